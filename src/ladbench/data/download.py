"""Downloads of MS-COCO val2014 and Flickr8k: resumable, retried, verified, atomically placed.

Standard library only (urllib). For each archive of a dataset:

1. Skip it when everything it provides already exists under the destination (a copy
   the user put there, or a previous run).
2. Fetch it to ``<archive>.part`` with HTTP ``Range`` requests, so an interrupted
   transfer continues where it stopped (also across runs); failures are retried with
   exponential back-off (the attempt counter restarts whenever bytes arrived).
3. Verify it: the size announced by the server (and the known size, if any), the known
   MD5 checksum where one is published, and always the zip's integrity
   (``zipfile.testzip``: every member's CRC). A bad archive is deleted and rejected.
4. Extract only the members the workflow needs into a temporary folder beside the
   destination and move each output into place with ``os.replace``.

Sources (``DATASETS``): COCO from the official cocodataset.org URLs; Flickr8k from the
copy commonly used since the original Illinois form closed, the GitHub release
``jbrownlee/Datasets`` (tag ``Flickr8k``). The MD5 sums are the ones widely listed for
these files (e.g. by the LAVIS and torchvision-for-R dataset loaders); pass
``--no-checksum`` if a mirror serves a repacked archive.

Outputs (``dataset_outputs``):

- coco: ``DEST/val2014/``, ``DEST/annotations/captions_val2014.json``,
  ``DEST/annotations/instances_val2014.json``
- flickr8k: ``DEST/Flicker8k_Dataset/`` (the archive's own spelling),
  ``DEST/Flickr8k.token.txt`` and its conversion to the MS-COCO captions format,
  ``DEST/annotations/captions.json`` (no instances file: Flickr8k has no categories).
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import socket
import sys
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ladbench.atomic import file_digest
from ladbench.data.coco import write_flickr8k_coco

_CHUNK = 1 << 20
_NOT_RETRIED = {400, 401, 403, 404, 410}


@dataclass(frozen=True)
class Resource:
    """One archive: where it comes from, how to check it, and what it provides (paths relative to DEST)."""

    file_name: str
    url: str
    provides: tuple[str, ...]
    md5: str | None = None
    size: int | None = None


DATASETS: dict[str, tuple[Resource, ...]] = {
    "coco": (
        Resource("val2014.zip", "http://images.cocodataset.org/zips/val2014.zip", ("val2014",),
                 md5="a3d79f5ed8d289b7a7554ce06a5782b3"),
        Resource("annotations_trainval2014.zip",
                 "http://images.cocodataset.org/annotations/annotations_trainval2014.zip",
                 ("annotations/captions_val2014.json", "annotations/instances_val2014.json"),
                 md5="d3e24dc9f5bda3e7887a1e6a5ff34c0c"),
    ),
    "flickr8k": (
        Resource("Flickr8k_Dataset.zip",
                 "https://github.com/jbrownlee/Datasets/releases/download/Flickr8k/Flickr8k_Dataset.zip",
                 ("Flicker8k_Dataset",), md5="f18a1e2920de5bd84dae7cf08ec78978"),
        Resource("Flickr8k_text.zip",
                 "https://github.com/jbrownlee/Datasets/releases/download/Flickr8k/Flickr8k_text.zip",
                 ("Flickr8k.token.txt",), md5="bf6c1abcb8e4a833b7f922104de18627"),
    ),
}
FLICKR8K_COCO_CAPTIONS = "annotations/captions.json"


class DownloadError(ValueError):
    """A file could not be fetched or failed verification; the message says what to do instead."""


class _Retryable(Exception):
    """A transfer failure worth retrying (dropped connection, short read, server error)."""


def dataset_outputs(dataset: str, dest: str | os.PathLike) -> dict[str, Path]:
    """The paths a downloaded dataset provides: ``images_dir``, ``captions_json`` and (COCO) ``instances_json``."""
    root = Path(dest)
    if dataset == "coco":
        return {"images_dir": root / "val2014", "captions_json": root / "annotations" / "captions_val2014.json",
                "instances_json": root / "annotations" / "instances_val2014.json"}
    if dataset == "flickr8k":
        return {"images_dir": root / "Flicker8k_Dataset", "captions_json": root / FLICKR8K_COCO_CAPTIONS}
    raise DownloadError(f"--dataset must be one of {sorted(DATASETS)}, got {dataset!r}")


# --- transfer ---------------------------------------------------------------------------

def _total_from_content_range(header: str | None) -> int | None:
    match = re.match(r"bytes (?:\d+-\d+|\*)/(\d+)", header or "")
    return int(match.group(1)) if match else None


def _transfer(url: str, part: Path, timeout: float, show_progress: bool) -> int | None:
    """Fetch ``url`` into ``part``, continuing from its current size. Returns the total size if the server told it."""
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "ladbench-download/1"}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # nothing left to send: complete, or a stale part larger than the file
            total = _total_from_content_range(err.headers.get("Content-Range"))
            if total == have:
                return total
            part.unlink()
            raise _Retryable(f"stale partial file ({have} bytes, server has {total})") from err
        if err.code in _NOT_RETRIED:
            raise DownloadError(f"{url}: HTTP {err.code} {err.reason}") from err
        raise _Retryable(f"HTTP {err.code} {err.reason}") from err
    with response:
        if have and response.status == 200:  # the server ignored Range: start again from byte 0
            have, mode = 0, "wb"
        elif response.status == 206:
            mode = "ab"
        else:
            mode = "wb"
        length = response.headers.get("Content-Length")
        total = _total_from_content_range(response.headers.get("Content-Range")) if response.status == 206 \
            else (int(length) if length is not None else None)
        written = have
        with open(part, mode) as handle, tqdm(total=total, initial=have, unit="B", unit_scale=True,
                                              desc=part.name.removesuffix(".part"), file=sys.stderr,
                                              disable=not show_progress) as bar:
            while True:
                try:
                    block = response.read(_CHUNK)
                except (http.client.IncompleteRead, ConnectionError, socket.timeout, TimeoutError) as err:
                    raise _Retryable(f"connection lost after {written} bytes ({err})") from err
                if not block:
                    break
                handle.write(block)
                written += len(block)
                bar.update(len(block))
    if total is not None and written < total:
        raise _Retryable(f"connection closed after {written} of {total} bytes")
    return total if total is not None else written


def fetch(url: str, dest: str | os.PathLike, md5: str | None = None, size: int | None = None,
          retries: int = 5, backoff: float = 2.0, timeout: float = 60.0, show_progress: bool = True,
          what_to_do: str = "") -> Path:
    """Download ``url`` to ``dest`` with resume, retries and verification; place it atomically.

    ``retries`` failed attempts in a row (without any byte arriving) are allowed, waiting
    ``backoff * 2**k`` seconds before retry ``k``. The finished ``dest.part`` is checked
    (size, ``md5`` if given, zip integrity for ``.zip``) and renamed to ``dest``; a file
    that fails is deleted. ``what_to_do`` is appended to the error when the file cannot
    be fetched (e.g. how to provide it by hand).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    failures, total = 0, None
    while True:
        before = part.stat().st_size if part.exists() else 0
        try:
            total = _transfer(url, part, timeout, show_progress)
            break
        except _Retryable as err:
            reason = str(err)
        except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError, http.client.HTTPException) as err:
            reason = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
        progressed = part.exists() and part.stat().st_size > before
        failures = 0 if progressed else failures + 1
        if failures > retries:
            raise DownloadError(f"could not download {url} after {retries} retries ({reason}). {what_to_do}".strip())
        delay = backoff * 2 ** max(failures - 1, 0)
        print(f"download: {dest.name}: {reason}; retrying in {delay:.1f} s", file=sys.stderr)
        time.sleep(delay)
    try:
        verify_file(part, expected_size=size if size is not None else total, md5=md5,
                    is_zip=dest.suffix == ".zip", label=url)
    except DownloadError:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, dest)
    return dest


