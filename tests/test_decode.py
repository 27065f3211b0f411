"""The decode loop of CoT and self-consistency (inference/decode.py) against the path it replaced.

On the tiny models (their end-of-turn logit doubled, so replies end at mixed lengths), CPU,
float32: the loop's replies equal transformers' ``generate`` reply for reply (CoT and SC, every
hand-written family of the lane; family auto on the current lane); each row goes through the
vision tower and the prefill once (``generate``: S times); the token slots the loop computes are
useful tokens (>= 0.9; ``generate``'s figure next to it); a decode step reads back from the device
once (counted as ``bench_inference.py --proxies`` counts the scoring pass).
"""
from __future__ import annotations

import collections
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchmark_scripts import load_script
from conftest_models import FAMILIES, demo_runner
from ladbench.models import compat

pytestmark = [pytest.mark.slow, pytest.mark.lanes]

#: hand-written families of this lane, and family auto (on the tiny Qwen2.5-VL build) on the current lane
DECODE_FAMILIES = tuple(f for f in FAMILIES if f != "auto") + (("auto",) if compat.on_current_lane() else ())
#: the families run on the tiny Qwen2.5-VL build (its vision tower is ``model.model.visual``)
QWEN_BUILDS = tuple(f for f in DECODE_FAMILIES if f in ("qwen2_5_vl", "auto"))
SAMPLES = 3
VARIANTS = {"cot": dict(max_new_tokens=12), "sc": dict(samples=SAMPLES, max_new_tokens=8)}
ROWS = list(range(10))              # 5 groups of 2 rows (batch size 2), prompts of two lengths


@pytest.fixture(scope="module")
def ending(tiny_model):
    """``ending(family)``: :func:`ending_adapter`, loaded once per module."""
    loaded = {}

    def get(family: str):
        if family not in loaded:
            loaded[family] = ending_adapter(tiny_model, family)
        return loaded[family]
    return get


def ending_adapter(tiny_model, family: str):
    """The family's tiny model with its end-of-turn logit doubled, loaded afresh (replies end at
    mixed lengths)."""
    from ladbench.models import load_adapter
    folder = tiny_model("qwen2_5_vl" if family == "auto" else family)
    adapter = load_adapter(family, folder, device="cpu", dtype="float32", trust_remote_code=family == "llava_ov15")
    with torch.no_grad():
        adapter.model.get_output_embeddings().weight[adapter.end_of_turn_id] *= 2
    return adapter


def generated(adapter, folder, prompt: str, decode: str, batch_size: int = 2, decode_slots: int | None = None,
              settings: dict | None = None, **option_changes):
    """One step of the infer stage over all rows: its results and the runner (counts); ``settings``:
    other inference settings."""
    from ladbench.variants import variant
    options = dataclasses.replace(variant(prompt).options(), **{**VARIANTS[prompt], **option_changes})
    runner = demo_runner(adapter, folder, 4, bench_options=dict(n_eval=3, n_orderings=2, n_cal=1), prompt=prompt,
                         decode=decode, options=options, batch_size=batch_size, decode_slots=decode_slots,
                         **(settings or {}))
    return runner.generate_batch(runner.prepare(ROWS)), runner


@pytest.mark.parametrize("decode", ["slots", "static"])
@pytest.mark.parametrize("prompt", sorted(VARIANTS))
@pytest.mark.parametrize("family", DECODE_FAMILIES)
def test_decode_loop_replies_equal_generate_and_keep_slots_useful(ending, tmp_path, family, prompt, decode):
    adapter = ending(family)
    new, loop = generated(adapter, tmp_path / "loop", prompt, decode)
    old, reference = generated(adapter, tmp_path / "generate", prompt, "generate")
    assert loop.generate_reason is None                     # the loop ran (no fallback)
    assert (loop.decode_stats.ring_columns > 0) == (decode == "static")
    for key in ("text", "parsed", "n_generated") + (("sample_parsed",) if prompt == "sc" else ()):
        assert (new[key] == old[key]).all(), key
    lengths = new["n_generated"]
    assert len(set(lengths.tolist())) > 1                   # replies of mixed length
    stats = loop.decode_stats
    assert stats.useful_tokens == int(lengths.sum())
    # static shapes compute every slot, free ones too while the last rows drain: at least what
    # generate keeps useful (only the draining tail of these few rows is lost; a real run's is short)
    assert stats.useful_fraction() >= (0.9 if decode == "slots" else 0.75)
    today = stats.useful_tokens / reference.generate_slots  # generate: every sequence until its batch's longest ends
    assert today <= stats.useful_fraction()


def test_samples_admitted_one_slot_at_a_time_keep_their_own_keys(ending, tmp_path):
    """Batch size 1 and four samples ending at different steps: each freed slot admits ONE more
    sample of the parked row, and that sample keeps its own key and reply (a regression: the
    admitted flight once shared the parked row's state, so later samples got shifted keys)."""
    adapter = ending("qwen2_5_vl")
    new, _ = generated(adapter, tmp_path / "loop", "sc", "slots", batch_size=1, samples=4)
    old, _ = generated(adapter, tmp_path / "generate", "sc", "generate", batch_size=1, samples=4)
    assert len({len(t) for row in new["text"] for t in row}) > 1          # samples of mixed length
    for key in ("text", "sample_parsed", "parsed", "n_generated"):
        assert (new[key] == old[key]).all(), key


@pytest.mark.parametrize("decode", ["slots", "graphs"])
@pytest.mark.parametrize("prompt", sorted(VARIANTS))
def test_a_repetition_penalty_is_applied_as_generate_applies_it_to_one_row(tiny_model, tmp_path, prompt, decode):
    """The generation config's repetition penalty (the real Qwen models set 1.05), over each row's
    own tokens: the loop at batch 2 equals ``generate`` row by row (batch 1: no padding to penalise),
    in the slab and in the ring (``--decode graphs``, eager on the CPU), whose slots carry the
    tokens seen from one sequence to the next."""
    from ladbench.models import load_adapter
    family = QWEN_BUILDS[0]
    adapter = load_adapter(family, tiny_model("qwen2_5_vl"), device="cpu", dtype="float32")
    with torch.no_grad():
        adapter.model.get_output_embeddings().weight[adapter.end_of_turn_id] *= 2
    adapter.model.generation_config.repetition_penalty = 1.5
    new, loop = generated(adapter, tmp_path / "loop", prompt, decode)
    old, _ = generated(adapter, tmp_path / "generate", prompt, "generate", batch_size=1)
    assert loop.generate_reason is None and loop.decode_stats.decode_steps
    assert bool(loop.decode_stats.ring_columns) == (decode == "graphs")
    assert (new["text"] == old["text"]).all() and (new["n_generated"] == old["n_generated"]).all()
    adapter.model.generation_config.repetition_penalty = 1.0                 # the penalty changes the replies
    plain, _ = generated(adapter, tmp_path / "plain", prompt, decode)
    assert (plain["text"] != new["text"]).any()


