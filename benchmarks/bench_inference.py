"""Speed of the ``infer`` stage: per-row time vs the reference, host syncs, and GPU throughput (rerunnable; not a test).

Five parts; each prints a Markdown table (``--json`` also writes the raw numbers; parts 3 and
5 rewrite it after every measurement, so a run stopped by a time limit keeps what it measured,
and a measurement of theirs that fails, e.g. a compilation or the profiler on a GPU, is listed
in the file's ``failed`` and under the table while the measurements after it go on).

1. CPU time per row (default): a random "medium" Qwen2.5-VL (hidden 512, 8 layers, 8 heads / 2
   KV heads; ``ladbench demo-model --preset medium``) at batch size 1:

   * ``bare``: one SDPA forward of the prompt (no capture): the floor.
   * ``ours``: this project's row step (``RowRunner.score_batch``): batched vision tower, SDPA +
     last-row capture of every layer + candidate scores (for N >= 10 the prefix-trie
     continuation on the KV cache), input preparation included.
   * ``ours_no_greedy`` (ask with ``--methods``): ``ours`` without the greedy reply
     (``--no-greedy-reply``); ours / ours_no_greedy is the cost of storing the reference's
     Vanilla readout (one one-token KV-cache step, and the KV cache single-token scores skip).
   * ``reference``: eager attention + ``generate(max_new_tokens=1, output_attentions=True)``
     (every layer's T x T attention kept); for N >= 10 plus a full re-forward with the first
     answer token appended. The reference runs this once per method (Vanilla, PriDe, LAD).
   * ``today`` (with ``--baseline-src DIR``, a checkout of an earlier commit's ``src``): that
     commit's ``ours``, in alternating worker processes with ours (paired).

   All in-process methods of one N are timed interleaved, repetition by repetition, minimum reported;
   also the process CPU time (all threads), which load from other processes on a shared
   machine inflates far less than wall time (use ``--threads 1`` to compare ours with today).

2. Proxies of GPU efficiency that a CPU can measure (``--proxies``): per row of one batch's
   DEVICE step (``score_batch`` of a batch already prepared on the host, as the DataLoader
   workers hand it over), counted with ``torch.profiler`` and by wrapping ``Tensor`` methods:
   host syncs (``aten::_local_scalar_dense``, i.e. ``.item()`` / ``bool()`` / ``int()`` of a
   tensor, plus every ``Tensor.tolist`` and ``Tensor.cpu`` call, each a device-to-host copy on a
   GPU; counted even where the tensor is on the host, so an upper bound) and aten operations
   (each one kernel launch or more on a GPU). For the tiny and medium models, batch 8, our
   batched tower and transformers' native one, on the current lane the same model through
   ``family: auto``, and ``today`` with ``--baseline-src``.

3. On a GPU (``--device cuda --arch qwen2_5_vl_3b internvl3_8b``): the real architectures at
   full size with random weights and the real vocabulary (configs below), bfloat16:
   ``ladbench infer`` rows/s at batch 1 / 8 / 32 with the mean GPU utilisation (``nvidia-smi``
   sampled every 250 ms); the per-row split at batch 8 (host preparation, vision tower, decoder
   with capture, scoring); one forward pass ours / bare SDPA / the reference's eager path, at
   N = 4, 8, 12. ``--arch-scale small`` shrinks the architectures to check the mechanics on a CPU.
   ``--trace DIR`` also profiles one device step of the split per N (``torch.profiler``: a Chrome
   trace and the operators of most device time). ``benchmarks/gpu_session.sh`` is the one call
   a lent GPU runs for what is still unmeasured (scoring rows/s with traces, generation).

4. Per architecture (current lane, ``--architectures all`` or names; no timing): the proxies
   of part 2 for ``family: auto`` on the tiny build of each architecture (models/tiny_archs.py),
   plus the host syncs of its vision tower alone (the model's ``get_image_features`` on the
   batch's images). ``ladbench models --markdown --proxies <the --json file>`` is the README's
   model table; a tower with more than 20 syncs per row reads back inside its layers.

5. Generation (``--generation``; the tiny model on the CPU, ``--arch`` on a GPU): CoT and
   self-consistency through the decode loop (``ladbench infer``'s path) against plain
   ``generate(num_return_sequences=S)`` on the same prepared rows (both decode through the
   model's attention function, so on a GPU both attend one query on the KV heads), tokens/s and
   rows/s first, then (``--gen-measure``, in the order named; by default all of
   ``GENERATION_MEASUREMENTS``) its static shapes as CUDA graphs, the other attention for one
   query position (transformers' ``repeat_kv`` on a GPU, the query packed on the KV heads on the
   CPU), without cuDNN's attention (``--no-cudnn-attention``), the prefill group's sequences in
   flight, its static shapes compiled, replies equal, host syncs per decode step and decode steps
   over the cache's chunks. ``--gen-max-new-tokens study --end-boost 0``: every reply at the
   variant's own limit, as a study's job is priced.

    python benchmarks/bench_inference.py --n 4 8 9 12 --reps 5 --proxies --baseline-src /tmp/old/src
    python benchmarks/bench_inference.py --device cuda --arch qwen2_5_vl_3b internvl3_8b --n 4 8 12
    python benchmarks/bench_inference.py --generation --n 4 --image-size 56 --threads 1
    .venv-current/bin/python benchmarks/bench_inference.py --n 8 --architectures all --threads 1 \
        --json benchmarks/results/auto-architectures.json
"""
from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import dataclasses
import functools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable, TypeVar

REFERENCE_PASSES_PER_ROW = 3      # Vanilla, PriDe, LAD each re-run inference in the reference
GPU_PARTS = ("throughput", "split", "pass")   # infer rows/s + utilisation; per-row split; one pass vs bare/reference
T = TypeVar("T")


# ------------------------------------------------------------------------------ inputs
@functools.cache
def _run_scratch() -> str:
    """This process's one folder of throw-away inputs, models and caches, removed at its exit."""
    folder = tempfile.mkdtemp(prefix="ladbench-bench-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def scratch_folder(prefix: str = "") -> str:
    """A new folder for throw-away inputs, models and caches, inside :func:`_run_scratch` (a run
    builds hundreds of MB of random models: left in the temporary folder, each run's would stay
    there until the disk is full)."""
    return tempfile.mkdtemp(prefix=prefix, dir=_run_scratch())


def write_inputs(folder: str, bench: dict, table: list[dict]) -> tuple[str, str]:
    """The benchmark file and the image table (images under ``folder/img``) of a benchmark run."""
    bench_path, images_path = os.path.join(folder, "bench.json"), os.path.join(folder, "images.json")
    with open(bench_path, "w") as f:
        json.dump(bench, f)
    with open(images_path, "w") as f:
        json.dump({"dataset": "bench", "image_root": os.path.join(folder, "img"), "images": table}, f)
    return bench_path, images_path


def _demo_inputs(folder: str, n: int, *, n_eval: int = 1, n_images: int | None = None) -> tuple[str, str]:
    """``n_eval`` evaluation instances over ``n`` of ``n_images`` distinct random-noise images (+ one
    calibration instance)."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    n_images = max(n, n_images or n)
    os.makedirs(os.path.join(folder, "img"), exist_ok=True)
    table = []
    for i in range(n_images):
        Image.fromarray(rng.integers(0, 255, (400, 500, 3), dtype=np.uint8)).save(os.path.join(folder, "img", f"{i}.png"))
        table.append({"image_id": i, "file_name": f"{i}.png", "caption": f"image {i}", "categories": []})
    candidates = [[int(c) for c in rng.choice(n_images, n, replace=False)] for _ in range(n_eval)]
    evaluation = [{"id": k, "caption": "a small dog running on the grass next to a red ball" + " again" * (k % 3),
                   "target": c[0], "candidates": c, "orderings": [list(range(n))]} for k, c in enumerate(candidates)]
    bench = {"dataset": "bench", "setting": "random", "n_candidates": n, "seed": 0, "n_orderings": 1,
             "eval": evaluation,
             "calibration": [{"id": 0, "caption": "a cat", "target": 1, "candidates": list(range(n))}]}
    return write_inputs(folder, bench, table)


def _family(model_dir: str) -> str:
    with open(os.path.join(model_dir, "config.json")) as f:
        return {"internvl": "internvl"}.get(json.load(f).get("model_type"), "qwen2_5_vl")


def _given_chat_template(model_dir: str) -> str | None:
    """The chat template a study's config would give a tiny build released without one (an
    older checkout has none)."""
    try:
        from ladbench.models.tiny_archs import given_chat_template
    except ImportError:
        return None
    return given_chat_template(model_dir)


def _runner(model_dir: str, n: int, *, attention: str, image_size: int, device: str, n_eval: int = 1,
            vision: str = "batched", greedy_reply: bool = True, family: str | None = None, **settings):
    from ladbench.benchmark import load_benchmark
    from ladbench.data.coco import load_image_table
    from ladbench.inference.cache import plan_rows
    from ladbench.inference.runner import InferenceSettings, RowRunner, image_paths
    from ladbench.models import load_adapter

    family = family or _family(model_dir)
    kwargs = {"vision": vision} if vision != "batched" else {}          # (an older checkout has no such option)
    template = _given_chat_template(model_dir)
    if template:
        kwargs["chat_template"] = template
    adapter = load_adapter(family, model_dir, device=device, attention=attention, **kwargs)
    tmp = scratch_folder("inputs_")
    bench_path, images_path = _demo_inputs(tmp, n, n_eval=n_eval)
    settings = InferenceSettings(benchmark=bench_path, images=images_path, out=os.path.join(tmp, "x.h5"),
                                 model_name="bench", family=family, model_path=model_dir, image_size=image_size,
                                 device=device, **({} if greedy_reply else {"greedy_reply": False}), **settings)
    bench = load_benchmark(bench_path)
    return RowRunner(adapter, settings, bench, plan_rows(bench), image_paths(load_image_table(images_path)))


def _sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ------------------------------------------------------------------- 1. time per row
def _row_function(method: str, n: int, model_dir: str, image_size: int, device: str):
    """Load the model for ``method`` and return (callable running one row, sequence length)."""
    import torch

    attention = {"bare": "sdpa", "ours": "capture", "ours_no_greedy": "capture", "today": "capture",
                 "reference": "eager"}[method]
    runner = _runner(model_dir, n, attention=attention, image_size=image_size, device=device,
                     greedy_reply=method != "ours_no_greedy")
    adapter = runner.adapter
    first_token = adapter.tokenizer.convert_tokens_to_ids("1")

    @torch.no_grad()
    def one_row() -> None:
        if method in ("ours", "ours_no_greedy", "today"):
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


def time_worker(n: int, methods: list[str], model_dir: str, reps: int, image_size: int, device: str) -> list[dict]:
    """Time every method in ONE process, interleaved rep by rep, so that load from other
    processes on a shared machine hits all methods alike; the minimum is the robust figure."""
    rows, seq_len = {}, 0
    for m in methods:
        rows[m], seq_len = _row_function(m, n, model_dir, image_size, device)
        rows[m]()                                                          # warm-up
    times: dict[str, list[float]] = {m: [] for m in methods}
    cpu: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(reps):
        for m in methods:
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            rows[m]()
            _sync(device)
            times[m].append(time.perf_counter() - t0)
            cpu[m].append(time.process_time() - c0)
    return [{"method": m, "n": n, "seq_len": seq_len, "min_s": min(t), "median_s": statistics.median(t),
             "cpu_min_s": min(cpu[m])} for m, t in times.items()]


# --------------------------------------------------------------------------- 2. proxies
SYNC_OPS = ("aten::_local_scalar_dense",)
HOST_COPY_METHODS = ("tolist", "cpu")


@contextlib.contextmanager
def count_tensor_calls(names: tuple[str, ...]):
    """Count calls of ``torch.Tensor`` methods (Python-level wrappers, restored afterwards)."""
    import torch
    counts: collections.Counter = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in names}

    def wrap(name, fn):
        def counted(self, *args, **kwargs):
            counts[name] += 1
            return fn(self, *args, **kwargs)
        return counted
    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


@contextlib.contextmanager
def count_kernel_ops():
    """Count the aten operations dispatched other than views (``OpOverload.is_view``, and
    ``_unsafe_view``), as the Python dispatcher sees them: each once, whatever a device's kernel
    does inside (the CPU's ``torch.roll`` is a concatenation of two narrowed views, which the
    profiler lists as nine events; on a GPU it is one kernel). On a GPU nearly every one of them
    launches a kernel, and views launch none: the launches an eager step waits on the host for."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    counts = collections.Counter()

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view and func is not torch.ops.aten._unsafe_view.default:
                counts["ops"] += 1
            return func(*args, **(kwargs or {}))
    with Counting():
        yield counts


