"""The one decode loop of the generative variants (CoT, self-consistency), every family, both lanes.

What ``generate(num_return_sequences=S)`` did per batch of rows, and what this loop does instead:

* **one vision pass and one prefill per row**: the rows are prefilled once (in groups of the
  batch size); a row's S samples continue from its prefilled KV cache, repeated in the cache
  (rows of the cache selected S times), with its position state (the position of its next token,
  1-D or multi-axis RoPE alike, ``ModelAdapter.decode_positions``) carried along;
* **a full batch**: at most ``slots`` sequences are in flight (``inference.decode_slots``: by
  default the prefill group's on the CPU, at least 64 on a GPU, so there the sequences of several
  groups decode together); a sequence that ends leaves the batch at once and the next pending
  sequence takes its place (its row prefilled when it is first needed, its cache joined to the
  batch's by left padding; each row's next position is tracked explicitly, so padding moves no
  position; the leading columns no sequence in flight needs are cut off after each step, so the
  cache is as wide as the longest sequence in flight, not wider by a column per step of the
  stream). The sequences in flight live in a :class:`Slab`, preallocated KV buffers where a
  step's position is written in place, a sequence that ends hands its row to one of the last
  rows, and a newcomer is written into free rows: transformers' dynamic cache copied every
  sequence's whole cache at every step (its append concatenates) and again at every cut and
  join, the slab only the rows that move. The batch stays full from one chunk of the cache to
  the next: the stage streams the rows of all its chunks through one loop
  (:meth:`SlotDecoder.stream`, ``RowRunner.generate_chunks``) and writes a chunk as soon as its
  rows have ended, so the batch drains once per job, not once per chunk;
* **one host sync per decode step**: the step's drawn tokens, their "ended" flags and the first
  cache column still needed come back in one copy; drawing, dropping, joining and the forward
  pass read nothing else from the device.

Each sequence draws exactly what ``generate`` drew: greedy (CoT) takes the argmax; sampled
(SC) draws with :class:`~ladbench.inference.sampling.KeyedSampler` under its own key at its own
step (the number of tokens it has generated), after the model's repetition penalty where its
generation config has one (applied to the row's own tokens, as a batch of one). On the CPU in
float32 the replies equal ``generate``'s reply for reply (tests/test_generation.py).

transformers 5.x's ``generate_batch`` / ``ContinuousBatchingManager`` is not used: its requests
are token ids only (5.23: ``generate_batch(inputs: list[list[int]])``, ``add_request(input_ids:
list[int])``; no pixel values, no multi-axis positions), so it cannot serve these image inputs;
both lanes run this loop. Caches that are not plain full-attention layers (sliding
windows, linear attention: ``compat.plain_kv``) or models that take no position ids keep the
padded path inside the same loop: a group's sequences run together until all have ended
(finished ones fed the pad token, as ``generate`` does), then the next group starts; the loop
says so in one warning with the reason (:func:`padded_path_reason`).

**Static shapes** (``--decode static``, :class:`Ring`): the sequences in flight live in ``slots``
fixed slots of one preallocated KV buffer per layer, a ring of C columns that every slot writes
at the same column each step; a slot's mask covers the columns it holds (its prompt, copied in
when it is admitted, and its reply so far). Keys carry their rotary positions already and the
mask is explicit, so where in the ring a key sits changes nothing; a step's inputs (tokens
[S, 1], positions, mask [S, 1, 1, C], the column) have the same shapes every step, and the step
is compiled (``torch.compile``, CUDA graphs through its ``reduce-overhead`` mode on a GPU). No
cache is cut or joined: a sequence that ends frees its slot, the next one's prompt is copied into
it. C grows (the ring unrolled into a longer one, a new compilation) only when a prompt longer
than any before does not fit. Joinable caches only; the others keep the padded path. On an H200
(docs/performance.md) faster than ``slots``' first run, but its sampled bfloat16 replies are not ``generate``'s
where ``slots``' are, and which is faster in a long job is not settled: not the default.
``--decode graphs`` runs the same ring without compiling: on a GPU its eager step is captured
once per ring shape as a CUDA graph and replayed (:mod:`ladbench.inference.graphs`), the eager
step's kernels with one launch; on the CPU it is the eager ring, as ``static`` is there. Not yet
run on a GPU (``bench_inference.py --generation`` measures it there).
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from ladbench.models import attention, compat
from ladbench.models.base import not_full_attention

from . import graphs
from .greedy import penalty_applied, repetition_penalty

log = logging.getLogger(__name__)

#: generation-config options whose logits processors this loop does not reproduce; a model that
#: sets one generates through ``generate`` (``RowRunner``), which applies them
UNREPRODUCED_OPTIONS = ("no_repeat_ngram_size", "bad_words_ids", "min_length", "min_new_tokens", "suppress_tokens",
                        "begin_suppress_tokens", "sequence_bias", "forced_bos_token_id", "forced_eos_token_id",
                        "exponential_decay_length_penalty", "stop_strings", "guidance_scale")


def unreproduced_options(adapter) -> list[str]:
    """The options of the model's generation config that only ``generate`` applies (empty: the loop runs)."""
    config = getattr(adapter.model, "generation_config", None)
    return [name for name in UNREPRODUCED_OPTIONS if _is_set(name, getattr(config, name, None))]


def _is_set(name: str, value: Any) -> bool:
    """Whether a generation option is on: a token id is on unless None (0 is a token)."""
    return value is not None if name.endswith("_token_id") else value not in (None, 0, [], {}, 1.0)


def padded_path_reason(text_config: Any, positions: torch.Tensor | None, cache: Any) -> str | None:
    """Why the loop cannot cut or join this model's KV cache, so that its sequences take the padded
    path (None: it can). Cutting and joining need every decoder layer to attend to the whole
    sequence (a sliding window's cache is not the sequence), the cache to be plain keys and values
    per layer, and each sequence's position to be fed explicitly (padding must move none)."""
    if reason := not_full_attention(text_config):
        return reason
    if positions is None:
        return "it takes no position ids"
    if compat.plain_kv(cache) is None:
        return f"its cache ({type(cache).__name__}) is not plain keys and values per layer"
    return None


