"""Row plan, resumable HDF5 writer and reader of the inference cache (docs/formats.md §4)."""
from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

from ladbench.hdf5 import HDF5FileError
from ladbench.inference.cache import (CacheLayout, CacheWriter, InferenceCache, is_complete_for, partial_path, plan_rows,
                                      read_cache, throughput)

BENCH = {
    "n_candidates": 3,
    "eval": [
        {"id": 0, "caption": "a", "target": 7, "candidates": [5, 7, 9], "orderings": [[0, 1, 2], [2, 0, 1]]},
        {"id": 1, "caption": "b", "target": 4, "candidates": [4, 6, 8], "orderings": [[0, 1, 2], [1, 2, 0]]},
    ],
    "calibration": [{"id": 0, "caption": "c", "target": 3, "candidates": [1, 2, 3]}],
}


def test_row_plan_by_hand():
    plan = plan_rows(BENCH)
    assert plan.split.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert plan.instance.tolist() == [0, 0, 1, 1, 0, 0, 0]
    assert plan.ordering.tolist() == [0, 1, 0, 1, 0, 1, 2]
    # eval instance 0, ordering [2, 0, 1]: shows 9, 5, 7 -> target 7 at position 2
    assert plan.order[1].tolist() == [2, 0, 1] and plan.target_pos[1] == 2
    # calibration shift s shows candidates[(p + s) % N]: target (index 2) at position (2 - s) % 3
    assert plan.order[5].tolist() == [1, 2, 0]
    assert plan.target_pos[4:].tolist() == [2, 1, 0]
    assert plan.shift is None
    assert plan.order.dtype == np.int16 and plan.split.dtype == np.int8 and plan.instance.dtype == np.int32


def test_shared_orderings_plan_the_same_orderings_for_every_instance():
    shared = [[0, 1, 2], [2, 0, 1]]
    bench = {**BENCH, "ordering_scheme": "shared", "orderings": shared,
             "eval": [{**inst, "orderings": shared} for inst in BENCH["eval"]]}
    plan = plan_rows(bench)
    # instance 1 (candidates 4, 6, 8; target 4 = index 0) under [2, 0, 1]: target at position 1
    assert plan.order[:4].tolist() == shared * 2 and plan.target_pos[:4].tolist() == [1, 2, 0, 1]
    with pytest.raises(ValueError, match=r"eval\[1\].orderings differ from the shared orderings"):
        plan_rows({**BENCH, "ordering_scheme": "shared", "orderings": shared})


def test_permavg_plan_adds_all_cyclic_shifts_of_each_ordering():
    plan = plan_rows(BENCH, shifts_per_ordering=True)
    assert len(plan) == 2 * 2 * 3 + 3
    assert plan.shift[:3].tolist() == [0, 1, 2] and plan.ordering[:6].tolist() == [0, 0, 0, 1, 1, 1]
    # instance 0, ordering 1 = [2, 0, 1]; shift 1 shows ordering[(p + 1) % 3] = [0, 1, 2]
    assert plan.order[4].tolist() == [0, 1, 2] and plan.target_pos[4] == 1
    assert plan.shift[-3:].tolist() == [0, 0, 0]    # calibration rows: their shift is their `ordering`
    for r in range(len(plan)):                 # the target really sits where target_pos says
        inst = BENCH["eval" if plan.split[r] == 0 else "calibration"][plan.instance[r]]
        assert inst["candidates"][plan.order[r][plan.target_pos[r]]] == inst["target"]


def test_plan_rejects_bad_benchmarks():
    bad = {**BENCH, "eval": [{**BENCH["eval"][0], "orderings": [[0, 0, 1]]}]}
    with pytest.raises(ValueError, match=r"orderings\[0\] is not a permutation"):
        plan_rows(bad)
    bad = {**BENCH, "calibration": [{"id": 3, "caption": "c", "target": 99, "candidates": [1, 2, 3]}]}
    with pytest.raises(ValueError, match=r"^benchmark calibration \(id 3\): target must be one of the candidates$"):
        plan_rows(bad)
    bad = {**BENCH, "eval": [BENCH["eval"][0], {**BENCH["eval"][1], "target": 99}]}
    with pytest.raises(ValueError, match=r"^benchmark eval \(id 1\): target must be one of the candidates$"):
        plan_rows(bad)


