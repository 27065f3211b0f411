"""InternVL3-HF adapter (native ``InternVLForConditionalGeneration``, e.g. ``OpenGVLab/InternVL3-8B-hf``).

Layout: the processor expands each image to ``<img> <IMG_CONTEXT>*k </img>`` (k tokens per
tile, one or more tiles per image); text decoder (Qwen2, 1-D RoPE) layers at
``model.model.language_model.layers``.
"""
from __future__ import annotations

from .base import ModelAdapter, OneDimRopeMixin


class InternVLAdapter(OneDimRopeMixin, ModelAdapter):
    image_start_token = "<img>"
    image_end_token = "</img>"
    model_class = "InternVLForConditionalGeneration"  # native in transformers 4.53
    image_token = "<IMG_CONTEXT>"
