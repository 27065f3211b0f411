"""Atomic file writes (a reader never sees a half-written output), the JSON reader
whose errors name the file, and a chunked file digest.

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

import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

__all__ = ["atomic_path", "atomic_write_text", "atomic_write_json", "json_one_item_per_line", "read_json",
           "file_digest", "sampled_digest"]


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


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    The parent folder is created if needed. The yielded path does not exist yet; the
    caller creates it (a file or a folder). On an exception inside the block the
    temporary is removed and the exception propagates; ``path`` is not touched.
    A folder can only replace a missing or empty folder (``os.replace`` semantics).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path_for(target)
    _remove(tmp)  # a leftover from a killed run with a recycled pid
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"atomic_path: nothing was written to {tmp} for {target}")
        os.replace(tmp, target)
    except BaseException:
        _remove(tmp)
        raise


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
    """A JSON document; a missing or malformed file raises ``error`` naming the file.

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
