"""Metrics of METHOD.md §8 with bootstrap confidence intervals over instances: pure numpy.

Inputs: ``pred_pos`` and ``target_pos`` [I, T] (physical positions; a prediction of
``-1`` is an unparsable generative answer and counts as wrong), ``order`` [I, T, N]
(``order[i, t, p]`` = identity shown at position ``p``). Every percentage is in %.

Choices (documented because the paper does not state them):

- **Acc std** uses ``ddof = 1`` by default (:data:`ACC_STD_DDOF`, config
  ``evaluation.acc_ddof``): the reference implementation's sample std over its T fixed
  orderings (``std`` in its ``src/metric.py``). At T = 5 it is sqrt(5/4) = 1.118 times the
  ``ddof = 0`` value. Every published "mean ± std" pair is attainable with both on the
  0.1 % grid of 1,000-instance accuracies, so the numbers alone cannot settle it; the
  choice is a parameter (``acc_ddof``) and recorded in every summary (``acc_std_ddof``).
- **RStd** is the sample std (``ddof = 1``) over the ``N`` positions of the recall,
  pooled over all instances and orderings whose ground truth sits at that position.
- **Where a statistic is undefined** (``edge_statistics``, config
  ``evaluation.edge_statistics``): ``undefined`` (default) reports ``None``: Acc's sample
  std at T = 1, RStd when a position never holds the ground truth (its recall is 0/0).
  ``reference``, the reference's ``src/metric.py``: a std of fewer than two values is 0.0,
  and RStd is the std over the positions that hold the ground truth at least once.
- **Cons.** counts an instance as consistent when all ``T`` predictions are valid and
  name the same image identity.
- **Confusion matrix** rows are ground-truth positions, columns predicted positions;
  unparsable answers appear in no column (see ``parse_success``).
- **Bootstrap**: percentile intervals from resampling instances with replacement, all
  orderings of an instance kept together. Each metric is a function of per-instance
  additive statistics, so one resample is one row of a count matrix ``W`` [n_boot, I]
  and all resamples are ``W @ X``: 10,000 resamples of 1,000 x 5 take well under a
  second. All metrics of one ``summarize`` call share the same resamples.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

__all__ = [
    "ACC_STD_DDOF",
    "EDGE_STATISTICS",
    "STANDARD_METRICS",
    "BootstrapResult",
    "InstanceMetric",
    "accuracy_per_ordering",
    "acc_mean_std",
    "bootstrap_ci",
    "bootstrap_counts",
    "bootstrap_indices",
    "confusion_matrix",
    "consistency",
    "edge_statistics_warnings",
    "instance_statistics",
    "json_safe",
    "paired_bootstrap",
    "parse_success",
    "predicted_identity",
    "recall_per_position",
    "recall_std",
    "spread_over_draws",
    "standard_metric",
    "summarize",
]

ACC_STD_DDOF = 1  # the reference implementation's sample std over the T orderings
BOOTSTRAP_RESAMPLES = 10000  # bootstrap resamples over instances (evaluation.bootstrap's default)
# ... and the most allowed: the counts are a float32 [resamples, instances] matrix (100,000 x
# 1,000 instances: 400 MB); a larger number would run out of memory, not narrow the intervals.
MAX_BOOTSTRAP_RESAMPLES = 100_000
RSTD_DDOF = 1
EDGE_STATISTICS = ("undefined", "reference")  # first: the default (None where a statistic is undefined)


# --------------------------------------------------------------------------- checks


def _check_predictions(pred_pos: np.ndarray, target_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pred_pos, target_pos = np.asarray(pred_pos), np.asarray(target_pos)
    if pred_pos.ndim != 2 or pred_pos.shape != target_pos.shape:
        raise ValueError(
            f"pred_pos {pred_pos.shape} and target_pos {target_pos.shape} must both be [I, T]"
        )
    return pred_pos, target_pos


def _check_order(pred_pos: np.ndarray, order: np.ndarray) -> np.ndarray:
    order = np.asarray(order)
    if order.ndim != 3 or order.shape[:2] != pred_pos.shape:
        raise ValueError(f"order {order.shape} must be [I, T, N] matching predictions {pred_pos.shape}")
    return order


# --------------------------------------------------------------------------- point metrics


def accuracy_per_ordering(pred_pos: np.ndarray, target_pos: np.ndarray) -> np.ndarray:
    """Accuracy (%) under each ordering [T]."""
    pred_pos, target_pos = _check_predictions(pred_pos, target_pos)
    return 100.0 * (pred_pos == target_pos).mean(axis=0)


def acc_mean_std(pred_pos: np.ndarray, target_pos: np.ndarray, ddof: int = ACC_STD_DDOF) -> tuple[float, float]:
    """Acc as reported: mean and std (``ddof``) over the T orderings of the per-ordering accuracy (%)."""
    per_ordering = accuracy_per_ordering(pred_pos, target_pos)
    return float(per_ordering.mean()), float(per_ordering.std(ddof=ddof))


def recall_per_position(pred_pos: np.ndarray, target_pos: np.ndarray, n: int) -> np.ndarray:
    """Recall (%) per physical position [N]: accuracy over the rows whose ground truth is there."""
    pred_pos, target_pos = _check_predictions(pred_pos, target_pos)
    rows = np.bincount(target_pos.ravel(), minlength=n)
    hits = np.bincount(target_pos.ravel(), weights=(pred_pos == target_pos).ravel(), minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return 100.0 * hits / rows


def recall_std(pred_pos: np.ndarray, target_pos: np.ndarray, n: int) -> float:
    """RStd: sample std (ddof = 1) over the N positions of the per-position recall, in %."""
    return float(np.std(recall_per_position(pred_pos, target_pos, n), ddof=RSTD_DDOF))


def predicted_identity(pred_pos: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Image identity [I, T] each prediction names (``order[i, t, pred]``); -1 where unparsable."""
    pred_pos = np.asarray(pred_pos)
    order = _check_order(pred_pos, order)
    valid = pred_pos >= 0
    identity = np.take_along_axis(order, np.where(valid, pred_pos, 0)[..., None], axis=-1)[..., 0]
    return np.where(valid, identity, -1)


