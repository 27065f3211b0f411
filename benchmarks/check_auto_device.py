"""``family: auto`` on another device: the same cache as on the CPU (current lane).

For the tiny build of every architecture ``family: auto`` was tested on (models/tiny_archs.py,
plus the hand-written families' tiny builds), write the inference cache of a small benchmark
on the CPU and on ``--device`` (float32 both; TF32 off) through ``run_inference``, the stage's
own entry point, and compare: the same spans and greedy replies, candidate scores and
attention masses within a tolerance. Prints one line per architecture and writes the raw
numbers as JSON (``--json``). A check of mechanics on random tiny models, not of accuracy.

    python benchmarks/check_auto_device.py --device cuda --json auto_cuda.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_inference import _demo_inputs, scratch_folder  # noqa: E402

#: float32 on two devices: reductions in another order, nothing more
TOLERANCE = {"scores": 1e-3, "attn": 1e-4, "attn_text": 1e-4}


def cache_on(device: str, model_dir: str, bench: str, images: str, out: str, image_size: int) -> dict:
    from ladbench.inference.cache import read_cache
    from ladbench.inference.runner import InferenceSettings, run_inference
    t0 = time.perf_counter()
    run_inference(InferenceSettings(benchmark=bench, images=images, out=out, model_name="tiny", family="auto",
                                    model_path=model_dir, device=device, dtype="float32", image_size=image_size,
                                    batch_size=4))
    cache = read_cache(out)
    return {"arrays": cache.arrays, "attrs": cache.attrs, "wall_s": time.perf_counter() - t0}


def compare(name: str, model_dir: str, device: str, folder: str, n: int, image_size: int) -> dict:
    import numpy as np
    bench, images = _demo_inputs(os.path.join(folder, "inputs"), n, n_eval=6, n_images=2 * n)
    caches = {d: cache_on(d, model_dir, bench, images, os.path.join(folder, f"{d}.h5"), image_size)
              for d in ("cpu", device)}
    cpu, other = caches["cpu"]["arrays"], caches[device]["arrays"]
    row = {"architecture": name, "n": n, "wall_s": {d: c["wall_s"] for d, c in caches.items()}}
    for key in TOLERANCE:
        row[f"max_abs_{key}"] = float(np.abs(cpu[key] - other[key]).max())
    row["greedy_equal"] = bool(np.array_equal(cpu["greedy_tokens"], other["greedy_tokens"]))
    row["argmax_equal"] = bool(np.array_equal(cpu["scores"].argmax(-1), other["scores"].argmax(-1)))
    row["ok"] = all(row[f"max_abs_{k}"] <= tol for k, tol in TOLERANCE.items())
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="the device compared with the CPU (cuda)")
    p.add_argument("--n", type=int, default=4, help="candidates per instance (4)")
    p.add_argument("--architectures", nargs="+", default=None, help="default: every tiny build auto runs on")
    p.add_argument("--json", default=None, help="also write the raw results here")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    from ladbench.models.tiny import build_tiny_model
    from ladbench.models.tiny_archs import BUILDS, FAMILY_BUILDS_AUTO_RUNS, build_tiny_architecture
    names = args.architectures or sorted(BUILDS) + list(FAMILY_BUILDS_AUTO_RUNS)
    root = scratch_folder("auto_device_")
    rows = []
    for name in names:
        folder = os.path.join(root, name)
        try:
            build = build_tiny_architecture if name in BUILDS else build_tiny_model
            model_dir = build(name, os.path.join(folder, "model"), seed=0)
            rows.append(compare(name, model_dir, args.device, folder, args.n, 56))
        except Exception as error:                       # one architecture's failure is a result, not the end
            rows.append({"architecture": name, "n": args.n, "ok": False,
                         "error": "".join(traceback.format_exception_only(error)).strip()[-600:]})
        r = rows[-1]
        print(f"{name:18s} " + ("ok  " if r["ok"] else "FAIL") + " " +
              (r.get("error") or "max |d| scores {max_abs_scores:.2e} attn {max_abs_attn:.2e} greedy equal "
               "{greedy_equal} argmax equal {argmax_equal}".format(**r)), flush=True)
    raw = {"device": args.device, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
           "date": time.strftime("%Y-%m-%d"), "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)
    print(f"{sum(r['ok'] for r in rows)} of {len(rows)} architectures write the CPU's cache on {args.device}")


if __name__ == "__main__":
    main()
