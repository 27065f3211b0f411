"""What kind of model a number comes from, as the files record it (never guessed from a path).

A tiny model folder says how it was made in its ``ladbench_tiny.json`` (``kind``); the
inference stage copies that into every cache's ``model_kind`` attribute, evaluation and
analysis copy it into their files, and every table and figure made from a tiny model says
so in its title. Light module: the report imports it without torch.
"""
from __future__ import annotations

import hashlib
import json
import os

from ladbench.atomic import read_json
from typing import Iterable

TINY_RANDOM = "tiny-random"          # random weights (ladbench demo-model): mechanics, not results
TINY_ORGANISM = "tiny-organism"      # trained model organism (ladbench train-organism): planted bias
PRETRAINED = "pretrained"            # anything else: a real checkpoint
METADATA_FILE = "ladbench_tiny.json"

LABELS = {TINY_RANDOM: "tiny random model: mechanics, not results",
          TINY_ORGANISM: "tiny trained model organism with a planted bias (docs/organism.md)"}


def model_kind(model_path: str) -> str:
    """``tiny-random``, ``tiny-organism`` or ``pretrained``, from the folder's metadata file."""
    path = os.path.join(model_path, METADATA_FILE)
    if not os.path.isfile(path):
        return PRETRAINED
    metadata = read_json(path, "tiny model metadata not found")
    return metadata.get("kind", TINY_RANDOM) if isinstance(metadata, dict) else TINY_RANDOM


def metadata_identity(path: str) -> str:
    """The sha256 of a tiny model's metadata file without what changes from run to run:
    timings, which are named ``*_seconds`` wherever they are (e.g. the organism's
    ``training.train_seconds``). The same settings and weights give the same identity
    however long the training took, and so the same cache identity."""
    def without_timings(value):
        if isinstance(value, dict):
            return {k: without_timings(v) for k, v in value.items() if not str(k).endswith("_seconds")}
        return [without_timings(v) for v in value] if isinstance(value, list) else value
    metadata = read_json(path, "tiny model metadata not found")
    return hashlib.sha256(json.dumps(without_timings(metadata), sort_keys=True).encode()).hexdigest()


def is_demo(kind: str | None) -> bool:
    return kind in LABELS


def title_with_kind(title: str, kind: str | None) -> str:
    """``title [demo: tiny random model: mechanics, not results]`` for tiny models; else unchanged."""
    return f"{title} [demo: {LABELS[kind]}]" if is_demo(kind) else title


def demo_note(kinds: dict[str, str | None]) -> str | None:
    """One sentence saying which models of a table are tiny demo models, or None if none is."""
    demo = {model: kind for model, kind in kinds.items() if is_demo(kind)}
    if not demo:
        return None
    described = "; ".join(f"{model} is a {LABELS[kind]}" for model, kind in demo.items())
    return f"DEMO: these numbers come from tiny models built by the workflow: {described}."


def demo_suffix(kinds: Iterable[str | None]) -> str:
    """Suffix of a table title that mixes models: which tiny kinds it holds."""
    present = [k for k in (TINY_ORGANISM, TINY_RANDOM) if k in set(kinds)]
    if not present:
        return ""
    names = {TINY_ORGANISM: "trained model organism", TINY_RANDOM: "random tiny models"}
    return " [demo: " + " and ".join(names[k] for k in present) + "]"
