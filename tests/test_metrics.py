"""Metrics and bootstrap (METHOD.md §8): hand-computed examples, equivalences, coverage."""

import json
import time

import numpy as np
import pytest

from ladbench.metrics import (
    InstanceMetric,
    _percentile_interval,
    acc_mean_std,
    accuracy_per_ordering,
    bootstrap_ci,
    bootstrap_counts,
    bootstrap_indices,
    confusion_matrix,
    consistency,
    paired_bootstrap,
    parse_success,
    predicted_identity,
    recall_per_position,
    recall_std,
    spread_over_draws,
    standard_metric,
    summarize,
)

# Hand example: I = 4 instances, T = 2 orderings, N = 3.
# instance 0: identity 0 is the target; predicted right under both orderings (identity 0, 0).
# instance 1: identity 2 is the target; right under ordering 0, wrong under 1 (identities 2, 0).
# instance 2: wrong, then unparsable (-1).
# instance 3: wrong under both, but the same identity (0) both times: consistent yet wrong.
ORDER = np.array([
    [[0, 1, 2], [1, 0, 2]],
    [[0, 1, 2], [2, 0, 1]],
    [[0, 1, 2], [0, 1, 2]],
    [[0, 1, 2], [2, 1, 0]],
])
TARGET = np.array([[0, 1], [2, 0], [1, 1], [1, 1]])
PRED = np.array([[0, 1], [2, 1], [0, -1], [0, 2]])


def test_accuracy_per_ordering_mean_and_std_by_hand():
    # correct: ordering 0 -> 2 of 4 = 50 %, ordering 1 -> 1 of 4 = 25 %
    np.testing.assert_allclose(accuracy_per_ordering(PRED, TARGET), [50.0, 25.0])
    mean, std = acc_mean_std(PRED, TARGET)
    # default ddof = 1 (the reference's sample std): sqrt((12.5^2 + 12.5^2) / 1) = 17.678
    assert mean == 37.5 and std == pytest.approx(12.5 * np.sqrt(2))
    assert acc_mean_std(PRED, TARGET, ddof=0)[1] == 12.5
    assert acc_mean_std(PRED, TARGET, ddof=1)[1] == pytest.approx(17.677670, abs=1e-6)


def test_recall_per_position_and_rstd_by_hand():
    # target at 0: 2 rows, 1 right -> 50 %; at 1: 5 rows, 1 right -> 20 %; at 2: 1 row, right -> 100 %
    np.testing.assert_allclose(recall_per_position(PRED, TARGET, 3), [50.0, 20.0, 100.0])
    # mean 56.667; squared deviations 44.444 + 1344.444 + 1877.778 = 3266.667; / 2 -> sqrt = 40.414519
    assert recall_std(PRED, TARGET, 3) == pytest.approx(40.414519, abs=1e-6)


def test_identity_consistency_confusion_and_parse_by_hand():
    assert predicted_identity(PRED, ORDER).tolist() == [[0, 0], [2, 0], [0, -1], [0, 0]]
    assert consistency(PRED, ORDER) == 50.0  # instances 0 and 3
    # rows = ground-truth position, columns = predicted; the unparsable row is left out
    assert confusion_matrix(PRED, TARGET, 3).tolist() == [[1, 1, 0], [2, 1, 1], [0, 0, 1]]
    assert parse_success(PRED) == 87.5


def test_instance_metrics_equal_the_direct_formulas():
    for name, direct in [
        ("acc_mean", acc_mean_std(PRED, TARGET)[0]),
        ("acc_std", acc_mean_std(PRED, TARGET)[1]),
        ("rstd", recall_std(PRED, TARGET, 3)),
        ("cons", consistency(PRED, ORDER)),
        ("parse_success", parse_success(PRED)),
    ]:
        assert standard_metric(name)(PRED, TARGET, ORDER) == pytest.approx(direct), name
    with pytest.raises(ValueError, match="unknown metric"):
        standard_metric("f1")


def test_bootstrap_counts_match_the_indices():
    index = bootstrap_indices(7, 50, 3)
    counts = bootstrap_counts(7, 50, 3)
    assert counts.shape == (50, 7) and np.all(counts.sum(axis=1) == 7)
    for b in range(50):
        np.testing.assert_array_equal(counts[b], np.bincount(index[b], minlength=7))
    with pytest.raises(ValueError):
        counts[0, 0] = 1.0  # shared between calls: read-only


