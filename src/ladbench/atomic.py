"""Atomic file writes (a reader never sees a half-written output), the JSON reader
whose errors name the file, the content digest of JSON outputs, output locks, and a
chunked file digest.

Every output is written to ``<name>.<pid>.tmp`` beside its target and then renamed over
it with :func:`os.replace` (atomic on POSIX within one file system, which "beside the
target" guarantees). If the writer fails, the temporary file is removed and the target
is left untouched. Snakemake, a killed job or a concurrent reader therefore sees either
the old file, the complete new file, or nothing.

The temporary name ends in ``.tmp``: writers that derive a format from the file name or
append an extension (``np.savez``, ``matplotlib.savefig``) must be given an open file
object or an explicit format, e.g. ``np.savez(open(tmp, "wb"), ...)`` or
``fig.savefig(tmp, format="png")``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import sys
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

__all__ = ["atomic_path", "replacing_together", "atomic_write_text", "atomic_write_json", "json_one_item_per_line", "read_json",
           "signed", "read_signed_json", "write_signed_npz", "read_signed_npz", "write_json_with_arrays",
           "read_arrays_beside", "exclusive_lock", "LockedError", "file_digest", "sampled_digest"]


def _tmp_path_for(path: Path) -> Path:
    # The pid keeps two processes that target the same file from sharing a temporary.
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


#: A write refused for want of room: a full disk, a quota, a file-size limit (``ulimit -f``).
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _named(error: BaseException, target: Path) -> BaseException:
    """A full disk met while writing ``target``, as one line naming it (a failed ``write`` names
    no file: "No space left on device" alone); any other error as it is."""
    if isinstance(error, OSError) and error.errno in NO_ROOM and str(target) not in str(error):
        return OSError(error.errno, f"{target}: cannot write ({error.strerror}: the disk is full or the file is "
                                    "over the size limit); free space and rerun (finished outputs are kept)")
    return error


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # another user's live process
        return True
    return True


def remove_stale_temporaries(target: Path) -> None:
    """Remove the temporaries ``<target>.<pid>.tmp`` that killed runs left (their pid is no
    process on this machine): a kill during a cache's assembly left a full-size copy that no
    rerun removed. Those of live processes (another writer's, this one's) are kept."""
    prefix = f"{target.name}."
    try:
        names = [entry.name for entry in os.scandir(target.parent)]
    except FileNotFoundError:
        return
    for name in names:
        pid = name[len(prefix):-len(".tmp")] if name.startswith(prefix) and name.endswith(".tmp") else ""
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            _remove(target.parent / name)


def _reserve(tmp: Path, folder: bool) -> None:
    """Create ``tmp`` (an empty file, or a folder) where nothing is: never through a symbolic
    link planted there (``O_EXCL | O_NOFOLLOW``; ``mkdir`` does not follow one either), so a
    writer never writes outside the output's folder."""
    if folder:
        tmp.mkdir()
    else:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))


@contextmanager
def atomic_path(path: str | os.PathLike, folder: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    The parent folder is created if needed. The yielded path exists, created by this
    function: an empty file (the caller opens it for writing), or with ``folder`` an empty
    folder. On an exception inside the block the temporary is removed and the exception
    propagates; ``path`` is not touched. A folder can only replace a missing or empty folder
    (``os.replace`` semantics). Temporaries of killed runs beside ``path`` are removed first.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target)
    tmp = _tmp_path_for(target)
    _remove(tmp)  # a leftover from a killed run with a recycled pid
    try:
        _reserve(tmp, folder)
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"atomic_path: nothing was written to {tmp} for {target}")
        os.replace(tmp, target)
    except BaseException as error:
        _remove(tmp)
        named = _named(error, target)
        if named is error:
            raise
        raise named from None


@contextmanager
def replacing_together(paths: Sequence[str | os.PathLike]) -> Iterator[list[Path]]:
    """Yield a temporary path beside each of ``paths``; when the block succeeds, replace the
    targets as one set: every old target is removed first, then every new file renamed in.
    A kill in between leaves files missing (a rerun redoes them: Snakemake reruns a job whose
    outputs are missing), never old files beside new ones. On an exception inside the block
    the temporaries are removed and the targets are left as they were."""
    targets = [Path(path) for path in paths]
    temporaries = [_tmp_path_for(target) for target in targets]
    for target, tmp in zip(targets, temporaries):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target)
        _remove(tmp)
    try:
        for tmp in temporaries:
            _reserve(tmp, folder=False)
        yield temporaries
        unwritten = [str(tmp) for tmp in temporaries if not tmp.exists()]
        if unwritten:
            raise FileNotFoundError(f"replacing_together: nothing was written to {', '.join(unwritten)}")
    except BaseException as error:
        for tmp in temporaries:
            _remove(tmp)
        named = _named(error, targets[0].parent)
        if named is error:
            raise
        raise named from None
    for target in targets:
        _remove(target)
    for target, tmp in zip(targets, temporaries):
        os.replace(tmp, target)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())


