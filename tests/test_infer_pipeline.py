"""The ``infer`` driver's input pipeline and batch sizing: batches prepared by DataLoader
workers write the same cache as the inline loop; a batch that runs out of GPU memory is
split and retried (simulated on the CPU by raising torch's out-of-memory error), no row is
lost, and the batch size that ran is recorded."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from conftest_models import TINY_IMAGE_SIZE, make_demo_benchmark
from ladbench.inference import runner
from ladbench.inference.cache import read_cache
from ladbench.variants import variant

pytestmark = [pytest.mark.slow, pytest.mark.lanes]

CONTENT = ("scores", "attn", "attn_text", "order", "target_pos", "split", "instance", "ordering", "done")


def _settings(model, bench, images, out, **overrides) -> runner.InferenceSettings:
    options = dict(benchmark=str(bench), images=str(images), out=str(out), model_name="tiny", family="qwen2_5_vl",
                   model_path=model, device="cpu", image_size=TINY_IMAGE_SIZE, chunk_size=4)
    return runner.InferenceSettings(**{**options, **overrides})


def _assert_same_content(a, b) -> None:
    for key in CONTENT:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_dataloader_workers_write_the_same_cache_as_the_inline_loop(tiny_model, tmp_path):
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=3, n_orderings=2, n_cal=2)     # 14 rows
    inline = runner.run_inference(_settings(model, bench, images, tmp_path / "inline.h5", batch_size=3, workers=0))
    pooled = runner.run_inference(_settings(model, bench, images, tmp_path / "pooled.h5", batch_size=3, workers=2))
    a, b = read_cache(inline), read_cache(pooled)
    _assert_same_content(a, b)
    assert a["done"].all() and a.attrs["batch_size_used"] == b.attrs["batch_size_used"] == 3


def test_grouping_by_prompt_length_keeps_the_results(tiny_model, tmp_path):
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=3, n_orderings=2, n_cal=2)
    plain = read_cache(runner.run_inference(_settings(model, bench, images, tmp_path / "a.h5", batch_size=3)))
    grouped = read_cache(runner.run_inference(_settings(model, bench, images, tmp_path / "b.h5", batch_size=3,
                                                        group_by_length=True)))
    for key, tol in (("scores", 1e-4), ("attn", 1e-5), ("attn_text", 1e-5)):
        np.testing.assert_allclose(grouped[key], plain[key], atol=tol, rtol=0, err_msg=key)
    assert grouped["done"].all()


def test_grouped_rows_keep_their_chunks_and_sort_by_prompt_length(tiny_adapter, tmp_path):
    from ladbench.benchmark import load_benchmark
    from ladbench.data.coco import load_image_table
    from ladbench.inference.cache import plan_rows
    adapter = tiny_adapter("qwen2_5_vl")
    bench_path, images = make_demo_benchmark(tmp_path, 4, n_eval=4, n_orderings=3, n_cal=2)
    bench = load_benchmark(bench_path)
    rr = runner.RowRunner(adapter, _settings(adapter.model_path, bench_path, images, tmp_path / "x.h5"), bench,
                          plan_rows(bench), runner.image_paths(load_image_table(images)))
    rows = list(range(len(rr.plan.split)))
    grouped = rr.grouped_by_length(rows, 5)
    for c0 in range(0, len(rows), 5):
        assert sorted(grouped[c0:c0 + 5]) == rows[c0:c0 + 5]
        lengths = [rr.prepare([r]).inputs["input_ids"].shape[1] for r in grouped[c0:c0 + 5]]
        assert lengths == sorted(lengths)
    assert grouped != rows                                   # captions of two lengths alternate: it reorders


def test_scoring_launches_each_batch_before_it_finishes_the_one_before():
    """One batch ahead: batch k + 1 is queued before batch k's results are read back, results come
    in order, and a launch that fails first hands over the batch before it (a retry redoes only
    the failed batch's rows)."""
    events = []

    def launch(batch):
        if batch.rows == [2]:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        events.append(f"launch {batch.rows[0]}")
        return batch.rows[0]

    def finish(k):
        events.append(f"finish {k}")
        return {"x": np.array([k])}
    stream = runner.launched_stream(launch, finish)
    batches = [runner.PreparedBatch([k], {}) for k in range(4)]
    assert [out["x"][0] for _, out in stream(iter(batches[:2] + batches[3:]))] == [0, 1, 3]
    assert events == ["launch 0", "launch 1", "finish 0", "launch 3", "finish 1", "finish 3"]
    events.clear()
    handed = []
    with pytest.raises(torch.cuda.OutOfMemoryError):
        for batch, _ in stream(iter(batches)):
            handed.append(batch.rows[0])
    assert handed == [0, 1] and events == ["launch 0", "launch 1", "finish 0", "finish 1"]
    events.clear()                                                # inference.score_ahead: false
    alone = runner.launched_stream(launch, finish, ahead=False)
    assert [out["x"][0] for _, out in alone(iter(batches[:2]))] == [0, 1]
    assert events == ["launch 0", "finish 0", "launch 1", "finish 1"]


def test_scoring_one_batch_ahead_equals_one_batch_at_a_time(tiny_adapter, tmp_path):
    """Each batch's results are its own whatever is launched after it (bit for bit on the CPU)."""
    from test_attention_equivalence import _runner
    rr = _runner(tiny_adapter("qwen2_5_vl"), tmp_path, 4, "qwen2_5_vl")
    batches = [rr.prepare(rows) for rows in ([0, 3], [1], [2, 4, 5])]
    alone = [rr.score_batch(batch) for batch in batches]
    ahead = list(runner.launched_stream(rr.launch_scores, rr.finish_scores)(iter(batches)))
    assert [batch.rows for batch, _ in ahead] == [[0, 3], [1], [2, 4, 5]]
    for want, (_, got) in zip(alone, ahead):
        assert want.keys() == got.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_out_of_memory_batches_are_split_and_retried(tiny_model, tmp_path, monkeypatch):
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=3, n_orderings=2, n_cal=2)
    reference = read_cache(runner.run_inference(_settings(model, bench, images, tmp_path / "b2.h5", batch_size=2)))

    real, sizes = runner.RowRunner.launch_scores, []

    def fits_two_rows(self, batch):
        sizes.append(len(batch.rows))
        if len(batch.rows) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(self, batch)
    monkeypatch.setattr(runner.RowRunner, "launch_scores", fits_two_rows)
    out = read_cache(runner.run_inference(_settings(model, bench, images, tmp_path / "b4.h5", batch_size=4,
                                                    workers=1)))
    _assert_same_content(out, reference)
    assert out["done"].all() and out.attrs["batch_size_used"] == 2
    assert sizes[0] == 4 and set(sizes[1:]) == {2}            # split once, then the smaller size throughout


