"""The embedded demo dataset: synthetic scenes of coloured shapes in the MS-COCO formats.

Each scene is a small PNG with 0-3 objects drawn with PIL; every object is one of
``len(SHAPES) * len(COLOURS)`` categories ("red circle", "blue square", ...). A scene has
two captions (e.g. "a red circle and a blue square"); the descriptive one is listed
first, so the first-caption rule of :mod:`ladbench.data.coco` picks it. About 5 % of the
scenes are empty (no instance annotation), like the few COCO images without objects,
so the "images without categories leave the pool" path is exercised by the demo too.

The output folder is laid out like an extracted COCO release::

    DIR/images/scene_000123.png
    DIR/annotations/captions.json     # {"images", "annotations": [{"image_id","id","caption"}]}
    DIR/annotations/instances.json    # {"images", "annotations": [..., "category_id", "bbox"], "categories"}

Image ids, the order of the ``images`` list and the caption annotation ids are drawn at
random (as in COCO, where neither follows file order), so readers that silently assume
"id == index" or "lowest annotation id == first caption" fail on the demo as they would
on COCO. The same seed gives byte-identical files (PNG encoding carries no timestamp).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from ladbench.atomic import atomic_path

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 38, 38),
    "green": (40, 160, 60),
    "blue": (40, 80, 215),
    "yellow": (235, 200, 30),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
EMPTY_SCENE_PROBABILITY = 0.05
MAX_OBJECTS = 3
GRID = 2  # objects sit in distinct cells of a GRID x GRID layout, so they never overlap
_FIXED_INFO = {"description": "ladbench synthetic scenes", "version": "1.0", "year": 2026,
               "contributor": "ladbench", "date_created": "2026-01-01"}


@dataclass(frozen=True)
class SceneObject:
    """One drawn object: its category and its bounding box [x, y, w, h] in pixels."""

    colour: str
    shape: str
    bbox: tuple[int, int, int, int]

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"


def category_table() -> list[dict]:
    """The COCO ``categories`` list: one entry per (colour, shape), ids from 1."""
    return [
        {"supercategory": shape, "id": category_id(colour, shape), "name": f"{colour} {shape}"}
        for shape in SHAPES for colour in COLOURS
    ]


def category_id(colour: str, shape: str) -> int:
    """The category id of a (colour, shape) pair; ids are 1-based like COCO's."""
    return 1 + SHAPES.index(shape) * len(COLOURS) + list(COLOURS).index(colour)


def _article_list(names: list[str]) -> str:
    phrases = [f"a {name}" for name in names]
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + " and " + phrases[-1]


def scene_captions(objects: list[SceneObject]) -> tuple[str, str]:
    """The scene's two captions: the descriptive one (listed first) and a paraphrase.

    Objects are named left to right so the caption follows what a reader sees.
    """
    if not objects:
        return "an empty grey canvas", "a plain background with no shapes"
    names = [obj.name for obj in sorted(objects, key=lambda o: (o.bbox[0], o.bbox[1]))]
    count = {1: "one shape", 2: "two shapes", 3: "three shapes"}[len(names)]
    return _article_list(names), f"a picture of {count}: {_article_list(names)}"


def _draw_object(draw: ImageDraw.ImageDraw, obj: SceneObject) -> list[float]:
    """Draw one object and return its outline polygon (COCO ``segmentation`` format)."""
    x, y, w, h = obj.bbox
    fill = COLOURS[obj.colour]
    if obj.shape == "circle":
        draw.ellipse([x, y, x + w - 1, y + h - 1], fill=fill)
        angles = np.linspace(0, 2 * np.pi, 16, endpoint=False)
        polygon = np.stack([x + w / 2 + w / 2 * np.cos(angles), y + h / 2 + h / 2 * np.sin(angles)], 1)
    elif obj.shape == "square":
        draw.rectangle([x, y, x + w - 1, y + h - 1], fill=fill)
        polygon = np.array([[x, y], [x + w, y], [x + w, y + h], [x, y + h]], dtype=float)
    else:
        polygon = np.array([[x + w / 2, y], [x + w, y + h], [x, y + h]], dtype=float)
        draw.polygon([tuple(p) for p in polygon.tolist()], fill=fill)
    return [round(float(v), 2) for v in polygon.reshape(-1)]


