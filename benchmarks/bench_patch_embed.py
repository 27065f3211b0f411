"""The patch embedding of a Qwen-style vision tower as a ``Conv3d`` (transformers' module, cuDNN's
or oneDNN's convolution) against the same weights as ONE matrix product
(``models/kernels.patch_embedding_as_linear``, what ``ladbench infer`` runs on a GPU), on the
published configs' shapes: one row of N = 4 at 336 px (2,304 patches) and a batch of 8 such rows
(18,432). Alternating repetitions, the minimum of each; the ratio conv / matrix product and the
largest difference relative to the output's scale. bfloat16 on a GPU, float32 on the CPU (where
``infer`` keeps the convolution: its bits are the reference). Seconds, no model to build.

Usage: python benchmarks/bench_patch_embed.py [--device cuda] [--reps 20] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from ladbench.models.kernels import patch_embedding_as_linear

#: (in channels, out channels, kernel, bias) of the published vision configs
SHAPES = {
    "qwen2_5_vl (3B, 7B, 72B)": (3, 1280, (2, 14, 14), False),
    "qwen3_vl_8b": (3, 1152, (2, 16, 16), True),
}
ROWS = (2304, 18432)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds(fn, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def measure(shape: tuple, rows: int, device: torch.device, dtype: torch.dtype, reps: int) -> dict:
    in_channels, out_channels, kernel, bias = shape
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(in_channels, out_channels, kernel_size=kernel, stride=kernel, bias=bias,
                           device=device, dtype=dtype)
    pixels = torch.randn(rows, in_channels, *kernel, device=device, dtype=dtype)
    ways = {"conv3d": lambda: type(conv).forward(conv, pixels), "linear": lambda: patch_embedding_as_linear(conv, pixels)}
    best = dict.fromkeys(ways, float("inf"))
    with torch.no_grad():
        outputs = {name: fn() for name, fn in ways.items()}                  # warm-up (algorithm choice)
        for _ in range(reps):
            for name, fn in ways.items():
                best[name] = min(best[name], seconds(fn, device))
    want, got = outputs["conv3d"].float(), outputs["linear"].float()
    return {"rows": rows, "conv3d_ms": 1e3 * best["conv3d"], "linear_ms": 1e3 * best["linear"],
            "ratio": best["conv3d"] / best["linear"],
            "max_rel_diff": float((got - want).abs().max() / want.abs().max())}


def kernel_bench_parser(doc: str) -> argparse.ArgumentParser:
    """The options of a kernel benchmark (this one's and bench_aligned_widths.py's)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions of each way (20)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (torch's default)")
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="patches per call (2304 18432)")
    p.add_argument("--json", default=None, help="also write the results here")
    return p


def kernel_bench_device(args: argparse.Namespace) -> tuple[torch.device, torch.dtype, str]:
    """The device, its dtype (bfloat16 on a GPU, float32 on the CPU) and a label naming it, with
    ``--threads`` applied."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    return device, dtype, label


def main() -> None:
    args = kernel_bench_parser(__doc__).parse_args()
    device, dtype, label = kernel_bench_device(args)
    print(f"patch embedding, {label}, {dtype}, torch {torch.__version__}\n")
    print("| vision config | patches | Conv3d ms | matrix product ms | Conv3d / matrix product | max diff (rel.) |")
    print("|---|---|---|---|---|---|", flush=True)
    results = []
    for name, shape in SHAPES.items():
        for rows in args.rows:                  # a row printed as soon as measured (a slow cuDNN case)
            r = {"shape": name, **measure(shape, rows, device, dtype, args.reps)}
            results.append(r)
            print(f"| {r['shape']} | {r['rows']:,} | {r['conv3d_ms']:.2f} | {r['linear_ms']:.2f} | {r['ratio']:.1f}x | "
                  f"{r['max_rel_diff']:.1e} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": label, "dtype": str(dtype), "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
