"""How the resumable HDF5 files (CLIP features, inference caches) are written, signed and opened.

- Every dataset is created with ``CHECKSUMS``: HDF5's per-chunk Fletcher-32 checksum, so a
  flipped byte in stored data is a read error where it lies. New files use the HDF5 1.10
  format (``LIBVER``), whose object headers carry checksums too. Texts, datasets and
  attributes alike, are stored as fixed-length UTF-8 strings (:func:`write_attrs`,
  :func:`stored_text`): variable-length strings live in HDF5's global heap, which has no
  checksum, and a damaged heap can make HDF5 itself loop forever on a read.
- Every finished file carries a content digest, the attribute ``content_sha256`` (:func:`sign`):
  the sha256 of every dataset (numbers byte for byte, strings text by text) and of every
  other attribute. Fletcher-32 alone misses changes (it sums modulo 65535: a 16-bit word
  turned from 0x0000 to 0xFFFF passes) and HDF5 can checksum neither variable-length strings
  nor attributes; the digest catches any change. Readers check it (:func:`check_digest`); a
  file without one (made by hand, or by a ladbench before 0.2) is read with a one-line warning.
- Every open, reading or writing, is without HDF5's file lock (``locking=False``): a
  reader holding a file open (another stage, ``h5dump``, a notebook) never makes a writer's
  open fail. Two writers of one output are prevented by :func:`writing` (a lock file).
- A file that cannot be read (missing, not HDF5, truncated, corrupted, damaged metadata,
  unreadable) raises :class:`HDF5FileError`: one line naming the file, what is wrong and how
  to rebuild it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import h5py
import numpy as np

from ladbench.atomic import atomic_path, exclusive_lock, fsync_file, warn_unchecked

log = logging.getLogger(__name__)

CHECKSUMS = {"fletcher32": True}
LIBVER = ("v110", "latest")
#: The attribute holding a finished file's content digest (JSON: ``attributes``, ``datasets``).
DIGEST_ATTR = "content_sha256"


class HDF5FileError(ValueError):
    """An HDF5 input cannot be read; the message names the file and the remedy."""


def open_h5(path: str | os.PathLike, mode: str = "r", **options: Any) -> h5py.File:
    """``h5py.File`` without the HDF5 file lock (new files in the 1.10 format). A new file
    (mode ``"w"``) is written through :class:`_GuardedFile`: a full disk or a file-size limit
    is one ``OSError`` naming the file, never HDF5's tracebacks at close nor a crash at exit."""
    if mode == "w":
        return _GuardedH5(path, **options)
    return h5py.File(path, mode, locking=False, libver=LIBVER, **options)


class _GuardedFile(io.RawIOBase):
    """The binary file under a new HDF5 file. Its first failed write (ENOSPC, EFBIG) raises in
    the writer; HDF5 then still holds unwritten metadata and retries at every close, in object
    destructors and at interpreter exit (thousands of ignored tracebacks, then a segmentation
    fault). After that first failure writes are discarded, so those retries succeed: the file
    is garbage and its writer removes it (it is always a temporary)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path, self.failure = os.fspath(path), None
        self._handle = open(path, "w+b", buffering=0)

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._handle.readinto(buffer)

    def write(self, data) -> int:
        if self.failure is None:
            try:
                view = memoryview(data)
                while view:
                    view = view[self._handle.write(view):]
            except OSError as exc:
                self.failure = exc
                raise
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    def truncate(self, size: int | None = None) -> int:
        if self.failure is None:
            try:
                return self._handle.truncate(size)
            except OSError as exc:
                self.failure = exc
                raise
        return self.tell() if size is None else size

    def flush(self) -> None:
        if self.failure is None and not self._handle.closed:
            self._handle.flush()

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.close()
        super().close()


class _GuardedH5(h5py.File):
    """A new HDF5 file written through :class:`_GuardedFile`; closing it raises the first
    write failure (an ``OSError`` naming the file), if one happened."""

    def __init__(self, path: str | os.PathLike, **options: Any) -> None:
        self._guard = _GuardedFile(path)
        # No chunk cache unless asked for: a chunk is then written inside the call that writes it
        # (whole-chunk writes lose nothing), never later by a dataset's destructor, where a failed
        # write leaves HDF5 a half-closed dataset that crashes it at exit (write_rows otherwise).
        options.setdefault("rdcc_nbytes", 0)
        try:
            super().__init__(self._guard, "w", libver=LIBVER, **options)
        except BaseException:
            self._guard.close()
            raise

    @property
    def filename(self) -> str:
        """The file's path (h5py would name the file object)."""
        return self._guard.path

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._guard.close()
        failure = self._guard.failure
        if failure is not None:
            raise OSError(failure.errno, f"{self._guard.path}: cannot write ({failure.strerror})") from None


