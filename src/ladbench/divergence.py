"""Logit-attention divergence statistics (METHOD.md §9) and the profiles of Figures 2-3.

Order robustness of a signal is measured per instance, on the vectors that assign a
value to each IMAGE IDENTITY (not position): under ordering ``t`` the identity
``order[i, t, p]`` receives the value at position ``p``. For an instance with ``T``
orderings this gives ``T`` vectors of length ``N``; the instance's statistic is

    rho_i = mean over the T(T-1)/2 pairs t < t' of Spearman(v_t, v_t'),

Spearman being the Pearson correlation of average ranks (ties share their mean rank).
A pair is skipped when either vector is constant (no ranking); an instance with no
usable pair is left out (``NaN``) and counted in ``n_undefined``. A signal that follows
the image content gives rho near 1; one that follows the position gives rho near the
correlation between the orderings' position patterns (near 0 for random orderings).
Scores are used raw; attention evidence is whatever per-position array the caller
passes, by default :func:`ladbench.methods.raw_attention` over the selected layers, or
the purified attention when a calibration's attention prior is given. The paper does
not say which it used; the purified one removes the positional pattern that the raw
attention shares with the logits, so report which one a number comes from.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ladbench.methods import LadSettings, identity_indexed, purified_attention, raw_attention
from ladbench.metrics import BOOTSTRAP_RESAMPLES, InstanceMetric, bootstrap_ci, json_safe

__all__ = [
    "Profile",
    "divergence_summary",
    "mean_pairwise_spearman",
    "profiles",
    "spearman_summary",
]


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..N along the last axis, ties given the mean of the ranks they share (scipy's
    ``rankdata``, method "average"); a slice holding a NaN is all NaN. Pairwise comparisons:
    N is a number of candidates (at most 16), so [..., N, N] stays small."""
    below = (values[..., None, :] < values[..., :, None]).sum(-1)
    tied = (values[..., None, :] == values[..., :, None]).sum(-1)
    ranks = below + (tied + 1) / 2.0
    ranks[np.isnan(values).any(axis=-1)] = np.nan
    return ranks


def mean_pairwise_spearman(identity_values: np.ndarray) -> np.ndarray:
    """Per instance [I]: mean Spearman correlation over all pairs of orderings.

    ``identity_values`` [I, T, N] are values indexed by image identity (see
    :func:`ladbench.methods.identity_indexed`). NaN where no pair is defined.
    """
    values = np.asarray(identity_values, dtype=np.float64)
    if values.ndim != 3 or values.shape[1] < 2:
        raise ValueError(f"need [I, T, N] values with T >= 2 orderings, got shape {values.shape}")
    ranks = average_ranks(values)
    centred = ranks - ranks.mean(axis=-1, keepdims=True)
    norms = np.sqrt((centred**2).sum(axis=-1))  # [I, T]; 0 for a constant vector
    gram = np.einsum("itn,isn->its", centred, centred)
    first, second = np.triu_indices(values.shape[1], k=1)
    denominator = norms[:, first] * norms[:, second]
    usable = denominator > 0
    rho = np.where(usable, gram[:, first, second] / np.where(usable, denominator, 1.0), 0.0)
    counts = usable.sum(axis=1)
    with np.errstate(invalid="ignore"):
        return np.where(counts > 0, rho.sum(axis=1) / counts, np.nan)


def _nan_mean_metric(name: str) -> InstanceMetric:
    """Mean over instances of a per-instance value, ignoring NaN (bootstrap-ready)."""

    def statistics(values: np.ndarray) -> dict[str, np.ndarray]:
        defined = ~np.isnan(values)
        return {"total": np.where(defined, values, 0.0)[:, None], "count": defined[:, None].astype(np.float64)}

    def from_sums(sums, n_instances):
        with np.errstate(invalid="ignore", divide="ignore"):
            return sums["total"][..., 0] / sums["count"][..., 0]

    return InstanceMetric(name, statistics, from_sums)


