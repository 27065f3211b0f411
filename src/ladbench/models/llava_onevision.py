"""LLaVA-OneVision adapter (native ``LlavaOnevisionForConditionalGeneration``, both lanes;
e.g. ``llava-hf/llava-onevision-qwen2-7b-ov-hf``).

Layout: the chat template writes one ``<image>`` per image (before the text); the processor
expands each into the image's feature tokens. Several images in one prompt are encoded as
LLaVA-OneVision's multi-image mode: each image padded to a square and resized to the vision
tower's input, no anyres tiling, ``num_image_tokens`` features plus one ``image_newline``
(minus one with the ``default`` feature strategy). The processor does this only when it gets
each prompt's images as one list (``nested_images``). There are no start / end markers
around an image, so an image's span (METHOD §3) is its own run of feature tokens; adjacent
images are told apart by that fixed length. Text decoder: Qwen2, 1-D RoPE, at
``model.model.language_model.layers``.
"""
from __future__ import annotations

from .base import ModelAdapter, OneDimRopeMixin


class LlavaOnevisionAdapter(OneDimRopeMixin, ModelAdapter):
    model_class = "LlavaOnevisionForConditionalGeneration"  # native in transformers 4.53 and 5.x
    image_token = "<image>"
    # no markers: a span is the image's run of <image> tokens (image_spans below)
    image_start_token = image_end_token = "<image>"
    nested_images = True

    @property
    def tokens_per_image(self) -> int:
        """Tokens of one image in a multi-image prompt (what the processor expands ``<image>`` to)."""
        proc = self.processor
        return proc.num_image_tokens + 1 - (proc.vision_feature_select_strategy == "default")

    def image_spans(self, input_ids) -> list[tuple[int, int]]:
        """Each image's run of ``<image>`` tokens ``[start, end)``. A run holding several
        images (adjacent in the template) is cut into ``tokens_per_image`` pieces; a run of
        another length is one image (a single image is tiled: anyres)."""
        per_image, spans, start = self.tokens_per_image, [], None
        for pos, tid in enumerate(list(input_ids) + [None]):
            if tid == self.image_token_id and start is None:
                start = pos
            elif tid != self.image_token_id and start is not None:
                length = pos - start
                if length % per_image == 0:
                    spans += [(s, s + per_image) for s in range(start, pos, per_image)]
                else:
                    spans.append((start, pos))
                start = None
        return spans