@pytest.mark.parametrize("family", QWEN_BUILDS)
def test_self_consistency_prefills_each_row_once(ending, tmp_path, family):
    """Vision tower calls and images, and prefilled tokens, per row: 1 and the prompt's length
    against S and S times that through ``generate``."""
    adapter = ending(family)
    counts: collections.Counter = collections.Counter()

    def on_vision(module, args, kwargs):
        counts["vision_calls"] += 1
        grid = kwargs.get("grid_thw", kwargs.get("image_grid_thw", args[1] if len(args) > 1 else None))
        counts["images"] += len(grid)

    def on_decoder(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        if hidden.shape[1] > 1:                              # a prefill (decode steps feed one token)
            counts["prefilled_tokens"] += hidden.shape[0] * hidden.shape[1]
    visual = adapter.model.model.visual
    hooks = [visual.register_forward_pre_hook(on_vision, with_kwargs=True),
             adapter.decoder_layers()[0].register_forward_pre_hook(on_decoder, with_kwargs=True)]
    try:
        result = {}
        for decode in ("slots", "generate"):
            counts.clear()
            _, runner = generated(adapter, tmp_path / decode, "sc", decode)
            result[decode] = dict(counts)
    finally:
        for hook in hooks:
            hook.remove()
    groups = runner.prepare(ROWS).groups
    prompt_tokens = sum(int(g["input_ids"].numel()) for g in groups)     # each row's padded prompt, once
    assert result["slots"] == {"vision_calls": len(groups), "images": 4 * len(ROWS), "prefilled_tokens": prompt_tokens}
    assert result["generate"] == {"vision_calls": len(groups), "images": SAMPLES * 4 * len(ROWS),
                                  "prefilled_tokens": SAMPLES * prompt_tokens}


@pytest.mark.parametrize("decode", ["slots", "static"])
@pytest.mark.parametrize("prompt", sorted(VARIANTS))
def test_a_decode_step_reads_back_from_the_device_once(ending, tmp_path, monkeypatch, prompt, decode):
    """Host syncs per decode step (``.item()`` and the like, every ``tolist`` / ``cpu``; counted as
    ``bench_inference.py --proxies`` counts them): at most one, the step's drawn tokens."""
    from ladbench.inference.decode import Ring, SlotDecoder
    bench = load_script("bench_inference")
    per_step = []
    owner = Ring if decode == "static" else SlotDecoder
    step = owner.step

    def counted(*args):
        with bench.count_host_syncs() as counted_syncs:
            out = step(*args)
        per_step.append(counted_syncs.syncs)
        return out
    monkeypatch.setattr(owner, "step", counted)
    generated(ending(QWEN_BUILDS[0]), tmp_path, prompt, decode)
    assert len(per_step) > 10 and max(per_step) <= 1 and min(per_step) == 1


@pytest.mark.parametrize("prompt", sorted(VARIANTS))
def test_a_ring_grows_for_a_longer_prompt_and_keeps_what_it_holds(ending, tmp_path, monkeypatch, prompt):
    """A ring sized for the first group without margin: a later, longer prompt does not fit, the
    ring is unrolled into a longer one mid-flight, and every reply stays generate's. The ring then
    has room for the widest prompt and the longest reply allowed, exactly: the reply limit here is
    more than half the prompts' spread (25 tokens), so that a room check off by the limit either
    way shows. Each unrolling copies every slot's columns, which the KV copy count holds beside the
    admissions' copies (a ring with room from the start makes only those)."""
    from ladbench.inference import decode
    adapter, limit = ending(QWEN_BUILDS[0]), 16
    _, roomy = generated(adapter, tmp_path / "roomy", prompt, "static", max_new_tokens=limit)
    sizes = []

    def exact(tokens):
        sizes.append(tokens)
        return tokens
    monkeypatch.setattr(decode, "ring_capacity", exact)
    new, loop = generated(adapter, tmp_path / "ring", prompt, "static", max_new_tokens=limit)
    old, _ = generated(adapter, tmp_path / "generate", prompt, "generate", max_new_tokens=limit)
    stats = loop.decode_stats
    widths = [group["attention_mask"].shape[1] for group in loop.prepare(ROWS).groups]
    assert 2 * limit > max(widths) - min(widths) > 0
    assert sizes[0] == widths[0] + limit                              # the first ring: the first group's
    assert len(sizes) > 1 and stats.ring_columns == max(sizes) == max(widths) + limit > sizes[0]
    unrolled = stats.kv_positions_copied - roomy.decode_stats.kv_positions_copied
    assert unrolled == stats.slots * sum(sizes[:-1])                  # the first ring starts empty
    for key in ("text", "parsed", "n_generated"):
        assert (new[key] == old[key]).all(), key


@pytest.mark.parametrize("family", ["qwen2_5_vl", "internvl"])
def test_the_loops_prefills_wait_for_nothing_on_the_host(ending, tmp_path, monkeypatch, family):
    """The decode loop's groups are made on the host with what a prefill would otherwise read back
    from the device (Qwen2.5-VL's M-RoPE positions, whether the group is padded, where the image
    features go), as scoring's batches are: on a GPU each read back is a wait on the host (aten's
    ``_local_scalar_dense``, or ``lift_fresh``: a tensor made from Python data). Every prefill after
    the first (whose tower plans its image grids, on the host, once) waits for none, counted on the
    CPU; until 2026-11-28 a group of 4 rows of the medium Qwen2.5-VL waited 80 to 105 times. The
    replies stay generate's, and so with ``decide_on_host: false`` (transformers decides, for
    comparison), whose groups hold no host decision."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from ladbench.inference import decode
    from ladbench.models.base import IMAGE_TOKEN_INDEX, PADDED_KEY
    if family == "qwen2_5_vl" and not compat.batched_vision_supported():
        pytest.skip("the current lane runs transformers' own vision tower, which reads its grids itself")
    waits: list[list[str]] = []

    class HostWaits(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default or (
                    func is torch.ops.aten.lift_fresh.default and args[0].numel()):
                waits[-1].append(str(func))
            return func(*args, **(kwargs or {}))
    prefill, adapter = decode.SlotDecoder.prefill, ending(family)
    to_device, moves = type(adapter).to_device, []

    def counted(decoder, inputs, first_row):
        assert inputs[PADDED_KEY] in (True, False) and IMAGE_TOKEN_INDEX in inputs
        waits.append([])
        with HostWaits():
            return prefill(decoder, inputs, first_row)

    def moved(self, inputs, **kwargs):         # (the CPU cannot tell a key kept on the host from one moved)
        if waits:
            moves.append(kwargs.get("for_prefill", False))
        return to_device(self, inputs, **kwargs)
    monkeypatch.setattr(decode.SlotDecoder, "prefill", counted)
    monkeypatch.setattr(type(adapter), "to_device", moved)
    new, _ = generated(adapter, tmp_path / "loop", "sc", "slots")
    assert len(waits) > 2 and all(w == [] for w in waits[1:]), waits
    assert moves and all(moves)                # the tower's grids stay on the host (host_input_keys)
    monkeypatch.setattr(type(adapter), "to_device", to_device)
    monkeypatch.setattr(decode.SlotDecoder, "prefill", prefill)
    old, _ = generated(adapter, tmp_path / "generate", "sc", "generate")
    read_back, runner = generated(adapter, tmp_path / "read-back", "sc", "slots", settings={"decide_on_host": False})
    assert not {PADDED_KEY, IMAGE_TOKEN_INDEX} & set(runner.prepare(ROWS[:2]).groups[0])
    for key in ("text", "sample_parsed", "parsed", "n_generated"):
        assert (new[key] == old[key]).all() and (read_back[key] == old[key]).all(), key


def recording_capture(records: list):
    """A CUDA graph's contract, kept on the CPU: a capture runs the step once (its result is the
    first call's) and hands back a record that, replayed, reruns the step on the very input tensors
    it was given and writes the result into one output tensor; the record also holds the ring's
    buffers' addresses (a real one launches kernels on them), so a replay after they moved fails.
    ``records`` gets "capture" and "replay" as they happen."""
    def capture(step, inputs):
        ring = step.__self__
        addresses = [t.data_ptr() for pair in ring.kv for t in pair] + [ring.column.data_ptr()]
        first = step(*inputs)
        output = torch.full_like(first, float("nan"))

        def replay():
            assert [t.data_ptr() for pair in ring.kv for t in pair] + [ring.column.data_ptr()] == addresses
            output.copy_(step(*inputs))
            records.append("replay")
        records.append("capture")
        return first, replay, output
    return capture


@pytest.mark.parametrize("capture", ["records", "fails"])
@pytest.mark.parametrize("prompt", sorted(VARIANTS))
def test_graphed_ring_steps_replay_their_record_with_generates_replies(ending, tmp_path, monkeypatch, caplog, prompt,
                                                                       capture):
    """``--decode graphs``: the ring's eager step recorded once per ring shape (a longer prompt
    grows the ring: a new record) and replayed with each step's inputs copied into the record's;
    the replies stay generate's. A capture that fails says so in one warning per ring shape and
    the step runs eagerly, with the same replies. (The CPU has no CUDA graphs: the record here is
    :func:`recording_capture`, which fails where inputs are not copied in or the buffers move.)"""
    from ladbench.inference import decode, graphs
    records, sizes = [], []

    def fails(step, inputs):
        step(*inputs)
        raise graphs.CaptureFailed("operation not permitted when stream is capturing")
    monkeypatch.setattr(graphs, "capture_on", lambda device: recording_capture(records) if capture == "records" else fails)
    monkeypatch.setattr(decode, "ring_capacity", lambda tokens: sizes.append(tokens) or tokens)
    stepped, ring_step = set(), decode.Ring.step

    def step(ring, replies):                    # the ring shapes whose step ran the model
        before = ring.decoder.stats.decode_steps
        ring_step(ring, replies)
        if ring.decoder.stats.decode_steps > before:
            stepped.add(ring.capacity)
    monkeypatch.setattr(decode.Ring, "step", step)
    adapter = ending(QWEN_BUILDS[0])
    new, loop = generated(adapter, tmp_path / "graphs", prompt, "graphs")
    old, _ = generated(adapter, tmp_path / "generate", prompt, "generate")
    for key in ("text", "parsed", "n_generated"):
        assert (new[key] == old[key]).all(), key
    shapes = len(stepped)
    assert len(sizes) > 1 and shapes >= 1 and loop.decode_stats.decode_steps > 2 * shapes
    warned = [r.getMessage() for r in caplog.records if "could not be captured" in r.getMessage()]
    if capture == "records":
        # every step after a shape's first replays its record
        assert records.count("capture") == loop.decode_stats.graph_captures == shapes and not warned
        assert records.count("replay") == loop.decode_stats.decode_steps - shapes
    else:
        assert loop.decode_stats.graph_captures == 0 and warned == shapes * [
            "the static shapes' decode step could not be captured as a CUDA graph (operation not permitted when "
            "stream is capturing): it runs eagerly"]


def _batch_sizes(monkeypatch) -> list[int]:
    """The sequences in flight at each decode step, recorded from now on (both paths)."""
    from ladbench.inference.decode import Ring, SlotDecoder
    sizes: list[int] = []
    slot_step, ring_step = SlotDecoder.step, Ring.step

    def slots(self, flight, replies):
        sizes.append(len(flight))
        return slot_step(self, flight, replies)

    def ring(self, replies):
        sizes.append(sum(seq is not None for seq in self.seq))
        return ring_step(self, replies)
    monkeypatch.setattr(SlotDecoder, "step", slots)
    monkeypatch.setattr(Ring, "step", ring)
    return sizes


def _drains_once(sizes: list[int], slots: int) -> bool:
    """Full until the first step that is not, then never refilled: the batch drained once."""
    tail = next((i for i, size in enumerate(sizes) if size < slots), len(sizes))
    return all(a >= b for a, b in zip(sizes[tail:], sizes[tail + 1:]))


@pytest.mark.parametrize("decode", ["slots", "static"])
@pytest.mark.parametrize("prompt", sorted(VARIANTS))
def test_the_loop_keeps_its_batch_full_across_chunks(ending, tmp_path, monkeypatch, prompt, decode):
    """The stage's chunks (steps of the cache) stream through one loop: the batch stays full from
    one chunk to the next and drains once, at the end; each chunk comes out whole, with the replies
    it has alone. Decoded one chunk at a time, as before, the batch drains at every chunk's end
    (here at least its last group, of one row, runs below the batch): the same check fails there."""
    adapter = ending(QWEN_BUILDS[0])
    _, runner = generated(adapter, tmp_path / "whole", prompt, decode)
    chunks = [ROWS[:3], ROWS[3:6], ROWS[6:]]     # 3 rows at batch 2: a chunk alone ends on a group of one row
    alone = [runner.generate_batch(runner.prepare(rows)) for rows in chunks]
    slots = runner.s.batch_size * (SAMPLES if prompt == "sc" else 1)
    sizes = _batch_sizes(monkeypatch)
    for rows in chunks:
        runner.generate_batch(runner.prepare(rows))
    per_chunk, streamed = list(sizes), sizes
    sizes.clear()
    out = {tuple(batch.rows): part for batch, part in runner.generate_chunks(runner.prepare(rows) for rows in chunks)}
    assert sorted(out) == sorted(tuple(rows) for rows in chunks)
    for rows, expected in zip(chunks, alone):
        for key in expected:
            assert (out[tuple(rows)][key] == expected[key]).all(), key
    assert _drains_once(streamed, slots) and not _drains_once(per_chunk, slots)


@pytest.mark.parametrize("decode", ["slots", "static"])
@pytest.mark.parametrize("prompt", sorted(VARIANTS))
def test_more_sequences_in_flight_than_a_prefill_group_give_the_same_replies(ending, tmp_path, monkeypatch, prompt,
                                                                              decode):
    """``decode_slots`` beyond batch_size x S: rows are still prefilled batch_size at a time, but the
    sequences of several groups decode together (the batch holds ``decode_slots`` while rows remain),
    in fewer decode steps, with the replies of the default (batch_size x S in flight)."""
    adapter = ending(QWEN_BUILDS[0])
    group = 2 * (SAMPLES if prompt == "sc" else 1)             # batch size 2
    default, narrow = generated(adapter, tmp_path / "narrow", prompt, decode)
    sizes = _batch_sizes(monkeypatch)
    wide_out, wide = generated(adapter, tmp_path / "wide", prompt, decode, decode_slots=3 * group)
    assert narrow.decode_stats.slots == group and wide.decode_stats.slots == 3 * group
    assert max(sizes) == 3 * group and _drains_once(sizes, 3 * group)
    assert wide.decode_stats.prefilled_rows == narrow.decode_stats.prefilled_rows == len(ROWS)
    assert wide.decode_stats.prefills == narrow.decode_stats.prefills                # groups of 2 rows
    assert wide.decode_stats.decode_steps < narrow.decode_stats.decode_steps / 2
    for key in default:
        assert (wide_out[key] == default[key]).all(), key


@pytest.mark.parametrize("prompt", sorted(VARIANTS))
def test_a_stream_holds_no_more_cache_columns_than_its_longest_sequence(ending, tmp_path, monkeypatch, prompt):
    """Rows of one row a group (no padding in a prompt) stream through a few more slots than a
    group's sequences, so that the batch drains only at the end: at every decode step the cache is
    as wide as the longest sequence in flight (prompt and reply so far), never wider. Before the
    leading columns that no sequence needs were cut, a newcomer was left padded to the width of
    the sequences already in flight and every step appended a column, so the width grew by one a
    step for the whole stream (a real job: tens of thousands of columns, memory and attention
    with them). The slab's buffers stay as long as laid out for the longest sequence. The replies
    stay ``generate``'s."""
    from ladbench.inference import decode
    widths: list[tuple[int, int]] = []
    step = decode.SlotDecoder.step

    def recording(self, flight, replies):
        widths.append((flight.mask.shape[1], int(flight.mask.sum(1).max())))
        capacities.append(flight.slab.capacity)
        return step(self, flight, replies)
    capacities: list[int] = []
    monkeypatch.setattr(decode.SlotDecoder, "step", recording)
    adapter = ending(QWEN_BUILDS[0])
    slots = SAMPLES + 1 if prompt == "sc" else 2
    new, loop = generated(adapter, tmp_path / "loop", prompt, "slots", batch_size=1, decode_slots=slots)
    assert len(widths) > 2 * VARIANTS[prompt]["max_new_tokens"]          # longer than any reply
    assert [width for width, _ in widths] == [held for _, held in widths]
    # the slab's memory is bounded by the longest sequence too: laid out for at most its width
    assert max(capacities) <= decode.Slab.columns_for(max(held for _, held in widths) + 1)
    widest = max(width for width, _ in widths)
    assert widest <= loop.decode_stats.widest_cache <= widest + 1             # (+ the token fed, if any)
    monkeypatch.undo()
    old, _ = generated(adapter, tmp_path / "generate", prompt, "generate", batch_size=1)
    for key in old:
        assert (new[key] == old[key]).all(), key


