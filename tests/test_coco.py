"""COCO-format reading: first-caption rule, category sets, Flickr8k conversion, bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ladbench.atomic import signed
from ladbench.cli import build_parser
from ladbench.data import coco


def write(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


@pytest.fixture()
def coco_files(tmp_path):
    """A tiny dataset in the official layout: images listed out of id order, captions interleaved."""
    root = tmp_path / "val2014"
    root.mkdir()
    images = [{"id": 42, "file_name": "COCO_val2014_000000000042.jpg", "width": 8, "height": 8},
              {"id": 7, "file_name": "COCO_val2014_000000000007.jpg", "width": 8, "height": 8},
              {"id": 19, "file_name": "COCO_val2014_000000000019.jpg", "width": 8, "height": 8}]
    for image in images:
        (root / image["file_name"]).write_bytes(b"jpeg")
    captions = {"info": {}, "licenses": [], "images": images, "annotations": [
        # For image 42 the first caption listed has the LARGER annotation id.
        {"image_id": 42, "id": 900, "caption": "A dog on a sofa. \n"},
        {"image_id": 7, "id": 5, "caption": "Two cats."},
        {"image_id": 42, "id": 1, "caption": "a second caption for 42"},
        {"image_id": 19, "id": 77, "caption": "An empty street"},
        {"image_id": 7, "id": 2, "caption": "another cat caption"},
    ]}
    instances = {"info": {}, "licenses": [], "images": images, "annotations": [
        {"id": 1, "image_id": 42, "category_id": 18, "bbox": [0, 0, 1, 1]},
        {"id": 2, "image_id": 42, "category_id": 1, "bbox": [0, 0, 1, 1]},
        {"id": 3, "image_id": 42, "category_id": 18, "bbox": [0, 0, 1, 1]},
        {"id": 4, "image_id": 7, "category_id": 17, "bbox": [0, 0, 1, 1]},
    ], "categories": [{"id": 1, "name": "person"}, {"id": 17, "name": "cat"}, {"id": 18, "name": "dog"}]}
    return write(tmp_path / "captions.json", captions), write(tmp_path / "instances.json", instances), root


def test_first_listed_caption_and_sorted_category_sets(coco_files):
    captions, instances, root = coco_files
    table = coco.build_image_table(captions, instances, root, "coco")
    assert table["dataset"] == "coco" and table["image_root"] == str(root.resolve())
    assert table["has_categories"] is True
    jpeg = hashlib.sha256(b"jpeg").hexdigest()                 # each image's bytes, recorded
    assert table["images"] == [
        {"image_id": 7, "file_name": "COCO_val2014_000000000007.jpg", "caption": "Two cats.", "categories": [17],
         "sha256": jpeg},
        {"image_id": 19, "file_name": "COCO_val2014_000000000019.jpg", "caption": "An empty street", "categories": [],
         "sha256": jpeg},
        {"image_id": 42, "file_name": "COCO_val2014_000000000042.jpg", "caption": "A dog on a sofa.", "categories": [1, 18],
         "sha256": jpeg},
    ]


def test_table_round_trips_through_its_file(coco_files, tmp_path):
    captions, instances, root = coco_files
    table = coco.build_image_table(captions, instances, root, "coco")
    coco.write_image_table(table, tmp_path / "images.json")
    assert coco.load_image_table(tmp_path / "images.json") == table
    # plain JSON, with its digest; the image folder inside the table's folder recorded relative to it
    assert json.loads((tmp_path / "images.json").read_text()) == signed({**table, "image_root": "val2014"})


def test_a_copied_output_folder_reads_its_own_images(coco_files, tmp_path):
    """The issue's case: an absolute image_root made a copy read (changed) images from the
    original's folder. The copy now reads its own; an image changed after the table was made
    is refused in one line naming it; images missing are named with where they should be."""
    import shutil
    captions, instances, root = coco_files
    coco.write_image_table(coco.build_image_table(captions, instances, root, "coco"), tmp_path / "images.json")
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(tmp_path / "images.json", copy / "images.json")
    shutil.copytree(root, copy / "val2014")
    table = coco.load_image_table(copy / "images.json")
    paths, digests = coco.image_paths(table), coco.image_digests(table)
    assert paths[7] == str(copy.resolve() / "val2014" / "COCO_val2014_000000000007.jpg")
    (root / "COCO_val2014_000000000007.jpg").write_bytes(b"changed in the original")   # not the copy's input
    from PIL import UnidentifiedImageError
    with pytest.raises(UnidentifiedImageError):           # past the digest (the copy's bytes): b"jpeg" is no image
        coco.read_image(paths[7], digests[7])
    (copy / "val2014" / "COCO_val2014_000000000019.jpg").write_bytes(b"jpeg, changed")
    with pytest.raises(coco.AnnotationError, match=r"COCO_val2014_000000000019.jpg: image changed since the image "
                                                   r"table .* recorded it .*`ladbench captions`"):
        coco.read_image(paths[19], digests[19], copy / "images.json")
    shutil.rmtree(copy / "val2014")
    with pytest.raises(FileNotFoundError, match=r"000042.jpg: image not found \(the image table .* says the images are "
                                                r"in .*copy/val2014"):
        coco.read_image(paths[42], digests[42], copy / "images.json")


def test_without_instances_every_category_list_is_empty(coco_files):
    captions, _, root = coco_files
    table = coco.build_image_table(captions, None, root, "x")
    assert table["has_categories"] is False
    assert all(row["categories"] == [] for row in table["images"])


def edit(path: Path, change) -> Path:
    doc = json.loads(path.read_text())
    change(doc)
    return write(path, doc)


def test_duplicate_image_ids_are_rejected(coco_files):
    captions, instances, root = coco_files
    edit(captions, lambda d: d["images"].append(dict(d["images"][0])))
    with pytest.raises(coco.AnnotationError, match=r"captions.json: duplicate image ids in 'images': 42"):
        coco.build_image_table(captions, instances, root, "coco")


def test_captions_without_images_are_rejected(coco_files):
    captions, instances, root = coco_files
    edit(captions, lambda d: d["annotations"].append({"image_id": 999, "id": 3, "caption": "ghost"}))
    with pytest.raises(coco.AnnotationError, match=r"captions without images\): 999"):
        coco.build_image_table(captions, instances, root, "coco")


def test_images_without_captions_are_rejected(coco_files):
    captions, instances, root = coco_files
    edit(captions, lambda d: d.__setitem__("annotations", [a for a in d["annotations"] if a["image_id"] != 19]))
    with pytest.raises(coco.AnnotationError, match="images without any caption: 19"):
        coco.build_image_table(captions, instances, root, "coco")


def test_instances_on_unknown_images_or_categories_are_rejected(coco_files):
    captions, instances, root = coco_files
    edit(instances, lambda d: d["annotations"].append({"id": 9, "image_id": 5, "category_id": 1}))
    with pytest.raises(coco.AnnotationError, match="instances.json: .*image ids that are not in the captions file: 5"):
        coco.build_image_table(captions, instances, root, "coco")
    edit(instances, lambda d: d["annotations"].__setitem__(-1, {"id": 9, "image_id": 7, "category_id": 99}))
    with pytest.raises(coco.AnnotationError, match="undeclared category ids: 99"):
        coco.build_image_table(captions, instances, root, "coco")


def test_missing_files_are_named_or_skipped(coco_files, capsys):
    captions, instances, root = coco_files
    (root / "COCO_val2014_000000000019.jpg").unlink()
    with pytest.raises(coco.AnnotationError, match="COCO_val2014_000000000019.jpg"):
        coco.build_image_table(captions, instances, root, "coco")
    table = coco.build_image_table(captions, instances, root, "coco", skip_missing=True)
    assert [row["image_id"] for row in table["images"]] == [7, 42]
    assert table["skipped_files"] == ["COCO_val2014_000000000019.jpg"]
    assert "skipped 1 images" in capsys.readouterr().err
    assert len(coco.build_image_table(captions, instances, root, "coco", check_files=False)["images"]) == 3


def test_malformed_json_names_the_file(tmp_path):
    bad = tmp_path / "captions.json"
    bad.write_text("{not json")
    with pytest.raises(coco.AnnotationError, match="captions.json: not valid JSON"):
        coco.load_annotation_json(bad)
    write(bad, {"images": []})
    with pytest.raises(coco.AnnotationError, match="missing the list 'annotations'"):
        coco.load_annotation_json(bad)
    with pytest.raises(coco.AnnotationError, match="not found"):
        coco.load_annotation_json(tmp_path / "nope.json")


# --- Flickr8k ---------------------------------------------------------------------------

TOKEN_LINES = [
    "b_2.jpg#1\tsecond caption of b",
    "a_1.jpg#0\tfirst caption of a",
    "b_2.jpg#0\tfirst caption of b",
    "a_1.jpg#1\tsecond caption of a",
    "gone.jpg.1#0\ta caption whose image is not in the archive",
]


def test_flickr8k_token_file_to_coco_then_first_caption(tmp_path, capsys):
    images = tmp_path / "Flicker8k_Dataset"
    images.mkdir()
    for name in ("a_1.jpg", "b_2.jpg"):
        (images / name).write_bytes(b"jpeg")
    token = tmp_path / "Flickr8k.token.txt"
    token.write_text("\n".join(TOKEN_LINES) + "\n")
    doc = coco.flickr8k_to_coco(token, images)
    assert "dropped 1" in capsys.readouterr().err
    assert doc["images"] == [{"id": 1, "file_name": "a_1.jpg"}, {"id": 2, "file_name": "b_2.jpg"}]
    assert [a["caption"] for a in doc["annotations"]] == [
        "first caption of a", "second caption of a", "first caption of b", "second caption of b"]
    captions = write(tmp_path / "captions_flickr8k.json", doc)
    table = coco.build_image_table(captions, None, images, "flickr8k")
    assert [row["caption"] for row in table["images"]] == ["first caption of a", "first caption of b"]
    assert table["has_categories"] is False


def test_flickr8k_kaggle_csv_keeps_commas(tmp_path):
    path = tmp_path / "captions.txt"
    path.write_text('image,caption\nx.jpg,"A dog, running."\nx.jpg,Second one\ny.jpg,Y caption\n')
    assert coco.read_flickr8k_captions(path) == [("x.jpg", "A dog, running."), ("x.jpg", "Second one"),
                                                  ("y.jpg", "Y caption")]


def test_flickr8k_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "Flickr8k.token.txt"
    path.write_text("a.jpg#0\tok\nbroken line\n")
    with pytest.raises(coco.AnnotationError, match=r"Flickr8k.token.txt:2"):
        coco.read_flickr8k_captions(path)


def test_cli_captions_and_flickr(coco_files, tmp_path):
    captions, instances, root = coco_files
    parser = build_parser(only="captions")
    out = tmp_path / "out" / "images.json"
    args = parser.parse_args(["captions", "--captions-json", str(captions), "--instances-json", str(instances),
                              "--image-root", str(root), "--dataset", "coco", "--out", str(out)])
    args.func(args)
    assert [row["image_id"] for row in json.loads(out.read_text())["images"]] == [7, 19, 42]
    token = tmp_path / "t.txt"
    token.write_text("a.jpg#0\tA\n")
    args = build_parser(only="flickr8k-to-coco").parse_args(["flickr8k-to-coco", "--captions", str(token), "--out", str(tmp_path / "c.json")])
    args.func(args)
    assert json.loads((tmp_path / "c.json").read_text())["annotations"][0]["caption"] == "A"
