"""Matrix products of a width that is not a multiple of 8 elements, as shipped against the same
weights padded with zeros to an aligned width, at the study's shapes. Alternating repetitions, the
minimum of each; the ratio shipped / padded and the largest difference relative to the output's
scale. bfloat16 on a GPU, float32 on the CPU (where ``infer`` keeps the shipped widths: its bits
are the reference). Seconds, no model to build.

* ``mlp``: Qwen2.5-VL's vision MLP (1,280 -> 3,420 -> 1,280, biases, SiLU; transformers' own
  module) padded with zero units (``models/kernels.pad_gated_mlp``, what ``ladbench infer`` runs
  on a GPU) to a multiple of 8 and of 64 (``kernels.PADDED_WIDTH_MULTIPLE``), on the tower's
  rows: one row of N = 4 at 336 px (2,304 patches) and a batch of 8 such rows (18,432).
* ``lm_head``: InternVL3-8B's LM head (3,584 -> 151,674 tokens) with zero rows to a multiple of 64
  and its logits cut back to the vocabulary, on the last positions of the sequences in flight (4:
  a scoring or CoT batch; 64: the decode loop's GPU default). ``infer`` does not pad it (yet):
  this measures whether it should.

Usage: python benchmarks/bench_aligned_widths.py [--device cuda] [--reps 20] [--threads N]
                                                 [--small] [--json FILE]
"""
from __future__ import annotations

import copy
import functools
import json
import types

import torch
import torch.nn.functional as F

from bench_patch_embed import kernel_bench_device, kernel_bench_parser, seconds
from ladbench.models.kernels import ALIGNED_WIDTH, PADDED_WIDTH_MULTIPLE, gated_mlp, pad_gated_mlp, round_up

#: (hidden, intermediate, bias, activation) of the published vision configs with an unaligned MLP
MLP_SHAPES = {
    "qwen2_5_vl vision MLP (3B, 7B, 72B)": (1280, 3420, True, "silu"),
}
#: (hidden, vocabulary) of the study's LM heads with an unaligned vocabulary
HEAD_SHAPES = {
    "internvl3_8b LM head": (3584, 151674),
}
#: sequences in flight whose last position goes through the LM head
HEAD_ROWS = (4, 64)
#: the multiples the hidden width is padded to: the alignment alone, and what infer pads to
MULTIPLES = (ALIGNED_WIDTH, PADDED_WIDTH_MULTIPLE)


def shipped_mlp(shape: tuple, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' Qwen2.5-VL MLP at ``shape``, random weights."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLMLP

    hidden, intermediate, bias, act = shape
    config = types.SimpleNamespace(hidden_size=hidden, intermediate_size=intermediate, hidden_act=act)
    return Qwen2_5_VLMLP(config, bias=bias).to(device=device, dtype=dtype)


def padded_mlp(mlp: torch.nn.Module, multiple: int) -> torch.nn.Module:
    copied = copy.deepcopy(mlp)
    projections = gated_mlp(copied)
    pad_gated_mlp(*projections, round_up(projections[0].out_features, multiple))
    return copied


def mlp_ways(shape: tuple, rows: int, device: torch.device, dtype: torch.dtype) -> tuple[dict, dict]:
    """way -> callable, way -> hidden width: the MLP as shipped and padded."""
    shipped = shipped_mlp(shape, device, dtype)
    mlps = {"shipped": shipped, **{f"padded_{m}": padded_mlp(shipped, m) for m in MULTIPLES}}
    x = torch.randn(rows, shape[0], device=device, dtype=dtype)
    return ({name: functools.partial(mlp, x) for name, mlp in mlps.items()},
            {name: gated_mlp(mlp)[0].out_features for name, mlp in mlps.items()})


def head_ways(shape: tuple, rows: int, device: torch.device, dtype: torch.dtype) -> tuple[dict, dict]:
    """way -> callable, way -> width: the LM head's float32 logits as the adapter reads them
    (``lm_head(hidden)[:, -1].float()``), shipped and with zero rows cut off again."""
    hidden, vocab = shape
    weight = torch.randn(vocab, hidden, device=device, dtype=dtype) * hidden ** -0.5
    x = torch.randn(rows, hidden, device=device, dtype=dtype)
    weights = {"shipped": weight, **{f"padded_{m}": F.pad(weight, (0, 0, 0, round_up(vocab, m) - vocab))
                                     for m in MULTIPLES}}

    def logits(w: torch.Tensor) -> torch.Tensor:
        return F.linear(x, w)[:, :vocab].float()
    return ({name: functools.partial(logits, w) for name, w in weights.items()},
            {name: w.shape[0] for name, w in weights.items()})


def measure(ways: dict, device: torch.device, reps: int) -> dict:
    best = dict.fromkeys(ways, float("inf"))
    with torch.no_grad():
        outputs = {name: fn().float() for name, fn in ways.items()}          # warm-up (kernel choice)
        for _ in range(reps):
            for name, fn in ways.items():
                best[name] = min(best[name], seconds(fn, device))
    scale = outputs["shipped"].abs().max()
    return {"ms": {name: 1e3 * s for name, s in best.items()},
            "ratio": {name: best["shipped"] / s for name, s in best.items() if name != "shipped"},
            "max_rel_diff": max(float((out - outputs["shipped"]).abs().max() / scale) for out in outputs.values())}


def main() -> None:
    p = kernel_bench_parser(__doc__)                   # --rows: the MLP's patches per call
    p.add_argument("--small", action="store_true", help="the LM head 64 wide (the vocabulary stays): a smoke test")
    args = p.parse_args()
    device, dtype, label = kernel_bench_device(args)
    print(f"unaligned widths, shipped against padded, {label}, {dtype}, torch {torch.__version__}\n")
    print("| product | rows | width shipped / padded | shipped ms | " + " | ".join(f"padded to {m} ms" for m in MULTIPLES)
          + " | " + " | ".join(f"shipped / {m}" for m in MULTIPLES) + " | max diff (rel.) |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    heads = {name: (64 if args.small else hidden, vocab) for name, (hidden, vocab) in HEAD_SHAPES.items()}
    cases = ([(name, shape, rows, mlp_ways) for name, shape in MLP_SHAPES.items() for rows in args.rows]
             + [(name, shape, rows, head_ways) for name, shape in heads.items() for rows in HEAD_ROWS])
    results = []
    for name, shape, rows, ways_of in cases:          # a row printed as soon as measured
        torch.manual_seed(0)
        ways, widths = ways_of(shape, rows, device, dtype)
        r = {"product": name, "rows": rows, "widths": widths, **measure(ways, device, args.reps)}
        results.append(r)
        cells = ([" / ".join(f"{w:,}" for w in widths.values()), f"{r['ms']['shipped']:.3f}"]
                 + [f"{r['ms'][f'padded_{m}']:.3f}" for m in MULTIPLES]
                 + [f"{r['ratio'][f'padded_{m}']:.2f}x" for m in MULTIPLES] + [f"{r['max_rel_diff']:.1e}"])
        print(f"| {name} | {rows:,} | " + " | ".join(cells) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": label, "dtype": str(dtype), "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
