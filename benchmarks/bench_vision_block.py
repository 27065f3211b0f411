"""One block of Qwen2.5-VL-3B's vision tower as ``ladbench infer`` runs it (the batched tower's
``models/vision.vision_block_step``; on a GPU the MLP padded and the norms fused, as infer runs
them), eager against the same step under ``torch.compile``, at the study's patches per call.
Does fusing the block's elementwise work pay?

Why: the H200 trace of a scoring batch (benchmarks/results/h200-2026-11-27, N = 4, batch 8) spends
about 57 of the tower's 138 ms of kernels on elementwise work (the float32 rotary embedding, whose
broadcast cos/sin run torch's generic strided kernel, and the two float32 RMSNorms: per block 9
multiplies, 8 casts, 6 adds, 2 concatenations, 2 negations, 2 powers, 2 means and a SiLU), each a
pass over the block's activations in memory. A compiled step does them in a few fused kernels;
exact arithmetic is the same, the rounding may differ (a fused multiply-add, another order of
the norm's sum), so the largest difference is reported beside the ratio.

Per number of patches (in the order given) and layer kind (windowed: windows of 64 patches;
full: an image's 576), alternating repetitions, the minimum of each; the compiled step's first
call (its compilation) is timed apart. bfloat16 on a GPU, float32 on the CPU. ``--backend eager`` traces the step without compiling it (a smoke
test of the capture: one graph per layer kind, ``fullgraph``). Seconds to a minute, no model to
build, no weights read. ``--json`` is rewritten after every row.

Usage: python benchmarks/bench_vision_block.py [--device cuda] [--reps 20] [--rows 2304 18432]
                                               [--backend inductor] [--small] [--json FILE]
"""
from __future__ import annotations

import json
import types

import torch

from bench_inference import architecture
from bench_patch_embed import kernel_bench_device, kernel_bench_parser, seconds
from ladbench.models.kernels import pad_unaligned_mlps, use_fused_rms_norms
from ladbench.models.rotary import signed_sin
from ladbench.models.vision import AttentionGroups, compiled_block_step, vision_block_step

#: patches of one image (336 px: a 24 x 24 grid) and of one attention window (112 px: 8 x 8)
IMAGE_PATCHES, WINDOW_PATCHES = 576, 64


def vision_block(small: bool, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' Qwen2.5-VL vision block at the 3B's sizes (``bench_inference.architecture``),
    random weights, with the kernel choices infer makes on ``device`` (none on the CPU)."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLVisionBlock

    a = architecture("qwen2_5_vl_3b", small)
    config = types.SimpleNamespace(hidden_size=a["vision_hidden"], intermediate_size=a["vision_intermediate"],
                                   num_heads=a["vision_heads"], hidden_act="silu", _attn_implementation="sdpa")
    torch.manual_seed(0)
    block = Qwen2_5_VLVisionBlock(config).to(device=device, dtype=dtype).eval()
    pad_unaligned_mlps(block)
    use_fused_rms_norms(block)
    return block


def rotary_tables(patches: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos and signed sine [patches, 1, head_dim] as the tower's plan holds them (random angles)."""
    angles = torch.rand(patches, head_dim // 2) * 24
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos()[:, None].to(device), signed_sin(emb.sin())[:, None].to(device)


def measure(block: torch.nn.Module, rows: int, group: int, args, device: torch.device,
            dtype: torch.dtype) -> dict:
    heads = block.attn.num_heads
    hidden = torch.randn(rows, block.norm1.weight.shape[0], device=device, dtype=dtype)
    cos, sin = rotary_tables(rows, hidden.shape[1] // heads, device)
    groups = AttentionGroups(length=group)
    compiled = compiled_block_step(args.backend)           # what --vision-tower compiled runs
    ways = {"eager": lambda: vision_block_step(block, hidden, cos, sin, groups),
            "compiled": lambda: compiled(block, hidden, cos, sin, groups)}
    with torch.no_grad():
        outputs = {"eager": ways["eager"]()}
        first_call_s = seconds(lambda: outputs.update(compiled=ways["compiled"]()), device)   # its compilation
        best = dict.fromkeys(ways, float("inf"))
        for _ in range(args.reps):
            for name, fn in ways.items():
                best[name] = min(best[name], seconds(fn, device))
    scale = outputs["eager"].float().abs().max()
    return {"rows": rows, "group": group, "ms": {name: 1e3 * s for name, s in best.items()},
            "ratio": best["eager"] / best["compiled"], "first_call_s": first_call_s,
            "max_rel_diff": float((outputs["compiled"].float() - outputs["eager"].float()).abs().max() / scale)}


def main() -> None:
    p = kernel_bench_parser(__doc__)                   # --rows: patches per call
    p.add_argument("--backend", default="inductor", help="torch.compile's backend (inductor; eager: capture only)")
    p.add_argument("--small", action="store_true", help="the block 128 wide (the groups stay): a smoke test")
    args = p.parse_args()
    device, dtype, label = kernel_bench_device(args)
    block = vision_block(args.small, device, dtype)
    print(f"Qwen2.5-VL-3B vision block, eager against torch.compile (backend {args.backend}), {label}, {dtype}, "
          f"torch {torch.__version__}\n")
    print("| layers | patches | eager ms | compiled ms | eager / compiled | first compiled call s | max diff (rel.) |")
    print("|---|---|---|---|---|---|---|", flush=True)
    raw = {"device": label, "dtype": str(dtype), "torch": torch.__version__, "backend": args.backend, "results": []}
    for rows in args.rows:                             # in the order asked: the most wanted first
        for kind, group in (("windowed", WINDOW_PATCHES), ("full", IMAGE_PATCHES)):
            r = {"layers": kind, **measure(block, rows, group, args, device, dtype)}
            raw["results"].append(r)
            print(f"| {kind} | {rows:,} | {r['ms']['eager']:.3f} | {r['ms']['compiled']:.3f} | {r['ratio']:.2f}x | "
                  f"{r['first_call_s']:.1f} | {r['max_rel_diff']:.1e} |", flush=True)
            if args.json:                              # after every row: a run stopped at its limit keeps them
                with open(args.json, "w") as f:
                    json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