def atomic_write_json(path: str | os.PathLike, obj: Any, **json_kw: Any) -> None:
    """Serialise ``obj`` with :func:`json.dumps` (``json_kw`` passed on) and write it atomically.

    A trailing newline is added so the files are friendly to ``cat`` and ``diff``.
    """
    atomic_write_text(path, json.dumps(obj, **json_kw) + "\n")


def json_one_item_per_line(doc: dict, list_keys: Sequence[str]) -> str:
    """JSON text of ``doc`` with each item of the lists under ``list_keys`` on its own line
    (placed after the other keys, in that order): valid JSON, deterministic, and diffs of
    large tables stay readable."""
    head = {key: value for key, value in doc.items() if key not in list_keys}
    parts = [json.dumps(head, ensure_ascii=False)[:-1]]
    for key in list_keys:
        lines = [json.dumps(item, ensure_ascii=False) for item in doc[key]]
        parts.append(f', "{key}": [\n' + ",\n".join(lines) + "\n]")
    return "".join(parts) + "}\n"


def read_json(path: str | os.PathLike, missing: str, error: type[Exception] = ValueError) -> Any:
    """A JSON document; a missing, undecodable or malformed file raises ``error`` naming the file.

    ``missing`` says what was expected there, e.g. "benchmark file not found (run
    `ladbench benchmark`)".
    """
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    except json.JSONDecodeError as err:
        raise error(f"{path}: not valid JSON ({err})") from None
    except UnicodeDecodeError as err:
        raise error(f"{path}: not UTF-8 text (byte {err.start}: {err.reason}); is it the file you meant?") from None
    except RecursionError:
        raise error(f"{path}: nested too deeply to be a ladbench file") from None


# ---------------------------------------------------------------------------- content digests
#: The key of a JSON output holding its content digest (and the attribute of an HDF5 file's, hdf5.py).
DIGEST_KEY = "content_sha256"
_WARNED_UNCHECKED: set[str] = set()


def warn_unchecked(path: str | os.PathLike, what: str) -> None:
    """One line on stderr, once per file and process: a file without a content digest (made by
    hand, or by a ladbench before 0.2) is read as it is, unchecked."""
    key = os.path.abspath(path)
    if key not in _WARNED_UNCHECKED:
        _WARNED_UNCHECKED.add(key)
        print(f"WARNING: {path}: {what} without a {DIGEST_KEY} (made by hand or by an older ladbench); read as it "
              "is, unchecked", file=sys.stderr)


def _json_digest(doc: dict) -> str:
    """sha256 of a JSON document's canonical text (sorted keys, no spaces), the digest key left out."""
    body = {key: value for key, value in doc.items() if key != DIGEST_KEY}
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def signed(doc: dict) -> dict:
    """``doc`` with its content digest (key ``content_sha256``, last) for a JSON output: a
    reader (:func:`read_signed_json`) refuses the file if anything in it changed. Computed on
    the document as JSON reads it back (tuples as lists, keys as strings), whatever the layout
    it is written in."""
    body = json.loads(json.dumps({key: value for key, value in doc.items() if key != DIGEST_KEY}))
    return {**body, DIGEST_KEY: _json_digest(body)}


def _unsigned(path: str | os.PathLike, what: str, remedy: str, required: bool, error: type[Exception]) -> None:
    """A file without a digest: refused when ``required`` (a file only ladbench writes, cheap to
    rebuild: a digest stripped by an edit must not pass), else read with a one-line warning."""
    if required:
        raise error(f"{path}: {what}: has no {DIGEST_KEY} (edited, or made by hand or by an older ladbench); "
                    f"{remedy}")
    warn_unchecked(path, what)


