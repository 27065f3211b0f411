"""Scale-out of ``ladbench infer`` (rerunnable; not a test): sharded vs unsharded rows/s,
and chain-of-thought generated tokens/s at batch 1 vs larger batches.

* Shards: one benchmark scored as one job, then as K jobs started at once (``ladbench
  infer --gpus 1 --shard-index i --shard-count K``: each claims its own GPU) and merged
  (``ladbench merge-shards``). Reports both wall times and rows/s, and the largest score
  difference between merged and unsharded (0 where shard boundaries fall on batch
  boundaries; else left padding differs, within batch-vs-single-row float noise). On K
  GPUs the speed-up should be near K; on one CPU the shards only share it.
* CoT: the benchmark generated greedily at each ``--batch-sizes``: rows/s and generated
  tokens/s (the cache's ``generated_tokens_per_s``), and whether the replies equal batch 1's.

Default model: a tiny random Qwen2.5-VL built offline (mechanics only, numbers mean
nothing); ``--model-path`` / ``--family`` (and ``--trust-remote-code``) for a real one.

    python benchmarks/bench_scaleout.py --device cuda --shards 4 --batch-sizes 1 8 \
        --model-path Qwen/Qwen2.5-VL-3B-Instruct --family qwen2_5_vl --instances 50
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from bench_inference import write_inputs    # this folder: the same input files as the inference benchmark


def make_inputs(folder: str, n: int, instances: int, orderings: int) -> tuple[str, str]:
    """Random-noise images, and a benchmark of ``instances`` x ``orderings`` rows with
    captions of several lengths (plus one calibration instance)."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    os.makedirs(os.path.join(folder, "img"), exist_ok=True)
    table = []
    for i in range(max(n, 8)):
        Image.fromarray(rng.integers(0, 255, (300, 400, 3), dtype=np.uint8)).save(os.path.join(folder, "img", f"{i}.png"))
        table.append({"image_id": i, "file_name": f"{i}.png", "caption": f"image {i}", "categories": []})
    words = "a small dog running on the grass next to a red ball under a tree".split()

    def instance(k: int) -> dict:
        candidates = [int(c) for c in rng.permutation(len(table))[:n]]
        return {"id": k, "caption": " ".join(words[: 3 + k % (len(words) - 3)]), "target": candidates[0],
                "candidates": candidates}

    evaluation = []
    for k in range(instances):
        inst = instance(k)
        inst["orderings"] = [list(range(n))] + [[int(p) for p in rng.permutation(n)] for _ in range(orderings - 1)]
        evaluation.append(inst)
    bench = {"dataset": "bench", "setting": "random", "n_candidates": n, "seed": 0, "n_orderings": orderings,
             "eval": evaluation, "calibration": [instance(instances)]}
    return write_inputs(folder, bench, table)


def ladbench(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ladbench", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def wait(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        _, err = process.communicate()
        if process.returncode:
            raise SystemExit(f"ladbench failed:\n{err[-3000:]}")


def attrs_and(path: str, key: str):
    from ladbench.inference.cache import read_cache
    cache = read_cache(path)
    return cache.attrs, cache[key]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", help="hub id or folder (default: a tiny random model built here)")
    p.add_argument("--family", default="qwen2_5_vl")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--preset", default="tiny", help="tiny-model preset when no --model-path (tiny, medium)")
    p.add_argument("--device", default="auto")
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--instances", type=int, default=16)
    p.add_argument("--orderings", type=int, default=5)
    p.add_argument("--image-size", type=int, default=336)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--score-batch-size", type=int, default=4)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8], help="CoT batch sizes")
    p.add_argument("--cot-max-new-tokens", type=int, default=64)
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="ladbench-scaleout-") as folder:
        model = args.model_path
        if model is None:
            from ladbench.models.tiny import build_tiny_model
            model = build_tiny_model(args.family, os.path.join(folder, "model"), preset=args.preset)
        bench, images = make_inputs(folder, args.n, args.instances, args.orderings)
        common = ["--benchmark", bench, "--images", images, "--model-name", "bench", "--family", args.family,
                  "--model-path", model, "--device", args.device, "--image-size", str(args.image_size), "--gpus", "1",
                  *(["--trust-remote-code"] if args.trust_remote_code else [])]

        def timed(jobs: list[list[str]]) -> float:
            start = time.perf_counter()
            wait([ladbench("infer", *common, *job) for job in jobs])
            return time.perf_counter() - start

        whole = os.path.join(folder, "whole.h5")
        scoring = ["--batch-size", str(args.score_batch_size)]
        whole_s = timed([[*scoring, "--out", whole]])
        shards = [os.path.join(folder, f"shard{i}.h5") for i in range(args.shards)]
        sharded_s = timed([[*scoring, "--shard-index", str(i), "--shard-count", str(args.shards), "--out", path]
                           for i, path in enumerate(shards)])
        merged = os.path.join(folder, "merged.h5")
        wait([ladbench("merge-shards", *shards, "--out", merged)])
        (attrs, scores), (merged_attrs, merged_scores) = attrs_and(whole, "scores"), attrs_and(merged, "scores")
        rows = attrs["timed_rows"]
        print("| jobs | wall s (incl. model load) | rows/s (wall) | rows/s per job (cache) |\n|---|---|---|---|")
        print(f"| 1 | {whole_s:.1f} | {rows / whole_s:.2f} | {attrs['rows_per_s']:.2f} |")
        print(f"| {args.shards} shards | {sharded_s:.1f} | {rows / sharded_s:.2f} | {merged_attrs['rows_per_s']:.2f} |")
        # identical where shard boundaries fall on batch boundaries; else batch padding differs
        print(f"max |merged - unsharded| score: {float(abs(merged_scores - scores).max()):.2e}\n")

        print("| CoT batch | rows/s | generated tokens/s | tokens | replies equal batch 1 |\n|---|---|---|---|---|")
        first = None
        for batch in args.batch_sizes:
            out = os.path.join(folder, f"cot{batch}.h5")
            timed([["--prompt", "cot", "--cot-max-new-tokens", str(args.cot_max_new_tokens), "--batch-size",
                    str(batch), "--out", out]])
            attrs, texts = attrs_and(out, "text")
            first = texts if first is None else first
            print(f"| {batch} | {attrs['rows_per_s']:.2f} | {attrs['generated_tokens_per_s']:.1f} | "
                  f"{attrs['generated_tokens']} | {bool((texts == first).all())} |")


if __name__ == "__main__":
    main()
