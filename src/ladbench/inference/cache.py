"""The inference cache (docs/formats.md §4): row plan, resumable HDF5 writer, and reader.

Rows: every evaluation instance x ordering (instance-major), then every calibration
instance x cyclic left shift. The ``permavg`` variant adds, for every evaluation
(instance, ordering), all N cyclic left shifts of that ordering: its evaluation rows are
instance x ordering x shift (shift fastest), with an extra dataset ``shift`` [R] (int16;
0 for calibration rows, whose own shift is in ``ordering`` as usual), and ``order`` holds
what was actually shown: ``order[r, p] = orderings[t][(p + s) % N]``.

Writing: :class:`CacheWriter` is a :class:`ladbench.hdf5.ResumableFile` (the work folder
``<out>.partial/``, one file per chunk of rows written whole or not at all, then the
finished file assembled, signed, ``complete`` set and renamed to ``<out>``: see
``hdf5.py``). ``config_sha256`` identifies the inputs: work from other inputs is discarded,
and a finished ``<out>`` with the same hash is never rewritten (the caller checks
:func:`is_complete_for`). Reading checks the file's content digest (``content_sha256``).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

import h5py
import numpy as np

from ladbench.hdf5 import (DIGEST_ATTR, HDF5FileError, ResumableFile, RowDataset, attributes, check_digest,
                           is_complete, partial_path, reading)

# Part of every cache's config_sha256: a cache written in an older layout is rebuilt.
# 2: per-chunk checksums, text_sha256, benchmark identity attributes. (The content digest,
# content_sha256, changed no dataset: a format-2 cache without it is kept, read with a warning.)
CACHE_FORMAT = 2
# What to do with a cache that cannot be read (the end of its one-line error).
REBUILD = "delete it and rerun the workflow (or `ladbench infer`) to rebuild it"

SPLIT_EVAL, SPLIT_CALIBRATION = 0, 1
ROW_TABLE_KEYS = ("split", "instance", "ordering", "order", "target_pos")


# ----------------------------------------------------------------------------- row plan
@dataclass
class RowPlan:
    """The rows of one cache, before any model runs (all arrays have R rows)."""

    split: np.ndarray          # int8 [R]
    instance: np.ndarray       # int32 [R]
    ordering: np.ndarray       # int16 [R]
    order: np.ndarray          # int16 [R, N]
    target_pos: np.ndarray     # int16 [R]
    shift: np.ndarray | None   # int16 [R] (permavg only)
    first_row: int = 0         # index of row 0 in the whole benchmark's plan (> 0 for a shard)

    def __len__(self) -> int:
        return len(self.split)

    def rows(self, start: int, stop: int) -> "RowPlan":
        """The rows ``start:stop`` of this plan, as a plan of their own (a shard)."""
        part = {k: None if v is None else v[start:stop] for k, v in self.arrays().items()}
        return RowPlan(**{**part, "shift": part.get("shift")}, first_row=self.first_row + start)

    def arrays(self) -> dict[str, np.ndarray]:
        out = {k: getattr(self, k) for k in ROW_TABLE_KEYS}
        if self.shift is not None:
            out["shift"] = self.shift
        return out


def _target_index(inst: Mapping[str, Any], where: str) -> int:
    try:
        return list(inst["candidates"]).index(inst["target"])
    except (KeyError, ValueError):
        raise ValueError(f"benchmark {where} (id {inst.get('id')}): target must be one of the candidates") from None


def plan_rows(benchmark: Mapping[str, Any], *, shifts_per_ordering: bool = False) -> RowPlan:
    """The row plan of a benchmark (docs/formats.md §3, §4); ``shifts_per_ordering`` for permavg."""
    n = int(benchmark["n_candidates"])
    shared = benchmark.get("orderings") if benchmark.get("ordering_scheme") == "shared" else None
    rows: list[tuple[int, int, int, list[int], int]] = []     # split, instance, ordering, order, shift
    for i, inst in enumerate(benchmark["eval"]):
        if len(inst["candidates"]) != n:
            raise ValueError(f"benchmark eval[{i}] has {len(inst['candidates'])} candidates, expected {n}")
        if shared is not None and inst["orderings"] != shared:
            raise ValueError(f"benchmark eval[{i}].orderings differ from the shared orderings the file declares")
        for t, ordering in enumerate(inst["orderings"]):
            if sorted(ordering) != list(range(n)):
                raise ValueError(f"benchmark eval[{i}].orderings[{t}] is not a permutation of range({n})")
            for s in (range(n) if shifts_per_ordering else (0,)):
                rows.append((SPLIT_EVAL, i, t, [ordering[(p + s) % n] for p in range(n)], s))
    for c, inst in enumerate(benchmark["calibration"]):
        if len(inst["candidates"]) != n:
            raise ValueError(f"benchmark calibration[{c}] has {len(inst['candidates'])} candidates, expected {n}")
        for s in range(n):
            rows.append((SPLIT_CALIBRATION, c, s, [(p + s) % n for p in range(n)], 0))
    order = np.array([r[3] for r in rows], dtype=np.int16).reshape(len(rows), n)
    targets = [_target_index(benchmark["eval" if r[0] == SPLIT_EVAL else "calibration"][r[1]],
                             "eval" if r[0] == SPLIT_EVAL else "calibration") for r in rows]
    target_pos = np.array([list(o).index(t) for o, t in zip(order, targets)], dtype=np.int16)
    return RowPlan(split=np.array([r[0] for r in rows], dtype=np.int8),
                   instance=np.array([r[1] for r in rows], dtype=np.int32),
                   ordering=np.array([r[2] for r in rows], dtype=np.int16),
                   order=order, target_pos=target_pos,
                   shift=np.array([r[4] for r in rows], dtype=np.int16) if shifts_per_ordering else None)


# ------------------------------------------------------------------------------ writer
@dataclass(frozen=True)
class CacheLayout:
    """Shapes of the result datasets."""

    n_candidates: int
    n_layers: int
    n_heads: int
    store_heads: bool = False
    generative: bool = False
    n_samples: int = 1         # > 1: self-consistency, texts [R, S]
    greedy: bool = False       # the two greedy reply tokens and their text (the reference's Vanilla readout)


def _result_datasets(layout: CacheLayout, n_rows: int) -> dict[str, RowDataset]:
    """The datasets filled row by row (``done`` is added by the writer)."""
    r, n, lyr = n_rows, layout.n_candidates, layout.n_layers
    out = {
        "scores": RowDataset((r, n), np.float32, np.nan),
        "attn": RowDataset((r, lyr, n), np.float32, np.nan),
        "attn_text": RowDataset((r, lyr), np.float32, np.nan),
        # wall-clock seconds of the row (its batch's time shared equally): the job's rate and
        # Table 2's latency come from all rows, however many resumed runs wrote them
        "seconds": RowDataset((r,), np.float32, np.nan),
    }
    if layout.greedy:
        out["greedy_tokens"] = RowDataset((r, 2), np.int32, -1)
        out["greedy_text"] = RowDataset((r,), h5py.string_dtype("utf-8"), "")
    if layout.store_heads:
        out["attn_heads"] = RowDataset((r, lyr, layout.n_heads, n), np.float16, np.nan)
    if layout.generative:
        text_shape = (r,) if layout.n_samples == 1 else (r, layout.n_samples)
        out["text"] = RowDataset(text_shape, h5py.string_dtype("utf-8"), "")
        out["parsed"] = RowDataset((r,), np.int16, -1)
        # tokens generated for the row (all samples; up to and including each end token)
        out["n_generated"] = RowDataset((r,), np.int32, 0)
        if layout.n_samples > 1:
            out["sample_parsed"] = RowDataset((r, layout.n_samples), np.int16, -1)
    return out


def throughput(seconds: np.ndarray, n_generated: np.ndarray | None = None) -> dict[str, float]:
    """Rates over every timed row (of this run or of earlier, interrupted or parallel ones):
    ``rows_per_s``, ``timed_rows``, ``timed_s``; for generative caches also
    ``generated_tokens`` and ``generated_tokens_per_s`` (over the same rows)."""
    timed = np.isfinite(seconds)
    total = float(seconds[timed].astype(np.float64).sum())
    out = {"rows_per_s": int(timed.sum()) / total if total > 0 else float("nan"), "timed_rows": int(timed.sum()),
           "timed_s": total}
    if n_generated is not None:
        tokens = int(n_generated[timed].astype(np.int64).sum())
        out.update(generated_tokens=tokens, generated_tokens_per_s=tokens / total if total > 0 else float("nan"))
    return out


def text_sha256(texts: np.ndarray) -> str:
    """Digest of the reply texts that caches written before ``content_sha256`` carry."""
    return hashlib.sha256(json.dumps(np.asarray(texts).tolist()).encode()).hexdigest()


def is_complete_for(path: str, config_sha256: str) -> bool:
    """True if ``path`` is a finished cache made from the inputs with this hash."""
    return is_complete(path, {"config_sha256": config_sha256})


class CacheWriter(ResumableFile):
    """Resumable writer of one inference cache; see the module docstring for the guarantees."""

    @classmethod
    def open(cls, path: str, plan: RowPlan, layout: CacheLayout, attrs: Mapping[str, Any]) -> "CacheWriter":
        """Create the work file, or reopen an unfinished one made from the same inputs.

        ``attrs`` must contain ``config_sha256``. A work file is reused only if it is
        readable and has the same ``config_sha256``, row plan and dataset layout; otherwise
        it is replaced. A finished ``path`` from other inputs is removed first (it is stale).
        """
        if "config_sha256" not in attrs:
            raise ValueError("cache attributes need a config_sha256")
        return super().open(path, identity={"config_sha256": attrs["config_sha256"]}, fixed=plan.arrays(),
                            datasets=_result_datasets(layout, len(plan)), attrs=attrs)

    def throughput(self) -> dict[str, float]:
        """:func:`throughput` of every row written so far."""
        arrays, _ = self.read(["seconds", "n_generated"])
        return throughput(arrays["seconds"], arrays.get("n_generated"))


# ------------------------------------------------------------------------------ reader
@dataclass
class InferenceCache:
    """An inference cache in memory: ``arrays`` (docs/formats.md §4 datasets) and ``attrs``.

    ``cache["scores"]`` is the raw [R, ...] array; :meth:`eval_view` and
    :meth:`calibration_view` reshape the evaluation rows to [I, T, ...] ([I, T, N, ...] for
    permavg, axis 2 = shift) and the calibration rows to [C, N, ...] (axis 1 = shift).
    """

    path: str
    arrays: dict[str, np.ndarray]
    attrs: dict[str, Any]

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    def __contains__(self, key: str) -> bool:
        return key in self.arrays

    @property
    def n_candidates(self) -> int:
        return int(self.attrs["n_candidates"])

    @property
    def has_shifts(self) -> bool:
        return "shift" in self.arrays

    def _split_rows(self, split: int) -> np.ndarray:
        return np.flatnonzero(self.arrays["split"] == split)

    def eval_view(self, key: str) -> np.ndarray:
        """``key``'s evaluation rows as [I, T, ...] (permavg: [I, T, N, ...])."""
        rows = self._split_rows(SPLIT_EVAL)
        inst, ordering = self.arrays["instance"][rows], self.arrays["ordering"][rows]
        n_inst, n_ord = (int(inst.max()) + 1, int(ordering.max()) + 1) if len(rows) else (0, 0)
        shape = (n_inst, n_ord) + ((self.n_candidates,) if self.has_shifts else ())
        expected = np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"), -1).reshape(-1, len(shape))
        actual = np.stack([inst, ordering] + ([self.arrays["shift"][rows]] if self.has_shifts else []), -1)
        if actual.shape != expected.shape or not np.array_equal(actual, expected):
            raise ValueError(f"{self.path}: evaluation rows are not instance x ordering"
                             f"{' x shift' if self.has_shifts else ''} in row-major order")
        data = self.arrays[key][rows]
        return data.reshape(shape + data.shape[1:])

    def calibration_view(self, key: str) -> np.ndarray:
        """``key``'s calibration rows as [C, N, ...] (axis 1 = cyclic shift s)."""
        rows = self._split_rows(SPLIT_CALIBRATION)
        n = self.n_candidates
        n_cal = len(rows) // n
        expected = np.stack([np.repeat(np.arange(n_cal), n), np.tile(np.arange(n), n_cal)], -1)
        actual = np.stack([self.arrays["instance"][rows], self.arrays["ordering"][rows]], -1)
        if len(rows) % n or not np.array_equal(actual, expected):
            raise ValueError(f"{self.path}: calibration rows are not instance x shift in row-major order")
        data = self.arrays[key][rows]
        return data.reshape((n_cal, n) + data.shape[1:])


