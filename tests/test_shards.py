"""Sharded inference (inference.shards): K jobs over contiguous row ranges, merged into the
cache one job writes. The merge is checked by hand on small caches; the workflow with
K = 3 on the demo gives the unsharded demo's caches exactly, and a killed shard reruns
alone while the other shards are kept."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from ladbench.config import REPO_ROOT as ROOT, load_config
from ladbench.hdf5 import resign_attributes
from ladbench.inference.cache import CacheLayout, CacheWriter, plan_rows, read_cache
from ladbench.inference.merge import merge_shards, select_shard, shard_bounds
from workflow_runner import copy_run, demo_config_with, environment, planned_jobs, snakemake, snakemake_command

from test_cache import BENCH

RUN_ATTRS = {"rows_per_s", "timed_rows", "timed_s", "last_run_rows", "last_run_s", "peak_rss_mb", "peak_cuda_mb",
             "versions", "n_shards", "benchmark",   # benchmark: an absolute path, of another folder
             "content_sha256"}                      # the digest of all the attributes, run ones too


def test_shard_bounds_cover_every_row_once():
    for n_rows in (0, 1, 7, 84, 1000):
        for count in (1, 2, 3, 8):
            bounds = [shard_bounds(n_rows, i, count) for i in range(count)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n_rows
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1
    with pytest.raises(ValueError, match="--shard-index 3"):
        shard_bounds(10, 3, 3)


def write_shard(path, plan, index, count, seconds):
    shard, digest, attrs = select_shard(plan, "job-hash", index, count)
    layout = CacheLayout(n_candidates=3, n_layers=2, n_heads=1)
    writer = CacheWriter.open(str(path), shard, layout, {"config_sha256": digest, "model": "m", **attrs})
    rows = np.arange(len(shard))
    global_rows = shard.first_row + rows
    writer.write(rows, {"scores": np.repeat(global_rows[:, None], 3, 1).astype(np.float32),
                        "seconds": np.full(len(rows), seconds, np.float32)})
    writer.finish({**writer.throughput(), "last_run_rows": len(rows), "last_run_s": 10.0 * seconds,
                   "peak_rss_mb": 100.0 * (index + 1), "peak_cuda_mb": float("nan")})
    return path


def test_merge_by_hand(tmp_path):
    plan = plan_rows(BENCH)                                             # 7 rows: shards of 2, 2, 3
    paths = [write_shard(tmp_path / f"{i}.h5", plan, i, 3, seconds=float(i + 1)) for i in (2, 0, 1)]
    out = tmp_path / "merged.h5"
    merge_shards([str(p) for p in paths], str(out))                     # any order
    cache = read_cache(str(out))
    assert cache["scores"][:, 0].tolist() == list(range(7))             # each row from its shard, in order
    for key, values in plan.arrays().items():
        assert np.array_equal(cache[key], values), key
    attrs = cache.attrs
    assert attrs["config_sha256"] == "job-hash" and attrs["n_shards"] == 3 and "shard_index" not in attrs
    assert attrs["timed_rows"] == 7 and attrs["timed_s"] == pytest.approx(2 * 1 + 2 * 2 + 3 * 3)
    assert attrs["rows_per_s"] == pytest.approx(7 / 15)                 # per GPU: all rows / all seconds
    assert attrs["last_run_rows"] == 7 and attrs["last_run_s"] == 30.0  # summed; the slowest shard
    assert attrs["peak_rss_mb"] == 300.0 and np.isnan(attrs["peak_cuda_mb"])


def test_merge_refuses_incomplete_or_mixed_shard_sets(tmp_path):
    plan = plan_rows(BENCH)
    paths = [str(write_shard(tmp_path / f"{i}.h5", plan, i, 3, 1.0)) for i in range(3)]
    with pytest.raises(ValueError, match=r"shards \[0, 2\] given, expected 0..2"):
        merge_shards([paths[0], paths[2]], str(tmp_path / "m.h5"))
    other = write_shard(tmp_path / "other.h5", plan, 1, 2, 1.0)
    with pytest.raises(ValueError, match="one of 2 shards"):
        merge_shards([paths[0], str(other), paths[2]], str(tmp_path / "m.h5"))
    with h5py.File(paths[1], "a") as f:
        f.attrs["job_config_sha256"] = "another-job"
    with pytest.raises(ValueError, match="1.h5: inference cache: changed since it was written"):   # edited by hand
        merge_shards(paths, str(tmp_path / "m.h5"))
    with h5py.File(paths[1], "a") as f:
        resign_attributes(f)                                              # as if written so
    with pytest.raises(ValueError, match="a shard of another job"):
        merge_shards(paths, str(tmp_path / "m.h5"))
    assert not (tmp_path / "m.h5").exists()


# ---- the workflow ---------------------------------------------------------------------
SHARDS = 3
MODEL = "tiny_qwen2_5_vl"


def demo_caches(workdir: Path) -> list[Path]:
    return sorted((workdir / "results/demo/cache").rglob("*.h5"))


def read_all(path: Path) -> tuple[dict, dict]:
    with h5py.File(path, "r") as f:
        return {k: f[k][()] for k in f}, dict(f.attrs)


def assert_same_cache(merged: Path, reference: Path) -> None:
    arrays, attrs = read_all(merged)
    ref_arrays, ref_attrs = read_all(reference)
    assert set(arrays) == set(ref_arrays)
    for key in arrays:
        if key != "seconds":
            floats = arrays[key].dtype.kind == "f"        # (string datasets: no NaN to compare)
            assert np.array_equal(arrays[key], ref_arrays[key], equal_nan=floats), f"{merged}: {key}"
    assert np.isfinite(arrays["seconds"]).all()
    differ = {k for k in set(attrs) | set(ref_attrs) if not np.array_equal(attrs.get(k), ref_attrs.get(k))}
    assert differ <= RUN_ATTRS, differ
    assert attrs["n_shards"] == SHARDS and attrs["config_sha256"] == ref_attrs["config_sha256"]


@pytest.mark.slow
def test_sharded_demo_equals_unsharded_and_a_killed_shard_reruns_alone(demo_run, tmp_path):
    # chunks of 4 rows: a shard (28 rows) is written in 7 steps, so the kill below lands mid-shard
    config = demo_config_with(tmp_path, shards=SHARDS, chunk_size=4)
    workdir = copy_run(demo_run, tmp_path)
    caches = [p.relative_to(demo_run) for p in demo_caches(demo_run)]
    plan = planned_jobs(workdir, configfile=config)
    assert plan["infer"] == SHARDS * len(caches) and plan["merge_shards"] == len(caches)

    snakemake(workdir, *map(str, caches), configfile=config)
    for cache in caches:
        assert_same_cache(workdir / cache, demo_run / cache)

    # Shards 0 and 2 of a cache finished, shard 1 is killed mid-run (so nothing is merged
    # yet): the rerun runs shard 1 alone, resuming it, and merges.
    cache = caches[0]
    shard = workdir / "results/demo/shards" / cache.relative_to("results/demo/cache").with_suffix("") / "1-of-3.h5"
    others = {p: p.stat().st_mtime_ns for p in shard.parent.glob("*.h5") if p != shard}
    shard.unlink()
    (workdir / cache).unlink()
    partial = Path(f"{shard}.partial")
    log = tmp_path / "killed-run.log"
    with open(log, "w") as out:
        process = subprocess.Popen(snakemake_command(workdir, "--cores", "1", str(cache), configfile=config),
                                   env=environment(), start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None and rows_done(partial) == 0:
            time.sleep(0.01)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    kept = rows_done(partial)
    assert 0 < kept and not shard.exists(), f"the kill did not land mid-shard:\n{log.read_text()[-3000:]}"
    snakemake(workdir, "--unlock", configfile=config)
    rerun = planned_jobs(workdir, configfile=config)
    assert rerun["infer"] == 1 and rerun["merge_shards"] == 1, rerun
    snakemake(workdir, str(cache), configfile=config)
    assert {p: p.stat().st_mtime_ns for p in others} == others          # the other shards were kept
    with h5py.File(shard, "r") as f:
        assert f.attrs["last_run_rows"] == len(f["done"]) - kept           # it resumed
    assert_same_cache(workdir / cache, demo_run / cache)


def rows_done(partial: Path) -> int:
    try:
        return int(read_cache(str(partial), require_complete=False)["done"].sum())
    except (OSError, ValueError):           # not created yet, or finished and removed meanwhile
        return 0


def test_paper_dry_run_plans_shard_jobs_each_with_its_models_gpus(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)   # the paper's hub models are not cached here
    config = load_config(ROOT / "config.yaml")
    config["inference"]["shards"] = 4
    config["models"]["internvl3_8b"]["gpus_per_job"] = 2
    path = tmp_path / "paper.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    jobs = planned_jobs(tmp_path, configfile=path)
    assert jobs["infer"] == 4 * 72 and jobs["merge_shards"] == 72
    output = snakemake(tmp_path, "--dry-run", "--resources", "gpu=8", configfile=path)
    gpus = Counter()
    for block in output.split("rule infer:")[1:]:
        model = re.search(r"wildcards: model=(\w+)", block).group(1)
        gpus[model, int(re.search(r"resources: .*\bgpu=(\d+)", block).group(1))] += 1
    assert gpus == {("qwen2_5_vl_3b", 1): 96, ("llava_ov15_8b", 1): 96, ("internvl3_8b", 2): 96}
