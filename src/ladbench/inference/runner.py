"""The ``infer`` stage: one forward pass per cache row, written to a resumable HDF5 cache.

Per row (docs/formats.md §4): the N images in the row's order (resized to a square,
bicubic), the prompt of the variant through the model's chat template, ONE prefill with
the fast attention kernel capturing the last query row of every decoder layer, the
candidate scores (METHOD §2; continuation steps reuse the prefill's KV cache), the
attention mass per layer per image span and on the other tokens, and (unless
``--no-greedy-reply``) the two-token greedy reply the reference reads Vanilla from
(``greedy.py``). Generative variants
(cot, sc) generate replies instead and store texts and parsed answers (their ``scores``
and ``attn`` stay NaN).
"""
from __future__ import annotations

import bisect
import contextlib
import hashlib
import itertools
import json
import logging
import os
import platform
import resource
import shutil
import time
from dataclasses import dataclass, field, fields
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ladbench.atomic import atomic_path, file_digest, sampled_digest
from ladbench.benchmark import load_benchmark
from ladbench.data.checks import AnnotationError
from ladbench.data.coco import (caption_problem, image_digests, image_paths, load_image_table, read_image,
                               table_fingerprint)
from ladbench.families import (DEVICE_PATTERN, DTYPES, FAMILIES, FAMILY_SETTINGS, RICE_FEATURES, VISION_TOWERS,
                               family_entry)
from ladbench.inputs import check_benchmark_table
from ladbench.progress import progress_bar
from ladbench.settings import Settings, setting
from ladbench.variants import PromptVariant, prompt_sha256, prompt_text, variant, variant_names

from .cache import CACHE_FORMAT, CacheLayout, CacheWriter, RowPlan, is_complete_for, plan_rows
from .merge import select_shard
from .greedy import greedy_outputs, greedy_reply_tokens, repetition_penalty
from .prompts import IDENTIFIER_FORMATS, identifiers, majority_vote
from .scoring import SCORE_MODES, IdentifierTrie, identifier_encoder, trie_scores

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

#: most DataLoader workers used by default on a GPU (the processor of one N = 8 batch of 8
#: takes about 0.5 s of one core; a GPU step of it about 60 ms)
GPU_WORKERS = 8
#: fewest sequences the decode loop keeps in flight by default on a GPU: a decode step reads every
#: weight of the decoder whatever the number of sequences, so on a GPU (where those reads, not the
#: arithmetic, bound a step of a 3B-8B model) more sequences per step should cost little (not yet
#: measured there: benchmarks/gpu_session.sh times 4 x S against 64); their KV caches
#: are the limit (about 0.1 to 0.25 GB a sequence at the paper's prompt and reply lengths, and
#: the slab that holds them keeps about 1.5 times that for each slot: decode.Slab)
GPU_DECODE_SLOTS = 64
#: a field that does not change any stored number (only speed, how much runs now, names), so
#: not part of the cache's identity (config_sha256); a shard's rows are identified by its cache's
#: own config_sha256 (merge.select_shard)
UNHASHED = {"hashed": False}
#: how the generative variants decode (``inference.decode``); unset means the first, the loop's slots
DECODE_WAYS = ("slots", "static", "graphs", "generate")
#: the ways that keep the sequences in flight in a ring of static shapes (decode.Ring)
RING_WAYS = ("static", "graphs")
#: the infer command's help sections of the settings' flags
PROMPT_GROUP, EXECUTION_GROUP = "prompt and scoring", "execution"


