"""Stage `demo-model`: build a tiny random model of one family into a folder, offline
(:func:`ladbench.models.tiny.build_tiny_model`)."""

from __future__ import annotations

import argparse

from ladbench.families import TINY_FAMILIES
from ladbench.models.tiny import PRESETS, build_tiny_model
from ladbench.stages.options import seed


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo-model", help="build a tiny random model of one family into a folder (offline)",
                                   description=build_tiny_model.__doc__)
    parser.add_argument("--family", required=True, choices=TINY_FAMILIES, help="model family to build")
    parser.add_argument("--out", required=True, help="output folder (replaced if it exists)")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the random weights (default 0)")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                        help="model size: tiny (tests) or medium (CPU benchmark); default tiny")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    print(build_tiny_model(args.family, args.out, seed=args.seed, preset=args.preset))
