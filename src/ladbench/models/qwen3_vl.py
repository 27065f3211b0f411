"""Qwen3-VL adapter (native ``Qwen3VLForConditionalGeneration``, transformers 5.x: current lane only).

Same image layout, processor outputs and M-RoPE bookkeeping as Qwen2.5-VL
(``<|vision_start|> <|image_pad|>*k <|vision_end|>``, host-computed ``get_rope_index``,
``rope_deltas`` continued after the prefill), so it is the Qwen2.5-VL adapter with another
class. Differences that stay inside transformers: 16-px patches, interleaved M-RoPE, a Qwen3
text decoder (q/k norms) and DeepStack visual features added to the first decoder layers'
hidden states. The vision tower is transformers' own (``models/vision.py`` is Qwen2.5-VL's).
"""
from __future__ import annotations

from .qwen2_5_vl import Qwen25VLAdapter


class Qwen3VLAdapter(Qwen25VLAdapter):
    model_class = "Qwen3VLForConditionalGeneration"  # native in transformers 5.x

    def use_batched_vision(self) -> tuple[str, ...]:
        return ()
