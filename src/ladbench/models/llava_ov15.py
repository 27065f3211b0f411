"""LLaVA-OneVision-1.5 adapter (hub code, ``lmms-lab/LLaVA-OneVision-1.5-8B-Instruct``).

The model class ships inside the checkpoint, so loading runs code from the model folder:
this adapter does so ONLY when the caller passes ``trust_remote_code=True`` (the study's
config marks the model as trusted) and never asks on stdin. Layout: Qwen2-VL style image
tokens ``<|vision_start|> <|image_pad|>*k <|vision_end|>``; a Qwen3 text model (q/k norms,
1-D RoPE) at ``model.model.language_model.layers``.
"""
from __future__ import annotations

from typing import Any

import torch

from .base import ModelAdapter, OneDimRopeMixin


class LlavaOV15Adapter(OneDimRopeMixin, ModelAdapter):
    image_start_token = "<|vision_start|>"
    image_end_token = "<|vision_end|>"
    image_token = "<|image_pad|>"
    # the shared Qwen2.5-VL processor emits it; the OV-1.5 model does not take it
    drop_input_keys = ("mm_token_type_ids",)
    # the hub code's decoder layers look their attention class up in their own table (eager, sdpa,
    # flash_attention_2; a KeyError for the capture's name), and its eager class does not run
    own_attention_table = True

    def use_batched_vision(self) -> tuple[str, ...]:
        """The tiny stand-in's tower is transformers' Qwen2.5-VL tower: batched like Qwen2.5-VL's. The real
        model's RICE-ViT (hub code) is left as shipped."""
        from .vision import is_qwen2_5_vision_tower, use_batched_vision
        visual = self.model.model.visual
        if not is_qwen2_5_vision_tower(visual):
            return ()
        use_batched_vision(visual)
        return ("image_grid_thw",)

    @classmethod
    def _load_processor(cls, model_path: str, *, revision: str | None, trust_remote_code: bool) -> Any:
        cls._require_trust(model_path, trust_remote_code)
        return super()._load_processor(model_path, revision=revision, trust_remote_code=trust_remote_code)

    @classmethod
    def _load_model(cls, model_path: str, *, text_impl: str, trust_remote_code: bool, **kw: Any) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM
        cls._require_trust(model_path, trust_remote_code)
        return AutoModelForCausalLM.from_pretrained(
            model_path, trust_remote_code=True, attn_implementation=cls.attn_implementation(text_impl), **kw)

    @staticmethod
    def _require_trust(model_path: str, trust_remote_code: bool) -> None:
        if not trust_remote_code:
            raise PermissionError(
                f"{model_path}: LLaVA-OneVision-1.5 runs model code shipped with the checkpoint; mark the model "
                "as trusted in the config (trust_remote_code: true / --trust-remote-code) to load it")
