"""Stage `analyze`: the ablations, sweeps, divergence statistics and position profiles of
one vanilla-prompt cache (``ladbench.analysis``; docs/formats.md §8)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ladbench import analysis, metrics
from ladbench.analysis import DEFAULT_DCAL_DRAWS, DEFAULT_DCAL_SIZES, DEFAULT_TAUS, analyze
from ladbench.atomic import atomic_path, atomic_write_json, signed
from ladbench.cli import output_file
from ladbench.inference.cache import read_cache_attributes
from ladbench.stages.calibrate import add_fit_arguments
from ladbench.stages.options import (add_bootstrap_arguments, add_lad_arguments, bootstrap_settings, lad_settings,
                                     metrics_line)


def register(subparsers) -> None:
    """Add the ``analyze`` subcommand."""
    parser = subparsers.add_parser(
        "analyze",
        help="ablations, sweeps, divergence statistics and profiles from a vanilla cache",
        description=analysis.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cache", required=True, help="inference cache (HDF5) of a vanilla-prompt variant")
    add_lad_arguments(parser.add_argument_group("LAD base settings (as in `ladbench evaluate`)"))
    cal = parser.add_argument_group("calibration (fitted in-process from the cache's pool)")
    add_fit_arguments(cal)
    cal.add_argument("--seeds", type=int, nargs="+", default=[0], help="calibration draws of the tables")
    sweeps = parser.add_argument_group("Figure 6 sweeps")
    sweeps.add_argument("--dcal-sizes", type=int, nargs="+", default=list(DEFAULT_DCAL_SIZES),
                        help="|D_cal| sizes (clipped to the pool size)")
    sweeps.add_argument("--dcal-draws", type=int, default=DEFAULT_DCAL_DRAWS,
                        help="calibration draws (seeds 0..n-1) per |D_cal| size")
    sweeps.add_argument("--taus", type=float, nargs="+", default=list(DEFAULT_TAUS), help="tau values of the sweep")
    add_bootstrap_arguments(parser.add_argument_group("confidence intervals"))
    parser.add_argument("--out", required=True, type=output_file(".json"), help="output .json (per-row arrays go to the same name .npz)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    if args.dcal_draws < 1:
        raise ValueError(f"--dcal-draws must be >= 1, got {args.dcal_draws}")
    base = lad_settings(args, read_cache_attributes(args.cache))
    document, arrays = analyze(
        args.cache, base, n_cal=args.n_cal, seeds=args.seeds, score_average=args.score_average,
        pride_original_logs=args.pride_original_logs, empty_positions=args.empty_positions,
        dcal_sizes=args.dcal_sizes, dcal_draws=args.dcal_draws, taus=args.taus,
        boot=bootstrap_settings(args), progress=True,
    )
    atomic_write_json(args.out, signed(metrics.json_safe(document)), indent=1)
    npz = Path(args.out).with_suffix(".npz")
    with atomic_path(npz) as tmp:
        with open(tmp, "wb") as handle:
            np.savez(handle, **arrays)
    for row in document["readouts"]:
        if "metrics" in row:
            print(metrics_line(row["label"], row["metrics"]))
    print(f"wrote {args.out} and {npz}")