def read_cache(path: str, *, require_complete: bool = True) -> InferenceCache:
    """Read a whole inference cache (docs/formats.md §4) into memory, checked against its
    content digest.

    Raises if the file is not marked complete, unless ``require_complete=False``: then an
    unfinished run's work (the folder ``<path>.partial``) is read when ``path`` does not exist
    yet; unwritten rows hold NaN / -1 and ``done`` is False. JSON attributes (``versions``) are
    decoded; string datasets come back as ``str`` arrays.
    """
    unfinished = str(path)[:-len(".partial")] if os.path.isdir(path) and str(path).endswith(".partial") else None
    if unfinished is None and not require_complete and not os.path.exists(path) and os.path.isdir(partial_path(path)):
        unfinished = path
    if unfinished is not None:
        if require_complete:
            raise ValueError(f"{path}: inference cache is not complete (job unfinished or killed; rerun `ladbench infer`)")
        arrays, raw = ResumableFile(unfinished).read()
        return InferenceCache(path=str(partial_path(unfinished)), arrays=arrays, attrs=_decoded(path, raw))
    with reading(path, "inference cache", REBUILD) as f:
        raw = attributes(f)
        if require_complete and not raw.get("complete", False):
            raise ValueError(f"{path}: inference cache is not complete (job unfinished or killed; rerun `ladbench infer`)")
        arrays = {}
        for key, ds in f.items():
            arrays[key] = ds.asstr()[()] if h5py.check_string_dtype(ds.dtype) else ds[()]
    if raw.get("complete", False):
        check_digest(path, raw, arrays, "inference cache", REBUILD)
    if "text" in arrays and DIGEST_ATTR not in raw and raw.get("text_sha256") not in (None, text_sha256(arrays["text"])):
        raise HDF5FileError(f"{path}: inference cache: corrupted (the reply texts do not match text_sha256); {REBUILD}")
    return InferenceCache(path=path, arrays=arrays, attrs=_decoded(path, raw))


