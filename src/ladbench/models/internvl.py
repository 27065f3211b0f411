"""InternVL3-HF adapter (native ``InternVLForConditionalGeneration``, e.g. ``OpenGVLab/InternVL3-8B-hf``).

Layout: the processor expands each image to ``<img> <IMG_CONTEXT>*k </img>`` (k tokens per
tile, one or more tiles per image); text decoder (Qwen2, 1-D RoPE) layers at
``model.model.language_model.layers``.

Each tile gives the same number of image features (the tower's patches, fewer by the pixel
shuffle), so the host knows where they go and checks their count there
(``ModelAdapter.placed_image_features``); transformers' forward would check it by a read-back
that waits for the whole tower.
"""
from __future__ import annotations

from typing import Any

import torch

from . import compat
from .base import ModelAdapter, OneDimRopeMixin


class InternVLAdapter(OneDimRopeMixin, ModelAdapter):
    image_start_token = "<img>"
    image_end_token = "</img>"
    model_class = "InternVLForConditionalGeneration"  # native in transformers 4.53
    image_token = "<IMG_CONTEXT>"

    def image_feature_count(self, inputs: dict[str, torch.Tensor]) -> int | None:
        """Tiles x features per tile (the eager reference path keeps transformers' forward)."""
        if self.attention == "eager":
            return None
        config = self.model.config
        side = _first(config.vision_config.image_size) // _first(config.vision_config.patch_size)
        per_tile = int(side * config.downsample_ratio) ** 2            # the pixel shuffle's output
        return int(inputs["pixel_values"].shape[0]) * per_tile

    def image_features(self, kwargs: dict[str, Any]) -> torch.Tensor:
        out = self.model.model.get_image_features(pixel_values=kwargs.pop("pixel_values"))
        features = compat.image_features_tensor(out)
        return features.reshape(-1, features.shape[-1])


def _first(size: int | list[int]) -> int:
    """A square size as a config states it: a number, or [height, width] (the -hf checkpoints)."""
    return size[0] if isinstance(size, (list, tuple)) else size
