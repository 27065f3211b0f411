"""Stage `demo-scenes`: draw the embedded demo's synthetic scenes, with MS-COCO-format
annotations (:func:`ladbench.data.synthetic.build_scenes`)."""

from __future__ import annotations

import argparse

from ladbench.data.synthetic import build_scenes
from ladbench.stages.options import seed


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo-scenes", help="Draw the embedded demo's synthetic scenes (COCO-format annotations).",
        description="Draw synthetic scenes of coloured shapes and write DIR/images/*.png, "
                    "DIR/annotations/captions.json and DIR/annotations/instances.json in the MS-COCO formats.")
    parser.add_argument("--out", required=True, help="Output folder (created; a previous demo output is replaced).")
    parser.add_argument("--n-images", type=int, default=200, help="Number of scenes (default 200).")
    parser.add_argument("--seed", type=seed, default=0, help="Random seed; the same seed gives byte-identical files.")
    parser.add_argument("--image-size", type=int, default=96, help="Side of each square scene in pixels (default 96).")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    out = build_scenes(args.out, n_images=args.n_images, seed=args.seed, image_size=args.image_size)
    print(f"demo-scenes: wrote {args.n_images} scenes to {out}")