@pytest.mark.parametrize("prompt", sorted(VARIANTS))
def test_a_slab_laid_out_anew_at_every_step_keeps_what_it_holds(ending, tmp_path, monkeypatch, prompt):
    """The slots loop's slab with no room to spare (buffers one column past the flight's end): a
    new layout at every decode step and at every admission wider than the flight, everything in
    flight copied each time; the replies stay ``generate``'s, and the copies are counted."""
    from ladbench.inference import decode
    adapter = ending(QWEN_BUILDS[0])
    slots = SAMPLES + 1 if prompt == "sc" else 3
    _, roomy = generated(adapter, tmp_path / "roomy", prompt, "slots", batch_size=1, decode_slots=slots)
    monkeypatch.setattr(decode.Slab, "columns_for", staticmethod(lambda end: end + 1))
    new, tight = generated(adapter, tmp_path / "tight", prompt, "slots", batch_size=1, decode_slots=slots)
    old, _ = generated(adapter, tmp_path / "generate", prompt, "generate", batch_size=1)
    for key in old:
        assert (new[key] == old[key]).all(), key
    # each step's layout copies every sequence kept, as the dynamic cache's append did
    assert tight.decode_stats.kv_positions_copied > roomy.decode_stats.kv_positions_copied + tight.decode_stats.decode_rows


@pytest.mark.parametrize("tight", [False, True], ids=["roomy", "tight"])
@pytest.mark.parametrize("copies_views", [False, True], ids=["views", "copies"])
def test_a_slab_holds_each_sequence_right_aligned_at_its_end_with_zeros_before_it(monkeypatch, tight, copies_views):
    """The slab against a picture kept by hand, through admissions narrower and wider than the
    flight (a new layout), decode steps, a trim and cuts that reuse freed rows: over the columns
    [start, end) every row in flight reads zeros, then its own positions, the last at ``end`` (and
    a step's attention reads just that); a reused row reads nothing of the sequence it held before;
    the copies are counted as DecodeStats says (a new layout: all in flight; an admission: the
    flight; a cut: the rows moved; a contiguous copy for the attention: what it reads). Buffers
    with room to spare, and with none (a new layout at every step); views of them, and contiguous
    copies (where SDPA misreads views)."""
    from ladbench.inference import decode
    from ladbench.inference.decode import DecodeStats, Flight, Slab
    if tight:
        monkeypatch.setattr(Slab, "columns_for", staticmethod(lambda end: end + 1))
    monkeypatch.setattr(decode, "read_views", lambda kv, groups: (0.0, copies_views))
    heads, dim, layers = 2, 5, 3
    serial = iter(range(1, 10**6))
    copies = collections.Counter()

    def positions(n: int, width: int) -> list[list[torch.Tensor]]:
        """Per layer, keys and values [n, heads, width, dim], every position its own nonzero numbers."""
        return [[torch.stack([torch.full((heads, width, dim), 0.0) + torch.arange(1, width + 1)[None, :, None] * 1000
                              + next(serial) for _ in range(n)]) for _ in range(2)] for _ in range(layers)]

    def flight(kv: list[list[torch.Tensor]]) -> Flight:
        n, width = kv[0][0].shape[0], kv[0][0].shape[2]
        return Flight(compat.new_plain_cache(kv), torch.ones(n, width), None, torch.zeros(n, 1), None, list(range(n)))

    stats = DecodeStats()
    first = positions(2, 3)
    slab = Slab(flight(first), rows=4, stats=stats)
    held: list[list[list[torch.Tensor]]] = []        # per row in flight: per layer, [keys, values] [heads, columns, dim]

    def admit(kv):
        n, width = kv[0][0].shape[0], kv[0][0].shape[2]
        copies["expected"] += n * width + (slab.count * slab.width if width > slab.end else 0)
        slab.admit(flight(kv))
        held.extend([[[buf[r] for buf in pair] for pair in kv] for r in range(n)])

    def step():
        copies["expected"] += slab.count * slab.width if slab.end == slab.capacity else 0
        slab.reserve()
        copies["expected"] += slab.count * (slab.width + 1) if copies_views else 0
        new = positions(slab.count, 1)
        for r, row in enumerate(held):
            for layer, pair in enumerate(row):
                pair[:] = [torch.cat([buf, new[layer][i][r]], 1) for i, buf in enumerate(pair)]
        for layer, (keys, values) in enumerate(new):
            read = slab.append(layer, keys, values)              # what the step's attention reads
            for r, row in enumerate(held):
                for got, expected in zip(read, row[layer]):
                    pad = slab.width + 1 - expected.shape[1]
                    assert (got[r, :, :pad] == 0).all() and torch.equal(got[r, :, pad:], expected), (r, layer)
        slab.stepped()

    def cut(live, moved):
        copies["expected"] += moved * slab.width
        order = slab.cut(live)
        held[:] = [held[r] for r in order]
        return order

    def check():
        assert slab.count == len(held) and stats.kv_positions_copied == copies["expected"]
        for r, row in enumerate(held):
            for layer, pair in enumerate(row):
                for buf, expected in zip(slab.kv[layer], pair):
                    got = buf[r, :, slab.start:slab.end]
                    pad = slab.width - expected.shape[1]
                    assert pad >= 0 and (got[:, :pad] == 0).all(), (r, layer)
                    assert torch.equal(got[:, pad:], expected), (r, layer)

    admit(first)                                     # the first flight: a layout 3 columns wide
    check()
    step()
    admit(positions(1, 2))                           # narrower than the flight: no new layout
    check()
    slab.trim(1)                                     # a leading column no sequence needs (padding of all)
    for row in held:
        for pair in row:
            pair[:] = [buf[:, max(buf.shape[1] - slab.width, 0):] for buf in pair]
    step()                                           # a step reading from a column past 0
    check()
    admit(positions(1, slab.width + 1))              # wider than the flight, within its end: zeros before the old rows
    check()
    step()
    assert cut([1, 3], moved=1) == [3, 1]            # row 3 moves into freed row 0
    check()
    admit(positions(1, 2))                           # into a freed row that held a sequence: zeros before it
    check()
    admit(positions(1, slab.end + 3))                # wider than the flight ends: a new layout, then the row
    check()
    step()
    check()
    with pytest.raises(ValueError, match="do not fit a slab of 4 rows"):
        slab.admit(flight(positions(1, 2)))
    assert cut([0, 2, 3], moved=1) == [0, 3, 2]      # row 3 moves into freed row 1; rows 0 and 2 stay
    check()
    step()
    check()
    assert cut([], moved=0) == [] and slab.width == 0


