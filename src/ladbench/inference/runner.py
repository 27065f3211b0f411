"""The ``infer`` stage: one forward pass per cache row, written to a resumable HDF5 cache.

Per row (docs/formats.md §4): the N images in the row's order (resized to a square,
bicubic), the prompt of the variant through the model's chat template, ONE prefill with
the fast attention kernel capturing the last query row of every decoder layer, the
candidate scores (METHOD §2; continuation steps reuse the prefill's KV cache), the
attention mass per layer per image span and on the other tokens. Generative variants
(cot, sc) generate replies instead and store texts and parsed answers (their ``scores``
and ``attn`` stay NaN).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import platform
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from ladbench.atomic import file_digest
from ladbench.benchmark import load_benchmark
from ladbench.data.coco import load_image_table

from .cache import CacheLayout, CacheWriter, RowPlan, is_complete_for, plan_rows
from .merge import select_shard
from .prompts import (GENERATIVE_VARIANTS, IDENTIFIER_FORMATS, PROMPT_VARIANTS, identifiers, majority_vote,
                      parse_answer_is, parse_last_identifier, prompt_sha256, prompt_text)
from .scoring import SCORE_MODES, IdentifierTrie, identifier_encoder, trie_scores

log = logging.getLogger(__name__)

FAMILY_CHOICES = ("qwen2_5_vl", "internvl", "llava_ov15")


@dataclass
class InferenceSettings:
    """Everything the stage needs; one field per CLI flag."""

    benchmark: str
    images: str
    out: str
    model_name: str
    family: str
    model_path: str
    revision: str | None = None
    trust_remote_code: bool = False
    dtype: str = "auto"
    device: str = "auto"
    prompt: str = "vanilla"
    identifiers: str = "digits"
    score_mode: str = "reference"
    image_size: int = 336
    batch_size: int = 1
    chunk_size: int = 16
    store_head_attention: bool = False
    limit_rows: int | None = None
    sofa_sigma: float = 0.5
    sofa_every: int = 2
    cot_max_new_tokens: int = 1024
    sc_samples: int = 10
    sc_temperature: float = 0.7
    sc_top_k: int = 40
    sc_max_new_tokens: int = 512
    seed: int = 0
    shard_index: int = 0
    shard_count: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    # fields that do not change any stored number (only speed / how much runs now; a
    # shard's rows are identified by its cache's own config_sha256, see merge.select_shard)
    _NOT_HASHED = ("out", "batch_size", "chunk_size", "limit_rows", "model_name", "extra", "shard_index",
                   "shard_count")

    def validate(self) -> None:
        checks = [("family", self.family, FAMILY_CHOICES), ("prompt", self.prompt, PROMPT_VARIANTS),
                  ("identifiers", self.identifiers, IDENTIFIER_FORMATS), ("score_mode", self.score_mode, SCORE_MODES)]
        for name, value, allowed in checks:
            if value not in allowed:
                raise ValueError(f"--{name.replace('_', '-')} {value!r} is not one of {', '.join(allowed)}")
        for name in ("image_size", "batch_size", "chunk_size", "sofa_every", "sc_samples", "shard_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1; got {getattr(self, name)}")
        if not 0.0 <= self.sofa_sigma <= 1.0:
            raise ValueError(f"--sofa-sigma must be in [0, 1]; got {self.sofa_sigma}")

    def hashed_fields(self) -> dict[str, Any]:
        """Settings that change the cache content (for ``config_sha256``); variant-irrelevant ones dropped."""
        d = {k: v for k, v in asdict(self).items() if k not in self._NOT_HASHED}
        if self.prompt != "sofa":
            d.pop("sofa_sigma"), d.pop("sofa_every")
        if self.prompt != "cot":
            d.pop("cot_max_new_tokens")
        if self.prompt != "sc":
            for k in ("sc_samples", "sc_temperature", "sc_top_k", "sc_max_new_tokens"):
                d.pop(k)
        if self.prompt not in GENERATIVE_VARIANTS:
            d.pop("seed")
        if self.prompt == "sc":
            from .sampling import SAMPLER
            d["sampler"] = SAMPLER
        return d


# --------------------------------------------------------------------------- inputs
def image_paths(table: dict) -> dict[int, str]:
    """image_id -> file path, from an image table read by ``load_image_table`` (formats.md §1)."""
    return {int(im["image_id"]): os.path.join(table["image_root"], im["file_name"]) for im in table["images"]}


def check_benchmark(bench: dict, path: str, known_images: dict[int, str]) -> None:
    for key in ("n_candidates", "eval", "calibration"):
        if key not in bench:
            raise ValueError(f"benchmark {path}: missing key {key!r}")
    for split in ("eval", "calibration"):
        for inst in bench[split]:
            unknown = [c for c in inst["candidates"] if int(c) not in known_images]
            if unknown:
                raise ValueError(f"benchmark {path}: {split} instance {inst.get('id')} uses image ids {unknown} "
                                 "that the image table does not list")


def model_fingerprint(model_path: str) -> dict[str, Any]:
    """For a local model folder: its config's hash and its weight files' sizes (a rebuilt or
    replaced model changes the cache's identity). Hub ids are identified by id + revision."""
    if not os.path.isdir(model_path):
        return {}
    out: dict[str, Any] = {}
    for name in sorted(os.listdir(model_path)):
        full = os.path.join(model_path, name)
        if name == "config.json":
            out[name] = file_digest(full)
        elif name.endswith((".safetensors", ".bin")):
            out[name] = os.path.getsize(full)
    return out


def config_sha256(settings: InferenceSettings, bench_path: str, images_path: str) -> str:
    """Identity of a cache's inputs: hashed settings, benchmark and image table, model files."""
    payload = {"settings": settings.hashed_fields(), "benchmark_sha256": file_digest(bench_path),
               "images_sha256": file_digest(images_path), "model": model_fingerprint(settings.model_path),
               "cache_format": 1}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def library_versions() -> dict[str, str]:
    import h5py
    import torch
    import transformers

    import ladbench
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "h5py": h5py.__version__, "numpy": np.__version__,
            "ladbench": ladbench.__version__, "cuda": str(torch.version.cuda)}


