"""A gated MLP of an unaligned hidden width (Qwen2.5-VL's vision MLP: 1,280 -> 3,420 -> 1,280, with
biases, SiLU; transformers' own module) as shipped against the same weights padded with zero
units (``models/kernels.pad_gated_mlp``, what ``ladbench infer`` runs on a GPU) to a multiple of
8 and of 64 (``kernels.PADDED_WIDTH_MULTIPLE``), on the vision tower's rows: one row of N = 4
at 336 px (2,304 patches) and a batch of 8 such rows (18,432). Alternating repetitions, the
minimum of each; the ratio shipped / padded and the largest difference relative to the output's
scale. bfloat16 on a GPU, float32 on the CPU (where ``infer`` keeps the shipped width: its bits
are the reference). Seconds, no model to build.

Usage: python benchmarks/bench_padded_mlp.py [--device cuda] [--reps 20] [--threads N] [--json FILE]
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import types

import torch

from bench_patch_embed import ROWS, seconds
from ladbench.models.kernels import ALIGNED_WIDTH, PADDED_WIDTH_MULTIPLE, gated_mlp, pad_gated_mlp

#: (hidden, intermediate, bias, activation) of the published vision configs with an unaligned MLP
SHAPES = {
    "qwen2_5_vl vision (3B, 7B, 72B)": (1280, 3420, True, "silu"),
}
#: the multiples the hidden width is padded to: the alignment alone, and what infer pads to
MULTIPLES = (ALIGNED_WIDTH, PADDED_WIDTH_MULTIPLE)


def shipped_mlp(shape: tuple, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' Qwen2.5-VL MLP at ``shape``, random weights."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLMLP

    hidden, intermediate, bias, act = shape
    torch.manual_seed(0)
    config = types.SimpleNamespace(hidden_size=hidden, intermediate_size=intermediate, hidden_act=act)
    return Qwen2_5_VLMLP(config, bias=bias).to(device=device, dtype=dtype)


def padded_copy(mlp: torch.nn.Module, multiple: int) -> torch.nn.Module:
    copied = copy.deepcopy(mlp)
    width = gated_mlp(copied)[0].out_features
    pad_gated_mlp(*gated_mlp(copied), -(-width // multiple) * multiple)
    return copied


def measure(shape: tuple, rows: int, device: torch.device, dtype: torch.dtype, reps: int) -> dict:
    shipped = shipped_mlp(shape, device, dtype)
    mlps = {"shipped": shipped, **{f"padded_{m}": padded_copy(shipped, m) for m in MULTIPLES}}
    x = torch.randn(rows, shape[0], device=device, dtype=dtype)
    best = dict.fromkeys(mlps, float("inf"))
    with torch.no_grad():
        outputs = {name: mlp(x).float() for name, mlp in mlps.items()}        # warm-up (kernel choice)
        for _ in range(reps):
            for name, mlp in mlps.items():
                best[name] = min(best[name], seconds(functools.partial(mlp, x), device))
    scale = outputs["shipped"].abs().max()
    return {"rows": rows, **{f"{name}_ms": 1e3 * s for name, s in best.items()},
            **{f"{name}_width": gated_mlp(mlp)[0].out_features for name, mlp in mlps.items()},
            **{f"ratio_{m}": best["shipped"] / best[f"padded_{m}"] for m in MULTIPLES},
            "max_rel_diff": max(float((outputs[n] - outputs["shipped"]).abs().max() / scale) for n in mlps)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions of each way (20)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (torch's default)")
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="patches per call (2304 18432)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"gated MLP, shipped against padded widths, {label}, {dtype}, torch {torch.__version__}\n")
    print("| MLP | rows | shipped ms | " + " | ".join(f"padded to {m} ms" for m in MULTIPLES) + " | "
          + " | ".join(f"shipped / {m}" for m in MULTIPLES) + " | max diff (rel.) |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    results = []
    for name, shape in SHAPES.items():
        for rows in args.rows:
            r = {"shape": name, **measure(shape, rows, device, dtype, args.reps)}
            results.append(r)
            cells = ([f"{r['shipped_ms']:.2f}"] + [f"{r[f'padded_{m}_ms']:.2f}" for m in MULTIPLES]
                     + [f"{r[f'ratio_{m}']:.2f}x" for m in MULTIPLES] + [f"{r['max_rel_diff']:.1e}"])
            print(f"| {name} | {rows:,} | " + " | ".join(cells) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": label, "dtype": str(dtype), "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
