"""Command `flickr8k-to-coco`: convert Flickr8k's caption file to an MS-COCO captions file
(:func:`ladbench.data.coco.write_flickr8k_coco`; the download stage does it too)."""

from __future__ import annotations

import argparse

from ladbench.cli import output_file
from ladbench.data.coco import write_flickr8k_coco


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "flickr8k-to-coco", help="Convert Flickr8k captions to an MS-COCO captions file.",
        description="Convert Flickr8k.token.txt (or Kaggle's captions.txt) to the MS-COCO captions format.")
    parser.add_argument("--captions", required=True, help="Flickr8k.token.txt or captions.txt.")
    parser.add_argument("--image-root", default=None, help="Image folder; captions of missing files are dropped.")
    parser.add_argument("--out", required=True, type=output_file(".json"), help="Output captions JSON.")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    doc = write_flickr8k_coco(args.captions, args.image_root, args.out)
    print(f"flickr8k-to-coco: {len(doc['images'])} images, {len(doc['annotations'])} captions -> {args.out}")