@dataclasses.dataclass
class HostSyncs:
    """What :func:`count_host_syncs` counted in its block: the profiler's events by name and the
    calls of the host-copy methods."""
    ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    calls: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    @property
    def items(self) -> int:
        """``.item()`` and its kind (:data:`SYNC_OPS`)."""
        return sum(self.ops[k] for k in SYNC_OPS)

    @property
    def host_copies(self) -> int:
        """Calls of the host-copy methods (:data:`HOST_COPY_METHODS`)."""
        return sum(self.calls.values())

    @property
    def syncs(self) -> int:
        """The host's waits on the device: ``.item()`` and its kind, and every host copy."""
        return self.items + self.host_copies

    @property
    def aten_ops(self) -> int:
        return sum(v for k, v in self.ops.items() if k.startswith("aten::"))


@contextlib.contextmanager
def count_host_syncs():
    """The block's host syncs and aten operations (:class:`HostSyncs`, filled when it ends), as
    the proxies count them: the CPU profiler's events, and the host-copy methods' calls."""
    from torch.profiler import ProfilerActivity, profile
    counted = HostSyncs()
    with count_tensor_calls(HOST_COPY_METHODS) as calls, profile(activities=[ProfilerActivity.CPU]) as prof:
        yield counted
    counted.ops.update(e.name for e in prof.events())
    counted.calls.update(calls)


def vision_tower_syncs(adapter, inputs: dict) -> int:
    """Host syncs of the vision tower alone on a prepared batch's images (family auto: the
    model's own ``get_image_features``, given the inputs its signature names)."""
    import inspect

    import torch

    tower = adapter.model.model.get_image_features
    names = inspect.signature(tower).parameters
    kwargs = {k: v for k, v in inputs.items() if k in names}
    with torch.no_grad(), count_host_syncs() as counted:
        tower(**kwargs)
    return counted.syncs


def proxy_worker(n: int, model_dir: str, batch: int, image_size: int, vision: str, family: str | None = None) -> dict:
    """Syncs and aten operations per row of the device step of one prepared batch (family auto:
    also those of its vision tower alone)."""
    import torch

    runner = _runner(model_dir, n, attention="capture", image_size=image_size, device="cpu", n_eval=batch,
                     vision=vision, family=family)
    rows = list(range(batch))
    if hasattr(runner, "prepare"):
        step_input = runner.prepare(rows)
    else:                                  # an older checkout: encoding happened inside score_batch
        encoded = runner.encode_rows(rows)
        runner.encode_rows = lambda _rows: encoded
        step_input = rows
    runner.score_batch(step_input)                                         # warm-up, plans cached
    with count_host_syncs() as counted:
        t0 = time.perf_counter()
        runner.score_batch(step_input)
        seconds = time.perf_counter() - t0
    with count_kernel_ops() as kernel_ops:       # (apart: a dispatch mode changes what the profiler lists)
        runner.score_batch(step_input)
    result = {"n": n, "batch": batch, "vision": vision, "syncs_per_row": counted.syncs / batch,
              "item_per_row": counted.items / batch, "tolist_cpu_per_row": counted.host_copies / batch,
              "aten_ops_per_row": counted.aten_ops / batch,
              "non_view_ops_per_row": kernel_ops["ops"] / batch,
              "step_s_per_row": seconds / batch, "threads": torch.get_num_threads()}
    if family == "auto":
        result["vision_syncs_per_row"] = vision_tower_syncs(runner.adapter, step_input.inputs) / batch
    return result


