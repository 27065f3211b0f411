"""Divergence statistics (METHOD.md §9) and score/attention profiles (Figures 2-3)."""

import json
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import rankdata, spearmanr

from ladbench.divergence import (
    average_ranks,
    divergence_summary,
    mean_pairwise_spearman,
    profiles,
    spearman_summary,
)
from ladbench.methods import LadSettings, identity_indexed, purified_attention, raw_attention


def test_mean_pairwise_spearman_by_hand():
    # [1, 2, 3] vs [3, 2, 1]: rho = -1; vs [1, 3, 2]: d = (0, 1, 1), rho = 1 - 6 * 2 / (3 * 8) = 0.5
    values = np.array([[[1, 2, 3], [3, 2, 1]], [[1, 2, 3], [1, 3, 2]]], dtype=float)
    np.testing.assert_allclose(mean_pairwise_spearman(values), [-1.0, 0.5])
    # three orderings: pairs (0,1) = 1, (0,2) = -1, (1,2) = -1 -> mean -1/3
    three = np.array([[[1, 2, 3], [10, 20, 30], [3, 2, 1]]], dtype=float)
    np.testing.assert_allclose(mean_pairwise_spearman(three), [-1 / 3])
    # N = 2: centred ranks (-1/2, 1/2), norms sqrt(1/2): still a defined pair
    np.testing.assert_allclose(mean_pairwise_spearman(np.array([[[1, 2], [2, 1]], [[1, 2], [5, 7]]], dtype=float)), [-1, 1])
    with pytest.raises(ValueError, match="T >= 2 orderings"):
        mean_pairwise_spearman(np.zeros((2, 1, 3)))


def test_spearman_handles_ties_with_average_ranks():
    # ranks [1.5, 1.5, 3] vs [1, 2, 3]: centred (-0.5, -0.5, 1) . (-1, 0, 1) = 1.5; norms sqrt(1.5) sqrt(2)
    values = np.array([[[1, 1, 2], [1, 2, 3]]], dtype=float)
    np.testing.assert_allclose(mean_pairwise_spearman(values), [1.5 / np.sqrt(3.0)])


def test_average_ranks_equal_scipys_rankdata():
    """Ties (values drawn from a few levels), NaN slices and N from 2 to 16 as scipy ranks them."""
    rng = np.random.default_rng(0)
    for n in (2, 3, 8, 16):
        values = rng.integers(0, 4, size=(50, 5, n)).astype(float)
        values[3, 1, 0] = np.nan
        np.testing.assert_array_equal(average_ranks(values), rankdata(values, axis=-1))


def test_constant_vectors_are_skipped_and_counted():
    values = np.array([
        [[1, 1, 1], [1, 2, 3], [1, 2, 3]],  # only the pair (1, 2) is defined -> 1
        [[5, 5, 5], [2, 2, 2], [1, 2, 3]],  # no defined pair -> NaN
    ], dtype=float)
    rho = mean_pairwise_spearman(values)
    assert rho[0] == pytest.approx(1.0) and np.isnan(rho[1])
    summary = spearman_summary(rho, n_boot=100)
    assert summary["n_undefined"] == 1 and summary["mean"] == pytest.approx(1.0)
    assert summary["std"] is None  # one defined instance: no sample std


def test_spearman_matches_scipy_on_random_data():
    rng = np.random.default_rng(0)
    values = rng.integers(0, 4, size=(40, 4, 6)).astype(float)  # ties included
    rho = mean_pairwise_spearman(values)
    for i in range(40):
        pairs = [spearmanr(values[i, a], values[i, b])[0] for a in range(4) for b in range(a + 1, 4)]
        pairs = [p for p in pairs if not np.isnan(p)]
        assert rho[i] == pytest.approx(np.mean(pairs))


def test_identity_signal_is_order_robust_and_position_signal_is_not():
    rng = np.random.default_rng(1)
    n_instances, n_orderings, n = 300, 5, 6
    order = np.argsort(rng.random((n_instances, n_orderings, n)), axis=-1)
    content = rng.normal(size=(n_instances, n))
    follows_content = np.take_along_axis(content[:, None, :].repeat(n_orderings, 1), order, axis=-1)
    follows_position = np.broadcast_to(np.arange(n, dtype=float), order.shape) + 0.01 * follows_content
    result = divergence_summary(follows_position, order, attn_evidence=follows_content, n_boot=500)
    json.dumps(result, allow_nan=False)
    assert result["attention_evidence"] == "given"
    assert result["attention"]["mean"] == pytest.approx(1.0)
    # random orderings: the position signal's identity ranking is uncorrelated across orderings
    assert abs(result["logits"]["mean"]) < 0.05
    assert result["logits"]["ci_low"] < result["logits"]["mean"] < result["logits"]["ci_high"]
    assert result["attention_minus_logits"]["ci_low"] > 0.9
    assert len(result["rho_logits"]) == n_instances


