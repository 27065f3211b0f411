"""transformers' RMSNorm as shipped against the same norm normalised by torch's fused kernel
(``models/kernels.fused_rms_norm``, what ``ladbench infer`` runs on a GPU), at the study's shapes.
Alternating repetitions, the minimum of each; the ratio shipped / fused, the operations each call
dispatches (each a kernel launch on a GPU), the share of output elements with the very bits of
transformers' norm, and the largest difference relative to the output's scale. bfloat16 on a GPU,
float32 on the CPU (where ``infer`` keeps transformers' norm: its bits are the reference). Seconds,
no model to build.

The shapes (rows: the positions one call normalises):

* a scoring batch of 8 rows at N = 4, 336 px: Qwen2.5-VL-3B's tower (18,432 patches, 1,280 wide;
  two norms in each of its 32 blocks) and decoder (about 700 positions a row, 2,048 wide; two in
  each of its 36 layers and the final one), InternVL3-8B's decoder (about 1,100 a row, 3,584);
* a decode step of the loop's 64 sequences in flight (one position each), both decoders.

Usage: python benchmarks/bench_norms.py [--device cuda] [--reps 20] [--threads N] [--small] [--json FILE]
"""
from __future__ import annotations

import json

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench_aligned_widths import measure
from bench_patch_embed import kernel_bench_device, kernel_bench_parser
from ladbench.models.kernels import fused_rms_norm

#: what one call normalises: (rows, width)
SHAPES = {
    "qwen2_5_vl_3b tower, scoring batch": (18432, 1280),
    "qwen2_5_vl_3b decoder, scoring batch": (8 * 700, 2048),
    "internvl3_8b decoder, scoring batch": (8 * 1100, 3584),
    "qwen2_5_vl_3b decoder, decode step": (64, 2048),
    "internvl3_8b decoder, decode step": (64, 3584),
}
#: --small: rows cut to this many at most (a smoke test)
SMALL_ROWS = 256


class _Dispatched(TorchDispatchMode):
    """Counts the operations a call dispatches to a device's kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def dispatched(fn) -> int:
    with torch.no_grad(), _Dispatched() as mode:
        fn()
    return mode.count


def norm_ways(rows: int, width: int, device: torch.device, dtype: torch.dtype) -> dict:
    """way -> callable: transformers' Qwen2 RMSNorm (the study's models' decoder and tower norm)
    as shipped and fused, random weight, rows of mixed magnitudes."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    norm = Qwen2RMSNorm(width, eps=1e-6).to(device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.normal_()
    x = (torch.randn(rows, width, device=device) * torch.logspace(-2, 1, rows, device=device)[:, None]).to(dtype)
    return {"shipped": lambda: norm(x), "fused": lambda: fused_rms_norm(x, norm.weight, norm.variance_epsilon)}


def equal_bits(ways: dict) -> float:
    """The share of the fused output's elements equal, bit for bit, to transformers'."""
    with torch.no_grad():
        return float((ways["fused"]() == ways["shipped"]()).float().mean())


def main() -> None:
    p = kernel_bench_parser(__doc__)
    p.set_defaults(rows=None)
    p.add_argument("--small", action="store_true", help=f"at most {SMALL_ROWS} rows a shape: a smoke test")
    args = p.parse_args()
    device, dtype, label = kernel_bench_device(args)
    print(f"RMSNorm, transformers' against torch's fused kernel, {label}, {dtype}, torch {torch.__version__}\n")
    print("| norm | rows x width | shipped ms | fused ms | shipped / fused | operations a call: shipped / fused "
          "| equal bits | max diff (rel.) |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    results = []
    for name, (rows, width) in SHAPES.items():          # a row printed as soon as measured
        rows = min(rows, SMALL_ROWS) if args.small else rows
        torch.manual_seed(0)
        ways = norm_ways(rows, width, device, dtype)
        r = {"norm": name, "rows": rows, "width": width, **measure(ways, device, args.reps),
             "operations": {way: dispatched(fn) for way, fn in ways.items()}, "equal_bits": equal_bits(ways)}
        results.append(r)
        print(f"| {name} | {rows:,} x {width:,} | {r['ms']['shipped']:.3f} | {r['ms']['fused']:.3f} | "
              f"{r['ratio']['fused']:.2f}x | {r['operations']['shipped']} / {r['operations']['fused']} | "
              f"{100 * r['equal_bits']:.2f}% | {r['max_rel_diff']:.1e} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": label, "dtype": str(dtype), "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