def test_a_slab_layout_leaves_room_for_half_its_end_again_and_at_least_256_steps_in_blocks_of_256():
    from ladbench.inference.decode import Slab
    assert [Slab.columns_for(end) for end in (0, 1, 256, 300, 511, 600, 1000, 2000)] == [256, 512, 512, 768, 768, 1024, 1536, 3072]


def test_the_loops_repetition_penalty_is_transformers_on_logits_of_both_signs():
    """Each sequence's own seen tokens (a mask [B, V]) shrink towards 0 whatever their sign, as
    transformers' processor does given the tokens."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    from ladbench.inference.decode import SlotDecoder
    scores = torch.randn(3, 30, generator=torch.Generator().manual_seed(1)) * 4
    tokens = torch.tensor([[1, 2, 29], [0, 5, 7], [11, 11, 11]])
    seen = torch.zeros(3, 30, dtype=torch.bool).scatter_(1, tokens, True)
    assert (scores[seen] < 0).any() and (scores[seen] > 0).any()
    for penalty in (1.3, 3.0):
        got = SlotDecoder.penalised(SimpleNamespace(penalty=penalty), scores, seen)
        torch.testing.assert_close(got, RepetitionPenaltyLogitsProcessor(penalty)(tokens, scores.clone()), rtol=0, atol=0)
    assert SlotDecoder.penalised(SimpleNamespace(penalty=3.0), scores, None) is scores


def test_a_sequence_goes_on_until_it_ends_or_draws_its_last_allowed_token():
    from ladbench.inference.decode import SlotDecoder
    decoder = SimpleNamespace(max_new_tokens=3)
    steps = torch.tensor([0, 1, 2, 0, 2])                  # tokens generated before this step's draw
    ended = torch.tensor([False, False, False, True, True])
    assert SlotDecoder.continuing(decoder, ended, steps).tolist() == [True, True, False, False, False]


def test_a_short_first_step_does_not_narrow_the_sequences_in_flight(ending, tmp_path):
    """The loop's width comes from the groups' size asked for (halved only by an out-of-memory
    retry), not from the rows of the first step it reads: a first chunk of one row (a resumed job,
    or a chunk smaller than the batch) leaves ``decode_slots`` as set."""
    _, runner = generated(ending(QWEN_BUILDS[0]), tmp_path, "cot", "slots", decode_slots=6)
    runner.decode_stats = type(runner.decode_stats)()
    list(runner.generate_chunks(iter([runner.prepare(ROWS[:1]), runner.prepare(ROWS[1:])])))
    assert runner.decode_stats.slots == 6


@pytest.mark.parametrize("decode", ["slots", "static"])
def test_a_cache_the_loop_cannot_join_takes_the_padded_path_and_says_so_in_one_line(ending, tmp_path, monkeypatch,
                                                                                    caplog, decode):
    """A decoder with sliding-window layers (here the tiny Qwen2.5-VL's text config set to say so;
    its attention is unchanged, so the replies can still be compared): its groups decode one at a
    time until all their sequences end, whatever ``decode_slots`` and ``decode``, with the same
    replies as ``generate``, and the job's log says so once, with the reason."""
    adapter = ending(QWEN_BUILDS[0])
    old, _ = generated(adapter, tmp_path / "generate", "sc", "generate")
    monkeypatch.setattr(adapter.text_config, "use_sliding_window", True)
    with caplog.at_level("WARNING", logger="ladbench.inference.decode"):
        new, loop = generated(adapter, tmp_path / "loop", "sc", decode, decode_slots=12)
    for key in ("text", "sample_parsed", "parsed", "n_generated"):
        assert (new[key] == old[key]).all(), key
    stats = loop.decode_stats
    assert stats.ring_columns == 0 and stats.prefills == len(ROWS) // 2           # groups of 2 rows, no ring
    assert stats.decode_rows == stats.decode_steps * 2 * SAMPLES                  # a whole group each step
    # each sample's copy of its row's prompt cache, then every step's concatenation copies all a
    # sequence holds (the step's reads, less the one new position each)
    assert stats.kv_positions_copied == SAMPLES * stats.prefilled_tokens + stats.kv_positions_read - stats.decode_rows
    (line,) = [r.getMessage() for r in caplog.records if r.name == "ladbench.inference.decode"]
    assert "(its text config sets use_sliding_window)" in line and "(the padded path), not 12 sequences" in line
    assert line.endswith("static shapes do not apply") == (decode == "static")


def test_the_padded_path_reasons_name_what_the_loop_cannot_cut_or_join():
    from ladbench.inference.decode import padded_path_reason
    from ladbench.models import compat
    full = SimpleNamespace(layer_types=["full_attention"] * 4)
    cache = compat.new_plain_cache([[torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2)]])
    position = torch.zeros(1, 1, dtype=torch.long)
    assert padded_path_reason(full, position, cache) is None
    assert padded_path_reason(SimpleNamespace(), position, cache) is None                 # no layer types: full
    gemma = SimpleNamespace(layer_types=["sliding_attention"] * 5 + ["full_attention"])
    assert padded_path_reason(gemma, position, cache) == "its decoder has sliding_attention layers"
    assert padded_path_reason(full, None, cache) == "it takes no position ids"
    assert padded_path_reason(full, position, object()) == "its cache (object) is not plain keys and values per layer"


def test_the_sequences_in_flight_default_to_the_batch_on_a_cpu_and_at_least_64_on_a_gpu():
    """``decode_slots`` unset: batch_size x samples (the prefill group) on the CPU, at least
    GPU_DECODE_SLOTS on a GPU; set: as set, on either; both halve with the groups of an
    out-of-memory retry."""
    from ladbench.inference.runner import GPU_DECODE_SLOTS, decode_sequences
    assert decode_sequences(10, 4, None, gpu=False) == 40 and decode_sequences(1, 4, None, gpu=False) == 4
    assert decode_sequences(10, 4, None, gpu=True) == GPU_DECODE_SLOTS == decode_sequences(1, 4, None, gpu=True)
    assert decode_sequences(10, 8, None, gpu=True) == 80
    assert decode_sequences(1, 4, 12, gpu=True) == 12 == decode_sequences(1, 4, 12, gpu=False)
    assert decode_sequences(1, 4, None, gpu=True, group_rows=2) == GPU_DECODE_SLOTS // 2
    assert decode_sequences(10, 4, 12, gpu=False, group_rows=1) == 3
    assert decode_sequences(1, 4, None, gpu=False, group_rows=4) == 4


def test_keyed_draws_at_per_sequence_steps_equal_the_shared_step():
    """The loop draws each sequence at its own step; the draws equal the processor's at that step."""
    from ladbench.inference.sampling import KeyedSampler, sequence_keys
    keys = sequence_keys(5, torch.arange(4), 2)
    scores = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    sampler = KeyedSampler(keys, prompt_length=10, temperature=0.8, top_k=7)
    steps = torch.tensor([0, 3, 1, 1, 2, 0, 5, 3])
    drawn = sampler.draw(scores, keys, steps)
    for b in range(8):
        alone = KeyedSampler(keys[b:b + 1], 10, 0.8, 7)(torch.zeros(1, 10 + int(steps[b])), scores[b:b + 1])
        assert alone.argmax(-1).item() == drawn[b].item()
    assert np.unique(drawn.numpy()).size > 1


