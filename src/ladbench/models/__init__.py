"""Model adapters, one per family, and the family-name registry.

``ADAPTERS[family]`` is the adapter class; :func:`load_adapter` loads a model through it.
"""
from __future__ import annotations

from typing import Any

from .base import ModelAdapter, PrefillState
from .internvl import InternVLAdapter
from .llava_onevision import LlavaOnevisionAdapter
from .llava_ov15 import LlavaOV15Adapter
from .qwen2_5_vl import Qwen25VLAdapter
from .qwen3_vl import Qwen3VLAdapter

ADAPTERS: dict[str, type[ModelAdapter]] = {
    Qwen25VLAdapter.family: Qwen25VLAdapter,
    InternVLAdapter.family: InternVLAdapter,
    LlavaOV15Adapter.family: LlavaOV15Adapter,
    Qwen3VLAdapter.family: Qwen3VLAdapter,
    LlavaOnevisionAdapter.family: LlavaOnevisionAdapter,
}


def adapter_class(family: str) -> type[ModelAdapter]:
    """The adapter class registered for ``family`` (clear error for unknown names)."""
    try:
        return ADAPTERS[family]
    except KeyError:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(sorted(ADAPTERS))}") from None


def lane_families() -> tuple[str, ...]:
    """The families that run on the installed transformers lane (models/compat.py)."""
    from .compat import LANE
    return tuple(f for f, cls in ADAPTERS.items() if LANE in cls.lanes)


def load_adapter(family: str, model_path: str, **kwargs: Any) -> ModelAdapter:
    """Load ``model_path`` (hub id or local folder) with the adapter of ``family``; see ``ModelAdapter.load``."""
    return adapter_class(family).load(model_path, **kwargs)


__all__ = ["ADAPTERS", "ModelAdapter", "PrefillState", "adapter_class", "lane_families", "load_adapter",
           "Qwen25VLAdapter", "InternVLAdapter", "LlavaOV15Adapter",
           "Qwen3VLAdapter", "LlavaOnevisionAdapter"]