def _problem(exc: OSError) -> str:
    text = str(exc)
    if isinstance(exc, FileNotFoundError) or "errno = 2," in text:
        return "no such file"
    if isinstance(exc, PermissionError) or "errno = 13," in text:
        return "not readable (permission denied)"
    if isinstance(exc, IsADirectoryError) or "errno = 21," in text:
        return "a folder, not a file"
    if "errno = 28," in text or "No space left" in text or "errno = 27," in text or "File too large" in text:
        return "the disk is full (or the file is over the size limit)"
    if "file signature not found" in text:
        return "not an HDF5 file"
    if "truncated file" in text:
        return "truncated (an interrupted copy, or a full disk?)"
    if "filter returned failure" in text or "checksum" in text.lower():
        return "corrupted (a stored checksum does not match the data)"
    if "unable to lock file" in text.lower():
        return "locked by another process"
    return f"damaged or unreadable ({' '.join(text.split())})"


# What h5py raises, besides OSError, on a file whose metadata (object headers, attributes,
# dataset types) is damaged: none of these come from a healthy file read by this code.
_DAMAGED_METADATA = (KeyError, RuntimeError, AttributeError, TypeError, IndexError, UnicodeDecodeError)


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
    except _DAMAGED_METADATA as exc:
        detail = " ".join(str(exc).split())[:200]
        raise HDF5FileError(f"{path}: {what}: damaged (its HDF5 metadata cannot be read: {type(exc).__name__}: "
                            f"{detail}); {remedy}") from exc


# ----------------------------------------------------------------------------- content digest
def _dtype_name(dtype: Any) -> str:
    dtype = np.dtype(dtype)
    if h5py.check_string_dtype(dtype) is not None or dtype.kind in "OSU":
        return "str"
    return dtype.newbyteorder("<").str if dtype.byteorder not in "|" else dtype.str


def _update(digest: "hashlib._Hash", block: np.ndarray) -> None:
    """Add a block of rows: numbers as little-endian bytes, texts as length-prefixed UTF-8."""
    if _dtype_name(block.dtype) == "str":
        texts = [t.encode("utf-8", "surrogatepass") if isinstance(t, str) else bytes(t) for t in block.reshape(-1)]
        digest.update(b"".join(len(t).to_bytes(8, "little") + t for t in texts))
    else:                                           # the array's own buffer: no copy when little-endian
        digest.update(np.ascontiguousarray(block, dtype=np.dtype(_dtype_name(block.dtype))).reshape(-1).view(np.uint8))


def _digest(blocks: Iterable[np.ndarray], dtype: Any, shape: tuple[int, ...]) -> str:
    digest = hashlib.sha256(f"{_dtype_name(dtype)}{tuple(shape)}".encode())
    for block in blocks:
        _update(digest, np.asarray(block))
    return digest.hexdigest()


def array_digest(values: np.ndarray) -> str:
    """The digest of an array as :func:`sign` records it for a dataset holding it."""
    values = np.asarray(values)
    return _digest([values], values.dtype, values.shape)


#: Rows read at a time when a stored dataset is hashed (about this many bytes).
_DIGEST_BLOCK_BYTES = 64 << 20


def dataset_digest(dataset: h5py.Dataset) -> str:
    """The digest of a stored dataset, read in blocks of rows (never whole in memory)."""
    if dataset.shape is None or dataset.ndim == 0:
        return _digest([np.asarray(dataset[()])] if dataset.shape is not None else [], dataset.dtype,
                       dataset.shape or ())
    row_bytes = max(1, int(np.prod(dataset.shape[1:], dtype=np.int64)) * max(dataset.dtype.itemsize, 1))
    step = max(1, _DIGEST_BLOCK_BYTES // row_bytes)
    blocks = (dataset[start:start + step] for start in range(0, dataset.shape[0], step))
    return _digest(blocks, dataset.dtype, dataset.shape)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()] if value.dtype == object else value.tolist()
    return value.item() if isinstance(value, np.generic) else value


