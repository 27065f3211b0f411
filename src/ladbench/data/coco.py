"""Annotation files in the MS-COCO format -> the image table (docs/formats.md §1).

One caption per image: the first caption annotation listed for that image in the
captions file (file order, not annotation id; the reference implementation's choice).
Captions are stripped of surrounding whitespace (COCO has a few with trailing spaces
or newlines). Or, with ``reference_tables``, the caption and category tables the
reference implementation ships, verbatim (:mod:`ladbench.data.reference_tables`). Categories: the sorted set of category ids of the image's instance
annotations; an image without instances keeps an empty list here and is left out of
the benchmark pool later (:mod:`ladbench.benchmark`).

Flickr8k has no instance annotations. :func:`flickr8k_to_coco` converts its caption file
(``Flickr8k.token.txt`` of the original release, or the ``captions.txt`` CSV of the
Kaggle copy) to a COCO captions file, so one reader serves COCO, Flickr8k and the demo.
Its image table has ``"has_categories": false`` and every ``categories`` list empty;
the adversarial benchmark then applies the caption-similarity rule only (see
:mod:`ladbench.benchmark`).

Beyond formats.md §1, the table carries two additive keys: ``has_categories`` (an
instances file was read) and ``skipped_files`` (images left out by ``--skip-missing``).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable

from ladbench.atomic import (atomic_write_json, atomic_write_text, file_digest, json_one_item_per_line, read_json,
                             read_signed_json, signed)
from ladbench.data.checks import AnnotationError, caption_problem, examples, file_name_problem
from ladbench.data.reference_tables import table_annotations

def _identifier(value: Any, what: str, source: str | os.PathLike) -> int:
    """An image or category id: an integer as written (4713.7 or "4713" are mistakes, not 4713)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise AnnotationError(f"{source}: {what} {repr(value)[:40]} is not an integer")
    return value


def load_annotation_json(path: str | os.PathLike, need: tuple[str, ...] = ("images", "annotations")) -> dict:
    """Read a COCO-format JSON file and check that it has the top-level lists ``need``."""
    path = Path(path)
    doc = read_json(path, "annotation file not found", AnnotationError)
    if not isinstance(doc, dict):
        raise AnnotationError(f"{path}: expected a JSON object with keys {list(need)}")
    for key in need:
        if not isinstance(doc.get(key), list):
            raise AnnotationError(f"{path}: missing the list '{key}' of the MS-COCO format")
    return doc


def index_images(images: list[dict], source: str | os.PathLike) -> dict[int, str]:
    """Map image id -> file name; duplicate ids or entries without id/file_name are errors."""
    index: dict[int, str] = {}
    duplicates = []
    for entry in images:
        if not isinstance(entry, dict) or "id" not in entry or "file_name" not in entry:
            raise AnnotationError(f"{source}: an entry of 'images' lacks 'id' or 'file_name': {str(entry)[:200]}")
        image_id = _identifier(entry["id"], "image id", source)
        if image_id in index:
            duplicates.append(image_id)
        index[image_id] = str(entry["file_name"])
    if duplicates:
        raise AnnotationError(f"{source}: duplicate image ids in 'images': {examples(duplicates)}")
    return index


def first_captions(annotations: list[dict], known_ids: set[int] | dict, source: str | os.PathLike) -> dict[int, str]:
    """The first caption listed (file order) for each image id.

    A caption whose ``image_id`` is not among the file's images is an error (captions
    without images), as is a caption annotation without ``image_id``/``caption``.
    """
    captions: dict[int, str] = {}
    orphans = []
    for annotation in annotations:
        if not isinstance(annotation, dict) or "image_id" not in annotation or "caption" not in annotation:
            raise AnnotationError(f"{source}: a caption annotation lacks 'image_id' or 'caption': {str(annotation)[:200]}")
        image_id = _identifier(annotation["image_id"], "image_id of a caption", source)
        if image_id not in known_ids:
            orphans.append(image_id)
            continue
        if image_id not in captions:
            problem = caption_problem(annotation["caption"])
            if problem:
                raise AnnotationError(f"{source}: the caption of image {image_id} {problem}")
            captions[image_id] = annotation["caption"].strip()
    if orphans:
        raise AnnotationError(f"{source}: captions refer to image ids that are not in 'images' "
                              f"(captions without images): {examples(sorted(set(orphans)))}")
    return captions


