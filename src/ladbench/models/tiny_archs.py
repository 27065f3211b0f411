"""Tiny offline builds of image-text-to-text architectures that run through ``family: auto``.

Test fixtures, like :mod:`ladbench.models.tiny`'s family builds: transformers' own config,
model and processor classes at tiny sizes (the ``tiny`` preset), the project's offline BPE
tokenizer with the architecture's special tokens, and a chat template that lays out images
as the released checkpoint's template does (written here: no template can be downloaded;
each builder names the checkpoint whose layout it follows). Each architecture states its
sizes and tokens here and nowhere else; the auto adapter (``models/auto.py``) knows none of
them. ``ladbench models`` reports an architecture built here as ``tested``: the current-lane
tests (``tests/test_auto.py``) run every build through the checks every family passes.

The weights are random: these models test code paths and equivalences, not answers.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ladbench.families import family_lanes
from ladbench.provenance import TINY_RANDOM

from . import compat
from .tiny import (INTERNVL_CHAT_TEMPLATE, INTERNVL_SPECIAL_TOKENS, PRESETS, QWEN2_5_VL_CHAT_TEMPLATE,
                   QWEN3_VL_CHAT_TEMPLATE, QWEN_SPECIAL_TOKENS, VOCAB_SIZE, internvl_tokenizer)
from .tiny import _ids, _qwen_vision_config, _text_config, build_tokenizer, save_model_folder


@dataclass(frozen=True)
class TinyArch:
    """One architecture's tiny build: ``build(preset) -> (model, processor)``, which image
    layout / decoder feature it covers (README's model table), and the first and last token
    of each image's span in its layout (what the span test expects, stated from the released
    model's layout, independently of how ``family: auto`` finds spans)."""

    build: Callable[[dict[str, Any]], tuple[Any, Any]]
    layout: str
    span_ends: tuple[str, str]
    #: for an architecture whose released checkpoints have no chat template (the build's
    #: processor then has none either): the template a study's config gives it
    #: (``models.<name>.chat_template``), saved beside the weights as :data:`GIVEN_CHAT_TEMPLATE`
    given_chat_template: str | None = None


#: the file of a tiny build's folder holding the chat template a study's config would give it
#: (a name transformers does not read: the folder itself has no template, as released)
GIVEN_CHAT_TEMPLATE = "given_chat_template.jinja"


def _vision(p: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A small ViT-style vision config (SigLIP / CLIP keys)."""
    return dict(hidden_size=p["vision_hidden"], intermediate_size=2 * p["vision_hidden"],
                num_hidden_layers=p["vision_depth"], num_attention_heads=2, **extra)


def _tokenizer(special: tuple[str, ...] = (), bos: str | None = None, **multimodal: str):
    """The offline tiny tokenizer with ``special`` tokens, a BOS token (emitted by the template,
    as in the released checkpoints) and the multimodal token names the processor reads."""
    tok = build_tokenizer(special, **({"extra_special_tokens": multimodal} if multimodal else {}))
    if bos:
        tok.bos_token = bos
    return tok


#: the sliding window of the tiny builds' sliding-window layers: shorter than the prompts, so
#: that the last token sees only part of the images there
SLIDING_WINDOW = 64
_NORM = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])


def _sliding_window_text(p, ids, **extra):
    """A text config of two sliding-window layers (window :data:`SLIDING_WINDOW`) and a full one."""
    return _text_config(p, ids, head_dim=p["hidden"] // p["heads"], sliding_window=SLIDING_WINDOW,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"][:p["layers"]], **extra)


def _siglip(p, side: int, patch: int):
    """A SigLIP vision config without its pooling head."""
    return dict(model_type="siglip_vision_model", image_size=side, patch_size=patch, vision_use_head=False, **_vision(p))

# llava-hf/llava-1.5-7b-hf: "USER: <image>\n... ASSISTANT:", images first, no end-of-turn token
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' ' }}{% endfor %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")


#: LLaVA's CLIP tower at tiny size: 28-px images of 14-px patches (4 features, CLS dropped)
_CLIP_SIDE, _CLIP_PATCH = 28, 14
#: what a LLaVA-style processor is told about that tower
_LLAVA_PROCESSOR = dict(patch_size=_CLIP_PATCH, vision_feature_select_strategy="default", num_additional_image_tokens=1)
_CLIP_SIZES = dict(size={"shortest_edge": _CLIP_SIDE}, crop_size={"height": _CLIP_SIDE, "width": _CLIP_SIDE})
#: LLaVA-NeXT's anyres grid: 1 x 1 to 2 x 2 tiles
_ANYRES_GRID = [[_CLIP_SIDE * a, _CLIP_SIDE * b] for a in (1, 2) for b in (1, 2)]


def _clip_vision(p):
    return dict(model_type="clip_vision_model", image_size=_CLIP_SIDE, patch_size=_CLIP_PATCH, projection_dim=32,
                **_vision(p))


def _anyres_image_processor():
    from transformers import LlavaNextImageProcessor
    return LlavaNextImageProcessor(image_grid_pinpoints=_ANYRES_GRID, **_CLIP_SIZES, **_NORM)


def _llava_processor(chat_template: str):
    """LLaVA-1.5's processor (a CLIP image processor, one run of ``<image>`` per image) and the
    token ids of its tokenizer."""
    from transformers import CLIPImageProcessor, LlavaProcessor
    tok = _tokenizer(("<image>",), image_token="<image>")
    proc = LlavaProcessor(image_processor=CLIPImageProcessor(**_CLIP_SIZES, **_NORM), tokenizer=tok,
                          chat_template=chat_template, **_LLAVA_PROCESSOR)
    return proc, _ids(tok, QWEN_SPECIAL_TOKENS + ("<image>",))


def _build_llava(p):
    """LLaVA-1.5: a CLIP tower, one run of ``<image>`` tokens per image (no markers)."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration
    proc, ids = _llava_processor(LLAVA_CHAT_TEMPLATE)
    cfg = LlavaConfig(text_config=dict(model_type="qwen2", **_text_config(p, ids)), vision_config=_clip_vision(p),
                      image_token_index=ids["<image>"], vision_feature_select_strategy="default",
                      vision_feature_layer=-1, tie_word_embeddings=False)
    return LlavaForConditionalGeneration(cfg), proc


# llava-hf/llava-v1.6-mistral-7b-hf: "[INST] <image>\n... [/INST]"
LLAVA_NEXT_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{{ ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' ' + message['content'][0]['text'] + '<|im_end|>' }}{% endif %}{% endfor %}")


def _build_llava_next(p):
    """LLaVA-NeXT: anyres tiles, each image's features with one image_newline feature per row,
    all in one run of ``<image>`` tokens (its length depends on the image's aspect ratio)."""
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration, LlavaNextProcessor
    tok = _tokenizer(("<image>",), image_token="<image>")
    proc = LlavaNextProcessor(image_processor=_anyres_image_processor(), tokenizer=tok,
                              chat_template=LLAVA_NEXT_CHAT_TEMPLATE, **_LLAVA_PROCESSOR)
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + ("<image>",))
    cfg = LlavaNextConfig(text_config=dict(model_type="mistral", **_text_config(p, ids, sliding_window=None)),
                          vision_config=_clip_vision(p), image_token_index=ids["<image>"],
                          image_grid_pinpoints=_ANYRES_GRID, vision_feature_select_strategy="default",
                          vision_feature_layer=-1, tie_word_embeddings=False)
    return LlavaNextForConditionalGeneration(cfg), proc


# mistralai/Mistral-Small-3.1-24B-Instruct-2503: "<s>[INST]" images as "[IMG]", then "[/INST]"
MISTRAL3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}[INST]"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}[IMG]"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}[/INST]"
    "{% elif message['role'] == 'assistant' %}{{ message['content'][0]['text'] }}{{ eos_token }}{% endif %}{% endfor %}")


