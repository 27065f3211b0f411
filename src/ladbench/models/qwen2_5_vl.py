"""Qwen2.5-VL adapter (native ``Qwen2_5_VLForConditionalGeneration``).

Layout: ``<|vision_start|> <|image_pad|>*k <|vision_end|>`` per image; text decoder layers at
``model.model.language_model.layers``; 3-axis M-RoPE whose per-row offset (``rope_deltas``)
is computed during the prefill and must be added to positions of continuation tokens.

The vision tower is run one image at a time (except on the eager reference path): see
``encode_images_one_by_one``.
"""
from __future__ import annotations

from typing import Any

import torch

from .base import ModelAdapter, PrefillState


class Qwen25VLAdapter(ModelAdapter):
    family = "qwen2_5_vl"
    image_start_token = "<|vision_start|>"
    image_end_token = "<|vision_end|>"
    model_class = "Qwen2_5_VLForConditionalGeneration"  # native in transformers 4.53
    image_token = "<|image_pad|>"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.attention != "eager":      # the eager path stays the reference's, for comparisons
            encode_images_one_by_one(self.model.model)

    def _position_offset(self, inputs: dict[str, torch.Tensor], out: Any) -> torch.Tensor:
        # Taken from this prefill's output, not from model.model.rope_deltas, which any
        # later prefill (another batch) overwrites.
        return out.rope_deltas

    def continuation_position_ids(self, state: PrefillState, n_new: int) -> torch.Tensor:
        steps = torch.arange(state.seq_len, state.seq_len + n_new, device=state.position_offset.device)
        pos = steps.view(1, -1) + state.position_offset                      # [B, n_new]
        return pos.unsqueeze(0).expand(3, -1, -1)                             # same on the t/h/w axes for text


def encode_images_one_by_one(base_model: torch.nn.Module) -> None:
    """Make ``base_model.get_image_features`` run the vision tower once per image.

    Why: without flash-attention's variable-length kernel, the vision tower builds one
    dense [P, P] mask over all P patches of all the row's images and attends over all of
    them, so its time and memory grow with N^2 (12 COCO-sized images: a 0.7 GB mask per
    vision layer in bf16). Every patch attends only within its own image (its windows,
    or the whole image in the full-attention blocks), so encoding the images separately
    gives the same features at a cost linear in N (tested against the joint encoding).
    """
    visual = base_model.visual

    def get_image_features(pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pixel_values = pixel_values.type(visual.dtype)
        patches_per_image = image_grid_thw.prod(-1).tolist()
        return tuple(visual(patches, grid_thw=image_grid_thw[i:i + 1])
                     for i, patches in enumerate(torch.split(pixel_values, patches_per_image)))

    base_model.get_image_features = get_image_features
