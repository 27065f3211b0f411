"""Stage `benchmark`: one benchmark file (docs/formats.md §3) from an image table and its
CLIP features, per METHOD §7; the construction is in :mod:`ladbench.benchmark`."""

from __future__ import annotations

import argparse

import numpy as np

from ladbench.atomic import atomic_write_text
from ladbench.benchmark import SETTINGS, BenchmarkError, BenchmarkSettings, build_benchmark, format_benchmark
from ladbench.cli import output_file
from ladbench.data.coco import load_image_table
from ladbench.stages.options import add_arguments, from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "benchmark", help="Build a random or adversarial benchmark (instances, calibration pool, orderings).",
        description="Build one benchmark file (docs/formats.md §3) per METHOD §7.")
    parser.add_argument("--images", required=True, help="Image table (images.json).")
    parser.add_argument("--features", required=True, help="CLIP features (features.h5) of that table.")
    parser.add_argument("--setting", required=True, choices=SETTINGS, help="random or adversarial distractors.")
    parser.add_argument("--n-candidates", type=int, required=True, help="N, candidate images per instance (>= 2).")
    add_arguments(parser, BenchmarkSettings)          # n_eval ... similarity_dtype, calibration_source
    parser.add_argument("--dataset", default=None, help="Dataset name recorded in the file (default: the table's).")
    parser.add_argument("--out", required=True, type=output_file(".json"), help="Output benchmark JSON.")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from ladbench.features import load_features
    from ladbench.inputs import check_features_table

    table = load_image_table(args.images)
    features = load_features(args.features)
    if not np.array_equal(np.asarray(features["image_id"]), [row["image_id"] for row in table["images"]]):
        raise BenchmarkError(f"{args.features}: image ids differ from {args.images}; rebuild the features")
    check_features_table(args.features, features["attrs"], args.images, table)
    settings = from_args(BenchmarkSettings, args)
    doc = build_benchmark(table, features, args.setting, args.n_candidates, settings, dataset=args.dataset)
    atomic_write_text(args.out, format_benchmark(doc))
    print(f"benchmark: {len(doc['eval'])} evaluation + {len(doc['calibration'])} calibration instances "
          f"({args.setting}, N = {args.n_candidates}, pool {doc['pool_size']}, {settings.draw} draw) -> {args.out}")
