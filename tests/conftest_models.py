"""Shared fixtures and helpers for the model / inference tests. The fixtures reach every
test through tests/conftest.py; helpers are imported (``from conftest_models import make_demo_benchmark``).

Tiny models of each family are built once per test session into a temporary folder, with
a private ``HF_HOME`` and ``HF_HUB_OFFLINE=1`` (the OV-1.5 stand-in's remote code is cached
by transformers under ``HF_HOME``, keyed by the folder's base name; a private home keeps
parallel sessions apart).
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Callable

import pytest

from ladbench.families import TINY_FAMILIES
from ladbench.atomic import signed
from ladbench.models import lane_families  # noqa: E402

#: the families the model tests run: those of the installed transformers lane (models/compat.py)
#: with a tiny build (family auto runs on the tiny builds of architectures: tests/test_auto.py)
FAMILIES = tuple(f for f in lane_families() if f in TINY_FAMILIES)
#: tiny processors cap images at 112 x 112 px; 56 px gives 4 visual tokens per image (Qwen, OV)
TINY_IMAGE_SIZE = 56

_COLOURS = [("red", (255, 0, 0)), ("blue", (0, 0, 255)), ("green", (0, 255, 0)), ("yellow", (255, 255, 0)),
            ("black", (0, 0, 0)), ("white", (255, 255, 255)), ("magenta", (255, 0, 255)), ("cyan", (0, 255, 255)),
            ("maroon", (128, 0, 0)), ("olive", (128, 128, 0)), ("navy", (0, 0, 128)), ("teal", (0, 128, 128)),
            ("grey", (128, 128, 128)), ("orange", (255, 128, 0))]


@pytest.fixture(scope="session")
def hf_offline(tmp_path_factory) -> str:
    """Private HF_HOME + offline mode for the whole session (set before any model loads)."""
    home = str(tmp_path_factory.mktemp("hf_home"))
    os.environ["HF_HOME"] = home
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    return home


@pytest.fixture(scope="session")
def tiny_model(hf_offline, tmp_path_factory) -> Callable[[str], str]:
    """``tiny_model(family)`` -> folder of a tiny model of that family (built once, seed 0)."""
    from ladbench.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("tiny_models")
    built: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in built:
            # unique base name per session: the remote-code module cache is keyed by it
            built[family] = build_tiny_model(family, str(root / f"{family}_{root.name}"), seed=0)
        return built[family]
    return get


@pytest.fixture(scope="session")
def tiny_adapter(tiny_model) -> Callable[..., object]:
    """``tiny_adapter(family, attention="capture")`` -> loaded adapter (cached per session)."""
    from ladbench.models import load_adapter

    loaded: dict[tuple[str, str], object] = {}

    def get(family: str, attention: str = "capture"):
        key = (family, attention)
        if key not in loaded:
            loaded[key] = load_adapter(family, tiny_model(family), device="cpu", dtype="float32",
                                       trust_remote_code=family == "llava_ov15", attention=attention)
        return loaded[key]
    return get


@pytest.fixture(scope="session")
def tiny_arch_model(hf_offline, tmp_path_factory) -> Callable[[str], str]:
    """``tiny_arch_model(model_type)`` -> folder of that architecture's tiny build
    (``models/tiny_archs.py``; built once, seed 0)."""
    from ladbench.models.tiny_archs import build_tiny_architecture

    root = tmp_path_factory.mktemp("tiny_archs")
    built: dict[str, str] = {}

    def get(model_type: str) -> str:
        if model_type not in built:
            built[model_type] = build_tiny_architecture(model_type, str(root / model_type))
        return built[model_type]
    return get


@pytest.fixture(scope="session")
def auto_adapter(tiny_model, tiny_arch_model) -> Callable[..., object]:
    """``auto_adapter(name, attention="capture")``: ``family: auto`` on the tiny build of an
    architecture (``models/tiny_archs.py``) or of a family (``models/tiny.py``), cached per session."""
    from ladbench.models import load_adapter
    from ladbench.models.tiny_archs import given_chat_template

    loaded: dict[tuple[str, str], object] = {}

    def get(name: str, attention: str = "capture"):
        if (name, attention) not in loaded:
            folder = tiny_model(name) if name in TINY_FAMILIES else tiny_arch_model(name)
            loaded[name, attention] = load_adapter("auto", folder, device="cpu", dtype="float32", attention=attention,
                                                   chat_template=given_chat_template(folder))
        return loaded[name, attention]
    return get


def make_images(n: int, size: int = 40, offset: int = 0):
    """``n`` plain-colour PIL images (distinct colours)."""
    from PIL import Image
    return [Image.new("RGB", (size, size + 8), _COLOURS[(i + offset) % len(_COLOURS)][1]) for i in range(n)]


def make_demo_benchmark(folder: Path, n: int, *, n_eval: int = 3, n_orderings: int = 3, n_cal: int = 2,
                        seed: int = 0) -> tuple[Path, Path]:
    """Write coloured-square images, an image table (formats §1) and a benchmark (formats §3).

    Captions of different lengths, so batches need left padding. Returns (benchmark, images).
    """
    from PIL import Image
    rng = random.Random(seed)
    img_dir = folder / "images"
    img_dir.mkdir(parents=True, exist_ok=True)
    table = []
    for image_id, (name, rgb) in enumerate(_COLOURS):
        file_name = f"{image_id:04d}.png"
        Image.new("RGB", (48, 40), rgb).save(img_dir / file_name)
        table.append({"image_id": image_id, "file_name": file_name, "caption": f"a {name} square", "categories": []})

    def instance(k: int, target: int) -> dict:
        others = rng.sample([i for i in range(len(_COLOURS)) if i != target], n - 1)
        candidates = others + [target]
        rng.shuffle(candidates)
        caption = f"a {_COLOURS[target][0]} square" + " on a long wooden table near a window" * (k % 2)
        return {"id": k, "caption": caption, "target": target, "candidates": candidates}

    evaluation = []
    for k in range(n_eval):
        inst = instance(k, k % len(_COLOURS))
        orderings = [list(range(n))]
        while len(orderings) < n_orderings:
            perm = rng.sample(range(n), n)
            if perm not in orderings:
                orderings.append(perm)
        inst["orderings"] = orderings
        evaluation.append(inst)
    calibration = [instance(k, (n_eval + k) % len(_COLOURS)) for k in range(n_cal)]
    bench = {"dataset": "demo", "setting": "random", "n_candidates": n, "seed": seed, "n_orderings": n_orderings,
             "eval": evaluation, "calibration": calibration}
    bench_path, images_path = folder / f"demo_random_N{n}.json", folder / "images.json"
    bench_path.write_text(json.dumps(signed(bench)))
    images_path.write_text(json.dumps(signed({"dataset": "demo", "image_root": str(img_dir), "images": table})))
    return bench_path, images_path


def demo_runner(adapter, folder: Path, n: int, *, bench_options: dict | None = None, **settings):
    """The inference stage's ``RowRunner`` of a tiny ``adapter`` over a demo benchmark of ``n``
    candidates written to ``folder`` (``bench_options``: :func:`make_demo_benchmark`'s; ``settings``:
    ``InferenceSettings`` fields beyond the inputs and the model)."""
    from ladbench.benchmark import load_benchmark
    from ladbench.data.coco import load_image_table
    from ladbench.inference.cache import plan_rows
    from ladbench.inference.runner import InferenceSettings, RowRunner, image_paths

    bench_path, images_path = make_demo_benchmark(folder, n, **(bench_options or {}))
    bench = load_benchmark(bench_path)
    config = InferenceSettings(benchmark=str(bench_path), images=str(images_path), out="x", model_name="t",
                               family=adapter.family, model_path=adapter.model_path, image_size=TINY_IMAGE_SIZE,
                               **settings)
    return RowRunner(adapter, config, bench, plan_rows(bench), image_paths(load_image_table(images_path)))
