"""Stage `demo-model`: build a tiny random model of one family
(:func:`ladbench.models.tiny.build_tiny_model`) or of one architecture that ``family: auto``
runs (:func:`ladbench.models.tiny_archs.build_tiny_architecture`) into a folder, offline."""

from __future__ import annotations

import argparse
import sys

from ladbench.families import TINY_FAMILIES
from ladbench.models.tiny import PRESETS, build_tiny_model
from ladbench.models.tiny_archs import BUILDS, build_tiny_architecture, given_chat_template
from ladbench.stages.options import seed


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo-model", help="build a tiny random model of one family or architecture into a "
                                                      "folder (offline)", description=build_tiny_model.__doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--family", choices=TINY_FAMILIES, help="model family to build")
    what.add_argument("--architecture", choices=sorted(BUILDS), metavar="NAME",
                      help="transformers model type to build, run with `family: auto` (current lane; `ladbench "
                           f"models` lists them as tested): {', '.join(sorted(BUILDS))}")
    parser.add_argument("--out", required=True, help="output folder (replaced if it exists)")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the random weights (default 0)")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                        help="model size: tiny (tests) or medium (CPU benchmark); default tiny")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    if args.architecture:
        folder = build_tiny_architecture(args.architecture, args.out, seed=args.seed, preset=args.preset)
        print(folder)
        template = given_chat_template(folder)
        if template:
            print(f"{args.architecture} is released without a chat template: give {template} as the model's "
                  "chat_template (config) or --chat-template (ladbench infer)", file=sys.stderr)
    else:
        print(build_tiny_model(args.family, args.out, seed=args.seed, preset=args.preset))