def _build_mistral3(p):
    """Mistral 3 (Pixtral tower): each image as rows of ``[IMG]`` tokens, ``[IMG_BREAK]`` after
    each row and ``[IMG_END]`` after the last; no start marker."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, PixtralImageProcessor, PixtralProcessor
    special = ("[IMG]", "[IMG_BREAK]", "[IMG_END]", "[INST]", "[/INST]", "<s>")
    tok = _tokenizer(special, bos="<s>", image_token="[IMG]")
    patch, merge = 14, 2
    proc = PixtralProcessor(image_processor=PixtralImageProcessor(size={"longest_edge": 112}, patch_size=patch, **_NORM),
                            tokenizer=tok, patch_size=patch, spatial_merge_size=merge,
                            chat_template=MISTRAL3_CHAT_TEMPLATE)
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + special)
    head_dim = p["hidden"] // p["heads"]
    cfg = Mistral3Config(text_config=dict(model_type="mistral", **_text_config(p, ids, head_dim=head_dim, sliding_window=None)),
                         vision_config=dict(model_type="pixtral", head_dim=p["vision_hidden"] // 2, image_size=112,
                                            patch_size=patch, **_vision(p)),
                         image_token_index=ids["[IMG]"], spatial_merge_size=merge, tie_word_embeddings=False)
    return Mistral3ForConditionalGeneration(cfg), proc


# CohereForAI/aya-vision-8b: Cohere turn tokens; the processor expands "<image>" into
# "<|START_OF_IMG|>", per tile "TILE_k" (plain text) and its patches, then "<|END_OF_IMG|>"
AYA_VISION_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|START_OF_TURN_TOKEN|>"
    "{% if message['role'] == 'user' %}<|USER_TOKEN|>{% else %}<|CHATBOT_TOKEN|>{% endif %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}<image>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}<|END_OF_TURN_TOKEN|>{% endfor %}"
    "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}")


def _build_aya_vision(p):
    """Aya Vision: tiles (up to 2 + a global view) between start / end markers; a Cohere2
    decoder with sliding-window layers interleaved with full ones."""
    from transformers import AyaVisionConfig, AyaVisionForConditionalGeneration, AyaVisionProcessor, GotOcr2ImageProcessor
    special = ("<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>", "<BOS_TOKEN>",
               "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>")
    tok = _tokenizer(special, bos="<BOS_TOKEN>", image_token="<image>")
    side, patch, downsample = 56, 14, 2
    improc = GotOcr2ImageProcessor(size={"height": side, "width": side}, crop_to_patches=True, min_patches=1,
                                   max_patches=2, **_NORM)
    proc = AyaVisionProcessor(image_processor=improc, tokenizer=tok, patch_size=patch, img_size=side,
                              downsample_factor=downsample, chat_template=AYA_VISION_CHAT_TEMPLATE)
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + special)
    text = _sliding_window_text(p, ids)
    cfg = AyaVisionConfig(text_config=dict(model_type="cohere2", **text),
                          vision_config=_siglip(p, side, patch),
                          image_token_index=ids["<|IMG_PATCH|>"], downsample_factor=downsample,
                          vision_feature_select_strategy="full", tie_word_embeddings=False)
    return AyaVisionForConditionalGeneration(cfg), proc


# google/gemma-3-4b-it: "<start_of_image>" per image (the processor expands it to
# "\n\n<start_of_image><image_soft_token>*k<end_of_image>\n\n"), turns end with <end_of_turn>
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}<start_of_image>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def _build_gemma3(p):
    """Gemma 3: a fixed number of soft tokens per image between markers, image tokens attend
    to each other bidirectionally (``token_type_ids``); sliding-window layers interleaved with full ones."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor, Gemma3Processor
    special = ("<start_of_image>", "<end_of_image>", "<image_soft_token>", "<start_of_turn>", "<end_of_turn>", "<bos>")
    tok = _tokenizer(special, bos="<bos>", boi_token="<start_of_image>", eoi_token="<end_of_image>",
                     image_token="<image_soft_token>")
    side, patch, tokens = 56, 14, 4
    proc = Gemma3Processor(image_processor=Gemma3ImageProcessor(size={"height": side, "width": side}, **_NORM),
                           tokenizer=tok, image_seq_length=tokens, chat_template=GEMMA3_CHAT_TEMPLATE)
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + special)
    head_dim = p["hidden"] // p["heads"]
    text = _text_config(p, ids, head_dim=head_dim, sliding_window=SLIDING_WINDOW, query_pre_attn_scalar=head_dim,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"][:p["layers"]])
    cfg = Gemma3Config(text_config=text, vision_config=dict(image_size=side, patch_size=patch, vision_use_head=False,
                                                            **_vision(p)),
                       mm_tokens_per_image=tokens, boi_token_index=ids["<start_of_image>"],
                       eoi_token_index=ids["<end_of_image>"], image_token_index=ids["<image_soft_token>"],
                       eos_token_id=[ids["<end_of_turn>"], ids["<|im_end|>"]])
    model = Gemma3ForConditionalGeneration(cfg)
    with torch.no_grad():         # transformers initialises the projection to zeros: every image would look alike
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, p["init_std"])
    return model, proc


# HuggingFaceM4/Idefics3-8B-Llama3: "User:<image>...<end_of_utterance>\nAssistant:"
IDEFICS3_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")


def _idefics3_like(p, config_class, model_class, processor_class, image_processor_class, **processor_extra):
    """Idefics3's layout (tiles with row / column tokens and a global view, a Llama decoder)
    under ``config_class`` / ``model_class`` / ``processor_class`` (Idefics3's or SmolVLM's)."""
    rows = tuple(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))
    special = ("<image>", "<fake_token_around_image>", "<end_of_utterance>", "<global-img>") + rows
    tok = build_tokenizer(special)
    side, patch, scale = 56, 14, 2
    improc = image_processor_class(size={"longest_edge": 2 * side}, max_image_size={"longest_edge": side},
                                   do_image_splitting=True, **_NORM)
    proc = processor_class(image_processor=improc, tokenizer=tok, image_seq_len=(side // patch) ** 2 // scale ** 2,
                           chat_template=IDEFICS3_CHAT_TEMPLATE, **processor_extra)
    ids = _ids(proc.tokenizer, QWEN_SPECIAL_TOKENS + special)
    cfg = config_class(text_config=dict(model_type="llama", **_text_config(p, ids)),
                       vision_config=dict(image_size=side, patch_size=patch, **_vision(p)),
                       scale_factor=scale, image_token_id=ids["<image>"], tie_word_embeddings=False,
                       eos_token_id=ids["<end_of_utterance>"])
    return model_class(cfg), proc


def _build_idefics3(p):
    """Idefics3: each image split into tiles, each ``<fake_token_around_image><row_r_col_c>``
    + its tokens, then a global view ``<fake_token_around_image><global-img>`` + tokens, closed
    by ``<fake_token_around_image>``; a Llama decoder at ``model.text_model``."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessor, Idefics3Processor
    return _idefics3_like(p, Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor, Idefics3ImageProcessor)


# zai-org/GLM-4.1V-9B-Thinking: "[gMASK]<sop><|user|>\n" + "<|begin_of_image|><|image|><|end_of_image|>" per image
GLM4V_CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
GLM4V_SPECIAL_TOKENS = ("<|image|>", "<|video|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
                        "<|end_of_video|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|system|>")


def _glm4v_parts(p, rope_parameters):
    from transformers import Glm4vImageProcessor, Glm4vProcessor, Glm4vVideoProcessor
    tok = _tokenizer(GLM4V_SPECIAL_TOKENS, image_token="<|image|>", video_token="<|video|>")
    sizes = dict(size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112}, patch_size=14, temporal_patch_size=2,
                 merge_size=2)
    proc = Glm4vProcessor(image_processor=Glm4vImageProcessor(**sizes), video_processor=Glm4vVideoProcessor(**sizes),
                          tokenizer=tok, chat_template=GLM4V_CHAT_TEMPLATE)
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + GLM4V_SPECIAL_TOKENS)
    text = _text_config(p, ids)
    text.pop("rope_theta")
    text["eos_token_id"] = [ids["<|user|>"], ids["<|endoftext|>"]]        # GLM's turn ends at the next role tag
    text["rope_parameters"] = rope_parameters
    tokens = dict(image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
                  image_start_token_id=ids["<|begin_of_image|>"], image_end_token_id=ids["<|end_of_image|>"],
                  video_start_token_id=ids["<|begin_of_video|>"], video_end_token_id=ids["<|end_of_video|>"])
    vision = dict(depth=p["vision_depth"], hidden_size=p["vision_hidden"], intermediate_size=2 * p["vision_hidden"],
                  num_heads=2, out_hidden_size=p["hidden"], patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                  image_size=56)
    return text, vision, tokens, proc


def _build_glm4v(p):
    """GLM-4.1V: template markers around each image, 3-axis M-RoPE on half the head dimension."""
    from transformers import Glm4vConfig, Glm4vForConditionalGeneration
    text, vision, tokens, proc = _glm4v_parts(p, {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1],
                                                 "partial_rotary_factor": 0.5})
    return Glm4vForConditionalGeneration(Glm4vConfig(text_config=text, vision_config=vision, **tokens)), proc


def _build_glm4v_moe(p):
    """GLM-4.5V: GLM-4.1V's layout with a mixture-of-experts decoder (one dense layer first)."""
    from transformers import Glm4vMoeConfig, Glm4vMoeForConditionalGeneration
    text, vision, tokens, proc = _glm4v_parts(p, {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1],
                                                 "partial_rotary_factor": 0.5})
    text.update(n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
                first_k_dense_replace=1, n_group=1, topk_group=1, head_dim=p["hidden"] // p["heads"])
    return Glm4vMoeForConditionalGeneration(Glm4vMoeConfig(text_config=text, vision_config=vision, **tokens)), proc


def _qwen2_vl_processor(tok, p):
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor
    sizes = dict(min_pixels=56 * 56, max_pixels=p["max_pixels"])
    return Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**sizes), video_processor=Qwen2VLVideoProcessor(**sizes),
                            tokenizer=tok, chat_template=QWEN2_5_VL_CHAT_TEMPLATE)


