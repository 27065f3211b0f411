"""What ``family: auto`` does with each architecture of the installed transformers'
image-text-to-text mapping (``ladbench models``):

* ``tested``: a tiny offline build of it (``models/tiny_archs.py``, or a hand-written
  family's in ``models/tiny.py``) passes the checks every family passes (``tests/test_auto.py``);
* ``refused``: auto's loader refuses it, with the loader's one-line reason
  (:func:`ladbench.models.auto.architecture_refusal`);
* ``untested``: neither, with why there is no tiny build where that is known.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from .auto import architecture_refusal
from .tiny_archs import BUILDS, FAMILY_BUILDS_AUTO_RUNS, NOT_BUILT

STATUSES = ("tested", "refused", "untested")
#: a vision tower (the model's ``get_image_features``) that reads back from the device more
#: often than this per row is the next candidate for a batched tower like Qwen2.5-VL's
#: (models/vision.py)
VISION_SYNCS_PER_ROW_LIMIT = 20


@dataclass(frozen=True)
class ArchitectureStatus:
    model_type: str
    status: str
    reason: str


def architecture_statuses() -> list[ArchitectureStatus]:
    """Every architecture of the installed transformers' image-text-to-text mapping, by name."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    rows = []
    for model_type in sorted(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES):
        refusal = architecture_refusal(model_type)
        if model_type in BUILDS:
            rows.append(ArchitectureStatus(model_type, "tested", BUILDS[model_type].layout))
        elif model_type in FAMILY_BUILDS_AUTO_RUNS:
            rows.append(ArchitectureStatus(model_type, "tested", f"the {model_type} family's tiny build; auto writes "
                                                                 "its adapter's cache"))
        elif refusal:
            rows.append(ArchitectureStatus(model_type, "refused", refusal))
        else:
            rows.append(ArchitectureStatus(model_type, "untested", NOT_BUILT.get(model_type, "no tiny build yet")))
    return rows


def as_json(rows: list[ArchitectureStatus]) -> str:
    return json.dumps([asdict(row) for row in rows], indent=1)


def as_text(rows: list[ArchitectureStatus]) -> str:
    width = max(len(row.model_type) for row in rows)
    counts = ", ".join(f"{sum(r.status == s for r in rows)} {s}" for s in STATUSES)
    lines = [f"{row.model_type:{width}}  {row.status:8}  {row.reason}" for row in rows]
    return "\n".join(lines + [f"{len(rows)} architectures: {counts}"])


def as_markdown(rows: list[ArchitectureStatus], proxies: list[dict[str, Any]] | None = None) -> str:
    """The README's model table; ``proxies``: ``benchmarks/bench_inference.py --proxies``'s
    family-auto rows (host syncs and aten ops per row of the device step, per architecture)."""
    measured = {p["architecture"]: p for p in proxies or [] if p.get("architecture")}
    lines = ["| architecture | status | layout, or why not | host syncs / row (in the vision tower) | aten ops / row |",
             "|---|---|---|---|---|"]
    for row in rows:
        p = measured.get(row.model_type)
        syncs = ops = "-"
        reason = row.reason
        if p:
            syncs = f"{p['syncs_per_row']:.1f} ({p['vision_syncs_per_row']:.1f})"
            ops = f"{p['aten_ops_per_row']:,.0f}"
            if p["vision_syncs_per_row"] > VISION_SYNCS_PER_ROW_LIMIT:
                reason += "; **its vision tower reads back from the device: next candidate for a batched tower**"
        lines.append(f"| {row.model_type} | {row.status} | {reason} | {syncs} | {ops} |")
    return "\n".join(lines)
