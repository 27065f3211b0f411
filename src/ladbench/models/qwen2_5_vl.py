"""Qwen2.5-VL adapter (native ``Qwen2_5_VLForConditionalGeneration``).

Layout: ``<|vision_start|> <|image_pad|>*k <|vision_end|>`` per image; text decoder layers at
``model.model.language_model.layers``; 3-axis M-RoPE whose per-row offset (``rope_deltas``)
is computed during the prefill and must be added to positions of continuation tokens.

The vision tower runs batched (``models/vision.py``: all images of a batch together, window
plans cached per grid, one attention call per layer) unless ``vision="native"``; the M-RoPE
position ids are computed on the host with the model's own ``get_rope_index`` (in the
DataLoader workers), and so are the places of the image features among the prompt's
embeddings (with transformers' check that the image tokens and the features agree, there
free: on the device it is a read of a count the whole tower must first finish), so the
forward pass reads nothing back from the device.
"""
from __future__ import annotations

from typing import Any

import torch

from . import compat
from .base import ModelAdapter, PrefillState


class Qwen25VLAdapter(ModelAdapter):
    image_start_token = "<|vision_start|>"
    image_end_token = "<|vision_end|>"
    model_class = "Qwen2_5_VLForConditionalGeneration"  # native in transformers 4.53
    image_token = "<|image_pad|>"

    def use_batched_vision(self) -> tuple[str, ...]:
        from .vision import use_batched_vision
        use_batched_vision(self.model.model.visual, compiled=self.vision == "compiled")
        return ("image_grid_thw",)          # the tower and the feature split read it on the host: no sync

    def prefill_extras(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        position_ids, rope_deltas = compat.qwen_vl_rope_index(self.model.model, inputs)
        return {"position_ids": position_ids, "rope_deltas": rope_deltas}

    def image_feature_count(self, inputs: dict[str, torch.Tensor]) -> int | None:
        """With the batched tower: one feature per merge unit of each image's grid."""
        if self.vision == "native":
            return None
        return int((inputs["image_grid_thw"].prod(-1) // self.model.model.visual.spatial_merge_size ** 2).sum())

    def image_features(self, kwargs: dict[str, Any]) -> torch.Tensor:
        visual = self.model.model.visual
        return visual(kwargs.pop("pixel_values").type(visual.dtype), grid_thw=kwargs.pop("image_grid_thw"))

    def _position_offset(self, inputs: dict[str, torch.Tensor], out: Any) -> torch.Tensor:
        # From this prefill's inputs (host-computed) or output, not from model.model.rope_deltas,
        # which any later prefill (another batch) overwrites.
        if "rope_deltas" in inputs:
            deltas = inputs["rope_deltas"]
        else:   # 5.x's output no longer carries them; this forward has just set the model's attribute
            deltas = out.rope_deltas if getattr(out, "rope_deltas", None) is not None else self.model.model.rope_deltas
        return compat.qwen_vl_padded_rope_deltas(deltas, inputs["attention_mask"])

    def continuation_position_ids(self, state: PrefillState, n_new: int) -> torch.Tensor:
        steps = torch.arange(state.seq_len, state.seq_len + n_new, device=state.position_offset.device)
        pos = steps.view(1, -1) + state.position_offset                      # [B, n_new]
        return pos.unsqueeze(0).expand(3, -1, -1)                             # same on the t/h/w axes for text