def _qwen_tokens(ids):
    return dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])


def _build_qwen2_vl(p):
    """Qwen2-VL: template markers around each image, 3-axis M-RoPE."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    tok = build_tokenizer()
    ids = _ids(tok, QWEN_SPECIAL_TOKENS)
    text = _text_config(p, ids)
    text.pop("rope_theta")
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}
    cfg = Qwen2VLConfig(text_config=text, vision_config=dict(depth=p["vision_depth"], embed_dim=p["vision_hidden"],
                                                             hidden_size=p["hidden"], num_heads=2, mlp_ratio=2,
                                                             patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
                        **_qwen_tokens(ids))
    return Qwen2VLForConditionalGeneration(cfg), _qwen2_vl_processor(tok, p)


def _qwen3_vl_processor(tok, p):
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor
    norm = dict(patch_size=16, merge_size=2, **_NORM)
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(min_pixels=64 * 64, max_pixels=p["max_pixels"], **norm),
                            video_processor=Qwen3VLVideoProcessor(**norm), tokenizer=tok,
                            chat_template=QWEN3_VL_CHAT_TEMPLATE)


def _qwen3_vision(p):
    return dict(depth=p["vision_depth"], hidden_size=p["vision_hidden"], intermediate_size=2 * p["vision_hidden"],
                num_heads=2, out_hidden_size=p["hidden"], patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                num_position_embeddings=64)


def _qwen3_5_text(p, ids, attention: str = "full_attention", **extra):
    """Qwen3.5's hybrid decoder: Gated DeltaNet linear-attention layers with an ``attention``
    layer every few (here the last of three); interleaved M-RoPE on a quarter of the head."""
    head_dim = p["hidden"] // p["heads"]
    text = _text_config(p, ids, head_dim=head_dim, linear_key_head_dim=head_dim, linear_value_head_dim=head_dim,
                        linear_num_key_heads=2, linear_num_value_heads=4,
                        layer_types=["linear_attention", "linear_attention", attention][-p["layers"]:], **extra)
    text.pop("rope_theta")
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e7, "mrope_section": [2, 1, 1],
                               "mrope_interleaved": True, "partial_rotary_factor": 0.5}
    return text


def _build_qwen3_5(p):
    """Qwen3.5: the hybrid decoder of :func:`_qwen3_5_text`, Qwen3-VL's processor."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    tok = build_tokenizer()
    ids = _ids(tok, QWEN_SPECIAL_TOKENS)
    cfg = Qwen3_5Config(text_config=_qwen3_5_text(p, ids), vision_config=_qwen3_vision(p), **_qwen_tokens(ids))
    return Qwen3_5ForConditionalGeneration(cfg), _qwen3_vl_processor(tok, p)


def _build_qwen3_vl_moe(p):
    """Qwen3-VL-MoE (e.g. Qwen3-VL-30B-A3B): Qwen3-VL's layout with a mixture-of-experts decoder."""
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration
    tok = build_tokenizer()
    ids = _ids(tok, QWEN_SPECIAL_TOKENS)
    head_dim = p["hidden"] // p["heads"]
    half = head_dim // 2
    text = _text_config(p, ids, head_dim=head_dim, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        decoder_sparse_step=1)
    text.pop("rope_theta")
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e6, "mrope_interleaved": True,
                               "mrope_section": [half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16]}
    cfg = Qwen3VLMoeConfig(text_config=text, vision_config=dict(deepstack_visual_indexes=[0], **_qwen3_vision(p)),
                           **_qwen_tokens(ids))
    return Qwen3VLMoeForConditionalGeneration(cfg), _qwen3_vl_processor(tok, p)


# LiquidAI/LFM2-VL-1.6B: ChatML, "<image>" per image (the processor adds the markers)
CHATML_IMAGE_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ image_placeholder }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _chatml(placeholder: str) -> str:
    return CHATML_IMAGE_TEMPLATE.replace("{{ image_placeholder }}", placeholder)


def _build_lfm2_vl(p):
    """LFM2-VL: ``<|image_start|> <image>*k <|image_end|>`` per image; a hybrid decoder of
    short-convolution blocks with attention in some layers only (here the middle one)."""
    from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration, Lfm2VlImageProcessor, Lfm2VlProcessor
    special = ("<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>") + tuple(
        f"<|img_row_{r}_col_{c}|>" for r in range(1, 4) for c in range(1, 4))
    tok = _tokenizer(special, image_token="<image>")
    improc = Lfm2VlImageProcessor(do_image_splitting=False, min_image_tokens=4, max_image_tokens=16,
                                  encoder_patch_size=16, tile_size=64, downsample_factor=2, **_NORM)
    proc = Lfm2VlProcessor(image_processor=improc, tokenizer=tok, chat_template=_chatml("<image>"))
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + special)
    text = _text_config(p, ids, layer_types=["conv", "full_attention", "conv"][:p["layers"]])
    cfg = Lfm2VlConfig(text_config=dict(model_type="lfm2", **text),
                       vision_config=dict(model_type="siglip2_vision_model", patch_size=16, num_patches=64,
                                          vision_use_head=False, **_vision(p)),
                       image_token_id=ids["<image>"], projector_hidden_size=64, downsample_factor=2,
                       tie_word_embeddings=False)
    return Lfm2VlForConditionalGeneration(cfg), proc


def _build_perception_lm(p):
    """PerceptionLM: a timm Perception Encoder tower, ``<|image|>*k`` per image with no markers
    (adjacent images form one run); a Llama decoder."""
    from transformers import (PerceptionLMConfig, PerceptionLMForConditionalGeneration, PerceptionLMImageProcessor,
                              PerceptionLMProcessor, PerceptionLMVideoProcessor)
    tok = _tokenizer(("<|image|>", "<|video|>"), image_token="<|image|>", video_token="<|video|>")
    side, patch = 64, 16
    proc = PerceptionLMProcessor(video_processor=PerceptionLMVideoProcessor(),
                                 image_processor=PerceptionLMImageProcessor(tile_size=side, max_num_tiles=1,
                                                                            vision_input_type="vanilla"),
                                 tokenizer=tok, patch_size=patch, pooling_ratio=2, chat_template=_chatml("<|image|>"))
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + ("<|image|>", "<|video|>"))
    cfg = PerceptionLMConfig(
        vision_config=dict(model_type="timm_wrapper", architecture="vit_pe_core_tiny_patch16_384", num_classes=0,
                           model_args=dict(embed_dim=p["vision_hidden"], depth=p["vision_depth"], num_heads=2,
                                           img_size=(side, side))),
        text_config=dict(model_type="llama", **_text_config(p, ids)), vision_use_cls_token=True,
        projector_pooling_ratio=2, image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
        tie_word_embeddings=False)
    return PerceptionLMForConditionalGeneration(cfg), proc


# google/gemma-4 instruction checkpoints: "<|turn>user\n" + "<|image|>" per image + text + "<turn|>\n"
GEMMA4_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}<|image|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}<turn|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}")