def _fmix32(x: int) -> int:
    """murmur3's fmix32 on Python's integers: the reference of the sampler's tensor version."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = x * 0x85EBCA6B & 0xFFFFFFFF
    x ^= x >> 13
    x = x * 0xC2B2AE35 & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_keyed_noise_is_the_documented_hash_of_seed_row_sample_step_and_token():
    """The sampler's numbers, however the tensors compute them (stream keys mixed once, the
    tokens' hashes looked up in a table), are gumbel-hash-v1's: fmix32 chained over (seed, row,
    sample), then (step), then (token id + 0x9E3779B9), computed here on Python's integers."""
    from ladbench.inference.sampling import token_hashes, uniform, sequence_keys
    seed, rows, samples, vocab = 2**31 + 5, torch.tensor([0, 7, 2**32 - 1]), 3, 1000
    keys = sequence_keys(seed, rows, samples)
    tokens = torch.tensor([[0, 1, 999], [65535 % vocab, 500, 3]]).repeat(len(keys) // 2 + 1, 1)[:len(keys)]
    steps = torch.arange(len(keys)) * 65537
    got = uniform(keys, steps, tokens, token_hashes(vocab, torch.device("cpu")))
    for j, (row, sample) in enumerate((r, s) for r in rows.tolist() for s in range(samples)):
        stream = _fmix32(_fmix32(_fmix32(_fmix32(_fmix32(seed) ^ row) ^ sample)) ^ int(steps[j]))
        for k, token in enumerate(tokens[j].tolist()):
            expected = (_fmix32(stream ^ _fmix32(token + 0x9E3779B9)) + 0.5) / 2**32
            assert got[j, k].item() == expected


def test_a_generation_option_only_generate_applies_is_found_even_at_token_id_0():
    """Token 0 is a token: a forced BOS of id 0 sends the model through ``generate``; unset
    options (None, 0 n-grams, a neutral 1.0) leave it to the loop."""
    from ladbench.inference.decode import unreproduced_options

    def options(**config):
        return unreproduced_options(SimpleNamespace(model=SimpleNamespace(generation_config=SimpleNamespace(**config))))
    assert options(forced_bos_token_id=0) == ["forced_bos_token_id"]
    assert options(forced_eos_token_id=None, no_repeat_ngram_size=0, exponential_decay_length_penalty=1.0) == []
    assert options(no_repeat_ngram_size=3) == ["no_repeat_ngram_size"]


@pytest.mark.parametrize("decode", ["slots", "static"])
@pytest.mark.parametrize("prompt", sorted(VARIANTS))
def test_on_a_gpu_a_decode_step_attends_on_the_kv_heads_without_copying_them(ending, tmp_path, monkeypatch,
                                                                              prompt, decode):
    """With a GPU's attention (forced here: ``packs_on``), every layer of every decode step runs
    :func:`~ladbench.models.attention.one_query_attention` (no KV cache copied per query head, as
    ``repeat_kv`` does), the prefill keeps SDPA, and the replies equal ``generate``'s (which
    decodes through the same attention)."""
    from ladbench.models import attention
    monkeypatch.setattr(attention, "packs_on", lambda device: True)
    calls = []
    one_query = attention.one_query_attention

    def counted(query, *args):
        calls.append(query.shape[0])
        return one_query(query, *args)
    monkeypatch.setattr(attention, "one_query_attention", counted)
    adapter = ending(QWEN_BUILDS[0])
    new, loop = generated(adapter, tmp_path / "loop", prompt, decode)
    layers = adapter.text_config.num_hidden_layers
    stats = loop.decode_stats
    assert len(calls) == layers * stats.decode_steps                   # the prefills: none
    if decode == "slots":
        assert sum(calls) == layers * stats.decode_rows                # every sequence of every step
    old, _ = generated(adapter, tmp_path / "generate", prompt, "generate")
    for key in ("text", "parsed", "n_generated"):
        assert (new[key] == old[key]).all(), key


def misreading_sdpa(sdpa):
    """Torch's SDPA as a kernel that assumes contiguous keys and values would run it: a strided view
    is read as if its elements lay one after another from its first one (pytorch#112577's kind of
    failure: no error, wrong values); only in calls of a few query positions (decode steps: the
    vision tower's calls, which also take strided inputs, are left alone)."""
    def misread(t: torch.Tensor) -> torch.Tensor:
        return t if t.is_contiguous() else t.as_strided(t.shape, t.new_empty(t.shape).stride(), t.storage_offset())

    def kernel(query, key, value, *args, **kwargs):
        if query.dim() == 4 and query.shape[-2] <= 8:
            key, value = misread(key), misread(value)
        return sdpa(query, key, value, *args, **kwargs)
    return kernel


def test_where_sdpa_misreads_strided_views_the_slab_hands_it_contiguous_copies(ending, tmp_path, monkeypatch, caplog):
    """The slab's attention reads strided views of its buffers (the packed query on a GPU passes
    them to SDPA as they are). On a device whose SDPA misreads such views, the loop's probe finds it
    once, says so in one warning, and gives the attention contiguous copies (counted as KV copies):
    the replies stay ``generate``'s. Without the probe the same kernel changes them."""
    from ladbench.inference import decode
    from ladbench.models import attention
    monkeypatch.setattr(attention, "packs_on", lambda device: True)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        misreading_sdpa(torch.nn.functional.scaled_dot_product_attention))
    attention.strided_kv_read_error.cache_clear()
    try:
        assert not attention.strided_kv_read_right(attention.strided_kv_read_error("cpu", torch.float32, 2, 16, 2),
                                                   torch.float32)
        adapter = ending(QWEN_BUILDS[0])
        old, _ = generated(adapter, tmp_path / "generate", "sc", "generate")
        with caplog.at_level("WARNING", logger="ladbench.inference.decode"):
            new, loop = generated(adapter, tmp_path / "copies", "sc", "slots")
        assert sum("reads strided views" in r.getMessage() for r in caplog.records) == 1
        for key in ("text", "parsed", "n_generated"):
            assert (new[key] == old[key]).all(), key
        copied = loop.decode_stats.kv_positions_copied
        assert loop.decoder.store.copies_views and loop.decoder.store.view_read_error > 0.1
        monkeypatch.setattr(decode, "read_views", lambda kv, groups: (0.0, False))
        unprobed, views = generated(adapter, tmp_path / "views", "sc", "slots")
        assert (unprobed["text"] != old["text"]).any()
        assert views.decode_stats.kv_positions_copied < copied
    finally:
        attention.strided_kv_read_error.cache_clear()


def test_a_decode_steps_additive_mask_is_what_sdpa_makes_of_the_boolean_one():
    """Made once per step instead of by SDPA in every layer: 0 where a key is seen, -inf where not,
    rows 8-aligned in memory (the memory-efficient kernel's ask), and the same attention, bit for bit."""
    from ladbench.models.attention import additive_mask
    padding = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    mask = additive_mask(padding, torch.float32)
    inf = float("-inf")
    assert mask.shape == (2, 1, 1, 5) and mask.tolist() == [[[[inf, inf, 0, 0, 0]]], [[[0, 0, 0, 0, 0]]]]
    assert all(stride % 8 == 0 for stride in mask.stride()[:-1]) and mask.stride(-1) == 1
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        query = torch.randn(2, 2, 4, 16, generator=generator).to(dtype)      # 4 query heads packed per KV head
        key, value = (torch.randn(2, 2, 5, 16, generator=generator).to(dtype) for _ in range(2))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        assert torch.equal(sdpa(query, key, value, attn_mask=additive_mask(padding, dtype)),
                           sdpa(query, key, value, attn_mask=padding.bool()[:, None, None, :]))


def test_torchs_sdpa_reads_a_kv_stores_strided_views_right_on_this_machine():
    """The probe on the CPU's own kernels: strided views and contiguous copies give the same values
    (both lanes pass the slab's views to SDPA here: 5.x always, 4.53 with the packed query)."""
    from ladbench.models import attention
    for dtype in (torch.float32, torch.bfloat16):
        for groups in (1, 8):
            error = attention.strided_kv_read_error("cpu", dtype, 2, 64, groups)
            assert attention.strided_kv_read_right(error, dtype) and error == 0.0


def test_the_strided_read_probe_measures_the_kernels_relative_error(monkeypatch):
    """A kernel whose output on strided views is off by a factor 1 + r is measured at r, and r
    reads as a misread where it exceeds what the dtype's own rounding explains; meta: 0."""
    from ladbench.models import attention
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def off_by(relative):
        def kernel(query, key, value, **kwargs):
            output = sdpa(query, key, value, **kwargs)
            return output if key.is_contiguous() else output * (1 + relative)
        return kernel
    try:
        for dtype, relative, right in [(torch.float32, 1e-3, False), (torch.float32, 1e-6, True),
                                       (torch.float64, 1e-6, False), (torch.bfloat16, 0.1, False)]:
            attention.strided_kv_read_error.cache_clear()
            monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", off_by(relative))
            error = attention.strided_kv_read_error("cpu", dtype, 2, 16, 2)
            assert error == pytest.approx(relative, rel=0.1)
            assert attention.strided_kv_read_right(error, dtype) is right, (dtype, relative)
    finally:
        attention.strided_kv_read_error.cache_clear()
    assert attention.strided_kv_read_error("meta", torch.float32, 2, 16, 2) == 0.0


