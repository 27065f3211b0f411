"""Stage `captions`: the image table (images.json, docs/formats.md §1) from MS-COCO-format
annotation files; the work is in :mod:`ladbench.data.coco`."""

from __future__ import annotations

import argparse

from ladbench.cli import output_file
from ladbench.data.coco import build_image_table, write_image_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "captions", help="COCO-format annotation JSONs -> the image table (images.json).",
        description="Build images.json (docs/formats.md §1): the first caption listed for each image "
                    "and its sorted category-id set.")
    parser.add_argument("--captions-json", required=True, help="Captions file in the MS-COCO format (e.g. captions_val2014.json).")
    parser.add_argument("--instances-json", default=None,
                        help="Instances file in the MS-COCO format (e.g. instances_val2014.json); "
                             "omit for datasets without categories (Flickr8k).")
    parser.add_argument("--image-root", required=True, help="Folder holding the images' file_name paths.")
    parser.add_argument("--dataset", required=True, help="Dataset name recorded in the table.")
    parser.add_argument("--out", required=True, type=output_file(".json"), help="Output images.json.")
    parser.add_argument("--skip-missing", action="store_true",
                        help="Leave out images whose files are missing (count reported) instead of stopping.")
    parser.add_argument("--no-check-files", action="store_true", help="Do not check that the image files exist.")
    parser.add_argument("--reference-tables", default=None,
                        help="Folder with the reference implementation's file_to_caption.pkl and file_to_cat.pkl: "
                             "they give the captions (verbatim) and the categories (instead of --instances-json); "
                             "read without executing anything.")
    parser.add_argument("--files-outside-root", action="store_true",
                        help="Allow file_name entries pointing outside --image-root (absolute paths, '..'); "
                             "recorded in the table (config: datasets.<name>.files_outside_root).")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    table = build_image_table(args.captions_json, args.instances_json, args.image_root, args.dataset,
                              check_files=not args.no_check_files, skip_missing=args.skip_missing,
                              reference_tables=args.reference_tables, files_outside_root=args.files_outside_root)
    write_image_table(table, args.out)
    n_with = sum(1 for row in table["images"] if row["categories"])
    print(f"captions: {len(table['images'])} images ({n_with} with categories) -> {args.out}")
