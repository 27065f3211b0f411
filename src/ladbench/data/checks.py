"""Checks shared by the annotation readers (COCO-format files, the reference's tables): the
error they raise and what makes a caption or a file name unusable."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

MAX_LISTED = 5  # how many offending ids/files an error message lists
#: The longest caption accepted (characters): COCO's and Flickr8k's are under 300; a prompt
#: holds one caption beside N images, and a megabyte of text would exhaust the memory of
#: the model's processor long before it said anything.
MAX_CAPTION_CHARS = 1000


class AnnotationError(ValueError):
    """An annotation file is malformed or inconsistent; the message names the file."""


def caption_problem(caption: Any) -> str | None:
    """Why ``caption`` cannot be a caption (not a string, empty, too long), or None."""
    if not isinstance(caption, str):
        return f"is a {type(caption).__name__}, not a string"
    if not caption.strip():
        return "is empty"
    if len(caption) > MAX_CAPTION_CHARS:
        return f"has {len(caption):,} characters, more than {MAX_CAPTION_CHARS:,}"
    return None


def file_name_problem(file_name: Any) -> str | None:
    """Why ``file_name`` does not name a file inside the image root, or None: an image table
    reads only below its root unless it says otherwise (``files_outside_root``)."""
    if not isinstance(file_name, str) or not file_name:
        return "is not a file name"
    path = Path(file_name)
    if path.is_absolute() or ".." in path.parts:
        return "points outside the image root (an absolute path or '..')"
    return None


def examples(items: Iterable[Any]) -> str:
    """The first few of ``items`` for an error message, and how many there are in all."""
    items = list(items)
    shown = ", ".join(str(x) for x in items[:MAX_LISTED])
    return shown + (f", ... ({len(items)} in all)" if len(items) > MAX_LISTED else "")