def verify_file(path: str | os.PathLike, expected_size: int | None = None, md5: str | None = None,
                is_zip: bool = False, label: str | None = None) -> None:
    """Raise :class:`DownloadError` unless the file has the size, MD5 and (zip) member CRCs expected."""
    path = Path(path)
    name = label or str(path)
    actual = path.stat().st_size
    if expected_size is not None and actual != expected_size:
        raise DownloadError(f"{name}: got {actual} bytes, expected {expected_size}; the file was deleted")
    if md5 is not None:
        got = file_digest(path, "md5")
        if got != md5:
            raise DownloadError(f"{name}: MD5 {got} != expected {md5} (corrupted or a different file); "
                                "the file was deleted")
    if is_zip:
        try:
            with zipfile.ZipFile(path) as archive:
                check_expansion(path, archive.infolist())       # before testzip inflates every member
                bad = archive.testzip()
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as err:
            raise DownloadError(f"{name}: not a valid zip archive ({err}); the file was deleted") from err
        if bad is not None:
            raise DownloadError(f"{name}: zip member {bad} fails its CRC check; the file was deleted")


# --- extraction -------------------------------------------------------------------------

def _members_for(archive: zipfile.ZipFile, wanted: str) -> list[zipfile.ZipInfo]:
    """Members that make up ``wanted`` (a file or a folder), matched at any depth, macOS junk ignored."""
    base = wanted.rstrip("/").split("/")[-1]
    names = [info for info in archive.infolist() if not info.filename.startswith("__MACOSX/")]
    exact = [info for info in names if info.filename.rstrip("/") == wanted or info.filename.startswith(wanted + "/")]
    if exact:
        return exact
    # The archive nests the item differently (e.g. under a top folder): match by its last component.
    pattern = re.compile(rf"(^|.*/){re.escape(base)}(/.*)?$")
    return [info for info in names if pattern.match(info.filename.rstrip("/"))]


