"""Stage `calibrate`: fit the calibration (L, B, k, attention prior, PriDe priors) from the
calibration rows of an inference cache, for one |D_cal| draw. Pure numpy; no torch."""

from __future__ import annotations

import argparse
from dataclasses import replace

from ladbench.calibration import EMPTY_POSITIONS, PRIDE_ORIGINAL_LOGS, SCORE_AVERAGES, fit_calibration
from ladbench.cli import output_file
from ladbench.inference.cache import read_cache
from ladbench.stages.arrays import calibration_arrays
from ladbench.stages.inputs import cache_identity


# |D_cal| (calibration.n_cal's default; tests/test_config.py checks the schema states the same)
N_CAL = 5


def add_fit_arguments(parser) -> None:
    """How a calibration is fitted (``calibration.*`` in the config); shared with ``analyze``."""
    parser.add_argument("--n-cal", type=int, default=N_CAL, help="|D_cal|: calibration instances drawn from the pool")
    parser.add_argument("--score-average", choices=SCORE_AVERAGES, default=SCORE_AVERAGES[0],
                        help="reference: average raw scores; paper: average probabilities, then log (Eqs. 1-3)")
    parser.add_argument("--pride-original-logs", choices=PRIDE_ORIGINAL_LOGS, default=PRIDE_ORIGINAL_LOGS[0],
                        help="pride_original: log(p + 1e-10) as the original code (floor, default) or exact logs")
    parser.add_argument("--empty-positions", choices=EMPTY_POSITIONS, default=EMPTY_POSITIONS[0],
                        help="a position where no calibration row has its ground truth: stop (error, default), or a "
                             "row of zeros in L with a warning (zero, the reference's)")


def register(subparsers) -> None:
    parser = subparsers.add_parser("calibrate", help="fit the calibration from a cache's calibration rows")
    parser.add_argument("--cache", required=True, help="inference cache (HDF5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw")
    add_fit_arguments(parser)
    parser.add_argument("--out", required=True, type=output_file(".npz"), help="output .npz")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    cache = read_cache(args.cache)
    cal = calibration_arrays(cache)
    calibration = fit_calibration(
        cal.scores, cal.attn, cal.target_pos, n_cal=args.n_cal, seed=args.seed, average=args.score_average,
        source=cal.source,  # from the benchmark, through the cache
        pride_original_logs=args.pride_original_logs, empty_positions=args.empty_positions,
    )
    replace(calibration, source=cache_identity(args.cache, cache.attrs)).to_npz(args.out)
    how = "the first" if cal.source == "evaluation_head" else f"seed {args.seed},"
    print(f"calibration from {args.n_cal} of {cal.scores.shape[0]} instances ({how} source {cal.source}): "
          f"k = {calibration.k:.4f}")
    for warning in calibration.warnings:
        print(f"warning: {warning}")
    print(f"wrote {args.out}")
