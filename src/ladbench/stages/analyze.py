"""Stage `analyze`: the ablations, sweeps, divergence statistics and position profiles of
one vanilla-prompt cache (``ladbench.analysis``; docs/formats.md §8)."""

from __future__ import annotations

import argparse

from ladbench import analysis, metrics
from ladbench.analysis import SweepSettings, analyze
from ladbench.atomic import write_json_with_arrays
from ladbench.calibration import FitSettings
from ladbench.cli import output_file
from ladbench.inference.cache import read_cache_attributes
from ladbench.stages.options import add_arguments, from_args, seed
from ladbench.stages.calibrate import add_fit_arguments
from ladbench.evaluation import metrics_line
from ladbench.stages.options import add_bootstrap_arguments, add_method_arguments, bootstrap_settings, method_settings


def register(subparsers) -> None:
    """Add the ``analyze`` subcommand."""
    parser = subparsers.add_parser(
        "analyze",
        help="ablations, sweeps, divergence statistics and profiles from a vanilla cache",
        description=analysis.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cache", required=True, help="inference cache (HDF5) of a vanilla-prompt variant")
    add_method_arguments(parser.add_argument_group("LAD base settings (as in `ladbench evaluate`)"))
    cal = parser.add_argument_group("calibration (fitted in-process from the cache's pool)")
    add_fit_arguments(cal)
    cal.add_argument("--seeds", type=seed, nargs="+", default=[0], help="calibration draws of the tables")
    add_arguments(parser.add_argument_group("Figure 6 sweeps"), SweepSettings)
    add_bootstrap_arguments(parser.add_argument_group("confidence intervals"))
    parser.add_argument("--out", required=True, type=output_file(".json"), help="output .json (per-row arrays go to the same name .npz)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    document, arrays = analyze(
        args.cache, method_settings(args, read_cache_attributes(args.cache)), n_cal=args.n_cal, seeds=args.seeds,
        fit=from_args(FitSettings, args), sweeps=from_args(SweepSettings, args), boot=bootstrap_settings(args),
        progress=True,
    )
    npz = write_json_with_arrays(args.out, metrics.json_safe(document), arrays)
    for row in document["readouts"]:
        if "metrics" in row:
            print(metrics_line(row["label"], row["metrics"]))
    print(f"wrote {args.out} and {npz}")