@pytest.mark.parametrize(("family", "prompt", "gpu_kernels"),
                         [(QWEN_BUILDS[0], prompt, gpu) for prompt in sorted(VARIANTS) for gpu in (False, True)]
                         + [(family, "sc", True) for family in DECODE_FAMILIES if family not in QWEN_BUILDS],
                         ids=lambda value: {False: "cpu", True: "gpu kernels"}.get(value, value))
def test_the_static_step_compiles_as_one_graph_and_replies_stay_equal(ending, tiny_model, tmp_path, monkeypatch,
                                                                      family, prompt, gpu_kernels):
    """``--decode static``: the step traces whole (``fullgraph=True``: no graph break, which CUDA
    graphs need), once per ring shape, and the compiled steps give the eager replies; also with a
    GPU's kernels: its one-query attention (``packs_on``: the query heads packed on the KV heads)
    and its fused RMSNorms (a model loaded with them). One graph over steps also means nothing on
    the host that changes from step to step decides what a step launches (a guard would fail and
    recompile), which a CUDA graph of the eager step (``--decode graphs``) relies on: checked for
    every family with a GPU's kernels."""
    from ladbench.inference import decode
    from ladbench.models import attention, kernels
    monkeypatch.setattr(attention, "packs_on", lambda device: gpu_kernels)
    monkeypatch.setattr(kernels, "fused_rms_norm_on", lambda device: gpu_kernels)
    compiled = []

    def options(device):
        compiled.append(device)
        return {"backend": "eager", "fullgraph": True, "dynamic": False}
    monkeypatch.setattr(decode, "static_compile_options", options)
    adapter = ending_adapter(tiny_model, family) if gpu_kernels else ending(family)
    assert bool(adapter.fused_norms) == gpu_kernels
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    # generate first: 4.53's Qwen2.5-VL forward keeps the M-RoPE deltas of its last own position
    # computation on the model and copies them into every output (a guard of the compiled step);
    # the loop's prefills take their positions from the host and leave it alone, generate sets it
    old, _ = generated(adapter, tmp_path / "generate", prompt, "generate")
    steps_begun = []              # each compiled step a new CUDA-graph step: its replay may reuse the last one's memory
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: steps_begun.append(1))
    new, loop = generated(adapter, tmp_path / "compiled", prompt, "static")
    assert compiled and loop.decode_stats.ring_columns
    assert len(steps_begun) == loop.decode_stats.decode_steps > 0
    again = loop.generate_batch(loop.prepare(ROWS[:4]))                     # the next step of the stage
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1     # one ring, one graph, both steps
    for key in ("text", "parsed", "n_generated"):
        assert (new[key] == old[key]).all(), key
        assert (again[key] == old[key][:4]).all(), key


class _Layer:
    """A cache layer as transformers' repeat sees it, with a prompt tensor it may leave behind."""

    def __init__(self, batch: int, repeats_prompt_keys: bool):
        self.keys = torch.zeros(batch, 1, 3, 2)
        self.prompt_keys = torch.zeros(batch, 1, 5, 2)
        self.repeats_prompt_keys = repeats_prompt_keys

    def batch_repeat_interleave(self, repeats: int):
        self.keys = self.keys.repeat_interleave(repeats, 0)
        if self.repeats_prompt_keys:
            self.prompt_keys = self.prompt_keys.repeat_interleave(repeats, 0)


class _Cache:
    def __init__(self, layers):
        self.layers = layers

    def batch_repeat_interleave(self, repeats: int):
        for layer in self.layers:
            layer.batch_repeat_interleave(repeats)


@pytest.mark.parametrize("samples", [2, 3])
def test_a_padded_group_repeated_per_sample_is_checked_layer_by_layer(samples):
    """The padded path repeats a group's cache once per sample: every 4-D tensor a layer holds
    must come out at the repeated batch (a layer state transformers' repeat leaves at the
    prompt's batch would decode with another sequence's keys), and a layer with no repeat at
    all is refused before anything is repeated. Both are :class:`UnrepeatableCache`, which
    sends the job through ``generate``."""
    from ladbench.inference.decode import Flight, UnrepeatableCache, take

    def flight(cache):
        return Flight(cache, torch.ones(2, 3), None, torch.zeros(2, 5), None, seq=[0, 1])
    rows = [0] * samples + [1] * samples
    good = _Cache([_Layer(2, True), _Layer(2, True)])
    taken = take(flight(good), rows, joinable=False)
    assert taken.seq == rows and [layer.prompt_keys.shape[0] for layer in good.layers] == [2 * samples] * 2
    with pytest.raises(UnrepeatableCache, match="_Layer.prompt_keys is not repeated along the batch"):
        take(flight(_Cache([_Layer(2, True), _Layer(2, False)])), rows, joinable=False)
    bare = _Cache([_Layer(2, True), object()])
    with pytest.raises(UnrepeatableCache, match="_Cache's layers cannot be repeated along the batch"):
        take(flight(bare), rows, joinable=False)
    assert bare.layers[0].keys.shape[0] == 2                               # refused before any repeat


@pytest.mark.current_lane("family auto's architectures run on the current lane")
def test_a_cache_transformers_repeats_only_in_part_sends_self_consistency_through_generate(auto_adapter, tmp_path):
    """Unlimited-OCR's cache layers keep the prompt's keys beside their window, which transformers'
    generic repeat leaves at the prompt's batch: the loop finds it when it repeats the cache for the
    samples and generates through ``generate`` instead, with its replies."""
    adapter = auto_adapter("unlimited_ocr")
    new, loop = generated(adapter, tmp_path / "loop", "sc", "slots")
    old, _ = generated(adapter, tmp_path / "generate", "sc", "generate")
    assert "is not repeated along the batch" in loop.generate_reason
    for key in ("text", "sample_parsed", "parsed", "n_generated"):
        assert (new[key] == old[key]).all(), key
    # CoT needs no repeat: its groups decode together in the loop (the padded path), as generate's
    new, loop = generated(adapter, tmp_path / "cot-loop", "cot", "slots")
    old, _ = generated(adapter, tmp_path / "cot-generate", "cot", "generate")
    assert loop.generate_reason is None and loop.decode_stats.decode_steps
    for key in ("text", "parsed", "n_generated"):
        assert (new[key] == old[key]).all(), key


@pytest.mark.parametrize("prompt", sorted(VARIANTS))
def test_kv_cache_copies_are_counted_as_worked_out_by_hand(ending, tmp_path, monkeypatch, prompt):
    """The KV cache positions each path copies, for one group of every row (no later joins),
    worked out by hand from the replies' and prompts' lengths. Both paths first repeat each row's
    cache per sample for self-consistency (rows x S x W, W the group's padded prompt) and copy each
    sequence's W positions into their store (the slots loop's slab, the ring's slot). Then the
    slots loop, at step t: cuts the columns no sequence staying in flight needs (nothing copied),
    appends the step's position in place (nothing copied), and where sequences ended, moves each
    staying sequence from a row past the ones kept into a freed row (its columns copied: the
    longest prompt still in flight + t). transformers' dynamic cache, which the loop used before,
    copied every sequence kept at every step (its append concatenates), and again at a cut."""
    from ladbench.inference import decode
    replies: dict[int, list[int]] = {}
    stream = decode.SlotDecoder.stream

    def recording(self, groups):
        for row, row_replies in stream(self, groups):
            replies[row] = [len(reply) for reply in row_replies]
            yield row, row_replies
    monkeypatch.setattr(decode.SlotDecoder, "stream", recording)
    adapter = ending("qwen2_5_vl")
    _, loop = generated(adapter, tmp_path / "slots", prompt, "slots", batch_size=len(ROWS))
    stats = loop.decode_stats
    (group,) = loop.prepare(ROWS).groups
    prompts = group["attention_mask"].sum(1).tolist()                 # each row's real prompt
    sequences = [(prompts[row], n) for row in sorted(replies) for n in replies[row]]   # row-major, as admitted
    lengths = [n for _, n in sequences]
    assert stats.prefills == 1 and len(set(lengths)) > 1 and len(set(prompts)) > 1
    width = stats.prefilled_tokens // len(ROWS)
    repeat = len(lengths) * width if len(lengths) > len(ROWS) else 0            # the samples' repeat
    expected = concatenated = repeat + len(lengths) * width
    rows, alive = list(range(len(sequences))), len(sequences)         # the sequence in each row of the slab
    for t in range(max(lengths)):
        staying = [r for r, q in enumerate(rows) if lengths[q] > t + 1]      # a reply of n tokens ends at step n - 1
        if not staying:
            break
        held = max(sequences[rows[r]][0] for r in staying) + t
        freed, movers = [r for r in range(len(staying)) if r not in staying], [r for r in staying if r >= len(staying)]
        expected += len(freed) * held
        concatenated += len(staying) * held * (1 if len(staying) == alive else 2)
        moved = rows[:len(staying)]
        for row, mover in zip(freed, movers):
            moved[row] = rows[mover]
        rows, alive = moved, len(staying)
    assert stats.kv_positions_copied == expected
    replies.clear()
    _, ring = generated(adapter, tmp_path / "static", prompt, "static", batch_size=len(ROWS))
    assert ring.decode_stats.kv_positions_copied == repeat + len(lengths) * width
    # after the admissions: the dynamic cache's copies grew with every step, the slab's only where
    # sequences end (here 10 or 30 sequences of at most 12 tokens: 6x and 22x fewer)
    admitted = repeat + len(lengths) * width
    assert stats.kv_positions_copied - admitted < (concatenated - admitted) / 5