def attributes_digest(attrs: Mapping[str, Any]) -> str:
    """The digest of a file's attributes (all but the digest itself), as read back from HDF5."""
    plain = {key: _plain(value) for key, value in attrs.items() if key != DIGEST_ATTR}
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=repr).encode()).hexdigest()


def sign(h5: h5py.File) -> None:
    """Record the digest of every dataset and attribute of an open file (its last write)."""
    record = {"attributes": attributes_digest(h5.attrs),
              "datasets": {name: dataset_digest(h5[name]) for name in h5}}
    write_attrs(h5, {DIGEST_ATTR: json.dumps(record, sort_keys=True)})


def resign_attributes(h5: h5py.File) -> None:
    """After attributes of a signed file changed on purpose: record their new digest (the
    datasets' digests are kept). A file without a digest is left without one."""
    record = attributes(h5).get(DIGEST_ATTR)
    if record is not None:
        record = json.loads(record)
        record["attributes"] = attributes_digest(h5.attrs)
        write_attrs(h5, {DIGEST_ATTR: json.dumps(record, sort_keys=True)})


def check_digest(path: str | os.PathLike, attrs: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                 what: str, remedy: str, *, every_dataset: bool = True) -> None:
    """Refuse a file whose attributes or given arrays (read from it) differ from what its
    content digest records, with one line naming it and ``remedy``; ``every_dataset``: the
    arrays are all of the file's datasets (one deleted or added is a change too). A file
    without a digest is accepted with a one-line warning."""
    text = attrs.get(DIGEST_ATTR)
    if text is None:
        warn_unchecked(path, what)
        return
    try:
        record = json.loads(_plain(text))
        recorded = record["datasets"]
        changed = [] if record["attributes"] == attributes_digest(attrs) else ["its attributes"]
    except (ValueError, TypeError, KeyError):
        changed, recorded = [f"its {DIGEST_ATTR} attribute"], {}
    if not changed:
        names = set(recorded) | set(arrays) if every_dataset else set(arrays)
        changed = [f"dataset {name}" for name in sorted(names)
                   if name not in arrays or recorded.get(name) != array_digest(arrays[name])]
    if changed:
        raise HDF5FileError(f"{path}: {what}: changed since it was written ({', '.join(changed[:3])}: not what its "
                            f"{DIGEST_ATTR} records); {remedy}")


# ----------------------------------------------------------------------------- resumable files
# CLIP features and inference caches are both tables of rows computed batch by batch, and
# both are written the same way, by ResumableFile:
# - the work folder ``<out>.partial/`` is created (through a temporary folder and a rename)
#   holding ``inputs.h5``: the fixed inputs (the rows' keys), the attributes and the layout
#   of the result datasets;
# - each chunk of rows is written as a file of its own, ``chunk-<k>.h5`` (its rows, their
#   results and attribute updates, signed), through a temporary file and a rename: a file
#   that is there is whole, and nothing written before is ever opened for writing again. A
#   kill at any moment, or a full disk, loses at most the chunk in flight; a rerun computes
#   only the rows no chunk file holds;
# - when every row is written, the chunks are assembled into ``<out>`` (again through a
#   temporary file and a rename, signed, ``complete`` set), and only then is the work folder
#   removed. So ``<out>`` exists only when finished, and a workflow manager that deletes the
#   declared outputs of a killed job (Snakemake does) never deletes the partial work;
# - a work folder is resumed only if its identity attributes, its fixed datasets and its
#   layout are those asked for; otherwise it is started over (with a warning).
# Only one process writes an output at a time (:func:`writing`).

#: Rows per HDF5 chunk of a resumable file's datasets (fewer for a smaller file).
CHUNK_ROWS = 256
INPUTS_FILE = "inputs.h5"
_LAYOUT_ATTR, _CHUNK_ROWS_ATTR = "work_layout", "work_chunk_rows"     # the work folder's own, not the file's
_CHUNK_REMEDY = "rerun: the file is removed and its rows computed again"
#: What to do when a write fails for lack of space (the end of its error).
_KEPT = "the rows written before are kept; free space and rerun to resume"


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