def _build_gemma4(p):
    """Gemma 4: ``<|image> <|image|>*k <image|>`` per image (k from the image's size, pooled
    3 x 3), sliding-window layers interleaved with full ones, per-layer input embeddings."""
    from transformers import (Gemma4AudioFeatureExtractor, Gemma4Config, Gemma4ForConditionalGeneration,
                              Gemma4ImageProcessor, Gemma4Processor, Gemma4VideoProcessor)
    special = ("<|image>", "<image|>", "<|image|>", "<|video|>", "<|turn>", "<turn|>", "<bos>", "<|audio|>", "<|audio>",
               "<audio|>")
    tok = _tokenizer(special, bos="<bos>", boi_token="<|image>", eoi_token="<image|>", image_token="<|image|>",
                     audio_token="<|audio|>", boa_token="<|audio>", eoa_token="<audio|>")
    vision = dict(patch_size=16, max_soft_tokens=70, pooling_kernel_size=3)
    proc = Gemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(), image_processor=Gemma4ImageProcessor(**vision),
                           tokenizer=tok, video_processor=Gemma4VideoProcessor(**vision), image_seq_length=70,
                           chat_template=GEMMA4_CHAT_TEMPLATE)
    ids = _ids(proc.tokenizer, QWEN_SPECIAL_TOKENS + special)
    head_dim = p["hidden"] // p["heads"]
    text = _text_config(p, ids, head_dim=head_dim, sliding_window=SLIDING_WINDOW, vocab_size_per_layer_input=VOCAB_SIZE,
                        hidden_size_per_layer_input=8,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"][:p["layers"]])
    text["eos_token_id"] = [ids["<turn|>"], ids["<|im_end|>"]]
    cfg = Gemma4Config(text_config=text,
                       vision_config=dict(hidden_size=p["vision_hidden"], intermediate_size=2 * p["vision_hidden"],
                                          num_hidden_layers=p["vision_depth"], num_attention_heads=2,
                                          num_key_value_heads=2, head_dim=16, patch_size=16, pooling_kernel_size=3,
                                          position_embedding_size=256),
                       audio_config=None, boi_token_id=ids["<|image>"], eoi_token_id=ids["<image|>"],
                       image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"], audio_token_id=ids["<|audio|>"],
                       boa_token_id=ids["<|audio>"], eoa_token_index=ids["<audio|>"])
    return Gemma4ForConditionalGeneration(cfg), proc


# llava-hf/vip-llava-7b-hf: "###Human: <image>\n...###Assistant:"
VIPLLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}###Human: "
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{% elif message['role'] == 'assistant' %}###Assistant: {{ message['content'][0]['text'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}###Assistant:{% endif %}")


def _build_vipllava(p):
    """VipLLaVA: LLaVA-1.5's layout; the projector reads several layers of the tower."""
    from transformers import VipLlavaConfig, VipLlavaForConditionalGeneration
    proc, ids = _llava_processor(VIPLLAVA_CHAT_TEMPLATE)
    cfg = VipLlavaConfig(text_config=dict(model_type="llama", **_text_config(p, ids)), vision_config=_clip_vision(p),
                         image_token_index=ids["<image>"], vision_feature_layers=[-2, -1], tie_word_embeddings=False)
    return VipLlavaForConditionalGeneration(cfg), proc


def _build_video_llava(p):
    """Video-LLaVA (LanguageBind/Video-LLaVA-7B-hf, LLaVA-1.5's prompt): one run of ``<image>``
    per image, no markers; its processor needs a video processor too."""
    from transformers import (VideoLlavaConfig, VideoLlavaForConditionalGeneration, VideoLlavaImageProcessor,
                              VideoLlavaProcessor, VideoLlavaVideoProcessor)
    special = ("<image>", "<video>")
    tok = _tokenizer(special, image_token="<image>", video_token="<video>")
    proc = VideoLlavaProcessor(image_processor=VideoLlavaImageProcessor(**_CLIP_SIZES, **_NORM),
                               video_processor=VideoLlavaVideoProcessor(**_CLIP_SIZES), tokenizer=tok,
                               chat_template=LLAVA_CHAT_TEMPLATE, **_LLAVA_PROCESSOR)
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + special)
    cfg = VideoLlavaConfig(text_config=dict(model_type="llama", **_text_config(p, ids)), vision_config=_clip_vision(p),
                           image_token_index=ids["<image>"], video_token_index=ids["<video>"],
                           image_seq_length=(_CLIP_SIDE // _CLIP_PATCH) ** 2, vision_feature_select_strategy="default",
                           vision_feature_layer=-1, tie_word_embeddings=False)
    return VideoLlavaForConditionalGeneration(cfg), proc


def _build_llava_next_video(p):
    """LLaVA-NeXT-Video (llava-hf/LLaVA-NeXT-Video-7B-hf, LLaVA-1.5's prompt): LLaVA-NeXT's anyres images."""
    from transformers import (LlavaNextVideoConfig, LlavaNextVideoForConditionalGeneration, LlavaNextVideoProcessor,
                              LlavaNextVideoVideoProcessor)
    special = ("<image>", "<video>")
    tok = _tokenizer(special, image_token="<image>", video_token="<video>")
    proc = LlavaNextVideoProcessor(image_processor=_anyres_image_processor(),
                                   video_processor=LlavaNextVideoVideoProcessor(**_CLIP_SIZES), tokenizer=tok,
                                   chat_template=LLAVA_CHAT_TEMPLATE, **_LLAVA_PROCESSOR)
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + special)
    cfg = LlavaNextVideoConfig(text_config=dict(model_type="llama", **_text_config(p, ids)), vision_config=_clip_vision(p),
                               image_token_index=ids["<image>"], video_token_index=ids["<video>"],
                               image_grid_pinpoints=_ANYRES_GRID, vision_feature_select_strategy="default",
                               vision_feature_layer=-1, spatial_pool_stride=2, tie_word_embeddings=False)
    return LlavaNextVideoForConditionalGeneration(cfg), proc


def _build_glm46v(p):
    """GLM-4.6V: GLM-4.1V's layout (template markers, 3-axis M-RoPE) under its own classes."""
    from transformers import Glm46VConfig, Glm46VForConditionalGeneration, Glm46VProcessor
    text, vision, tokens, proc = _glm4v_parts(p, {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1],
                                                 "partial_rotary_factor": 0.5})
    proc = Glm46VProcessor(image_processor=proc.image_processor, video_processor=proc.video_processor,
                           tokenizer=proc.tokenizer, chat_template=proc.chat_template)
    return Glm46VForConditionalGeneration(Glm46VConfig(text_config=text, vision_config=vision, **tokens)), proc


#: the tiny mixture of experts of the MoE decoders: 4 experts, 2 per token, one shared
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)


def _build_qwen3_5_moe(p):
    """Qwen3.5-MoE: Qwen3.5's hybrid decoder with mixture-of-experts MLPs."""
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration
    tok = build_tokenizer()
    ids = _ids(tok, QWEN_SPECIAL_TOKENS)
    cfg = Qwen3_5MoeConfig(text_config=_qwen3_5_text(p, ids, **_MOE), vision_config=_qwen3_vision(p), **_qwen_tokens(ids))
    return Qwen3_5MoeForConditionalGeneration(cfg), _qwen3_vl_processor(tok, p)


def _build_qwen4_exp(p):
    """Qwen4-Exp: Qwen3.5-MoE's hybrid decoder whose attention layers attend only to the tokens
    an indexer selects (``indexed_attention``; a budget of 16 tokens, shorter than the prompts:
    the selection reaches the kernel as a mask, which the capture sees), hyper-connections
    between layers, and 1-D RoPE (its config's default)."""
    from transformers import Qwen4ExpConfig, Qwen4ExpForConditionalGeneration
    tok = build_tokenizer()
    ids = _ids(tok, QWEN_SPECIAL_TOKENS)
    text = _qwen3_5_text(p, ids, "indexed_attention", **_MOE, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16,
                         indexer_budget=16, indexer_compress_ratio=4, hc_lowrank=8)
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e7}
    cfg = Qwen4ExpConfig(text_config=text, vision_config=_qwen3_vision(p), **_qwen_tokens(ids))
    return Qwen4ExpForConditionalGeneration(cfg), _qwen3_vl_processor(tok, p)


