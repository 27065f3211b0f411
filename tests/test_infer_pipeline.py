"""The ``infer`` driver's input pipeline and batch sizing: batches prepared by DataLoader
workers write the same cache as the inline loop; a batch that runs out of GPU memory is
split and retried (simulated on the CPU by raising torch's out-of-memory error), no row is
lost, and the batch size that ran is recorded."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest_models import TINY_IMAGE_SIZE, make_demo_benchmark
from ladbench.inference import runner
from ladbench.inference.cache import read_cache

pytestmark = pytest.mark.slow

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


def test_out_of_memory_batches_are_split_and_retried(tiny_model, tmp_path, monkeypatch):
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=3, n_orderings=2, n_cal=2)
    reference = read_cache(runner.run_inference(_settings(model, bench, images, tmp_path / "b2.h5", batch_size=2)))

    real, sizes = runner.RowRunner.score_batch, []

    def fits_two_rows(self, batch):
        sizes.append(len(batch.rows))
        if len(batch.rows) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(self, batch)
    monkeypatch.setattr(runner.RowRunner, "score_batch", fits_two_rows)
    out = read_cache(runner.run_inference(_settings(model, bench, images, tmp_path / "b4.h5", batch_size=4,
                                                    workers=1)))
    _assert_same_content(out, reference)
    assert out["done"].all() and out.attrs["batch_size_used"] == 2
    assert sizes[0] == 4 and set(sizes[1:]) == {2}            # split once, then the smaller size throughout


def test_out_of_memory_at_batch_size_one_and_other_errors_are_fatal(tiny_model, tmp_path, monkeypatch):
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=1, n_orderings=2, n_cal=1)

    def never_fits(self, batch):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
    monkeypatch.setattr(runner.RowRunner, "score_batch", never_fits)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        runner.run_inference(_settings(model, bench, images, tmp_path / "a.h5", batch_size=2))

    def broken(self, batch):
        raise RuntimeError("not a memory problem")
    monkeypatch.setattr(runner.RowRunner, "score_batch", broken)
    with pytest.raises(RuntimeError, match="not a memory problem"):
        runner.run_inference(_settings(model, bench, images, tmp_path / "b.h5", batch_size=2))