@pytest.mark.parametrize("decode", ["slots", "static"])
def test_the_prefills_seconds_are_counted_apart_from_the_decode_steps(ending, tmp_path, monkeypatch, decode):
    """``DecodeStats.prefill_seconds`` (what ``ladbench plan`` prices a study's longer replies with):
    the time inside the prefills on the host's clock, here one that each prefill moves by 1 s and
    each decode step by 100 s: exactly 1 s a prefill, none of the steps' time."""
    from ladbench.inference import decode as decoding
    now = [0.0]
    adapter = ending("qwen2_5_vl")

    def moving(method, seconds):
        def moved(*args, **kwargs):
            now[0] += seconds
            return method(*args, **kwargs)
        return moved
    monkeypatch.setattr(adapter, "prefill", moving(adapter.prefill, 1.0))
    monkeypatch.setattr(adapter, "decode_logits", moving(adapter.decode_logits, 100.0))
    clock = decoding.PrefillClock
    monkeypatch.setattr(decoding, "PrefillClock", lambda device: clock(device, clock=lambda: now[0]))
    _, runner = generated(adapter, tmp_path, "sc", decode)
    stats = runner.decode_stats
    assert stats.prefills == len(ROWS) // 2 and stats.decode_steps > 0 and now[0] > 100 * stats.decode_steps
    assert stats.prefill_seconds == stats.prefills * 1.0


def test_on_a_gpu_the_prefill_clock_reads_cuda_events_on_the_models_stream(monkeypatch):
    """The GPU's branch of :class:`~ladbench.inference.decode.PrefillClock` without a GPU: events
    recorded on the stream of the model's device (cuda:1 here, not the current device), around
    each prefill and nothing else, read once when the run asks for its total (their milliseconds
    in seconds), and none read twice."""
    from ladbench.inference import decode as decoding
    recorded, streams = [], []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self, stream=None):
            streams.append(stream)
            self.at = len(recorded)
            recorded.append(self)

        def synchronize(self):
            assert self.at is not None

        def elapsed_time(self, end):
            return 250.0 * (end.at - self.at)            # ms: one unit between a span's two records
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream of {device}")
    clock = decoding.PrefillClock("cuda:1")
    for _ in range(3):
        with clock.span():
            pass
    assert streams == ["stream of cuda:1"] * 6 and clock.total() == pytest.approx(0.75)
    with clock.span():
        pass
    assert clock.total() == pytest.approx(1.0)           # the earlier spans counted once


def test_a_slab_over_layers_on_several_devices_moves_each_layers_rows_on_its_own_device(monkeypatch):
    """A model spread over two GPUs keeps each layer's KV cache on its GPU: the slab's buffers
    stay on their layer's device, and taking a prefill's rows, cutting (a row moved into a freed
    one) and appending index each layer with indices on its own device (a GPU refuses another
    GPU's). Here layer 0 on the CPU, layer 1 on the meta device (shapes only); the indices made
    are recorded by the device asked for, since the meta device itself takes any."""
    from ladbench.inference import decode
    from ladbench.inference.decode import DecodeStats, Flight, Slab, take
    asked: list[str] = []
    made = decode.device_index

    def recording(values, device):
        asked.append(torch.device(device).type)
        return made(values, device)
    monkeypatch.setattr(decode, "device_index", recording)

    def kv(device, rows, width, start=0.0):
        values = torch.arange(rows * 2 * width * 4, dtype=torch.float32).reshape(rows, 2, width, 4) + start
        return values.to(device)
    layers = [("cpu", 0.0), ("meta", 0.0)]
    prefill = compat.new_plain_cache([[kv(d, 2, 3, s), kv(d, 2, 3, s + 1000)] for d, s in layers])
    parked = Flight(prefill, torch.ones(2, 3, dtype=torch.long), None, torch.zeros(2, 5), None, [0, 2])
    fresh = take(parked, [0, 0, 1, 1], joinable=True)          # two samples of each row
    assert sorted(set(asked)) == ["cpu", "meta"]
    slab = Slab(fresh, rows=4, stats=DecodeStats())
    slab.admit(fresh)
    assert [buf.device.type for pair in slab.kv for buf in pair] == ["cpu", "cpu", "meta", "meta"]
    asked.clear()
    order = slab.cut([0, 2, 3])                        # row 1 ended: the last row moves into it
    assert order == [0, 3, 2] and slab.count == 3
    assert sorted(asked) == ["cpu", "cpu", "meta", "meta"]          # freed rows and movers, per device
    expected = kv("cpu", 2, 3)[[0, 1, 1]]
    assert torch.equal(slab.kv[0][0][:3, :, slab.start:slab.end], expected)
    k, _ = slab.append(1, torch.zeros(3, 2, 1, 4, device="meta"), torch.zeros(3, 2, 1, 4, device="meta"))
    assert k.device.type == "meta" and k.shape == (3, 2, slab.width + 1, 4)



class TwoDeviceAdapter:
    """The adapter surface the decode loop uses, over a fake decoder whose KV cache keeps layer 0
    on the CPU and layer 1 on the meta device (shapes only), as a model spread over two GPUs keeps
    each layer's cache on its GPU. A prompt's last token is its marker m (4, 5, ...): its reply
    repeats m and ends (token 3) at position 10 + 2 (m - 4), so replies end at mixed steps; the
    logits read only the marker and the position, never the cache."""

    END, VOCAB = 3, 12
    device, pad_token_id = "cpu", 0
    model = type("Model", (), {"generation_config": None})()
    text_config = type("TextConfig", (), {})()

    def end_token_ids(self):
        return [self.END]

    def to_device(self, inputs, *, for_prefill=False):
        return inputs

    def logits(self, markers, positions):
        """The next token's logits, for the token at ``positions`` [B]."""
        out = torch.zeros(len(markers), self.VOCAB)
        ending = positions >= 10 + 2 * (markers - 4)
        out[torch.arange(len(markers)), torch.where(ending, self.END, markers)] = 1.0
        return out

    def prefill(self, inputs, use_cache=True):
        from ladbench.models.base import PrefillState
        mask = inputs["attention_mask"]
        rows, width = mask.shape
        cache = compat.new_plain_cache([[torch.zeros(rows, 1, width, 2, device=device)] * 2 for device in ("cpu", "meta")])
        positions = mask.sum(1, keepdim=True)                       # of the first reply token
        return self.logits(inputs["input_ids"][:, -1], positions[:, 0]), PrefillState(cache, mask, positions, width)

    def decode_positions(self, state):
        return state.position_offset

    def decode_logits(self, cache, ids, mask, positions):
        for layer, device in enumerate(("cpu", "meta")):
            new = torch.zeros(ids.shape[0], 1, 1, 2, device=device)
            keys, _ = cache.update(new, new, layer)
            assert keys.device.type == device and keys.shape[-2] == mask.shape[-1]
        return self.logits(ids[:, 0], positions[:, 0] + 1)


@pytest.mark.parametrize("static", [False, True])
def test_the_loop_decodes_a_cache_spread_over_two_devices(caplog, static):
    """Groups of two rows (prompts of 3 to 6 tokens, left padded) through three slots, each layer
    of the cache on its own device: every reply is what the fake decoder dictates (its marker
    repeated, then the end token at its position), sequences leave and join the slab across
    devices, and static shapes, whose ring keeps one device, say in one line that the slots loop
    decodes this model."""
    from ladbench.inference.decode import SlotDecoder
    prompts = [(3, 4), (4, 5), (5, 6), (6, 7), (3, 8), (5, 9)]         # (prompt length, marker)
    width = max(length for length, _ in prompts)

    def group(rows):
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for r, (length, marker) in enumerate(rows):
            ids[r, -1], mask[r, width - length:] = marker, 1
        return {"input_ids": ids, "attention_mask": mask}
    decoder = SlotDecoder(TwoDeviceAdapter(), samples=1, slots=3, max_new_tokens=20, static=static,
                          draw=lambda scores, keys, steps: scores.argmax(-1))
    with caplog.at_level("WARNING"):
        replies = decoder.run([group(prompts[i:i + 2]) for i in range(0, len(prompts), 2)])
    assert replies == [[marker] * (10 + 2 * (marker - 4) - length) + [TwoDeviceAdapter.END] for length, marker in prompts]
    assert decoder.stats.decode_steps < sum(len(reply) for reply in replies) / 2      # sequences shared steps
    warned = [r.getMessage() for r in caplog.records if "static shapes keep the KV cache on one device" in r.getMessage()]
    assert warned == (["static shapes keep the KV cache on one device, and this model's spans cpu, meta: the slots "
                       "loop decodes it"] if static else [])


