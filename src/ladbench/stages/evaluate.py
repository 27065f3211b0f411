"""Stage `evaluate`: every configured method on a cache's evaluation rows, with one
calibration per draw (seed), and metrics with bootstrap confidence intervals.

The calibration may come from another benchmark's cache (calibration transfer): it only
has to share N and the model's layer count. Writes a JSON summary and, beside it, an
``.npz`` of per-instance predictions (the first draw) for figures and paired tests.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import numpy as np

from ladbench import methods, metrics
from ladbench.analysis import summarize_predictions
from ladbench.atomic import atomic_path, atomic_write_json, signed
from ladbench.calibration import Calibration
from ladbench.cli import output_file
from ladbench.stages.options import (add_bootstrap_arguments, add_lad_arguments, bootstrap_settings, lad_settings,
                                     metrics_line)
from ladbench.inference.cache import read_cache
from ladbench.stages.arrays import EvalArrays, eval_arrays
from ladbench.stages.inputs import cache_identity, calibration_record, check_calibrations, what_it_is
from ladbench.variants import VARIANTS, variant


def register(subparsers) -> None:
    parser = subparsers.add_parser("evaluate", help="evaluate methods from a cache and calibrations")
    parser.add_argument("--cache", required=True, help="inference cache (HDF5) of the test benchmark")
    parser.add_argument(
        "--calibration", nargs="*", default=[],
        help="calibration .npz, one per draw (needed by pride, pride_original, lad, purified_attention)",
    )
    parser.add_argument(
        "--methods", nargs="+", default=None,
        help="methods to evaluate (default: by the cache's prompt variant: "
        + "; ".join(f"{name} -> {' '.join(v.methods)}" for name, v in VARIANTS.items()) + ")",
    )
    add_lad_arguments(parser)
    add_bootstrap_arguments(parser)
    parser.add_argument("--transfer", action="store_true",
                        help="the calibrations were fitted on another benchmark (calibration transfer); "
                        "without it they must come from this cache's benchmark")
    parser.add_argument("--out", required=True, type=output_file(".json"), help="output .json (predictions go to the same name .npz)")
    parser.set_defaults(func=run)


def check_methods(names) -> None:
    for name in names:
        methods.method(name)                         # an unknown name: a one-line error listing the known ones


def default_methods(prompt: str) -> list[str]:
    """The methods a cache of prompt variant ``prompt`` is evaluated with unless --methods says otherwise."""
    return list(variant(prompt).methods)


def predict_all(names, arrays: EvalArrays, calibration: Calibration | None, settings: methods.LadSettings) -> dict[str, np.ndarray]:
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


def evaluation_warnings(names, arrays: EvalArrays, settings: methods.LadSettings, boot,
                        calibrations: list[Calibration]) -> list[str]:
    """Where a rule of docs/method.md's table of choices decided something: the layer selection's
    (lad.layer_ties, lad.k_beyond_range, lad.layers_beyond_depth), the reply parse
    (evaluation.reply_parse), undefined statistics (evaluation.edge_statistics) and the
    calibrations' fits (calibration.empty_positions)."""
    warnings = []
    if any(methods.method(name).selects_layers for name in names):
        warnings += methods.selection_warnings(arrays.attn, settings)
    if "vanilla_generate" in names:
        warnings += methods.reply_parse_warnings(arrays, settings)
    warnings += metrics.edge_statistics_warnings(arrays.target_pos, arrays.order.shape[-1], boot.edge_statistics)
    for calibration in calibrations:
        warnings += [warning for warning in calibration.warnings if warning not in warnings]
    return warnings


def run(args: argparse.Namespace) -> None:
    cache = read_cache(args.cache)
    arrays = eval_arrays(cache)
    names = args.methods or default_methods(cache.attrs.get("variant", "vanilla"))
    check_methods(names)
    check_shifts(args.cache, names, cache.has_shifts)
    loaded = [Calibration.from_npz(path) for path in args.calibration]
    transfer = check_calibrations(args.cache, cache.attrs, zip(args.calibration, loaded), transfer=args.transfer)
    calibrations = loaded or [None]
    settings = lad_settings(args, cache.attrs)
    n = arrays.scores.shape[-1]
    draws = [predict_all(names, arrays, cal, settings) for cal in calibrations]
    if cache.has_shifts:
        arrays = unshifted(arrays)

    boot = bootstrap_settings(args)
    summary = {}
    for name in names:
        summary[name] = summarize_predictions(draws[0][name], arrays, boot)
        if len(draws) > 1:
            summary[name]["calibration_draws"] = metrics.spread_over_draws(
                [summarize_predictions(d[name], arrays, boot, intervals=False) for d in draws])
    result = {
        **what_it_is(cache.attrs),
        # the benchmark the calibrations were fitted on (another one: a calibration transfer)
        "cal_benchmark": (transfer or {}).get("calibrated_on") or cache.attrs.get("benchmark_name"),
        "cache": str(args.cache),
        "calibrations": [str(p) for p in args.calibration],
        "inputs": {"cache": cache_identity(args.cache, cache.attrs),
                   "calibrations": [calibration_record(p, c) for p, c in zip(args.calibration, loaded)]},
        "transfer": transfer,
        # pool (disjoint from the evaluation set) or evaluation_head (the reference's: its first instances)
        "calibration_source": calibrations[0].settings.get("source", "pool") if calibrations[0] else None,
        "n_instances": int(arrays.scores.shape[0]),
        "n_orderings": int(arrays.scores.shape[1]),
        "n_candidates": int(n),
        "settings": {**settings.as_dict(), "bootstrap": boot.n_boot, "ci": boot.ci, "seed": boot.seed,
                     "acc_ddof": boot.acc_ddof, "edge_statistics": boot.edge_statistics},
        "methods": summary,
        "warnings": evaluation_warnings(names, arrays, settings, boot, loaded),
    }
    atomic_write_json(args.out, signed(result), indent=1)
    npz = Path(args.out).with_suffix(".npz")
    with atomic_path(npz) as tmp:
        with open(tmp, "wb") as handle:
            np.savez(handle, target_pos=arrays.target_pos, order=arrays.order,
                     model_kind=np.array(cache.attrs.get("model_kind") or ""),
                     **{f"pred_{name}": pred for name, pred in draws[0].items()})
    for name in names:
        print(metrics_line(name, summary[name]))
    for warning in result["warnings"]:
        print(f"warning: {warning}")
    print(f"wrote {args.out} and {npz}")
