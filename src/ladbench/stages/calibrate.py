"""Stage `calibrate`: fit the calibration (L, B, k, attention prior, PriDe priors) from the
calibration rows of an inference cache, for one |D_cal| draw. Pure numpy; no torch."""

from __future__ import annotations

import argparse

from ladbench.calibration import FitSettings
from ladbench.cli import output_file
from ladbench.evaluation import calibration_from_cache
from ladbench.stages.options import add_arguments, from_args, seed


# |D_cal| (calibration.n_cal's default; tests/test_config.py checks the schema states the same)
N_CAL = 5


def add_fit_arguments(parser) -> None:
    """How a calibration is fitted (``calibration.*`` in the config); shared with ``analyze``."""
    parser.add_argument("--n-cal", type=int, default=N_CAL, help="|D_cal|: calibration instances drawn from the pool")
    add_arguments(parser, FitSettings)


def register(subparsers) -> None:
    parser = subparsers.add_parser("calibrate", help="fit the calibration from a cache's calibration rows")
    parser.add_argument("--cache", required=True, help="inference cache (HDF5)")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the draw")
    add_fit_arguments(parser)
    parser.add_argument("--out", required=True, type=output_file(".npz"), help="output .npz")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    calibration = calibration_from_cache(args.cache, args.n_cal, args.seed, from_args(FitSettings, args))
    calibration.to_npz(args.out)
    source = calibration.settings.get("source", "pool")
    how = "the first" if source == "evaluation_head" else f"seed {args.seed},"
    print(f"calibration from {args.n_cal} of {calibration.settings['n_pool']} instances ({how} source "
          f"{source}): k = {calibration.k:.4f}")
    for warning in calibration.warnings:
        print(f"warning: {warning}")
    print(f"wrote {args.out}")