@dataclass
class InferenceSettings(Settings):
    """Everything the stage needs: the inputs and the model (plain fields, the command's
    required flags), then one carrier field per setting (:mod:`ladbench.settings`); those of
    the config's ``inference`` section are its keys, the others (``config=False``) come from a
    model's or a variant's entry or only from the command line."""

    section = "inference"

    # not hashed: the input files' contents are (the same inputs elsewhere give the same hash);
    # where the cache goes and what it is called change no number
    benchmark: str = field(metadata=UNHASHED)
    images: str = field(metadata=UNHASHED)
    out: str = field(metadata=UNHASHED)
    model_name: str = field(metadata=UNHASHED)
    family: str
    model_path: str
    revision: str | None = setting(None, "hub revision (commit / tag) to pin", kind=str, config=False, group="model")
    trust_remote_code: bool = setting(
        False, "allow model code shipped with the checkpoint (needed by llava_ov15; only for trusted models)",
        config=False, group="model")
    # not hashed: its content is (config_sha256), where it lies changes no number
    chat_template: str | None = setting(
        None, "a Jinja file holding the chat template, for a checkpoint released without one (used only when the "
        "model's processor has none)", kind=str, config=False, group="model", hashed=False)
    prompt: str = "vanilla"              # its flag lists the registry's variants, plugins' included (stages/infer.py)
    variant_name: str | None = setting(
        None, "the config's name of this cache variant, recorded in the cache (default: the prompt)", kind=str,
        config=False, group=PROMPT_GROUP, hashed=False)
    identifiers: str = setting("digits", "candidate identifier format", choices=IDENTIFIER_FORMATS, config=False,
                               group=PROMPT_GROUP)
    score_mode: str = setting(
        "reference", "reference: raw first-step logits when every identifier is one token, else joint restricted "
        "log-probs (the published numbers); joint: always joint restricted log-probs", choices=SCORE_MODES,
        group=PROMPT_GROUP)
    image_size: int = setting(336, "every image is resized to this square (bicubic) first", minimum=28,
                              group=PROMPT_GROUP)
    batch_size: int = setting(
        1, "rows per forward pass (left padded); a batch that runs out of GPU memory is halved and retried, and the "
        "size that ran is recorded in the cache (batch_size_used); in the config, a model's own batch_size wins",
        minimum=1, group=EXECUTION_GROUP, hashed=False)
    chunk_size: int = setting(
        64, "rows per flushed chunk of the cache; a kill loses only the chunks not written yet (scoring: at most "
        "this many rows; generation: the chunks with rows still decoding, as the decode loop runs on across chunks)",
        minimum=1, group=EXECUTION_GROUP, hashed=False)
    workers: int | None = setting(
        None, f"DataLoader workers preparing batches (image decoding, square resize, processor) ahead of the model; "
        f"0 = in the main process; unset: 0 on the CPU, up to {GPU_WORKERS} on a GPU (one CPU of the job left to the "
        f"main process)", kind=int, minimum=0, group=EXECUTION_GROUP, hashed=False)
    vision_tower: str = setting(
        "batched", "batched: all images of a batch through the vision tower together (Qwen2.5-VL-style towers; "
        "the same features); compiled: batched, each block under torch.compile (its elementwise work fused; the "
        "rounding may differ; the first batches pay the compilation); native: transformers' own, for comparison",
        choices=VISION_TOWERS, group=EXECUTION_GROUP, hashed=False)
    cudnn_attention: bool = setting(
        True, "on a GPU, whether torch's SDPA may choose cuDNN's attention kernel (torch's own choice); false leaves "
        "it out (flash, memory-efficient or math kernels), for comparison: cuDNN builds a graph for every new shape, "
        "and a decode loop meets a new KV length at every step (the same arithmetic; the rounding may differ)",
        group=EXECUTION_GROUP, hashed=False)
    score_ahead: bool = setting(
        True, "scoring: queue each batch on the device before reading back the one before, so that a GPU runs the "
        "next batch while the host scores and writes one (the same results); false: one batch at a time, for "
        "comparison", group=EXECUTION_GROUP, hashed=False)
    decide_on_host: bool = setting(
        True, "whether a prefill's batch (scoring's, the decode loop's groups) is padded and where its image features "
        "go are decided on the host as the batch is prepared, so that a GPU's host never waits inside a prefill for "
        "transformers to read them back (the same results, bit for bit); false: transformers reads them back, for "
        "comparison",
        group=EXECUTION_GROUP, hashed=False)
    group_by_length: bool = setting(
        False, "sort the rows of each chunk by prompt length before batching (less padding; results equal up to "
        "float rounding)",
        group=EXECUTION_GROUP, hashed=False)
    dtype: str = setting("auto", "weights dtype; auto = bfloat16 on a GPU, float32 on the CPU", choices=DTYPES,
                         group="model")
    rice_features: str = setting(
        RICE_FEATURES[0], "LLaVA-OneVision-1.5 only (its hub code's RICE-ViT, which takes the k-th image of a tower "
        "call's features from positions shifted back by k): per_prompt = what the hub code computes for each prompt "
        "alone (a prompt's k-th image shifted by k), as the published numbers were presumably made; per_image = each "
        "image its own features (docs/method.md)", choices=RICE_FEATURES, group="model")
    device: str = setting("auto", "auto (a GPU when one is visible), cpu, cuda or cuda:<i>; on a GPU the weights are "
                          "placed with device_map=auto", pattern=DEVICE_PATTERN, group="model")
    store_head_attention: bool = setting(False, "also store per-head attention (attn_heads)", group=PROMPT_GROUP)
    greedy_reply: bool = setting(
        True, "store each row's two greedy reply tokens and their text (the reference's Vanilla readout, method "
        "vanilla_generate; one KV-cache continuation step per batch)", group=PROMPT_GROUP)
    limit_rows: int | None = setting(
        None, "debugging: process at most this many pending rows, leave the cache incomplete", kind=int, minimum=1,
        config=False, group=EXECUTION_GROUP, hashed=False)
    # the prompt variant's own settings (its dataclass, ladbench.variants); None: its defaults
    options: Any = field(default=None, metadata=UNHASHED)      # hashed through its variant (hashed_settings)
    decode: str | None = setting(
        None, "generative variants: slots (unset) = the decode loop (one prefill per row, self-consistency's "
        "samples continue from it, a finished sequence's slot taken by the next; inference/decode.py); static = "
        "the decode loop with static shapes: its sequences in fixed slots of one preallocated KV cache, each step "
        "compiled (CUDA graphs on a GPU; on an H200 faster than slots' first run, its sampled bfloat16 replies not "
        "generate's: docs/performance.md); graphs = static's ring uncompiled, each step its eager kernels replayed as one CUDA "
        "graph on a GPU (no compilation; not yet measured there; on the CPU the same as static); generate = "
        "transformers' generate per batch, each "
        "sample encoded as its own row: the path it replaced, at its cost (the same replies on the CPU)",
        kind=str, choices=DECODE_WAYS, group=EXECUTION_GROUP, hashed=False)
    decode_slots: int | None = setting(
        None, f"generative variants: sequences the decode loop keeps in flight (each of a self-consistency row's "
        f"samples is one; rows are still prefilled batch_size at a time); unset: batch_size x samples per row on "
        f"the CPU, at least {GPU_DECODE_SLOTS} on a GPU (where a decode step reads every weight whatever the "
        f"number of sequences); an out-of-memory retry halves it with the batch", kind=int, minimum=1, group=EXECUTION_GROUP,
        hashed=False)
    seed: int = setting(
        0, "self-consistency: sampling seed (each sample is keyed by the seed, its row and its index: see "
        "inference/sampling.py)", config=False, group="generation (generative variants)")
    shard_index: int = setting(0, "run only shard i (0-based) of --shard-count", minimum=0, config=False,
                               group=EXECUTION_GROUP, hashed=False)
    shard_count: int = setting(
        1, "split the rows into this many contiguous shards (each its own cache; `ladbench merge-shards` joins them)",
        minimum=1, config=False, group=EXECUTION_GROUP, hashed=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.options is None and self.prompt in variant_names():
            self.options = variant(self.prompt).options()

    @property
    def variant(self) -> PromptVariant:
        return variant(self.prompt)

    def validate(self) -> None:
        """What the fields cannot check on construction: the registries, which plugins extend
        (the fields' choices and bounds are checked by :class:`~ladbench.settings.Settings`)."""
        checks = [("family", self.family, FAMILIES), ("prompt", self.prompt, variant_names())]
        for name, value, allowed in checks:
            if value not in allowed:
                raise ValueError(f"--{name.replace('_', '-')} {value!r} is not one of {', '.join(allowed)}")
        if not isinstance(self.options, self.variant.settings):
            raise ValueError(f"--prompt {self.prompt}: its settings must be a {self.variant.settings.__name__}, "
                             f"got {type(self.options).__name__}")

    def hashed_fields(self) -> dict[str, Any]:
        """Settings that change the cache content (for ``config_sha256``); variant-irrelevant ones dropped."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("hashed", True)}
        if os.path.isdir(self.model_path):
            d.pop("model_path")                          # a local folder: its files are hashed
        d.pop("greedy_reply" if self.variant.generative else "seed")
        for name in set(FAMILY_SETTINGS) - set(family_entry(self.family).own_settings):
            d.pop(name)                                  # another family's setting changes nothing here
        return {**d, **self.variant.hashed_settings(self.options)}

    def loader_workers(self) -> int:
        """DataLoader workers preparing batches: as set, else none on the CPU (they would take the
        model's cores) and up to :data:`GPU_WORKERS` of this process's CPUs but one on a GPU."""
        if self.workers is not None:
            return self.workers
        if not self.device.startswith("cuda"):
            return 0
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return max(1, min(GPU_WORKERS, cpus - 1))


def decode_sequences(samples: int, batch_size: int, decode_slots: int | None, *, gpu: bool,
                     group_rows: int | None = None) -> int:
    """Sequences the decode loop keeps in flight: ``decode_slots``, else ``batch_size`` x
    ``samples`` (on a GPU at least :data:`GPU_DECODE_SLOTS`); scaled by ``group_rows`` /
    ``batch_size`` where the groups are smaller than the batch size (an out-of-memory retry
    halved them, so the sequences halve too)."""
    wanted = decode_slots or samples * batch_size
    if decode_slots is None and gpu:
        wanted = max(wanted, GPU_DECODE_SLOTS)
    if group_rows is None or group_rows >= batch_size:
        return wanted
    return max(1, wanted * group_rows // batch_size)


# --------------------------------------------------------------------------- inputs
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
            problem = caption_problem(inst.get("caption"))
            if problem:
                raise ValueError(f"benchmark {path}: the caption of {split} instance {inst.get('id')} (image "
                                 f"{inst.get('target')}) {problem}")


def model_fingerprint(model_path: str) -> dict[str, Any]:
    """For a local model folder: the hashes of its config and of its weight files (sampled
    blocks: a rebuilt, replaced or fine-tuned model changes the cache's identity; the folder's
    location does not), and of a tiny model's metadata. Hub ids are identified by id + revision."""
    from ladbench.provenance import METADATA_FILE, metadata_identity
    if not os.path.isdir(model_path):
        return {}
    out: dict[str, Any] = {}
    for name in sorted(os.listdir(model_path)):
        full = os.path.join(model_path, name)
        if name == "config.json":
            out[name] = file_digest(full)
        elif name == METADATA_FILE:                        # how a tiny model was made (not how long it took)
            out[name] = metadata_identity(full)
        elif name.endswith((".safetensors", ".bin")):
            out[name] = sampled_digest(full)
    return out


def config_sha256(settings: InferenceSettings, bench_path: str, table: dict) -> str:
    """Identity of a cache's inputs: hashed settings, the benchmark file, the image table's
    content (not where the images are), the model files and a chat template given apart."""
    payload = {"settings": settings.hashed_fields(), "benchmark_sha256": file_digest(bench_path),
               "images_sha256": table_fingerprint(table), "model": model_fingerprint(settings.model_path),
               "cache_format": CACHE_FORMAT}
    if settings.chat_template:                   # a template the config gives: its content, not its path
        payload["chat_template_sha256"] = file_digest(settings.chat_template)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def library_versions() -> dict[str, str]:
    import h5py
    import torch
    import transformers

    import ladbench
    from ladbench.models.compat import LANE
    return {"python": platform.python_version(), "torch": torch.__version__, "lane": LANE,
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


@dataclass
class PreparedBatch:
    """A batch of rows encoded on the host (in a DataLoader worker, or inline with 0 workers):
    the model inputs and, for scoring variants, each token's segment (``segment_ids``)."""

    rows: list[int]
    inputs: dict[str, Any]
    segments: Any = None                       # torch.Tensor [B, T] (scoring variants)
    groups: list[dict[str, Any]] | None = None     # generative variants: inputs of each group of rows
    group_size: int | None = None      # the rows per group asked for (below batch_size: an out-of-memory retry)

    def pin_memory(self) -> "PreparedBatch":
        """Called by the DataLoader's pinning thread on a GPU run: page-locked tensors copy asynchronously."""
        segments = self.segments.pin_memory() if self.segments is not None else None
        groups = [_pinned(g) for g in self.groups] if self.groups else None
        return PreparedBatch(self.rows, _pinned(self.inputs), segments, groups, self.group_size)


class RowRunner:
    """Runs the model on batches of rows for one setting (scoring or generative).

    ``prepare(rows)`` does the host work of a batch (image decoding, square resize, processor,
    image spans; no device involved); ``score_batch`` does the device work of a prepared batch (or
    of plain row indices, prepared on the spot), ``generate_chunks`` that of a stream of them
    (``generate_batch``: of one).
    """

    def __init__(self, adapter, settings: InferenceSettings, bench: dict, plan: RowPlan,
                 paths: dict[int, str], digests: dict[int, str | None] | None = None) -> None:
        self.adapter, self.s, self.bench, self.plan = adapter, settings, bench, plan
        self.n = int(bench["n_candidates"])
        self.ids = identifiers(settings.identifiers, self.n)
        self._image = lru_cache(maxsize=512)(self._load_image)
        self._paths = paths
        self._digests = digests or {}
        self.generative = settings.variant.generative
        from .decode import DecodeStats
        #: counts of the decode loop, and the token slots ``generate`` computed (the benchmark reads both)
        self.decode_stats, self.generate_slots = DecodeStats(), 0
        self.decoder = None                     # the decode loop of the stream running now (its progress)
        #: why this model generates through transformers' generate instead (None: the decode loop)
        self.generate_reason: str | None = None
        #: --decode static: the KV ring and compiled step of the previous step, kept for the next
        self.ring = None
        if not self.generative:
            self.trie = IdentifierTrie.build(self.ids, identifier_encoder(adapter.tokenizer), adapter.end_of_turn_id)
            self.nodes = self.trie.nodes_needing_logits(settings.score_mode)
            # the only logit columns the scores read, per trie node (gathered on the device)
            self.node_tokens = {node: list(self.trie.valid_next[node]) for node in self.nodes}
            self._node_tensors: dict = {}           # by device: node_tensors

    def _load_image(self, image_id: int):
        from PIL import Image

        from ladbench.models.base import resize_square
        path = self._paths[image_id]
        try:
            with read_image(path, self._digests.get(image_id), self.s.images) as im:
                return resize_square(im, self.s.image_size)
        except (AnnotationError, FileNotFoundError):        # changed or missing: its own line
            raise
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:  # what PIL raises
            raise ValueError(f"{path}: cannot read image {image_id} ({exc}); restore the file (it was readable when "
                             "the features were computed), or rebuild the features and benchmarks without it "
                             "(`ladbench features --skip-bad-images`)") from None

    def _row_inputs(self, r: int) -> tuple[str, list]:
        split = "eval" if self.plan.split[r] == 0 else "calibration"
        inst = self.bench[split][int(self.plan.instance[r])]
        shown = [int(inst["candidates"][j]) for j in self.plan.order[r]]
        text = self.adapter.chat_text(prompt_text(self.s.prompt, self.n, inst["caption"], self.s.identifiers), self.n)
        return text, [self._image(i) for i in shown]

    def encode_rows(self, rows: Sequence[int]) -> dict:
        """Model inputs of a batch of rows on the device (images in each row's order, prompt, left padding)."""
        texts, images = zip(*(self._row_inputs(r) for r in rows))
        return self.adapter.encode(list(texts), list(images))

    def grouped_by_length(self, rows: Sequence[int], chunk_size: int) -> list[int]:
        """``rows`` with each chunk's rows sorted by prompt length, so a batch pads less. Chunks
        keep their rows (what a kill can lose does not change). Every image of a study has the
        same square size, hence the same number of tokens: the text decides the length."""
        def length(r: int) -> int:
            split = "eval" if self.plan.split[r] == 0 else "calibration"
            caption = self.bench[split][int(self.plan.instance[r])]["caption"]
            text = prompt_text(self.s.prompt, self.n, caption, self.s.identifiers)
            return len(self.adapter.tokenizer(text, add_special_tokens=False)["input_ids"])
        rows = [int(r) for r in rows]
        return [r for c0 in range(0, len(rows), chunk_size) for r in sorted(rows[c0:c0 + chunk_size], key=length)]

    def _decided(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """A prefill's host-made inputs with the host's decisions (padding, where the image
        features go), or without them where ``decide_on_host`` is false (transformers then reads
        them back from the device, for comparison)."""
        if self.s.decide_on_host:
            return inputs
        from ladbench.models.base import without_host_decisions
        return without_host_decisions(inputs)

    def prepare(self, rows: Sequence[int], group_size: int | None = None) -> PreparedBatch:
        """The host part of a batch (runs in DataLoader workers): inputs and token segments; a
        generative variant's rows in groups of ``group_size`` (default: the batch size)."""
        import torch
        texts, images = zip(*(self._row_inputs(r) for r in rows))
        if self.generative:           # groups of batch_size rows, each prefilled once (generate_chunks)
            size = group_size or self.s.batch_size
            groups = [self._decided(self.adapter.encode_on_host(list(texts[i:i + size]), list(images[i:i + size]),
                                                                for_prefill=True))
                      for i in range(0, len(texts), size)]
            return PreparedBatch([int(r) for r in rows], {}, groups=groups, group_size=size)
        inputs, row_spans = self.adapter.encode_with_spans(list(texts), list(images), for_prefill=True)
        inputs = self._decided(inputs)
        batch = PreparedBatch([int(r) for r in rows], inputs)
        ids, mask = inputs["input_ids"].numpy(), inputs["attention_mask"].numpy()
        segs = []
        for b, (r, spans) in enumerate(zip(rows, row_spans)):
            if len(spans) != self.n:
                raise RuntimeError(f"row {r}: found {len(spans)} image spans in the prompt, expected {self.n}")
            segs.append(segment_ids(ids[b], mask[b], spans, self.n))
        batch.segments = torch.from_numpy(np.stack(segs))
        return batch

    @property
    def samples(self) -> int:
        """Replies per row: the variant's samples (self-consistency), else 1."""
        return self.s.variant.samples_per_row(self.s.options)

    def _prepared(self, batch: Sequence[int] | PreparedBatch) -> PreparedBatch:
        return batch if isinstance(batch, PreparedBatch) else self.prepare(batch)

    def score_batch(self, batch: Sequence[int] | PreparedBatch) -> dict[str, np.ndarray]:
        """Scores and attention of a batch of rows (one prefill + trie continuations):
        :meth:`launch_scores`, then :meth:`finish_scores`."""
        return self.finish_scores(self.launch_scores(batch))

    def launch_scores(self, batch: Sequence[int] | PreparedBatch) -> LaunchedScores:
        """The device work of a batch, queued: everything stays on the device until the batch is
        done; then ONE device-to-host copy (:class:`HostCopy`) of the attention masses and the
        logit columns the scores need, started, not waited for (on a GPU the host goes on)."""
        from ladbench.models.attention import LastRowCapture
        ad, n = self.adapter, self.n
        batch = self._prepared(batch)
        inputs = ad.to_device(batch.inputs, for_prefill=True)
        seg = batch.segments.to(ad.device, non_blocking=True)
        modules = ad.attention_modules()
        hook = self.s.variant.prefill_hook           # e.g. SoFA's attention masks
        prefill_ctx = hook(ad, inputs, modules, self.s.options) if hook else contextlib.nullcontext()
        with self.attention_backends():
            with LastRowCapture(modules, seg, n + 2) as cap, prefill_ctx:
                logits, state = ad.prefill(inputs, use_cache=len(self.nodes) > 1 or self.s.greedy_reply)
            on_device = {"mass": cap.masses()}                               # [B, L, H, N + 2]
            if cap.applied_windows() != ad.attention_windows():    # the cache's attention_windows is what ran
                raise RuntimeError(f"the attention kernels applied sliding windows {cap.applied_windows()}, not the "
                                   f"{ad.attention_windows()} the model's adapter states")
            columns, paths = self.node_tensors(logits.device)
            for i, node in enumerate(self.nodes):
                node_logits = logits if i == 0 else ad.continue_logits(state, paths[node].repeat(len(logits), 1))
                on_device[node] = node_logits[:, columns[node]]
            if self.s.greedy_reply:       # the reference's Vanilla readout (greedy.py); ids are exact in float32
                on_device["greedy"] = greedy_reply_tokens(ad, logits, state, inputs)
        return LaunchedScores(len(batch.rows), int(logits.shape[-1]), HostCopy(on_device))

    def attention_backends(self) -> contextlib.AbstractContextManager:
        """SDPA's kernels for the model's work (``cudnn_attention``: models/kernels.attention_backends)."""
        from ladbench.models.kernels import attention_backends
        return attention_backends(self.s.cudnn_attention)

    def node_tensors(self, device) -> tuple[dict, dict]:
        """The trie nodes' logit columns and token paths ([1, k]) as tensors on ``device``, made
        once per device: indexing with a list, or ``torch.tensor`` of one, is a copy from pageable
        host memory that a GPU makes the host wait for (the H200 profile of 2026-11-27: one per
        batch, which held the host until the prefill had finished; it then launched the greedy
        reply's continuation to an idle GPU)."""
        import torch
        if device not in self._node_tensors:
            self._node_tensors[device] = (
                {node: torch.as_tensor(cols, dtype=torch.long).to(device) for node, cols in self.node_tokens.items()},
                {node: torch.as_tensor([node], dtype=torch.long).to(device) for node in self.nodes if node})
        return self._node_tensors[device]

    def finish_scores(self, launched: LaunchedScores) -> dict[str, np.ndarray]:
        """A launched batch's results on the host (waits for its copy), scored."""
        n, host = self.n, launched.copy.wait()
        logits_at = {}
        for node in self.nodes:                 # full-width rows, NaN where the scores never read
            full = np.full((launched.rows, launched.vocab), np.nan, dtype=np.float32)
            full[:, self.node_tokens[node]] = host[node]
            logits_at[node] = full
        mass = host["mass"]
        head_mass = mass[..., :n]
        out = {"scores": trie_scores(self.trie, logits_at, self.s.score_mode).astype(np.float32),
               "attn": head_mass.mean(axis=2).astype(np.float32),
               "attn_text": mass[..., n].mean(axis=2).astype(np.float32)}
        if self.s.store_head_attention:
            out["attn_heads"] = head_mass.astype(np.float16)
        if "greedy" in host:
            out.update(greedy_outputs(self.adapter, host["greedy"].astype(np.int64)))
        return out

    def generate_batch(self, batch: Sequence[int] | PreparedBatch) -> dict[str, np.ndarray]:
        """Replies and parsed answers of the rows of one step (:meth:`generate_chunks` of it alone)."""
        [(_, out)] = list(self.generate_chunks([self._prepared(batch)]))
        return out

    def generate_chunks(self, batches: Iterable[PreparedBatch]) -> Iterator[tuple[PreparedBatch, dict[str, np.ndarray]]]:
        """Replies and parsed answers of each prepared step (a chunk of the cache, in groups of the
        batch size), yielded as soon as all its rows have ended (not always in the order read). A
        greedy variant (CoT): one reply per row. A sampled one (self-consistency): S samples per
        row, each drawn with its own key (sampling.py), so the samples do not depend on the batch
        size, chunking or shards; the answer is their majority vote.

        The decode loop (``decode.py``) prefills each group of ``batch_size`` rows once and keeps
        ``decode_slots`` sequences in flight (:func:`decode_sequences`), across groups and steps:
        it reads the next step when a slot frees up, so the batch drains once, after the last
        step. ``--decode generate`` (or a generation config with options only ``generate``
        applies, or a cache transformers cannot repeat per sample) runs ``generate`` per group
        instead (:meth:`_generate_groups`; the same replies on the CPU in float32)."""
        from .decode import unreproduced_options
        batches = iter(batches)
        if self.s.decode != "generate" and self.generate_reason is None:
            skipped = unreproduced_options(self.adapter)
            self.generate_reason = f"its generation config sets {', '.join(skipped)}" if skipped else None
        # (held across the yields: the stage writes the replies between them, on the host)
        with self.attention_backends():
            if self.s.decode != "generate" and self.generate_reason is None:
                unfinished = yield from self._decode_chunks(batches)
                if self.generate_reason:
                    log.warning("generating through transformers' generate: %s", self.generate_reason)
                batches = itertools.chain(unfinished, batches)
            for batch in batches:
                yield batch, self._generated(batch.rows, *self._generate_groups(batch.rows, batch.group_size))

    def _sequence_keys(self, rows: Sequence[int]):
        """The sampling keys of the rows' sequences, row-major (None: a greedy variant)."""
        import torch

        from .sampling import sequence_keys
        if not self.s.variant.sampled:
            return None
        return sequence_keys(self.s.seed, torch.as_tensor(np.asarray(rows, dtype=np.int64) + self.plan.first_row),
                             self.samples)

    def _decode_chunks(self, batches: Iterator[PreparedBatch]):
        """:meth:`generate_chunks` through one decode loop over the rows of every step read. Returns
        the steps read but not yielded when the loop cannot serve the model's cache (an
        :class:`~.decode.UnrepeatableCache`, found at the first prefill; ``generate_reason`` set)."""
        from . import decode as decoding
        from .sampling import KeyedSampler
        first = next(batches, None)
        if first is None:
            return []
        s, options, samples = self.s, self.s.options, self.samples
        rows: list[int] = []                     # the plan row of each row the loop has read, in order
        starts: list[int] = []                   # the loop's number of the first row of each step read
        steps: dict[int, PreparedBatch] = {}     # the steps read and not yet yielded, by their first row
        ended: dict[int, list[list[int]]] = {}   # replies of the rows that have ended, by the loop's number

        def groups():
            for batch in itertools.chain([first], batches):
                starts.append(len(rows))
                steps[len(rows)] = batch
                rows.extend(batch.rows)
                yield from batch.groups

        def sample_keys(first_row: int, count: int):
            return self._sequence_keys(rows[first_row:first_row + count])

        sampler = KeyedSampler(None, 0, options.temperature, options.top_k) if s.variant.sampled else None
        decoder = decoding.SlotDecoder(
            self.adapter, samples=samples,
            # the groups' size asked for (halved by an out-of-memory retry), not a short first step's rows
            slots=decode_sequences(samples, s.batch_size, s.decode_slots, gpu=self.adapter.device.type == "cuda",
                                   group_rows=first.group_size),
            max_new_tokens=options.max_new_tokens, sample_keys=sample_keys if sampler else None,
            draw=sampler.draw if sampler else lambda scores, _keys, _steps: scores.argmax(-1),
            static=s.decode in RING_WAYS, graphs=s.decode == "graphs",
            compile_options=decoding.static_compile_options(self.adapter.device) if s.decode == "static" else None,
            ring=self.ring)
        self.decoder = decoder
        try:
            for row, replies in decoder.stream(groups()):
                ended[row] = replies
                start = starts[bisect.bisect_right(starts, row) - 1]
                batch = steps[start]
                if all(r in ended for r in range(start, start + len(batch.rows))):
                    del steps[start]
                    done = [reply for r in range(start, start + len(batch.rows)) for reply in ended.pop(r)]
                    texts = self.adapter.tokenizer.batch_decode(done, skip_special_tokens=True)
                    yield batch, self._generated(batch.rows, texts, [len(reply) for reply in done])
        except decoding.UnrepeatableCache as exc:
            self.generate_reason, self.decoder = str(exc), None      # (generate's path has no loop to report)
            return list(steps.values())
        except BaseException:
            self.ring = None            # (out of memory: its buffers go with the failed step's)
            raise
        self.decode_stats.add(decoder.stats)
        self.ring = decoder.ring            # its buffers and compiled step serve the next stage's run
        return []

    def _generated(self, rows: Sequence[int], texts: list[str], counts: list[int]) -> dict[str, np.ndarray]:
        """A step's results from its replies (row-major: row, sample) and their token counts."""
        entry, s, samples = self.s.variant, self.s, self.samples
        texts = np.array(texts, dtype=object).reshape(len(rows), samples)
        parsed = np.array([[entry.parse(t, self.n, s.identifiers) for t in row] for row in texts], np.int16)
        n_generated = np.asarray(counts, dtype=np.int32).reshape(len(rows), samples).sum(-1).astype(np.int32)
        if not entry.sampled:
            return {"text": texts[:, 0], "parsed": parsed[:, 0], "n_generated": n_generated}
        return {"text": texts, "parsed": np.array([majority_vote(row) for row in parsed], dtype=np.int16),
                "sample_parsed": parsed, "n_generated": n_generated}

    def _generate_groups(self, rows: list[int], group_size: int) -> tuple[list[str], list[int]]:
        """The replies through transformers' ``generate``, one call per group of rows, each of a row's S
        samples encoded as its own row (the path the decode loop replaced, at its cost: S vision passes
        and prefills per row; the reference of its tests and of the generation benchmark).

        Not ``num_return_sequences=S``: transformers 4.53 expands every input along dim 0, which
        repeats each IMAGE S times rather than each row's images, so the samples of InternVL,
        LLaVA-OneVision and LLaVA-OV-1.5 prompts were given other rows' images (Qwen2.5-VL's own
        expansion is right, and equals this)."""
        from .sampling import KeyedSampler
        options, samples, keys, texts, counts = self.s.options, self.samples, self._sequence_keys(rows), [], []
        for first in range(0, len(rows), group_size):
            prompts, images = zip(*(self._row_inputs(r) for r in rows[first:first + group_size]))
            inputs = self.adapter.encode([t for t in prompts for _ in range(samples)],
                                         [im for im in images for _ in range(samples)])
            size = inputs["input_ids"].shape[0]
            if keys is None:
                kwargs: dict[str, Any] = dict(do_sample=False)
            else:
                # The sampler leaves one finite logit per sequence: transformers' own sampling then
                # takes it whatever its warpers (disabled here) would do.
                sampler = KeyedSampler(keys[first * samples:first * samples + size],
                                       prompt_length=inputs["input_ids"].shape[1], temperature=options.temperature,
                                       top_k=options.top_k)
                kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, logits_processor=[sampler])
            group_texts, group_counts = self.adapter.generate(inputs, max_new_tokens=options.max_new_tokens, **kwargs)
            texts += group_texts
            counts += group_counts.cpu().tolist()
            self.generate_slots += size * int(group_counts.max())
        return texts, counts


class HostCopy:
    """Device tensors on their way to the host as float32: ONE copy of them all, flattened (one
    sync per batch). On a GPU the copy goes into page-locked memory without blocking and
    :meth:`wait` waits for it (an event), so the host can queue more work first; elsewhere it
    is made at once."""

    def __init__(self, tensors: dict[Any, "torch.Tensor"]) -> None:
        import torch
        self.shapes = {key: tuple(t.shape) for key, t in tensors.items()}
        self.flat = torch.cat([t.float().reshape(-1) for t in tensors.values()])
        self.done = None
        if self.flat.device.type == "cuda":
            self.host = torch.empty(self.flat.shape, dtype=self.flat.dtype, pin_memory=True)
            with torch.cuda.device(self.flat.device):         # the copy's stream is that device's
                self.host.copy_(self.flat, non_blocking=True)
                self.done = torch.cuda.Event()
                self.done.record()
        else:
            self.host = self.flat.cpu()

    def wait(self) -> dict[Any, np.ndarray]:
        if self.done is not None:
            self.done.synchronize()
        flat, out, start = self.host.numpy(), {}, 0
        for key, shape in self.shapes.items():
            size = int(np.prod(shape, dtype=np.int64))
            out[key] = flat[start:start + size].reshape(shape)
            start += size
        self.flat = None                                   # the device's copy, free now
        return out


@dataclass
class LaunchedScores:
    """A scoring batch whose device work is queued (:meth:`RowRunner.launch_scores`)."""

    rows: int                   # rows of the batch
    vocab: int                  # width of the model's logits
    copy: HostCopy


# --------------------------------------------------------------------------- driver
def _peak_memory(writer: CacheWriter, device: str) -> dict[str, float]:
    """Peak CPU RSS and CUDA memory (MB) of this run, or of an earlier run of the same cache
    if higher (one that ended and recorded its peak; a killed run records none)."""
    import torch
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0            # Linux: KiB
    cuda = torch.cuda.max_memory_allocated() / 2 ** 20 if device.startswith("cuda") else float("nan")
    return {"peak_rss_mb": float(np.nanmax([rss, writer.attr("peak_rss_mb", np.nan)])),
            "peak_cuda_mb": float(np.fmax(cuda, writer.attr("peak_cuda_mb", np.nan)))}


class _Batches:
    """A map-style dataset whose item i is ``prepare(batches[i])``: the DataLoader's workers run it."""

    def __init__(self, prepare: Callable[[Sequence[int]], PreparedBatch], batches: list[list[int]]) -> None:
        self.prepare, self.batches = prepare, batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> PreparedBatch:
        return self.prepare(self.batches[i])


def _pinned(inputs: dict[str, Any]) -> dict[str, Any]:
    """The tensors of ``inputs`` in pinned memory; other values (a processor's per-image lists) as they are."""
    import torch
    return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def prepared_batches(prepare: Callable[[Sequence[int]], PreparedBatch], batches: list[list[int]], *,
                     workers: int, pin_memory: bool) -> Iterator[PreparedBatch]:
    """``prepare(batch)`` for each batch, in order, computed ahead by ``workers`` DataLoader
    workers (0: inline) so that the device step of batch k overlaps the preparation of k + 1."""
    import multiprocessing

    from torch.utils.data import DataLoader
    options: dict[str, Any] = {}
    if workers:
        # fork: workers inherit the loaded processor instead of unpickling the adapter and its model
        fork = "fork" in multiprocessing.get_all_start_methods()
        options = dict(prefetch_factor=4, multiprocessing_context="fork" if fork else None)
    return iter(DataLoader(_Batches(prepare, batches), batch_size=None, shuffle=False, num_workers=workers,
                           pin_memory=pin_memory, **options))


def is_out_of_memory(exc: BaseException) -> bool:
    import torch
    return isinstance(exc, torch.cuda.OutOfMemoryError)


#: What :func:`run_batches` runs: prepared steps in (read as far as it needs), and each step
#: with its results out, when they are ready (in the order read or not).
Stream = Callable[[Iterator[PreparedBatch]], Iterable[tuple[PreparedBatch, dict[str, np.ndarray]]]]


def launched_stream(launch: Callable[[PreparedBatch], Any], finish: Callable[[Any], dict[str, np.ndarray]], *,
                    ahead: bool = True) -> Stream:
    """The :data:`Stream` of a step in two halves (scoring: :meth:`RowRunner.launch_scores`, then
    :meth:`RowRunner.finish_scores`). ``ahead``: one batch ahead, batch k + 1 launched before batch
    k is finished, so that on a GPU the device runs k + 1 while the host waits for k's results,
    scores them, writes them and takes the next prepared batch (one batch at a time, the device
    idles through all of that). Results come in order; every batch's computation is its own, so
    they are the same either way. A launch that fails (out of memory) first hands over the batch
    launched before it, so that a retry redoes only the failed batch's rows."""
    def stream(batches: Iterator[PreparedBatch]) -> Iterator[tuple[PreparedBatch, dict[str, np.ndarray]]]:
        pending = None
        for batch in batches:
            try:
                launched = launch(batch)
            except Exception:
                if pending is not None:
                    yield pending[0], finish(pending[1])
                raise
            if pending is not None:
                yield pending[0], finish(pending[1])
                pending = None
            if ahead:
                pending = (batch, launched)
            else:
                yield batch, finish(launched)
        if pending is not None:
            yield pending[0], finish(pending[1])
    return stream


def run_batches(stream: Stream, prepare: Callable[[Sequence[int]], PreparedBatch], rows: Sequence[int], *,
                batch_size: int, chunk_size: int, workers: int, pin_memory: bool,
                write: Callable[[list[int], dict[str, np.ndarray]], None],
                batch_done: Callable[[int], None] | None = None, grouped: bool = False) -> int:
    """Run ``stream`` over ``rows`` in batches and ``write`` each chunk of ``chunk_size`` rows as
    soon as all its rows have their results.

    Batches never straddle a chunk. A batch whose step runs out of GPU memory is not lost: the
    batch size halves (down to 1, where the error is final) and the preparation restarts from
    the rows not written yet. Each row's ``seconds`` is the wall time between results divided
    by their rows (so preparation that the workers did not hide is counted). ``batch_done(rows)``
    follows each batch that ran (the progress bar). Returns the batch size in use at the end
    (the largest that ran without running out of memory).

    ``grouped`` (generation): a step is a whole chunk in groups of ``batch_size`` rows,
    ``prepare(rows, group_size)`` makes the groups, the stream may yield chunks later and in
    another order than it read them (the decode loop runs on across chunks), and running out of
    memory halves the groups (the sequences in flight).
    """
    chunks = [list(rows[i:i + chunk_size]) for i in range(0, len(rows), chunk_size)]
    chunk_of = {row: c for c, chunk in enumerate(chunks) for row in chunk}
    parts: list[list | None] = [[] for _ in chunks]      # each chunk's finished batches (None: written)
    done = [0] * len(chunks)                             # rows of each chunk with results (leading ones)
    while any(part is not None for part in parts):
        step_rows = chunk_size if grouped else batch_size
        batches = [chunk[start:start + step_rows] for c, chunk in enumerate(chunks) if parts[c] is not None
                   for start in range(done[c], len(chunk), step_rows)]
        in_groups = partial(prepare, group_size=batch_size) if grouped else prepare
        tick = time.perf_counter()
        try:
            for prepared, part in stream(prepared_batches(in_groups, batches, workers=workers, pin_memory=pin_memory)):
                now = time.perf_counter()
                part["seconds"] = np.full(len(prepared.rows), (now - tick) / len(prepared.rows), np.float32)
                tick = now
                c = chunk_of[prepared.rows[0]]
                parts[c].append((prepared.rows, part))
                done[c] += len(prepared.rows)
                if batch_done is not None:
                    batch_done(len(prepared.rows))
                if done[c] == len(chunks[c]):
                    write([row for batch_rows, _ in parts[c] for row in batch_rows],
                          {k: np.concatenate([p[k] for _, p in parts[c]]) for k in parts[c][0][1]})
                    parts[c] = None
        except Exception as exc:                       # noqa: BLE001 (only out-of-memory is handled)
            if not is_out_of_memory(exc) or batch_size == 1:
                raise
            first = next(c for c, part in enumerate(parts) if part is not None)
            batch_size = max(1, min(batch_size, len(chunks[first]) - done[first]) // 2)
            log.warning("a batch ran out of GPU memory; retrying its rows with batch size %d", batch_size)
        if any(part is not None for part in parts):   # out of memory: the failed batch's tensors are freed now, return them to CUDA
            _release_cached_memory()
    return batch_size


def _release_cached_memory() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_inference(settings: InferenceSettings) -> str:
    """Run (or resume, or skip when complete) the ``infer`` stage; returns the cache path.
    One process at a time writes a cache: a second one refuses at once, naming the first."""
    from ladbench.hdf5 import writing

    settings.validate()
    with writing(settings.out, "inference cache"):
        return _run_inference(settings)


def _run_inference(settings: InferenceSettings) -> str:
    from ladbench.hdf5 import discard_work
    from ladbench.models.base import resolve_device
    settings.device = resolve_device(settings.device)        # hashed resolved: a CPU run never resumes a GPU one
    bench = load_benchmark(settings.benchmark)
    table = load_image_table(settings.images)
    paths = image_paths(table)
    check_benchmark(bench, settings.benchmark, paths)
    check_benchmark_table(settings.benchmark, bench, settings.images, table)
    n = int(bench["n_candidates"])
    entry = settings.variant
    plan = plan_rows(bench, shifts_per_ordering=entry.shifts_per_ordering)
    digest = config_sha256(settings, settings.benchmark, table)
    plan, digest, shard_attrs = select_shard(plan, digest, settings.shard_index, settings.shard_count)

    if is_complete_for(settings.out, digest):
        log.info("%s is complete for these inputs; nothing to do", settings.out)
        discard_work(settings.out)
        _refresh_names(settings)
        return settings.out

    from ladbench.models import load_adapter
    device = settings.device
    adapter = load_adapter(settings.family, settings.model_path, revision=settings.revision, dtype=settings.dtype,
                           device=device, trust_remote_code=settings.trust_remote_code, vision=settings.vision_tower,
                           chat_template=settings.chat_template)
    adapter.apply_settings(settings)
    generative = entry.generative
    layout = CacheLayout(n_candidates=n, n_layers=adapter.n_layers, n_heads=adapter.n_heads,
                         store_heads=settings.store_head_attention, generative=generative,
                         greedy=settings.greedy_reply and not generative,
                         n_samples=entry.samples_per_row(settings.options))
    from ladbench.provenance import model_kind
    attrs = {"model": settings.model_name, "model_path": settings.model_path, "revision": settings.revision or "",
             "model_kind": model_kind(settings.model_path),
             "family": settings.family, "variant": settings.prompt, "variant_name": _variant_name(settings),
             "n_candidates": n,
             "n_layers": adapter.n_layers, "n_heads": adapter.n_heads, "identifiers": settings.identifiers,
             "score_mode": settings.score_mode, "prompt_sha256": prompt_sha256(settings.prompt, n, settings.identifiers),
             "config_sha256": digest, "settings": settings.hashed_fields(), "versions": library_versions(),
             "device": device, "dtype": str(adapter.model.dtype).replace("torch.", ""),
             "benchmark": os.path.abspath(settings.benchmark), "benchmark_sha256": file_digest(settings.benchmark),
             "benchmark_name": f"{bench.get('dataset')}_{bench.get('setting')}_N{n}",
             "calibration_source": bench.get("calibration_source", "pool"),  # read by calibrate / analyze
             **shard_attrs}
    attention_layers = getattr(adapter, "attention_layers", None)
    if attention_layers and len(attention_layers) < len(adapter.decoder_layers()):     # a hybrid decoder
        attrs["attention_layers"] = list(attention_layers)
    windows = adapter.attention_windows()
    if any(windows):        # only then: the caches of models without windows keep their attributes (and digests)
        attrs["attention_windows"] = windows
    if settings.greedy_reply and not generative:
        attrs.update(greedy_repetition_penalty=repetition_penalty(adapter), greedy_stop_ids=adapter.end_token_ids())
    attrs.update(entry.hashed_settings(settings.options))      # the variant's own settings, e.g. sofa_sigma
    writer = CacheWriter.open(settings.out, plan, layout, attrs)
    pending = writer.pending_rows()
    if 0 < len(pending) < len(plan):
        log.info("%s: resuming, %d of %d rows already done", writer.path, len(plan) - len(pending), len(plan))
    if settings.limit_rows is not None:
        pending = pending[: settings.limit_rows]
    runner = RowRunner(adapter, settings, bench, plan, paths, digests=image_digests(table))
    # generation: a step is a whole chunk (groups of batch_size rows), streamed through one decode loop
    stream = runner.generate_chunks if generative else launched_stream(runner.launch_scores, runner.finish_scores,
                                                                        ahead=settings.score_ahead)
    if settings.group_by_length or generative:      # generation pads (and waits) for the longest prompt
        pending = runner.grouped_by_length(pending, settings.chunk_size)

    started = time.perf_counter()
    # generation: the tokens so far and the KV store's memory beside the rows (a long job's, bounded)
    note = (lambda: runner.decoder.progress_note() if runner.decoder is not None else "") if generative else None
    with progress_bar(len(pending), unit="row", desc=f"infer {settings.model_name}/{settings.prompt}", note=note) as bar:
        used = run_batches(stream, runner.prepare, pending, batch_size=settings.batch_size, grouped=generative,
                           chunk_size=settings.chunk_size, workers=settings.loader_workers(),
                           pin_memory=device.startswith("cuda"), write=writer.write,
                           batch_done=bar.advance)
    done_now = len(pending)
    final = {**writer.throughput(), **_peak_memory(writer, device),
             "last_run_rows": done_now, "last_run_s": time.perf_counter() - started,
             "batch_size_used": min(used, settings.batch_size) if len(pending) else writer.attr("batch_size_used", settings.batch_size)}
    if len(writer.pending_rows()):
        writer.set_attrs(final)
        log.warning("%s: stopped after %d rows (--limit-rows); run again to continue", writer.path, done_now)
    else:
        writer.finish(final)
    return settings.out


def _variant_name(settings: InferenceSettings) -> str:
    return settings.variant_name or settings.prompt


def _refresh_names(settings: InferenceSettings) -> None:
    """A complete cache is kept, but the names it records (not hashed: they change no number)
    follow the config's, so a cache made before ``variant_name`` was recorded gains it. The
    cache is checked first and its attributes' digest recorded again after."""
    from ladbench.hdf5 import open_h5, resign_attributes, write_attrs

    from .cache import read_cache_attributes
    names = {"model": settings.model_name, "variant_name": _variant_name(settings)}
    recorded = read_cache_attributes(settings.out)
    stale = {key: value for key, value in names.items() if recorded.get(key) != value}
    if stale:                                       # else untouched (not even opened for writing)
        with atomic_path(settings.out) as tmp:      # a copy renamed over it: a kill leaves one or the other
            shutil.copyfile(settings.out, tmp)
            with open_h5(tmp, "a") as f:
                write_attrs(f, stale)
                resign_attributes(f)
