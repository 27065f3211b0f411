"""Stage `features`: CLIP image and caption embeddings of an image table into HDF5
(docs/formats.md §2), resumable; the work is in :mod:`ladbench.features`."""

from __future__ import annotations

import argparse

from ladbench.cli import output_file
from ladbench.clip import ClipSettings
from ladbench.features import compute_features
from ladbench.stages.options import add_arguments, from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "features", help="CLIP image and caption embeddings -> features.h5.",
        description="L2-normalised float16 open_clip embeddings of every image and caption of an image "
                    "table (docs/formats.md §2); resumable after an interruption.")
    parser.add_argument("--images", required=True, help="Image table (images.json from `ladbench captions`).")
    parser.add_argument("--out", required=True, type=output_file(".h5"), help="Output HDF5 file.")
    add_arguments(parser, ClipSettings)      # --model, --pretrained, --model-config, --batch-size, --workers, --device
    parser.add_argument("--skip-bad-images", action="store_true",
                        help="Record unreadable images (NaN embedding, count in the file) instead of stopping.")
    parser.add_argument("--cache-dir", default=None, help="open_clip weights cache folder (default: the library's).")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    out = compute_features(args.images, args.out, from_args(ClipSettings, args), skip_bad_images=args.skip_bad_images,
                           cache_dir=args.cache_dir)
    print(f"features: {out}")