@contextmanager
def writing(path: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold the lock of output ``path`` (the file ``<path>.lock``) while writing it: a second
    writer of the same output refuses at once, naming the holder (so no finished file or
    work is ever removed or rebuilt by a concurrent writer)."""
    with exclusive_lock(f"{os.fspath(path)}.lock", f"{path}: {what} being written"):
        yield


def _jsonable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list, tuple)) else value


def _text_dtype(n_bytes: int) -> np.dtype:
    return h5py.string_dtype("utf-8", max(1, n_bytes))


def write_attrs(h5: h5py.File, attrs: Mapping[str, Any]) -> None:
    """Set attributes; dicts, lists and tuples are stored as JSON text, texts as fixed-length
    UTF-8 (read them back with :func:`attributes`)."""
    for key, value in attrs.items():
        value = _jsonable(value)
        if isinstance(value, str):
            data = value.encode("utf-8", "surrogatepass")
            h5.attrs.create(key, np.array(data, dtype=_text_dtype(len(data))))
        else:
            h5.attrs[key] = value


def attributes(h5: h5py.File | h5py.Dataset) -> dict[str, Any]:
    """An object's attributes, texts as ``str`` (however they were stored)."""
    return {key: value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            for key, value in h5.attrs.items()}


def stored_text(values: np.ndarray, n_bytes: int | None = None) -> np.ndarray:
    """Texts (``str`` or UTF-8 ``bytes``) as a fixed-length UTF-8 array (``n_bytes`` each, or the
    longest's), NUL (which HDF5 strings cannot hold; a sampled reply can) as U+FFFD."""
    values = np.asarray(values, dtype=object)
    encoded = [(v.replace("\0", "\ufffd").encode("utf-8", "surrogatepass") if isinstance(v, str) else bytes(v))
               for v in values.reshape(-1)]
    width = max((len(e) for e in encoded), default=1) if n_bytes is None else n_bytes
    return np.array(encoded, dtype=_text_dtype(width)).reshape(values.shape)


def write_rows(h5: h5py.File, key: str, where: Any, values: np.ndarray) -> None:
    """``h5[key][where] = values`` (texts stored as the dataset's fixed-length strings), flushed:
    with a chunk cache, a full disk is raised here rather than in the dataset's destructor (see
    :class:`_GuardedH5`)."""
    dataset = h5[key]
    dataset[where] = stored_text(values, dataset.dtype.itemsize) if values.dtype == object else values
    dataset.flush()


def create_row_dataset(h5: h5py.File, name: str, spec: RowDataset, chunk_rows: int = CHUNK_ROWS) -> h5py.Dataset:
    """A dataset of ``spec``'s shape chunked by rows, with checksums (a text dataset must have a
    fixed-length string dtype: :func:`stored_text`)."""
    n_rows = spec.shape[0]
    chunks = (max(1, min(n_rows, chunk_rows)),) + tuple(spec.shape[1:]) if n_rows else None
    fill = stored_text(np.array([spec.fill]), np.dtype(spec.dtype).itemsize)[0] if _is_text(spec.dtype) else spec.fill
    return h5.create_dataset(name, shape=spec.shape, dtype=spec.dtype, fillvalue=fill, chunks=chunks, **CHECKSUMS)


def _is_text(dtype: Any) -> bool:
    return h5py.check_string_dtype(np.dtype(dtype)) is not None


def _rows_selection(rows: np.ndarray) -> slice | np.ndarray:
    """A slice for a contiguous run of increasing rows (fast in HDF5), else the index array."""
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows):
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def file_problem(path: str | os.PathLike, identity: Mapping[str, Any], fixed: Mapping[str, np.ndarray] = {},
                 datasets: Mapping[str, RowDataset] = {}) -> str | None:
    """None if ``path`` is an HDF5 file with these identity attributes, fixed datasets and
    dataset shapes; else why it is not."""
    try:
        with open_h5(path, "r") as h5:
            attrs = attributes(h5)
            for key, value in identity.items():
                if _jsonable(value) != attrs.get(key):
                    return f"attribute {key} is {attrs.get(key)!r}, expected {_jsonable(value)!r}"
            for key, values in fixed.items():
                if key not in h5 or not np.array_equal(h5[key][()], values):
                    return f"dataset {key} differs (other rows)"
            for key, spec in datasets.items():
                if key not in h5 or h5[key].shape != spec.shape:
                    return f"dataset {key} has another shape (written by another version?)"
    except (OSError, *_DAMAGED_METADATA) as exc:                       # unreadable or damaged
        return f"unreadable ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    return None


