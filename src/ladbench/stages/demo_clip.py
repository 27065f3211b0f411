"""Stage `demo-clip`: build the demo's tiny random open_clip model locally
(:func:`ladbench.features.build_tiny_clip`)."""

from __future__ import annotations

import argparse

from ladbench.clip import TINY_CLIP_NAME
from ladbench.features import build_tiny_clip
from ladbench.stages.options import seed


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo-clip", help="Build the demo's tiny random open_clip model locally.",
        description="Write a tiny open_clip config (NAME.json), random weights (NAME.pt) and clip.json into --out.")
    parser.add_argument("--out", required=True, help="Output folder.")
    parser.add_argument("--seed", type=seed, default=0, help="Seed of the random weights.")
    parser.add_argument("--name", default=TINY_CLIP_NAME, help=f"Model (and config file) name (default {TINY_CLIP_NAME}).")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    manifest = build_tiny_clip(args.out, args.seed, args.name)
    print(f"demo-clip: model {manifest['model']} -> {manifest['pretrained']} (config {manifest['model_config']})")