def _build_smolvlm(p):
    """SmolVLM (HuggingFaceTB/SmolVLM2-2.2B-Instruct): Idefics3's layout under its own classes;
    its processor imports num2words (the current lane's ``current`` extra)."""
    from transformers import (SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMImageProcessor, SmolVLMProcessor,
                              SmolVLMVideoProcessor)
    return _idefics3_like(p, SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMProcessor, SmolVLMImageProcessor,
                          video_processor=SmolVLMVideoProcessor())


def _build_cohere2_vision(p):
    """Command A Vision (CohereLabs/command-a-vision-07-2025): Aya Vision's turns; per image
    ``<|START_OF_IMG|>``, each tile's patches then ``<|IMG_LINE_BREAK|>``, ``<|END_OF_IMG|>``;
    a Cohere2 decoder with sliding-window layers."""
    from transformers import (Cohere2VisionConfig, Cohere2VisionForConditionalGeneration, Cohere2VisionImageProcessor,
                              Cohere2VisionProcessor)
    special = ("<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>", "<BOS_TOKEN>",
               "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>")
    tok = _tokenizer(special, bos="<BOS_TOKEN>", image_token="<|IMG_PATCH|>", boi_token="<|START_OF_IMG|>",
                     eoi_token="<|END_OF_IMG|>", img_line_break_token="<|IMG_LINE_BREAK|>")
    side, patch, downsample = 56, 14, 2
    improc = Cohere2VisionImageProcessor(size={"height": side, "width": side}, crop_to_patches=True, min_patches=1,
                                         max_patches=2, **_NORM)
    improc.patch_size = side // patch // downsample          # the processor reads it as tokens per tile side
    proc = Cohere2VisionProcessor(image_processor=improc, tokenizer=tok,
                                  chat_template=AYA_VISION_CHAT_TEMPLATE.replace("<image>", "<|IMG_PATCH|>"))
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + special)
    text = _sliding_window_text(p, ids)
    cfg = Cohere2VisionConfig(text_config=dict(model_type="cohere2", **text),
                              vision_config=_siglip(p, side, patch),
                              image_token_id=ids["<|IMG_PATCH|>"], downsample_factor=downsample,
                              alignment_intermediate_size=64, tie_word_embeddings=False)
    return Cohere2VisionForConditionalGeneration(cfg), proc


# deepseek-community/deepseek-vl-1.3b-chat: "User: <image_placeholder>...\n\nAssistant:" (Janus-Pro: "<|User|>",
# "<|Assistant|>"); an assistant turn ends with the end-of-sentence token
DEEPSEEK_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}User: "
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}<image_placeholder>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}\n\n"
    "{% elif message['role'] == 'assistant' %}Assistant: {{ message['content'][0]['text'] }}<｜end▁of▁sentence｜>"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")
JANUS_CHAT_TEMPLATE = DEEPSEEK_VL_CHAT_TEMPLATE.replace("User:", "<|User|>:").replace("Assistant:", "<|Assistant|>:")
#: DeepSeek-VL's and Janus's understanding tower at tiny size: 32-px images, 16-px patches (4 tokens)
_DEEPSEEK_SIDE, _DEEPSEEK_PATCH = 32, 16