def is_complete(path: str | os.PathLike, identity: Mapping[str, Any], fixed: Mapping[str, np.ndarray] = {},
                datasets: Mapping[str, RowDataset] = {}) -> bool:
    """True if ``path`` is a finished file made from these inputs (see :func:`file_problem`)."""
    if not os.path.isfile(path) or file_problem(path, identity, fixed, datasets) is not None:
        return False
    with open_h5(path, "r") as h5:
        return bool(attributes(h5).get("complete", False))


def discard_work(path: str | os.PathLike) -> None:
    """Remove the work folder of a finished ``path`` (left when a job was killed between the
    rename of the finished file and the removal of its work)."""
    work = partial_path(path)
    if os.path.isdir(work):
        shutil.rmtree(work, ignore_errors=True)


def _layout_json(datasets: Mapping[str, RowDataset]) -> str:
    return json.dumps({key: [list(spec.shape), _dtype_name(spec.dtype), spec.fill] for key, spec in datasets.items()},
                      sort_keys=True)


def _layout(text: str) -> dict[str, RowDataset]:
    return {key: RowDataset(tuple(shape), h5py.string_dtype("utf-8") if dtype == "str" else np.dtype(dtype), fill)
            for key, (shape, dtype, fill) in json.loads(text).items()}


def _empty(spec: RowDataset) -> np.ndarray:
    return np.full(spec.shape, spec.fill, dtype=object if _is_text(spec.dtype) else spec.dtype)