# ------------------------------------------------------------------------- per-batch
def segment_ids(input_ids: Sequence[int], attention_mask: Sequence[int], spans: Sequence[tuple[int, int]],
                n_candidates: int) -> np.ndarray:
    """Token -> segment: k for image k's span, N for other real tokens, N + 1 for padding."""
    seg = np.full(len(input_ids), n_candidates, dtype=np.int64)
    seg[np.asarray(attention_mask) == 0] = n_candidates + 1
    for k, (start, end) in enumerate(spans):
        seg[start:end] = k
    return seg


class RowRunner:
    """Runs the model on batches of rows for one setting (scoring or generative)."""

    def __init__(self, adapter, settings: InferenceSettings, bench: dict, plan: RowPlan,
                 paths: dict[int, str]) -> None:
        self.adapter, self.s, self.bench, self.plan = adapter, settings, bench, plan
        self.n = int(bench["n_candidates"])
        self.ids = identifiers(settings.identifiers, self.n)
        self._image = lru_cache(maxsize=512)(self._load_image)
        self._paths = paths
        if settings.prompt not in GENERATIVE_VARIANTS:
            self.trie = IdentifierTrie.build(self.ids, identifier_encoder(adapter.tokenizer), adapter.end_of_turn_id)
            self.nodes = self.trie.nodes_needing_logits(settings.score_mode)

    def _load_image(self, image_id: int):
        from PIL import Image

        from ladbench.models.base import resize_square
        path = self._paths[image_id]
        try:
            with Image.open(path) as im:
                return resize_square(im, self.s.image_size)
        except OSError as exc:
            raise OSError(f"cannot read image {image_id} at {path}: {exc}") from None

    def _instance(self, r: int) -> dict:
        return self.bench["eval" if self.plan.split[r] == 0 else "calibration"][int(self.plan.instance[r])]

    def _row_text(self, r: int) -> str:
        caption = self._instance(r)["caption"]
        return self.adapter.chat_text(prompt_text(self.s.prompt, self.n, caption, self.s.identifiers), self.n)

    def _row_inputs(self, r: int) -> tuple[str, list]:
        shown = [int(self._instance(r)["candidates"][j]) for j in self.plan.order[r]]
        return self._row_text(r), [self._image(i) for i in shown]

    def encode_rows(self, rows: Sequence[int]) -> dict:
        """Model inputs of a batch of rows (images in each row's order, prompt, left padding)."""
        texts, images = zip(*(self._row_inputs(r) for r in rows))
        return self.adapter.encode(list(texts), list(images))

    def score_batch(self, rows: Sequence[int]) -> dict[str, np.ndarray]:
        """Scores and attention of a batch of rows (one prefill + trie continuations)."""
        import torch

        from .attention import LastRowCapture, SofaMask, sofa_attention_bias, sofa_layers
        ad, n = self.adapter, self.n
        inputs = self.encode_rows(rows)
        ids, mask = inputs["input_ids"].cpu().numpy(), inputs["attention_mask"].cpu().numpy()
        segs = []
        for b, r in enumerate(rows):
            spans = ad.image_spans(ids[b].tolist())
            if len(spans) != n:
                raise RuntimeError(f"row {r}: found {len(spans)} image spans in the prompt, expected {n}")
            segs.append(segment_ids(ids[b], mask[b], spans, n))
        seg = torch.as_tensor(np.stack(segs), device=ad.device)
        modules = ad.attention_modules()
        sofa_ctx = contextlib.nullcontext()
        if self.s.prompt == "sofa":
            bias = sofa_attention_bias(inputs["attention_mask"], inputs["input_ids"] == ad.image_token_id,
                                       self.s.sofa_sigma, ad.model.dtype)
            sofa_ctx = SofaMask([modules[i] for i in sofa_layers(len(modules), self.s.sofa_every)], bias)
        with LastRowCapture(modules, seg, n + 2) as cap, sofa_ctx:
            logits, state = ad.prefill(inputs, use_cache=len(self.nodes) > 1)
        mass = cap.masses()                                              # [B, L, H, N + 2]
        logits_at = {(): logits.cpu().numpy()}
        for node in self.nodes[1:]:
            logits_at[node] = ad.continue_logits(state, node).cpu().numpy()
        head_mass = mass[..., :n].cpu().numpy()
        out = {"scores": trie_scores(self.trie, logits_at, self.s.score_mode).astype(np.float32),
               "attn": head_mass.mean(axis=2).astype(np.float32),
               "attn_text": mass[..., n].mean(dim=2).cpu().numpy().astype(np.float32)}
        if self.s.store_head_attention:
            out["attn_heads"] = head_mass.astype(np.float16)
        return out

    def by_prompt_length(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` ordered by prompt length, longest first (a batch of similar lengths pads
        little; the largest batch comes first, so memory trouble shows at once). Images
        add the same number of tokens to every row, so the text's tokens decide."""
        lengths = [len(self.adapter.tokenizer(self._row_text(int(r))).input_ids) for r in rows]
        return np.asarray(rows)[np.argsort(-np.asarray(lengths), kind="stable")]

    def generate_batch(self, rows: Sequence[int]) -> dict[str, np.ndarray]:
        """Replies and parsed answers of a batch of rows, generated together, each sequence
        stopping at its end token. CoT: one greedy reply per row. SC: the S samples of
        every row of the batch in one batch, each drawn with its own key (sampling.py), so
        the samples do not depend on the batch size, chunking or shards."""
        from .sampling import KeyedSampler, sequence_keys
        s = self.s
        inputs = self.encode_rows(rows)
        if s.prompt == "cot":
            texts, counts = self.adapter.generate(inputs, max_new_tokens=s.cot_max_new_tokens, do_sample=False)
            parsed = [parse_last_identifier(t, self.n, s.identifiers) for t in texts]
            return {"text": np.array(texts, dtype=object), "parsed": np.array(parsed, dtype=np.int16),
                    "n_generated": counts.cpu().numpy().astype(np.int32)}
        import torch
        plan_rows_of_batch = torch.as_tensor(np.asarray(rows, dtype=np.int64) + self.plan.first_row)
        sampler = KeyedSampler(sequence_keys(s.seed, plan_rows_of_batch, s.sc_samples),
                               prompt_length=inputs["input_ids"].shape[1], temperature=s.sc_temperature,
                               top_k=s.sc_top_k)
        # The sampler leaves one finite logit per sequence: transformers' own sampling then
        # takes it whatever its warpers (disabled here) would do.
        texts, counts = self.adapter.generate(inputs, max_new_tokens=s.sc_max_new_tokens, do_sample=True,
                                              temperature=1.0, top_k=0, top_p=1.0,
                                              num_return_sequences=s.sc_samples, logits_processor=[sampler])
        texts = np.array(texts, dtype=object).reshape(len(rows), s.sc_samples)
        samples = np.array([[parse_answer_is(t, self.n, s.identifiers) for t in row] for row in texts], np.int16)
        return {"text": texts, "parsed": np.array([majority_vote(row) for row in samples], dtype=np.int16),
                "sample_parsed": samples,
                "n_generated": counts.view(len(rows), s.sc_samples).sum(-1).cpu().numpy().astype(np.int32)}


# --------------------------------------------------------------------------- driver
def _peak_memory(writer: CacheWriter, device: str) -> dict[str, float]:
    """Peak CPU RSS and CUDA memory (MB) of this run, or of an earlier run of the same cache
    if higher (one that ended and recorded its peak; a killed run records none)."""
    import torch
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0            # Linux: KiB
    cuda = torch.cuda.max_memory_allocated() / 2 ** 20 if device.startswith("cuda") else float("nan")
    return {"peak_rss_mb": float(np.nanmax([rss, writer.attr("peak_rss_mb", np.nan)])),
            "peak_cuda_mb": float(np.fmax(cuda, writer.attr("peak_cuda_mb", np.nan)))}


def run_inference(settings: InferenceSettings) -> str:
    """Run (or resume, or skip when complete) the ``infer`` stage; returns the cache path."""
    from tqdm import tqdm

    from ladbench.models.base import resolve_device
    settings.validate()
    settings.device = resolve_device(settings.device)        # hashed resolved: a CPU run never resumes a GPU one
    bench = load_benchmark(settings.benchmark)
    paths = image_paths(load_image_table(settings.images))
    check_benchmark(bench, settings.benchmark, paths)
    n = int(bench["n_candidates"])
    plan = plan_rows(bench, shifts_per_ordering=settings.prompt == "permavg")
    digest = config_sha256(settings, settings.benchmark, settings.images)
    plan, digest, shard_attrs = select_shard(plan, digest, settings.shard_index, settings.shard_count)

    if is_complete_for(settings.out, digest):
        log.info("%s is complete for these inputs; nothing to do", settings.out)
        return settings.out

    from ladbench.models import load_adapter
    device = settings.device
    adapter = load_adapter(settings.family, settings.model_path, revision=settings.revision, dtype=settings.dtype,
                           device=device, trust_remote_code=settings.trust_remote_code)
    generative = settings.prompt in GENERATIVE_VARIANTS
    layout = CacheLayout(n_candidates=n, n_layers=adapter.n_layers, n_heads=adapter.n_heads,
                         store_heads=settings.store_head_attention, generative=generative,
                         n_samples=settings.sc_samples if settings.prompt == "sc" else 1)
    attrs = {"model": settings.model_name, "model_path": settings.model_path, "revision": settings.revision or "",
             "family": settings.family, "variant": settings.prompt, "n_candidates": n,
             "n_layers": adapter.n_layers, "n_heads": adapter.n_heads, "identifiers": settings.identifiers,
             "score_mode": settings.score_mode, "prompt_sha256": prompt_sha256(settings.prompt, n, settings.identifiers),
             "config_sha256": digest, "settings": settings.hashed_fields(), "versions": library_versions(),
             "device": device, "dtype": str(adapter.model.dtype).replace("torch.", ""),
             "benchmark": os.path.abspath(settings.benchmark), **shard_attrs}
    if settings.prompt == "sofa":
        attrs.update(sofa_sigma=settings.sofa_sigma, sofa_every=settings.sofa_every)
    writer = CacheWriter.open(settings.out, plan, layout, attrs)
    pending = writer.pending_rows()
    if 0 < len(pending) < len(plan):
        log.info("%s: resuming, %d of %d rows already done", writer.path, len(plan) - len(pending), len(plan))
    if settings.limit_rows is not None:
        pending = pending[: settings.limit_rows]
    runner = RowRunner(adapter, settings, bench, plan, paths)
    if generative:
        pending = runner.by_prompt_length(pending)
    step = runner.generate_batch if generative else runner.score_batch

    started, done_now = time.perf_counter(), 0
    with tqdm(total=len(pending), unit="row", desc=f"infer {settings.model_name}/{settings.prompt}",
              file=sys.stderr, disable=None) as bar:
        for c0 in range(0, len(pending), settings.chunk_size):
            chunk = pending[c0:c0 + settings.chunk_size]
            parts: list[dict[str, np.ndarray]] = []
            for b0 in range(0, len(chunk), settings.batch_size):
                batch = chunk[b0:b0 + settings.batch_size]
                t0 = time.perf_counter()
                part = step(batch)
                part["seconds"] = np.full(len(batch), (time.perf_counter() - t0) / len(batch), np.float32)
                parts.append(part)
                bar.update(len(batch))
            writer.write(chunk, {k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
            done_now += len(chunk)
    final = {**writer.throughput(), **_peak_memory(writer, device),
             "last_run_rows": done_now, "last_run_s": time.perf_counter() - started}
    if len(writer.pending_rows()):
        writer.set_attrs(final)
        log.warning("%s: stopped after %d rows (--limit-rows); run again to continue", writer.path, done_now)
    else:
        writer.finish(final)
    return settings.out


def _settings_from_args(args: argparse.Namespace) -> InferenceSettings:
    fields = InferenceSettings.__dataclass_fields__
    return InferenceSettings(**{k: getattr(args, k) for k in fields if k != "extra" and hasattr(args, k)})


def _cmd_infer(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from .devices import claim_for_device
    claim = claim_for_device(args.gpus, args.device)   # before torch initialises CUDA; held until exit
    print(run_inference(_settings_from_args(args)))
    del claim


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``infer`` subcommand."""
    p = subparsers.add_parser("infer", help="run a model over a benchmark into a resumable HDF5 cache",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("inputs and output")
    g.add_argument("--benchmark", required=True, help="benchmark JSON (docs/formats.md §3)")
    g.add_argument("--images", required=True, help="image table JSON (docs/formats.md §1)")
    g.add_argument("--out", required=True, help="cache HDF5 to write or resume (docs/formats.md §4)")
    g = p.add_argument_group("model")
    g.add_argument("--model-name", required=True, help="short model name stored in the cache (e.g. qwen2_5_vl_3b)")
    g.add_argument("--family", required=True, choices=FAMILY_CHOICES, help="model family (selects the adapter)")
    g.add_argument("--model-path", required=True, help="hub id or local folder of the model")
    g.add_argument("--revision", default=None, help="hub revision (commit / tag) to pin")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="allow model code shipped with the checkpoint (needed by llava_ov15; only for trusted models)")
    g.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="weights dtype; auto = bfloat16 on GPU, float32 on CPU")
    g.add_argument("--device", default="auto", help="auto, cpu or cuda (GPU: weights placed with device_map=auto)")
    g = p.add_argument_group("prompt and scoring")
    g.add_argument("--prompt", default="vanilla", choices=PROMPT_VARIANTS, help="prompt / cache variant")
    g.add_argument("--identifiers", default="digits", choices=IDENTIFIER_FORMATS, help="candidate identifier format")
    g.add_argument("--score-mode", default="reference", choices=SCORE_MODES,
                   help="reference: raw logits when every identifier is one token, else joint restricted "
                        "log-probs (published numbers); joint: always joint restricted log-probs")
    g.add_argument("--image-size", type=int, default=336, help="images are resized to this square, bicubic (336)")
    g.add_argument("--store-head-attention", action="store_true", help="also store per-head attention (attn_heads)")
    g = p.add_argument_group("SoFA (--prompt sofa)")
    g.add_argument("--sofa-sigma", type=float, default=0.5, help="future image-to-image attention weight (0.5)")
    g.add_argument("--sofa-every", type=int, default=2, help="apply SoFA in every n-th decoder layer from 0 (2)")
    g = p.add_argument_group("generation (--prompt cot / sc)")
    g.add_argument("--cot-max-new-tokens", type=int, default=1024, help="CoT: greedy reply length limit (1024)")
    g.add_argument("--sc-samples", type=int, default=10, help="self-consistency: samples per row (10)")
    g.add_argument("--sc-temperature", type=float, default=0.7, help="self-consistency: temperature (0.7)")
    g.add_argument("--sc-top-k", type=int, default=40, help="self-consistency: top-k (40)")
    g.add_argument("--sc-max-new-tokens", type=int, default=512, help="self-consistency: reply length limit (512)")
    g.add_argument("--seed", type=int, default=0,
                   help="self-consistency: sampling seed (each sample is keyed by the seed, its row and its "
                        "index: see inference/sampling.py)")
    g = p.add_argument_group("execution")
    g.add_argument("--gpus", type=int, default=0,
                   help="claim this many GPUs no other ladbench job on this machine holds and show CUDA only "
                        "those (0: no claim; a CUDA_VISIBLE_DEVICES already set for the job is respected)")
    g.add_argument("--batch-size", type=int, default=1, help="rows per forward pass (left padded)")
    g.add_argument("--chunk-size", type=int, default=16, help="rows per write to the cache (the most a kill can lose)")
    g.add_argument("--shard-index", type=int, default=0, help="run only shard i (0-based) of --shard-count")
    g.add_argument("--shard-count", type=int, default=1,
                   help="split the rows into this many contiguous shards (each its own cache; "
                        "`ladbench merge-shards` joins them)")
    g.add_argument("--limit-rows", type=int, default=None,
                   help="debugging: process at most this many pending rows, leave the cache incomplete")
    p.set_defaults(func=_cmd_infer)
