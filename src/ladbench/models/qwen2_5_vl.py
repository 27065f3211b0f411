"""Qwen2.5-VL adapter (native ``Qwen2_5_VLForConditionalGeneration``).

Layout: ``<|vision_start|> <|image_pad|>*k <|vision_end|>`` per image; text decoder layers at
``model.model.language_model.layers``; 3-axis M-RoPE whose per-row offset (``rope_deltas``)
is computed during the prefill and must be added to positions of continuation tokens.
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

    def _position_offset(self, inputs: dict[str, torch.Tensor], out: Any) -> torch.Tensor:
        # Taken from this prefill's output, not from model.model.rope_deltas, which any
        # later prefill (another batch) overwrites.
        return out.rope_deltas

    def continuation_position_ids(self, state: PrefillState, n_new: int) -> torch.Tensor:
        steps = torch.arange(state.seq_len, state.seq_len + n_new, device=state.position_offset.device)
        pos = steps.view(1, -1) + state.position_offset                      # [B, n_new]
        return pos.unsqueeze(0).expand(3, -1, -1)                             # same on the t/h/w axes for text
