"""Methods (METHOD.md §5-6): hand-computed examples, equivalences and invariances."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from ladbench import methods
from ladbench.methods import (
    METHODS,
    LadSettings,
    MethodSettings,
    ablation_grid,
    ablation_methods,
    expected_bias,
    identity_indexed,
    lad,
    layer_selection_mask,
    layer_strength,
    paper_vs_reference_grid,
    permutation_average,
    predict,
    predict_identity_under_orderings,
    pride,
    purified_attention,
    raw_attention,
    select_layers,
    selection_warnings,
    sharpen,
    tau_sweep,
    vanilla,
)

# Hand example: N = 2, two layers, both selected with K = 2.
ATTN = np.array([[0.2, 0.6], [0.4, 0.2]])  # [Lyr, N]
PRIOR = np.array([[0.5, 0.5], [0.25, 0.75]])
B = np.array([[0.0, 1.0], [0.5, 0.5]])


def _calibration(B, attn_prior, pride_prior=None, pride_original_prior=None):
    n = B.shape[0]
    return SimpleNamespace(
        B=B, attn_prior=attn_prior,
        pride_prior=np.zeros(n) if pride_prior is None else pride_prior,
        pride_original_prior=np.zeros(n) if pride_original_prior is None else pride_original_prior,
    )


def _random_case(seed=0, i=6, t=3, lyr=5, n=4):
    rng = np.random.default_rng(seed)
    arrays = SimpleNamespace(
        scores=rng.normal(size=(i, t, n)),
        attn=rng.random(size=(i, t, lyr, n)) + 0.01,
        target_pos=rng.integers(0, n, size=(i, t)),
        order=np.argsort(rng.random((i, t, n)), axis=-1),
    )
    calibration = _calibration(rng.normal(size=(n, n)), rng.random((lyr, n)) + 0.01, rng.normal(size=n), rng.normal(size=n))
    return arrays, calibration


def test_vanilla_predict_and_pride_by_hand():
    scores = np.array([[1.0, 3.0, 2.0], [0.5, 0.1, 0.2]])
    assert np.array_equal(predict(vanilla(scores)), [1, 0])
    corrected = pride(scores, np.array([0.0, 2.5, 0.0]))
    np.testing.assert_allclose(corrected, [[1.0, 0.5, 2.0], [0.5, -2.4, 0.2]])
    assert np.array_equal(predict(corrected), [2, 0])
    assert predict(np.array([2.0, 2.0, 1.0])) == 0  # ties: first maximum


def test_layer_selection_by_strength_with_ties_and_range():
    # dyadic values so the tie between layers 1 and 3 is exact in floating point
    attn = np.array([[0.125, 0.125], [0.25, 0.5], [0.125, 0.25], [0.5, 0.25]])  # strengths 0.25, 0.75, 0.375, 0.75
    np.testing.assert_array_equal(layer_strength(attn), [0.25, 0.75, 0.375, 0.75])
    assert select_layers(attn, 1).tolist() == [3]  # tie between 1 and 3: the reference keeps the highest index
    assert select_layers(attn, 1, ties="lowest").tolist() == [1]
    assert select_layers(attn, 2).tolist() == [3, 1]
    assert select_layers(attn, 2, ties="lowest").tolist() == [1, 3]
    assert select_layers(attn, 3, ties="lowest").tolist() == [1, 3, 2]
    assert select_layers(attn, 2, layer_range=(0, 2)).tolist() == [1, 2]
    assert select_layers(attn, 1, layer_range=(2, 3)).tolist() == [3]
    assert layer_selection_mask(attn, LadSettings(top_k=2)).tolist() == [False, True, False, True]
    assert layer_selection_mask(attn, LadSettings(top_k=1)).tolist() == [False, False, False, True]
    assert layer_selection_mask(attn, LadSettings(top_k=1, layer_ties="lowest")).tolist() == [False, True, False, False]
    assert layer_selection_mask(attn, LadSettings(top_k=1, layer_range=(1, 2), all_layers=True)).tolist() == [False, True, True, False]
    # K beyond the range: the reference lowers K to the range's size; "error" stops
    assert select_layers(attn, 3, layer_range=(2, 3)).tolist() == [3, 2]
    with pytest.raises(ValueError, match="holds only 2"):
        select_layers(attn, 3, layer_range=(2, 3), k_beyond_range="error")
    # a K equal to the range's size, and a range of one layer, are not beyond it
    assert select_layers(attn, 2, layer_range=(2, 3), k_beyond_range="error").tolist() == [3, 2]
    assert select_layers(attn, 1, layer_range=(2, 2), k_beyond_range="error").tolist() == [2]
    assert select_layers(attn, 2, layer_range=(2, 9)).tolist() == [3, 2]  # clipped to the last layer
    # a family default (first, last, of) is the same share of this model's 4 layers
    assert select_layers(attn, 2, layer_range=(21, 35, 36)).tolist() == [3, 2]   # 21..35 of 36 -> 2..3 of 4
    assert select_layers(attn, 2, layer_range=(2, 5, 8)).tolist() == [1, 2]      # 2..5 of 8 -> 1..2 of 4
    with pytest.raises(ValueError, match="outside the model's layers 0..3"):
        select_layers(attn, 1, layer_range=(4, 6))
    # batched rows select independently
    batch = np.stack([attn, attn[::-1]])
    assert select_layers(batch, 1)[:, 0].tolist() == [3, 2]
    assert select_layers(batch, 1, ties="lowest")[:, 0].tolist() == [1, 0]
    # and so do the rows of a cache, [I, T, Lyr, N], under every tie rule
    rows = np.stack([batch, batch[::-1], batch])                                          # [3, 2, 4, 2]
    for ties in ("highest", "lowest", "argsort"):
        flat = select_layers(rows.reshape(6, 4, 2), 2, ties=ties)
        assert select_layers(rows, 2, ties=ties).tolist() == flat.reshape(3, 2, 2).tolist(), ties


def test_layer_selection_matches_the_reference_rule_on_many_ties():
    # The reference's rule, restated: sort the layers by strength ascending (stable: equal
    # strengths keep index order) and keep the last K; K above the range is lowered.
    rng = np.random.default_rng(3)
    attn = rng.integers(0, 3, size=(400, 15, 2)).astype(np.float64)  # strengths in 0..4: ties everywhere
    for k in (1, 2, 4, 15, 20):
        ours = np.sort(select_layers(attn, k), axis=-1)
        k_used = min(k, 15)
        expected = np.sort(np.argsort(attn.sum(-1), axis=-1, kind="stable")[:, -k_used:], axis=-1)
        np.testing.assert_array_equal(ours, expected)


def test_selection_warnings_name_lowered_k_and_counted_ties():
    attn = np.array([[[0.125, 0.125], [0.25, 0.5], [0.125, 0.25], [0.5, 0.25]],     # tie at K = 1
                     [[0.125, 0.125], [0.25, 0.5], [0.125, 0.25], [0.5, 0.5]],      # no tie
                     [[0.25, 0.5], [0.25, 0.5], [0.125, 0.25], [0.5, 0.25]]])       # tie at K = 1
    warnings = selection_warnings(attn, LadSettings(top_k=1))
    assert len(warnings) == 1 and warnings[0].startswith("2 of 3 rows have a tie")
    # rows [I, T, Lyr, N], as a cache holds them, are counted as the same rows flat
    assert selection_warnings(attn.reshape(3, 1, 4, 2), LadSettings(top_k=1)) == warnings
    warnings = selection_warnings(attn, LadSettings(top_k=5, layer_range=(2, 3)))
    assert warnings == ["top_k = 5 is larger than the 2 layers of the range (2, 3); K lowered to 2 "
                        "(k_beyond_range = lower, the reference's rule)"]
    assert selection_warnings(attn, LadSettings(top_k=2, all_layers=True)) == []


def test_purified_attention_reference_by_hand():
    # log(mean a) - mean log prior = log([0.3, 0.4]) - [log sqrt(0.125), log sqrt(0.375)]
    #                              = log([0.848528, 0.653197])
    log_pi = purified_attention(ATTN, PRIOR, LadSettings(top_k=2, layer_mean="reference"))
    np.testing.assert_allclose(np.exp(log_pi), [0.848528, 0.653197], atol=1e-6)


def test_purified_attention_paper_by_hand():
    # mean(log(a / prior)) = [0.5 log(0.4 * 1.6), 0.5 log(1.2 * 0.266667)] = log([0.8, 0.565685])
    log_pi = purified_attention(ATTN, PRIOR, LadSettings(top_k=2, layer_mean="paper"))
    np.testing.assert_allclose(np.exp(log_pi), [0.8, 0.565685], atol=1e-6)


def test_purified_attention_of_zero_attention_is_finite():
    """An image given no attention in a selected layer (or a layer the model lacks, taken as 0)
    is very unlikely, not undefined: its log is taken of 0 + a tiny constant under both means."""
    zero = np.array([[0.0, 0.6], [0.0, 0.2]])                   # image 0 unattended in both layers
    for mean in ("reference", "paper"):
        log_pi = purified_attention(zero, PRIOR, LadSettings(top_k=2, layer_mean=mean))
        assert np.isfinite(log_pi).all() and log_pi[0] < log_pi[1], mean


def test_purified_attention_without_prior_and_with_one_layer():
    np.testing.assert_allclose(np.exp(purified_attention(ATTN, PRIOR, LadSettings(top_k=2, use_prior=False))), [0.3, 0.4])
    np.testing.assert_allclose(  # paper, no prior: geometric mean sqrt(0.08), sqrt(0.12)
        np.exp(purified_attention(ATTN, PRIOR, LadSettings(top_k=2, use_prior=False, layer_mean="paper"))), [0.282843, 0.346410], atol=1e-6
    )
    # K = 1 keeps layer 0 (strength 0.8 > 0.6): both variants give a / prior of that layer.
    for mean in ("reference", "paper"):
        np.testing.assert_allclose(np.exp(purified_attention(ATTN, PRIOR, LadSettings(top_k=1, layer_mean=mean))), [0.4, 1.2])


def test_raw_attention_is_the_mean_over_selected_layers():
    np.testing.assert_allclose(raw_attention(ATTN, LadSettings(top_k=2)), [0.3, 0.4])
    np.testing.assert_allclose(raw_attention(ATTN, LadSettings(top_k=1)), [0.2, 0.6])
    np.testing.assert_allclose(raw_attention(ATTN, LadSettings(top_k=1, all_layers=True)), [0.3, 0.4])


def test_sharpen_by_hand():
    # tau = 2 on log([0.8, 0.4]): proportional to [0.64, 0.16] -> [0.8, 0.2]
    np.testing.assert_allclose(sharpen(np.log([0.8, 0.4]), 2.0), [0.8, 0.2])
    pi = sharpen(np.array([1000.0, 0.0, -1000.0]), 5.0)  # no overflow
    np.testing.assert_allclose(pi, [1.0, 0.0, 0.0])


def test_expected_bias_by_hand():
    pi = np.array([0.8, 0.2])
    # reference: pi @ B = [0.2 * 0.5, 0.8 + 0.2 * 0.5]
    np.testing.assert_allclose(expected_bias(pi, B, "reference"), [0.1, 0.9])
    # paper: log(0.8 e^0 + 0.2 e^0.5), log(0.8 e^1 + 0.2 e^0.5)
    np.testing.assert_allclose(expected_bias(pi, B, "paper"), [0.121991, 0.918037], atol=1e-6)
    with pytest.raises(ValueError, match="mixture"):
        expected_bias(pi, B, "geometric")


def test_mixtures_agree_on_one_hot_posteriors_and_paper_dominates():
    rng = np.random.default_rng(3)
    Bm = rng.normal(scale=3.0, size=(5, 5))
    one_hot = np.eye(5)
    np.testing.assert_allclose(expected_bias(one_hot, Bm, "paper"), expected_bias(one_hot, Bm, "reference"), atol=1e-12)
    np.testing.assert_allclose(expected_bias(one_hot, Bm, "reference"), Bm)
    pi = rng.dirichlet(np.ones(5), size=20)
    assert np.all(expected_bias(pi, Bm, "paper") >= expected_bias(pi, Bm, "reference") - 1e-12)  # Jensen


def test_lad_end_to_end_by_hand():
    # log pi~ = log([0.848528, 0.653197]); tau = 2: pi ∝ [0.72, 0.426667] = [27/43, 16/43]
    # expected bias (reference) = pi @ B = [8/43, 35/43]; s' = [1 - 8/43, 0.6 - 35/43]
    calibration = _calibration(B, PRIOR)
    corrected = lad(np.array([1.0, 0.6]), ATTN, calibration, LadSettings(top_k=2, tau=2.0))
    np.testing.assert_allclose(corrected, [1 - 8 / 43, 0.6 - 35 / 43])


def test_lad_is_the_composition_of_its_steps_for_every_variant():
    arrays, calibration = _random_case()
    for mean in ("reference", "paper"):
        for mix in ("reference", "paper"):
            for use_prior in (True, False):
                settings = LadSettings(top_k=3, tau=4.0, layer_range=(1, 4), layer_mean=mean, mixture=mix,
                                       use_prior=use_prior)
                log_pi = purified_attention(arrays.attn, calibration.attn_prior, settings)
                expected = arrays.scores - expected_bias(sharpen(log_pi, 4.0), calibration.B, mix)
                got = lad(arrays.scores, arrays.attn, calibration, settings)
                np.testing.assert_allclose(got, expected)


def test_batched_equals_row_by_row():
    arrays, calibration = _random_case(seed=5)
    batched = lad(arrays.scores, arrays.attn, calibration, LadSettings(top_k=2, tau=5.0))
    for i in range(arrays.scores.shape[0]):
        for t in range(arrays.scores.shape[1]):
            row = lad(arrays.scores[i, t], arrays.attn[i, t], calibration, LadSettings(top_k=2, tau=5.0))
            np.testing.assert_allclose(batched[i, t], row)


def test_invariances_of_predictions():
    arrays, calibration = _random_case(seed=1, i=30)
    shifted = SimpleNamespace(**vars(arrays))
    shifted.scores = arrays.scores + np.random.default_rng(9).normal(scale=10, size=arrays.scores.shape[:-1] + (1,))
    scaled = SimpleNamespace(**vars(arrays))  # one positive factor per row, the same for every layer
    scaled.attn = arrays.attn * np.random.default_rng(8).uniform(0.1, 10, size=arrays.attn.shape[:-2] + (1, 1))
    shifted_B = _calibration(calibration.B - 7.0, calibration.attn_prior, calibration.pride_prior,
                             calibration.pride_original_prior)
    for name in ("vanilla", "pride", "pride_original", "lad", "raw_attention", "purified_attention"):
        for layer_mean, mixture in (("reference", "reference"), ("paper", "paper"), ("reference", "paper")):
            settings = MethodSettings(LadSettings(layer_mean=layer_mean, mixture=mixture, top_k=2))
            base = METHODS[name](arrays, calibration, settings)
            assert np.array_equal(METHODS[name](shifted, calibration, settings), base), (name, "row constant")
            assert np.array_equal(METHODS[name](scaled, calibration, settings), base), (name, "attention scale")
            if name == "lad":  # the reference's extra constant shift of B changes nothing
                assert np.array_equal(METHODS[name](arrays, shifted_B, settings), base)


def test_permutation_average_by_hand():
    scores = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    order = np.array([[0, 1, 2], [1, 2, 0]])
    # shift 1 puts identity 1 at position 0 (4), identity 2 at 1 (5), identity 0 at 2 (6)
    np.testing.assert_allclose(identity_indexed(scores, order), [[1, 2, 3], [6, 4, 5]])
    np.testing.assert_allclose(permutation_average(scores, order), [3.5, 3.0, 4.0])
    positions = predict_identity_under_orderings(np.array([2]), order[None])
    assert positions.tolist() == [[2, 1]]


def test_permutation_average_method_is_fully_consistent():
    arrays, calibration = _random_case(seed=2, i=20)
    pred = METHODS["permutation_average"](arrays, calibration, MethodSettings())
    identity = np.take_along_axis(arrays.order, pred[..., None], axis=-1)[..., 0]
    assert np.all(identity == identity[:, :1])


def test_registry_covers_every_method_with_integer_positions():
    arrays, calibration = _random_case(seed=4)
    arrays.parsed = np.full(arrays.target_pos.shape, -1)
    for name in ("vanilla", "pride", "pride_original", "lad", "raw_attention", "purified_attention",
                 "permutation_average", "generated"):
        pred = METHODS[name](arrays, calibration, MethodSettings(LadSettings(top_k=2, tau=5.0, layer_range=None)))
        assert pred.shape == arrays.target_pos.shape and np.issubdtype(pred.dtype, np.integer)
        assert pred.min() >= -1 and pred.max() < 4
    del arrays.parsed
    with pytest.raises(ValueError, match="parsed"):
        METHODS["generated"](arrays, calibration, MethodSettings())


def test_registry_matches_the_functions():
    arrays, calibration = _random_case(seed=6)
    lad_settings = LadSettings(top_k=3, tau=2.0, layer_range=(1, 4), layer_mean="paper", mixture="paper")
    settings = MethodSettings(lad_settings)
    np.testing.assert_array_equal(
        METHODS["lad"](arrays, calibration, settings),
        predict(lad(arrays.scores, arrays.attn, calibration, LadSettings(top_k=3, tau=2.0, layer_range=(1, 4), layer_mean="paper", mixture="paper"))),
    )
    np.testing.assert_array_equal(
        METHODS["pride"](arrays, calibration, MethodSettings()), predict(arrays.scores - calibration.pride_prior)
    )
    np.testing.assert_array_equal(
        METHODS["purified_attention"](arrays, calibration, settings),
        predict(sharpen(purified_attention(arrays.attn, calibration.attn_prior, LadSettings(top_k=3, layer_range=(1, 4), layer_mean="paper")), 2.0)),
    )


def test_compatibility_errors_name_the_mismatch():
    arrays, calibration = _random_case()
    wrong_n = _calibration(np.zeros((3, 3)), np.ones((5, 3)))
    with pytest.raises(ValueError, match="N = 3 candidates but the cache has N = 4"):
        METHODS["lad"](arrays, wrong_n, MethodSettings())
    wrong_layers = _calibration(np.zeros((4, 4)), np.ones((7, 4)))
    with pytest.raises(ValueError, match="same model"):
        METHODS["lad"](arrays, wrong_layers, MethodSettings())


def test_family_default_layer_range_scales_with_depth():
    from ladbench.families import REFERENCE_LAYER_RANGE, scale_layer_range
    assert scale_layer_range(*REFERENCE_LAYER_RANGE, 36) == (21, 35)       # the reference's own depth
    assert scale_layer_range(*REFERENCE_LAYER_RANGE, 28) == (16, 27)       # 7B-class Qwen2 decoders
    assert scale_layer_range(*REFERENCE_LAYER_RANGE, 24) == (14, 23)
    assert scale_layer_range(*REFERENCE_LAYER_RANGE, 2) == (1, 1)          # never empty, never past the end


def test_settings_validation_and_mapping():
    assert LadSettings.from_record({"top_k": 4, "bootstrap": 100}).top_k == 4  # an evaluation's other settings ignored
    assert LadSettings.from_record(None) == LadSettings()
    assert LadSettings(layer_range=[21, 35]).as_dict()["layer_range"] == [21, 35]
    assert LadSettings(layer_range=[21, 35, 36]).as_dict()["layer_range"] == [21, 35, 36]
    for bad in ({"top_k": -1}, {"tau": 0.0}, {"mixture": "probability"}, {"layer_range": (5, 2)},
                {"layer_range": (21, 36, 36)}, {"layer_range": (1,)}):
        with pytest.raises(ValueError):
            LadSettings(**bad)


def test_ablation_grid_and_sweeps_describe_tables_4_and_figure_6():
    base = LadSettings(layer_range=(2, 4))
    grid = {v.label: v for v in ablation_grid(base)}
    # LAD's own grid, then a row per method that declared one (Method.ablation), at the base settings
    assert list(grid) == [
        "attn_readout_no_prior_K2", "attn_readout_prior_K2", "all_layers_prior", "dynamic_no_prior_K2",
        "dynamic_prior_K1", "dynamic_prior_K2", "dynamic_prior_K4", "dynamic_prior_K8", *ablation_methods(),
    ]
    assert all(grid[name].method == name and grid[name].settings == base for name in ablation_methods())
    assert grid["attn_readout_no_prior_K2"].method == "raw_attention"
    assert grid["attn_readout_prior_K2"].method == "purified_attention"
    assert grid["all_layers_prior"].settings.all_layers and grid["all_layers_prior"].settings.layer_range is None
    assert not grid["dynamic_no_prior_K2"].settings.use_prior
    assert grid["dynamic_prior_K8"].settings == replace(base, top_k=8)
    assert [v.settings.tau for v in tau_sweep(base)] == [float(t) for t in range(1, 10)]
    assert {(v.settings.layer_mean, v.settings.mixture) for v in paper_vs_reference_grid()} == {
        ("reference", "reference"), ("reference", "paper"), ("paper", "reference"), ("paper", "paper")}
    arrays, calibration = _random_case(lyr=10)
    predictions = methods.evaluate_rows(arrays, calibration, ablation_grid() + tau_sweep())
    assert len(predictions) == 8 + len(ablation_methods()) + 9           # the grid, the declared rows, the taus
    np.testing.assert_array_equal(predictions["dynamic_prior_K2"], METHODS["lad"](arrays, calibration, MethodSettings()))