def _random_predictions(rng, n_instances=60, n_orderings=5, n=4, skill=0.6):
    target = rng.integers(0, n, size=(n_instances, n_orderings))
    # skill None: heterogeneous instances, ability ~ Beta(2, 2) (mean 0.5) shared by their orderings
    ability = rng.beta(2, 2, size=(n_instances, 1)) if skill is None else np.full((n_instances, 1), skill)
    right = rng.random((n_instances, n_orderings)) < ability
    pred = np.where(right, target, (target + rng.integers(1, n, size=target.shape)) % n)
    order = np.argsort(rng.random((n_instances, n_orderings, n)), axis=-1)
    return pred, target, order


def test_vectorised_bootstrap_equals_the_loop_over_resamples():
    rng = np.random.default_rng(0)
    pred, target, order = _random_predictions(rng)
    pred[0, 0] = -1
    for name in ("acc_mean", "acc_std", "rstd", "cons", "parse_success"):
        metric = standard_metric(name)
        fast = bootstrap_ci(metric, pred, target, order, n_boot=300, seed=5)
        slow = bootstrap_ci(lambda *a, metric=metric: metric(*a), pred, target, order, n_boot=300, seed=5)
        np.testing.assert_allclose(fast.replicates, slow.replicates, atol=1e-9, err_msg=name)
        assert fast.estimate == pytest.approx(slow.estimate)
        assert fast.ci_low <= fast.estimate <= fast.ci_high or name in ("acc_std", "rstd")


def test_bootstrap_of_constant_data_is_degenerate():
    target = np.zeros((30, 3), dtype=int)
    order = np.tile(np.arange(2), (30, 3, 1))
    result = bootstrap_ci(standard_metric("acc_mean"), target, target, order, n_boot=200)
    assert (result.estimate, result.ci_low, result.ci_high) == (100.0, 100.0, 100.0)


def test_bootstrap_interval_covers_the_true_accuracy_at_the_nominal_rate():
    # Instances have heterogeneous abilities (correlated orderings), true mean ability 0.5.
    rng = np.random.default_rng(1)
    metric = standard_metric("acc_mean")
    covered = 0
    repetitions = 200
    for repetition in range(repetitions):
        pred, target, order = _random_predictions(rng, n_instances=150, skill=None)
        result = bootstrap_ci(metric, pred, target, order, n_boot=500, seed=repetition)
        covered += result.ci_low <= 50.0 <= result.ci_high
    rate = covered / repetitions
    # nominal 0.95; binomial sd over 200 repetitions is 0.015
    assert 0.90 <= rate <= 0.99, rate


def test_paired_bootstrap_detects_a_real_difference_and_not_a_null_one():
    rng = np.random.default_rng(7)
    pred, target, order = _random_predictions(rng, n_instances=300, skill=0.5)
    better = np.where(rng.random(pred.shape) < 0.3, target, pred)  # fixes ~30 % of the errors
    result = paired_bootstrap(better, pred, target, order, "acc_mean", n_boot=2000, seed=1)
    assert result["difference"] > 0 and result["ci_low"] > 0 and result["p_value"] < 0.01
    same = paired_bootstrap(pred, pred, target, order, "acc_mean", n_boot=500, seed=1)
    assert same["difference"] == 0.0 and same["p_value"] == 1.0
    # two-sided: the same p-value with the methods swapped; every resample's difference of one
    # sign: each tail is (1 + count) / (1 + n_boot), so p = 2 / 2001
    worse = paired_bootstrap(pred, better, target, order, "acc_mean", n_boot=2000, seed=1)
    assert worse["difference"] == -result["difference"] and worse["p_value"] == result["p_value"]
    assert result["p_value"] == pytest.approx(2 / 2001) and (worse["ci_low"], worse["ci_high"]) == pytest.approx(
        (-result["ci_high"], -result["ci_low"]))
    # Under the null (two equally good, independent methods) p < 0.05 about 5 % of the time.
    rejections = 0
    for repetition in range(150):
        a, target, order = _random_predictions(rng, n_instances=100, skill=0.6)
        b = np.where(rng.random(a.shape) < 0.6, target, (target + 1) % 4)
        rejections += paired_bootstrap(a, b, target, order, "acc_mean", n_boot=400, seed=repetition)["p_value"] < 0.05
    assert rejections / 150 <= 0.12


