"""Sharded inference: a job's rows split into K contiguous ranges, one cache per range,
merged into the one cache an unsharded job writes (docs/formats.md §4, "Shards").

A shard is an ordinary inference cache of rows ``shard_start:shard_stop`` of the whole
row plan, resumable on its own. Its ``config_sha256`` is the whole job's hash combined
with the shard's place (so a shard of another split is rebuilt, never resumed), and
``job_config_sha256`` keeps the whole job's hash, which the merged cache gets back: a
merged cache is indistinguishable from an unsharded one, down to ``ladbench infer`` finding
it complete for the same inputs.
"""
from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

import h5py
import numpy as np

from ladbench.atomic import atomic_path
from ladbench.hdf5 import (DIGEST_ATTR, RowDataset, create_row_dataset, open_h5, reading, sign, write_attrs, write_rows,
                           writing)

from .cache import REBUILD, RowPlan, read_cache, read_cache_attributes, throughput

#: What only a shard has (dropped when merging).
SHARD_ATTRS = ("shard_index", "shard_count", "shard_start", "shard_stop", "n_rows_total", "job_config_sha256")
#: Run attributes that add up over shards, and those whose merged value is the highest.
#: (rows_per_s, generated_tokens_per_s: recomputed from the merged `seconds` and
#: `n_generated`, i.e. the rate per GPU; shards run in parallel, so the job's wall time
#: is about last_run_s, the slowest shard's.)
SUMMED = ("last_run_rows",)
MAXED = ("last_run_s", "peak_rss_mb", "peak_cuda_mb")


def shard_bounds(n_rows: int, index: int, count: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of shard ``index`` of ``count``: contiguous, sizes differing by at most one."""
    if not 0 <= index < count:
        raise ValueError(f"--shard-index {index} is not in 0..{count - 1} (--shard-count {count})")
    return n_rows * index // count, n_rows * (index + 1) // count


def select_shard(plan: RowPlan, config_sha256: str, index: int, count: int) -> tuple[RowPlan, str, dict[str, Any]]:
    """The shard's rows, its own cache identity and the attributes that describe it
    (the plan, hash and {} unchanged for ``count == 1``)."""
    if count == 1 and index == 0:
        return plan, config_sha256, {}
    start, stop = shard_bounds(len(plan), index, count)
    digest = hashlib.sha256(f"{config_sha256}:shard:{start}:{stop}:{len(plan)}".encode()).hexdigest()
    attrs = {"shard_index": index, "shard_count": count, "shard_start": start, "shard_stop": stop,
             "n_rows_total": len(plan), "job_config_sha256": config_sha256}
    return plan.rows(start, stop), digest, attrs


def _shard_attributes(paths: Sequence[str]) -> list[dict[str, Any]]:
    """Every shard's attributes, checked to form one job's complete set in order."""
    shards = []
    for path in paths:
        attrs = read_cache_attributes(path)
        for key in ("n_rows", "n_eval_rows", DIGEST_ATTR, "text_sha256"):     # the shard's own, not the merged cache's
            attrs.pop(key, None)
        missing = [key for key in SHARD_ATTRS if key not in attrs]
        if missing:
            raise ValueError(f"{path}: not a shard cache (no {', '.join(missing)})")
        if not attrs.get("complete", False):
            raise ValueError(f"{path}: shard cache is not complete (rerun its `ladbench infer`)")
        shards.append({**attrs, "path": path})
    shards.sort(key=lambda a: a["shard_index"])
    first = shards[0]
    if [a["shard_index"] for a in shards] != list(range(first["shard_count"])):
        raise ValueError(f"shards {[a['shard_index'] for a in shards]} given, expected 0..{first['shard_count'] - 1} "
                         f"({first['path']} is one of {first['shard_count']})")
    for before, after in zip(shards, shards[1:]):
        if after["job_config_sha256"] != first["job_config_sha256"]:
            raise ValueError(f"{after['path']}: a shard of another job than {first['path']} "
                             "(job_config_sha256 differs)")
        if after["shard_count"] != first["shard_count"]:
            raise ValueError(f"{after['path']}: one of {after['shard_count']} shards, {first['path']} "
                             f"one of {first['shard_count']}")
        if after["shard_start"] != before["shard_stop"]:
            raise ValueError(f"{after['path']}: starts at row {after['shard_start']}, the previous shard "
                             f"stops at {before['shard_stop']}")
    if shards[-1]["shard_stop"] != first["n_rows_total"] or first["shard_start"] != 0:
        raise ValueError(f"shards cover rows {first['shard_start']}..{shards[-1]['shard_stop']} "
                         f"of {first['n_rows_total']}")
    return shards


def merged_attributes(shards: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The merged cache's attributes: the first shard's, without the shard ones, with the
    whole job's ``config_sha256`` and the run attributes summed or maxed over shards."""
    first = shards[0]
    attrs = {k: v for k, v in first.items() if k not in SHARD_ATTRS + ("path",)}
    attrs["config_sha256"] = first["job_config_sha256"]
    for key in SUMMED:
        if all(key in a for a in shards):
            attrs[key] = sum(a[key] for a in shards)
    for key in MAXED:
        if all(key in a for a in shards):
            attrs[key] = float(np.fmax.reduce([float(a[key]) for a in shards]))   # NaN (CPU) ignored
    attrs["n_shards"] = len(shards)
    return attrs


def merge_shards(paths: Sequence[str], out: str) -> dict[str, Any]:
    """Write the cache ``out`` from complete shard caches (any order); returns its attributes.
    Shards are read (and checked against their digests) one at a time."""
    shards = _shard_attributes(paths)
    n_rows = shards[0]["n_rows_total"]
    attrs = merged_attributes(shards)
    with writing(out, "inference cache"), atomic_path(out) as tmp, open_h5(tmp, "w", rdcc_nbytes=64 << 20) as dst:
        with reading(shards[0]["path"], "inference cache", REBUILD) as f:
            specs = {key: RowDataset((n_rows,) + ds.shape[1:], ds.dtype, ds.fillvalue) for key, ds in f.items()}
        longest = {key: 1 for key, spec in specs.items() if h5py.check_string_dtype(spec.dtype) is not None}
        for shard in shards:                        # texts: as long as the longest of any shard
            with reading(shard["path"], "inference cache", REBUILD) as f:
                for key in longest:
                    longest[key] = max([longest[key], *(len(t.encode()) for t in f[key].asstr()[()].reshape(-1))])
        for key, spec in specs.items():             # chunked and checksummed as the cache writer's
            text = key in longest
            dtype = h5py.string_dtype("utf-8", longest[key]) if text else spec.dtype
            create_row_dataset(dst, key, RowDataset(spec.shape, dtype, "" if text else spec.fill))
        for shard in shards:
            arrays = read_cache(shard["path"]).arrays
            if set(arrays) != set(dst):
                raise ValueError(f"{shard['path']}: datasets {sorted(arrays)} differ from {sorted(dst)}")
            for key, values in arrays.items():
                write_rows(dst, key, slice(shard["shard_start"], shard["shard_stop"]), values)
        if not dst["done"][()].all():
            raise ValueError(f"{out}: a complete shard has rows not done (corrupt shard?)")
        attrs.update(throughput(dst["seconds"][()], dst["n_generated"][()] if "n_generated" in dst else None))
        write_attrs(dst, {**attrs, "complete": True})
        sign(dst)
    return attrs

