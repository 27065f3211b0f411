"""Time adversarial benchmark construction on CPU: 1,000 (+100 calibration) instances from a 20,000-image pool.

Synthetic inputs at the paper's scale: 25,000 images with random unit ViT-L/14-sized
(768-d) float16 image and caption embeddings and random COCO-like category sets (1-4 of
80 ids), from which the benchmark draws its 20,000-image pool. Prints the seconds for the
whole `build_benchmark` call (pool draw, mining, shuffles, orderings) per N.

    python benchmarks/bench_hard_negatives.py [--n 4 8 12] [--images 25000] [--dim 768]
        [--draw distinct|reference] [--similarity-dtype float32|float16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ladbench.benchmark import DRAWS, SIMILARITY_DTYPES, build_benchmark


def synthetic_inputs(n_images: int, dim: int, seed: int = 0) -> tuple[dict, dict]:
    """An image table and features of ``n_images`` random images (COCO-like category sets)."""
    rng = np.random.default_rng(seed)

    def unit(n: int) -> np.ndarray:
        x = rng.normal(size=(n, dim)).astype(np.float32)
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)

    rows = [{"image_id": i + 1, "file_name": f"{i + 1}.jpg", "caption": f"caption {i + 1}",
             "categories": sorted(rng.choice(np.arange(1, 81), size=int(rng.integers(1, 5)), replace=False).tolist())}
            for i in range(n_images)]
    table = {"dataset": "synthetic-bench", "image_root": "/none", "has_categories": True, "images": rows}
    features = {"image_id": np.arange(1, n_images + 1), "image_emb": unit(n_images), "text_emb": unit(n_images)}
    return table, features


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[4, 8, 12], help="Numbers of candidates N.")
    parser.add_argument("--images", type=int, default=25000, help="Images in the table (pool drawn from them).")
    parser.add_argument("--pool-size", type=int, default=20000)
    parser.add_argument("--dim", type=int, default=768, help="Embedding size (768 = ViT-L/14).")
    parser.add_argument("--n-eval", type=int, default=1000)
    parser.add_argument("--n-calibration", type=int, default=100)
    parser.add_argument("--draw", choices=DRAWS, default=DRAWS[0])
    parser.add_argument("--similarity-dtype", choices=SIMILARITY_DTYPES, default=SIMILARITY_DTYPES[0])
    args = parser.parse_args()

    start = time.perf_counter()
    table, features = synthetic_inputs(args.images, args.dim)
    print(f"inputs: {args.images} images x {args.dim}-d built in {time.perf_counter() - start:.2f} s")
    for n in args.n:
        for setting in ("adversarial", "random"):
            start = time.perf_counter()
            doc = build_benchmark(table, features, setting, n, n_eval=args.n_eval, n_calibration=args.n_calibration,
                                  pool_size=args.pool_size, seed=42, draw=args.draw,
                                  similarity_dtype=args.similarity_dtype)
            seconds = time.perf_counter() - start
            print(f"{setting:11s} N={n:2d}: {len(doc['eval'])} eval + {len(doc['calibration'])} calibration "
                  f"instances from a pool of {doc['pool_size']} in {seconds:.2f} s ({args.draw} draw, "
                  f"{args.similarity_dtype} similarities)")


if __name__ == "__main__":
    main()
