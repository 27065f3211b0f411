"""Speed and memory of one cached inference pass vs the reference approach (rerunnable; not a test).

Compares, per row, on a random "medium" Qwen2.5-VL (hidden 512, 8 layers, 8 heads / 2 KV
heads; built offline by ``ladbench demo-model --preset medium``) on CPU (and on a GPU when
``--device cuda`` and one is present):

* ``bare``: one SDPA forward of the prompt (no capture): the floor.
* ``ours``: this project's row step (``RowRunner.score_batch``): SDPA + last-row capture of
  every layer + candidate scores (for N >= 10, the prefix-trie continuation on the KV cache).
* ``ours_no_greedy``: the same without the greedy reply (``--no-greedy-reply``): the
  ratio ours / ours_no_greedy is the cost of storing the reference's Vanilla readout
  (one KV-cache continuation step, plus the KV cache a single-token score would not need).
* ``reference``: eager attention + ``generate(max_new_tokens=1, output_attentions=True)``,
  which keeps every layer's T x T attention; for N >= 10 plus one full re-forward of the
  prompt with the first answer token appended (what the reference does for two-token
  answers). The reference runs this once per method (Vanilla, PriDe, LAD: 3 passes per
  evaluation row); the project runs ``ours`` once and serves every method from the cache.

Times: all methods of one N in one process, interleaved repetition by repetition, minimum
reported (robust on a shared machine). Memory: every (method, N) in its own process.
Prints a Markdown table; ``--json`` also writes the raw numbers.

    python benchmarks/bench_inference.py --n 4 8 9 12 --reps 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REFERENCE_PASSES_PER_ROW = 3      # Vanilla, PriDe, LAD each re-run inference in the reference


def _demo_inputs(folder: str, n: int) -> tuple[str, str]:
    """One evaluation instance with ``n`` distinct random-noise images (+ a calibration one)."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    os.makedirs(os.path.join(folder, "img"), exist_ok=True)
    table = []
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (400, 500, 3), dtype=np.uint8)).save(os.path.join(folder, "img", f"{i}.png"))
        table.append({"image_id": i, "file_name": f"{i}.png", "caption": f"image {i}", "categories": []})
    bench = {"dataset": "bench", "setting": "random", "n_candidates": n, "seed": 0, "n_orderings": 1,
             "eval": [{"id": 0, "caption": "a small dog running on the grass next to a red ball", "target": 0,
                       "candidates": list(range(n)), "orderings": [list(range(n))]}],
             "calibration": [{"id": 0, "caption": "a cat", "target": 1, "candidates": list(range(n))}]}
    bench_path, images_path = os.path.join(folder, "bench.json"), os.path.join(folder, "images.json")
    with open(bench_path, "w") as f:
        json.dump(bench, f)
    with open(images_path, "w") as f:
        json.dump({"dataset": "bench", "image_root": os.path.join(folder, "img"), "images": table}, f)
    return bench_path, images_path


def _rss_mb() -> float:
    import psutil
    return psutil.Process().memory_info().rss / 2 ** 20


