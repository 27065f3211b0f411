"""Stage `features`: CLIP image and caption embeddings of an image table into HDF5
(docs/formats.md §2), resumable; the work is in :mod:`ladbench.features`."""

from __future__ import annotations

import argparse

from ladbench.cli import output_file
from ladbench.features import DEFAULT_MODEL, DEFAULT_PRETRAINED, compute_features


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "features", help="CLIP image and caption embeddings -> features.h5.",
        description="L2-normalised float16 open_clip embeddings of every image and caption of an image "
                    "table (docs/formats.md §2); resumable after an interruption.")
    parser.add_argument("--images", required=True, help="Image table (images.json from `ladbench captions`).")
    parser.add_argument("--out", required=True, type=output_file(".h5"), help="Output HDF5 file.")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"open_clip model name (default {DEFAULT_MODEL}).")
    parser.add_argument("--pretrained", default=DEFAULT_PRETRAINED,
                        help=f"open_clip pretrained tag or a local checkpoint file (default {DEFAULT_PRETRAINED}).")
    parser.add_argument("--model-config", default=None,
                        help="JSON config of a custom open_clip architecture; its file stem must equal --model.")
    parser.add_argument("--batch-size", type=int, default=64, help="Images per batch (default 64).")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader worker processes for image decoding (default 4).")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto = CUDA when present.")
    parser.add_argument("--skip-bad-images", action="store_true",
                        help="Record unreadable images (NaN embedding, count in the file) instead of stopping.")
    parser.add_argument("--cache-dir", default=None, help="open_clip weights cache folder (default: the library's).")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    out = compute_features(args.images, args.out, args.model, args.pretrained, args.model_config,
                           args.batch_size, args.workers, args.device, args.skip_bad_images, args.cache_dir)
    print(f"features: {out}")
