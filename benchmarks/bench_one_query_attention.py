"""One decode step's attention (one query position per sequence) two ways, at the language models'
published head shapes: transformers' SDPA path, which copies each KV head once per query head of
its group (``repeat_kv``), against the query heads packed on their KV heads
(``models/attention.one_query_attention``, no copy; what ``packs_one_query`` chose on a GPU).

The end-to-end decode loop measured the packed query slower on an H200 (bench_inference
--generation: repeat_kv / packed 484 / 377 tokens/s for CoT, 843 / 730 for SC; results/
h200-2026-11-27). This isolates the kernel over the sequences in flight and the KV length (a
study reply of 1,024 tokens ends near 1,900 positions), with the decode loop's boolean padding
mask [B, 1, 1, Tk] and without one. Each timing is one step: the call once per layer (36 for
Qwen2.5-VL-3B, 28 for InternVL3-8B's Qwen2.5-7B), alternating the ways, the minimum of the
repetitions; the ratio repeat_kv / packed (above 1: packing wins). Each way also runs with cuDNN's
attention left out of SDPA's choice (``models/kernels.attention_backends``: infer's
``--no-cudnn-attention``), and, with the mask, over fresh shapes: a decode loop meets a KV
length it has not seen at every step, and cuDNN builds a graph per new shape (public reports:
hundreds of ms each), a cost the warm timings never see; ``--fresh-steps`` steps
of lengths just past each timed one, each step once, their mean. bfloat16 on a GPU, float32 on the
CPU (where cuDNN is not in the choice). Seconds, no model to build.

Usage: python benchmarks/bench_one_query_attention.py [--device cuda] [--reps 20] [--fresh-steps 8] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from bench_patch_embed import seconds
from ladbench.models.attention import one_query_attention
from ladbench.models.kernels import attention_backends

#: (layers, query heads, KV heads, head dim) of the language models
SHAPES = {
    "qwen2_5_vl_3b": (36, 16, 2, 128),
    "internvl3_8b": (28, 28, 4, 128),
}
BATCHES = (4, 16, 64)
KEYS = (512, 1024, 2048, 4096)


class _Attention(torch.nn.Module):
    """What transformers' ``sdpa_attention_forward`` reads of its module."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


def inputs(shape: tuple, batch: int, keys: int, device: torch.device, dtype: torch.dtype, masked: bool):
    _, heads, kv_heads, dim = shape
    torch.manual_seed(0)
    query = torch.randn(batch, heads, 1, dim, device=device, dtype=dtype)
    key, value = (torch.randn(batch, kv_heads, keys, dim, device=device, dtype=dtype) for _ in range(2))
    mask = None
    if masked:                                               # left padding, as the decode loop's rows have
        pad = torch.randint(0, keys // 10 + 1, (batch, 1, 1, 1), device=device)
        mask = torch.arange(keys, device=device).view(1, 1, 1, keys) >= pad
    return query, key, value, mask


def ways(shape: tuple, query, key, value, mask) -> dict:
    """The four ways of one attention call, by name: transformers' path and the packed query, each
    with SDPA's own backend choice and with cuDNN left out."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    _, heads, kv_heads, dim = shape
    module, scaling = _Attention(heads // kv_heads), dim ** -0.5
    calls = {"repeat_kv": lambda: sdpa_attention_forward(module, query, key, value, mask, scaling=scaling)[0],
             "packed": lambda: one_query_attention(query, key, value, mask, scaling)[0]}

    def without_cudnn(call):
        def run():
            with attention_backends(cudnn=False):            # what --no-cudnn-attention runs
                return call()
        return run
    return {**calls, **{f"{name}_no_cudnn": without_cudnn(call) for name, call in calls.items()}}


def one_step(call, layers: int):
    """One decode step of ``call``: once per layer."""
    return lambda: [call() for _ in range(layers)]


def measure(shape: tuple, batch: int, keys: int, device: torch.device, dtype: torch.dtype, reps: int,
            masked: bool, fresh_steps: int) -> dict:
    layers = shape[0]
    calls = ways(shape, *inputs(shape, batch, keys, device, dtype, masked))

    best = dict.fromkeys(calls, float("inf"))
    with torch.no_grad():
        outputs = {name: call() for name, call in calls.items()}              # warm-up
        for _ in range(reps):
            for name, call in calls.items():
                best[name] = min(best[name], seconds(one_step(call, layers), device))
        fresh = {name: fresh_shapes_ms(shape, batch, keys, device, dtype, name, fresh_steps)
                 for name in calls} if masked and fresh_steps else {}
    want = outputs["repeat_kv"].float()
    return {"batch": batch, "keys": keys, "masked": masked,
            **{f"{name}_ms": 1e3 * t for name, t in best.items()},
            **{f"{name}_fresh_ms": t for name, t in fresh.items()},
            "ratio": best["repeat_kv"] / best["packed"],
            "max_rel_diff": max(float((out.float() - want).abs().max() / want.abs().max()) for out in outputs.values())}


def fresh_shapes_ms(shape: tuple, batch: int, keys: int, device: torch.device, dtype: torch.dtype, way: str,
                    steps: int) -> float:
    """Mean ms of ``steps`` decode steps of ``way`` whose KV lengths (keys + 1, keys + 2, ...) this
    process has not run before: each step's first meeting with its shape, as in a decode loop."""
    total = 0.0
    for extra in range(1, steps + 1):
        call = ways(shape, *inputs(shape, batch, keys + extra, device, dtype, True))[way]
        total += seconds(one_step(call, shape[0]), device)
    return 1e3 * total / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES), help="sequences in flight")
    p.add_argument("--keys", type=int, nargs="+", default=list(KEYS), help="KV positions")
    p.add_argument("--fresh-steps", type=int, default=8,
                   help="decode steps over new KV lengths per masked case (0: none)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"one-query attention per decode step (ms; with the padding mask also over fresh shapes), {where}, "
          f"{dtype}, torch {torch.__version__}\n")
    names = ("repeat_kv", "packed", "repeat_kv_no_cudnn", "packed_no_cudnn")
    print(f"| model (layers) | sequences | KV positions | padding mask | {' | '.join(n.replace('_no_cudnn', ', no cuDNN') for n in names)} "
          "| repeat_kv / packed | max diff (rel.) |")
    print("|---|---|---|---|" + "---|" * len(names) + "---|---|")
    results = {"device": where, "dtype": str(dtype), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
               "rows": []}
    for masked in (True, False):                                  # the decode loop's case first
        for name, shape in SHAPES.items():
            for batch in args.batches:
                for keys in args.keys:
                    r = {"model": name, **measure(shape, batch, keys, device, dtype, args.reps, masked,
                                                  args.fresh_steps)}
                    results["rows"].append(r)
                    cells = [f"{r[f'{way}_ms']:.3f}" + (f" / {r[f'{way}_fresh_ms']:.3f}" if masked and args.fresh_steps
                                                       else "") for way in names]
                    print(f"| {name} ({shape[0]}) | {batch} | {keys:,} | {'yes' if masked else 'no'} | "
                          f"{' | '.join(cells)} | {r['ratio']:.2f}x | {r['max_rel_diff']:.1e} |", flush=True)
                    if args.json:
                        with open(args.json, "w") as f:
                            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
