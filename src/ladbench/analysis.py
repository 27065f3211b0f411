"""Everything the paper's ablation tables and figures need that is not
one evaluation run, from one vanilla-prompt cache (docs/formats.md §8).

The calibration is refitted here from the cache's own calibration pool (milliseconds),
because the sweeps need many calibrations: one per |D_cal| size and draw, and one per
way of averaging the scores. Computed:

- Table 7 readouts (Vanilla, raw attention, purified attention, LAD) and Table 4's
  ablation grid (readouts with and without prior, all layers, dynamic K in 1, 2, 4, 8);
- Figure 6: LAD accuracy versus tau and versus |D_cal| (several draws per size);
- LAD with each step switched between the reference implementation and the paper;
- the divergence statistics of METHOD §9 (logits vs raw and purified attention), with CIs;
- Figures 2-3 data: per ground-truth position, the mean candidate probabilities and the
  attention shares, with the per-row values in an ``.npz`` beside the JSON.

Every row of a table is computed on the first calibration draw (with bootstrap CIs over
instances); with several draws, ``calibration_draws`` says how much it moves between them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from ladbench import divergence, methods, metrics
from ladbench.calibration import Calibration, FitSettings, fit_calibration, log_softmax
from ladbench.arrays import CalibrationArrays, EvalArrays, calibration_arrays, eval_arrays
from ladbench.evaluation import summarize_predictions
from ladbench.inference.cache import read_cache
from ladbench.inputs import cache_identity, what_it_is
from ladbench.metrics import Bootstrap
from ladbench.settings import Settings, setting

__all__ = [
    "DEFAULT_DCAL_SIZES",
    "DEFAULT_TAUS",
    "Bootstrap",
    "SweepSettings",
    "ablation_rows",
    "analyze",
    "attention_shares",
    "dcal_sizes_for_pool",
    "dcal_sweep",
    "divergence_statistics",
    "fit_draws",
    "paper_vs_reference_rows",
    "position_profiles",
    "readout_rows",
    "tau_sweep_rows",
    "row_result",
]

# Figure 6 of the paper: |D_cal| in 1..100 and tau in 1..9.


@dataclass(frozen=True)
class SweepSettings(Settings):
    """The sweeps of Figure 6 (config ``analysis``; defaults: the paper's |D_cal| in 1..100 and tau in 1..9)."""

    section = "analysis"

    dcal_sizes: tuple[int, ...] = setting((1, 5, 10, 20, 50, 100), "|D_cal| values of the calibration-size sweep "
                                          "(clipped to the pool size; sizes a config lists must fit "
                                          "benchmarks.n_calibration_pool)", minimum=1)
    dcal_draws: int = setting(5, "calibration draws (seeds 0..n-1) per size in that sweep", minimum=1)
    taus: tuple[float, ...] = setting(tuple(range(1, 10)), "sharpening temperatures of the tau sweep (each > 0)",
                                      kind=float, above=0, below=float("inf"))


DEFAULT_DCAL_SIZES = SweepSettings.dcal_sizes
DEFAULT_TAUS = tuple(float(t) for t in SweepSettings.taus)
DEFAULT_DCAL_DRAWS = SweepSettings.dcal_draws
# Methods compared across |D_cal| (Vanilla needs no calibration: it is the flat baseline).
DCAL_METHODS = ("lad", "pride", "purified_attention")


# --------------------------------------------------------------------------- small helpers


def fit_draws(cal: CalibrationArrays, n_cal: int, seeds: Sequence[int], fit: FitSettings = FitSettings()
              ) -> list[Calibration]:
    """One calibration per seed, each from its own draw of ``n_cal`` pool instances (with the
    evaluation_head source every seed takes the same first instances, so one is fitted)."""
    seeds = seeds[:1] if cal.source == "evaluation_head" else seeds
    return [fit_calibration(cal.scores, cal.attn, cal.target_pos, n_cal=n_cal, seed=s, source=cal.source,
                            **fit.kwargs()) for s in seeds]


def dcal_sizes_for_pool(requested: Sequence[int], pool_size: int) -> list[int]:
    """The |D_cal| sizes that a pool of ``pool_size`` instances allows: each clipped to the
    pool, duplicates dropped, ascending (a size above the pool becomes the whole pool)."""
    if pool_size < 1:
        raise ValueError(f"the cache has an empty calibration pool (pool size {pool_size})")
    bad = [s for s in requested if int(s) < 1]
    if bad:
        raise ValueError(f"|D_cal| sizes must be >= 1, got {bad}")
    return sorted({min(int(s), pool_size) for s in requested})


def row_result(
    method_row: methods.MethodRow, arrays: EvalArrays, calibrations: Sequence[Calibration], boot: Bootstrap
) -> dict[str, Any]:
    """One table row: the method's metrics on the first draw (with CIs) and, with several
    draws, their spread. A row that cannot run on this cache (e.g. K larger than the
    layer range) is kept with an ``unavailable`` reason so the table shows "–"."""
    row: dict[str, Any] = {"label": method_row.label, "method": method_row.method,
                           "settings": method_row.settings.as_dict()}
    try:
        predictions = [method_row.predict(arrays, cal) for cal in calibrations]
    except ValueError as error:
        return {**row, "unavailable": str(error)}
    row["metrics"] = summarize_predictions(predictions[0], arrays, boot)
    if methods.METHODS[method_row.method].selects_layers:
        row["warnings"] = methods.selection_warnings(arrays.attn, method_row.settings)
    if len(predictions) > 1:
        row["calibration_draws"] = metrics.spread_over_draws([summarize_predictions(p, arrays, boot, False) for p in predictions])
    return row


# --------------------------------------------------------------------------- tables


def readout_rows(arrays: EvalArrays, calibrations: Sequence[Calibration], base: methods.LadSettings, boot: Bootstrap) -> list[dict]:
    """Table 7: the registry's readouts (Vanilla, raw attention, purified attention, LAD), at the base settings."""
    rows = [methods.MethodRow(name, name, base) for name in methods.readout_methods()]
    return [row_result(row, arrays, calibrations, boot) for row in rows]


def _ablation_labels(method_row: methods.MethodRow) -> dict[str, Any]:
    """Table 4's Strategy / Prior / K columns for a row of :func:`ladbench.methods.ablation_grid`."""
    s = method_row.settings
    if method_row.label == method_row.method and method_row.method in methods.ablation_methods():
        declared = methods.METHODS[method_row.method]            # a method's own row (Method.ablation)
        return {"strategy": declared.label, "prior": declared.needs_calibration,
                "top_k": s.top_k if declared.selects_layers else None}
    if method_row.method == "raw_attention":
        return {"strategy": "Attn readout", "prior": False, "top_k": s.top_k}
    if method_row.method == "purified_attention":
        return {"strategy": "Attn readout", "prior": s.use_prior, "top_k": s.top_k}
    if s.all_layers:
        return {"strategy": "All layers", "prior": s.use_prior, "top_k": None}
    return {"strategy": "Dynamic", "prior": s.use_prior, "top_k": s.top_k}


def ablation_rows(arrays: EvalArrays, calibrations: Sequence[Calibration], base: methods.LadSettings, boot: Bootstrap) -> list[dict]:
    """Table 4: every row of :func:`ladbench.methods.ablation_grid` around the base settings."""
    return [
        {**_ablation_labels(v), **row_result(v, arrays, calibrations, boot)} for v in methods.ablation_grid(base)
    ]


def tau_sweep_rows(
    arrays: EvalArrays, calibrations: Sequence[Calibration], base: methods.LadSettings, taus: Sequence[float], boot: Bootstrap
) -> list[dict]:
    """Figure 6 (right): LAD at each sharpening temperature tau."""
    return [
        {"tau": v.settings.tau, **row_result(v, arrays, calibrations, boot)}
        for v in methods.tau_sweep(base, taus)
    ]


def dcal_sweep(
    arrays: EvalArrays,
    cal: CalibrationArrays,
    base: methods.LadSettings,
    sizes: Sequence[int],
    n_draws: int,
    fit: FitSettings = FitSettings(),
    progress: bool = False,
    boot: Bootstrap | None = None,
) -> list[dict]:
    """Figure 6 (left): accuracy of LAD, PriDe and the purified readout versus |D_cal|.

    ``n_draws`` calibration sets (seeds 0..n_draws-1) per size; per method the spread of
    every metric over the draws (:func:`ladbench.metrics.spread_over_draws`). When a size
    is the whole pool every draw is the same set, so one draw is used.
    """
    pool = cal.scores.shape[0]
    boot = boot or Bootstrap()
    rows = []
    for size in tqdm(dcal_sizes_for_pool(sizes, pool), desc="|D_cal| sweep", disable=not progress):
        seeds = [0] if size == pool or cal.source == "evaluation_head" else list(range(n_draws))
        calibrations = fit_draws(cal, size, seeds, fit)
        per_method = {}
        for name in DCAL_METHODS:
            method_row = methods.MethodRow(name, name, base)
            summaries = [summarize_predictions(method_row.predict(arrays, c), arrays, boot, False) for c in calibrations]
            per_method[name] = metrics.spread_over_draws(summaries)
        rows.append({"n_cal": int(size), "seeds": seeds, "methods": per_method})
    return rows


def paper_vs_reference_rows(
    arrays: EvalArrays, cal: CalibrationArrays, base: methods.LadSettings, n_cal: int, seeds: Sequence[int],
    boot: Bootstrap, fit: FitSettings = FitSettings()) -> list[dict]:
    """LAD with each switchable step as in the reference implementation or the paper:
    the score average of the calibration (Eqs. 1-3) x layer mean (Eqs. 10-11) x mixture
    (Eq. 13); and PriDe as the reference implements it versus the original PriDe."""
    rows = []
    for average in ("reference", "paper"):
        calibrations = fit_draws(cal, n_cal, seeds, replace(fit, score_average=average))
        for method_row in methods.paper_vs_reference_grid(base):
            s = method_row.settings
            rows.append({
                "score_average": average, "layer_mean": s.layer_mean, "mixture": s.mixture,
                **row_result(method_row, arrays, calibrations, boot),
            })
        for name in ("pride", "pride_original"):
            rows.append({
                "score_average": average, "layer_mean": None, "mixture": None,
                **row_result(methods.MethodRow(name, name, base), arrays, calibrations, boot),
            })
    return rows


# --------------------------------------------------------------------------- divergence and profiles


def _without_instance_lists(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in ("rho_logits", "rho_attention")}


def layer_selection(base: methods.LadSettings) -> methods.LadSettings:
    """``base``'s layer selection (K, range, ties, K beyond the range, the windowed layers left
    out) with the other settings at their defaults: what the divergence statistics and the
    profiles read the attention with (the layers past a model's last are clipped there whatever
    ``lad.layers_beyond_depth``)."""
    return methods.LadSettings(top_k=base.top_k, layer_range=base.layer_range, layer_ties=base.layer_ties,
                               k_beyond_range=base.k_beyond_range, unseen_layers=base.unseen_layers)


def divergence_statistics(
    arrays: EvalArrays, calibration: Calibration, base: methods.LadSettings, boot: Bootstrap
) -> tuple[dict, dict[str, np.ndarray]]:
    """METHOD §9 with the raw and with the purified attention evidence.

    Returns the JSON summaries (without per-instance lists) and the per-instance rho
    arrays for the ``.npz`` (``rho_logits``, ``rho_attention_raw``, ``rho_attention_purified``).
    """
    common = dict(settings=layer_selection(base), n_boot=boot.n_boot, ci=boot.ci, seed=boot.seed)
    raw = divergence.divergence_summary(arrays.scores, arrays.order, attn=arrays.attn, **common)
    purified = divergence.divergence_summary(
        arrays.scores, arrays.order, attn=arrays.attn, attn_prior=calibration.attn_prior, **common
    )
    per_instance = {
        "rho_logits": np.asarray(raw["rho_logits"], dtype=np.float64),
        "rho_attention_raw": np.asarray(raw["rho_attention"], dtype=np.float64),
        "rho_attention_purified": np.asarray(purified["rho_attention"], dtype=np.float64),
    }
    summary = {"raw": _without_instance_lists(raw), "purified": _without_instance_lists(purified)}
    return summary, per_instance


def attention_shares(values: np.ndarray) -> np.ndarray:
    """Normalise non-negative values over the last axis so they sum to one (0/0 -> uniform)."""
    values = np.asarray(values, dtype=np.float64)
    total = values.sum(axis=-1, keepdims=True)
    uniform = np.full_like(values, 1.0 / values.shape[-1])
    return np.divide(values, total, out=uniform, where=total > 0)


def position_profiles(
    arrays: EvalArrays, calibration: Calibration, base: methods.LadSettings
) -> tuple[dict, dict[str, np.ndarray]]:
    """Figures 2-3 data, per ground-truth position: the mean candidate probabilities
    (softmax of the scores over the N candidates), the share of the image attention each
    position receives (raw evidence over the selected layers, normalised), and the
    purified attention posterior ``softmax(log pi~)`` (tau = 1).

    Returns the profiles (mean, std, count as lists) and the per-row values [I, T, N].
    """
    probabilities = np.exp(log_softmax(arrays.scores))
    selection = replace(layer_selection(base), layer_mean=base.layer_mean)
    raw_share = attention_shares(methods.raw_attention(arrays.attn, selection))
    log_pi = methods.purified_attention(arrays.attn, calibration.attn_prior, selection)
    purified_share = methods.sharpen(log_pi, 1.0)
    rows = {"probability": probabilities, "attention_share": raw_share, "purified_share": purified_share}
    summary = {}
    for name, values in rows.items():
        profile = divergence.profiles(values, arrays.target_pos)
        summary[name] = metrics.json_safe(
            {"mean": profile.mean.tolist(), "std": profile.std.tolist(), "count": profile.count.tolist()}
        )
    return summary, rows


# --------------------------------------------------------------------------- the stage


def analyze(
    cache_path: str,
    settings: methods.MethodSettings,
    *,
    n_cal: int,
    seeds: Sequence[int],
    fit: FitSettings = FitSettings(),
    sweeps: SweepSettings = SweepSettings(),
    boot: Bootstrap = Bootstrap(),
    progress: bool = False,
) -> tuple[dict, dict[str, np.ndarray]]:
    """Every analysis of one vanilla-prompt cache: (JSON document, arrays for the .npz)."""
    base = settings.lad
    cache = read_cache(cache_path)
    if cache.has_shifts or "parsed" in cache:
        raise ValueError(f"{cache_path}: analyze needs a cache of scores and attention (vanilla prompt), "
                         f"not a {cache.attrs.get('variant')!r} cache")
    arrays = eval_arrays(cache)
    cal = calibration_arrays(cache)
    pool = int(cal.scores.shape[0])
    if n_cal > pool:
        raise ValueError(f"{cache_path}: |D_cal| = {n_cal} but the calibration pool has {pool} instances")
    if not seeds:
        raise ValueError("analyze needs at least one calibration seed")
    calibrations = fit_draws(cal, n_cal, seeds, fit)
    beyond = sorted({int(size) for size in sweeps.dcal_sizes if int(size) > pool})
    if beyond and tuple(sweeps.dcal_sizes) != DEFAULT_DCAL_SIZES:     # the defaults are clipped as documented
        print(f"analyze: warning: analysis.dcal_sizes (--dcal-sizes) {beyond} above the calibration pool of {pool} "
              f"instances of {cache_path}: swept at {pool}", file=sys.stderr)

    sections = [
        ("readouts", lambda: readout_rows(arrays, calibrations, base, boot)),
        ("ablation", lambda: ablation_rows(arrays, calibrations, base, boot)),
        ("tau_sweep", lambda: tau_sweep_rows(arrays, calibrations, base, sweeps.taus, boot)),
        ("dcal_sweep", lambda: dcal_sweep(arrays, cal, base, sweeps.dcal_sizes, sweeps.dcal_draws, fit, boot=boot)),
        ("paper_vs_reference", lambda: paper_vs_reference_rows(arrays, cal, base, n_cal, seeds, boot, fit)),
    ]
    document: dict[str, Any] = {
        **what_it_is(cache.attrs),
        "cache": str(cache_path),
        "inputs": {"cache": cache_identity(cache_path, cache.attrs)},
        "model_path": cache.attrs.get("model_path"),
        "n_instances": int(arrays.scores.shape[0]),
        "n_orderings": int(arrays.scores.shape[1]),
        "n_candidates": int(arrays.scores.shape[-1]),
        "n_layers": int(arrays.attn.shape[-2]),
        "n_calibration_pool": pool,
        "calibration_source": cal.source,
        "settings": {
            **settings.as_dict(), "n_cal": int(n_cal), "calibration_seeds": [int(s) for s in seeds],
            **fit.as_dict(), "dcal_sizes": dcal_sizes_for_pool(sweeps.dcal_sizes, pool),
            "dcal_draws": int(sweeps.dcal_draws), "taus": [float(t) for t in sweeps.taus], **boot.kwargs(),
        },
    }
    for name, compute in tqdm(sections, desc="analyze", disable=not progress):
        document[name] = compute()
    document["divergence"], rho = divergence_statistics(arrays, calibrations[0], base, boot)
    document["profiles"], rows = position_profiles(arrays, calibrations[0], base)
    extra = {"target_pos": arrays.target_pos.astype(np.int16), "order": arrays.order.astype(np.int16), **rho, **rows}
    return document, extra