def spearman_summary(rho: np.ndarray, n_boot: int = BOOTSTRAP_RESAMPLES, ci: float = 0.95,
                     seed: int = 0) -> dict[str, Any]:
    """Mean, std over instances (ddof = 1) and a bootstrap CI of the mean of per-instance rho."""
    rho = np.asarray(rho, dtype=np.float64)
    defined = rho[~np.isnan(rho)]
    summary: dict[str, Any] = {
        "mean": float(defined.mean()) if defined.size else float("nan"),
        "std": float(defined.std(ddof=1)) if defined.size > 1 else float("nan"),
        "n_instances": int(rho.size),
        "n_undefined": int(rho.size - defined.size),
        "ci_low": None,
        "ci_high": None,
    }
    if n_boot > 0 and defined.size:
        result = bootstrap_ci(_nan_mean_metric("spearman"), rho, n_boot=n_boot, ci=ci, seed=seed)
        summary["ci_low"], summary["ci_high"] = result.ci_low, result.ci_high
    return json_safe(summary)


def divergence_summary(
    scores: np.ndarray,
    order: np.ndarray,
    attn_evidence: np.ndarray | None = None,
    attn: np.ndarray | None = None,
    *,
    attn_prior: np.ndarray | None = None,
    settings: LadSettings = LadSettings(),
    n_boot: int = BOOTSTRAP_RESAMPLES,
    ci: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Order robustness of logits versus attention (METHOD §9), with bootstrap CIs.

    ``scores`` [I, T, N]; ``attn_evidence`` [I, T, N] per position, or ``attn``
    [I, T, Lyr, N] from which the evidence over the layers ``settings`` selects is taken:
    the raw attention, or, with ``attn_prior`` [Lyr, N] (a calibration's), the purified
    attention ``log pi~``. Returns ``logits`` and ``attention`` summaries (see
    :func:`spearman_summary`), the per-instance rho arrays (lists), and the paired
    difference attention - logits with its CI.
    """
    evidence_kind = "given" if attn_evidence is not None else ("raw" if attn_prior is None else "purified")
    if attn_evidence is None:
        if attn is None:
            raise ValueError("divergence_summary needs attn_evidence [I, T, N] or attn [I, T, Lyr, N]")
        if attn_prior is None:
            attn_evidence = raw_attention(attn, settings)
        else:
            attn_evidence = purified_attention(attn, attn_prior, settings)
    scores, attn_evidence = np.asarray(scores), np.asarray(attn_evidence)
    if scores.shape != attn_evidence.shape:
        raise ValueError(f"scores {scores.shape} and attention evidence {attn_evidence.shape} must match")
    rho_logits = mean_pairwise_spearman(identity_indexed(scores, order))
    rho_attention = mean_pairwise_spearman(identity_indexed(attn_evidence, order))
    difference = rho_attention - rho_logits
    return json_safe({
        "definition": "per instance: mean over ordering pairs of Spearman rho between identity-indexed vectors",
        "attention_evidence": evidence_kind,
        "logits": spearman_summary(rho_logits, n_boot, ci, seed),
        "attention": spearman_summary(rho_attention, n_boot, ci, seed),
        "attention_minus_logits": spearman_summary(difference, n_boot, ci, seed),
        "rho_logits": rho_logits.tolist(),
        "rho_attention": rho_attention.tolist(),
    })


class Profile(NamedTuple):
    """Per ground-truth position ``i`` (rows) the mean / std of a per-position signal (columns)."""

    mean: np.ndarray  # [N, N]
    std: np.ndarray  # [N, N], ddof = 1 (NaN with fewer than two rows)
    count: np.ndarray  # [N] rows with the ground truth at position i


def profiles(values: np.ndarray, target_pos: np.ndarray) -> Profile:
    """Mean and std of ``values`` [..., N] over the rows grouped by ground-truth position."""
    values = np.asarray(values, dtype=np.float64)
    target_pos = np.asarray(target_pos)
    if values.shape[:-1] != target_pos.shape:
        raise ValueError(f"values {values.shape} and target_pos {target_pos.shape} do not match")
    n = values.shape[-1]
    rows = values.reshape(-1, n)
    target = target_pos.reshape(-1)
    count = np.bincount(target, minlength=n)
    total = np.zeros((n, n))
    np.add.at(total, target, rows)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count[:, None]
        squares = np.zeros((n, n))
        np.add.at(squares, target, (rows - mean[target]) ** 2)
        std = np.sqrt(squares / (count[:, None] - 1))
    std[count < 2] = np.nan
    return Profile(mean, std, count)