def proxy_table(rows: list[dict]) -> str:
    lines = ["| model | N | batch | code | host syncs / row | of which item / tolist+cpu | aten ops / row | "
             "of them not views |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['preset']} | {r['n']} | {r['batch']} | {r['code']} | {r['syncs_per_row']:.1f} | "
                     f"{r['item_per_row']:.1f} / {r['tolist_cpu_per_row']:.1f} | {r['aten_ops_per_row']:.0f} | "
                     f"{r['non_view_ops_per_row']:.0f} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ 3. GPU
def architecture(arch: str, small: bool) -> dict:
    """The published configs' sizes (Qwen2.5-VL-3B-Instruct, InternVL3-8B-hf); ``small`` shrinks depth and
    width (mechanics only). Vocabulary: the real size, so the LM head costs what it really costs."""
    if arch == "qwen2_5_vl_3b":
        return dict(vocab=151936, hidden=256 if small else 2048, intermediate=512 if small else 11008,
                    layers=2 if small else 36, heads=2 if small else 16, kv_heads=2, vision_depth=4 if small else 32,
                    vision_hidden=128 if small else 1280, vision_intermediate=256 if small else 3420,
                    vision_heads=16, full_attention=[1, 3] if small else [7, 15, 23, 31])
    if arch == "internvl3_8b":
        return dict(vocab=151674, hidden=224 if small else 3584, intermediate=512 if small else 18944,
                    layers=2 if small else 28, heads=28, kv_heads=4, vision_depth=2 if small else 24,
                    vision_hidden=128 if small else 1024, vision_intermediate=256 if small else 4096,
                    vision_heads=16, tile=448)
    raise ValueError(f"unknown --arch {arch!r}")


def architecture_dtype(device: str) -> str:
    """The dtype the random architectures are built in: bfloat16 on a GPU (as served), float32 on the CPU."""
    return "bfloat16" if device.startswith("cuda") else "float32"


def build_architecture(arch: str, out_dir: str, *, small: bool, device: str) -> str:
    """Save a random-weight model of ``arch`` with the offline tokenizer and the family's processor."""
    import torch
    from transformers import (InternVLConfig, InternVLForConditionalGeneration, Qwen2_5_VLConfig,
                              Qwen2_5_VLForConditionalGeneration)

    from ladbench.models import tiny
    a = architecture(arch, small)
    dtype = getattr(torch, architecture_dtype(device))
    tok = tiny.internvl_tokenizer() if arch == "internvl3_8b" else tiny.build_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in tiny.QWEN_SPECIAL_TOKENS + tiny.INTERNVL_SPECIAL_TOKENS}
    special = dict(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    text = dict(vocab_size=a["vocab"], hidden_size=a["hidden"], intermediate_size=a["intermediate"],
                num_hidden_layers=a["layers"], num_attention_heads=a["heads"], num_key_value_heads=a["kv_heads"],
                max_position_embeddings=128000, rope_theta=1e6, rms_norm_eps=1e-6, **special)
    if arch == "qwen2_5_vl_3b":
        cfg = Qwen2_5_VLConfig(
            text_config=dict(text, tie_word_embeddings=True, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}),
            vision_config=dict(depth=a["vision_depth"], hidden_size=a["vision_hidden"],
                               intermediate_size=a["vision_intermediate"], num_heads=a["vision_heads"],
                               out_hidden_size=a["hidden"], patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                               window_size=112, fullatt_block_indexes=a["full_attention"], hidden_act="silu",
                               tokens_per_second=2),
            image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
            tie_word_embeddings=True, **special)
        model_class, processor = Qwen2_5_VLForConditionalGeneration, tiny.qwen_processor(tok, 12845056)
    else:
        tokens_per_tile = (a["tile"] // 14) ** 2 // 4
        cfg = InternVLConfig(
            vision_config=dict(hidden_size=a["vision_hidden"], num_hidden_layers=a["vision_depth"],
                               num_attention_heads=a["vision_heads"], intermediate_size=a["vision_intermediate"],
                               image_size=a["tile"], patch_size=14, norm_type="layer_norm", use_qk_norm=False,
                               use_mean_pooling=True),
            text_config=dict(model_type="qwen2", **text), image_token_id=ids["<IMG_CONTEXT>"],
            image_seq_length=tokens_per_tile, downsample_ratio=0.5, projector_hidden_act="gelu",
            vision_feature_layer=-1, vision_feature_select_strategy="default", tie_word_embeddings=False,
            eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
        model_class, processor = InternVLForConditionalGeneration, tiny.internvl_processor(tok, a["tile"], tokens_per_tile)
    torch.manual_seed(0)
    with torch.device(device):
        model = model_class._from_config(cfg, torch_dtype=dtype)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir


def arch_model(arch: str, args: argparse.Namespace) -> str:
    """The random model of ``arch`` at ``--arch-scale`` for ``--device``: built into a new temporary
    folder, or with ``--arch-dir`` built there once and reused by later runs (a GPU session's
    parts share one build instead of paying for three)."""
    small = args.arch_scale == "small"
    if not args.arch_dir:
        return build_architecture(arch, os.path.join(scratch_folder(), arch), small=small, device=args.device)
    from ladbench.atomic import atomic_path
    folder = os.path.join(args.arch_dir, f"{args.arch_scale}-{architecture_dtype(args.device)}", arch)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        with atomic_path(folder, folder=True) as tmp:               # a build killed halfway is not reused
            build_architecture(arch, str(tmp), small=small, device=args.device)
    return folder


class JsonCheckpoint:
    """``--json``: the raw results rewritten whole (atomically) each time it is called, so that a
    run stopped by its time limit leaves what it had measured (a lent GPU's minutes are few)."""

    def __init__(self, path: str | None, raw: dict) -> None:
        self.path, self.raw = path, raw

    def __call__(self) -> None:
        if self.path:
            from ladbench.atomic import atomic_write_json
            atomic_write_json(self.path, self.raw, indent=1)


class UtilisationSampler:
    """GPU utilisation (%) from ``nvidia-smi`` sampled every 250 ms, each sample with its time
    (``time.monotonic``); no samples without nvidia-smi (the means are then NaN)."""

    def __enter__(self):
        self.samples: list[tuple[float, float]] = []
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                          "-lms", "250"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except FileNotFoundError:
            self.proc = None
            return self
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.samples.append((time.monotonic(), float(line.split(",")[0])))

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
            self.reader.join(timeout=5)

    @property
    def mean(self) -> float:
        return self.mean_between(-math.inf, math.inf)

    def mean_between(self, start: float, end: float) -> float:
        """The mean of the samples taken from ``start`` to ``end`` (NaN if none)."""
        inside = [value for at, value in self.samples if start <= at <= end]
        return statistics.fmean(inside) if inside else float("nan")


def bar_window(lines: list[tuple[float, str]], desc: str) -> tuple[float, float]:
    """When a run's batches began and ended: the times of the first and the last line of its
    progress bar (``desc``) on a stderr that is not a terminal, which writes one line as the bar
    opens, before the first batch is prepared, and one as it closes (``ladbench.progress``); NaN
    without two such lines."""
    times = [at for at, line in lines if line.startswith(desc)]
    return (times[0], times[-1]) if len(times) >= 2 else (math.nan, math.nan)


def steady_rows_per_s(seconds) -> float:
    """Rows/s over the second half of a run's rows (each row's ``seconds``: its batch's wall time
    over its rows, in the order they ran): the first batches pay the run's start-up (the loader's
    workers, first kernel calls), which a study's jobs of thousands of rows pay once."""
    import numpy as np

    from ladbench.inference.cache import throughput
    timed = seconds[np.isfinite(seconds)]
    return throughput(timed[len(timed) // 2:])["rows_per_s"]


#: the inference settings an ``infer`` run of :func:`infer_throughput` records: the stage's defaults
#: unless a comparison sets them
COMPARED_SETTINGS = ("score_ahead", "decide_on_host", "vision_tower", "cudnn_attention")


def compared_defaults() -> dict:
    """:data:`COMPARED_SETTINGS` at infer's defaults (``InferenceSettings``)."""
    from ladbench.inference.runner import InferenceSettings
    from ladbench.settings import setting_defaults
    defaults = setting_defaults(InferenceSettings)
    return {name: defaults[name] for name in COMPARED_SETTINGS}


def setting_flags(settings: dict) -> list[str]:
    """infer's flags for inference settings, as the workflow writes them (``--no-x`` for a switch
    set false)."""
    import shlex

    from ladbench.inference.runner import InferenceSettings
    from ladbench.settings import command_options
    from ladbench.workflow import flags
    return shlex.split(flags(**command_options(InferenceSettings, settings)))


def infer_throughput(model_dir: str, n: int, batch: int, rows: int, image_size: int, device: str,
                     workers: int | None = None, family: str | None = None, **compared) -> dict:
    """``ladbench infer`` end to end (its own process): rows/s from the cache and the mean GPU
    utilisation over the whole process (start and model load included) and over its batches
    alone (between its progress bar's first and last lines: the steady state). ``compared``: any
    of :data:`COMPARED_SETTINGS` other than infer's default, the way compared with the stage's
    (``score_ahead=False``: one batch at a time, the stage's way before 2026-11-27;
    ``decide_on_host=False``: transformers reads the padding and the image-token count back, its
    way up to 22e72ef; ``vision_tower="compiled"``: the tower's blocks under ``torch.compile``;
    ``cudnn_attention=False``: SDPA without cuDNN's attention); every one is recorded."""
    unknown = set(compared) - set(COMPARED_SETTINGS)
    if unknown:
        raise ValueError(f"infer_throughput compares {', '.join(COMPARED_SETTINGS)}, not {', '.join(sorted(unknown))}")
    import h5py
    folder = scratch_folder("infer_")
    bench_path, images_path = _demo_inputs(folder, n, n_eval=rows, n_images=4 * n)
    out = os.path.join(folder, "cache.h5")
    cmd = [sys.executable, "-m", "ladbench", "infer", "--benchmark", bench_path, "--images", images_path, "--out", out,
           "--model-name", "bench", "--family", family or _family(model_dir), "--model-path", model_dir, "--device", device,
           "--image-size", str(image_size), "--batch-size", str(batch), "--chunk-size", str(max(64, batch))]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    cmd += setting_flags(compared)
    with UtilisationSampler() as util:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines = [(time.monotonic(), line) for line in proc.stderr]
        proc.wait()
        wall = time.monotonic() - t0
    if proc.returncode:
        raise RuntimeError(f"ladbench infer failed:\n{''.join(line for _, line in lines)[-2000:]}")
    start, end = bar_window(lines, "infer bench/")
    with h5py.File(out, "r") as f:
        return {"n": n, "batch": batch, **compared_defaults(), **compared, "rows": int(f["done"][()].sum()),
                "rows_per_s": float(f.attrs["rows_per_s"]),
                "rows_per_s_steady": steady_rows_per_s(f["seconds"][()]),
                "wall_s": wall, "batches_wall_s": end - start, "gpu_util_mean": util.mean,
                "gpu_util_batches": util.mean_between(start, end), "batch_size_used": int(f.attrs["batch_size_used"]),
                "peak_cuda_mb": float(f.attrs["peak_cuda_mb"])}


def split_worker(n: int, model_dir: str, batch: int, image_size: int, device: str, reps: int,
                 trace: str | None = None) -> dict:
    """Per-row split of one batch: host preparation, vision tower, decoder with capture, the rest of
    scoring; with ``trace`` (a folder), one more device step under ``torch.profiler`` (trace_step)."""
    import torch
    runner = _runner(model_dir, n, attention="capture", image_size=image_size, device=device, n_eval=batch)
    adapter, rows = runner.adapter, list(range(batch))

    def timed(fn) -> float:
        fn()
        best = float("inf")
        for _ in range(reps):
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            best = min(best, time.perf_counter() - t0)
        return best / batch
    prepared = runner.prepare(rows)
    if device.startswith("cuda"):        # page-locked, as infer's DataLoader hands a GPU run its batches
        prepared = prepared.pin_memory()
    inputs = adapter.to_device(prepared.inputs, for_prefill=True)
    base = adapter.model.model
    with torch.no_grad():
        if "image_grid_thw" in inputs:
            vision = timed(lambda: base.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]))
        else:
            vision = timed(lambda: base.get_image_features(inputs["pixel_values"], vision_feature_layer=-1,
                                                          vision_feature_select_strategy="default"))
        prefill = timed(lambda: adapter.prefill(inputs, use_cache=False))
        step = timed(lambda: runner.score_batch(prepared))
    prepare = timed(lambda: runner.prepare(rows))
    result = {"n": n, "batch": batch, "prepare_ms": 1e3 * prepare, "vision_ms": 1e3 * vision,
              "decoder_ms": 1e3 * (prefill - vision), "capture_and_scoring_ms": 1e3 * (step - prefill),
              "device_step_ms": 1e3 * step}
    if trace:                                                     # the split is kept if the profiler fails
        result["failed"] = []
        result["trace"] = attempt(result["failed"], f"trace at N = {n}", trace_step, lambda: runner.score_batch(prepared),
                                  device, os.path.join(trace, f"{os.path.basename(model_dir)}-n{n}-b{batch}"))
    return result


def gpu_name() -> str | None:
    """The first GPU's name by ``nvidia-smi`` (None without it): the results say what measured
    them (``ladbench plan --rates`` prints it) without this process starting CUDA."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    names = out.stdout.strip().splitlines() if out.returncode == 0 else []
    return names[0].strip() if names else None


def trace_step(step, device: str, stem: str) -> dict:
    """One call of ``step`` (warm) under ``torch.profiler``: its Chrome trace (``<stem>.trace.json.gz``,
    open in https://ui.perfetto.dev) and its 40 operators of most self time on the device
    (``<stem>.ops.txt``); the file names, for the results."""
    import torch
    from torch.profiler import profile
    step()
    _sync(device)
    with torch.no_grad(), profile(activities=_profiled_activities(device), with_stack=False) as prof:
        step()
        _sync(device)
    return write_trace(prof, device, stem)


def _profiled_activities(device: str) -> list:
    from torch.profiler import ProfilerActivity
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])


def write_trace(prof, device: str, stem: str) -> dict:
    """A finished profile's Chrome trace and operator table (:func:`trace_step`'s files)."""
    import gzip
    import shutil

    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    prof.export_chrome_trace(f"{stem}.trace.json")
    with open(f"{stem}.trace.json", "rb") as raw, gzip.open(f"{stem}.trace.json.gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)
    os.remove(f"{stem}.trace.json")
    sort = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    with open(f"{stem}.ops.txt", "w") as table:
        table.write(prof.key_averages().table(sort_by=sort, row_limit=40) + "\n")
    return {"chrome_trace": f"{stem}.trace.json.gz", "operators": f"{stem}.ops.txt"}


# ------------------------------------------------------------------------ 5. generation
GENERATION_VARIANTS = ("cot", "sc")
#: what ``--generation`` measures after the decode loop's own first and second runs, by name (``--gen-measure``),
#: most wanted first (a part's time limit may stop it): what each is, as a failure names it
GENERATION_MEASUREMENTS = {
    "plain": "plain generate",                          # on the same rows: the ratio
    "graphs": "static shapes as CUDA graphs",           # the eager step's kernels, one launch a step; never yet on a GPU
    "attention": "attention on the KV heads",           # the other one-query attention, both runs
    "no_cudnn": "without cuDNN's attention",            # both runs
    "trace": "a decode step's profile",                 # with --trace only
    "group": "the prefill group's sequences in flight",
    "static": "static shapes",                          # compiled
    "wide": "every sequence in flight",
    "replies": "replies equal",
    "syncs": "host syncs per decode step",
    "chunks": "decode steps over chunks",
    "launches": "launches per ring step",
}


def reply_limit(value: str) -> int | str:
    """``--gen-max-new-tokens``: a number of tokens, or ``study`` (the variant's own limit)."""
    if value == "study":
        return value
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a number of tokens or 'study', not {value!r}")
    return int(value)


def _generation_runner(model_dir: str, prompt: str, args: argparse.Namespace):
    """A CoT or SC runner over ``--gen-rows`` rows (captions of three lengths) whose model's end-of-turn
    logit is scaled by ``--end-boost`` (random weights seldom end a reply: this makes lengths mixed)."""
    import torch

    from ladbench.variants import variant
    options = variant(prompt).options()
    limit = options.max_new_tokens if args.gen_max_new_tokens == "study" else args.gen_max_new_tokens
    options = dataclasses.replace(options, max_new_tokens=limit, **({"samples": args.gen_samples} if prompt == "sc" else {}))
    runner = _runner(model_dir, args.n[0], attention="capture", image_size=args.image_size, device=args.device,
                     n_eval=args.gen_rows, family=args.family, prompt=prompt, options=options,
                     batch_size=args.gen_batch, decode_slots=args.gen_slots)
    ad = runner.adapter
    with torch.no_grad():
        ad.model.get_output_embeddings().weight[ad.end_of_turn_id] *= args.end_boost
    return runner, [r for r in range(len(runner.plan))][:args.gen_rows]


def plain_groups(runner, prepared) -> list[dict]:
    """The groups of a prepared step's rows as the stage encoded them before the decode loop (and
    ``generate`` takes them): without what the loop's prefill reads on the host (made beforehand,
    as a worker makes the loop's, so that neither side's timing holds the processor's work)."""
    size = prepared.group_size
    groups = []
    for first in range(0, len(prepared.rows), size):
        texts, images = zip(*(runner._row_inputs(r) for r in prepared.rows[first:first + size]))
        groups.append(runner.adapter.encode_on_host(list(texts), list(images)))
    return groups


def plain_generate(runner, prepared, groups: list[dict]) -> tuple[list[int], int]:
    """``generate(num_return_sequences=S)`` on each group of a prepared step (``groups``:
    :func:`plain_groups`), as the stage did before the decode loop: the reply lengths and the token
    slots computed."""
    from ladbench.inference.sampling import KeyedSampler, sequence_keys
    import torch
    entry, options, ad = runner.s.variant, runner.s.options, runner.adapter
    samples = entry.samples_per_row(options)
    counts, slots, first = [], 0, 0
    for group in groups:
        inputs = ad.to_device(group)
        rows = torch.as_tensor(prepared.rows[first:first + inputs["input_ids"].shape[0]]) + runner.plan.first_row
        kwargs = dict(do_sample=False)
        if entry.sampled:
            sampler = KeyedSampler(sequence_keys(runner.s.seed, rows, samples), inputs["input_ids"].shape[1],
                                   options.temperature, options.top_k)
            kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=samples,
                          logits_processor=[sampler])
        _, n = ad.generate(inputs, max_new_tokens=options.max_new_tokens, **kwargs)
        counts += n.tolist()
        slots += len(n) * int(n.max())
        first += len(rows)
    return counts, slots


def generation_worker(model_dir: str, name: str, args: argparse.Namespace, results: list[dict],
                      save: Callable[[], None] = lambda: None) -> None:
    """Per variant, appended to ``results`` (``model``: ``name``): the decode loop (``ladbench
    infer``'s path), its first run over the rows and its second (on an H200 the first ran at 377
    tokens/s and the other attention, timed after it, at 484: kernels that build a plan per new
    shape pay it in a first run), then ``args.gen_measure``'s measurements in the order named
    (:data:`GENERATION_MEASUREMENTS`; by default plain ``generate`` on the same rows first, the
    issue's ratio, then static shapes as CUDA graphs of the eager step, ``--decode graphs``,
    captured in its warm-up run). Each timed run's prefills apart from its decode steps
    (:func:`decode_split`). Most wanted first, ``save()`` after each: a run its time limit stops
    keeps what it measured. A measurement that fails is listed in the variant's ``failed``
    (:func:`attempt`) and the others go on."""
    for prompt in args.gen_variants:
        r: dict = {"variant": prompt, "model": name, "failed": []}
        results.append(r)
        if attempt(r["failed"], f"generation {prompt}", _generation_variant, r, model_dir, args, save) is None:
            save()
        print(f"generation {prompt}: {r}", file=sys.stderr)


def _generation_variant(r: dict, model_dir: str, args: argparse.Namespace, save: Callable[[], None]) -> dict:
    """:func:`generation_worker`'s measurements of one variant into ``r`` (returned): the decode
    loop's first and second runs, then ``args.gen_measure``'s measurements in the order named."""
    runner, rows = _generation_runner(model_dir, r["variant"], args)
    prepared = runner.prepare(rows)
    r.update({"rows": len(rows), "n": args.n[0], "samples": runner.samples, "batch": args.gen_batch,
              "device": args.device, "max_new_tokens": runner.s.options.max_new_tokens, "end_boost": args.end_boost})
    ours, (ours_s, second_s), (stats, second) = _first_and_second_run(runner, prepared, rows, args.device,
                                                                      decode="slots")
    tokens = int(ours["n_generated"].sum())
    r.update({
        "slots": stats.slots, "useful_tokens": tokens,
        "ours_token_slots": stats.token_slots, "ours_useful_fraction": stats.useful_fraction(),
        "ours_occupancy": stats.occupancy(), "ours_prefilled_rows_per_row": stats.prefilled_rows / len(rows),
        "ours_prefilled_tokens": stats.prefilled_tokens, "decode_steps": stats.decode_steps,
        "ours_kv_copies_per_token": stats.kv_copies_per_token(), **kv_reads("ours", stats),
        # the cache columns of the widest decode step, beside the longest prompt and reply: a
        # stream's cache is as wide as its longest sequence in flight, not wider by a column a step
        "ours_widest_cache": stats.widest_cache, "longest_prompt": longest_prompt(prepared),
        "ours_s": ours_s, "ours_tokens_per_s": tokens / ours_s, "ours_rows_per_s": len(rows) / ours_s,
        "ours_second_run_s": second_s, "ours_second_run_tokens_per_s": tokens / second_s,
        **decode_split("ours", ours_s, stats, len(rows)), **decode_split("ours_second_run", second_s, second, len(rows)),
        "strided_kv_read_error": strided_read_error(runner)})
    save()
    replies = {"same_replies": ours["text"]}                # the loop's and the static shapes' replies

    def plain() -> dict:
        groups = plain_groups(runner, prepared)
        t0 = time.perf_counter()
        counts, slots = plain_generate(runner, prepared, groups)
        _sync(args.device)
        seconds = time.perf_counter() - t0
        return {"reply_lengths": sorted(set(counts)), "plain_token_slots": slots, "plain_useful_fraction": sum(counts) / slots,
                "plain_prefilled_rows_per_row": r["samples"], "plain_s": seconds,
                "plain_tokens_per_s": sum(counts) / seconds, "plain_rows_per_s": len(rows) / seconds}

    def ring(way: str) -> dict:
        out, counts = ring_counts(runner, prepared, rows, tokens, args.device, way)
        replies[f"{way}_same_replies"] = out["text"]
        return counts

    def replies_equal() -> dict:
        with _settings(runner, decode="generate"):
            reference = runner.generate_batch(prepared)["text"]               # each sample its own row
        return {key: bool((texts == reference).all()) for key, texts in replies.items()}
    trace = os.path.join(args.trace, f"{r['model']}-{r['variant']}-decode-step") if args.trace else None
    measurements: dict[str, Callable[[], dict]] = {
        "plain": plain,
        "graphs": lambda: ring("graphs"),
        "attention": lambda: attention_counts(runner, prepared, rows, ours, (ours_s, second_s), args.device),
        "no_cudnn": lambda: without_cudnn_counts(runner, prepared, rows, ours, args.device),
        "trace": lambda: decode_step_trace(runner, prepared, args.device, trace),
        "group": lambda: group_counts(runner, prepared, rows, stats, ours, args.device),
        "static": lambda: ring("static"),
        "wide": lambda: wide_counts(runner, prepared, rows, stats, ours, args.device),
        "replies": replies_equal,
        "syncs": lambda: decode_step_syncs(runner, prepared),
        "chunks": lambda: chunk_counts(runner, rows, args.gen_chunk, args.device),
        "launches": lambda: ring_step_launches(runner, prepared),
    }
    assert measurements.keys() == GENERATION_MEASUREMENTS.keys()
    for name in args.gen_measure:
        if name == "trace" and trace is None:
            continue                                       # (a profile only where --trace names its folder)
        r.update(attempt(r["failed"], GENERATION_MEASUREMENTS[name], measurements[name]) or {})
        save()
    return r


def strided_read_error(runner) -> float | None:
    """What the slab of the runner's last decode loop found on this device for this model's KV
    shape (``Slab.view_read_error``): the largest relative difference between SDPA on strided views
    of its buffers and on contiguous copies (0 where the kernel reads them alike; above the
    tolerance the loop copies them); None where no slab ran (the padded path)."""
    from ladbench.inference.decode import Slab
    store = runner.decoder.store if runner.decoder is not None else None
    return store.view_read_error if isinstance(store, Slab) else None


def kv_reads(name: str, stats) -> dict:
    """The KV cache positions a run's decode steps read per reply token, and the share of them its
    sequences hold (``name_...``): with the weights, what a GPU's decode step reads from memory
    (x the bytes of a position: 36 KB for Qwen2.5-VL-3B in bfloat16). An older checkout (--baseline-src,
    PYTHONPATH) before 2026-11-28 did not count them: none."""
    if not hasattr(stats, "kv_reads_per_token"):
        return {}
    return {f"{name}_kv_reads_per_token": stats.kv_reads_per_token(), f"{name}_kv_reads_held": stats.kv_reads_held()}


def longest_prompt(prepared) -> int:
    """The most prompt tokens of a row (padding not counted) among the groups of a prepared step."""
    return max(int(group["attention_mask"].sum(1).max()) for group in prepared.groups)


def attempt(failed: list[dict], what: str, measure: Callable[..., T], *args, **kwargs) -> T | None:
    """``measure(*args, **kwargs)``; if it raises, None, with ``what`` and the error's last line
    added to ``failed`` and its traceback printed. A lent GPU runs one call: a measurement that
    fails there (a compilation, the profiler, a worker) must not take the ones after it along."""
    try:
        return measure(*args, **kwargs)
    except Exception as exc:                            # noqa: BLE001 (every failure is recorded, none hidden)
        traceback.print_exc()
        lines = str(exc).strip().splitlines()
        failed.append({"what": what, "error": f"{type(exc).__name__}: {lines[-1] if lines else ''}".strip()})
        print(f"{what}: failed ({failed[-1]['error']}); going on", file=sys.stderr)
        return None


def through_each_decode_step(runner, prepared, around: Callable) -> None:
    """One (untimed) run of the loop over ``prepared`` whose every decode step is made by
    ``around(step, decoder, flight, replies)``, ``step`` the loop's own (restored after)."""
    from unittest import mock

    from ladbench.inference.decode import SlotDecoder
    step = SlotDecoder.step
    with mock.patch.object(SlotDecoder, "step", lambda decoder, flight, replies: around(step, decoder, flight, replies)):
        runner.generate_batch(prepared)


def decode_step_syncs(runner, prepared) -> dict:
    """Host syncs per decode step of one (untimed) run of the loop over ``prepared``: the most and
    the mean; per prefill, the first's (where a tower plans its image grids, once) and the most of
    any later one (counted as for a step: on the CPU a read of a host tensor counts too, so an
    upper bound: the tower's ``tolist`` of the grids it keeps on the host is one); and the mean,
    over the steps that ran the model, of its aten operations (as the proxies count them, the
    profiler's events: on a GPU each one launches a kernel or more, or costs the host its
    dispatch, where an eager step waits on the host's launches) and of its operations other than
    views (:func:`count_kernel_ops`: each once, as a GPU would launch it)."""
    from unittest import mock

    from ladbench.inference.decode import SlotDecoder
    per_step, ops_per_step, kernel_ops_per_step, per_prefill = [], [], [], []
    prefill = SlotDecoder.prefill

    def prefill_syncs(decoder, inputs, first_row):
        with count_host_syncs() as counted:
            out = prefill(decoder, inputs, first_row)
        per_prefill.append(counted.syncs)
        return out

    def profiled(step, decoder, flight, replies):
        with count_host_syncs() as counted:
            out = step(decoder, flight, replies)
        per_step.append(counted.syncs)
        if out is not None:                             # (a step after which nothing is in flight runs no model)
            ops_per_step.append(counted.aten_ops)
        return out

    def dispatched(step, decoder, flight, replies):
        with count_kernel_ops() as kernel_ops:
            out = step(decoder, flight, replies)
        if out is not None:
            kernel_ops_per_step.append(kernel_ops["ops"])
        return out
    # two runs: a dispatch mode under the profiler would change what the profiler lists
    with mock.patch.object(SlotDecoder, "prefill", prefill_syncs):
        through_each_decode_step(runner, prepared, profiled)
    through_each_decode_step(runner, prepared, dispatched)
    return {"syncs_first_prefill": per_prefill[0], "syncs_per_later_prefill_max": max(per_prefill[1:], default=None),
            "syncs_per_step_max": max(per_step), "syncs_per_step_mean": sum(per_step) / len(per_step),
            "aten_ops_per_step": statistics.fmean(ops_per_step),
            "non_view_ops_per_step": statistics.fmean(kernel_ops_per_step),
            "decoder_layers": runner.adapter.text_config.num_hidden_layers}


def ring_step_launches(runner, prepared) -> dict:
    """What CUDA graphs take out of a decode step's launches, counted: the mean operations other
    than views (:func:`count_kernel_ops`) a step of the static shapes' ring dispatches, eager
    (``--decode static`` as the CPU runs it) and as graphs (``--decode graphs``: those outside the
    record, the copies of its inputs, and the replay, one launch), over the steps that ran the
    model (as graphs: those that replayed). Two untimed runs; the record here replays the step
    unseen by the count (on a GPU a replay is one launch of all its kernels), so the counts are
    the same on any machine, and the replies stay the eager step's."""
    from unittest import mock

    from torch.utils._python_dispatch import _disable_current_modes

    from ladbench.inference import decode, graphs
    per_step: dict[str, list[int]] = {"static": [], "graphs": []}
    step_counts: list[collections.Counter] = []           # the step being counted, and whether it replayed

    def unseen_replays(step, inputs):
        first = step(*inputs)
        output = first.clone()

        def replay():
            with _disable_current_modes():
                output.copy_(step(*inputs))
            step_counts[-1]["ops"] += 1
            step_counts[-1]["replays"] += 1
        return first, replay, output

    def counted(ring, replies):
        before = ring.decoder.stats.decode_steps
        with count_kernel_ops() as counts:
            step_counts.append(counts)
            ring_step(ring, replies)
        if ring.decoder.stats.decode_steps > before and (way == "static" or counts["replays"]):
            per_step[way].append(counts["ops"])
    ring_step = decode.Ring.step
    with mock.patch.object(decode.Ring, "step", counted), \
            mock.patch.object(graphs, "capture_on", lambda _device: unseen_replays):
        for way in per_step:
            runner.ring = None                            # (not a ring of an earlier run, its real graph with it)
            with _settings(runner, decode=way):
                runner.generate_batch(prepared)
    return {"ring_ops_per_step": statistics.fmean(per_step["static"]),
            "graphs_ops_per_step": statistics.fmean(per_step["graphs"])}


def chunk_counts(runner, rows: list[int], chunk: int, device: str) -> dict:
    """Decode steps and batch occupancy of the rows in chunks of ``chunk`` rows (the cache's
    chunks), decoded one chunk at a time (each chunk's batch drains before the next starts: the
    stage before) and streamed through one loop (``generate_chunks``: the stage now), with the
    same replies, and the seconds of each (on a GPU the ratio that matters; on the CPU a step's
    cost grows with its sequences, so there the decode steps are the figure that carries to a
    GPU, whose step costs about the same at any occupancy while the weights' reads dominate it)."""
    from ladbench.inference.decode import DecodeStats
    prepared = [runner.prepare(rows[i:i + chunk]) for i in range(0, len(rows), chunk)]
    out = {"chunk_rows": chunk, "chunks": len(prepared)}
    texts = {}
    for name, decode_all in (("alone", lambda: [runner.generate_batch(p) for p in prepared]),
                             ("streamed", lambda: [part for _, part in runner.generate_chunks(iter(prepared))])):
        runner.decode_stats = DecodeStats()
        _sync(device)
        t0 = time.perf_counter()
        parts = decode_all()
        _sync(device)
        texts[name] = sorted(map(repr, (t for part in parts for t in part["text"].tolist())))
        out.update({f"{name}_decode_steps": runner.decode_stats.decode_steps, f"{name}_s": time.perf_counter() - t0,
                    f"{name}_occupancy": runner.decode_stats.occupancy()})
    out["streamed_same_replies"] = texts["alone"] == texts["streamed"]
    return out


def group_counts(runner, prepared, rows: list[int], stats, ours: dict, device: str) -> dict:
    """Where the loop keeps more sequences in flight than a prefill group holds (``decode_slots``,
    by default at least 64 on a GPU): the same rows with only the group's batch_size x S in flight
    (the stage until 2026-11-27). Empty where they are the same number."""
    group = runner.samples * runner.s.batch_size
    return {} if stats.slots == group else in_flight_counts(runner, prepared, rows, ours, device, "group", group)


def wide_counts(runner, prepared, rows: list[int], stats, ours: dict, device: str) -> dict:
    """Where the rows have more sequences than the loop keeps in flight: every one of them in flight
    at once. Whether a decode step costs the same with more sequences (a step bound by the host's
    launches, not the GPU's work) says whether a wider default pays. Empty where they fit."""
    every = len(rows) * runner.samples
    return {} if every <= stats.slots else in_flight_counts(runner, prepared, rows, ours, device, "wide", every)


def in_flight_counts(runner, prepared, rows: list[int], ours: dict, device: str, name: str, slots: int) -> dict:
    """The same rows with ``slots`` sequences in flight (``name_...``): seconds, decode steps,
    tokens/s, the seconds apart (:func:`decode_split`) and whether the replies equal the loop's."""
    out, seconds, counts = _timed_decode(runner, prepared, rows, device, decode="slots", decode_slots=slots)
    return {f"{name}_slots": slots, f"{name}_s": seconds, f"{name}_decode_steps": counts.decode_steps,
            f"{name}_tokens_per_s": int(out["n_generated"].sum()) / seconds,
            f"{name}_same_replies": bool((out["text"] == ours["text"]).all()),
            **decode_split(name, seconds, counts, len(rows))}


def ring_counts(runner, prepared, rows: list[int], tokens: int, device: str, way: str) -> tuple[dict, dict]:
    """The loop with static shapes, ``way`` ``static`` (compiled, in its warm-up run) or ``graphs``
    (the eager step captured as a CUDA graph per ring shape, in its warm-up run too): its results
    (the replies, for the comparison that follows), and its token slots, ring, seconds, KV copies
    (``way_...``); for static, how many compiled graphs torch ran without their CUDA graph
    (``cudagraph_skips``: torch logs a reason and runs the graph's kernels one by one, the launches
    CUDA graphs would save; on the CPU there are none to skip); for graphs, whether the ring's step
    ran as a replayed graph at the end (false on the CPU, which runs it eagerly), why its capture
    failed where it did (the step then eager), and the captures in the timed run (a ring grown
    past the warm-up's captures its new shape)."""
    from torch._dynamo.utils import counters

    from ladbench.inference.graphs import GraphedStep
    skipped = counters["inductor"]["cudagraph_skips"]
    out, seconds, stats = _timed_decode(runner, prepared, rows, device, decode=way)
    step = getattr(runner.ring, "forward", None)
    own = ({"static_cudagraph_skips": counters["inductor"]["cudagraph_skips"] - skipped} if way == "static" else
           {"graphs_captures": stats.graph_captures, "graphs_capture_failed": getattr(step, "failed", None),
            "graphs_replayed": isinstance(step, GraphedStep) and step.failed is None and step.replay is not None})
    return out, {**own, f"{way}_useful_fraction": stats.useful_fraction(), f"{way}_ring_columns": stats.ring_columns,
                 f"{way}_s": seconds, f"{way}_kv_copies_per_token": stats.kv_copies_per_token(), **kv_reads(way, stats),
                 f"{way}_tokens_per_s": tokens / seconds, f"{way}_rows_per_s": len(rows) / seconds,
                 f"{way}_decode_steps": stats.decode_steps, **decode_split(way, seconds, stats, len(rows))}


@contextlib.contextmanager
def _settings(runner, **settings):
    """The runner's inference ``settings`` set for the block, restored after it (also on failure)."""
    before = {name: getattr(runner.s, name) for name in settings}
    for name, value in settings.items():
        setattr(runner.s, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(runner.s, name, value)


def attention_counts(runner, prepared, rows: list[int], ours: dict, ours_s: tuple[float, float],
                     device: str) -> dict:
    """The loop with the other attention for one query position than the device's own
    (``models.attention.packs_on``: on a GPU the query heads packed on their KV heads, on the CPU
    transformers' ``repeat_kv``, which copies the KV cache once per query head of a group in every
    layer of every decode step): tokens/s of each in its first run over the rows and in its second
    (``ours_s``: the loop's own two seconds; a first run meets shapes new to the kernels, which some
    build plans for), and whether their replies are equal (on the CPU they may not be: the packed
    query changes float32 results in the last place)."""
    from unittest import mock

    import torch

    from ladbench.models import attention
    packed_here = attention.packs_on(torch.device(device))
    with mock.patch.object(attention, "packs_on", lambda _device: not packed_here):
        out, seconds, _ = _first_and_second_run(runner, prepared, rows, device, decode="slots")
    tokens = int(ours["n_generated"].sum())
    rates = {packed_here: [tokens / t for t in ours_s], not packed_here: [tokens / t for t in seconds]}
    return {"packed_tokens_per_s": rates[True][0], "repeat_kv_tokens_per_s": rates[False][0],
            "packed_second_run_tokens_per_s": rates[True][1], "repeat_kv_second_run_tokens_per_s": rates[False][1],
            "attentions_same_replies": bool((out["text"] == ours["text"]).all())}


def without_cudnn_counts(runner, prepared, rows: list[int], ours: dict, device: str) -> dict:
    """The loop with cuDNN's attention left out of SDPA's choice (``inference.cudnn_attention:
    false``): tokens/s in its first run over the rows and in its second, and whether its replies
    equal the loop's. cuDNN builds a graph per new shape, and every decode step brings a new KV
    length: a first run pays that, a second (the same lengths again) does not. On the CPU, which
    has no cuDNN attention, the mechanics only."""
    tokens = int(ours["n_generated"].sum())
    out, (first, second), _ = _first_and_second_run(runner, prepared, rows, device, decode="slots",
                                                    cudnn_attention=False)
    return {"no_cudnn_tokens_per_s": tokens / first, "no_cudnn_second_run_tokens_per_s": tokens / second,
            "no_cudnn_same_replies": bool((out["text"] == ours["text"]).all())}


def decode_step_trace(runner, prepared, device: str, stem: str) -> dict:
    """One decode step of a run of the loop over ``prepared`` under ``torch.profiler``: the 8th (its
    sequences in flight by then), or the middle one of the longest reply if shorter;
    :func:`trace_step`'s files, under ``decode_step_trace``."""
    import torch
    from torch.profiler import profile
    calls, files = [0], {}
    at = max(1, min(8, runner.s.options.max_new_tokens // 2))

    def traced(step, decoder, flight, replies):
        calls[0] += 1
        if calls[0] != at:
            return step(decoder, flight, replies)
        _sync(device)
        with torch.no_grad(), profile(activities=_profiled_activities(device), with_stack=False) as prof:
            out = step(decoder, flight, replies)
            _sync(device)
        files.update(write_trace(prof, device, stem))
        return out
    through_each_decode_step(runner, prepared, traced)
    return {"decode_step_trace": files or None}


def _timed_decode(runner, prepared, rows: list[int], device: str, warm_up: bool = True, **settings):
    """``runner.generate_batch`` with these inference ``settings`` (e.g. ``decode="static"``), after a
    warm-up on two rows unless ``warm_up`` is false: its results, its seconds and its decode
    counts; the settings restored."""
    with _settings(runner, **settings):
        if warm_up:
            runner.generate_batch(runner.prepare(rows[:2]))
        runner.decode_stats = type(runner.decode_stats)()
        _sync(device)
        t0 = time.perf_counter()
        out = runner.generate_batch(prepared)
        _sync(device)
        return out, time.perf_counter() - t0, dataclasses.replace(runner.decode_stats)


def _first_and_second_run(runner, prepared, rows: list[int], device: str, **settings):
    """:func:`_timed_decode` twice with these ``settings``: the loop's first run over the rows
    (after the warm-up, whose shapes are not the rows') and its second, which meets every shape
    again. The first run's results, (first seconds, second seconds), (first counts, second counts)."""
    out, first, stats = _timed_decode(runner, prepared, rows, device, **settings)
    _, second, second_stats = _timed_decode(runner, prepared, rows, device, warm_up=False, **settings)
    return out, (first, second), (stats, second_stats)


def decode_split(name: str, seconds: float, stats, rows: int) -> dict:
    """A timed decode run's ``seconds`` apart (``name_...``): its prefills' (vision included) per row,
    and the rest per decode step (drawing, cutting, joining and the forward pass of one token per
    sequence in flight). The benchmark's replies are short (64 tokens on a GPU), a study's up to
    1,024: ``ladbench plan`` prices a job as its rows' prefills plus a step per token of each
    sequence in flight, not at the run's tokens/s, which the short replies' prefills weigh down."""
    decode = seconds - stats.prefill_seconds
    return {f"{name}_prefill_s": stats.prefill_seconds, f"{name}_prefill_s_per_row": stats.prefill_seconds / rows,
            f"{name}_decode_step_s": decode / max(stats.decode_steps, 1)}


#: the generation table's columns: header, and the cell of a variant's results
GENERATION_COLUMNS: tuple[tuple[str, Callable[[dict], str]], ...] = (
    ("variant", lambda r: r["variant"]),
    ("rows x samples", lambda r: f"{r['rows']} x {r['samples']}"),
    ("device", lambda r: r["device"]),
    ("longest reply (end boost)", lambda r: f"{r['max_new_tokens']} ({r['end_boost']:g})"),
    ("replies equal", lambda r: f"{r['same_replies']}"),
    ("useful / token slots: plain generate", lambda r: f"{r['plain_useful_fraction']:.2f}"),
    ("ours", lambda r: f"{r['ours_useful_fraction']:.2f}"),
    ("batch occupancy (ours)", lambda r: f"{r['ours_occupancy']:.2f}"),
    ("prefills per row: plain / ours",
     lambda r: f"{r['plain_prefilled_rows_per_row']} / {r['ours_prefilled_rows_per_row']:.0f}"),
    ("host syncs per decode step (max)", lambda r: f"{r['syncs_per_step_max']}"),
    ("host syncs per prefill: first / later (max)",
     lambda r: f"{r['syncs_first_prefill']} / {r['syncs_per_later_prefill_max']}"),
    ("tokens/s: plain / ours, its first run (second)",
     lambda r: f"{r['plain_tokens_per_s']:.1f} / {r['ours_tokens_per_s']:.1f} ({r['ours_second_run_tokens_per_s']:.1f})"),
    ("rows/s: plain / ours", lambda r: f"{r['plain_rows_per_s']:.2f} / {r['ours_rows_per_s']:.2f}"),
    ("ours, second run: prefill s / row, ms / decode step",
     lambda r: f"{r['ours_second_run_prefill_s_per_row']:.3f}, {1e3 * r['ours_second_run_decode_step_s']:.1f}"),
    ("static shapes: replies equal, useful / token slots, tokens/s, ms / decode step, CUDA graphs skipped",
     lambda r: f"{r['static_same_replies']}, {r['static_useful_fraction']:.2f}, {r['static_tokens_per_s']:.1f}, "
               f"{1e3 * r['static_decode_step_s']:.1f}, {r['static_cudagraph_skips']}"),
    ("static shapes as CUDA graphs: replies equal, tokens/s, ms / decode step, replayed (captures)",
     lambda r: f"{r['graphs_same_replies']}, {r['graphs_tokens_per_s']:.1f}, {1e3 * r['graphs_decode_step_s']:.1f}, "
               f"{r['graphs_replayed']} ({r['graphs_captures']})"),
    ("operations launched per ring step: eager / as CUDA graphs",
     lambda r: f"{r['ring_ops_per_step']:.0f} / {r['graphs_ops_per_step']:.0f}"),
    ("decode steps over chunks: one at a time / streamed (occupancy)",
     lambda r: f"{r['chunks']} x {r['chunk_rows']} rows: {r['alone_decode_steps']} ({r['alone_occupancy']:.2f}) / "
               f"{r['streamed_decode_steps']} ({r['streamed_occupancy']:.2f}), replies equal: "
               f"{r['streamed_same_replies']}"),
    ("sequences in flight: batch x S / ours, decode steps, tokens/s", lambda r: _in_flight(r)),
    ("every sequence in flight: how many, ms / decode step (ours, second run), tokens/s (replies equal)",
     lambda r: f"{r['wide_slots']}, {1e3 * r['wide_decode_step_s']:.1f} ({1e3 * r['ours_second_run_decode_step_s']:.1f}), "
               f"{r['wide_tokens_per_s']:.1f} ({r['wide_same_replies']})"),
    ("one-query attention, tokens/s: repeat_kv / packed on the KV heads, first run; second (replies equal)",
     lambda r: f"{r['repeat_kv_tokens_per_s']:.1f} / {r['packed_tokens_per_s']:.1f}; "
               f"{r['repeat_kv_second_run_tokens_per_s']:.1f} / {r['packed_second_run_tokens_per_s']:.1f} "
               f"({r['attentions_same_replies']})"),
    ("without cuDNN's attention, tokens/s: first run; second (replies equal)",
     lambda r: f"{r['no_cudnn_tokens_per_s']:.1f}; {r['no_cudnn_second_run_tokens_per_s']:.1f} "
               f"({r['no_cudnn_same_replies']})"),
    ("KV positions copied per token: ours / static",
     lambda r: f"{r['ours_kv_copies_per_token']:.0f} / {r['static_kv_copies_per_token']:.0f}"),
    # (the ring's reads are the same compiled or as CUDA graphs; the study parts run the graphs only)
    ("KV positions read per token (share held): ours / static shapes as CUDA graphs",
     lambda r: f"{r['ours_kv_reads_per_token']:.0f} ({r['ours_kv_reads_held']:.2f}) / "
               f"{r['graphs_kv_reads_per_token']:.0f} ({r['graphs_kv_reads_held']:.2f})"),
    ("widest cache (columns) / longest prompt + reply (ours)",
     lambda r: f"{r['ours_widest_cache']} / {r['longest_prompt'] + max(r['reply_lengths'])}"),
)


def generation_table(rows: list[dict]) -> str:
    """One row per variant; a cell whose measurement is missing (failed, or not reached) is "-",
    and each failure is listed below the table."""
    lines = ["| " + " | ".join(header for header, _ in GENERATION_COLUMNS) + " |", "|---" * len(GENERATION_COLUMNS) + "|"]
    lines += ["| " + " | ".join(_cell(render, r) for _, render in GENERATION_COLUMNS) + " |" for r in rows]
    return "\n".join(lines + failure_lines({r["variant"]: r.get("failed", []) for r in rows}))


def _cell(render: Callable[[dict], str], r: dict) -> str:
    try:
        return render(r)
    except KeyError:
        return "-"


def failure_lines(failed: dict[str, list[dict]]) -> list[str]:
    """What :func:`attempt` recorded (by variant or architecture), a line each after an empty one,
    for below a table; none if nothing failed."""
    lines = [f"- failed ({label}): {f['what']}: {f['error']}" for label, fs in failed.items() for f in fs]
    return [""] + lines if lines else []


def _in_flight(r: dict) -> str:
    slots = r.get("slots", r["batch"] * r["samples"])     # an older run: the prefill group's
    if slots == r["batch"] * r["samples"]:
        return f"{slots} (the prefill group's)"
    return (f"{r['group_slots']} / {r['slots']}: {r['group_decode_steps']} / {r['decode_steps']} steps, "
            f"{r['group_tokens_per_s']:.1f} / {r['ours_tokens_per_s']:.1f}, replies equal: {r['group_same_replies']}")


# ------------------------------------------------------------------------------ driver
def _run_worker(kind: str, n: int, args: argparse.Namespace, *, model_dir: str, src: str | None = None,
                extra: tuple[str, ...] = ()) -> list[dict]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--n", str(n), "--model-dir", model_dir,
           "--reps", str(args.reps), "--image-size", str(args.image_size), "--device", args.device,
           "--threads", str(args.threads), *extra]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"worker {kind} N={n} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result if isinstance(result, list) else [result]


def markdown_table(timing: list[dict]) -> str:
    t = {(r["method"], r["n"]): r for r in timing}
    ns = sorted({r["n"] for r in timing})
    lines = ["| N | tokens | bare SDPA s | ours s/row | capture overhead | today s/row | ours / today (CPU time) | "
             f"reference s/pass | reference s/row (x{REFERENCE_PASSES_PER_ROW} methods) | speed-up per row |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    nan_s = float("nan")
    nan = {"min_s": nan_s}
    for n in ns:
        bare, ours, ref, today = (t.get((m, n), nan) for m in ("bare", "ours", "reference", "today"))
        if ours is nan:
            continue
        lines.append(
            f"| {n} | {ours['seq_len']} | {bare['min_s']:.3f} | {ours['min_s']:.3f} | "
            f"{ours['min_s'] / bare['min_s'] - 1:+.1%} | {today['min_s']:.3f} | "
            f"{ours['min_s'] / today['min_s']:.2f} ({ours.get('cpu_min_s', nan_s) / today.get('cpu_min_s', nan_s):.2f}) | "
            f"{ref['min_s']:.3f} | {ref['min_s'] * REFERENCE_PASSES_PER_ROW:.3f} | "
            f"{ref['min_s'] * REFERENCE_PASSES_PER_ROW / ours['min_s']:.2f}x |")
    for n in ns:
        if ("ours", n) in t and ("ours_no_greedy", n) in t:
            lines.append(f"\nN = {n}: the greedy reply (vanilla_generate) costs ours / ours_no_greedy = "
                         f"{t[('ours', n)]['min_s'] / t[('ours_no_greedy', n)]['min_s']:.3f}x per row")
    lines.append("\nTimes are the minimum over the repetitions (s per row, batch size 1).")
    return "\n".join(lines)


def cpu_timing(args: argparse.Namespace, model_dir: str) -> list[dict]:
    timing = []
    for n in args.n:
        rows = _run_worker("time", n, args, model_dir=model_dir, extra=("--methods", *args.methods))
        if args.baseline_src:                # paired: ours and today in alternating processes, minimum of each
            for _ in range(args.pairs):
                rows += _run_worker("time", n, args, model_dir=model_dir, extra=("--methods", "ours"))
                rows += [dict(r, method="today") for r in _run_worker("time", n, args, model_dir=model_dir,
                                                                       src=args.baseline_src,
                                                                       extra=("--methods", "today"))]
        best: dict[str, dict] = {}
        for r in rows:                       # minimum over every process of a method, wall and CPU time apart
            b = best.setdefault(r["method"], dict(r))
            b.update(min_s=min(b["min_s"], r["min_s"]), cpu_min_s=min(b["cpu_min_s"], r["cpu_min_s"]))
        timing += best.values()
        for r in best.values():
            print(f"N={n:2d} {r['method']:9s} min {r['min_s']:.3f} s  median {r['median_s']:.3f} s  "
                  f"CPU time min {r['cpu_min_s']:.3f} s", file=sys.stderr)
    return timing


def proxies(args: argparse.Namespace, model_dirs: dict[str, str]) -> list[dict]:
    from ladbench.models import compat
    rows = []
    for preset, model_dir in model_dirs.items():
        qwen = _family(model_dir) == "qwen2_5_vl"           # the family with a tower of ours to compare
        for n in args.n:
            codes = [("ours", None, "batched", None)] + [("ours, native tower", None, "native", None)] * qwen
            if compat.on_current_lane() and qwen:            # the same model through family auto
                codes.append(("auto", None, "native", "auto"))
            if args.baseline_src:
                codes.append(("today", args.baseline_src, "batched", None))
            for code, src, vision, family in codes:
                r = _proxy(n, args, model_dir, src=src, vision=vision, family=family)
                rows.append(dict(r, preset=preset, code=code))
                print(f"proxy {preset} N={n} {code}: {r['syncs_per_row']:.1f} syncs/row, "
                      f"{r['aten_ops_per_row']:.0f} aten ops/row", file=sys.stderr)
    return rows


def _proxy(n: int, args: argparse.Namespace, model_dir: str, *, src: str | None = None, vision: str = "native",
           family: str | None = None) -> dict:
    extra = ("--batch", str(args.proxy_batch), "--vision", vision) + (("--family", family) if family else ())
    return _run_worker("proxy", n, args, model_dir=model_dir, src=src, extra=extra)[0]


def architecture_proxies(args: argparse.Namespace) -> list[dict]:
    """Family auto on the tiny build of each architecture (models/tiny_archs.py, and the
    hand-written families' builds auto runs in the tests; current lane)."""
    from ladbench.models.tiny import build_tiny_model
    from ladbench.models.tiny_archs import BUILDS, FAMILY_BUILDS_AUTO_RUNS, build_tiny_architecture
    built = sorted([*BUILDS, *FAMILY_BUILDS_AUTO_RUNS])
    names = built if args.architectures == ["all"] else args.architectures
    unknown = sorted(set(names) - set(built))
    if unknown:
        raise SystemExit(f"--architectures: no tiny build of {', '.join(unknown)}; built: {', '.join(built)}")
    root, rows = scratch_folder(), []
    for name in names:
        build = build_tiny_architecture if name in BUILDS else build_tiny_model
        model_dir = build(name, os.path.join(root, name))
        for n in args.n:
            r = dict(_proxy(n, args, model_dir, family="auto"), architecture=name, preset="tiny", code="auto")
            rows.append(r)
            print(f"proxy {name} N={n}: {r['syncs_per_row']:.1f} syncs/row ({r['vision_syncs_per_row']:.1f} in the "
                  f"vision tower), {r['aten_ops_per_row']:.0f} aten ops/row", file=sys.stderr)
    return rows


def architecture_table(rows: list[dict]) -> str:
    lines = ["| architecture | N | batch | host syncs / row | of which in the vision tower | aten ops / row |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['architecture']} | {r['n']} | {r['batch']} | {r['syncs_per_row']:.1f} | "
              f"{r['vision_syncs_per_row']:.1f} | {r['aten_ops_per_row']:.0f} |" for r in rows]
    return "\n".join(lines)


def gpu(args: argparse.Namespace, results: dict[str, dict], save: Callable[[], None] = lambda: None) -> None:
    """Part 3 into ``results`` by architecture, ``save()`` after each measurement (a run its time
    limit stops keeps what it measured); a measurement that fails is listed in the architecture's
    ``failed`` (:func:`attempt`) and the others go on."""
    for arch in args.arch:
        results[arch] = {"throughput": [], "split": [], "pass": [], "failed": []}
        _gpu_architecture(arch_model(arch, args), args, results[arch], save)


def _gpu_architecture(model_dir: str, args: argparse.Namespace, r: dict, save: Callable[[], None]) -> None:
    def measured(part: str, what: str, measure: Callable[..., dict | list[dict]], *margs, **kwargs) -> None:
        out = attempt(r["failed"], what, measure, *margs, **kwargs)
        r[part] += [] if out is None else out if isinstance(out, list) else [out]
        print(model_dir, part, out, file=sys.stderr)
        save()
    for n in args.n:
        for batch in args.batches if "throughput" in args.gpu_parts else ():
            measured("throughput", f"infer rows/s at N = {n}, batch {batch}", infer_throughput, model_dir, n, batch,
                     args.gpu_rows, args.image_size, args.device, args.workers, args.family)
            for wanted, what, compared in ((args.one_at_a_time, "one batch at a time", {"score_ahead": False}),
                                           (args.read_back, "with transformers' read-backs", {"decide_on_host": False}),
                                           (args.compiled_vision, "with the vision blocks compiled",
                                            {"vision_tower": "compiled"}),
                                           (args.no_cudnn, "without cuDNN's attention", {"cudnn_attention": False})):
                if wanted and (n, batch) == (args.n[0], args.batches[0]):                  # the ratio, in this run
                    measured("throughput", f"infer rows/s {what} at N = {n}, batch {batch}", infer_throughput,
                             model_dir, n, batch, args.gpu_rows, args.image_size, args.device, args.workers,
                             args.family, **compared)
        if "split" in args.gpu_parts:
            measured("split", f"split at N = {n}", _run_worker, "split", n, args, model_dir=model_dir,
                     extra=("--batch", str(args.proxy_batch), *(("--trace", args.trace) if args.trace else ())))
        if "pass" in args.gpu_parts:
            measured("pass", f"one pass at N = {n}", _run_worker, "time", n, args, model_dir=model_dir,
                     extra=("--methods", "bare", "ours", "reference"))


def scoring_way(run: dict) -> str:
    """How an ``infer`` run of :func:`infer_throughput` scored (files written before 8de17fa lack ``decide_on_host``,
    older ones ``vision_tower`` and ``cudnn_attention`` too)."""
    way = "one batch ahead" if run.get("score_ahead", True) else "one at a time"
    way = way if run.get("decide_on_host", True) else f"{way}, transformers reads back"
    way = way if run.get("vision_tower", "batched") == "batched" else f"{way}, vision tower {run['vision_tower']}"
    return way if run.get("cudnn_attention", True) else f"{way}, no cuDNN attention"


def gpu_tables(results: dict) -> str:
    lines = []
    for arch, r in results.items():
        lines += [f"\n**{arch}**", "", "| N | batch | scoring | rows/s: all rows / the second half | mean GPU util %: "
                  "whole run / its batches | wall s: whole run / its batches | batch used |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {t['n']} | {t['batch']} | {scoring_way(t)} | "
                  f"{t['rows_per_s']:.2f} / {t.get('rows_per_s_steady', math.nan):.2f} | "
                  f"{t['gpu_util_mean']:.0f} / {t.get('gpu_util_batches', math.nan):.0f} | "
                  f"{t['wall_s']:.1f} / {t.get('batches_wall_s', math.nan):.1f} | {t['batch_size_used']} |"
                  for t in r["throughput"]]
        lines += ["", "| N | batch | prepare ms/row (host, hidden by workers) | vision ms/row | decoder ms/row | "
                  "capture + scoring ms/row |", "|---|---|---|---|---|---|"]
        lines += [f"| {s['n']} | {s['batch']} | {s['prepare_ms']:.1f} | {s['vision_ms']:.1f} | {s['decoder_ms']:.1f} | "
                  f"{s['capture_and_scoring_ms']:.1f} |" for s in r["split"]]
        if r["pass"]:
            lines += ["", markdown_table(r["pass"])]
        lines += failure_lines({arch: r.get("failed", []) + [f for s in r["split"] for f in s.get("failed", [])]})
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
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
    p.add_argument("--baseline-src", default=None,
                   help="an earlier commit's src/ folder: also time and count its row step ('today'), paired")
    p.add_argument("--pairs", type=int, default=3, help="alternating ours/today worker pairs (3)")
    p.add_argument("--proxies", action="store_true", help="also count host syncs and aten ops per row (tiny + --preset)")
    p.add_argument("--proxy-batch", "--batch", dest="proxy_batch", type=int, default=8,
                   help="batch size of the proxies and of the GPU split (8)")
    p.add_argument("--proxy-families", nargs="+", default=[], choices=["internvl"],
                   help="proxies: also count the tiny build of these families (ours, and --baseline-src's)")
    p.add_argument("--vision", default="batched", help=argparse.SUPPRESS)
    p.add_argument("--family", default=None,
                   help="GPU part: the family infer runs (auto: current lane; default: the architecture's own)")
    p.add_argument("--architectures", nargs="+", default=[], metavar="ARCH",
                   help="current lane: only count the proxies of family auto on these tiny architecture builds "
                        "(models/tiny_archs.py; 'all' for every one), e.g. --n 8 --architectures all; the README's "
                        "model table reads them (ladbench models --markdown --proxies JSON)")
    p.add_argument("--arch", nargs="+", default=[], choices=["qwen2_5_vl_3b", "internvl3_8b"],
                   help="GPU part: full-size random architectures to run")
    p.add_argument("--arch-scale", default="full", choices=["full", "small"], help="small: mechanics check only")
    p.add_argument("--arch-dir", default=None, metavar="DIR",
                   help="GPU part and generation: build each --arch into DIR once and reuse it from then on "
                        "(default: a new temporary folder every run)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32], help="GPU part: infer batch sizes (1 8 32)")
    p.add_argument("--gpu-parts", nargs="+", default=list(GPU_PARTS), choices=GPU_PARTS,
                   help="GPU part: which measurements to run (all three; each model load costs time on a lent machine)")
    p.add_argument("--workers", type=int, default=None, help="GPU part: infer's --workers (its default if omitted)")
    p.add_argument("--one-at-a-time", action="store_true",
                   help="GPU part: at the first N and batch, also run infer one batch at a time (--no-score-ahead)")
    p.add_argument("--read-back", action="store_true",
                   help="GPU part: at the first N and batch, also run infer with transformers reading the padding and "
                        "the image-token count back (--no-decide-on-host)")
    p.add_argument("--compiled-vision", action="store_true",
                   help="GPU part: at the first N and batch, also run infer with the vision tower's blocks compiled "
                        "(--vision-tower compiled)")
    p.add_argument("--no-cudnn", action="store_true",
                   help="GPU part: at the first N and batch, also run infer with cuDNN's attention left out of SDPA's "
                        "choice (--no-cudnn-attention)")
    p.add_argument("--gpu-rows", type=int, default=128, help="GPU part: rows per infer run (128)")
    p.add_argument("--generation", action="store_true",
                   help="part 5: CoT and SC through the decode loop against plain generate (tiny model on the CPU, "
                        "--arch on a GPU)")
    p.add_argument("--gen-variants", nargs="+", default=list(GENERATION_VARIANTS), choices=GENERATION_VARIANTS)
    p.add_argument("--gen-rows", type=int, default=24, help="generation: rows (24)")
    p.add_argument("--gen-batch", type=int, default=4, help="generation: batch size (rows per prefill group; 4)")
    p.add_argument("--gen-samples", type=int, default=5, help="generation: SC samples per row (5)")
    p.add_argument("--gen-slots", type=int, default=None,
                   help="generation: sequences in flight (infer's --decode-slots; unset: its default, batch x samples "
                        "on the CPU, at least 64 on a GPU); where it differs from batch x samples the loop also runs "
                        "with batch x samples in flight, for the ratio")
    p.add_argument("--gen-chunk", type=int, default=8,
                   help="generation: rows per chunk of the cache, for decode steps one chunk at a time against "
                        "streamed across chunks (8)")
    p.add_argument("--gen-max-new-tokens", type=reply_limit, default=24,
                   help="generation: longest reply (24); 'study': the variant's own limit, as the study runs it")
    p.add_argument("--end-boost", type=float, default=2.0,
                   help="generation: scale of the end-of-turn row of the LM head (random weights seldom end a "
                        "reply; 2 gives replies of mixed length on the tiny model; 0: every reply runs to its limit, "
                        "as ladbench plan prices a job)")
    p.add_argument("--gen-measure", nargs="+", default=list(GENERATION_MEASUREMENTS), choices=GENERATION_MEASUREMENTS,
                   metavar="NAME",
                   help="generation: what to measure after the decode loop's own first and second runs, in this order "
                        f"(default, most wanted first: {' '.join(GENERATION_MEASUREMENTS)})")
    p.add_argument("--json", default=None, help="also write the raw results here")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="GPU part 'split': also profile one device step per (arch, N) with torch.profiler into DIR, "
                        "and --generation one decode step per variant (a Chrome trace and a table of operators; "
                        "e.g. benchmarks/results/<gpu>-<date>/traces)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p


def main() -> None:
    args = parser().parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.worker:
        import torch
        torch.set_num_threads(args.threads)
        if args.worker == "time":
            result = time_worker(args.n[0], args.methods, args.model_dir, args.reps, args.image_size, args.device)
        elif args.worker == "proxy":
            result = proxy_worker(args.n[0], args.model_dir, args.proxy_batch, args.image_size, args.vision,
                                  args.family)
        else:
            result = split_worker(args.n[0], args.model_dir, args.proxy_batch, args.image_size, args.device, args.reps,
                                  args.trace)
        print(json.dumps(result))
        return
    raw: dict = {"threads": args.threads, "device": args.device, "date": time.strftime("%Y-%m-%d")}
    if args.device.startswith("cuda") and (name := gpu_name()):
        raw["gpu_name"] = name
    save = JsonCheckpoint(args.json, raw)
    if args.generation:
        from ladbench.models.tiny import build_tiny_model
        dirs = [arch_model(arch, args) for arch in args.arch] or [args.model_dir or build_tiny_model(
            "qwen2_5_vl", os.path.join(scratch_folder(), "tiny_qwen2_5_vl"), seed=0, preset="tiny")]
        models = [(os.path.basename(os.path.normpath(model_dir)), model_dir) for model_dir in dirs]   # by folder name
        import torch
        torch.set_num_threads(args.threads)
        raw["generation"] = []
        for name, model_dir in models:
            generation_worker(model_dir, name, args, raw["generation"], save)
        print(generation_table(raw["generation"]))
    elif args.architectures:
        raw["proxies"] = architecture_proxies(args)
        print(architecture_table(raw["proxies"]))
    elif args.arch:
        raw["gpu"] = {}
        gpu(args, raw["gpu"], save)
        print(gpu_tables(raw["gpu"]))
    else:
        from ladbench.models.tiny import build_tiny_model
        root = scratch_folder()
        model_dir = args.model_dir or build_tiny_model("qwen2_5_vl", os.path.join(root, f"{args.preset}_qwen2_5_vl"),
                                                       seed=0, preset=args.preset)
        raw["timing"] = cpu_timing(args, model_dir)
        print(markdown_table(raw["timing"]))
        if args.proxies:
            dirs = {"tiny": build_tiny_model("qwen2_5_vl", os.path.join(root, "tiny_qwen2_5_vl"), seed=0, preset="tiny")}
            dirs[args.preset] = model_dir
            dirs.update({f"tiny {family}": build_tiny_model(family, os.path.join(root, f"tiny_{family}"), seed=0,
                                                            preset="tiny") for family in args.proxy_families})
            raw["proxies"] = proxies(args, dirs)
            print("\n" + proxy_table(raw["proxies"]))
    save()


if __name__ == "__main__":
    main()