def test_out_of_memory_in_generation_halves_the_groups_in_flight(tiny_model, tmp_path, monkeypatch):
    """A generative step decodes a whole chunk in groups of the batch size; running out of memory
    halves the groups and the sequences in flight (``decode_slots`` with them), not only the rows of
    the step, which would keep the groups, and the memory, as they were."""
    from ladbench.inference.decode import SlotDecoder
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=3, n_orderings=2, n_cal=1)
    settings = dict(prompt="cot", chunk_size=4, workers=1)
    options = dataclasses.replace(variant("cot").options(), max_new_tokens=4)
    reference = read_cache(runner.run_inference(_settings(model, bench, images, tmp_path / "b1.h5", batch_size=1,
                                                          options=options, **settings)))
    real, groups = runner.RowRunner.generate_chunks, []

    def fits_groups_of_one(self, batches):
        def read():                      # the decode loop reads the next step as slots free up
            for batch in batches:
                groups.append([len(g["input_ids"]) for g in batch.groups])
                if max(groups[-1]) > 1:
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
                yield batch
        return real(self, read())
    monkeypatch.setattr(runner.RowRunner, "generate_chunks", fits_groups_of_one)
    slots, decoder_init = [], SlotDecoder.__init__

    def recorded(self, *args, **kwargs):
        decoder_init(self, *args, **kwargs)
        slots.append(self.slots)
    monkeypatch.setattr(SlotDecoder, "__init__", recorded)
    out = read_cache(runner.run_inference(_settings(model, bench, images, tmp_path / "b4.h5", batch_size=4,
                                                    decode_slots=8, options=options, **settings)))
    assert out["done"].all() and out.attrs["batch_size_used"] == 1
    assert (out["text"][:] == reference["text"][:]).all()
    assert groups[0] == [4] and groups[1] == [2, 2] and all(g == [1] * len(g) for g in groups[2:])
    assert slots == [2]                  # 8 sequences for groups of 4 rows: 2 for the groups of 1 that ran


