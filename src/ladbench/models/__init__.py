"""Model adapters, one per family, and the family-name registry.

``ADAPTERS[family]`` is the adapter class of each family of ``ladbench.families.FAMILY_REGISTRY``
(which states where it lives); :func:`load_adapter` loads a model through it.
"""
from __future__ import annotations

import importlib
from typing import Any

from ladbench.families import FAMILY_REGISTRY, family_entry

from .base import ModelAdapter, PrefillState


def _adapter(name: str) -> type[ModelAdapter]:
    module, _, cls_name = FAMILY_REGISTRY[name].adapter.partition(":")
    cls = getattr(importlib.import_module(f"{__name__}.{module}"), cls_name)
    cls.family = name                  # the registry's key is the family's one name
    return cls


ADAPTERS: dict[str, type[ModelAdapter]] = {name: _adapter(name) for name in FAMILY_REGISTRY}


def adapter_class(family: str) -> type[ModelAdapter]:
    """The adapter class registered for ``family`` (clear error for unknown names)."""
    family_entry(family)
    return ADAPTERS[family]


def lane_families() -> tuple[str, ...]:
    """The families that run on the installed transformers lane (models/compat.py)."""
    from .compat import LANE
    return tuple(f for f, entry in FAMILY_REGISTRY.items() if LANE in entry.lanes)


def load_adapter(family: str, model_path: str, **kwargs: Any) -> ModelAdapter:
    """Load ``model_path`` (hub id or local folder) with the adapter of ``family``; see ``ModelAdapter.load``."""
    return adapter_class(family).load(model_path, **kwargs)


__all__ = ["ADAPTERS", "ModelAdapter", "PrefillState", "adapter_class", "lane_families", "load_adapter"]