def category_sets(instances: dict, known_ids: set[int] | dict, source: str | os.PathLike) -> dict[int, list[int]]:
    """Sorted category-id set per image id from an instances file.

    Annotations on unknown images or with undeclared category ids are errors.
    """
    declared = {int(c["id"]) for c in instances.get("categories", []) if isinstance(c, dict) and "id" in c}
    if not declared:
        raise AnnotationError(f"{source}: no 'categories' declared; is this an instances file?")
    sets: dict[int, set[int]] = {}
    unknown_images, unknown_categories = [], []
    for annotation in instances["annotations"]:
        if not isinstance(annotation, dict) or "image_id" not in annotation or "category_id" not in annotation:
            raise AnnotationError(f"{source}: an instance annotation lacks 'image_id' or 'category_id': "
                                  f"{str(annotation)[:200]}")
        image_id = _identifier(annotation["image_id"], "image_id of an instance", source)
        category = _identifier(annotation["category_id"], "category_id", source)
        if image_id not in known_ids:
            unknown_images.append(image_id)
        elif category not in declared:
            unknown_categories.append(category)
        else:
            sets.setdefault(image_id, set()).add(category)
    if unknown_images:
        raise AnnotationError(f"{source}: instance annotations refer to image ids that are not in the "
                              f"captions file: {examples(sorted(set(unknown_images)))}")
    if unknown_categories:
        raise AnnotationError(f"{source}: instance annotations use undeclared category ids: "
                              f"{examples(sorted(set(unknown_categories)))}")
    return {image_id: sorted(cats) for image_id, cats in sets.items()}


def build_image_table(captions_json: str | os.PathLike, instances_json: str | os.PathLike | None,
                      image_root: str | os.PathLike, dataset: str, check_files: bool = True,
                      skip_missing: bool = False, reference_tables: str | os.PathLike | None = None,
                      files_outside_root: bool = False) -> dict:
    """Build the image table of docs/formats.md §1 from COCO-format annotation files.

    ``instances_json`` may be None (datasets without instance annotations). With
    ``check_files`` every image file must exist under ``image_root``; a missing file is
    an error naming it, unless ``skip_missing`` drops such images (listed in
    ``skipped_files``). Every image must have at least one caption (a non-empty string of
    at most :data:`~ladbench.data.checks.MAX_CAPTION_CHARS`). A ``file_name`` must lie inside ``image_root``
    unless ``files_outside_root`` (recorded in the table). ``reference_tables``: a folder
    with the reference implementation's caption and category tables, which then give every
    caption (verbatim) and category set instead of the captions file's first caption and
    ``instances_json`` (:mod:`ladbench.data.reference_tables`).
    """
    if reference_tables is not None and instances_json is not None:
        raise AnnotationError(f"{instances_json}: the reference tables in {reference_tables} give the categories; "
                              "pass one of the two")
    captions_doc = load_annotation_json(captions_json, need=("images",) if reference_tables is not None else
                                        ("images", "annotations"))
    files = index_images(captions_doc["images"], captions_json)
    if not files_outside_root:
        _check_file_names(files.items(), captions_json)
    categories: dict[int, list[int]] = {}
    table_digests: dict[str, str] = {}
    if reference_tables is not None:
        captions, categories, table_digests = table_annotations(files, reference_tables)
    else:
        captions = first_captions(captions_doc["annotations"], files, captions_json)
    without_caption = sorted(set(files) - set(captions))
    if without_caption:
        raise AnnotationError(f"{captions_json}: images without any caption: {examples(without_caption)}")
    if instances_json is not None:
        instances_doc = load_annotation_json(instances_json)
        categories = category_sets(instances_doc, files, instances_json)

    root = Path(image_root).resolve()
    skipped: list[str] = []
    if check_files:
        if not root.is_dir():
            raise AnnotationError(f"image folder not found: {root}")
        missing = sorted(name for name in files.values() if not (root / name).is_file())
        if missing and not skip_missing:
            raise AnnotationError(f"{captions_json}: image files missing under {root}: {examples(missing)} "
                                  "(pass --skip-missing to leave them out)")
        skipped = missing
        if skipped:
            print(f"captions: skipped {len(skipped)} images whose files are missing under {root}", file=sys.stderr)
    skipped_set = set(skipped)
    rows = [{"image_id": image_id, "file_name": files[image_id], "caption": captions[image_id],
             "categories": categories.get(image_id, []),
             # the image's bytes, checked whenever it is read (read_image): a changed file is refused
             **({"sha256": file_digest(root / files[image_id])} if check_files else {})}
            for image_id in sorted(files) if files[image_id] not in skipped_set]
    if reference_tables is not None:
        for row in rows:        # listed with an empty set: still pooled, as the reference pools it
            if row["image_id"] in categories and not row["categories"]:
                row["categories_listed"] = True
    # the digests of the annotation files it was read from (what it is made of, not where they were)
    sources = {"captions_sha256": file_digest(captions_json),
               "instances_sha256": file_digest(instances_json) if instances_json is not None else None,
               **table_digests}
    return {"dataset": dataset, "image_root": str(root),
            "has_categories": instances_json is not None or reference_tables is not None,
            "sources": sources, "skipped_files": skipped, **({"files_outside_root": True} if files_outside_root else {}),
            "images": rows}


