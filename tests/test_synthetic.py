"""The embedded synthetic scenes: determinism, official COCO formats, drawn content matches annotations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ladbench.cli import build_parser
from ladbench.data import coco, synthetic


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    return synthetic.build_scenes(tmp_path_factory.mktemp("s") / "demo", n_images=60, seed=5, image_size=64)


def test_same_seed_is_byte_identical_and_other_seed_differs(tmp_path, scenes):
    again = synthetic.build_scenes(tmp_path / "again", n_images=60, seed=5, image_size=64)
    assert tree_bytes(again) == tree_bytes(scenes)
    other = synthetic.build_scenes(tmp_path / "other", n_images=60, seed=6, image_size=64)
    assert tree_bytes(other) != tree_bytes(scenes)


def test_official_coco_structure(scenes):
    captions = json.loads((scenes / "annotations" / "captions.json").read_text())
    instances = json.loads((scenes / "annotations" / "instances.json").read_text())
    image_ids = {image["id"] for image in captions["images"]}
    assert len(image_ids) == 60 == len(captions["images"])
    assert captions["images"] == instances["images"]
    assert {a["image_id"] for a in captions["annotations"]} == image_ids
    assert len({a["id"] for a in captions["annotations"]}) == len(captions["annotations"]) == 120
    assert {c["id"] for c in instances["categories"]} == set(range(1, 13))
    for annotation in instances["annotations"]:
        x, y, w, h = annotation["bbox"]
        assert annotation["image_id"] in image_ids and 0 <= x and x + w <= 64 and 0 <= y and y + h <= 64
        assert annotation["area"] == w * h and annotation["iscrowd"] == 0
    for image in captions["images"]:
        assert (scenes / "images" / image["file_name"]).is_file()


def test_pixels_show_the_annotated_objects_and_captions_name_them(scenes):
    instances = json.loads((scenes / "annotations" / "instances.json").read_text())
    names = {c["id"]: c["name"] for c in instances["categories"]}
    files = {image["id"]: image["file_name"] for image in instances["images"]}
    table = coco.build_image_table(scenes / "annotations" / "captions.json", scenes / "annotations" / "instances.json",
                                   scenes / "images", "demo")
    caption_of = {row["image_id"]: row["caption"] for row in table["images"]}
    for annotation in instances["annotations"]:
        x, y, w, h = annotation["bbox"]
        pixels = np.asarray(Image.open(scenes / "images" / files[annotation["image_id"]]).convert("RGB"))
        colour, shape = names[annotation["category_id"]].split()
        # A point inside every shape: the centre (for triangles, two thirds down the axis).
        cy = y + (2 * h) // 3 if shape == "triangle" else y + h // 2
        assert tuple(pixels[cy, x + w // 2]) == synthetic.COLOURS[colour]
        assert f"a {colour} {shape}" in caption_of[annotation["image_id"]]
    # The first caption listed is the descriptive one, and empty scenes have no categories.
    for row in table["images"]:
        assert not row["caption"].startswith("a picture of")
        assert (row["caption"] == "an empty grey canvas") == (row["categories"] == [])


def test_first_listed_caption_is_not_the_smallest_annotation_id(scenes):
    captions = json.loads((scenes / "annotations" / "captions.json").read_text())
    by_image: dict[int, list[dict]] = {}
    for annotation in captions["annotations"]:
        by_image.setdefault(annotation["image_id"], []).append(annotation)
    assert any(anns[0]["id"] > anns[1]["id"] for anns in by_image.values())


def test_replaces_previous_output_but_not_foreign_folders(tmp_path):
    out = synthetic.build_scenes(tmp_path / "demo", n_images=4, seed=0, image_size=32)
    synthetic.build_scenes(out, n_images=5, seed=0, image_size=32)
    assert len(list((out / "images").iterdir())) == 5
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("precious")
    with pytest.raises(ValueError, match="not a previous demo-scenes output"):
        synthetic.build_scenes(foreign, n_images=4)
    assert (foreign / "keep.txt").read_text() == "precious"


def test_cli(tmp_path):
    parser = build_parser(only="demo-scenes")
    args = parser.parse_args(["demo-scenes", "--out", str(tmp_path / "d"), "--n-images", "6", "--seed", "1",
                              "--image-size", "32"])
    args.func(args)
    assert len(list((tmp_path / "d" / "images").glob("*.png"))) == 6
    with pytest.raises(ValueError, match="--n-images"):
        synthetic.build_scenes(tmp_path / "e", n_images=0)
