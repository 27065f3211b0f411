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

import os
from contextlib import contextmanager
from typing import Iterator

import h5py

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
