"""How the resumable HDF5 files (CLIP features, inference caches) are written and opened.

- Every dataset is created with ``CHECKSUMS``: HDF5's per-chunk Fletcher-32 checksum, so a
  flipped byte in stored data is a read error instead of a silently different number.
  (HDF5 cannot filter variable-length strings; the cache covers its reply texts with a
  digest attribute instead, see ``inference/cache.py``.) New files use the HDF5 1.10
  format (``LIBVER``), whose object headers carry checksums too.
- Every open, reading or writing, is without HDF5's file lock (``locking=False``): a
  reader holding a ``.partial`` work file open (another stage, ``h5dump``, a notebook)
  never makes the writer's next open fail. Two writers of one file are prevented by the
  workflow (Snakemake locks each job's outputs), not by HDF5.
- A file that cannot be read (missing, not HDF5, truncated, corrupted, unreadable) raises
  :class:`HDF5FileError`: one line naming the file, what is wrong and how to rebuild it.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import h5py
import numpy as np

from ladbench.atomic import atomic_path

log = logging.getLogger(__name__)

CHECKSUMS = {"fletcher32": True}
LIBVER = ("v110", "latest")


class HDF5FileError(ValueError):
    """An HDF5 input cannot be read; the message names the file and the remedy."""


def open_h5(path: str | os.PathLike, mode: str = "r") -> h5py.File:
    """``h5py.File`` without the HDF5 file lock (new files in the 1.10 format)."""
    return h5py.File(path, mode, locking=False, libver=LIBVER)


def _problem(exc: OSError) -> str:
    text = str(exc)
    if isinstance(exc, FileNotFoundError) or "errno = 2," in text:
        return "no such file"
    if isinstance(exc, PermissionError) or "errno = 13," in text:
        return "not readable (permission denied)"
    if "file signature not found" in text:
        return "not an HDF5 file"
    if "truncated file" in text:
        return "truncated (an interrupted copy, or a full disk?)"
    if "filter returned failure" in text or "checksum" in text.lower():
        return "corrupted (a stored checksum does not match the data)"
    if "lock" in text:
        return "locked by another process"
    return f"cannot be read ({text})"


@contextmanager
def reading(path: str | os.PathLike, what: str, remedy: str) -> Iterator[h5py.File]:
    """Open ``path`` read-only (no lock); an HDF5 error while opening or reading it inside
    the block becomes one :class:`HDF5FileError` line, ``<path>: <what>: <problem>; <remedy>``
    (a missing file: :class:`FileNotFoundError`, ``<path>: <what> not found``)."""
    try:
        with open_h5(path, "r") as handle:
            yield handle
    except OSError as exc:
        problem = _problem(exc)
        if problem == "no such file":
            raise FileNotFoundError(f"{path}: {what} not found") from exc
        raise HDF5FileError(f"{path}: {what}: {problem}; {remedy}") from exc


# ----------------------------------------------------------------------------- resumable files
# CLIP features and inference caches are both tables of rows computed batch by batch, and
# both are written the same way, by ResumableFile:
# - the work file ``<out>.partial`` is created with every dataset at full size (filled
#   with NaN / -1 / False) and its fixed inputs, through a temporary file and a rename;
# - each batch is written in one open/close of the file: its results, then its ``done``
#   flags, so a killed job leaves a closed, consistent file and loses at most the batch in
#   flight; a rerun computes only the rows not flagged done;
# - ``complete`` is set last, and only then is the work file renamed to ``<out>``. So
#   ``<out>`` exists only when finished, and a workflow manager that deletes the declared
#   outputs of a killed job (Snakemake does) never deletes the partial work.
# - A work file is resumed only if its identity attributes, its fixed datasets and its
#   datasets' shapes are those asked for; otherwise it is started over (with a warning).

#: Rows per HDF5 chunk of a resumable file's datasets (fewer for a smaller file).
CHUNK_ROWS = 256


@dataclass(frozen=True)
class RowDataset:
    """A dataset of a resumable file, filled row by row: its shape (rows first), dtype and the
    value of rows not yet written."""

    shape: tuple[int, ...]
    dtype: Any
    fill: Any


def partial_path(path: str | os.PathLike) -> str | Path:
    """Where ``path`` is built until it is complete (a Path for a Path, else a string)."""
    return Path(f"{os.fspath(path)}.partial") if isinstance(path, Path) else f"{os.fspath(path)}.partial"


def _jsonable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list, tuple)) else value


def write_attrs(h5: h5py.File, attrs: Mapping[str, Any]) -> None:
    """Set attributes; dicts, lists and tuples are stored as JSON text."""
    for key, value in attrs.items():
        h5.attrs[key] = _jsonable(value)


def create_row_dataset(h5: h5py.File, name: str, spec: RowDataset, chunk_rows: int = CHUNK_ROWS) -> h5py.Dataset:
    """A dataset of ``spec``'s shape chunked by rows, with checksums (except on variable-length
    strings, which HDF5 cannot filter: the caller covers them with a digest attribute)."""
    n_rows = spec.shape[0]
    chunks = (max(1, min(n_rows, chunk_rows)),) + tuple(spec.shape[1:]) if n_rows else None
    checks = {} if h5py.check_string_dtype(np.dtype(spec.dtype)) else CHECKSUMS
    return h5.create_dataset(name, shape=spec.shape, dtype=spec.dtype, fillvalue=spec.fill, chunks=chunks, **checks)


def _rows_selection(rows: np.ndarray) -> slice | np.ndarray:
    """A slice for a contiguous run of increasing rows (fast in HDF5), else the index array."""
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows):
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def _without_nul(values: np.ndarray) -> np.ndarray:
    """HDF5 strings cannot hold NUL (a sampled reply can): replaced by U+FFFD."""
    return np.vectorize(lambda t: t.replace("\0", "\ufffd"), otypes=[object])(values)


def file_problem(path: str | os.PathLike, identity: Mapping[str, Any], fixed: Mapping[str, np.ndarray] = {},
                 datasets: Mapping[str, RowDataset] = {}) -> str | None:
    """None if ``path`` is a resumable file with these identity attributes, fixed datasets
    and dataset shapes; else why it is not."""
    try:
        with open_h5(path, "r") as h5:
            for key, value in identity.items():
                if _jsonable(value) != h5.attrs.get(key):
                    return f"attribute {key} is {h5.attrs.get(key)!r}, expected {_jsonable(value)!r}"
            for key, values in fixed.items():
                if key not in h5 or not np.array_equal(h5[key][()], values):
                    return f"dataset {key} differs (other rows)"
            for key, spec in datasets.items():
                if key not in h5 or h5[key].shape != spec.shape:
                    return f"dataset {key} has another shape (written by another version?)"
    except (OSError, KeyError) as exc:                       # unreadable: killed mid-write
        return f"unreadable ({exc})"
    return None


def is_complete(path: str | os.PathLike, identity: Mapping[str, Any], fixed: Mapping[str, np.ndarray] = {},
                datasets: Mapping[str, RowDataset] = {}) -> bool:
    """True if ``path`` is a finished file made from these inputs (see :func:`file_problem`)."""
    if not os.path.exists(path) or file_problem(path, identity, fixed, datasets) is not None:
        return False
    with open_h5(path, "r") as h5:
        return bool(h5.attrs.get("complete", False))


class ResumableFile:
    """The writer of one resumable HDF5 file (see the comment above for the guarantees)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.final_path = path
        self.path = partial_path(path)

    @classmethod
    def open(cls, path: str | os.PathLike, *, identity: Mapping[str, Any], fixed: Mapping[str, np.ndarray],
             datasets: Mapping[str, RowDataset], attrs: Mapping[str, Any] = {}, chunk_rows: int = CHUNK_ROWS,
             warn: Callable[[str], None] = log.warning):
        """Create the work file, or reopen an unfinished one made from the same inputs.

        ``identity``: attributes that name the inputs (a work file with others is started
        over); ``fixed``: datasets known before any work (the rows' keys); ``datasets``: the
        results, filled row by row, plus ``done`` (added); ``attrs``: other attributes. A
        finished ``path`` is removed first: the caller found it stale (:func:`is_complete`).
        """
        datasets = {**datasets, "done": RowDataset((len(next(iter(fixed.values()))),), np.bool_, False)}
        if os.path.exists(path):
            warn(f"{path}: made from other inputs or settings; rebuilding it")
            os.remove(path)
        work = partial_path(path)
        if os.path.exists(work):
            reason = file_problem(work, identity, fixed, datasets)
            if reason is None:
                return cls(path)
            warn(f"{work}: cannot be resumed ({reason}); starting over")
        with atomic_path(work) as tmp, open_h5(tmp, "w") as h5:
            for key, values in fixed.items():
                h5.create_dataset(key, data=values, **CHECKSUMS)
            for key, spec in datasets.items():
                create_row_dataset(h5, key, spec, chunk_rows)
            write_attrs(h5, {**attrs, **identity, "complete": False})
        return cls(path)

    def pending_rows(self) -> np.ndarray:
        """Indices of the rows not yet written."""
        with open_h5(self.path, "r") as h5:
            return np.flatnonzero(~h5["done"][()])

    def write(self, rows: Sequence[int], results: Mapping[str, np.ndarray], attrs: Mapping[str, Any] = {}) -> None:
        """Write result arrays (first axis = ``rows``), then mark the rows done and set
        ``attrs``, in one open/close."""
        rows = np.asarray(rows, dtype=np.int64)
        order = np.argsort(rows, kind="stable")                # h5py selections need increasing rows
        where = _rows_selection(rows[order])
        with open_h5(self.path, "r+") as h5:
            for key, values in results.items():
                if key not in h5:
                    raise KeyError(f"{self.path}: no dataset {key!r} to write")
                values = np.asarray(values)[order]
                h5[key][where] = _without_nul(values) if values.dtype == object else values
            h5["done"][where] = True
            write_attrs(h5, attrs)

    def final_attrs(self, h5: h5py.File) -> dict[str, Any]:
        """Attributes computed from the finished data (a digest, ...); none here."""
        return {}

    def finish(self, attrs: Mapping[str, Any] = {}) -> None:
        """Set the final attributes and ``complete`` (only if every row is done), then move the
        work file to the final path."""
        with open_h5(self.path, "r+") as h5:
            undone = int((~h5["done"][()]).sum())
            if undone:
                raise RuntimeError(f"{self.path}: {undone} rows not written; refusing to mark the file complete")
            write_attrs(h5, {**attrs, **self.final_attrs(h5), "complete": True})
        os.replace(self.path, self.final_path)

    def attr(self, key: str, default: Any = None) -> Any:
        with open_h5(self.path, "r") as h5:
            return h5.attrs.get(key, default)

    def set_attrs(self, attrs: Mapping[str, Any]) -> None:
        with open_h5(self.path, "r+") as h5:
            write_attrs(h5, attrs)