def _check_file_names(files: Iterable[tuple[int, Any]], source: str | os.PathLike) -> None:
    for image_id, file_name in files:
        problem = file_name_problem(file_name)
        if problem:
            raise AnnotationError(f"{source}: the file_name of image {image_id}, {str(file_name)[:200]!r}, {problem}; "
                                  "set the dataset's files_outside_root: true in the config if that is meant")


_REBUILD_TABLE = "rebuild it with `ladbench captions` (or delete it and rerun the workflow)"


def write_image_table(table: dict, out: str | os.PathLike) -> None:
    """Write the image table atomically (signed): one image per line, so diffs stay readable.
    An ``image_root`` inside the table's folder is recorded relative to it, so that a copied
    output folder reads its own images."""
    root = Path(table["image_root"])
    folder = Path(out).resolve().parent
    if root.is_absolute() and root.resolve().is_relative_to(folder):
        table = {**table, "image_root": root.resolve().relative_to(folder).as_posix() or "."}
    atomic_write_text(out, json_one_item_per_line(signed(table), ["images"]))


def load_image_table(path: str | os.PathLike) -> dict:
    """Read an image table and check its shape (keys, sorted unique ids); a relative
    ``image_root`` is resolved against the table's folder."""
    path = Path(path)
    table = read_signed_json(path, "image table", _REBUILD_TABLE, AnnotationError)
    for key in ("dataset", "image_root", "images"):
        if key not in table:
            raise AnnotationError(f"{path}: missing key '{key}' (docs/formats.md §1)")
    ids = [_identifier(row.get("image_id"), "image_id", path) for row in table["images"]]
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise AnnotationError(f"{path}: image ids must be unique and sorted")
    for row in table["images"]:
        problem = caption_problem(row.get("caption"))
        if problem:
            raise AnnotationError(f"{path}: the caption of image {row['image_id']} {problem}")
    if not table.get("files_outside_root", False):
        _check_file_names(((row["image_id"], row.get("file_name")) for row in table["images"]), path)
    table.setdefault("has_categories", any(row["categories"] for row in table["images"]))
    table["image_root"] = str(path.resolve().parent / table["image_root"])   # an absolute root is kept as it is
    return table


def image_digests(table: dict) -> dict[int, str | None]:
    """image_id -> the sha256 of its bytes the table records (None in a table made before it did)."""
    return {int(im["image_id"]): im.get("sha256") for im in table["images"]}


def read_image(path: str | os.PathLike, sha256: str | None, table_path: str | os.PathLike | None = None):
    """The image at ``path`` (a PIL image, opened on its bytes in memory), refused in one line if its bytes are not
    those the image table ``table_path`` recorded (``sha256``; None: unchecked) or if the file is
    not there (naming where the table says the images are)."""
    from PIL import Image

    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: image not found (the image table {table_path or ''} says the images are in "
                                f"{Path(path).parent}; copy them there or rebuild the table with `ladbench captions` "
                                "naming where they are)") from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise AnnotationError(f"{path}: image changed since the image table {table_path or ''} recorded it (its bytes "
                              f"do not match its sha256); restore it, or {_REBUILD_TABLE}")
    return Image.open(io.BytesIO(data))