def test_decode_stats_ratios_and_sums_by_hand():
    """The ratios the generation benchmark reports, and runs added: counts summed, widths the widest.
    A run with nothing counted gives 0, not a division by zero; one reply token divides by 1."""
    from ladbench.inference.decode import WIDTHS, DecodeStats
    run = DecodeStats(decode_steps=2, decode_rows=6, slots=4, token_slots=8, useful_tokens=5, kv_positions_copied=10,
                      kv_positions_read=30, kv_positions_held=24, widest_cache=7, prefill_seconds=0.5)
    assert (run.useful_fraction(), run.occupancy(), run.kv_copies_per_token(), run.kv_reads_per_token(),
            run.kv_reads_held()) == (5 / 8, 6 / 8, 10 / 5, 30 / 5, 24 / 30)
    empty = DecodeStats()
    assert empty == DecodeStats(**{f.name: 0 for f in dataclasses.fields(DecodeStats)})          # every count starts at 0
    assert (empty.useful_fraction(), empty.occupancy(), empty.kv_copies_per_token(), empty.kv_reads_per_token(),
            empty.kv_reads_held()) == (0, 0, 0, 0, 0)
    one = DecodeStats(decode_steps=1, decode_rows=1, slots=1, token_slots=1, useful_tokens=1, kv_positions_copied=3,
                      kv_positions_read=1, kv_positions_held=1)
    assert (one.useful_fraction(), one.occupancy(), one.kv_copies_per_token(), one.kv_reads_per_token(),
            one.kv_reads_held()) == (1, 1, 3, 1, 1)
    total = DecodeStats(decode_steps=1, slots=6, widest_cache=3, ring_columns=9, prefill_seconds=0.25)
    total.add(run)
    assert (total.decode_steps, total.slots, total.widest_cache, total.ring_columns, total.prefill_seconds) == (3, 6, 7, 9, 0.75)
    assert dataclasses.replace(total, decode_steps=0, prefill_seconds=0) == dataclasses.replace(
        run, decode_steps=0, prefill_seconds=0, slots=6, ring_columns=9)
    assert set(WIDTHS) < {f.name for f in dataclasses.fields(DecodeStats)}


def test_the_progress_note_sizes_the_kv_store_by_hand():
    """The job's progress line: tokens generated, and the bytes the slab or ring holds (keys and
    values of every layer), in MiB under a GiB and in GiB from one; no store, no size."""
    from ladbench.inference.decode import DecodeStats, SlotDecoder

    def note(store):
        return SlotDecoder.progress_note(SimpleNamespace(stats=DecodeStats(useful_tokens=12345), store=store))
    assert note(None) == "12,345 tokens generated"
    layer = (torch.zeros(3, 2, 64, 8, dtype=torch.bfloat16), torch.zeros(3, 2, 64, 8, dtype=torch.bfloat16))   # 2 x 6 KiB
    assert note(SimpleNamespace(kv=[layer] * 64)) == "12,345 tokens generated, KV store 0.8 MiB"                # 768 KiB
    big = (torch.empty(3 * 2**27, dtype=torch.uint8, device="meta"),) * 2                                      # 2 x 384 MiB
    assert note(SimpleNamespace(kv=[big] * 2)) == "12,345 tokens generated, KV store 1.50 GiB"
    gib = (torch.empty(2**29, dtype=torch.uint8, device="meta"),) * 2
    assert note(SimpleNamespace(kv=[gib])) == "12,345 tokens generated, KV store 1.00 GiB"


def test_a_ring_serves_a_later_step_only_if_all_it_was_built_for_matches():
    """A stage's next step reuses the ring (and its compiled step) only with as many slots or
    fewer, the same compilation, graphs, model, sampler and penalty state, and the same heads,
    head sizes and dtype of the cache; any one of them different, it builds another."""
    from ladbench.inference.decode import Ring

    def kv(heads=2, dim=4, dtype=torch.float32, value_dim=4):
        return torch.zeros(1, heads, 5, dim, dtype=dtype), torch.zeros(1, heads, 5, value_dim, dtype=dtype)
    adapter = object()
    ring = SimpleNamespace(slots=4, compile_options={"mode": "reduce-overhead"}, graphs=True, adapter=adapter,
                           keys=torch.zeros(4), seen=None, kv=[kv()] * 2)
    built_for = dict(slots=4, compile_options={"mode": "reduce-overhead"}, graphs=True, adapter=adapter,
                     keys=torch.zeros(2), seen=None, cache=(kv(),) * 2)

    def serves(**different):
        step = {**built_for, **different}
        decoder = SimpleNamespace(**{k: step[k] for k in ("slots", "compile_options", "graphs", "adapter")})
        first = SimpleNamespace(keys=step["keys"], seen=step["seen"],
                                cache=compat.new_plain_cache([list(pair) for pair in step["cache"]]))
        return Ring.serves(ring, decoder, first)
    assert serves() and serves(slots=3)
    for different in (dict(slots=5), dict(compile_options=None), dict(compile_options={}), dict(graphs=False),
                      dict(adapter=object()),
                      dict(keys=None), dict(seen=torch.zeros(2, 9, dtype=torch.bool)), dict(cache=(kv(),)),
                      dict(cache=(kv(), kv(heads=3))), dict(cache=(kv(), kv(dim=8))), dict(cache=(kv(), kv(dtype=torch.float16))),
                      dict(cache=(kv(), kv(value_dim=8)))):
        assert not serves(**different), different


def test_query_groups_by_hand():
    """Query heads per KV head, which the strided-read probe is asked with: 1 where the config
    states no grouping, no heads, or heads that are not numbers."""
    from ladbench.inference.decode import query_groups
    assert query_groups(SimpleNamespace(num_attention_heads=16, num_key_value_heads=2)) == 8
    assert query_groups(SimpleNamespace(num_attention_heads=16, num_key_value_heads=16)) == 1
    assert query_groups(SimpleNamespace(num_attention_heads=16, num_key_value_heads=None)) == 1
    assert query_groups(SimpleNamespace()) == 1
    assert query_groups(SimpleNamespace(num_attention_heads="16", num_key_value_heads=2)) == 1


def test_kv_positions_held_by_hand():
    """Prompt 5, reply 3 (end token included): two tokens fed, attending 6 and 7 positions; a
    one-token reply is fed nothing; samples of a row share its prompt."""
    from ladbench.inference.decode import kv_positions_held
    assert kv_positions_held([5], [3]) == 6 + 7
    assert kv_positions_held([5, 2], [[3, 1], [2, 4]]) == (6 + 7) + 0 + 3 + (3 + 4 + 5)


def test_a_ring_holds_prompt_reply_and_margin_in_whole_blocks_by_hand():
    """Columns for up to ``tokens`` tokens and 64 more, rounded up to blocks of 128: CoT's
    1,900-token prompts and 1,024-token replies take 3,072 (the docstring's case); 64 tokens fill
    one block exactly, 65 start a second."""
    from ladbench.inference.decode import ring_capacity
    assert ring_capacity(1900 + 1024) == 3072
    assert ring_capacity(64) == 128 and ring_capacity(65) == 256
    assert ring_capacity(0) == 128


def test_the_static_step_is_cuda_graphed_at_fixed_shapes_on_a_gpu_and_eager_on_a_cpu():
    """``--decode static`` on a GPU: ``reduce-overhead`` (CUDA graphs), its shapes fixed (a ring is
    one shape, so its kernels are specialised to it; a ring of another shape compiles anew, which
    ``RING_BLOCK`` keeps rare). On the CPU: not compiled."""
    from ladbench.inference.decode import static_compile_options
    assert static_compile_options("cuda") == static_compile_options(torch.device("cuda", 1)) == {
        "mode": "reduce-overhead", "dynamic": False}
    assert static_compile_options("cpu") is None


@pytest.mark.parametrize("prompt", sorted(VARIANTS))
def test_kv_reads_counted_against_what_the_sequences_hold(ending, tmp_path, prompt):
    """What the sequences hold is the same however they decode (the same replies, the same prompts).
    One sequence in flight (CoT, batch 1, one slot), a step reads exactly that. More in flight, the
    slab also reads the columns a shorter sequence pads to the longest (where the lane's prompts
    differ in length); the ring (``--decode graphs``, eager on the CPU) reads every column of every
    slot at every step, more."""
    adapter = ending(QWEN_BUILDS[0])
    runs = [generated(adapter, tmp_path / f"{decode}{batch}", prompt, decode, batch_size=batch, decode_slots=slots)
            for decode, batch, slots in (("slots", 1, 1), ("slots", 2, None), ("graphs", 2, None))]
    (alone_text, alone), (slab_text, slab), (ring_text, ring) = [(out["text"], runner.decode_stats) for out, runner in runs]
    assert (alone_text == slab_text).all() and (slab_text == ring_text).all()
    assert alone.kv_positions_held == slab.kv_positions_held == ring.kv_positions_held > 0
    # however they decode, each sequence is fed back every token of its reply but the last
    assert alone.decode_rows == slab.decode_rows == ring.decode_rows == alone.useful_tokens - len(alone_text) * (
        SAMPLES if prompt == "sc" else 1)
    assert ring.token_slots % ring.slots == 0 and ring.token_slots >= ring.useful_tokens   # every slot drawn for
    if prompt == "cot":
        assert alone.kv_positions_read == alone.kv_positions_held and alone.kv_reads_held() == 1
        # one sequence in flight: a prefill a row, every token slot useful, a step a row; a reply of
        # L tokens is drawn from its prefill's logits and then from L - 1 steps
        rows, replied = len(alone_text), int(runs[0][0]["n_generated"].sum())
        assert alone.prefills == alone.prefilled_rows == rows and alone.slots == 1
        assert alone.token_slots == alone.useful_tokens == replied and alone.useful_fraction() == 1.0
        assert alone.decode_rows == alone.decode_steps == replied - rows and alone.occupancy() == 1.0
    assert slab.kv_positions_held <= slab.kv_positions_read < ring.kv_positions_read
    assert ring.kv_positions_read == ring.decode_steps * ring.slots * ring.ring_columns
    assert ring.kv_reads_per_token() == ring.kv_positions_read / ring.useful_tokens