def read_cache_attributes(path: str) -> dict[str, Any]:
    """A cache's attributes plus ``n_rows`` and ``n_eval_rows``, without loading its arrays
    (the attributes and ``split`` checked against the content digest)."""
    with reading(path, "inference cache", REBUILD) as f:
        raw = attributes(f)
        if "split" not in f:
            raise ValueError(f"{path}: no 'split' dataset (docs/formats.md §4)")
        split = f["split"][()]
    check_digest(path, raw, {"split": split}, "inference cache", REBUILD, every_dataset=False)
    attrs = _decoded(path, raw)
    attrs["n_rows"] = int(split.size)
    attrs["n_eval_rows"] = int((split == SPLIT_EVAL).sum())
    return attrs


def _decoded(path: str | os.PathLike, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes as Python values, with the JSON ``versions``, ``attention_layers`` and
    ``attention_windows`` decoded."""
    attrs = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in raw.items()}
    for key in ("versions", "attention_layers", "attention_windows"):
        if isinstance(attrs.get(key), str):
            try:
                attrs[key] = json.loads(attrs[key])
            except ValueError:
                raise HDF5FileError(f"{path}: inference cache: damaged (its {key} attribute is not JSON); "
                                    f"{REBUILD}") from None
    return attrs


def _attributes(f: h5py.File) -> dict[str, Any]:
    """An open cache's attributes as Python values, with the JSON ones decoded."""
    return _decoded(f.filename, attributes(f))