def test_summarize_is_json_and_consistent_with_the_point_metrics():
    summary = summarize(PRED, TARGET, ORDER, 3, n_boot=200, seed=0)
    json.dumps(summary)
    assert summary["acc_mean"] == 37.5 and summary["acc_std"] == pytest.approx(12.5 * np.sqrt(2))
    assert summary["rstd"] == pytest.approx(40.414519, abs=1e-6)
    assert summary["cons"] == 50.0 and summary["parse_success"] == 87.5
    assert summary["confusion"] == [[1, 1, 0], [2, 1, 1], [0, 0, 1]]
    assert summary["acc_per_ordering"] == [50.0, 25.0]
    assert summary["acc_mean_ci_low"] <= 37.5 <= summary["acc_mean_ci_high"]
    no_boot = summarize(PRED, TARGET, ORDER, 3, n_boot=0)
    assert no_boot["acc_mean_ci_low"] is None and no_boot["cons"] == 50.0
    with pytest.raises(ValueError, match="n = 4"):
        summarize(PRED, TARGET, ORDER, 4, n_boot=0)
    with pytest.raises(ValueError, match="positions 0..2 or -1"):
        summarize(PRED + 5, TARGET, ORDER, 3, n_boot=0)


def test_summarize_is_strict_json_when_a_position_is_never_the_target():
    target = np.zeros((5, 2), dtype=int)  # position 1 never holds the ground truth: its recall is undefined
    order = np.tile(np.arange(2), (5, 2, 1))
    summary = summarize(target, target, order, 2, n_boot=50)
    json.dumps(summary, allow_nan=False)
    assert summary["recall_per_position"] == [100.0, None] and summary["rstd"] is None
    assert summary["acc_mean"] == 100.0


def test_summarize_ten_thousand_resamples_is_fast():
    rng = np.random.default_rng(1)
    pred, target, order = _random_predictions(rng, n_instances=1000, skill=0.7)
    start = time.perf_counter()
    summary = summarize(pred, target, order, 4, n_boot=10000, seed=123)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, elapsed  # about 0.3 s on one shared core
    assert summary["acc_mean_ci_low"] < summary["acc_mean"] < summary["acc_mean_ci_high"]
    # percentile CI of a mean of 1,000 instances: half-width about 1.96 * sd / sqrt(I)
    assert 1.0 < summary["acc_mean_ci_high"] - summary["acc_mean_ci_low"] < 5.0


def test_spread_over_draws_by_hand():
    draws = [{"acc_mean": 50.0, "cons": 10.0}, {"acc_mean": 60.0, "cons": 10.0}, {"acc_mean": 70.0, "cons": 10.0}]
    spread = spread_over_draws(draws, keys=("acc_mean", "cons"))
    assert spread["n_draws"] == 3
    assert spread["acc_mean"] == {"mean": 60.0, "std": 10.0, "min": 50.0, "max": 70.0, "values": [50.0, 60.0, 70.0]}
    assert spread["cons"]["std"] == 0.0
    assert spread_over_draws(draws[:1], keys=("acc_mean",))["acc_mean"]["std"] == 0.0


def test_a_custom_instance_metric_bootstraps():
    values = np.arange(10, dtype=float)
    mean_metric = InstanceMetric("mean", lambda v: {"v": v[:, None]}, lambda sums, n: sums["v"][..., 0] / n)
    result = bootstrap_ci(mean_metric, values, n_boot=400, seed=0)
    assert result.estimate == 4.5 and result.ci_low < 4.5 < result.ci_high


def test_spread_over_draws_keeps_undefined_metrics_undefined():
    # Position 1 never holds the ground truth, so RStd is undefined (None) in every draw's
    # summary; the spread over two draws must say so instead of failing on float(None).
    target = np.zeros((5, 2), dtype=int)
    order = np.tile(np.arange(2), (5, 2, 1))
    draws = [summarize(target, target, order, 2, n_boot=0), summarize(target, target, order, 2, n_boot=0)]
    spread = spread_over_draws(draws)
    json.dumps(spread, allow_nan=False)
    assert spread["rstd"] == {"mean": None, "std": None, "min": None, "max": None, "values": [None, None]}
    assert spread["acc_mean"]["mean"] == 100.0 and spread["acc_mean"]["std"] == 0.0


