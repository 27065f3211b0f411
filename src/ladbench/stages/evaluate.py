"""Stage `evaluate`: every configured method on a cache's evaluation rows, with one
calibration per draw (seed), and metrics with bootstrap confidence intervals; the work is in
:mod:`ladbench.evaluation`. Writes a JSON summary and, beside it, an ``.npz`` of
per-instance predictions (the first draw) for figures and paired tests.
"""

from __future__ import annotations

import argparse

from ladbench.atomic import write_json_with_arrays
from ladbench.cli import output_file
from ladbench.evaluation import evaluate, metrics_line
from ladbench.stages.options import add_bootstrap_arguments, add_method_arguments, bootstrap_settings, method_settings
from ladbench.inference.cache import read_cache_attributes
from ladbench.variants import VARIANTS


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
    add_method_arguments(parser)
    add_bootstrap_arguments(parser)
    parser.add_argument("--transfer", action="store_true",
                        help="the calibrations were fitted on another benchmark (calibration transfer); "
                        "without it they must come from this cache's benchmark")
    parser.add_argument("--out", required=True, type=output_file(".json"), help="output .json (predictions go to the same name .npz)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    settings = method_settings(args, read_cache_attributes(args.cache))
    result, predictions = evaluate(args.cache, args.calibration, args.methods, settings, bootstrap_settings(args),
                                   transfer=args.transfer)
    npz = write_json_with_arrays(args.out, result, predictions)      # one unit: never a JSON of another run's arrays
    for name, summary in result["methods"].items():
        print(metrics_line(name, summary))
    for warning in result["warnings"]:
        print(f"warning: {warning}")
    print(f"wrote {args.out} and {npz}")
