"""Planted-bias simulations (tests/simulate.py): every method against a known truth.

- A bias that depends on the target position (the position after the target is pulled
  up) has a uniform marginal: PriDe, which removes a per-position prior, cannot touch it,
  while LAD, which uses attention to guess where the target is and removes that row of
  B, recovers most of the attention's accuracy.
- A static bias is exactly what PriDe models: both PriDe variants remove it.
"""

import numpy as np
import pytest

from ladbench.calibration import fit_calibration
from ladbench.divergence import divergence_summary
from ladbench.methods import METHODS, LadSettings, MethodSettings, ablation_grid, evaluate_rows, paper_vs_reference_grid
from ladbench.metrics import acc_mean_std, consistency

from simulate import conditional_bias, simulate_cache, static_bias


def _accuracy(pred, sim) -> float:
    return acc_mean_std(pred, sim.target_pos)[0]


def _fit(sim, n_cal=5, seed=0, average="reference"):
    return fit_calibration(sim.cal_scores, sim.cal_attn, sim.cal_target_pos, n_cal=n_cal, seed=seed, average=average)


def _run(sim, calibration, names=("vanilla", "pride", "pride_original", "lad", "raw_attention", "purified_attention")):
    return {name: _accuracy(METHODS[name](sim, calibration, MethodSettings()), sim) for name in names}


@pytest.mark.parametrize("n", [4, 8])
def test_lad_removes_a_target_dependent_bias_that_pride_cannot(n):
    sim = simulate_cache(n=n, bias=conditional_bias(n, 4.0), attn_accuracy=0.9, seed=n)
    acc = _run(sim, _fit(sim))
    attention = _accuracy(sim.attention_pred, sim)
    assert 85 <= attention <= 95  # the planted attention accuracy (0.9)
    assert acc["vanilla"] < 30  # the bias beats the visual gain
    for name in ("pride", "pride_original"):
        assert abs(acc[name] - acc["vanilla"]) <= 3, (name, acc)
    assert acc["purified_attention"] == pytest.approx(attention, abs=2)
    assert acc["lad"] >= 0.95 * attention, acc
    assert acc["lad"] >= acc["vanilla"] + 55
    assert acc["raw_attention"] <= acc["purified_attention"] - 15  # recency dominates raw attention


def test_both_pride_variants_remove_a_static_bias():
    sim = simulate_cache(bias=static_bias([2.5, 0.0, 0.0, 1.0]), seed=11)
    acc = _run(sim, _fit(sim))
    oracle = _accuracy(sim.oracle_pred, sim)
    assert acc["vanilla"] <= oracle - 10
    for name in ("pride", "pride_original"):
        assert acc[name] >= oracle - 2, (name, acc, oracle)
    assert acc["lad"] >= acc["vanilla"] + 5


def test_no_bias_means_no_harm():
    sim = simulate_cache(bias=None, seed=12)
    acc = _run(sim, _fit(sim))
    oracle = _accuracy(sim.oracle_pred, sim)
    for name in ("vanilla", "pride", "pride_original", "lad"):
        assert acc[name] >= oracle - 2, (name, acc, oracle)


def test_calibration_recovers_the_planted_gain_and_bias():
    # k = gain + max_{i, j != i}(bias[i, i] - bias[i, j]) = gain for this bias (zeros off the "next" slot)
    n, gain, strength = 4, 3.0, 4.0
    sim = simulate_cache(n=n, bias=conditional_bias(n, strength), gain=gain, n_cal_pool=400, identity_noise=0.5, seed=3)
    calibration = _fit(sim, n_cal=400)
    assert calibration.k == pytest.approx(gain, abs=0.2)
    np.testing.assert_allclose(calibration.B, conditional_bias(n, strength), atol=0.2)
    # the marginal of this bias is uniform: both PriDe priors are flat
    for prior in (calibration.pride_prior, calibration.pride_original_prior):
        assert np.ptp(prior) < 0.1
    # attention prior: the recency pattern, proportional to exp(4 p / 3), per layer
    ratios = calibration.attn_prior / calibration.attn_prior[:, :1]
    np.testing.assert_allclose(ratios, np.tile(np.exp(4.0 * np.arange(n) / 3), (8, 1)), rtol=0.1)


def test_every_paper_and_reference_variant_recovers_the_attention_accuracy():
    sim = simulate_cache(bias=conditional_bias(4, 4.0), seed=5)
    attention = _accuracy(sim.attention_pred, sim)
    for average in ("reference", "paper"):
        calibration = _fit(sim, average=average)
        for label, pred in evaluate_rows(sim, calibration, paper_vs_reference_grid()).items():
            assert _accuracy(pred, sim) >= 0.9 * attention, (average, label)


def test_ablations_behave_as_designed():
    sim = simulate_cache(bias=conditional_bias(4, 4.0), seed=6)
    calibration = _fit(sim)
    acc = {label: _accuracy(pred, sim) for label, pred in evaluate_rows(sim, calibration, ablation_grid()).items()}
    # the planted signal lives in two layers: K = 2 finds exactly them
    assert acc["dynamic_prior_K2"] >= acc["dynamic_prior_K8"]
    assert acc["dynamic_prior_K2"] >= acc["all_layers_prior"]
    assert acc["attn_readout_prior_K2"] > acc["attn_readout_no_prior_K2"] + 15
    assert acc["dynamic_prior_K2"] > acc["dynamic_no_prior_K2"]


def test_permutation_averaging_is_consistent_and_attention_is_order_robust():
    sim = simulate_cache(bias=conditional_bias(4, 4.0), seed=7)
    calibration = _fit(sim)
    pred = METHODS["permutation_average"](sim, calibration, MethodSettings())
    assert consistency(pred, sim.order) == 100.0
    assert consistency(METHODS["vanilla"](sim, calibration, MethodSettings()), sim.order) < 20
    result = divergence_summary(sim.scores, sim.order, attn=sim.attn, attn_prior=calibration.attn_prior, n_boot=300, settings=LadSettings(top_k=2))
    # planted: purified attention follows the (fixed) favoured identity, the logits' top follows the
    # target's position; the rest of both rankings is noise, so neither rho is near 1
    assert result["attention"]["mean"] > result["logits"]["mean"] + 0.3
    assert result["attention_minus_logits"]["ci_low"] > 0