def read_signed_json(path: str | os.PathLike, what: str, remedy: str, error: type[Exception] = ValueError,
                     required: bool = False) -> Any:
    """A JSON output (:func:`read_json`, ``<what> not found; <remedy>`` when missing) whose
    content digest, if it has one, matches; the digest key is removed. A mismatch raises
    ``error``: one line naming the file and ``remedy`` (the command that rebuilds it). A file
    without a digest is refused if ``required``, else accepted with a one-line warning."""
    doc = read_json(path, f"{what} not found; {remedy}", error)
    if not isinstance(doc, dict):
        raise error(f"{path}: not a {what} (a JSON object was expected); {remedy}")
    recorded = doc.pop(DIGEST_KEY, None)
    if recorded is None:
        _unsigned(path, what, remedy, required, error)
    elif recorded != _json_digest(doc):
        raise error(f"{path}: {what}: changed since it was written (its content does not match its {DIGEST_KEY}); "
                    f"{remedy}")
    return doc


# ---------------------------------------------------------------------------- NPZ outputs
# Calibrations, evaluations' predictions and analyses' per-row arrays are .npz archives. Their
# content digest is one more member, ``content_sha256``: the sha256 of every other member's
# name, dtype, shape and bytes (names sorted), so that an archive re-saved with an edited
# array (its CRC-32s recomputed by numpy) is refused like an edited JSON.


def arrays_digest(arrays: dict) -> str:
    """The content digest of named arrays as :func:`write_signed_npz` records it."""
    digest = hashlib.sha256()
    for name in sorted(key for key in arrays if key != DIGEST_KEY):
        values = np.ascontiguousarray(arrays[name])
        digest.update(json.dumps([name, values.dtype.str, list(values.shape)]).encode())
        digest.update(values.tobytes())
    return digest.hexdigest()


def write_signed_npz(path: str | os.PathLike, arrays: dict) -> str:
    """Write ``arrays`` (no pickled objects) to the ``.npz`` ``path`` atomically, with their
    digest; returns the digest."""
    digest = arrays_digest(arrays)
    with atomic_path(path) as tmp:
        _save_npz(tmp, arrays, digest)
    return digest


def _save_npz(tmp: Path, arrays: dict, digest: str) -> None:
    # An open handle: np.savez would otherwise append ".npz" to the ".tmp" name.
    with open(tmp, "wb") as handle:
        np.savez(handle, **{name: value for name, value in arrays.items() if name != DIGEST_KEY},
                 **{DIGEST_KEY: np.asarray(digest)})
        handle.flush()
        os.fsync(handle.fileno())


def read_signed_npz(path: str | os.PathLike, what: str, remedy: str, error: type[Exception] = ValueError,
                    required: bool = True) -> dict:
    """Every array of an ``.npz`` written by :func:`write_signed_npz`, checked against its digest
    (the digest member removed). Missing, unreadable (not a zip, a CRC-32 that fails, pickled
    objects), changed or, if ``required``, unsigned: one line naming the file and ``remedy``."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise error(f"{path}: {what} not found; {remedy}") from None
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise error(f"{path}: not a readable {what} ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
                    f"{remedy}") from None
    recorded = arrays.pop(DIGEST_KEY, None)
    if recorded is None:
        _unsigned(path, what, remedy, required, error)
    elif str(recorded) != arrays_digest(arrays):
        raise error(f"{path}: {what}: changed since it was written (its arrays do not match its {DIGEST_KEY}); "
                    f"{remedy}")
    return arrays


#: The key of a JSON output holding the digest of the ``.npz`` written with it (one unit).
ARRAYS_KEY = "arrays_sha256"


def write_json_with_arrays(path: str | os.PathLike, doc: dict, arrays: dict) -> Path:
    """Write the JSON output ``path`` (signed, ``indent=1``) and the ``.npz`` of the same name as
    one unit: the JSON records the arrays' digest (:data:`ARRAYS_KEY`) and both files are replaced
    together (:func:`replacing_together`), so no reader ever pairs files of two runs. Returns the
    ``.npz`` path."""
    npz = Path(path).with_suffix(".npz")
    digest = arrays_digest(arrays)
    with replacing_together([path, npz]) as (json_tmp, npz_tmp):
        with open(json_tmp, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(signed({**doc, ARRAYS_KEY: digest}), indent=1) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        _save_npz(npz_tmp, arrays, digest)
    return npz


def read_arrays_beside(path: str | os.PathLike, doc: dict, what: str, remedy: str,
                       error: type[Exception] = ValueError) -> dict:
    """The ``.npz`` written with the JSON output ``path`` (``doc``, as read), checked as
    :func:`read_signed_npz` does and refused unless it is the one ``doc`` records."""
    npz = Path(path).with_suffix(".npz")
    arrays = read_signed_npz(npz, f"{what}'s arrays", remedy, error)
    if doc.get(ARRAYS_KEY) != arrays_digest(arrays):
        raise error(f"{npz}: not the arrays written with {path} (the two files are of two runs, or the JSON "
                    f"records no {ARRAYS_KEY}); {remedy}")
    return arrays


# ---------------------------------------------------------------------------- locks
class LockedError(OSError):
    """An output (or output folder) is being written by another process; the message names it."""


class LockPathError(LockedError):
    """A lock file's path is a symbolic link (refused: the lock would write through it)."""