def test_a_plan_starts_at_row_0_and_a_shard_of_it_where_its_rows_start():
    plan = plan_rows(BENCH, shifts_per_ordering=True)
    shard = plan.rows(4, 9)
    assert plan.first_row == 0 and shard.first_row == 4 and shard.rows(1, 3).first_row == 5
    assert shard.order.tolist() == plan.order[4:9].tolist() and shard.shift.tolist() == plan.shift[4:9].tolist()


def _results(rows, n_layers=2, n=3):
    rows = np.asarray(rows)
    return {"scores": np.stack([rows * 10.0 + p for p in range(n)], 1).astype(np.float32),
            "attn": np.broadcast_to((rows * 1.0)[:, None, None], (len(rows), n_layers, n)).astype(np.float32),
            "attn_text": np.broadcast_to((rows * 0.5)[:, None], (len(rows), n_layers)).astype(np.float32)}


LAYOUT = CacheLayout(n_candidates=3, n_layers=2, n_heads=4)


def test_write_resume_finish_and_read_views(tmp_path):
    path = str(tmp_path / "c.h5")
    plan = plan_rows(BENCH)
    w = CacheWriter.open(path, plan, LAYOUT, {"config_sha256": "abc", "n_candidates": 3, "versions": {"t": "1"}})
    assert w.pending_rows().tolist() == list(range(7))
    w.write([2, 0], {k: v for k, v in _results([2, 0]).items()})     # unsorted rows are fine
    assert not os.path.exists(path) and os.path.exists(partial_path(path))   # the final name only when done
    with pytest.raises(FileNotFoundError, match="inference cache not found"):
        read_cache(path)
    with pytest.raises(ValueError, match="not complete"):
        read_cache(partial_path(path))
    assert read_cache(path, require_complete=False)["done"].sum() == 2
    # reopen with the same inputs: resume where it stopped
    w = CacheWriter.open(path, plan, LAYOUT, {"config_sha256": "abc", "n_candidates": 3})
    assert w.pending_rows().tolist() == [1, 3, 4, 5, 6]
    with pytest.raises(RuntimeError, match="5 rows not written"):
        w.finish({})
    w.write([1, 3, 4, 5, 6], _results([1, 3, 4, 5, 6]))
    w.finish({"rows_per_s": 2.5})
    assert not os.path.exists(partial_path(path)) and is_complete_for(path, "abc") and not is_complete_for(path, "x")
    c = read_cache(path)
    assert c.attrs["complete"] and c.attrs["rows_per_s"] == 2.5 and c.attrs["versions"] == {"t": "1"}
    np.testing.assert_array_equal(c["scores"], _results(range(7))["scores"])
    assert c.eval_view("scores").shape == (2, 2, 3)
    assert c.eval_view("scores")[1, 0, 2] == 2 * 10 + 2                 # instance 1, ordering 0 = row 2
    assert c.calibration_view("attn").shape == (1, 3, 2, 3)
    assert c.calibration_view("attn")[0, 2, 0, 0] == 6.0                # calibration shift 2 = row 6
    assert c.calibration_view("target_pos")[0].tolist() == [2, 1, 0]


def test_views_refuse_rows_out_of_row_major_order(tmp_path):
    """Rows that are all there, in the right number, but in another order would put one
    ordering's scores under another's: both views refuse them, as they refuse a missing row."""
    path = str(tmp_path / "c.h5")
    w = CacheWriter.open(path, plan_rows(BENCH), LAYOUT, {"config_sha256": "abc", "n_candidates": 3})
    w.write(list(range(7)), _results(range(7)))
    w.finish({})
    good = read_cache(path)

    def reordered(rows):
        return InferenceCache(path, {k: v[rows] for k, v in good.arrays.items()}, good.attrs)

    eval_swapped = reordered([0, 2, 1, 3, 4, 5, 6])                     # (instance 1, ordering 0) before (0, 1)
    assert sorted(eval_swapped["instance"][:4]) == sorted(good["instance"][:4])
    with pytest.raises(ValueError, match="c.h5: evaluation rows are not instance x ordering in row-major order"):
        eval_swapped.eval_view("scores")
    eval_swapped.calibration_view("scores")                             # the other split is untouched
    for rows in ([0, 1, 2, 3, 4, 6, 5], [0, 1, 2, 3, 4, 5]):             # shifts 2 and 1 swapped; shift 2 missing
        with pytest.raises(ValueError, match="c.h5: calibration rows are not instance x shift in row-major order"):
            reordered(rows).calibration_view("scores")
        reordered(rows).eval_view("scores")