#: most bytes a member may expand to per archived byte (JPEG images ~1, JSON annotations ~10; a
#: zip bomb 1,000 and more); members below ``_SMALL_MEMBER`` bytes are not held to it
MAX_EXPANSION = 100
_SMALL_MEMBER = 1 << 20


def check_expansion(archive_path: str | os.PathLike, members: list[zipfile.ZipInfo]) -> None:
    """Refuse, before anything is written, members that would expand beyond :data:`MAX_EXPANSION`
    times their archived size, or all together beyond that times the archive (a zip bomb: with
    ``--no-checksum`` nothing else vouches for the archive). zipfile never writes more than a
    member's recorded size, so the recorded sizes bound what extraction writes."""
    for info in members:
        if info.file_size > _SMALL_MEMBER and info.file_size > MAX_EXPANSION * max(info.compress_size, 1):
            raise DownloadError(f"{archive_path}: member {info.filename} would expand from {info.compress_size} to "
                                f"{info.file_size} bytes (more than {MAX_EXPANSION} times; a zip bomb?); not extracted")
    total, archived = sum(info.file_size for info in members), os.path.getsize(archive_path)
    if total > MAX_EXPANSION * archived + _SMALL_MEMBER:
        raise DownloadError(f"{archive_path}: its members would expand to {total} bytes, more than {MAX_EXPANSION} "
                            f"times the archive's {archived} (a zip bomb?); not extracted")


def extract(archive_path: str | os.PathLike, dest: str | os.PathLike, provides: tuple[str, ...]) -> None:
    """Extract the members that provide ``provides`` and move each into ``dest`` atomically
    (expansion bounded: :func:`check_expansion`)."""
    dest = Path(dest)
    staging = dest / f".extract-{Path(archive_path).name}.{os.getpid()}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with zipfile.ZipFile(archive_path) as archive:
            for wanted in provides:
                members = _members_for(archive, wanted)
                if not members:
                    raise DownloadError(f"{archive_path}: no member provides '{wanted}'")
                check_expansion(archive_path, members)
                archive.extractall(staging, members=members)
                found = _locate(staging, wanted)
                target = dest / wanted
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_dir():  # a partial earlier extraction; os.replace cannot overwrite a folder
                    shutil.rmtree(target)
                os.replace(found, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _locate(staging: Path, wanted: str) -> Path:
    direct = staging / wanted
    if direct.exists():
        return direct
    base = wanted.rstrip("/").split("/")[-1]
    matches = sorted(staging.rglob(base), key=lambda p: len(p.parts))
    if not matches:
        raise DownloadError(f"extracted archive has no '{wanted}'")
    return matches[0]


# --- datasets ---------------------------------------------------------------------------

def _by_hand_message(resource: Resource, url: str, dest: Path) -> str:
    return (f"Offline or blocked? Download {url} by hand and put it at {dest / resource.file_name} "
            f"(or extract it so that {', '.join(str(dest / p) for p in resource.provides)} exist), then rerun; "
            "or point the config at an existing copy (datasets.<name>.images_dir / captions_json / instances_json "
            "with download: false).")


def download_dataset(dataset: str, dest: str | os.PathLike, url_base: str | None = None,
                     resources: tuple[Resource, ...] | None = None, retries: int = 5, backoff: float = 2.0,
                     timeout: float = 60.0, keep_archives: bool = False, check_md5: bool = True,
                     show_progress: bool = True) -> dict[str, Path]:
    """Make ``dataset`` available under ``dest``; return :func:`dataset_outputs`.

    Archives whose outputs already exist are skipped. ``url_base`` replaces the official
    location of every archive with ``<url_base>/<file name>`` (a mirror or a local
    server). ``resources`` overrides the archive list (tests).
    """
    if dataset not in DATASETS:
        raise DownloadError(f"--dataset must be one of {sorted(DATASETS)}, got {dataset!r}")
    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    for resource in resources if resources is not None else DATASETS[dataset]:
        if all((dest / p).exists() for p in resource.provides):
            print(f"download: {resource.file_name}: already present under {dest}, skipped", file=sys.stderr)
            continue
        url = f"{url_base.rstrip('/')}/{resource.file_name}" if url_base else resource.url
        archive = dest / resource.file_name
        if archive.exists():
            verify_file(archive, resource.size, resource.md5 if check_md5 else None, is_zip=True, label=str(archive))
        else:
            fetch(url, archive, md5=resource.md5 if check_md5 else None, size=resource.size, retries=retries,
                  backoff=backoff, timeout=timeout, show_progress=show_progress,
                  what_to_do=_by_hand_message(resource, url, dest))
        extract(archive, dest, resource.provides)
        if not keep_archives:
            archive.unlink()
    outputs = dataset_outputs(dataset, dest)
    if dataset == "flickr8k" and not outputs["captions_json"].exists():
        write_flickr8k_coco(dest / "Flickr8k.token.txt", outputs["images_dir"], outputs["captions_json"])
    return outputs