def test_out_of_memory_at_batch_size_one_and_other_errors_are_fatal(tiny_model, tmp_path, monkeypatch):
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=1, n_orderings=2, n_cal=1)

    def never_fits(self, batch):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
    monkeypatch.setattr(runner.RowRunner, "launch_scores", never_fits)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        runner.run_inference(_settings(model, bench, images, tmp_path / "a.h5", batch_size=2))

    def broken(self, batch):
        raise RuntimeError("not a memory problem")
    monkeypatch.setattr(runner.RowRunner, "launch_scores", broken)
    with pytest.raises(RuntimeError, match="not a memory problem"):
        runner.run_inference(_settings(model, bench, images, tmp_path / "b.h5", batch_size=2))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "internvl"])
def test_the_scoring_launch_waits_for_nothing_on_the_host(family, tiny_adapter, tmp_path):
    """On a GPU the host waits wherever it reads a value back (``.item()``, ``bool()``: aten's
    ``_local_scalar_dense``) and wherever it makes a tensor from Python data (``torch.tensor`` of a
    list, indexing with a list: a blocking copy from pageable memory; aten's ``lift_fresh``). The
    H200 profile of 2026-11-27 found three in a batch's launch: transformers' check that the image
    tokens match the tower's features, its check of the padding mask, and the trie's logit columns
    as a list. ``launch_scores`` does none of them (counted on the CPU) once the tower's plan for
    the batch's image grids is cached (Qwen2.5-VL's batched tower; built on the host, once): at
    N = 12, whose two-token identifiers continue along the trie from the prefill, with the greedy
    reply. Its scores and attention masses are those of transformers' own steps (the image
    features put in place by ``masked_scatter``, the mask decided by reading it: the setting
    ``decide_on_host: false``), bit for bit."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from conftest_models import demo_runner
    from ladbench.models import compat
    from ladbench.models.base import IMAGE_TOKEN_INDEX, PADDED_KEY
    if family == "qwen2_5_vl" and not compat.batched_vision_supported():
        pytest.skip("the current lane runs transformers' own vision tower, which reads its grids itself")
    rr = demo_runner(tiny_adapter(family), tmp_path, 12, bench_options=dict(n_eval=2, n_orderings=1, n_cal=1))
    assert len(rr.nodes) > 1                                          # continuations along the trie run
    prepared = rr.prepare([0, 1])
    assert prepared.inputs[PADDED_KEY] and IMAGE_TOKEN_INDEX in prepared.inputs
    rr.s = dataclasses.replace(rr.s, decide_on_host=False)           # the comparison setting: transformers decides
    read_back = rr.prepare([0, 1])
    assert PADDED_KEY not in read_back.inputs and IMAGE_TOKEN_INDEX not in read_back.inputs
    before = rr.score_batch(read_back)                               # and the tower's plan cached
    waits: list[str] = []

    class HostWaits(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default or (
                    func is torch.ops.aten.lift_fresh.default and args[0].numel()):   # (5.x's empty caches copy nothing)
                waits.append(str(func))
            return func(*args, **(kwargs or {}))
    with HostWaits():
        launched = rr.launch_scores(prepared)
    assert waits == []
    after = rr.finish_scores(launched)
    for key in ("scores", "attn", "attn_text", "greedy_tokens"):
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "internvl"])
def test_image_tokens_that_do_not_match_the_features_are_refused_on_the_host(family, tiny_adapter, tmp_path):
    """The places found on the host are the image tokens' (where ``masked_scatter`` writes), as
    many as the features the family counts; a count that differs is transformers' one-line
    error, raised on the host before any device work."""
    from conftest_models import demo_runner
    from ladbench.models import compat
    from ladbench.models.base import IMAGE_TOKEN_INDEX, image_token_index
    if family == "qwen2_5_vl" and not compat.batched_vision_supported():
        pytest.skip("the current lane runs transformers' own vision tower, and its forward places the features")
    adapter = tiny_adapter(family)
    inputs = demo_runner(adapter, tmp_path, 4, bench_options=dict(n_eval=1, n_orderings=1, n_cal=1)).prepare([0]).inputs
    index = inputs[IMAGE_TOKEN_INDEX]
    assert len(index) > 0 and torch.equal(index, (inputs["input_ids"].flatten() == adapter.image_token_id)
                                          .nonzero().squeeze(1))
    assert adapter.image_feature_count(inputs) == len(index)
    with pytest.raises(ValueError, match=rf"^Image features and image tokens do not match: tokens: {len(index)}, "
                                         rf"features {len(index) - 1}$"):
        image_token_index(inputs["input_ids"], adapter.image_token_id, len(index) - 1)
