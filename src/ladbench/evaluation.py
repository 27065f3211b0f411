"""Every configured method on a cache's evaluation rows, with one calibration per draw (seed),
and metrics with bootstrap confidence intervals: the evaluation record (docs/formats.md §6);
and the calibration of one |D_cal| draw fitted from a cache (§5).

The calibration may come from another benchmark's cache (calibration transfer): it only
has to share N and the model's layer count (:func:`ladbench.inputs.check_calibrations`).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Sequence

import numpy as np

from ladbench import methods, metrics
from ladbench.arrays import EvalArrays, calibration_arrays, eval_arrays
from ladbench.calibration import Calibration, FitSettings, fit_calibration
from ladbench.inference.cache import read_cache
from ladbench.inputs import cache_identity, calibration_record, check_calibrations, what_it_is
from ladbench.metrics import Bootstrap
from ladbench.variants import variant

__all__ = ["calibration_from_cache", "default_methods", "evaluate", "evaluation_warnings", "metrics_line",
           "summarize_predictions"]


def summarize_predictions(pred: np.ndarray, arrays: EvalArrays, boot: Bootstrap, intervals: bool = True) -> dict[str, Any]:
    """:func:`metrics.summarize` of one method's predictions with ``boot``'s options;
    ``intervals=False`` skips the bootstrap (spreads over calibration draws)."""
    n = arrays.scores.shape[-1]
    boot = boot if intervals else replace(boot, n_boot=0)
    return metrics.summarize(pred, arrays.target_pos, arrays.order, n, **boot.kwargs())


def metrics_line(label: str, summary: dict) -> str:
    """``vanilla: Acc 51.70 ± 1.38  RStd 36.27  Cons 6.61``; "–" for a metric that is undefined
    on this set (None: e.g. RStd when some position never holds the target)."""
    m = {key: "–" if summary.get(key) is None else f"{summary[key]:.2f}"
         for key in ("acc_mean", "acc_std", "rstd", "cons")}
    return f"{label:>20s}: Acc {m['acc_mean']} ± {m['acc_std']}  RStd {m['rstd']}  Cons {m['cons']}"


def calibration_from_cache(cache_path: str, n_cal: int, seed: int, fit: FitSettings = FitSettings()) -> Calibration:
    """The calibration of one draw of ``n_cal`` instances (``seed``) from a cache's calibration
    rows, recording the cache it was fitted on."""
    cache = read_cache(cache_path)
    cal = calibration_arrays(cache)
    calibration = fit_calibration(cal.scores, cal.attn, cal.target_pos, n_cal=n_cal, seed=seed,
                                  source=cal.source, **fit.kwargs())   # the source: from the benchmark, via the cache
    return replace(calibration, source=cache_identity(cache_path, cache.attrs))


def check_methods(names) -> None:
    for name in names:
        methods.method(name)                         # an unknown name: a one-line error listing the known ones


def default_methods(prompt: str, configured: Sequence[str] | None = None) -> list[str]:
    """The methods a cache of prompt variant ``prompt`` is evaluated with: its variant's own
    (ladbench.variants), where a vanilla-prompt cache takes ``configured`` when given (the
    config's evaluation.methods: a choice among the readouts of the one scoring pass)."""
    if configured and prompt == "vanilla":
        return list(configured)
    return list(variant(prompt).methods)


def predict_all(names, arrays: EvalArrays, calibration: Calibration | None, settings: methods.MethodSettings) -> dict[str, np.ndarray]:
    needing = sorted(name for name in names if methods.method(name).needs_calibration)
    if calibration is None and needing:
        raise ValueError(f"methods {needing} need --calibration")
    return {name: methods.METHODS[name](arrays, calibration, settings) for name in names}


def check_shifts(path, names, shifted: bool) -> None:
    """A cache whose orderings are also shown at their N cyclic shifts (permavg's row plan) is
    read only by the methods that read shifts (``Method.reads_shifts``)."""
    wrong = [name for name in names if not methods.method(name).reads_shifts]
    if shifted and wrong:
        readers = [name for name, m in methods.METHODS.items() if m.reads_shifts]
        raise ValueError(f"{path}: a cache of cyclic shifts per ordering is evaluated with {readers} only, "
                         f"not {wrong}")


def unshifted(arrays: EvalArrays) -> EvalArrays:
    """The rows of shift 0 of a cache of cyclic shifts per ordering ([I, T, N(shift), N] -> [I, T, N]):
    the orderings the metrics are computed under."""
    return EvalArrays(**{f.name: None if getattr(arrays, f.name) is None else getattr(arrays, f.name)[:, :, 0]
                         for f in fields(arrays)})


def evaluation_warnings(names, arrays: EvalArrays, settings: methods.MethodSettings, boot: Bootstrap,
                        calibrations: list[Calibration]) -> list[str]:
    """Where a rule of docs/method.md's table of choices decided something: the layer selection's
    (lad.layer_ties, lad.k_beyond_range, lad.layers_beyond_depth), the reply parse
    (evaluation.reply_parse), undefined statistics (evaluation.edge_statistics) and the
    calibrations' fits (calibration.empty_positions)."""
    warnings = []
    if any(methods.method(name).selects_layers for name in names):
        warnings += methods.selection_warnings(arrays.attn, settings.lad)
    if "vanilla_generate" in names:
        warnings += methods.reply_parse_warnings(arrays, settings.readout.reply_parse)
    warnings += metrics.edge_statistics_warnings(arrays.target_pos, arrays.order.shape[-1], boot.edge_statistics)
    for calibration in calibrations:
        warnings += [warning for warning in calibration.warnings if warning not in warnings]
    return warnings


def evaluate(cache_path: str, calibration_paths: Sequence[str], names: Sequence[str] | None,
             settings: methods.MethodSettings, boot: Bootstrap, transfer: bool = False
             ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The evaluation record of ``names`` (default: the cache's prompt variant's methods) on a
    cache, with the calibrations of ``calibration_paths`` (one per draw), and the arrays of
    its ``.npz`` (the first draw's predictions)."""
    cache = read_cache(cache_path)
    arrays = eval_arrays(cache)
    names = list(names or default_methods(cache.attrs.get("variant", "vanilla")))
    check_methods(names)
    check_shifts(cache_path, names, cache.has_shifts)
    loaded = [Calibration.from_npz(path) for path in calibration_paths]
    transfer_record = check_calibrations(cache_path, cache.attrs, zip(calibration_paths, loaded), transfer=transfer)
    calibrations = loaded or [None]
    draws = [predict_all(names, arrays, cal, settings) for cal in calibrations]
    if cache.has_shifts:
        arrays = unshifted(arrays)

    summary = {}
    for name in names:
        summary[name] = summarize_predictions(draws[0][name], arrays, boot)
        if len(draws) > 1:
            summary[name]["calibration_draws"] = metrics.spread_over_draws(
                [summarize_predictions(d[name], arrays, boot, intervals=False) for d in draws])
    record = {
        **what_it_is(cache.attrs),
        # the benchmark the calibrations were fitted on (another one: a calibration transfer)
        "cal_benchmark": (transfer_record or {}).get("calibrated_on") or cache.attrs.get("benchmark_name"),
        "cache": str(cache_path),
        "calibrations": [str(p) for p in calibration_paths],
        "inputs": {"cache": cache_identity(cache_path, cache.attrs),
                   "calibrations": [calibration_record(p, c) for p, c in zip(calibration_paths, loaded)]},
        "transfer": transfer_record,
        # pool (disjoint from the evaluation set) or evaluation_head (the reference's: its first instances)
        "calibration_source": calibrations[0].settings.get("source", "pool") if calibrations[0] else None,
        "n_instances": int(arrays.scores.shape[0]),
        "n_orderings": int(arrays.scores.shape[1]),
        "n_candidates": int(arrays.scores.shape[-1]),
        "settings": {**settings.as_dict(), "bootstrap": boot.n_boot, "ci": boot.ci, "seed": boot.seed,
                     "acc_ddof": boot.acc_ddof, "edge_statistics": boot.edge_statistics},
        "methods": summary,
        "warnings": evaluation_warnings(names, arrays, settings, boot, loaded),
    }
    predictions = {"target_pos": arrays.target_pos, "order": arrays.order,
                   "model_kind": np.array(cache.attrs.get("model_kind") or ""),
                   **{f"pred_{name}": pred for name, pred in draws[0].items()}}
    return record, predictions