def image_paths(table: dict) -> dict[int, str]:
    """image_id -> file path, from an image table read by ``load_image_table`` (formats.md §1)."""
    return {int(im["image_id"]): os.path.join(table["image_root"], im["file_name"]) for im in table["images"]}


def table_fingerprint(table: dict) -> str:
    """sha256 of what the later stages take from an image table: ids, file names, captions
    and, where recorded, the images' bytes digests (not ``image_root``: the same images moved
    elsewhere are the same inputs; a table without image digests keeps its fingerprint)."""
    digest = hashlib.sha256()
    for row in table["images"]:
        key = [row["image_id"], row["file_name"], row["caption"]]
        digest.update(json.dumps(key + [row["sha256"]] if row.get("sha256") else key).encode())
    return digest.hexdigest()


# --- Flickr8k ---------------------------------------------------------------------------

def read_flickr8k_captions(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(file name, caption) pairs in caption order from a Flickr8k caption file.

    Accepts the original ``Flickr8k.token.txt`` (``name.jpg#k<TAB>caption``; sorted by
    ``k`` within an image) and the Kaggle ``captions.txt`` CSV (header ``image,caption``;
    file order within an image).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AnnotationError(f"{path}: Flickr8k caption file not found") from None
    except UnicodeDecodeError as err:
        raise AnnotationError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise AnnotationError(f"{path}: empty caption file")
    if lines[0].strip().lower().startswith("image,caption"):
        reader = csv.reader(lines[1:])
        return [(row[0].strip(), ",".join(row[1:]).strip()) for row in reader if row]
    keyed = []
    for number, line in enumerate(lines, 1):
        key, sep, caption = line.partition("\t")
        name, hash_sign, index = key.partition("#")
        if not sep or not hash_sign or not index.strip().isdigit():
            raise AnnotationError(f"{path}:{number}: expected 'name.jpg#k<TAB>caption', got {line[:80]!r}")
        keyed.append((name.strip(), int(index), number, caption.strip()))
    keyed.sort(key=lambda item: (item[0], item[1], item[2]))
    return [(name, caption) for name, _, _, caption in keyed]


def flickr8k_to_coco(captions_path: str | os.PathLike, image_root: str | os.PathLike | None = None) -> dict:
    """Convert a Flickr8k caption file into an MS-COCO captions document.

    Image ids are 1, 2, ... in sorted file-name order, so they do not depend on the
    caption file's line order; annotations are listed image by image in caption order,
    so the first one listed is caption ``#0``. With ``image_root``, captions of files
    that do not exist there are dropped (the original token file names a
    ``2258277193_586949ec62.jpg.1`` that the image archive lacks) and the count is
    reported on stderr.
    """
    pairs = read_flickr8k_captions(captions_path)
    names = sorted({name for name, _ in pairs})
    if image_root is not None:
        root = Path(image_root)
        present = [name for name in names if (root / name).is_file()]
        dropped = len(names) - len(present)
        if dropped:
            print(f"flickr8k: dropped {dropped} captioned file names not found under {root}", file=sys.stderr)
        names = present
    ids = {name: index + 1 for index, name in enumerate(names)}
    order = {name: [] for name in names}
    for name, caption in pairs:
        if name in order:
            order[name].append(caption)
    annotations = []
    for name in names:
        for caption in order[name]:
            annotations.append({"image_id": ids[name], "id": len(annotations) + 1, "caption": caption})
    return {"info": {"description": "Flickr8k converted to the MS-COCO captions format by ladbench"},
            "licenses": [], "images": [{"id": ids[name], "file_name": name} for name in names],
            "annotations": annotations}


def write_flickr8k_coco(captions: str | os.PathLike, image_root: str | os.PathLike,
                        out: str | os.PathLike) -> dict:
    """Convert a Flickr8k caption file (:func:`flickr8k_to_coco`) and write the COCO
    captions file atomically, compact; returns the document."""
    doc = flickr8k_to_coco(captions, image_root)
    atomic_write_json(out, doc, separators=(",", ":"))
    return doc
