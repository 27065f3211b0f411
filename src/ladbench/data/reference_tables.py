"""The reference implementation's caption and category tables, read without executing anything.

The authors' code (brightXian/LAD) ships ``data/annotations_trainval/file_to_caption.pkl``
(``{file name: caption}``, one caption per image) and ``file_to_cat.pkl``
(``{"file_to_catIds": {file name: set of category ids}}``); which caption it keeps per
image decides the caption similarities of the adversarial mining and the prompt. With
``datasets.<name>.reference_tables`` (``ladbench captions --reference-tables``) they replace
the first listed caption and the instances file's categories of the image table; the
image ids and file names still come from the captions file.

They are pickles, and a pickle may name any Python callable to run at load time. The
:class:`PlainUnpickler` names none: every opcode that would look up a Python object
(classes, functions, extension codes, persistent ids) is refused, and what loads must be
made of dicts, lists, tuples, sets, strings and integers only; anything else is refused
with one line naming the file. Captions are kept verbatim (4,722 of the reference's
40,504 carry surrounding white space, which its prompts and CLIP features keep too).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path, PurePosixPath
from typing import Any

from ladbench.atomic import file_digest
from ladbench.data.checks import AnnotationError, caption_problem, examples

CAPTIONS_FILE = "file_to_caption.pkl"
CATEGORIES_FILE = "file_to_cat.pkl"
CATEGORIES_KEY = "file_to_catIds"
_PLAIN_TYPES = (dict, list, tuple, set, frozenset, str, int)
_ADMITTED = "only dicts, lists, tuples, sets, strings and integers are read, and nothing in the file is run"
#: the only names a plain pickle may use (protocols 0 to 3 write a set as a call of its type;
#: protocol 0 and 1 under Python 2's module name)
_SET_CONSTRUCTORS = {(module, kind.__name__): kind for module in ("builtins", "__builtin__") for kind in (set, frozenset)}
#: largest category id read (COCO's are below 100; a longer integer is no id)
MAX_CATEGORY_ID = 2 ** 31 - 1


class _Refused(Exception):
    """The pickle asks for something beyond plain data."""


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that resolves no Python object: it builds plain containers and scalars only."""

    def find_class(self, module: str, name: str) -> Any:
        # pickle protocols 0 to 3 have no set opcode: a set is ``builtins.set`` applied to a list
        if (module, name) in _SET_CONSTRUCTORS:
            return _SET_CONSTRUCTORS[module, name]
        raise _Refused(f"it names the Python object {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("it holds a persistent id")


def load_plain_pickle(path: str | os.PathLike) -> Any:
    """The content of a pickle made of plain data (:data:`_PLAIN_TYPES`); an
    :class:`AnnotationError` naming the file for anything else."""
    try:
        with open(path, "rb") as handle:
            data = PlainUnpickler(handle).load()
    except FileNotFoundError:
        raise AnnotationError(f"{path}: reference table not found") from None
    except _Refused as refused:
        raise AnnotationError(f"{path}: not read: {refused}; {_ADMITTED}") from None
    except ValueError as error:
        if "int_max_str_digits" not in str(error):
            raise AnnotationError(f"{path}: not a readable pickle (ValueError: {error})") from None
        raise AnnotationError(f"{path}: not read: it holds an integer of thousands of digits, which no caption or "
                              "category table holds") from None
    except Exception as error:  # truncated or not a pickle: the unpickler raises many types
        raise AnnotationError(f"{path}: not a readable pickle ({type(error).__name__}: {error})") from None
    foreign = _first_foreign(data)
    if foreign is not None:
        raise AnnotationError(f"{path}: not read: it holds a {type(foreign[0]).__name__}; {_ADMITTED}")
    return data


def _first_foreign(data: Any) -> tuple[Any] | None:
    """``(value,)``: the first value (depth first) whose exact type is not a plain one; None if all are."""
    stack, seen = [data], set()
    while stack:
        value = stack.pop()
        if type(value) not in _PLAIN_TYPES:    # exact types: no bool, no subclasses
            return (value,)
        if isinstance(value, (str, int)) or id(value) in seen:
            continue
        seen.add(id(value))                   # a pickle may hold cycles
        stack.extend(value.keys() if isinstance(value, dict) else value)
        if isinstance(value, dict):
            stack.extend(value.values())
    return None


def read_reference_tables(folder: str | os.PathLike) -> tuple[dict[str, str], dict[str, list[int]], dict[str, str]]:
    """Captions and category sets by file name from the two tables in ``folder``, and the
    tables' sha256 (``file_to_caption_sha256``, ``file_to_cat_sha256``). An empty category set is
    kept: the image is listed, and the reference pools every image its table lists."""
    folder = Path(folder)
    captions_path, categories_path = folder / CAPTIONS_FILE, folder / CATEGORIES_FILE
    captions = load_plain_pickle(captions_path)
    if not isinstance(captions, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in captions.items()):
        raise AnnotationError(f"{captions_path}: expected a dict of file name -> caption (strings)")
    document = load_plain_pickle(categories_path)
    sets = document.get(CATEGORIES_KEY) if isinstance(document, dict) else None
    if not isinstance(sets, dict) or not all(
            isinstance(k, str) and isinstance(v, (set, frozenset, list, tuple))
            and all(type(c) is int and 0 <= c <= MAX_CATEGORY_ID for c in v) for k, v in sets.items()):
        raise AnnotationError(f"{categories_path}: expected {{'{CATEGORIES_KEY}': {{file name: set of category "
                              f"ids (integers in 0..{MAX_CATEGORY_ID})}}")
    digests = {"file_to_caption_sha256": file_digest(captions_path), "file_to_cat_sha256": file_digest(categories_path)}
    return captions, {name: sorted(set(cats)) for name, cats in sets.items()}, digests


def table_annotations(files: dict[int, str], folder: str | os.PathLike,
                      ) -> tuple[dict[int, str], dict[int, list[int]], dict[str, str]]:
    """Caption and category set per image id (``files``: id -> file name) from the reference
    tables, matched by base name; an image without a caption there is an error. Also the
    tables' digests."""
    by_name, categories_by_name, digests = read_reference_tables(folder)
    names = {image_id: PurePosixPath(name).name for image_id, name in files.items()}
    missing = sorted(name for name in names.values() if name not in by_name)
    if missing:
        raise AnnotationError(f"{Path(folder) / CAPTIONS_FILE}: no caption for images of the captions file: "
                              f"{examples(missing)}")
    captions = {image_id: by_name[name] for image_id, name in names.items()}
    for image_id, caption in captions.items():
        problem = caption_problem(caption)
        if problem:
            raise AnnotationError(f"{Path(folder) / CAPTIONS_FILE}: the caption of image {image_id} ({names[image_id]}) "
                                  f"{problem}")
    categories = {image_id: categories_by_name[name] for image_id, name in names.items() if name in categories_by_name}
    return captions, categories, digests