def test_percentile_intervals_agree_with_scipy_bootstrap():
    """Cross-check against scipy.stats.bootstrap (percentile method), resampling instances:
    the intervals agree within Monte-Carlo error (20,000 resamples each, other streams)."""
    from scipy.stats import bootstrap
    from ladbench.metrics import standard_metric

    rng = np.random.default_rng(0)
    n_inst, t, n = 300, 5, 4
    target = rng.integers(0, n, (n_inst, t))
    skill = rng.random(n_inst)
    pred = np.where(rng.random((n_inst, t)) < skill[:, None], target, (target + 1) % n)
    order = np.tile(np.arange(n), (n_inst, t, 1))
    correct = (pred == target).astype(float)
    consistent = np.all(pred == pred[:, :1], axis=1).astype(float)
    by_indices = {  # each metric of the resampled instances (index arrays [..., I])
        "acc_mean": lambda idx: 100 * correct[idx].mean(axis=(-2, -1)),
        "acc_std": lambda idx: (100 * correct[idx].mean(axis=-2)).std(axis=-1, ddof=1),
        "cons": lambda idx: 100 * consistent[idx].mean(axis=-1),
    }
    for name, tolerance in (("acc_mean", 0.35), ("acc_std", 0.2), ("cons", 0.5)):
        ours = bootstrap_ci(standard_metric(name), pred, target, order, n_boot=20000, seed=1)
        theirs = bootstrap((np.arange(n_inst),), lambda idx, axis=-1, name=name: by_indices[name](idx.astype(int)),
                           method="percentile", n_resamples=20000, vectorized=True, batch=2000,
                           random_state=np.random.default_rng(2)).confidence_interval
        assert ours.estimate == pytest.approx(float(by_indices[name](np.arange(n_inst))))
        assert ours.ci_low == pytest.approx(theirs.low, abs=tolerance), name
        assert ours.ci_high == pytest.approx(theirs.high, abs=tolerance), name


def test_percentile_interval_by_hand():
    """The central ci of the replicates by numpy's linear quantiles, NaN replicates left out."""
    replicates = np.arange(101.0)
    assert _percentile_interval(replicates, 0.9) == pytest.approx((5.0, 95.0))
    assert _percentile_interval(np.append(replicates, np.nan), 0.5) == pytest.approx((25.0, 75.0))
    for ci in (0.0, 1.0):
        with pytest.raises(ValueError, match="ci must be in"):
            _percentile_interval(replicates, ci)


@pytest.mark.parametrize("pred, target, order, message", [
    (np.zeros((2, 3)), np.zeros((2, 2)), np.zeros((2, 2, 3)), r"must both be \[I, T\]"),
    (np.zeros(2), np.zeros(2), np.zeros((2, 1, 3)), r"must both be \[I, T\]"),
    (np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 3, 3)), r"must be \[I, T, N\] matching"),
    (np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2)), r"must be \[I, T, N\] matching"),
    (np.full((2, 2), 3), np.zeros((2, 2)), np.zeros((2, 2, 3)), r"positions 0\.\.2 or -1"),   # position N
    (np.full((2, 2), -2), np.zeros((2, 2)), np.zeros((2, 2, 3)), r"positions 0\.\.2 or -1"),  # below "unparsable"
])
def test_summarize_refuses_malformed_predictions(pred, target, order, message):
    with pytest.raises(ValueError, match=message):
        summarize(pred.astype(int), target.astype(int), order.astype(int), 3, n_boot=0)


def test_bootstrap_needs_an_instance_and_a_resample():
    assert bootstrap_indices(1, 1, 0).tolist() == [[0]]
    for n_instances, n_boot in ((0, 5), (5, 0)):
        with pytest.raises(ValueError, match="n_instances >= 1 and n_boot >= 1"):
            bootstrap_indices(n_instances, n_boot, 0)
