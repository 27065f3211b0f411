"""Stage `benchmark`: one benchmark file (docs/formats.md §3) from an image table and its
CLIP features, per METHOD §7; the construction is in :mod:`ladbench.benchmark`."""

from __future__ import annotations

import argparse

import numpy as np

from ladbench.atomic import atomic_write_text
from ladbench.benchmark import (
    CALIBRATION_SOURCES,
    CATEGORY_RULES,
    DRAWS,
    ORDERING_SCHEMES,
    SETTINGS,
    SIMILARITY_DTYPES,
    BenchmarkError,
    build_benchmark,
    format_benchmark,
)
from ladbench.cli import output_file
from ladbench.data.coco import load_image_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "benchmark", help="Build a random or adversarial benchmark (instances, calibration pool, orderings).",
        description="Build one benchmark file (docs/formats.md §3) per METHOD §7.")
    parser.add_argument("--images", required=True, help="Image table (images.json).")
    parser.add_argument("--features", required=True, help="CLIP features (features.h5) of that table.")
    parser.add_argument("--setting", required=True, choices=SETTINGS, help="random or adversarial distractors.")
    parser.add_argument("--n-candidates", type=int, required=True, help="N, candidate images per instance (>= 2).")
    parser.add_argument("--n-eval", type=int, default=1000, help="Evaluation instances (default 1000).")
    parser.add_argument("--n-calibration", type=int, default=100, help="Calibration instances, disjoint targets (default 100).")
    parser.add_argument("--n-orderings", type=int, default=5, help="T, orderings per evaluation instance, identity first (default 5).")
    parser.add_argument("--pool-size", type=int, default=20000, help="Images drawn into the pool (default 20000).")
    parser.add_argument("--seed", type=int, default=42, help="Seed (default 42); the same seed gives a byte-identical file.")
    parser.add_argument("--caption-sim-max", type=float, default=0.9,
                        help="Adversarial: a distractor's caption cosine similarity must be below this (default 0.9).")
    parser.add_argument("--category-rule", choices=CATEGORY_RULES, default="reference",
                        help="Adversarial: reference = skip candidates whose categories contain the target's; "
                             "paper = skip only identical category sets.")
    parser.add_argument("--orderings", choices=ORDERING_SCHEMES, default=ORDERING_SCHEMES[0],
                        help="shared (default, the reference's): one list of T orderings for every instance, drawn "
                             "like the reference's build_shuffles; per_instance: each instance draws its own.")
    parser.add_argument("--calibration-source", choices=CALIBRATION_SOURCES, default=CALIBRATION_SOURCES[0],
                        help="pool (default): calibration instances disjoint from the evaluation set; "
                             "evaluation_head (the reference's): the first --n-calibration evaluation instances.")
    parser.add_argument("--draw", choices=DRAWS, default=DRAWS[0],
                        help="distinct (default): distinct targets shared by both settings and every N; reference: "
                             "the reference's build_eval_dataset.py draw (Python's random, anchors may repeat, one "
                             "stream for the random set, then the adversarial set).")
    parser.add_argument("--similarity-dtype", choices=SIMILARITY_DTYPES, default=SIMILARITY_DTYPES[0],
                        help="Adversarial: float32 (default) similarities, or float16 ones computed as numpy's "
                             "float16 dot (the reference's, with its exact ties).")
    parser.add_argument("--dataset", default=None, help="Dataset name recorded in the file (default: the table's).")
    parser.add_argument("--out", required=True, type=output_file(".json"), help="Output benchmark JSON.")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from ladbench.features import load_features
    from ladbench.stages.inputs import check_features_table

    table = load_image_table(args.images)
    features = load_features(args.features)
    if not np.array_equal(np.asarray(features["image_id"]), [row["image_id"] for row in table["images"]]):
        raise BenchmarkError(f"{args.features}: image ids differ from {args.images}; rebuild the features")
    check_features_table(args.features, features["attrs"], args.images, table)
    doc = build_benchmark(table, features, args.setting, args.n_candidates, args.n_eval, args.n_calibration,
                          args.n_orderings, args.pool_size, args.seed, args.caption_sim_max, args.category_rule,
                          args.dataset, args.orderings, args.calibration_source, args.draw, args.similarity_dtype)
    atomic_write_text(args.out, format_benchmark(doc))
    print(f"benchmark: {len(doc['eval'])} evaluation + {len(doc['calibration'])} calibration instances "
          f"({args.setting}, N = {args.n_candidates}, pool {doc['pool_size']}, {args.draw} draw) -> {args.out}")
