"""InternVL3-HF adapter (native ``InternVLForConditionalGeneration``, e.g. ``OpenGVLab/InternVL3-8B-hf``).

Layout: the processor expands each image to ``<img> <IMG_CONTEXT>*k </img>`` (k tokens per
tile, one or more tiles per image); text decoder (Qwen2, 1-D RoPE) layers at
``model.model.language_model.layers``.
"""
from __future__ import annotations

from typing import Any

import torch

from .base import ModelAdapter, OneDimRopeMixin


class InternVLAdapter(OneDimRopeMixin, ModelAdapter):
    family = "internvl"
    image_start_token = "<img>"
    image_end_token = "</img>"
    image_token = "<IMG_CONTEXT>"

    @classmethod
    def _load_model(cls, model_path: str, *, text_impl: str, trust_remote_code: bool, **kw: Any) -> torch.nn.Module:
        from transformers import InternVLForConditionalGeneration
        return InternVLForConditionalGeneration.from_pretrained(
            model_path, attn_implementation=cls.attn_implementation(text_impl), **kw)
