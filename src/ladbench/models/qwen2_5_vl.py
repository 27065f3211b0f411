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

import functools
import inspect
from typing import Any

import torch

from . import compat
from .base import ModelAdapter, PrefillState
from . import rotary as rotary_rewrite


class Qwen25VLAdapter(ModelAdapter):
    image_start_token = "<|vision_start|>"
    image_end_token = "<|vision_end|>"
    model_class = "Qwen2_5_VLForConditionalGeneration"  # native in transformers 4.53
    image_token = "<|image_pad|>"

    def use_batched_vision(self) -> tuple[str, ...]:
        from .vision import use_batched_vision
        use_batched_vision(self.model.model.visual, compiled=self.vision == "compiled")
        return ("image_grid_thw",)          # the tower and the feature split read it on the host: no sync

    def exact_rewrites(self) -> int:
        # 4.53: M-RoPE laid out once and rotated by roll; 5.x lays it out once itself and rotates
        # the laid-out tables as 1-D RoPE does, which the roll then serves alike
        text_model = self.model.model.language_model
        return merge_mrope_sections_once(text_model) or rotary_rewrite.roll_one_dim_rope(text_model)

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


def merge_mrope_sections_once(text_model: torch.nn.Module) -> int:
    """Make ``text_model`` (the decoder) lay out M-RoPE's cos and sin once per forward instead of
    once per layer, and rotate by ``torch.roll`` (``models/rotary.py``); returns 1 where it changed,
    0 where transformers already lays them out once (5.x) or rotates otherwise.

    transformers 4.53's rotary embedding returns one cos and one sin per position axis (temporal,
    height, width: [3, B, T, d]), and every attention layer's ``apply_multimodal_rotary_pos_emb``
    picks the axis of each section of the d channels and concatenates them ([B, T, d]) before
    rotating its queries and keys: in Qwen2.5-VL-3B, 36 times the same two concatenations, 16
    operations a layer (a split, 6 selects and a concatenation, for cos and for sin), each a kernel
    launch or a dispatch the host pays on a GPU. Here the embedding's forward lays them out once,
    by the very expression of transformers, and signs the sine (:func:`~.rotary.signed_sin`); the
    layers' function (the modeling module's, wrapped once per process) takes the tables laid out
    ([B, T, d]: a 3-D cos) and rotates by :func:`~.rotary.rotate`: the same values, the same
    products, and a negation fewer for q and for k in every layer besides."""
    # (5.x has no such function, and its config may hold no such section: read only to lay them out)
    section = list((getattr(text_model.config, "rope_scaling", None) or {}).get("mrope_section") or [])
    probe = [1, 1, 2]                   # (the probe's 8 channels: sections of 1, 1 and 2, twice)

    def fits(apply) -> bool:
        return ("mrope_section" in inspect.signature(apply).parameters
                and rotary_rewrite.rotates_as_roll(apply, probe, axes=3, layout=lambda t: mrope_layout(t, probe)))
    return rotary_rewrite.rewrite_rotation(text_model, "apply_multimodal_rotary_pos_emb", fits=fits,
                                           wrap=rotating_laid_out, lay_out=lambda table: mrope_layout(table, section))


def mrope_layout(table: torch.Tensor, section: list[int]) -> torch.Tensor:
    """transformers 4.53's layout of an M-RoPE cos or sin [3, B, T, d]: each section of the channels
    (``section`` twice over, the rotated halves) from its own position axis, in turn: [B, T, d]."""
    return torch.cat([m[i % 3] for i, m in enumerate(table.split(section * 2, dim=-1))], dim=-1)


def rotating_laid_out(apply):
    """``apply`` (4.53's ``apply_multimodal_rotary_pos_emb``), which also takes cos laid out already
    (3-D, :func:`mrope_layout`) with the signed sine and then rotates by :func:`~.rotary.rotate`."""
    @functools.wraps(apply)
    def rotated(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
        if cos.dim() != 3:
            return apply(q, k, cos, sin, mrope_section, unsqueeze_dim)
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return rotary_rewrite.rotate(q, cos, sin), rotary_rewrite.rotate(k, cos, sin)
    return rotated