class PrefillClock:
    """The seconds a decode run spends in its prefills. On a GPU, CUDA events recorded around each
    prefill in stream order (no host sync) and read once the run has ended: a prefill's span is the
    stream's, from its first kernel's turn to its last one's end, gaps while the host launches
    included. Elsewhere the host's ``clock`` (a CPU's work is done when its call returns)."""

    def __init__(self, device: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        self.device, self.clock = torch.device(device), clock
        self.on_gpu = self.device.type == "cuda"
        self.spans: list[tuple[Any, Any]] = []      # the GPU's (start, end) events not read yet
        self.seconds = 0.0                          # the spans read, and the host's

    @contextlib.contextmanager
    def span(self) -> Iterator[None]:
        if not self.on_gpu:
            start = self.clock()
            yield
            self.seconds += self.clock() - start
            return
        stream = torch.cuda.current_stream(self.device)      # the model's GPU's, not the current device's
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        yield
        end.record(stream)
        self.spans.append((start, end))

    def total(self) -> float:
        """Every span's seconds so far (on a GPU, waiting for the last span's end: called when the
        run's last step has been read back, by then long past)."""
        for start, end in self.spans:
            end.synchronize()
            self.seconds += start.elapsed_time(end) / 1000.0
        self.spans = []
        return self.seconds


class UnrepeatableCache(ValueError):
    """A cache whose layers transformers cannot repeat per sample (5.x linear-attention layers):
    self-consistency then generates through ``generate`` (``RowRunner``)."""


#: the fields of :class:`DecodeStats` that are widths, not counts (runs added: the widest)
WIDTHS = ("slots", "ring_columns", "widest_cache")


@dataclass
class DecodeStats:
    """Counts of one or more decode runs (``bench_inference.py --generation``, tests)."""

    prefills: int = 0                 # prefill forward passes
    prefilled_rows: int = 0           # rows through them (each row once)
    prefilled_tokens: int = 0         # prompt positions through them (padding included)
    decode_steps: int = 0             # decode forward passes (one token per sequence in flight)
    decode_rows: int = 0              # sequences through them, summed over steps
    token_slots: int = 0              # tokens drawn, useful or not (a finished sequence kept in the batch)
    useful_tokens: int = 0            # tokens of the replies (end token included)
    slots: int = 0                    # the batch's capacity in sequences
    ring_columns: int = 0             # --decode static / graphs: the ring's columns (0: no ring ran)
    graph_captures: int = 0           # --decode graphs: the ring's steps captured as CUDA graphs (one a ring shape)
    widest_cache: int = 0             # the most cache columns a decode step attended (padding included)
    # KV cache positions (one sequence's keys and values at one token, every layer) copied after
    # they were computed: repeating a row per sample, admitting a sequence into the slab or a ring
    # slot, moving a row of the slab into one freed, laying the slab out anew, growing the ring, and
    # on the padded path the dynamic cache's append (transformers concatenates: the whole cache each
    # step); the token a step computes not counted
    kv_positions_copied: int = 0
    # KV cache positions the decode steps' attention read: each step, its sequences x the columns it
    # attends (padding, and a ring's columns no slot holds, included: a dense attention reads them all);
    # beside what the sequences hold (:func:`kv_positions_held`), the KV traffic a layout wastes
    kv_positions_read: int = 0
    kv_positions_held: int = 0
    # seconds of the prefills (vision included), on the device's clock (:class:`PrefillClock`): the
    # part of a run that grows with its rows, the rest with its decode steps (``ladbench plan``
    # prices a study's longer replies from the two apart)
    prefill_seconds: float = 0.0

    def useful_fraction(self) -> float:
        return self.useful_tokens / max(self.token_slots, 1)

    def occupancy(self) -> float:
        """Mean sequences per decode step over the capacity (1: the batch stayed full)."""
        return self.decode_rows / max(self.decode_steps * self.slots, 1)

    def kv_copies_per_token(self) -> float:
        """KV cache positions copied per reply token: memory traffic a GPU pays beside reading the
        weights (x the bytes a position holds: 36 KB for Qwen2.5-VL-3B in bfloat16)."""
        return self.kv_positions_copied / max(self.useful_tokens, 1)

    def kv_reads_per_token(self) -> float:
        """KV cache positions read per reply token: with the weights, the memory a GPU's decode step
        reads (x 36 KB a position for Qwen2.5-VL-3B in bfloat16, against about 6 GB of weights a step)."""
        return self.kv_positions_read / max(self.useful_tokens, 1)

    def kv_reads_held(self) -> float:
        """The share of the KV positions the decode steps read that their sequences hold (1: no
        padding, no unheld ring columns; the rest is memory traffic for nothing)."""
        return self.kv_positions_held / max(self.kv_positions_read, 1)

    def add(self, other: "DecodeStats") -> None:
        for name in self.__dataclass_fields__:
            if name not in WIDTHS:
                setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in WIDTHS:
            setattr(self, name, max(getattr(self, name), getattr(other, name)))


def host_lengths(mask: torch.Tensor) -> list[int]:
    """Each row's tokens in a padding mask [B, T], read where it is made, on the host (RowRunner.prepare);
    one on the device is read back (a host sync)."""
    return (mask.numpy() if mask.device.type == "cpu" else mask.cpu().numpy()).sum(1).tolist()


def kv_positions_held(prompt_lengths: Any, reply_lengths: Any) -> int:
    """The KV positions a decode loop's attention must read at the least: a sequence whose prompt
    holds P tokens and whose reply L (its end token included) is fed its first L - 1 tokens, the
    k-th attending P + k positions. ``prompt_lengths`` [R] (padding not counted), ``reply_lengths``
    [R] or [R, S] (S samples of a row share its prompt). :attr:`DecodeStats.kv_positions_read`
    over this: the share of a step's KV reads that padding or unheld columns cost."""
    fed = np.maximum(np.asarray(reply_lengths, dtype=np.int64) - 1, 0)
    prompt = np.asarray(prompt_lengths, dtype=np.int64).reshape(len(fed), *([1] * (fed.ndim - 1)))
    return int((fed * prompt + fed * (fed + 1) // 2).sum())


@dataclass
class Flight:
    """Sequences on the device, batch first (positions: batch at dim -2), and their host ids."""

    cache: Any
    mask: torch.Tensor                         # [B, T] padding mask of the cache (+ the token fed next)
    positions: torch.Tensor | None             # [..., B, 1] position of the token fed next
    logits: torch.Tensor                       # [B, V] what the next draw reads
    seen: torch.Tensor | None                  # [B, V] tokens the repetition penalty applies to
    seq: list[int] = field(default_factory=list)     # sequence index of each row
    keys: torch.Tensor | None = None           # [B] sampling keys
    steps: torch.Tensor | None = None          # [B] tokens generated so far (the draw's step)
    slab: "Slab | None" = None                 # the store ``cache`` reads (joinable caches in flight)

    def __len__(self) -> int:
        return len(self.seq)


def _index(tensor: torch.Tensor | None, idx: torch.Tensor, dim: int = 0) -> torch.Tensor | None:
    return None if tensor is None else tensor.index_select(dim, idx)


def device_index(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """A host list of indices on ``device``, copied from pinned memory without blocking: a
    pageable copy to a GPU waits for the stream, a second host sync in the step."""
    index = torch.tensor(list(values), dtype=torch.long)
    if device.type != "cuda":
        return index.to(device)
    return index.pin_memory().to(device, non_blocking=True)


def indices_on(values: Sequence[int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``at(tensor)``: :func:`device_index` of ``values`` on ``tensor``'s device, made once per
    device. A model spread over several GPUs (``gpus_per_job: 2``) keeps each layer's KV cache on
    that layer's GPU, and an index on another device than the tensor it selects from is refused."""
    made: dict[torch.device, torch.Tensor] = {}

    def at(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device not in made:
            made[tensor.device] = device_index(values, tensor.device)
        return made[tensor.device]
    return at


def take(flight: Flight, rows: Sequence[int], *, joinable: bool) -> Flight:
    """The given rows of ``flight`` (a row may repeat: a sample of the same prompt), in that order."""
    if list(rows) == list(range(len(flight))):
        # a new Flight over the same tensors: the caller sets its own ids, keys and steps, which
        # must not become those of the flight it was taken from (a parked row's later samples)
        return replace(flight, seq=list(flight.seq))
    at = indices_on(rows)
    idx = at(flight.mask)
    if flight.slab is not None:      # rows of a slab are arranged by Slab.cut, which gave ``rows``
        cache = flight.cache
    elif joinable:
        cache = compat.new_plain_cache([[k.index_select(0, at(k)), v.index_select(0, at(v))]
                                        for k, v in compat.plain_kv(flight.cache)])
    else:            # only a whole group, each row repeated equally (the padded path)
        repeats = len(rows) // len(flight)
        if list(rows) != [r for r in range(len(flight)) for _ in range(repeats)]:
            raise ValueError("a cache that cannot be cut takes whole groups only")
        cache = flight.cache
        if repeats > 1 and not all(hasattr(layer, "batch_repeat_interleave") for layer in getattr(cache, "layers", [])):
            raise UnrepeatableCache(f"{type(cache).__name__}'s layers cannot be repeated along the batch")
        cache.batch_repeat_interleave(repeats)
        if repeats > 1:
            _check_repeated(cache, len(rows))
    return Flight(cache, flight.mask.index_select(0, idx), _index(flight.positions, idx, -2),
                  flight.logits.index_select(0, idx), _index(flight.seen, idx),
                  [flight.seq[r] for r in rows], _index(flight.keys, idx), _index(flight.steps, idx), flight.slab)


def _check_repeated(cache: Any, batch: int) -> None:
    """Every tensor a cache layer holds has the repeated batch: a layer that keeps state of its
    own beyond transformers' generic repeat (Unlimited-OCR's prompt keys beside its window) would
    otherwise decode with another batch's size."""
    for layer in getattr(cache, "layers", []):
        for name, value in vars(layer).items():
            if isinstance(value, torch.Tensor) and value.dim() == 4 and value.shape[0] != batch:
                raise UnrepeatableCache(f"{type(layer).__name__}.{name} is not repeated along the batch by "
                                        "transformers' batch_repeat_interleave")


def first_needed_column(mask: torch.Tensor, staying: torch.Tensor) -> torch.Tensor:
    """The first cache column that a sequence staying in flight (``staying`` [B]) still attends to,
    [1] on the device (0 when none stays): the columns before it are padding of every such
    sequence. ``mask`` [B, T]: the columns each sequence holds."""
    return (mask.bool() & staying[:, None]).any(0).long().argmax().view(1)


def _left_pad(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - t.shape[dim]
    if not missing:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def join(a: Flight, b: Flight) -> Flight:
    """Both flights in one batch (a's rows first): ``b``'s sequences (a prefill's plain cache)
    written into ``a``'s slab, the narrower side left padded (masked out)."""
    a.slab.admit(b)
    if not len(a):
        return replace(b, cache=a.slab.cache, slab=a.slab)
    length = max(a.mask.shape[1], b.mask.shape[1])

    def cat(x, y, dim=0):
        return None if x is None else torch.cat([x, y], dim)
    return Flight(a.slab.cache, torch.cat([_left_pad(a.mask, length, 1), _left_pad(b.mask, length, 1)]),
                  cat(a.positions, b.positions, -2), torch.cat([a.logits, b.logits]), cat(a.seen, b.seen),
                  a.seq + b.seq, cat(a.keys, b.keys), torch.cat([a.steps, b.steps]), a.slab)


class Slab:
    """The KV store of the slots loop's sequences in flight (joinable caches): per layer one
    preallocated buffer of keys and one of values, [R, H, C, D] (R: the slots), whose rows
    [0, count) and columns [start, end) are the flight's cache. They hold the very values a
    concatenated cache of that width would, zero padding included, so the attention computes what
    it computed over transformers' dynamic cache; only the memory around them differs.

    What costs a copy of every sequence's whole cache in the dynamic cache costs little here: a
    decode step's new position is written at column ``end`` (nothing copied: transformers
    concatenates the whole cache to append it); a sequence that ends hands its row to one of the
    last rows (that row's columns copied, not every row's); a newcomer is written into the rows
    after the flight's, right-aligned at ``end``, its padding zeroed; a newcomer wider than the
    flight widens it to the left (the old rows' new columns zeroed: nothing moves); the leading
    columns no sequence needs any more are cut by moving ``start``. Everything in flight is copied
    only when the columns run out (:meth:`_lay_out`), and then with room for at least half as many
    steps as the flight is wide: at most about two positions per sequence and step.

    The attention gets strided views of the buffers. Where the device's SDPA does not read such
    views as it reads contiguous copies (:func:`read_views`, asked once per process; ``groups``:
    the model's query heads per KV head; ``view_read_error``: what it found), it gets contiguous
    copies of them instead, every layer and step, as transformers' concatenating cache gave it
    (``copies_views``; counted in the KV copies, and said in one warning).
    """

    def __init__(self, first: Flight, rows: int, stats: DecodeStats, groups: int = 1) -> None:
        self.rows, self.stats = rows, stats
        self.kv = [[k.new_zeros((rows, k.shape[1], 0, k.shape[-1])), v.new_zeros((rows, v.shape[1], 0, v.shape[-1]))]
                   for k, v in compat.plain_kv(first.cache)]
        self.count = self.start = self.end = 0
        self.view_read_error, self.copies_views = read_views(self.kv, groups)
        self.cache = compat.new_slab_cache(self)

    @property
    def width(self) -> int:
        return self.end - self.start

    @property
    def capacity(self) -> int:
        return self.kv[0][0].shape[-2]

    def append(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step's new position of every sequence in flight ([count, H, 1, D]) written at
        column ``end`` of ``layer``; returns the cache the attention reads, that position included
        (views). The caller has made room (:meth:`reserve`) and advances ``end`` after the step."""
        k, v = self.kv[layer]
        n, start, end = self.count, self.start, self.end
        k[:n, :, end:end + 1].copy_(keys)
        v[:n, :, end:end + 1].copy_(values)
        if self.copies_views:
            if layer == 0:                 # (a position: one sequence's keys and values in every layer)
                self.stats.kv_positions_copied += n * (end + 1 - start)
            return k[:n, :, start:end + 1].contiguous(), v[:n, :, start:end + 1].contiguous()
        return k[:n, :, start:end + 1], v[:n, :, start:end + 1]

    def reserve(self) -> None:
        """Room for a decode step's column at ``end``."""
        if self.end == self.capacity:
            self._lay_out(self.width)

    def admit(self, fresh: Flight) -> None:
        """``fresh``'s sequences (a prefill's plain cache, [n, H, W, D] a layer) in rows [count,
        count + n), right-aligned at ``end``, the columns before them zeroed; where W exceeds the
        width, the flight's rows are widened to the left with zeros."""
        n, width = len(fresh), fresh.mask.shape[1]
        if self.count + n > self.rows:
            raise ValueError(f"{self.count} + {n} sequences do not fit a slab of {self.rows} rows")
        if width > self.end:
            self._lay_out(width)
        start, old, rows = min(self.start, self.end - width), slice(0, self.count), slice(self.count, self.count + n)
        for pair, fresh_pair in zip(self.kv, compat.plain_kv(fresh.cache)):
            for buf, new in zip(pair, fresh_pair):
                if self.count and start < self.start:
                    buf[old, :, start:self.start].zero_()
                if start < self.end - width:
                    buf[rows, :, start:self.end - width].zero_()
                buf[rows, :, self.end - width:self.end] = new
        self.stats.kv_positions_copied += n * width
        self.start, self.count = start, self.count + n

    def cut(self, live: Sequence[int]) -> list[int]:
        """Keep the rows ``live`` (ascending): each of them past the first len(live) rows moves into
        a row freed there (its columns copied; the others stay where they are). Returns the old row
        of each row now in flight, the order the flight's other state must take."""
        kept = len(live)
        order, staying = list(range(kept)), set(live)
        freed = [r for r in order if r not in staying]
        movers = [r for r in live if r >= kept]
        for row, mover in zip(freed, movers):
            order[row] = mover
        if freed:
            into, out_of = indices_on(freed), indices_on(movers)
            for pair in self.kv:
                for buf in pair:
                    buf[into(buf), :, self.start:self.end] = buf[out_of(buf), :, self.start:self.end]
            self.stats.kv_positions_copied += len(freed) * self.width
        self.count = kept
        if not kept:
            self.start = self.end
        return order

    def trim(self, columns: int) -> None:
        """Cut ``columns`` leading columns, padding of every sequence in flight (nothing copied)."""
        self.start += columns

    def stepped(self) -> None:
        self.end += 1

    @staticmethod
    def columns_for(end: int) -> int:
        """The columns of buffers laid out to end a flight at column ``end``: room for max(end / 2,
        256) steps after it, in whole blocks of 256 (a copy of what is in flight at most every
        end / 2 steps: two positions per sequence and step at most, against the whole cache)."""
        return 256 * math.ceil((end + max(end // 2, 256)) / 256)

    def _lay_out(self, end: int) -> None:
        """New buffers (:meth:`columns_for`) holding what is in flight at columns [end - width, end)."""
        width, count, capacity = self.width, self.count, self.columns_for(end)
        for pair in self.kv:
            for i, buf in enumerate(pair):
                new = buf.new_zeros((*buf.shape[:2], capacity, buf.shape[-1]))
                new[:count, :, end - width:end] = buf[:count, :, self.start:self.end]
                pair[i] = new                     # (the old one freed here: one layer's extra memory at a time)
        self.stats.kv_positions_copied += count * width
        self.start, self.end = end - width, end


def read_views(kv: Sequence[Sequence[torch.Tensor]], groups: int) -> tuple[float, bool]:
    """How SDPA on the devices of the KV buffers ``kv`` (per layer, keys and values [R, KV, C, d])
    reads strided views of them: the largest :func:`~ladbench.models.attention.strided_kv_read_error`
    over their devices and shapes, and whether it misreads them on any device (warned once, naming
    the devices)."""
    errors = {(str(k.device), k.dtype): attention.strided_kv_read_error(str(k.device), k.dtype, k.shape[1], k.shape[-1],
                                                                         groups) for k, _ in kv}
    misread = sorted({device for (device, dtype), error in errors.items()
                      if not attention.strided_kv_read_right(error, dtype)})
    if misread:
        log.warning("SDPA on %s reads strided views of the decode loop's KV store otherwise than contiguous "
                    "copies of them: the attention gets contiguous copies (a copy of the cache in flight per "
                    "layer and step, as transformers' concatenating cache made)", ", ".join(misread))
    return max(errors.values(), default=0.0), bool(misread)


def query_groups(text_config: Any) -> int:
    """Query heads per KV head of a decoder config (1 where it states no grouping)."""
    heads = getattr(text_config, "num_attention_heads", None)
    kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
    return heads // kv_heads if isinstance(heads, int) and isinstance(kv_heads, int) and kv_heads else 1


class SlotDecoder:
    """Decode the replies of groups of rows (each ``samples`` sequences) with ``slots`` in flight.

    ``draw(scores [B, V], keys [B] | None, steps [B]) -> tokens [B]`` picks each token (greedy:
    argmax; sampled: ``KeyedSampler.draw``); ``sample_keys(first, count)`` gives the keys of the
    sequences of rows ``first`` to ``first + count - 1`` (rows numbered as :meth:`stream` reads
    them) in row-major order (row, sample), called once per group as it is prefilled; None for
    greedy decoding.
    """

    def __init__(self, adapter, *, samples: int, slots: int, max_new_tokens: int,
                 draw: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor], torch.Tensor],
                 sample_keys: Callable[[int, int], torch.Tensor] | None = None, static: bool = False,
                 compile_options: dict | None = None, graphs: bool = False, ring: "Ring | None" = None) -> None:
        self.adapter, self.samples, self.max_new_tokens, self.draw = adapter, samples, max_new_tokens, draw
        # static: the sequences in a Ring (module docstring); compile_options: its step through
        # torch.compile with these options (None: eager; mode reduce-overhead: CUDA graphs on a GPU);
        # graphs: its eager step captured as a CUDA graph instead, on a GPU (inference/graphs.py)
        self.static, self.compile_options, self.graphs = static, compile_options, graphs
        self.ring = ring                # a previous run's ring, reused where it serves (no new compilation)
        self.slots = max(slots, samples)
        self.sample_keys = sample_keys
        self.end_ids = set(adapter.end_token_ids())
        self.ends = torch.tensor(sorted(self.end_ids), device=adapter.device)
        self.penalty = repetition_penalty(adapter)
        self.stats = DecodeStats(slots=self.slots)
        self.prefill_clock = PrefillClock(adapter.device)
        self.padded_reason: str | None = None      # decided by the first prefill (padded_path_reason)
        self.store: Slab | Ring | None = None      # what holds the sequences in flight (the padded path: None)

    def progress_note(self) -> str:
        """For a job's progress line: the tokens generated so far and the memory of the KV store
        that holds the sequences in flight (the slab or the ring), which a long job keeps bounded."""
        note = f"{self.stats.useful_tokens:,} tokens generated"
        if self.store is None:
            return note
        held = sum(buf.numel() * buf.element_size() for pair in self.store.kv for buf in pair)
        return f"{note}, KV store {held / 2**30:.2f} GiB" if held >= 2**30 else f"{note}, KV store {held / 2**20:.1f} MiB"

    @property
    def joinable(self) -> bool:
        """Whether the sequences in flight can be cut and joined (not the padded path)."""
        return self.padded_reason is None

    # ----------------------------------------------------------------- prefill
    def prefill(self, inputs: dict[str, torch.Tensor], first_row: int) -> Flight:
        """One prefill of a group of rows (sequence ids: its rows' first samples)."""
        ad = self.adapter
        self._prompt_lengths.update(enumerate(host_lengths(inputs["attention_mask"]), first_row))
        with self.prefill_clock.span():
            # made on the host with what the prefill would otherwise read back (RowRunner.prepare)
            inputs = ad.to_device(inputs, for_prefill=True)
            logits, state = ad.prefill(inputs, use_cache=True)
        positions = ad.decode_positions(state)
        rows = inputs["input_ids"].shape[0]
        if self.joinable and (reason := padded_path_reason(ad.text_config, positions, state.past_key_values)):
            self.padded_reason = reason
            log.warning("the decode loop cannot cut or join this model's KV cache (%s): each group of %d rows "
                        "decodes until all its sequences have ended (the padded path), not %d sequences in "
                        "flight%s", reason, rows, self.slots, "; static shapes do not apply" if self.static else "")
        self.stats.prefills += 1
        self.stats.prefilled_rows += rows
        self.stats.prefilled_tokens += int(inputs["input_ids"].numel())
        seen = None
        if self.penalty != 1.0:          # the row's own tokens (padding replaced by its last token: as alone)
            ids, mask = inputs["input_ids"], inputs["attention_mask"].bool()
            real = torch.where(mask, ids, ids[:, -1:])
            seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, real, True)
        mask = state.attention_mask.to(logits.device)
        return Flight(state.past_key_values, mask, positions, logits, seen,
                      [(first_row + r) * self.samples for r in range(rows)])

    # ------------------------------------------------------------------ decode
    def stream(self, groups: Iterable[dict[str, torch.Tensor]]) -> Iterator[tuple[int, list[list[int]]]]:
        """Each row's replies (its samples' tokens, end token included) as soon as all of them have
        ended, rows numbered in the order ``groups`` hold them. Groups are read only as slots free
        up, so a caller may stream rows of any number of groups through one full batch; the batch
        drains once, at the end of the stream; the prefills' seconds are added to the counts then."""
        yield from self._stream(groups)
        self.stats.prefill_seconds += self.prefill_clock.total()

    def _stream(self, groups: Iterable[dict[str, torch.Tensor]]) -> Iterator[tuple[int, list[list[int]]]]:
        self._pending, self._parked, self._next_sample, self._rows_seen = iter(groups), None, [], 0
        self._replies: dict[int, list[int]] = {}        # sequence -> its tokens so far (rows in flight)
        self._unended: dict[int, int] = {}              # row in flight -> its samples still decoding
        self._prompt_lengths: dict[int, int] = {}       # row in flight -> its prompt's tokens
        self._rows_ended: list[int] = []                # rows whose samples have all ended, not yet yielded
        flight = self._fresh(self.slots)                # the first prefill decides ``joinable``
        if flight is not None and self.static and self.joinable:
            devices = sorted({str(k.device) for k, _ in compat.plain_kv(flight.cache)})
            if len(devices) == 1:
                yield from self._ring_stream(flight)
                return
            log.warning("static shapes keep the KV cache on one device, and this model's spans %s: the slots "
                        "loop decodes it", ", ".join(devices))
        slab = (Slab(flight, self.slots, self.stats, query_groups(self.adapter.text_config))
                if flight is not None and self.joinable else None)
        self.store = slab
        while flight is not None:
            if slab is not None:
                if flight.slab is None:                   # a prefill's sequences, the first in flight
                    flight = join(replace(flight, seq=[], slab=slab), flight)
                while len(flight) < self.slots and (fresh := self._fresh(self.slots - len(flight))) is not None:
                    flight = join(flight, fresh)
            flight = self.step(flight, self._replies)
            yield from self._ended_rows()
            flight = flight or self._fresh(self.slots)

    def run(self, groups: Iterable[dict[str, torch.Tensor]]) -> list[list[int]]:
        """The reply tokens of every sequence (end token included), row-major (row, sample)."""
        ended = dict(self.stream(groups))
        return [reply for row in sorted(ended) for reply in ended[row]]

    def _sequence_ended(self, seq: int) -> None:
        row = seq // self.samples
        self.stats.kv_positions_held += kv_positions_held([self._prompt_lengths[row]], [len(self._replies[seq])])
        self._unended[row] -= 1
        if not self._unended[row]:
            del self._unended[row], self._prompt_lengths[row]
            self._rows_ended.append(row)

    def _ended_rows(self) -> Iterator[tuple[int, list[list[int]]]]:
        for row in self._rows_ended:
            yield row, [self._replies.pop(row * self.samples + s) for s in range(self.samples)]
        self._rows_ended = []

    def _fresh(self, free: int) -> Flight | None:
        """Up to ``free`` sequences not started yet (a cache that cannot be joined: the whole next
        group), their rows prefilled when first needed (the next group once the parked one has
        started all its samples); None when every sequence has started."""
        if self._parked is None or all(s == self.samples for s in self._next_sample):
            inputs = next(self._pending, None)
            if inputs is None:
                return None
            self._parked = self.prefill(inputs, self._rows_seen)
            self._next_sample = [0] * len(self._parked)
            # the group's sequence keys, row-major [rows x samples], on the device once (not per admission)
            self._parked_keys = (None if self.sample_keys is None else
                                 self.sample_keys(self._rows_seen, len(self._parked)).to(self._parked.logits.device))
            for row in range(self._rows_seen, self._rows_seen + len(self._parked)):
                self._unended[row] = self.samples
                self._replies.update((row * self.samples + s, []) for s in range(self.samples))
            self._rows_seen += len(self._parked)
        parked = self._parked
        if not self.joinable:
            free = len(parked) * self.samples
        rows, samples = [], []
        for r in range(len(parked)):
            while self._next_sample[r] < self.samples and len(rows) < free:
                rows.append(r)
                samples.append(self._next_sample[r])
                self._next_sample[r] += 1
        fresh = take(parked, rows, joinable=self.joinable)
        if rows != list(range(len(parked))):              # selected or repeated rows: their cache copied
            self.stats.kv_positions_copied += len(fresh) * fresh.mask.shape[1]
        fresh.seq = [parked.seq[r] + sample for r, sample in zip(rows, samples)]
        if self._parked_keys is not None:
            fresh.keys = self._parked_keys.index_select(
                0, device_index([r * self.samples + sample for r, sample in zip(rows, samples)], self._parked_keys.device))
        fresh.steps = torch.zeros(len(rows), dtype=torch.long, device=fresh.logits.device)
        if not self.joinable:
            self._parked = None
        return fresh

    def _ring_stream(self, first: Flight) -> Iterator[tuple[int, list[list[int]]]]:
        """The loop over a :class:`Ring` (``--decode static``): draw and feed every slot, then fill
        the slots freed with the next sequences."""
        ring = self.ring.rebind(self) if self.ring is not None and self.ring.serves(self, first) else Ring(self, first)
        self.ring = self.store = ring
        ring.admit(first, ring.free_slots()[:len(first)])
        while True:
            free = ring.free_slots()
            while free and (fresh := self._fresh(len(free))) is not None:
                ring.admit(fresh, free[:len(fresh)])
                free = free[len(fresh):]
            if len(free) == ring.slots:
                return
            ring.step(self._replies)
            yield from self._ended_rows()

    def continuing(self, ended: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """Which sequences go on after this step's draw, on the device: not ended, and below the
        token limit with the token drawn (``steps``: tokens generated before it)."""
        return ~ended & (steps + 1 < self.max_new_tokens)

    def penalised(self, scores: torch.Tensor, seen: torch.Tensor | None) -> torch.Tensor:
        """The model's repetition penalty on each sequence's own tokens (``seen``), as ``generate`` applies it."""
        if seen is None:
            return scores
        return torch.where(seen, penalty_applied(scores, self.penalty), scores)

    def step(self, flight: Flight, replies: dict[int, list[int]]) -> Flight | None:
        """Draw one token per sequence, read them back (the step's one host sync), drop the
        sequences that ended and feed the others' tokens through the model."""
        tokens = self.draw(self.penalised(flight.logits, flight.seen), flight.keys, flight.steps)
        ended = torch.isin(tokens, self.ends)
        first = (first_needed_column(flight.mask, self.continuing(ended, flight.steps))
                 if flight.slab is not None else tokens.new_zeros(1))
        host = torch.cat([tokens, ended.long(), first]).cpu().numpy()          # the one sync
        tokens_host, ended_host = host[:len(flight)], host[len(flight):2 * len(flight)]
        self.stats.token_slots += len(flight)
        live = []
        for b, (seq, token, end) in enumerate(zip(flight.seq, tokens_host, ended_host)):
            reply = replies.get(seq)                       # None: its row has ended and been handed on
            if reply is None or (reply and (reply[-1] in self.end_ids or len(reply) == self.max_new_tokens)):
                continue                                   # finished earlier, kept in a padded batch
            reply.append(int(token))
            self.stats.useful_tokens += 1
            if not end and len(reply) < self.max_new_tokens:
                live.append(b)
            else:
                self._sequence_ended(seq)
        if flight.slab is not None:      # a joinable cache: the sequences that ended leave it
            if not live:
                flight.slab.cut(live)
                return None
            unneeded = int(host[-1])
            flight.slab.trim(unneeded)
            flight.mask = flight.mask[:, unneeded:]
            keep = flight.slab.cut(live)
            flight.slab.reserve()
        else:                       # the padded path: every row stays, finished ones fed the pad token
            if not live:
                return None
            keep = list(range(len(flight)))
            finished = torch.ones(len(flight), dtype=torch.bool, device=tokens.device)
            finished[device_index(live, tokens.device)] = False
            tokens = tokens.masked_fill(finished, self.adapter.pad_token_id)
            # transformers' dynamic cache appends by concatenation: every position it holds copied
            self.stats.kv_positions_copied += len(keep) * flight.mask.shape[1]
        flight = take(flight, keep, joinable=self.joinable)
        fed = tokens.index_select(0, device_index(keep, tokens.device))
        if flight.seen is not None:
            flight.seen = flight.seen.scatter(1, fed[:, None], True)
        flight.mask = torch.cat([flight.mask, flight.mask.new_ones(len(keep), 1)], 1)
        self.stats.widest_cache = max(self.stats.widest_cache, flight.mask.shape[1])
        self.stats.kv_positions_read += len(keep) * flight.mask.shape[1]
        # a joinable cache is full attention only: the padding mask of a one-token query is the whole
        # mask, handed over as such (4-D), so that transformers does not read it back to see if it can skip it
        mask = attention.additive_mask(flight.mask, flight.slab.kv[0][0].dtype) if flight.slab is not None else flight.mask
        flight.logits = self.adapter.decode_logits(flight.cache, fed[:, None], mask, flight.positions)
        if flight.slab is not None:
            flight.slab.stepped()
        if flight.positions is not None:
            flight.positions = flight.positions + 1
        flight.steps = flight.steps + 1
        self.stats.decode_steps += 1
        self.stats.decode_rows += len(keep)
        return flight


def static_compile_options(device: Any) -> dict | None:
    """How ``--decode static`` compiles its step on ``device``: ``torch.compile``'s
    ``reduce-overhead`` mode (CUDA graphs) on a GPU; on the CPU the step runs as it is (a
    compilation there costs more than the few steps it would save)."""
    return {"mode": "reduce-overhead", "dynamic": False} if torch.device(device).type == "cuda" else None


#: columns a ring keeps beyond its first prompt and the reply limit: the prompts of one job differ
#: only by their captions' tokens (every image of a study is the same size), and its rows are
#: prefilled shortest first within a chunk (``RowRunner.grouped_by_length``); a longer one grows the ring
RING_PROMPT_MARGIN = 64
#: a ring's columns are whole blocks of this many (fewer distinct shapes, fewer compilations)
RING_BLOCK = 128


def ring_capacity(tokens: int) -> int:
    """Columns of a ring for sequences of up to ``tokens`` tokens (prompt and reply). Every step
    attends every column of every slot (a dense attention over a static shape), so a column held
    for nothing is read for nothing at each step: the margin is for the prompts, not a share of
    the whole (until 2026-11-28 a quarter more: 3,840 columns for CoT's 1,900-token prompts and
    1,024-token replies where 3,072 now hold them)."""
    return RING_BLOCK * math.ceil((tokens + RING_PROMPT_MARGIN) / RING_BLOCK)


class Ring:
    """The static-shape store of the sequences in flight (module docstring): ``slots`` slots of one
    preallocated KV buffer per layer, [S, H, C, D], written at one shared column per step.

    Slot ``b`` holds ``length[b]`` tokens in the columns just before the write column (wrapping
    around); a free slot holds none, attends to its own column only and is fed the pad token. Per
    slot on the device: its length, next position, logits, seen tokens, key and step; on the host:
    the sequence it holds (None: free).
    """

    def __init__(self, decoder: SlotDecoder, first: Flight) -> None:
        self.decoder, self.slots, self.adapter = decoder, decoder.slots, decoder.adapter
        self.compile_options, self.graphs = decoder.compile_options, decoder.graphs
        device, slots = first.logits.device, decoder.slots
        self.kv = [[torch.zeros((slots, *k.shape[1:2], 0, k.shape[-1]), dtype=k.dtype, device=device),
                    torch.zeros((slots, *v.shape[1:2], 0, v.shape[-1]), dtype=v.dtype, device=device)]
                   for k, v in compat.plain_kv(first.cache)]
        self.column = torch.zeros(1, dtype=torch.long, device=device)      # where this step writes
        self.t = 0                                                          # the same, on the host
        self.length = torch.zeros(slots, dtype=torch.long, device=device)
        self.live = torch.zeros(slots, dtype=torch.bool, device=device)
        self.positions = first.positions.new_zeros((*first.positions.shape[:-2], slots, 1))
        self.logits = first.logits.new_zeros((slots, first.logits.shape[-1]))
        self.seen = None if first.seen is None else first.seen.new_zeros((slots, first.seen.shape[-1]))
        self.keys = None if first.keys is None else first.keys.new_zeros(slots)
        self.steps = torch.zeros(slots, dtype=torch.long, device=device)
        self.seq: list[int | None] = [None] * slots
        self._grow(first.mask.shape[1] + decoder.max_new_tokens)

    @property
    def capacity(self) -> int:
        return self.kv[0][0].shape[-2]

    def free_slots(self) -> list[int]:
        return [b for b, seq in enumerate(self.seq) if seq is None]

    def _grow(self, tokens: int) -> None:
        """A longer ring holding what this one holds: unrolled so that the write column's
        predecessors end just before the new write column C (a new shape: a new compilation)."""
        old, capacity = self.capacity, ring_capacity(tokens)
        self.decoder.stats.kv_positions_copied += self.slots * old
        for pair in self.kv:
            for i, buf in enumerate(pair):
                shape = (*buf.shape[:2], capacity - old, buf.shape[-1])
                held = buf.roll(-self.t, dims=2) if old else buf
                pair[i] = torch.cat([held, buf.new_zeros(shape)], dim=2)
        self.t = old % capacity
        self.column.fill_(self.t)
        self.columns = torch.arange(capacity, device=self.column.device)
        self.cache = compat.new_ring_cache(self.kv, self.column)
        self.decoder.stats.ring_columns = capacity
        forward = self._logits
        if self.compile_options is not None:
            forward = torch.compile(forward, **self.compile_options)
        elif self.graphs and (capture := graphs.capture_on(self.column.device)) is not None:
            forward = graphs.GraphedStep(forward, capture, on_capture=self._captured)
        self.forward = forward

    def _captured(self) -> None:
        self.decoder.stats.graph_captures += 1

    def serves(self, decoder: SlotDecoder, first: Flight) -> bool:
        """Whether this ring (a previous step's, its compiled step with it) can take ``decoder``'s
        sequences: as many slots or more (a stage's last, smaller step), the same compilation and
        cache layout (a longer prompt grows it)."""
        return (decoder.slots <= self.slots and decoder.compile_options == self.compile_options
                and decoder.graphs == self.graphs
                and decoder.adapter is self.adapter and (first.keys is None) == (self.keys is None)
                and (first.seen is None) == (self.seen is None)
                and [(k.shape[1], k.shape[-1], k.dtype, v.shape[-1]) for k, v in compat.plain_kv(first.cache)]
                == [(k.shape[1], k.shape[-1], k.dtype, v.shape[-1]) for k, v in self.kv])

    def rebind(self, decoder: SlotDecoder) -> "Ring":
        """Every slot free, for ``decoder``'s run (its draws, replies and counts)."""
        self.decoder, self.seq = decoder, [None] * self.slots
        self.live.zero_()
        self.length.zero_()
        decoder.stats.ring_columns = self.capacity
        return self

    def admit(self, fresh: Flight, slots: list[int]) -> None:
        """Put the prefilled sequences of ``fresh`` into the free ``slots``: their caches copied
        into the columns before the write column, their state into the slots'."""
        width = fresh.mask.shape[1]
        if width + self.decoder.max_new_tokens > self.capacity:
            self._grow(width + self.decoder.max_new_tokens)
        idx = device_index(slots, self.column.device)
        self.decoder.stats.kv_positions_copied += len(slots) * width
        columns = (self.columns[:width] + (self.t - width)) % self.capacity
        for (keys, values), (k, v) in zip(self.kv, compat.plain_kv(fresh.cache)):
            keys[idx[:, None], :, columns[None, :]] = k.transpose(1, 2)
            values[idx[:, None], :, columns[None, :]] = v.transpose(1, 2)
        self.length.index_copy_(0, idx, fresh.mask.long().sum(1))
        self.live.index_fill_(0, idx, True)
        self.positions.index_copy_(-2, idx, fresh.positions)
        self.logits = self.logits.index_copy(0, idx, fresh.logits)       # (not in place: a CUDA graph's output)
        self.steps.index_fill_(0, idx, 0)
        if self.seen is not None:
            self.seen.index_copy_(0, idx, fresh.seen)
        if self.keys is not None:
            self.keys.index_copy_(0, idx, fresh.keys)
        for slot, seq in zip(slots, fresh.seq):
            self.seq[slot] = seq

    def _logits(self, fed: torch.Tensor, length: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One forward of every slot (the compiled part: the same shapes every step)."""
        held = (self.column - self.columns) % self.capacity <= length[:, None]       # [S, C]
        return self.adapter.decode_logits(self.cache, fed[:, None], held[:, None, None, :], positions)

    def step(self, replies: dict[int, list[int]]) -> None:
        """Draw one token per slot, read them back (the step's one host sync), free the slots
        whose sequence ended and feed the others' tokens (every slot goes through the model)."""
        d = self.decoder
        tokens = d.draw(d.penalised(self.logits, self.seen), self.keys, self.steps)
        ended = torch.isin(tokens, d.ends)
        host = torch.stack([tokens, ended.long()]).cpu().numpy()              # the one sync
        d.stats.token_slots += self.slots
        d.stats.widest_cache = max(d.stats.widest_cache, self.capacity)
        live = 0
        for b, seq in enumerate(self.seq):
            if seq is None:
                continue
            reply = replies[seq]
            reply.append(int(host[0][b]))
            d.stats.useful_tokens += 1
            if host[1][b] or len(reply) == d.max_new_tokens:
                self.seq[b] = None
                d._sequence_ended(seq)
            else:
                live += 1
        if not live:
            return
        self.live = self.live & d.continuing(ended, self.steps)               # the host's live slots
        fed = tokens.masked_fill(~self.live, self.adapter.pad_token_id)
        if self.seen is not None:
            self.seen = self.seen.scatter(1, fed[:, None], True)
        length = torch.where(self.live, self.length, 0)
        if self.compile_options is not None:
            # CUDA graphs (reduce-overhead): the previous step's outputs are no longer read (its
            # logits were drawn from above), so this replay may reuse their memory
            torch.compiler.cudagraph_mark_step_begin()
        self.logits = self.forward(fed, length, self.positions)
        d.stats.kv_positions_read += self.slots * self.capacity            # every slot, every column
        self.length = length + 1
        self.positions = self.positions + 1
        self.steps = self.steps + 1
        self.t = (self.t + 1) % self.capacity
        self.column.fill_(self.t)
        d.stats.decode_steps += 1
        d.stats.decode_rows += live