def test_divergence_summary_from_raw_attention_layers():
    rng = np.random.default_rng(2)
    scores = rng.normal(size=(20, 3, 4))
    attn = rng.random(size=(20, 3, 5, 4))
    order = np.argsort(rng.random((20, 3, 4)), axis=-1)
    direct = divergence_summary(scores, order, attn_evidence=raw_attention(attn, LadSettings(top_k=2, layer_range=(1, 4))), n_boot=0)
    via_attn = divergence_summary(scores, order, attn=attn, n_boot=0, settings=LadSettings(top_k=2, layer_range=(1, 4)))
    assert direct["rho_attention"] == via_attn["rho_attention"]
    assert via_attn["attention"]["ci_low"] is None
    assert (direct["attention_evidence"], via_attn["attention_evidence"]) == ("given", "raw")
    prior = rng.random(size=(5, 4)) + 0.1
    purified = divergence_summary(scores, order, attn=attn, attn_prior=prior, n_boot=0, settings=LadSettings(top_k=2, layer_range=(1, 4)))
    expected = divergence_summary(scores, order, n_boot=0, attn_evidence=purified_attention(
        attn, prior, LadSettings(top_k=2, layer_range=(1, 4))))
    assert purified["rho_attention"] == expected["rho_attention"] and purified["attention_evidence"] == "purified"
    with pytest.raises(ValueError, match="needs attn_evidence"):
        divergence_summary(scores, order)


def test_the_paired_difference_and_each_summary_by_hand():
    """attention - logits is taken instance by instance (a paired difference), and each summary
    is the mean, the sample std (ddof = 1) and the bootstrap interval of its defined instances."""
    order = np.tile(np.arange(3), (3, 2, 1))                    # the identity ordering: positions are identities
    scores = np.array([[[1, 2, 3], [3, 2, 1]], [[1, 2, 3], [1, 3, 2]], [[1, 2, 3], [1, 2, 3]]], dtype=float)
    attention = scores[[2, 2, 1]]                               # rho: logits -1, 0.5, 1; attention 1, 1, 0.5
    result = divergence_summary(scores, order, attn_evidence=attention, n_boot=0)
    np.testing.assert_allclose(result["rho_logits"], [-1.0, 0.5, 1.0])
    np.testing.assert_allclose(result["rho_attention"], [1.0, 1.0, 0.5])
    difference = result["attention_minus_logits"]               # per instance 2, 0.5, -0.5
    assert difference["mean"] == pytest.approx(2 / 3)
    # deviations 4/3, -1/6, -7/6: squares 114/36, over 3 - 1
    assert difference["std"] == pytest.approx(np.sqrt(19 / 12))
    assert result["logits"]["mean"] == pytest.approx(1 / 6) and result["attention"]["mean"] == pytest.approx(5 / 6)
    # every resample of a constant sample has its mean: the interval is that value, the NaN left out
    constant = spearman_summary(np.array([0.25, 0.25, np.nan, 0.25]), n_boot=200)
    assert (constant["mean"], constant["std"], constant["n_undefined"]) == (pytest.approx(0.25), 0.0, 1)
    assert constant["ci_low"] == pytest.approx(0.25) and constant["ci_high"] == pytest.approx(0.25)


def test_identity_indexing_round_trip():
    order = np.array([[2, 0, 1]])
    assert identity_indexed(np.array([[10.0, 20.0, 30.0]]), order).tolist() == [[20.0, 30.0, 10.0]]


def test_profiles_by_hand():
    scores = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    target = np.array([0, 1, 0])
    profile = profiles(scores, target)  # Figure 2's data: scores per ground-truth position
    np.testing.assert_allclose(profile.mean, [[3.0, 4.0], [3.0, 4.0]])
    np.testing.assert_allclose(profile.std[0], [np.sqrt(8.0), np.sqrt(8.0)])  # ddof = 1 of (1, 5) and (2, 6)
    assert np.all(np.isnan(profile.std[1])) and profile.count.tolist() == [2, 1]
    # three rows at position 0: values 1, 2, 6 (mean 3, squares 4 + 1 + 9 over 3 - 1 rows)
    three = profiles(np.array([[1.0, 0.0], [2.0, 0.0], [6.0, 0.0], [0.0, 1.0]]), np.array([0, 0, 0, 1]))
    np.testing.assert_allclose(three.std[0], [np.sqrt(7.0), 0.0])
    # works on [I, T, N] too
    profile3 = profiles(scores.reshape(3, 1, 2), target.reshape(3, 1))
    np.testing.assert_allclose(profile3.mean, profile.mean)


def test_attention_profiles_use_the_selected_layers():
    attn = np.zeros((2, 3, 2))  # [rows, Lyr, N]
    attn[:, 2] = [[0.9, 0.1], [0.2, 0.8]]  # the strongest layer
    attn[:, 0] = 0.05
    # Figure 3's data: the raw attention evidence of the top-K layers per ground-truth position
    profile = profiles(raw_attention(attn, LadSettings(top_k=1)), np.array([0, 1]))
    np.testing.assert_allclose(profile.mean, [[0.9, 0.1], [0.2, 0.8]])


def test_divergence_summary_applies_the_layer_selection_rules():
    """The divergence statistics select layers by the same rules as LAD: with
    k_beyond_range="error", a K beyond the layer range is refused, not silently lowered."""
    rng = np.random.default_rng(0)
    scores, attn = rng.normal(size=(6, 3, 4)), rng.random((6, 3, 5, 4))
    order = np.tile(np.arange(4), (6, 3, 1))
    settings = LadSettings(top_k=4, layer_range=(1, 2))
    divergence_summary(scores, order, attn=attn, settings=settings, n_boot=0)   # the default lowers K to the range
    with pytest.raises(ValueError):
        divergence_summary(scores, order, attn=attn, settings=replace(settings, k_beyond_range="error"), n_boot=0)