def sample_scene(rng: np.random.Generator, image_size: int) -> list[SceneObject]:
    """Draw a scene's objects: 0 (rarely) to MAX_OBJECTS distinct categories in distinct cells."""
    if rng.random() < EMPTY_SCENE_PROBABILITY:
        return []
    n_objects = int(rng.integers(1, MAX_OBJECTS + 1))
    n_categories = len(SHAPES) * len(COLOURS)
    picked = rng.choice(n_categories, size=n_objects, replace=False)
    cells = rng.choice(GRID * GRID, size=n_objects, replace=False)
    cell = image_size // GRID
    objects = []
    for category_index, cell_index in zip(picked.tolist(), cells.tolist()):
        shape = SHAPES[category_index // len(COLOURS)]
        colour = list(COLOURS)[category_index % len(COLOURS)]
        side = int(rng.integers(max(4, cell // 2), max(5, int(cell * 0.9)) + 1))
        x0 = (cell_index % GRID) * cell + int(rng.integers(0, cell - side + 1))
        y0 = (cell_index // GRID) * cell + int(rng.integers(0, cell - side + 1))
        objects.append(SceneObject(colour, shape, (x0, y0, side, side)))
    return objects


def sample_background(rng: np.random.Generator) -> tuple[int, int, int]:
    """A light background colour (each channel in 200..245), drawn per scene."""
    return tuple(int(v) for v in rng.integers(200, 246, size=3))


def render_scene(objects: list[SceneObject], image_size: int, background: tuple[int, int, int]) -> tuple[bytes, list[list[float]]]:
    """Render a scene to PNG bytes; also return each object's outline polygon."""
    image = Image.new("RGB", (image_size, image_size), background)
    draw = ImageDraw.Draw(image)
    polygons = [_draw_object(draw, obj) for obj in objects]
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue(), polygons


def build_scenes(out_dir: str | os.PathLike, n_images: int, seed: int = 0, image_size: int = 96) -> Path:
    """Write ``n_images`` synthetic scenes and their COCO-format annotations to ``out_dir``.

    The folder is built beside the target and renamed into place, so it either holds a
    complete dataset or does not exist. An existing ``out_dir`` is replaced only if it is
    empty or a previous demo-scenes output (its captions.json names this generator);
    anything else is a ValueError.
    Returns ``out_dir`` as a Path.
    """
    if n_images < 1:
        raise ValueError(f"demo-scenes: --n-images must be >= 1, got {n_images}")
    if image_size < 16:
        raise ValueError(f"demo-scenes: --image-size must be >= 16 pixels, got {image_size}")
    out = Path(out_dir)
    _clear_previous_output(out)
    rng = np.random.default_rng(seed)
    image_ids = np.sort(rng.choice(np.arange(1, 100 * n_images + 1), size=n_images, replace=False))
    listing_order = rng.permutation(n_images)  # COCO's images list is not sorted by id either

    images, captions, instances = [], [], []
    with atomic_path(out, folder=True) as tmp:
        (tmp / "images").mkdir()
        (tmp / "annotations").mkdir()
        for image_id in tqdm(image_ids.tolist(), desc="demo-scenes", unit="img"):
            objects = sample_scene(rng, image_size)
            png, polygons = render_scene(objects, image_size, sample_background(rng))
            file_name = f"scene_{image_id:06d}.png"
            (tmp / "images" / file_name).write_bytes(png)
            images.append({"id": image_id, "file_name": file_name, "width": image_size,
                           "height": image_size, "license": 0, "date_captured": "2026-01-01 00:00:00"})
            captions.append((image_id, scene_captions(objects)))
            for obj, polygon in zip(objects, polygons):
                instances.append({"image_id": image_id, "category_id": category_id(obj.colour, obj.shape),
                                  "bbox": list(obj.bbox), "area": obj.bbox[2] * obj.bbox[3],
                                  "iscrowd": 0, "segmentation": [polygon]})
        listed_images = [images[i] for i in listing_order.tolist()]
        caption_annotations = _caption_annotations(captions, rng)
        for index, annotation in enumerate(instances):
            annotation["id"] = index + 1
        _write_json(tmp / "annotations" / "captions.json",
                    {"info": _FIXED_INFO, "licenses": [], "images": listed_images,
                     "annotations": caption_annotations})
        _write_json(tmp / "annotations" / "instances.json",
                    {"info": _FIXED_INFO, "licenses": [], "images": listed_images,
                     "annotations": instances, "categories": category_table()})
    return out


def _caption_annotations(captions: list[tuple[int, tuple[str, str]]], rng: np.random.Generator) -> list[dict]:
    """Caption annotations: every image's first caption, then every image's second one.

    Annotation ids are a random permutation, so "the first caption listed" and "the
    caption with the smallest id" differ, as they can in COCO.
    """
    rows = [(image_id, texts[0]) for image_id, texts in captions] + \
           [(image_id, texts[1]) for image_id, texts in captions]
    ids = rng.permutation(len(rows)) + 1
    return [{"image_id": image_id, "id": int(ann_id), "caption": text}
            for (image_id, text), ann_id in zip(rows, ids.tolist())]


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, separators=(",", ":")) + "\n", encoding="utf-8")


def _clear_previous_output(out: Path) -> None:
    """Remove a previous demo-scenes output so the new one can be renamed into place."""
    if not out.exists():
        return
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
        return
    marker = out / "annotations" / "captions.json"
    try:
        previous = json.loads(marker.read_text(encoding="utf-8")).get("info", {}).get("description")
    except (OSError, ValueError):
        previous = None
    if previous != _FIXED_INFO["description"]:
        raise ValueError(f"demo-scenes: {out} exists and is not a previous demo-scenes output; "
                              "choose another --out or remove it")
    shutil.rmtree(out)
