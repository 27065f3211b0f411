"""The reference's caption and category tables (pickles) as the image table's captions and
categories, read by an unpickler that runs nothing."""

from __future__ import annotations

import hashlib
import json
import pickle
import pickletools

import numpy as np
import pytest

from ladbench.cli import build_parser
from ladbench.data import coco
from ladbench.data.reference_tables import load_plain_pickle

NAMES = {42: "COCO_val2014_000000000042.jpg", 7: "COCO_val2014_000000000007.jpg", 19: "COCO_val2014_000000000019.jpg"}


@pytest.fixture()
def dataset(tmp_path):
    """COCO-format captions file (ids and file names) + the two tables as the reference ships
    them (protocol 4, category ids as sets, one caption with surrounding white space)."""
    root = tmp_path / "val2014"
    root.mkdir()
    for name in NAMES.values():
        (root / name).write_bytes(b"jpeg")
    captions = {"images": [{"id": i, "file_name": n} for i, n in NAMES.items()],
                "annotations": [{"image_id": i, "id": i, "caption": "the first listed"} for i in NAMES]}
    (tmp_path / "captions.json").write_text(json.dumps(captions))
    tables = tmp_path / "tables"
    tables.mkdir()
    with open(tables / "file_to_caption.pkl", "wb") as handle:
        pickle.dump({NAMES[42]: " A dog on a sofa.\n", NAMES[7]: "Two cats.", NAMES[19]: "An empty street",
                     "COCO_val2014_000000000099.jpg": "not in this dataset"}, handle, protocol=4)
    with open(tables / "file_to_cat.pkl", "wb") as handle:
        pickle.dump({"file_to_catIds": {NAMES[42]: {18, 1}, NAMES[7]: {17}}}, handle, protocol=4)
    return tmp_path / "captions.json", root, tables


def test_the_tables_give_captions_verbatim_categories_and_their_digests(dataset):
    captions, root, tables = dataset
    table = coco.build_image_table(captions, None, root, "coco", reference_tables=tables)
    assert table["has_categories"] is True
    assert [(r["image_id"], r["caption"], r["categories"]) for r in table["images"]] == [
        (7, "Two cats.", [17]), (19, "An empty street", []), (42, " A dog on a sofa.\n", [1, 18])]
    sources = table["sources"]
    for key, name in (("file_to_caption_sha256", "file_to_caption.pkl"), ("file_to_cat_sha256", "file_to_cat.pkl")):
        assert sources[key] == hashlib.sha256((tables / name).read_bytes()).hexdigest()
    assert sources["instances_sha256"] is None


def test_the_cli_reads_the_tables(dataset, tmp_path):
    captions, root, tables = dataset
    out = tmp_path / "images.json"
    args = build_parser(only="captions").parse_args(
        ["captions", "--captions-json", str(captions), "--image-root", str(root), "--dataset", "coco",
         "--reference-tables", str(tables), "--out", str(out)])
    args.func(args)
    assert json.loads(out.read_text())["images"][2]["caption"] == " A dog on a sofa.\n"