def test_a_folder_is_read_as_unfinished_work_only_by_its_partial_name(tmp_path):
    """Only ``<cache>.partial`` is an unfinished run's folder: another folder at a cache's
    path is refused as a folder, not mistaken for a run that did not finish."""
    path = str(tmp_path / "c.h5")
    w = CacheWriter.open(path, plan_rows(BENCH), LAYOUT, {"config_sha256": "abc", "n_candidates": 3})
    w.write([0], _results([0]))
    assert read_cache(partial_path(path), require_complete=False)["done"].tolist() == [True] + [False] * 6
    os.mkdir(tmp_path / "results")
    for require_complete in (True, False):
        with pytest.raises(HDF5FileError, match=r"results: inference cache: a folder, not a file; delete it"):
            read_cache(str(tmp_path / "results"), require_complete=require_complete)


def test_changed_inputs_replace_the_file_and_same_inputs_keep_it(tmp_path):
    path = str(tmp_path / "c.h5")
    plan = plan_rows(BENCH)
    w = CacheWriter.open(path, plan, LAYOUT, {"config_sha256": "abc"})
    w.write([0], _results([0]))
    inode = os.stat(partial_path(path)).st_ino
    CacheWriter.open(path, plan, LAYOUT, {"config_sha256": "abc"})
    assert os.stat(partial_path(path)).st_ino == inode                  # reused, not recreated
    w2 = CacheWriter.open(path, plan, LAYOUT, {"config_sha256": "other"})
    assert w2.pending_rows().tolist() == list(range(7))                 # new inputs: start over
    w2.write(list(range(7)), _results(range(7)))
    w2.finish({})
    CacheWriter.open(path, plan, LAYOUT, {"config_sha256": "third"})    # a stale finished cache goes away
    assert not os.path.exists(path)


def test_unreadable_file_is_replaced(tmp_path):
    path = tmp_path / "c.h5"
    with open(partial_path(str(path)), "wb") as f:                       # truncated: what a kill mid-write could leave
        f.write(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    w = CacheWriter.open(str(path), plan_rows(BENCH), LAYOUT, {"config_sha256": "abc"})
    assert len(w.pending_rows()) == 7


def test_generative_and_head_datasets(tmp_path):
    path = str(tmp_path / "g.h5")
    layout = CacheLayout(n_candidates=3, n_layers=2, n_heads=4, store_heads=True, generative=True, n_samples=2)
    w = CacheWriter.open(path, plan_rows(BENCH), layout, {"config_sha256": "abc", "n_candidates": 3})
    rows = list(range(7))
    w.write(rows, {"text": np.array([[f"r{r}a", f"r{r}b é"] for r in rows], dtype=object),
                   "parsed": np.array([r % 3 for r in rows], dtype=np.int16),
                   "sample_parsed": np.array([[r % 3, -1] for r in rows], dtype=np.int16),
                   "attn_heads": np.zeros((7, 2, 4, 3), np.float16)})
    w.finish({})
    c = read_cache(path)
    assert c["text"].shape == (7, 2) and c["text"][3, 1] == "r3b é"
    assert c.eval_view("parsed").shape == (2, 2) and np.isnan(c["scores"]).all()
    with h5py.File(path) as f:
        assert f["attn_heads"].dtype == np.float16 and f["parsed"].dtype == np.int16


def test_throughput_by_hand_over_the_timed_rows_only():
    """Rows without a time (never run, or written before times were kept) count in neither the
    rows nor the seconds nor the tokens; a job of under a second is not mistaken for none."""
    seconds, tokens = np.array([0.25, np.nan, 0.25], dtype=np.float32), np.array([10, 99, 30])
    assert throughput(seconds) == {"rows_per_s": 4.0, "timed_rows": 2, "timed_s": 0.5}
    assert throughput(seconds, tokens) == {"rows_per_s": 4.0, "timed_rows": 2, "timed_s": 0.5,
                                           "generated_tokens": 40, "generated_tokens_per_s": 80.0}
    none = throughput(np.full(2, np.nan), np.array([5, 5]))
    assert np.isnan(none["rows_per_s"]) and np.isnan(none["generated_tokens_per_s"])
    assert (none["timed_rows"], none["timed_s"], none["generated_tokens"]) == (0, 0.0, 0)