def _row_function(method: str, n: int, model_dir: str, image_size: int, device: str):
    """Load the model for ``method`` and return (callable running one row, sequence length)."""
    import torch

    from ladbench.benchmark import load_benchmark
    from ladbench.data.coco import load_image_table
    from ladbench.inference.cache import plan_rows
    from ladbench.inference.runner import InferenceSettings, RowRunner, image_paths
    from ladbench.models import load_adapter

    attention = {"bare": "sdpa", "ours": "capture", "ours_no_greedy": "capture", "reference": "eager"}[method]
    adapter = load_adapter("qwen2_5_vl", model_dir, device=device, attention=attention)
    tmp = tempfile.mkdtemp(prefix="bench_inputs_")
    bench_path, images_path = _demo_inputs(tmp, n)
    settings = InferenceSettings(benchmark=bench_path, images=images_path, out=os.path.join(tmp, "x.h5"),
                                 model_name="medium", family="qwen2_5_vl", model_path=model_dir,
                                 image_size=image_size, device=device, greedy_reply=method != "ours_no_greedy")
    bench = load_benchmark(bench_path)
    runner = RowRunner(adapter, settings, bench, plan_rows(bench), image_paths(load_image_table(images_path)))
    first_token = adapter.tokenizer.convert_tokens_to_ids("1")

    @torch.no_grad()
    def one_row() -> None:
        if method in ("ours", "ours_no_greedy"):
            runner.score_batch([0])
            return
        inputs = runner.encode_rows([0])
        if method == "bare":
            adapter.prefill(inputs, use_cache=False)
            return
        out = adapter.model.generate(**inputs, max_new_tokens=1, do_sample=False, output_attentions=True,
                                     output_logits=True, return_dict_in_generate=True)
        assert out.attentions[0][0].shape[-1] == inputs["input_ids"].shape[1]     # full T x T kept
        if n >= 10:                        # reference: whole-sequence re-forward for the second answer token
            ext = dict(inputs)
            add = torch.full((1, 1), first_token, dtype=torch.long, device=adapter.device)
            ext["input_ids"] = torch.cat([inputs["input_ids"], add], 1)
            ext["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(add)], 1)
            adapter.model(**ext, output_attentions=True, use_cache=False)

    return one_row, int(runner.encode_rows([0])["input_ids"].shape[1])


def _sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_worker(n: int, methods: list[str], model_dir: str, reps: int, image_size: int, device: str) -> list[dict]:
    """Time every method in ONE process, interleaved rep by rep, so that load from other
    processes on a shared machine hits all methods alike; the minimum is the robust figure."""
    rows, seq_len = {}, 0
    for m in methods:
        rows[m], seq_len = _row_function(m, n, model_dir, image_size, device)
        rows[m]()                                                          # warm-up
    times: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(reps):
        for m in methods:
            _sync(device)
            t0 = time.perf_counter()
            rows[m]()
            _sync(device)
            times[m].append(time.perf_counter() - t0)
    return [{"method": m, "n": n, "seq_len": seq_len, "min_s": min(t), "median_s": statistics.median(t)}
            for m, t in times.items()]


def memory_worker(method: str, n: int, model_dir: str, image_size: int, device: str) -> dict:
    """Peak memory of one method alone in this process: RSS (and CUDA peak on GPU)."""
    import resource

    import torch
    one_row, _ = _row_function(method, n, model_dir, image_size, device)
    loaded_rss = _rss_mb()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    one_row()
    one_row()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"method": method, "n": n, "peak_rss_mb": peak, "activation_rss_mb": peak - loaded_rss,
            "peak_cuda_mb": torch.cuda.max_memory_allocated() / 2 ** 20 if device.startswith("cuda") else None}


def _run_worker(kind: str, n: int, args: argparse.Namespace) -> list[dict]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--n", str(n), "--model-dir", args.model_dir,
           "--reps", str(args.reps), "--image-size", str(args.image_size), "--device", args.device,
           "--threads", str(args.threads), "--methods", *args.methods]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result if isinstance(result, list) else [result]