class Planted:
    """Unpickling this would create a file: the proof that something ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("content, refusal", [
    (lambda tmp: {"a.jpg": Planted(str(tmp / "ran"))}, "names the Python object io.open"),
    (lambda tmp: {"a.jpg": 1.5}, "holds a float"),
    (lambda tmp: {"a.jpg": b"bytes"}, "holds a bytes"),
    (lambda tmp: {"a.jpg": None}, "holds a NoneType"),
    (lambda tmp: {"a.jpg": {True}}, "holds a bool"),
])
def test_anything_but_plain_data_is_refused_naming_the_file(tmp_path, content, refusal):
    path = tmp_path / "file_to_caption.pkl"
    with open(path, "wb") as handle:
        pickle.dump(content(tmp_path), handle, protocol=4)
    with pytest.raises(coco.AnnotationError, match=f"^{path}: not read: it {refusal}; only dicts"):
        load_plain_pickle(path)
    assert not (tmp_path / "ran").exists()


def test_every_opcode_that_reaches_python_objects_is_refused(tmp_path):
    """GLOBAL (protocols 0-3), STACK_GLOBAL (4-5), extension codes and persistent ids."""
    import copyreg
    cases = [pickle.dumps(json.dumps, protocol=2), pickle.dumps(json.dumps, protocol=4), b"\x80\x04P0\n."]  # PERSID
    copyreg.add_extension("json", "dumps", 0xBEE)
    try:
        cases.append(pickle.dumps(json.dumps, protocol=2))     # by its extension code, resolved while registered
        assert any(op.name == "EXT2" for op, _, _ in pickletools.genops(cases[-1]))
        for number, data in enumerate(cases):
            path = tmp_path / f"{number}.pkl"
            path.write_bytes(data)
            with pytest.raises(coco.AnnotationError, match=f"^{path}: not read: it (names the Python object "
                                                           "json.dumps|holds a persistent id)"):
                load_plain_pickle(path)
    finally:
        copyreg.remove_extension("json", "dumps", 0xBEE)


def test_malformed_tables_are_named(dataset):
    captions, root, tables = dataset
    (tables / "file_to_cat.pkl").write_bytes(b"\x80\x04not a pickle")
    with pytest.raises(coco.AnnotationError, match="file_to_cat.pkl: not a readable pickle"):
        coco.build_image_table(captions, None, root, "coco", reference_tables=tables)
    with open(tables / "file_to_cat.pkl", "wb") as handle:
        pickle.dump({NAMES[7]: {17}}, handle)
    with pytest.raises(coco.AnnotationError, match="file_to_cat.pkl: expected {'file_to_catIds'"):
        coco.build_image_table(captions, None, root, "coco", reference_tables=tables)
    with open(tables / "file_to_cat.pkl", "wb") as handle:
        pickle.dump({"file_to_catIds": {NAMES[7]: {17}}}, handle)
    with open(tables / "file_to_caption.pkl", "wb") as handle:
        pickle.dump({NAMES[7]: "Two cats."}, handle)
    with pytest.raises(coco.AnnotationError, match="file_to_caption.pkl: no caption for images of the captions "
                                                   "file: COCO_val2014_000000000019.jpg"):
        coco.build_image_table(captions, None, root, "coco", reference_tables=tables)
    with pytest.raises(coco.AnnotationError, match="give the categories; pass one of the two"):
        coco.build_image_table(captions, captions, root, "coco", reference_tables=tables)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_sets_at_every_protocol_and_empty_sets_are_read(dataset, protocol):
    """Protocols 0 to 3 write a set as a call of builtins.set (plain data all the same); an image
    listed with an empty set is kept and marked, as the reference pools every image it lists."""
    captions, root, tables = dataset
    with open(tables / "file_to_cat.pkl", "wb") as handle:
        pickle.dump({"file_to_catIds": {NAMES[42]: {18, 1}, NAMES[7]: set(), NAMES[19]: frozenset({3})}}, handle,
                    protocol=protocol)
    table = coco.build_image_table(captions, None, root, "coco", reference_tables=tables)
    rows = {row["image_id"]: row for row in table["images"]}
    assert [rows[i]["categories"] for i in (7, 19, 42)] == [[], [3], [1, 18]]
    assert rows[7]["categories_listed"] is True and "categories_listed" not in rows[42]


def test_an_empty_set_image_is_in_the_pool():
    from ladbench.benchmark import eligible_rows
    emb = np.ones((3, 2))
    assert eligible_rows([[1], [], []], emb, True).tolist() == [0]
    assert eligible_rows([[1], [], []], emb, True, [False, True, False]).tolist() == [0, 1]


@pytest.mark.parametrize("body, expected", [
    # protocol 0 spells an integer in decimal: one past Python's 4,300-digit limit
    (b"(dVa.jpg\nL" + b"7" * 5000 + b"L\ns.", "it holds an integer of thousands of digits"),
])
def test_an_integer_of_thousands_of_digits_is_one_line(dataset, body, expected):
    captions, root, tables = dataset
    (tables / "file_to_caption.pkl").write_bytes(body)
    with pytest.raises(coco.AnnotationError) as caught:
        coco.build_image_table(captions, None, root, "coco", reference_tables=tables)
    assert str(caught.value).startswith(f"{tables / 'file_to_caption.pkl'}: not read: {expected}")
    assert "set_int_max_str_digits" not in str(caught.value)


def test_a_category_id_of_3000_digits_is_refused_naming_the_file(dataset):
    captions, root, tables = dataset
    with open(tables / "file_to_cat.pkl", "wb") as handle:
        pickle.dump({"file_to_catIds": {NAMES[7]: {int("7" * 3000)}}}, handle, protocol=4)
    with pytest.raises(coco.AnnotationError, match=r"file_to_cat.pkl: expected .*integers in 0\.\.2147483647"):
        coco.build_image_table(captions, None, root, "coco", reference_tables=tables)