def _consistent_instances(pred_pos: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Bool [I]: every ordering valid and naming the same identity."""
    identity = predicted_identity(pred_pos, order)
    return np.all(identity == identity[:, :1], axis=1) & np.all(identity >= 0, axis=1)


def consistency(pred_pos: np.ndarray, order: np.ndarray) -> float:
    """Cons. (%): instances whose predicted image identity is the same under all T orderings."""
    return float(100.0 * _consistent_instances(pred_pos, order).mean())


def confusion_matrix(pred_pos: np.ndarray, target_pos: np.ndarray, n: int) -> np.ndarray:
    """Counts [N, N]: rows = ground-truth position, columns = predicted position.

    Unparsable predictions (-1) are left out; their number is ``I*T - counts.sum()``.
    """
    pred_pos, target_pos = _check_predictions(pred_pos, target_pos)
    valid = pred_pos >= 0
    flat = target_pos[valid] * n + pred_pos[valid]
    return np.bincount(flat, minlength=n * n).reshape(n, n)


def parse_success(parsed: np.ndarray) -> float:
    """Parse success (%) of generative answers: share of entries that are not -1."""
    return float(100.0 * (np.asarray(parsed) >= 0).mean())


# --------------------------------------------------------------------------- per-instance statistics


def instance_statistics(pred_pos: np.ndarray, target_pos: np.ndarray, order: np.ndarray) -> dict[str, np.ndarray]:
    """Additive per-instance statistics, each [I, k], from which every metric follows.

    ``correct`` [I, T]; ``hits`` / ``rows`` [I, N] (correct rows / rows with the ground
    truth at each position); ``consistent`` [I, 1]; ``valid`` [I, 1] (parsed answers).
    Summing them over any multiset of instances gives that multiset's metrics.
    """
    pred_pos, target_pos = _check_predictions(pred_pos, target_pos)
    order = _check_order(pred_pos, order)
    n = order.shape[-1]
    correct = pred_pos == target_pos
    position_one_hot = target_pos[..., None] == np.arange(n)  # [I, T, N]
    return {
        "correct": correct.astype(np.int32),
        "hits": (position_one_hot & correct[..., None]).sum(axis=1).astype(np.int32),
        "rows": position_one_hot.sum(axis=1).astype(np.int32),
        "consistent": _consistent_instances(pred_pos, order)[:, None].astype(np.int32),
        "valid": (pred_pos >= 0).sum(axis=1, keepdims=True).astype(np.int32),
    }


def _acc_per_ordering_from_sums(sums: Mapping[str, np.ndarray], n_instances: int) -> np.ndarray:
    return 100.0 * sums["correct"] / n_instances


def _acc_mean_from_sums(sums, n_instances):
    return _acc_per_ordering_from_sums(sums, n_instances).mean(axis=-1)


def _acc_std_from_sums(ddof: int, edge: str = EDGE_STATISTICS[0]) -> Callable[[Mapping[str, np.ndarray], int], np.ndarray]:
    def from_sums(sums, n_instances):
        per_ordering = _acc_per_ordering_from_sums(sums, n_instances)
        if edge == "reference" and per_ordering.shape[-1] < 2:
            return np.zeros(per_ordering.shape[:-1])
        return per_ordering.std(axis=-1, ddof=ddof)

    return from_sums


def _rstd_from_sums(edge: str = EDGE_STATISTICS[0]) -> Callable[[Mapping[str, np.ndarray], int], np.ndarray]:
    def from_sums(sums, n_instances):
        with np.errstate(invalid="ignore", divide="ignore"):
            recall = 100.0 * sums["hits"] / sums["rows"]
        if edge != "reference":
            return recall.std(axis=-1, ddof=RSTD_DDOF)
        # over the positions seen (recall defined); fewer than two values: 0.0
        seen = np.asarray(sums["rows"]) > 0
        count = seen.sum(axis=-1)
        values = np.where(seen, recall, 0.0)
        mean = values.sum(axis=-1) / np.maximum(count, 1)
        squares = (np.where(seen, values - mean[..., None], 0.0) ** 2).sum(axis=-1)
        return np.where(count > RSTD_DDOF, np.sqrt(squares / np.maximum(count - RSTD_DDOF, 1)), 0.0)

    return from_sums


def _cons_from_sums(sums, n_instances):
    return 100.0 * sums["consistent"][..., 0] / n_instances


def _parse_success_from_sums(sums, n_instances):
    n_orderings = sums["correct"].shape[-1]
    return 100.0 * sums["valid"][..., 0] / (n_instances * n_orderings)


@dataclass(frozen=True)
class InstanceMetric:
    """A metric that is a function of sums of per-instance statistics (fast bootstrap).

    ``statistics(*arrays)`` gives a dict of [I, k] arrays; ``from_sums(sums, I)`` maps
    their sums (any leading shape, e.g. [n_boot, k]) to the metric. Calling the object
    on the arrays gives the point estimate.
    """

    name: str
    statistics: Callable[..., dict[str, np.ndarray]]
    from_sums: Callable[[Mapping[str, np.ndarray], int], np.ndarray]

    def __call__(self, *arrays: np.ndarray) -> float:
        stats = self.statistics(*arrays)
        n_instances = next(iter(stats.values())).shape[0]
        return float(self.from_sums({k: v.sum(axis=0, dtype=np.float64) for k, v in stats.items()}, n_instances))


def standard_metric(name: str, acc_ddof: int = ACC_STD_DDOF, edge_statistics: str = EDGE_STATISTICS[0]) -> InstanceMetric:
    """The InstanceMetric for ``name`` in acc_mean, acc_std, rstd, cons, parse_success.

    Each takes the arrays ``(pred_pos, target_pos, order)``.
    """
    if edge_statistics not in EDGE_STATISTICS:
        raise ValueError(f"edge_statistics must be one of {EDGE_STATISTICS}, got {edge_statistics!r}")
    from_sums = {
        "acc_mean": _acc_mean_from_sums,
        "acc_std": _acc_std_from_sums(acc_ddof, edge_statistics),
        "rstd": _rstd_from_sums(edge_statistics),
        "cons": _cons_from_sums,
        "parse_success": _parse_success_from_sums,
    }
    if name not in from_sums:
        raise ValueError(f"unknown metric {name!r}; known: {sorted(from_sums)}")
    return InstanceMetric(name, instance_statistics, from_sums[name])


STANDARD_METRICS = ("acc_mean", "acc_std", "rstd", "cons", "parse_success")


# --------------------------------------------------------------------------- bootstrap


@lru_cache(maxsize=4)
def bootstrap_indices(n_instances: int, n_boot: int, seed: int) -> np.ndarray:
    """Resampled instance indices [n_boot, I] (read-only; cached so methods share resamples)."""
    if n_instances < 1 or n_boot < 1:
        raise ValueError(f"bootstrap needs n_instances >= 1 and n_boot >= 1, got {n_instances}, {n_boot}")
    rng = np.random.default_rng(seed)
    index = rng.integers(0, n_instances, size=(n_boot, n_instances), dtype=np.int32)
    index.setflags(write=False)
    return index


@lru_cache(maxsize=4)
def bootstrap_counts(n_instances: int, n_boot: int, seed: int) -> np.ndarray:
    """How often each instance appears in each resample [n_boot, I] (float32, read-only).

    Same resamples as :func:`bootstrap_indices`. Counts are small integers, so float32
    sums of integer statistics stay exact (below 2**24). Memory: 4 * n_boot * I bytes.
    """
    index = bootstrap_indices(n_instances, n_boot, seed)
    offsets = (np.arange(n_boot, dtype=np.int64) * n_instances)[:, None]
    counts = np.bincount((index + offsets).ravel(), minlength=n_boot * n_instances)
    counts = counts.reshape(n_boot, n_instances).astype(np.float32)
    counts.setflags(write=False)
    return counts


class BootstrapResult(NamedTuple):
    """Point estimate, percentile interval and the bootstrap replicates."""

    estimate: float
    ci_low: float
    ci_high: float
    replicates: np.ndarray


def _percentile_interval(replicates: np.ndarray, ci: float) -> tuple[float, float]:
    if not 0 < ci < 1:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    alpha = (1.0 - ci) / 2.0
    if np.all(np.isnan(replicates)):
        return float("nan"), float("nan")
    low, high = np.nanquantile(replicates, [alpha, 1.0 - alpha])
    return float(low), float(high)


def _resampled_sums(stats: Mapping[str, np.ndarray], counts: np.ndarray) -> dict[str, np.ndarray]:
    """Sums of each per-instance statistic [I, k] within every resample: [n_boot, k] (float64).

    Integer statistics are stacked into one matrix so ``counts`` is read once, in float32
    (exact while sums stay below 2**24); other statistics use a float64 product.
    """
    integer_keys = [k for k, v in stats.items() if np.issubdtype(v.dtype, np.integer) or v.dtype == bool]
    sums: dict[str, np.ndarray] = {}
    if integer_keys:
        stacked = np.concatenate([stats[k].astype(np.float32) for k in integer_keys], axis=1)
        product = (counts @ stacked).astype(np.float64)
        edges = np.cumsum([0] + [stats[k].shape[1] for k in integer_keys])
        sums.update({k: product[:, lo:hi] for k, lo, hi in zip(integer_keys, edges[:-1], edges[1:])})
    for key, value in stats.items():
        if key not in sums:
            sums[key] = counts.astype(np.float64) @ value.astype(np.float64, copy=False)
    return sums


def _replicates(metric: "InstanceMetric | Callable[..., float]", arrays: Sequence[np.ndarray], n_boot: int, seed: int) -> np.ndarray:
    n_instances = np.asarray(arrays[0]).shape[0]
    if isinstance(metric, InstanceMetric):
        sums = _resampled_sums(metric.statistics(*arrays), bootstrap_counts(n_instances, n_boot, seed))
        return np.asarray(metric.from_sums(sums, n_instances), dtype=np.float64)
    # A plain callable cannot be vectorised: evaluate it on each resample (slower).
    index = bootstrap_indices(n_instances, n_boot, seed)
    arrays = [np.asarray(a) for a in arrays]
    return np.array([metric(*(a[rows] for a in arrays)) for rows in index], dtype=np.float64)


def bootstrap_ci(
    metric_fn: "InstanceMetric | Callable[..., float]",
    *arrays: np.ndarray,
    n_boot: int = BOOTSTRAP_RESAMPLES,
    ci: float = 0.95,
    seed: int = 0,
) -> BootstrapResult:
    """Percentile bootstrap interval of ``metric_fn(*arrays)``, resampling instances (axis 0).

    All arrays are indexed by instance on their first axis; an instance's orderings stay
    together. An :class:`InstanceMetric` is vectorised (``W @ X``); any other callable
    is evaluated once per resample.
    """
    if not arrays:
        raise ValueError("bootstrap_ci needs at least one array")
    n_instances = np.asarray(arrays[0]).shape[0]
    if any(np.asarray(a).shape[0] != n_instances for a in arrays):
        raise ValueError(f"all arrays must share the instance axis 0; shapes {[np.shape(a) for a in arrays]}")
    estimate = float(metric_fn(*arrays))
    replicates = _replicates(metric_fn, arrays, n_boot, seed)
    return BootstrapResult(estimate, *_percentile_interval(replicates, ci), replicates)


def paired_bootstrap(
    pred_a: np.ndarray,
    pred_b: np.ndarray,
    target_pos: np.ndarray,
    order: np.ndarray,
    metric: "str | InstanceMetric" = "acc_mean",
    n_boot: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    ci: float = 0.95,
) -> dict[str, float]:
    """Difference ``metric(a) - metric(b)`` with a paired bootstrap interval and p-value.

    Both methods are evaluated on the same resampled instances. The two-sided p-value
    is ``min(1, 2 * min(P*(d <= 0), P*(d >= 0)))`` over the bootstrap differences, each
    tail counted as ``(1 + count) / (1 + n_boot)`` so it is never exactly zero.
    """
    metric = standard_metric(metric) if isinstance(metric, str) else metric
    a = bootstrap_ci(metric, pred_a, target_pos, order, n_boot=n_boot, ci=ci, seed=seed)
    b = bootstrap_ci(metric, pred_b, target_pos, order, n_boot=n_boot, ci=ci, seed=seed)
    differences = a.replicates - b.replicates
    low, high = _percentile_interval(differences, ci)
    tail_low = (1 + np.sum(differences <= 0)) / (1 + n_boot)
    tail_high = (1 + np.sum(differences >= 0)) / (1 + n_boot)
    return {
        "metric": metric.name,
        "difference": a.estimate - b.estimate,
        "ci_low": low,
        "ci_high": high,
        "p_value": float(min(1.0, 2.0 * min(tail_low, tail_high))),
        "n_boot": int(n_boot),
    }


# --------------------------------------------------------------------------- summaries


def json_safe(value: Any) -> Any:
    """Replace NaN/inf floats (e.g. the recall of a position no ground truth visited) by None,
    recursively, so the result is strict JSON."""
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def summarize(
    pred_pos: np.ndarray,
    target_pos: np.ndarray,
    order: np.ndarray,
    n: int,
    n_boot: int = BOOTSTRAP_RESAMPLES,
    ci: float = 0.95,
    seed: int = 0,
    acc_ddof: int = ACC_STD_DDOF,
    edge_statistics: str = EDGE_STATISTICS[0],
) -> dict[str, Any]:
    """Every metric of one method's predictions as a JSON-serialisable dict.

    Keys: ``acc_mean``, ``acc_std``, ``rstd``, ``cons``, ``parse_success`` (%), each with
    ``<name>_ci_low`` / ``<name>_ci_high`` (``None`` when ``n_boot = 0``; any undefined
    value, such as the recall of a position no ground truth visited, is also ``None``);
    ``acc_per_ordering`` [T], ``recall_per_position`` [N], ``confusion`` [N][N], and the
    sizes and bootstrap settings used.
    """
    pred_pos, target_pos = _check_predictions(pred_pos, target_pos)
    order = _check_order(pred_pos, order)
    if order.shape[-1] != n:
        raise ValueError(f"n = {n} but order has {order.shape[-1]} positions")
    if pred_pos.max(initial=-1) >= n or pred_pos.min(initial=0) < -1:
        raise ValueError(f"predictions must be positions 0..{n - 1} or -1 (unparsable)")
    n_instances, n_orderings = pred_pos.shape
    stats = instance_statistics(pred_pos, target_pos, order)
    point_sums = {k: v.sum(axis=0, dtype=np.float64) for k, v in stats.items()}
    boot_sums = _resampled_sums(stats, bootstrap_counts(n_instances, n_boot, seed)) if n_boot > 0 else None

    summary: dict[str, Any] = {}
    for name in STANDARD_METRICS:
        metric = standard_metric(name, acc_ddof, edge_statistics)
        summary[name] = float(metric.from_sums(point_sums, n_instances))
        low = high = None
        if boot_sums is not None:
            low, high = _percentile_interval(np.asarray(metric.from_sums(boot_sums, n_instances), np.float64), ci)
        summary[f"{name}_ci_low"], summary[f"{name}_ci_high"] = low, high
    summary.update(
        acc_per_ordering=accuracy_per_ordering(pred_pos, target_pos).tolist(),
        recall_per_position=recall_per_position(pred_pos, target_pos, n).tolist(),
        confusion=confusion_matrix(pred_pos, target_pos, n).tolist(),
        n_instances=int(n_instances),
        n_orderings=int(n_orderings),
        n_candidates=int(n),
        n_boot=int(n_boot),
        ci=float(ci),
        bootstrap_seed=int(seed),
        acc_std_ddof=int(acc_ddof),
    )
    return json_safe(summary)


def edge_statistics_warnings(target_pos: np.ndarray, n: int, edge_statistics: str) -> list[str]:
    """Where ``edge_statistics = reference`` gives a number for a statistic that is otherwise
    undefined (recorded in the evaluation output)."""
    if edge_statistics != "reference":
        return []
    target_pos = np.asarray(target_pos)
    warnings = []
    if target_pos.shape[1] < 2:
        warnings.append("T = 1 ordering: Acc's std is 0.0 (edge_statistics = reference, the reference's; "
                        "undefined: null)")
    unseen = np.flatnonzero(np.bincount(target_pos.ravel(), minlength=n) == 0).tolist()
    if unseen:
        warnings.append(f"position(s) {unseen} never hold the ground truth: RStd is over the {n - len(unseen)} "
                        "other positions (edge_statistics = reference, the reference's; undefined: null)")
    return warnings


def spread_over_draws(summaries: Sequence[Mapping[str, Any]], keys: Sequence[str] = STANDARD_METRICS) -> dict[str, Any]:
    """How much each metric moves across calibration draws: mean, std (ddof = 1), min, max.

    ``summaries`` are :func:`summarize` outputs, one per draw (seed) of the calibration set.
    """
    if not summaries:
        raise ValueError("spread_over_draws needs at least one summary")
    spread: dict[str, Any] = {"n_draws": len(summaries)}
    for key in keys:
        # An undefined metric (None in a summary, e.g. RStd with a never-visited position) stays undefined.
        values = np.array([np.nan if s[key] is None else float(s[key]) for s in summaries])
        spread[key] = {
            "mean": float(values.mean()),
            "std": float(values.std(ddof=1)) if values.size > 1 else 0.0,
            "min": float(values.min()),
            "max": float(values.max()),
            "values": values.tolist(),
        }
    return json_safe(spread)