def markdown_table(timing: list[dict], memory: list[dict]) -> str:
    t = {(r["method"], r["n"]): r for r in timing}
    mem = {(r["method"], r["n"]): r for r in memory}
    ns = sorted({r["n"] for r in timing})
    lines = ["| N | tokens | bare SDPA s | ours s/row | capture overhead | reference s/pass | "
             f"reference s/row (x{REFERENCE_PASSES_PER_ROW} methods) | speed-up per pass | speed-up per row | "
             "peak RSS MB ours / ref | activation MB ours / ref |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in ns:
        bare, ours, ref = t.get(("bare", n)), t.get(("ours", n)), t.get(("reference", n))
        if not (bare and ours and ref):
            continue
        mo, mr = mem.get(("ours", n), {}), mem.get(("reference", n), {})
        lines.append(
            f"| {n} | {ours['seq_len']} | {bare['min_s']:.3f} | {ours['min_s']:.3f} | "
            f"{ours['min_s'] / bare['min_s'] - 1:+.1%} | {ref['min_s']:.3f} | "
            f"{ref['min_s'] * REFERENCE_PASSES_PER_ROW:.3f} | {ref['min_s'] / ours['min_s']:.2f}x | "
            f"{ref['min_s'] * REFERENCE_PASSES_PER_ROW / ours['min_s']:.2f}x | "
            f"{mo.get('peak_rss_mb', float('nan')):.0f} / {mr.get('peak_rss_mb', float('nan')):.0f} | "
            f"{mo.get('activation_rss_mb', float('nan')):.0f} / {mr.get('activation_rss_mb', float('nan')):.0f} |")
    if ("ours", 9) in t and ("ours", 12) in t:
        def ratio(m: str) -> float:
            return t[(m, 12)]["min_s"] / t[(m, 9)]["min_s"]
        line = f"\nN = 12 vs N = 9 time: ours {ratio('ours'):.2f}x"
        if ("reference", 9) in t and ("reference", 12) in t:
            line += f", reference {ratio('reference'):.2f}x"
        if ("bare", 9) in t and ("bare", 12) in t:
            line += (f"; a bare forward alone {ratio('bare'):.2f}x (tokens x"
                     f"{t[('ours', 12)]['seq_len'] / t[('ours', 9)]['seq_len']:.2f})")
        lines.append(line)
    for n in ns:
        if ("ours", n) in t and ("ours_no_greedy", n) in t:
            lines.append(f"\nN = {n}: the greedy reply (vanilla_generate) costs ours / ours_no_greedy = "
                         f"{t[('ours', n)]['min_s'] / t[('ours_no_greedy', n)]['min_s']:.3f}x per row")
    lines.append("\nTimes are the minimum over the interleaved repetitions (s per row, batch size 1).")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[4, 8, 9, 12], help="numbers of candidates (4 8 9 12)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per (method, N) after a warm-up (5)")
    p.add_argument("--image-size", type=int, default=336, help="square image size before the processor (336)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (2)")
    p.add_argument("--model-dir", default=None, help="existing model folder (built from --preset if omitted)")
    p.add_argument("--preset", default="medium", help="size of the random model built when --model-dir is "
                   "omitted (medium; tiny only checks that the script runs)")
    p.add_argument("--methods", nargs="+", default=["bare", "ours", "reference"])
    p.add_argument("--json", default=None, help="also write the raw results here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.worker:
        import torch
        torch.set_num_threads(args.threads)
        if args.worker == "time":
            result = time_worker(args.n[0], args.methods, args.model_dir, args.reps, args.image_size, args.device)
        else:
            result = memory_worker(args.worker.split(":", 1)[1], args.n[0], args.model_dir, args.image_size,
                                   args.device)
        print(json.dumps(result))
        return
    if args.model_dir is None:
        from ladbench.models.tiny import build_tiny_model
        args.model_dir = build_tiny_model("qwen2_5_vl", os.path.join(tempfile.mkdtemp(), f"{args.preset}_qwen2_5_vl"),
                                          seed=0, preset=args.preset)
    timing, memory = [], []
    for n in args.n:
        timing += _run_worker("time", n, args)
        for method in args.methods:
            memory += _run_worker(f"memory:{method}", n, args)
        for r in timing[-len(args.methods):]:
            print(f"N={n:2d} {r['method']:9s} min {r['min_s']:.3f} s  median {r['median_s']:.3f} s", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"timing": timing, "memory": memory, "threads": args.threads, "device": args.device}, f, indent=1)
    print(markdown_table(timing, memory))


if __name__ == "__main__":
    main()