def _holder() -> str:
    return (f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')} in "
            f"{os.getcwd()}: {' '.join(sys.argv)[:300]}")


def _acquire(path: str | os.PathLike) -> int | str:
    """The descriptor of ``path`` locked exclusively (created if missing), or who holds it.
    Every holder removes the file before releasing it, so a lock taken on a removed file is
    dropped and taken again on the file now there."""
    import fcntl

    while True:
        try:    # never through a symbolic link: it would write the holder's line into its target
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise
            raise LockPathError(f"{path}: a symbolic link where a lock file goes; refused (a lock never writes "
                                "through a link: remove it, or use another output path)") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(descriptor, 4096).decode("utf-8", "replace").strip()
            os.close(descriptor)
            return holder or "another process"
        except OSError as error:        # a file system without locks (some network mounts): go on unlocked
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            print(f"WARNING: {path}: this file system does not lock files ({error.strerror}); a second writer "
                  "would not be stopped", file=sys.stderr)
            return descriptor
        try:
            if os.stat(path).st_ino == os.fstat(descriptor).st_ino:
                return descriptor
        except FileNotFoundError:
            pass
        os.close(descriptor)


def hold_lock(path: str | os.PathLike, what: str) -> "Lock":
    """Lock ``path`` for this process (:class:`Lock`; released by :meth:`Lock.release` or when the
    process ends, however it ends); :class:`LockedError` naming the holder if another has it."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    descriptor = _acquire(path)
    if isinstance(descriptor, str):
        raise LockedError(f"{what}: locked by {descriptor} (its lock file: {path}); wait for it to end, or stop it")
    os.ftruncate(descriptor, 0)
    os.write(descriptor, (_holder() + "\n").encode())
    return Lock(str(path), descriptor)


class Lock:
    """A lock held by :func:`hold_lock`."""

    def __init__(self, path: str, descriptor: int) -> None:
        self.path, self.descriptor = path, descriptor

    def release(self) -> None:
        if self.descriptor < 0:
            return
        try:
            os.unlink(self.path)          # before unlocking: see _acquire
        except FileNotFoundError:
            pass
        os.close(self.descriptor)
        self.descriptor = -1


@contextmanager
def exclusive_lock(path: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold the lock file ``path`` inside the block (see :func:`hold_lock`)."""
    lock = hold_lock(path, what)
    try:
        yield
    finally:
        lock.release()


#: The lock file of a study's output folder, held by the workflow that runs it.
OUTPUT_LOCK_FILE = ".workflow.lock"


def lock_output_dir(output_dir: str | os.PathLike) -> Lock:
    """Hold the lock of a study's output folder (:data:`OUTPUT_LOCK_FILE` in it): one workflow
    per folder, whatever folder it was started from (Snakemake's own lock is kept in the
    working folder's ``.snakemake/``, so two workflows started from two folders both ran)."""
    return hold_lock(Path(output_dir) / OUTPUT_LOCK_FILE, f"output_dir {output_dir} is in use by another workflow")


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a written file to the disk (before it is renamed into place)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def file_digest(path: str | os.PathLike, algorithm: str = "sha256", chunk_bytes: int = 1 << 22) -> str:
    """Hex digest of a file (any ``hashlib`` algorithm), read in chunks so that multi-GB
    archives and weights never sit in memory whole."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk_bytes), b""):
            digest.update(block)
    return digest.hexdigest()


def sampled_digest(path: str | os.PathLike, samples: int = 16, block_bytes: int = 1 << 20) -> str:
    """sha256 of a file's size and of ``samples`` evenly spaced blocks (first and last
    included): a content fingerprint of multi-GB weights in milliseconds. Retrained or
    fine-tuned weights change every block; a file of at most ``samples`` blocks is read whole."""
    size = os.path.getsize(path)
    if size <= samples * block_bytes:
        return file_digest(path)
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        for i in range(samples):
            handle.seek((size - block_bytes) * i // (samples - 1))
            digest.update(handle.read(block_bytes))
    return digest.hexdigest()
