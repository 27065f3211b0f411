"""Stage `evaluate`: every configured method on a cache's evaluation rows, with one
calibration per draw (seed), and metrics with bootstrap confidence intervals.

The calibration may come from another benchmark's cache (calibration transfer): it only
has to share N and the model's layer count. Writes a JSON summary and, beside it, an
``.npz`` of per-instance predictions (the first draw) for figures and paired tests.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ladbench import methods, metrics
from ladbench.atomic import atomic_path, atomic_write_json
from ladbench.calibration import Calibration
from ladbench.cli import output_file
from ladbench.stages.options import add_bootstrap_arguments, add_lad_arguments, lad_settings, metrics_line
from ladbench.inference.cache import read_cache
from ladbench.stages.arrays import EvalArrays, eval_arrays
from ladbench.stages.inputs import cache_identity, calibration_record, check_calibrations, what_it_is


def register(subparsers) -> None:
    parser = subparsers.add_parser("evaluate", help="evaluate methods from a cache and calibrations")
    parser.add_argument("--cache", required=True, help="inference cache (HDF5) of the test benchmark")
    parser.add_argument(
        "--calibration", nargs="*", default=[],
        help="calibration .npz, one per draw (needed by pride, pride_original, lad, purified_attention)",
    )
    parser.add_argument(
        "--methods", nargs="+", default=None,
        help="methods to evaluate (default: by the cache's prompt variant: vanilla -> vanilla pride lad; "
        "instruction/sofa -> vanilla; permavg -> permutation_average; cot/sc -> generated)",
    )
    add_lad_arguments(parser)
    add_bootstrap_arguments(parser)
    parser.add_argument("--transfer", action="store_true",
                        help="the calibrations were fitted on another benchmark (calibration transfer); "
                        "without it they must come from this cache's benchmark")
    parser.add_argument("--out", required=True, type=output_file(".json"), help="output .json (predictions go to the same name .npz)")
    parser.set_defaults(func=run)


# Methods that read a calibration; the others need none (e.g. on CoT caches).
NEEDS_CALIBRATION = frozenset({"pride", "pride_original", "lad", "purified_attention"})
# Methods that select layers by attention strength (their selection warnings are recorded).
SELECTS_LAYERS = frozenset({"lad", "raw_attention", "purified_attention"})
# What a cache of each prompt variant is evaluated with, unless --methods says otherwise.
METHODS_FOR_PROMPT = {
    "vanilla": ("vanilla", "pride", "lad"),
    "instruction": ("vanilla",),
    "sofa": ("vanilla",),
    "permavg": ("permutation_average",),
    "cot": ("generated",),
    "sc": ("generated",),
}


def check_methods(names) -> None:
    unknown = sorted(set(names) - set(methods.METHODS))
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {sorted(methods.METHODS)}")


def predict_all(names, arrays: EvalArrays, calibration: Calibration | None, settings: methods.LadSettings) -> dict[str, np.ndarray]:
    if calibration is None and NEEDS_CALIBRATION.intersection(names):
        raise ValueError(f"methods {sorted(NEEDS_CALIBRATION.intersection(names))} need --calibration")
    return {name: methods.METHODS[name](arrays, calibration, settings) for name in names}


def shifted_permutation_average(arrays: EvalArrays) -> tuple[EvalArrays, dict[str, np.ndarray]]:
    """A permavg cache holds, per instance x ordering, all N cyclic shifts of that ordering
    ([I, T, N(shift), N]). Average the scores per image identity over the shifts, choose the
    best identity, and report where it sits in the unshifted ordering (shift 0)."""
    identity = methods.permutation_average(arrays.scores, arrays.order).argmax(axis=-1)  # [I, T]
    unshifted = EvalArrays(
        scores=arrays.scores[:, :, 0], attn=arrays.attn[:, :, 0], target_pos=arrays.target_pos[:, :, 0],
        order=arrays.order[:, :, 0],
    )
    position = np.argmax(unshifted.order == identity[..., None], axis=-1)
    return unshifted, {"permutation_average": position}


def run(args: argparse.Namespace) -> None:
    cache = read_cache(args.cache)
    arrays = eval_arrays(cache)
    names = args.methods or list(METHODS_FOR_PROMPT[cache.attrs.get("variant", "vanilla")])
    check_methods(names)
    loaded = [Calibration.from_npz(path) for path in args.calibration]
    transfer = check_calibrations(args.cache, cache.attrs, zip(args.calibration, loaded), transfer=args.transfer)
    calibrations = loaded or [None]
    settings = lad_settings(args, cache.attrs)
    n = arrays.scores.shape[-1]
    if cache.has_shifts:
        if names != ["permutation_average"]:
            raise ValueError(f"{args.cache}: a permutation-averaging cache is evaluated with permutation_average only")
        arrays, predictions = shifted_permutation_average(arrays)
        draws = [predictions]
    else:
        draws = [predict_all(names, arrays, cal, settings) for cal in calibrations]

    summary = {}
    for name in names:
        summary[name] = metrics.summarize(
            draws[0][name], arrays.target_pos, arrays.order, n, n_boot=args.bootstrap, ci=args.ci, seed=args.seed,
            acc_ddof=args.acc_ddof,
        )
        if len(draws) > 1:
            summary[name]["calibration_draws"] = metrics.spread_over_draws(
                [metrics.summarize(d[name], arrays.target_pos, arrays.order, n, n_boot=0, acc_ddof=args.acc_ddof)
                 for d in draws]
            )
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
        "settings": {**settings.as_dict(), "bootstrap": args.bootstrap, "ci": args.ci, "seed": args.seed,
                     "acc_ddof": args.acc_ddof},
        "methods": summary,
        # where the layer-selection rules (lad.layer_ties, lad.k_beyond_range) decided something
        "warnings": methods.selection_warnings(arrays.attn, settings) if SELECTS_LAYERS.intersection(names) else [],
    }
    atomic_write_json(args.out, result, indent=1)
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