class ResumableFile:
    """The writer of one resumable HDF5 file (see the comment above for the guarantees)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.final_path = path
        self.path = partial_path(path)
        with reading(self._inputs, "work file", "delete its folder and rerun") as h5:
            self.layout = _layout(attributes(h5)[_LAYOUT_ATTR])
            self.n_rows = len(next(iter(h5.values())))
        self._sequence = 1 + max((int(chunk.stem.split("-")[1]) for chunk in self._chunks()), default=0)

    @property
    def _inputs(self) -> Path:
        return Path(self.path) / INPUTS_FILE

    @classmethod
    def open(cls, path: str | os.PathLike, *, identity: Mapping[str, Any], fixed: Mapping[str, np.ndarray],
             datasets: Mapping[str, RowDataset], attrs: Mapping[str, Any] = {}, chunk_rows: int = CHUNK_ROWS,
             warn: Callable[[str], None] = log.warning):
        """Create the work folder, or reopen an unfinished one made from the same inputs.

        ``identity``: attributes that name the inputs (work with others is started over);
        ``fixed``: datasets known before any work (the rows' keys); ``datasets``: the
        results, filled row by row (``done`` is added to the finished file); ``attrs``: other
        attributes. A finished ``path`` is removed first: the caller found it stale
        (:func:`is_complete`). The caller holds :func:`writing`.
        """
        if os.path.exists(path):
            warn(f"{path}: made from other inputs or settings; rebuilding it")
            os.remove(path)
        work = partial_path(path)
        if os.path.isdir(work):
            reason = _work_problem(work, identity, fixed, datasets)
            if reason is None:
                return cls(path)._tidied(warn)
            warn(f"{work}: cannot be resumed ({reason}); starting over")
            shutil.rmtree(work)
        elif os.path.exists(work):
            warn(f"{work}: a work file of an older ladbench (one file, not a folder); starting over")
            os.remove(work)
        try:
            with atomic_path(work, folder=True) as tmp:
                with open_h5(tmp / INPUTS_FILE, "w") as h5:
                    for key, values in fixed.items():
                        h5.create_dataset(key, data=values, **CHECKSUMS)
                    write_attrs(h5, {**attrs, **identity, _LAYOUT_ATTR: _layout_json(datasets),
                                     _CHUNK_ROWS_ATTR: chunk_rows})
                    sign(h5)
        except OSError as exc:
            raise OSError(f"{work}: cannot create the work folder ({_problem(exc)})") from exc
        return cls(path)

    def _chunks(self) -> list[Path]:
        return sorted(Path(self.path).glob("chunk-*.h5"))

    def _tidied(self, warn: Callable[[str], None]) -> "ResumableFile":
        """Remove what a killed writer left half done (temporary files) and chunk files that
        cannot be read (damaged on disk after they were written): their rows are pending again."""
        for leftover in Path(self.path).glob("*.tmp"):
            leftover.unlink()
        for chunk in self._chunks():
            try:
                self._read_chunk(chunk, keys=())
            except (HDF5FileError, FileNotFoundError) as exc:
                warn(str(exc))
                chunk.unlink()
        return self

    def _read_chunk(self, chunk: Path, keys: Iterable[str] | None = None) -> tuple[np.ndarray, dict[str, np.ndarray],
                                                                                      dict[str, Any]]:
        """A chunk file's rows, results (``keys``; None: all) and attributes, checked against its digest."""
        with reading(chunk, "chunk of a work folder", _CHUNK_REMEDY) as h5:
            attrs = attributes(h5)
            names = list(h5) if keys is None else ["rows", *keys]
            arrays = {name: h5[name].asstr()[()] if _is_text(h5[name].dtype) else h5[name][()]
                      for name in names if name in h5}
            check_digest(chunk, attrs, arrays, "chunk of a work folder", _CHUNK_REMEDY,
                         every_dataset=keys is None)
        rows = arrays.pop("rows")
        return rows, arrays, {k: v for k, v in attrs.items() if k != DIGEST_ATTR}

    def pending_rows(self) -> np.ndarray:
        """Indices of the rows not yet written."""
        done = np.zeros(self.n_rows, dtype=bool)
        for chunk in self._chunks():
            done[self._read_chunk(chunk, keys=())[0]] = True
        return np.flatnonzero(~done)

    def write(self, rows: Sequence[int], results: Mapping[str, np.ndarray], attrs: Mapping[str, Any] = {}) -> None:
        """Write result arrays (first axis = ``rows``) and attribute updates as one chunk file,
        whole or not at all (a failure, a full disk, a kill: no file, the earlier ones kept)."""
        rows = np.asarray(rows, dtype=np.int64)
        order = np.argsort(rows, kind="stable")
        for key, values in results.items():
            if key not in self.layout:
                raise KeyError(f"{self.path}: no dataset {key!r} to write")
            if np.shape(values)[1:] != self.layout[key].shape[1:] or len(values) != len(rows):
                raise ValueError(f"{self.path}: {key} of shape {np.shape(values)} for {len(rows)} rows, expected "
                                 f"rows x {self.layout[key].shape[1:]}")
        target = Path(self.path) / f"chunk-{self._sequence:08d}.h5"
        try:
            with atomic_path(target) as tmp:
                with open_h5(tmp, "w") as h5:
                    h5.create_dataset("rows", data=rows[order], **CHECKSUMS)
                    for key, values in results.items():
                        spec, values = self.layout[key], np.asarray(values)[order]
                        if _is_text(spec.dtype):
                            h5.create_dataset(key, data=stored_text(values), **CHECKSUMS)
                        else:
                            h5.create_dataset(key, data=values.astype(spec.dtype, copy=False), **CHECKSUMS)
                    write_attrs(h5, attrs)
                    sign(h5)
                fsync_file(tmp)
        except OSError as exc:
            raise OSError(f"{target}: cannot write {len(rows)} rows ({_problem(exc)}); {_KEPT}") from exc
        self._sequence += 1

    def read(self, keys: Iterable[str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The work so far, as the finished file would hold it: the fixed datasets, the result
        datasets ``keys`` (None: all; unwritten rows hold their fill value), ``done``, and the
        attributes (``complete`` false)."""
        with reading(self._inputs, "work file", "delete its folder and rerun") as h5:
            attrs = {k: v for k, v in attributes(h5).items() if k not in (_LAYOUT_ATTR, _CHUNK_ROWS_ATTR, DIGEST_ATTR)}
            arrays = {key: ds[()] for key, ds in h5.items()}
        keys = list(self.layout) if keys is None else [k for k in keys if k in self.layout]
        arrays.update({key: _empty(self.layout[key]) for key in keys})
        arrays["done"] = np.zeros(self.n_rows, dtype=bool)
        for chunk in self._chunks():
            rows, results, chunk_attrs = self._read_chunk(chunk, keys)
            for key, values in results.items():
                arrays[key][rows] = values
            arrays["done"][rows] = True
            attrs.update(chunk_attrs)
        return arrays, {**attrs, "complete": False}

    def finish(self, attrs: Mapping[str, Any] = {}) -> None:
        """Assemble the chunks into the final file (``attrs`` set last, then ``complete``; only
        if every row is written), sign it, move it to the final path, remove the work folder."""
        undone = len(self.pending_rows())
        if undone:
            raise RuntimeError(f"{self.path}: {undone} rows not written; refusing to mark the file complete")
        with reading(self._inputs, "work file", "delete its folder and rerun") as h5:
            merged = {k: v for k, v in attributes(h5).items() if k not in (_LAYOUT_ATTR, _CHUNK_ROWS_ATTR, DIGEST_ATTR)}
            chunk_rows = int(h5.attrs[_CHUNK_ROWS_ATTR])
            fixed = {key: ds[()] for key, ds in h5.items()}
        datasets = {**self.layout, "done": RowDataset((self.n_rows,), np.bool_, False)}
        for key, spec in datasets.items():           # texts: as long as the longest written
            if _is_text(spec.dtype):
                datasets[key] = RowDataset(spec.shape, _text_dtype(self._longest_text(key)), spec.fill)
        try:
            with atomic_path(self.final_path) as tmp:
                # a chunk cache of 64 MB: rows arrive a chunk file at a time, not in HDF5 chunks
                with open_h5(tmp, "w", rdcc_nbytes=64 << 20) as h5:
                    for key, values in fixed.items():
                        h5.create_dataset(key, data=values, **CHECKSUMS).flush()   # see write_rows
                    for key, spec in datasets.items():
                        create_row_dataset(h5, key, spec, chunk_rows)
                    for chunk in self._chunks():
                        rows, results, chunk_attrs = self._read_chunk_or_drop(chunk)
                        where = _rows_selection(rows)
                        for key, values in results.items():
                            write_rows(h5, key, where, values)
                        write_rows(h5, "done", where, np.ones(len(rows), np.bool_))
                        merged.update(chunk_attrs)
                    write_attrs(h5, {**merged, **attrs, "complete": True})
                    sign(h5)
                fsync_file(tmp)
        except OSError as exc:
            raise OSError(f"{self.final_path}: cannot write the finished file ({_problem(exc)}); the work in "
                          f"{self.path} is kept: free space and rerun to finish") from exc
        shutil.rmtree(self.path, ignore_errors=True)

    def _read_chunk_or_drop(self, chunk: Path) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, Any]]:
        """A chunk file read whole; one damaged on disk since it was written is removed (its rows
        are pending again) and the error raised."""
        try:
            return self._read_chunk(chunk)
        except HDF5FileError:
            chunk.unlink()
            raise

    def _longest_text(self, key: str) -> int:
        """The byte length of the longest text of dataset ``key`` written so far."""
        longest = 1
        for chunk in self._chunks():
            with reading(chunk, "chunk of a work folder", _CHUNK_REMEDY) as h5:
                if key in h5:
                    longest = max(longest, h5[key].dtype.itemsize)
        return longest

    def attr(self, key: str, default: Any = None) -> Any:
        """An attribute as the finished file will have it (the last chunk's update, else the inputs')."""
        return self.read(keys=())[1].get(key, default)

    def set_attrs(self, attrs: Mapping[str, Any]) -> None:
        """Update attributes (a chunk file of no rows)."""
        self.write([], {}, attrs)


def _work_problem(work: str | os.PathLike, identity: Mapping[str, Any], fixed: Mapping[str, np.ndarray],
                  datasets: Mapping[str, RowDataset]) -> str | None:
    """None if the work folder ``work`` was started for these inputs and layout; else why not."""
    inputs = Path(work) / INPUTS_FILE
    reason = file_problem(inputs, identity, fixed)
    if reason is not None:
        return reason
    with open_h5(inputs, "r") as h5:
        if attributes(h5).get(_LAYOUT_ATTR) != _layout_json(datasets):
            return "its datasets have another layout (written by another version?)"
    return None