def _build_deepseek_vl(p):
    """DeepSeek-VL: a fixed run of ``<image_placeholder>`` per image, no markers; a SigLIP tower."""
    from transformers import DeepseekVLConfig, DeepseekVLForConditionalGeneration, DeepseekVLImageProcessor, DeepseekVLProcessor
    special = ("<image_placeholder>", "<｜end▁of▁sentence｜>")
    tok = _tokenizer(special, image_token="<image_placeholder>")
    side, patch = _DEEPSEEK_SIDE, _DEEPSEEK_PATCH
    proc = DeepseekVLProcessor(image_processor=DeepseekVLImageProcessor(size={"height": side, "width": side}, min_size=4,
                                                                        **_NORM),
                               tokenizer=tok, chat_template=DEEPSEEK_VL_CHAT_TEMPLATE, num_image_tokens=(side // patch) ** 2)
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + special)
    cfg = DeepseekVLConfig(text_config=dict(model_type="llama", **_text_config(p, ids)),
                           vision_config=_siglip(p, side, patch),
                           image_token_id=ids["<image_placeholder>"])
    return DeepseekVLForConditionalGeneration(cfg), proc


def _build_janus(p):
    """Janus-Pro (deepseek-community/Janus-Pro-1B): ``<begin_of_image> <image_placeholder>*k
    <end_of_image>`` per image; a SigLIP tower for understanding (its VQ model, tiny here, only generates images)."""
    from transformers import JanusConfig, JanusForConditionalGeneration, JanusImageProcessor, JanusProcessor
    special = ("<image_placeholder>", "<begin_of_image>", "<end_of_image>", "<｜end▁of▁sentence｜>")
    tok = _tokenizer(special, image_token="<image_placeholder>", boi_token="<begin_of_image>", eoi_token="<end_of_image>")
    side, patch = _DEEPSEEK_SIDE, _DEEPSEEK_PATCH
    proc = JanusProcessor(image_processor=JanusImageProcessor(size={"height": side, "width": side}, min_size=4, **_NORM),
                          tokenizer=tok, chat_template=JANUS_CHAT_TEMPLATE, use_default_system_prompt=False,
                          num_image_tokens=(side // patch) ** 2)
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + special)
    cfg = JanusConfig(text_config=dict(model_type="llama", **_text_config(p, ids)),
                      vision_config=dict(hidden_size=p["vision_hidden"], intermediate_size=2 * p["vision_hidden"],
                                         num_hidden_layers=p["vision_depth"], num_attention_heads=2, image_size=side,
                                         patch_size=patch, projection_dim=p["hidden"], num_image_tokens=(side // patch) ** 2),
                      vq_config=dict(embed_dim=8, num_embeddings=16, base_channels=32, channel_multiplier=[1, 1],
                                     num_res_blocks=1, latent_channels=8, projection_dim=p["hidden"],
                                     image_token_embed_dim=p["hidden"], num_patches=2, num_hidden_layers=1),
                      image_token_id=ids["<image_placeholder>"])
    return JanusForConditionalGeneration(cfg), proc


def _build_lighton_ocr(p):
    """LightOnOCR (lightonai/LightOnOCR-1B-1025): a Pixtral tower whose rows of ``[IMG]`` carry
    no break or end tokens here (its processor writes none), a Qwen3 decoder; ChatML turns as its
    Qwen3 decoder's (the released template's exact text around an image is not reproduced)."""
    from transformers import LightOnOcrConfig, LightOnOcrForConditionalGeneration, LightOnOcrProcessor, PixtralImageProcessor
    special = ("[IMG]", "[IMG_BREAK]", "[IMG_END]")
    tok = _tokenizer(special, image_token="[IMG]", image_break_token="[IMG_BREAK]", image_end_token="[IMG_END]")
    patch, merge = 14, 2
    proc = LightOnOcrProcessor(image_processor=PixtralImageProcessor(size={"longest_edge": 112}, patch_size=patch, **_NORM),
                               tokenizer=tok, patch_size=patch, spatial_merge_size=merge, chat_template=_chatml("[IMG]"))
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + special)
    head_dim = p["hidden"] // p["heads"]
    cfg = LightOnOcrConfig(text_config=dict(model_type="qwen3", **_text_config(p, ids, head_dim=head_dim)),
                           vision_config=dict(model_type="pixtral", head_dim=p["vision_hidden"] // 2, image_size=112,
                                              patch_size=patch, **_vision(p)),
                           image_token_id=ids["[IMG]"], spatial_merge_size=merge, tie_word_embeddings=False)
    return LightOnOcrForConditionalGeneration(cfg), proc


def _build_exaone4_5(p):
    """EXAONE 4.5: Qwen2.5-VL's tower and processor (``<|image_pad|>`` runs between Qwen's vision
    markers), an EXAONE 4 decoder with sliding-window layers before a global one. The template
    is ChatML with Qwen's markers (the released template's turn tokens are not reproduced)."""
    from transformers import Exaone4_5_Config, Exaone4_5_ForConditionalGeneration, Exaone4_5_Processor
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor
    tok = build_tokenizer()
    ids = _ids(tok, QWEN_SPECIAL_TOKENS)
    sizes = dict(min_pixels=56 * 56, max_pixels=p["max_pixels"])
    proc = Exaone4_5_Processor(image_processor=Qwen2VLImageProcessor(**sizes), video_processor=Qwen2VLVideoProcessor(**sizes),
                               tokenizer=tok, chat_template=_chatml("<|vision_start|><|image_pad|><|vision_end|>"))
    text = _sliding_window_text(p, ids)
    cfg = Exaone4_5_Config(text_config=dict(model_type="exaone4", **text),
                           vision_config=dict(_qwen_vision_config(p, [p["vision_depth"] - 1]),
                                              num_key_value_heads=2),      # grouped-query attention in the tower
                           image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"])
    return Exaone4_5_ForConditionalGeneration(cfg), proc


def _build_qianfan_ocr(p):
    """Qianfan-OCR (baidu/Qianfan-OCR): InternVL's layout, but its chat template writes
    ``<image>`` per image, which the processor expands to ``<img> <IMG_CONTEXT>*k </img>`` per
    tile (its ``image_placeholder_token``, apart from the feature token); a Qwen3 decoder."""
    from transformers import GotOcr2ImageProcessor, QianfanOCRConfig, QianfanOCRForConditionalGeneration, QianfanOCRProcessor
    tok = internvl_tokenizer()
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + INTERNVL_SPECIAL_TOKENS)
    tile, patch, downsample = 56, 14, 0.5
    tokens_per_tile = int((tile // patch) ** 2 * downsample ** 2)
    improc = GotOcr2ImageProcessor(size={"height": tile, "width": tile}, crop_to_patches=True, min_patches=1,
                                   max_patches=2, **_NORM)
    proc = QianfanOCRProcessor(image_processor=improc, tokenizer=tok, image_seq_length=tokens_per_tile,
                               image_placeholder_token="<image>",
                               chat_template=INTERNVL_CHAT_TEMPLATE.replace("<IMG_CONTEXT>\n", "<image>\n"))
    cfg = QianfanOCRConfig(
        vision_config=dict(hidden_size=p["vision_hidden"], num_hidden_layers=p["vision_depth"], num_attention_heads=2,
                           intermediate_size=2 * p["vision_hidden"], image_size=tile, patch_size=patch),
        text_config=dict(model_type="qwen3", **_text_config(p, ids, head_dim=p["hidden"] // p["heads"])),
        image_token_id=ids["<IMG_CONTEXT>"], image_seq_length=tokens_per_tile, downsample_ratio=downsample,
        tie_word_embeddings=False)
    return QianfanOCRForConditionalGeneration(cfg), proc


# google/paligemma-3b-mix-224 ships no chat template: its processor writes the images first,
# then BOS, the text and a newline. The one a study's config gives it writes the images first.
PALIGEMMA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "<image>{% endfor %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] }}{% endfor %}{% endfor %}")


def _build_paligemma(p):
    """PaliGemma: a SigLIP tower, all images first as one run of ``<image>`` each, then BOS and
    the text; the prompt (the prefix) attends bidirectionally, generated tokens (token type 1,
    the suffix) causally. No chat template (:data:`PALIGEMMA_CHAT_TEMPLATE` is given apart)."""
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration, PaliGemmaProcessor, SiglipImageProcessor
    special = ("<image>", "<bos>")
    tok = _tokenizer(special, bos="<bos>", image_token="<image>")
    side, patch = _CLIP_SIDE, _CLIP_PATCH
    improc = SiglipImageProcessor(size={"height": side, "width": side}, **_NORM)
    improc.image_seq_length = (side // patch) ** 2
    proc = PaliGemmaProcessor(image_processor=improc, tokenizer=tok)
    ids = _ids(proc.tokenizer, QWEN_SPECIAL_TOKENS + special)
    vision = _siglip(p, side, patch)
    cfg = PaliGemmaConfig(text_config=dict(model_type="gemma", **_text_config(p, ids, head_dim=p["hidden"] // p["heads"])),
                          vision_config=dict(vision, projection_dim=p["hidden"]), image_token_index=ids["<image>"],
                          projection_dim=p["hidden"], hidden_size=p["hidden"])
    return PaliGemmaForConditionalGeneration(cfg), proc


# stepfun-ai/GOT-OCR-2.0-hf ships no chat template: its processor writes its own OCR prompt
# (ChatML, a system query, "<img><imgpad></img>" per image). The one a study's config gives it
# writes that layout around the benchmark's text.
GOT_OCR2_CHAT_TEMPLATE = (
    "<|im_start|>system\nYou should follow the instructions carefully and explain your answers in detail.<|im_end|>"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}<img><imgpad></img>{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ '\n' + content['text'] }}"
    "{% endfor %}<|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _build_got_ocr2(p):
    """GOT-OCR2: a SAM-style windowed tower, ``<img> <imgpad>*k </img>`` per image (its
    processor's ``multi_page`` option would expand a prompt's images as one document's pages:
    each gets its own run only from a flat list); a Qwen2 decoder. No chat template
    (:data:`GOT_OCR2_CHAT_TEMPLATE` is given apart)."""
    from transformers import GotOcr2Config, GotOcr2ForConditionalGeneration, GotOcr2ImageProcessor, GotOcr2Processor
    special = ("<img>", "</img>", "<imgpad>")
    tok = _tokenizer(special)
    # the processor writes its fixed 256 tokens per image (no setting of its own survives a save):
    # the released 1,024-px input, 16-px patches, its neck's 4x reduction; windowed attention only
    side, patch, window = 1024, 16, 8
    proc = GotOcr2Processor(image_processor=GotOcr2ImageProcessor(size={"height": side, "width": side}, **_NORM),
                            tokenizer=tok)
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + special)
    cfg = GotOcr2Config(text_config=dict(model_type="qwen2", **_text_config(p, ids)),
                        vision_config=dict(hidden_size=p["vision_hidden"], output_channels=16,
                                           num_hidden_layers=p["vision_depth"], num_attention_heads=2, image_size=side,
                                           patch_size=patch, window_size=window, global_attn_indexes=[],
                                           mlp_dim=2 * p["vision_hidden"]),
                        image_token_index=ids["<imgpad>"], image_seq_length=(side // patch // 4) ** 2,
                        tie_word_embeddings=False)
    return GotOcr2ForConditionalGeneration(cfg), proc


def _build_inkling2(p):
    """Inkling 2: a decoder whose attention layers (sliding-window and full, keys and values
    through a short convolution) add a relative position bias and data-dependent attention
    sinks (one logit per query and head, ``sinks=``); one run of image tokens per image. ChatML
    (not the released template)."""
    from transformers import (Inkling2Config, Inkling2ForConditionalGeneration, Inkling2ImageProcessor,
                              Inkling2Processor)
    tok = _tokenizer(("<|image|>",), image_token="<|image|>")
    proc = Inkling2Processor(image_processor=Inkling2ImageProcessor(size={"height": 40, "width": 40}, **_NORM),
                             tokenizer=tok, chat_template=_chatml("<|image|>"))
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + ("<|image|>",))
    head_dim = p["hidden"] // p["heads"]
    text = _text_config(p, ids, head_dim=head_dim, swa_num_attention_heads=p["heads"],
                        swa_num_key_value_heads=p["kv_heads"], swa_head_dim=head_dim, sliding_window_size=SLIDING_WINDOW,
                        rel_extent=SLIDING_WINDOW, unpadded_vocab_size=VOCAB_SIZE, n_routed_experts=4,
                        num_experts_per_tok=2, moe_intermediate_size=32,
                        layer_types=["hybrid_sliding", "hybrid_sliding", "hybrid"][:p["layers"]])
    for key in ("rope_theta", "intermediate_size", "sliding_window"):
        text.pop(key, None)
    vision = dict(_vision(p), patch_size=20, spatial_merge_size=2, text_hidden_size=p["hidden"],
                  projection_hidden_dim=2 * p["hidden"])
    cfg = Inkling2Config(text_config=text, vision_config=vision, image_token_id=ids["<|image|>"])
    return Inkling2ForConditionalGeneration(cfg), proc


def _build_cosmos3_edge(p):
    """Cosmos3-Edge: Qwen3-VL's layout (template markers around each image, 3-axis M-RoPE) with
    a SigLIP-style tower; its model reads ``mm_token_type_ids``, which its processor returns
    only when asked."""
    from transformers import (Cosmos3EdgeConfig, Cosmos3EdgeForConditionalGeneration, Cosmos3EdgeImageProcessor,
                              Cosmos3EdgeProcessor, Cosmos3EdgeVideoProcessor)
    tok = build_tokenizer()
    ids = _ids(tok, QWEN_SPECIAL_TOKENS)
    sizes = dict(min_pixels=64 * 64, max_pixels=p["max_pixels"], patch_size=16, merge_size=2, **_NORM)
    proc = Cosmos3EdgeProcessor(image_processor=Cosmos3EdgeImageProcessor(**sizes),
                                video_processor=Cosmos3EdgeVideoProcessor(**sizes), tokenizer=tok,
                                chat_template=QWEN3_VL_CHAT_TEMPLATE)
    patch, merge = sizes["patch_size"], sizes["merge_size"]
    head_dim = p["hidden"] // p["heads"]
    half = head_dim // 2
    text = _text_config(p, ids, head_dim=head_dim)
    text.pop("rope_theta")
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6,
                               "mrope_section": [half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16]}
    cfg = Cosmos3EdgeConfig(text_config=text, vision_config=dict(_vision(p), patch_size=patch, spatial_merge_size=merge),
                            projector_hidden_size=2 * p["hidden"], **_qwen_tokens(ids))
    return Cosmos3EdgeForConditionalGeneration(cfg), proc


# baidu/Unlimited-OCR: its chat template cannot be read offline; its decoder and tokenizer are DeepSeek's, so this
# follows Janus's "<|User|>:" / "<|Assistant|>:" turns (its processor expands one "<image>" per image)
UNLIMITED_OCR_CHAT_TEMPLATE = JANUS_CHAT_TEMPLATE.replace("<image_placeholder>", "<image>")


def _build_unlimited_ocr(p):
    """Unlimited-OCR: a SAM tower feeding a CLIP-style encoder; per image, local tiles (a grid of
    ``tile``-px crops, with a newline feature after each row), its global view (likewise) and a
    view separator, all one run of ``<image>``. Its processor returns per-image lists
    (``num_local_patches``, ``patches_grid``) that its forward reads on the host. Tiny: a 128-px
    global view (2 x 2 features after the SAM tower's 16-px patches and 4x reduction) and 48-px
    tiles (1 feature each, 2 tiles per image), so a 56-px image is 11 tokens. Its decoder's
    reference sliding window applies to generated tokens only (the prompt is always seen whole)."""
    from transformers import (UnlimitedOcrConfig, UnlimitedOcrForConditionalGeneration, UnlimitedOcrImageProcessor,
                              UnlimitedOcrProcessor)
    special = ("<image>", "<｜end▁of▁sentence｜>")
    tok = _tokenizer(special, image_token="<image>")
    side, tile, patch, reduction = 128, 48, 16, 4
    improc = UnlimitedOcrImageProcessor(size={"height": side, "width": side}, tile_size=tile, min_patches=2,
                                        max_patches=2, **_NORM)
    proc = UnlimitedOcrProcessor(image_processor=improc, tokenizer=tok, chat_template=UNLIMITED_OCR_CHAT_TEMPLATE,
                                 patch_size=patch, downsample_ratio=reduction)
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + special)
    # as released, as many key-value heads as query heads: its eager attention repeats none (grouped heads fail there)
    text = dict(_text_config(p, ids, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=p["hidden"] // 2,
                             n_shared_experts=1), num_key_value_heads=p["heads"])
    width = p["vision_hidden"]
    # the SAM tower's output (downsample_channels[-1]) is the encoder's input width: one width throughout; its
    # weights drawn at the preset's scale (its default, 1e-10, would make every image's features alike)
    sam = dict(hidden_size=width, output_channels=width // 2, num_hidden_layers=p["vision_depth"], num_attention_heads=2,
               image_size=side, patch_size=patch, window_size=4, global_attn_indexes=[p["vision_depth"] - 1],
               mlp_dim=2 * width, downsample_channels=[width, width], initializer_range=p["init_std"])
    encoder = dict(_vision(p), image_size=side // patch // reduction, patch_size=1)
    cfg = UnlimitedOcrConfig(text_config=text, vision_config=dict(sam_config=sam, encoder_config=encoder),
                             image_token_id=ids["<image>"])
    return UnlimitedOcrForConditionalGeneration(cfg), proc


#: The hand-written families whose tiny builds (``models/tiny.py``) auto runs too, in the
#: tests, where it must write their adapters' caches; each build's model type is the family's name.
FAMILY_BUILDS_AUTO_RUNS = ("qwen2_5_vl", "internvl", "llava_onevision", "qwen3_vl")

#: Architectures without a tiny build here, and what is missing (``ladbench models`` lists them as
#: untested): from a probe of every one with transformers 5.23 (2026-11-26), whose generic build
#: shrinks the architecture's own config defaults; where it fails, the cause may be that build's.
NOT_BUILT = {
    "aria": "a hand-written tiny build; the generic one fails at load (its projector has no query count for the tiny "
            "tower's patch count)",
    "chameleon": "a VQ image tokenizer config (images enter as VQ codes) for a tiny build",
    "cohere_compass": "a hand-written tiny build; the generic one fails at build (no full_attention layer type)",
    "cosmos3_omni": "a hand-written tiny build; the generic one fails at load (an M-RoPE shape mismatch, undiagnosed)",
    "deepseek_ocr2": "a hand-written tiny build; the generic one does not finish (killed after 240 s)",
    "deepseek_vl_hybrid": "a hand-written tiny build; the generic one fails at load (a size mismatch, 576 vs 196)",
    "diffusion_gemma": "an autoregressive decoder: it is a block-diffusion LM, and the capture reads one causal prompt",
    "dots3_note": "a hand-written tiny build; the generic one fails at build (its adapter's input width must be the "
                  "text width)",
    "emu3": "a VQ image tokenizer config (images enter as VQ codes) for a tiny build",
    "ernie4_5_vl_moe": "a hand-written tiny build; the generic one fails at build (a tensor size mismatch, 8 vs 0)",
    "fast_vlm": "a processor: none is mapped for its model type (a checkpoint names its own)",
    "fuyu": "a hand-written tiny build; the generic one fails at build (its processor needs a token the build lacks)",
    "gemma3n": "a hand-written tiny build; the generic one fails at build (its layer types that produce and use the "
               "cache differ)",
    "gemma4_unified": "a hand-written tiny build; the generic one fails at load (weight shapes do not match its config)",
    "glm5_next": "a hand-written tiny build; the generic one fails at build (its sparse attention layers need NoPE "
                 "settings)",
    "glm_ocr": "a processor: none is mapped for its model type (a checkpoint names its own)",
    "glmga": "a hand-written tiny build; the generic one fails at load (an M-RoPE shape mismatch, undiagnosed)",
    "granite4_vision": "a hand-written tiny build; the generic one fails at build (a length of None)",
    "granite_docling": "a hand-written tiny build; the generic one fails the span check (one span of 1,004 tokens, "
                       "undiagnosed)",
    "hunyuan_vl": "a hand-written tiny build; the generic one fails at build (a power of None)",
    "hyperclovax_vision_v2": "a hand-written tiny build; the generic one fails at load (a flag its config leaves None)",
    "inkling_mm_model": "a hand-written tiny build; the generic one does not finish (killed after 240 s)",
    "kimi_k25": "a hand-written tiny build; the generic one fails at load (a layer norm of the wrong width)",
    "kosmos-2": "a chat template (its checkpoint has none and its processor takes none)",
    "lfm3_vl": "a hand-written tiny build; the generic one fails at load (a matrix shape mismatch)",
    "llama4": "a hand-written tiny build; the generic one fails at build (an index out of range)",
    "minicpm_ocr": "a hand-written tiny build; the generic one passes capture, batching and KV checks; generate (the "
                   "greedy reference) crashes in its vision tower, undiagnosed",
    "minicpmv4_6": "a hand-written tiny build; the generic one passes capture, batching and KV checks; generate (the "
                   "greedy reference) crashes in its vision tower, undiagnosed",
    "minicpmv4_7": "a hand-written tiny build; the generic one passes capture, batching and KV checks; generate (the "
                   "greedy reference) crashes in its vision tower, undiagnosed",
    "minimax_m3_vl": "a hand-written tiny build; the generic one writes no image placeholder its processor reads",
    "mistral4": "a processor: none is mapped for its model type (a checkpoint names its own)",
    "mistral_large4": "a hand-written tiny build; the generic one fails at build (its KV-source layers need one entry "
                      "per layer)",
    "molmo2": "a hand-written tiny build; the generic one fails at build (its adapter's feature layers)",
    "muse_glimmer": "a hand-written tiny build; the generic one fails at load (a matrix shape mismatch)",
    "muse_spark": "a hand-written tiny build; the generic one fails at build (its audio config's width)",
    "nemotron_h_omni": "a hand-written tiny build; the generic one fails at build (its processor needs an audio feature"
                       " extractor)",
    "ovis2": "a hand-written tiny build; the generic one's image tokens do not fall one image's run each into the spans"
             " (undiagnosed)",
    "paddleocr_vl": "a hand-written tiny build; the generic one fails at load (an M-RoPE shape mismatch, undiagnosed)",
    "qwen2_5_omni_thinker": "a processor: none is mapped for its model type (a checkpoint names its own)",
    "qwen3_omni_moe_thinker": "a processor: none is mapped for its model type (a checkpoint names its own)",
    "step3p7": "a hand-written tiny build; the generic one fails at load (its config leaves the sliding window unset)",
    "video_llama_3": "a hand-written tiny build; the generic one fails at load (a patch reshape of the wrong size)",
}

#: Every tiny architecture build, by transformers model type.
BUILDS: dict[str, TinyArch] = {
    "llava": TinyArch(_build_llava, "single span, no markers",
                       ("<image>", "<image>")),
    "llava_next": TinyArch(_build_llava_next, "anyres tiles with newline features, no markers",
                       ("<image>", "<image>")),
    "mistral3": TinyArch(_build_mistral3, "rows with break tokens, end marker",
                       ("[IMG]", "[IMG_END]")),
    "aya_vision": TinyArch(_build_aya_vision, "tiles with text separators between markers; sliding-window layers",
                       ("<|START_OF_IMG|>", "<|END_OF_IMG|>")),
    "gemma3": TinyArch(_build_gemma3, "single span between markers; bidirectional image attention, sliding-window layers",
                       ("<start_of_image>", "<end_of_image>")),
    "idefics3": TinyArch(_build_idefics3, "tiles with row/column tokens and a global view",
                       ("<fake_token_around_image>", "<fake_token_around_image>")),
    "glm4v": TinyArch(_build_glm4v, "single span between template markers; multi-axis RoPE",
                       ("<|begin_of_image|>", "<|end_of_image|>")),
    "glm4v_moe": TinyArch(_build_glm4v_moe, "single span between template markers; multi-axis RoPE, MoE decoder",
                       ("<|begin_of_image|>", "<|end_of_image|>")),
    "qwen2_vl": TinyArch(_build_qwen2_vl, "single span between template markers; multi-axis RoPE",
                       ("<|vision_start|>", "<|vision_end|>")),
    "qwen3_5": TinyArch(_build_qwen3_5, "single span between template markers; hybrid linear-attention decoder",
                       ("<|vision_start|>", "<|vision_end|>")),
    "qwen3_vl_moe": TinyArch(_build_qwen3_vl_moe, "single span between template markers; MoE decoder",
                       ("<|vision_start|>", "<|vision_end|>")),
    "lfm2_vl": TinyArch(_build_lfm2_vl, "single span between markers; hybrid convolution decoder",
                       ("<|image_start|>", "<|image_end|>")),
    "gemma4": TinyArch(_build_gemma4, "single span between markers, length from the image size; sliding-window layers",
                       ("<|image>", "<image|>")),
    "perception_lm": TinyArch(_build_perception_lm, "single span, no markers, adjacent images in one run",
                       ("<|image|>", "<|image|>")),
    "vipllava": TinyArch(_build_vipllava, "single span, no markers; features from several tower layers",
                         ("<image>", "<image>")),
    "video_llava": TinyArch(_build_video_llava, "single span, no markers",
                            ("<image>", "<image>")),
    "llava_next_video": TinyArch(_build_llava_next_video, "anyres tiles with newline features, no markers",
                                 ("<image>", "<image>")),
    "glm46v": TinyArch(_build_glm46v, "single span between template markers; multi-axis RoPE",
                       ("<|begin_of_image|>", "<|end_of_image|>")),
    "qwen3_5_moe": TinyArch(_build_qwen3_5_moe, "single span between template markers; hybrid linear-attention "
                            "decoder, MoE", ("<|vision_start|>", "<|vision_end|>")),
    "qwen4_exp": TinyArch(_build_qwen4_exp, "single span between template markers; hybrid decoder with indexed "
                          "sparse attention", ("<|vision_start|>", "<|vision_end|>")),
    "smolvlm": TinyArch(_build_smolvlm, "tiles with row/column tokens and a global view",
                        ("<fake_token_around_image>", "<fake_token_around_image>")),
    "cohere2_vision": TinyArch(_build_cohere2_vision, "tiles with line breaks between markers; sliding-window layers",
                               ("<|START_OF_IMG|>", "<|END_OF_IMG|>")),
    "deepseek_vl": TinyArch(_build_deepseek_vl, "fixed-length span, no markers",
                            ("<image_placeholder>", "<image_placeholder>")),
    "janus": TinyArch(_build_janus, "fixed-length span between markers",
                      ("<begin_of_image>", "<end_of_image>")),
    "lighton_ocr": TinyArch(_build_lighton_ocr, "single span, no markers (Pixtral tower)",
                            ("[IMG]", "[IMG]")),
    "qianfan_ocr": TinyArch(_build_qianfan_ocr, "tiles between markers, written by the template as a separate "
                            "placeholder", ("<img>", "</img>")),
    "paligemma": TinyArch(_build_paligemma, "single span, no markers, all images before the text; bidirectional "
                          "prompt; no released chat template (given in the config)", ("<image>", "<image>"),
                          given_chat_template=PALIGEMMA_CHAT_TEMPLATE),
    "got_ocr2": TinyArch(_build_got_ocr2, "fixed-length span between markers; windowed (SAM-style) tower; no released "
                         "chat template (given in the config)", ("<img>", "</img>"),
                         given_chat_template=GOT_OCR2_CHAT_TEMPLATE),
    "inkling2": TinyArch(_build_inkling2, "single span, no markers; attention sinks and a relative position bias, "
                         "sliding-window layers", ("<|image|>", "<|image|>")),
    "cosmos3_edge": TinyArch(_build_cosmos3_edge, "single span between template markers; multi-axis RoPE from "
                             "mm_token_type_ids", ("<|vision_start|>", "<|vision_end|>")),
    "exaone4_5": TinyArch(_build_exaone4_5, "single span between template markers; sliding-window layers",
                          ("<|vision_start|>", "<|vision_end|>")),
    "unlimited_ocr": TinyArch(_build_unlimited_ocr, "tiles and a global view with newline features and a view "
                              "separator, no markers; list-valued processor outputs", ("<image>", "<image>")),
}


def build_tiny_architecture(model_type: str, out_dir: str, *, seed: int = 0, preset: str = "tiny") -> str:
    """Build a random tiny model of ``model_type`` (a key of :data:`BUILDS`) and save it like a
    hub folder into ``out_dir`` (see ``tiny.save_model_folder``); returns ``out_dir``."""
    if model_type not in BUILDS:
        raise ValueError(f"no tiny build of architecture {model_type!r}; built: {', '.join(sorted(BUILDS))}")
    compat.require_lane("auto", family_lanes("auto"))       # transformers 5.x classes
    torch.manual_seed(seed)
    model, processor = BUILDS[model_type].build(PRESETS[preset])
    model.eval()
    folder = save_model_folder(out_dir, model, processor,
                               {"architecture": model_type, "kind": TINY_RANDOM, "seed": seed, "preset": preset,
                                "note": "random weights built offline by ladbench; answers are meaningless"})
    if BUILDS[model_type].given_chat_template:
        with open(os.path.join(folder, GIVEN_CHAT_TEMPLATE), "w", encoding="utf-8") as f:
            f.write(BUILDS[model_type].given_chat_template)
    return folder


def given_chat_template(folder: str) -> str | None:
    """The chat template file a study's config gives the tiny build in ``folder`` (None: the
    build has its own)."""
    path = os.path.join(folder, GIVEN_CHAT_TEMPLATE)
    return path if os.path.isfile(path) else None
