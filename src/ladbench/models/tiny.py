"""Tiny, randomly initialised, fully offline builds of the three model families.

Each build is saved with ``save_pretrained`` (model + processor + chat template) into a
folder and is meant to be loaded back through exactly the adapter code a hub model goes
through (``ModelAdapter.load(folder)``). Nothing is downloaded: the tokenizer is a
byte-level BPE trained here on a few sentences, with the real special tokens of the
families, wrapped in ``Qwen2TokenizerFast`` (the class real Qwen checkpoints use), so
digits are single tokens and multi-character identifiers ("10", "III", "third") really
need several tokens, as they do for the real tokenizers.

The weights are random: these models are for testing code paths and equivalences, and
their answers mean nothing.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Any, Sequence

import torch

from ladbench.families import TINY_FAMILIES, family_lanes
from ladbench.provenance import METADATA_FILE, TINY_RANDOM

from . import compat

# Pre-tokenisation of Qwen2 tokenizers (one digit per token, words with one leading non-letter).
_QWEN_PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                       "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                       "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
LLAVA_ONEVISION_SPECIAL_TOKENS = ("<image>", "<video>")
INTERNVL_SPECIAL_TOKENS = ("<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>",
                           "<box>", "</box>", "<video>")

# Text the BPE is trained on: the prompts and every identifier format, so that the merges
# look like a real tokenizer's on this task (e.g. "first" one token, "III" maybe not).
_TRAINING_TEXT = (
    "Given 4 images indexed from 1 to 4, identify the image that best matches the provided caption. "
    "Respond with the index number only and nothing else.\nCaption: a red square on a table\nAnswer: ",
    "Please note that the provided images have been randomly shuffled, so it is essential to consider them "
    "fairly and without bias. Analyze the visual content objectively and do not be influenced by the order.",
    "Please think step by step. First, write your reasoning inside <think> and </think> tags. "
    "The answer is 3. You are a helpful assistant. user assistant system",
    "A B C D E F G H I J K L a b c d e f g h i j k l I II III IV V VI VII VIII IX X XI XII",
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 the a an of and in on with is that this dog cat blue green yellow",
)

QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# The template of the OpenGVLab/InternVL3-*-hf checkpoints (images as <IMG_CONTEXT>, which the
# processor expands to <img><IMG_CONTEXT>*k</img>).
INTERNVL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{'<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}")

#: Model sizes. "tiny" is for tests (seconds on CPU); "medium" for the CPU benchmark.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden=64, intermediate=128, layers=3, heads=4, kv_heads=2, vision_hidden=32, vision_depth=2,
                 max_pixels=112 * 112, init_std=0.15),
    "medium": dict(hidden=512, intermediate=1024, layers=8, heads=8, kv_heads=2, vision_hidden=64, vision_depth=2,
                   max_pixels=448 * 448, init_std=0.05),
}
VOCAB_SIZE = 512


def build_tokenizer(added_special_tokens: tuple[str, ...] = (), **tokenizer_kwargs: Any):
    """A Qwen2-style byte-level BPE tokenizer trained offline, with the families' special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN_PRETOKENIZE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    core.train_from_iterator(list(_TRAINING_TEXT) * 3, trainer=trainer)
    bpe = json.loads(core.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]]
    tok = compat.bpe_tokenizer(Qwen2TokenizerFast, bpe["vocab"], merges, unk_token=None, bos_token=None,
                               eos_token="<|im_end|>", pad_token="<|endoftext|>", **tokenizer_kwargs)
    vocab = tok.get_vocab()
    tok.add_tokens([t for t in QWEN_SPECIAL_TOKENS + added_special_tokens if t not in vocab], special_tokens=True)
    if len(tok) > VOCAB_SIZE:
        raise RuntimeError(f"tiny tokenizer has {len(tok)} tokens, more than the tiny models' {VOCAB_SIZE}")
    return tok


def _ids(tok, names: tuple[str, ...]) -> dict[str, int]:
    return {n: tok.convert_tokens_to_ids(n) for n in names}


def qwen_processor(tok, max_pixels: int, **image_kwargs: Any):
    """A Qwen2.5-VL processor around ``tok`` (also the OV-1.5 one, with its image normalisation)."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor
    improc = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=max_pixels, **image_kwargs)
    vidproc = Qwen2VLVideoProcessor(min_pixels=56 * 56, max_pixels=max_pixels, **image_kwargs)
    return Qwen2_5_VLProcessor(image_processor=improc, video_processor=vidproc, tokenizer=tok,
                               chat_template=QWEN2_5_VL_CHAT_TEMPLATE)


def _text_config(p: dict[str, Any], ids: dict[str, int], **extra: Any) -> dict[str, Any]:
    return dict(vocab_size=VOCAB_SIZE, hidden_size=p["hidden"], intermediate_size=p["intermediate"],
                num_hidden_layers=p["layers"], num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"],
                max_position_embeddings=8192, initializer_range=p["init_std"], rope_theta=1e6,
                bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"], **extra)


def _qwen_vision_config(p: dict[str, Any], full_attention_blocks: list[int]) -> dict[str, Any]:
    return dict(depth=p["vision_depth"], hidden_size=p["vision_hidden"], intermediate_size=2 * p["vision_hidden"],
                num_heads=2, out_hidden_size=p["hidden"], patch_size=14, spatial_merge_size=2,
                temporal_patch_size=2, window_size=112, fullatt_block_indexes=full_attention_blocks)


def _build_qwen2_5_vl(p: dict[str, Any]):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    tok = build_tokenizer()
    ids = _ids(tok, QWEN_SPECIAL_TOKENS)
    head_dim = p["hidden"] // p["heads"]
    # M-RoPE sections (t, h, w) in rotary pairs; they sum to head_dim / 2 like the real 16/24/24 of 128
    t = head_dim // 8
    section = [t, (head_dim // 2 - t) // 2, head_dim // 2 - t - (head_dim // 2 - t) // 2]
    cfg = Qwen2_5_VLConfig(
        text_config=_text_config(p, ids, rope_scaling={"type": "mrope", "mrope_section": section}),
        vision_config=_qwen_vision_config(p, [p["vision_depth"] - 1]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    return Qwen2_5_VLForConditionalGeneration(cfg), qwen_processor(tok, p["max_pixels"])


# Qwen3-VL's template lays out images like Qwen2.5-VL's but adds no default system turn
QWEN3_VL_CHAT_TEMPLATE = QWEN2_5_VL_CHAT_TEMPLATE.replace(
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}",
    "")


def _build_qwen3_vl(p: dict[str, Any]):
    """Qwen3-VL (transformers 5.x): 16-px patches (32 px per visual token), interleaved M-RoPE,
    DeepStack features from the first vision block."""
    from transformers import (Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration,
                              Qwen3VLProcessor, Qwen3VLVideoProcessor)
    tok = build_tokenizer()
    ids = _ids(tok, QWEN_SPECIAL_TOKENS)
    head_dim = p["hidden"] // p["heads"]
    half = head_dim // 2
    section = [half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16]       # like the real 24/20/20 of 64
    norm = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], patch_size=16, merge_size=2)
    improc = Qwen2VLImageProcessor(min_pixels=64 * 64, max_pixels=p["max_pixels"], **norm)
    vidproc = Qwen3VLVideoProcessor(**norm)
    proc = Qwen3VLProcessor(image_processor=improc, video_processor=vidproc, tokenizer=tok,
                            chat_template=QWEN3_VL_CHAT_TEMPLATE)
    text = _text_config(p, ids, head_dim=head_dim)
    text.pop("rope_theta")
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e6, "mrope_section": section,
                               "mrope_interleaved": True}
    cfg = Qwen3VLConfig(
        text_config=text,
        vision_config=dict(depth=p["vision_depth"], hidden_size=p["vision_hidden"], num_heads=2,
                           intermediate_size=2 * p["vision_hidden"], out_hidden_size=p["hidden"], patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                           deepstack_visual_indexes=[0]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    return Qwen3VLForConditionalGeneration(cfg), proc


def internvl_tokenizer():
    return build_tokenizer(INTERNVL_SPECIAL_TOKENS, extra_special_tokens={
        "start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>"})


def internvl_processor(tok, tile: int, tokens_per_tile: int):
    """An InternVL3-HF processor around ``tok``: one ``tile`` x ``tile`` tile per image (no cropping)."""
    from transformers import GotOcr2ImageProcessor, InternVLProcessor, InternVLVideoProcessor
    norm = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    improc = GotOcr2ImageProcessor(size={"height": tile, "width": tile}, crop_to_patches=False,
                                   min_patches=1, max_patches=4, **norm)
    vidproc = InternVLVideoProcessor(size={"height": tile, "width": tile}, **norm)
    return InternVLProcessor(image_processor=improc, video_processor=vidproc, tokenizer=tok,
                             image_seq_length=tokens_per_tile, chat_template=INTERNVL_CHAT_TEMPLATE)


def _build_internvl(p: dict[str, Any]):
    from transformers import InternVLConfig, InternVLForConditionalGeneration
    tok = internvl_tokenizer()
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + INTERNVL_SPECIAL_TOKENS)
    tile, patch, downsample = 56, 14, 0.5
    tokens_per_tile = int((tile // patch) ** 2 * downsample ** 2)
    proc = internvl_processor(tok, tile, tokens_per_tile)
    cfg = InternVLConfig(
        vision_config=dict(hidden_size=p["vision_hidden"], num_hidden_layers=p["vision_depth"], num_attention_heads=2,
                           intermediate_size=2 * p["vision_hidden"], image_size=tile, patch_size=patch,
                           norm_type="layer_norm", use_qk_norm=False, use_mean_pooling=True),
        text_config=dict(model_type="qwen2", **_text_config(p, ids)),
        image_token_id=ids["<IMG_CONTEXT>"], image_seq_length=tokens_per_tile, downsample_ratio=downsample,
        projector_hidden_act="gelu", vision_feature_layer=-1, vision_feature_select_strategy="default",
        tie_word_embeddings=False, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    return InternVLForConditionalGeneration(cfg), proc


def _build_llava_ov15(p: dict[str, Any]):
    from .tiny_ov15 import modeling_tiny_ov15 as remote
    tok = build_tokenizer()
    ids = _ids(tok, QWEN_SPECIAL_TOKENS)
    proc = qwen_processor(tok, p["max_pixels"], image_mean=[0.48145466, 0.4578275, 0.40821073],
                           image_std=[0.26862954, 0.26130258, 0.27577711])
    cfg = remote.TinyOV15Config(
        text_config=_text_config(p, ids, head_dim=p["hidden"] // p["heads"]),
        vision_config=_qwen_vision_config(p, list(range(p["vision_depth"]))),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        auto_map={"AutoConfig": "modeling_tiny_ov15.TinyOV15Config",
                  "AutoModelForCausalLM": "modeling_tiny_ov15.TinyOV15ForConditionalGeneration"},
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    return remote.TinyOV15ForConditionalGeneration(cfg), proc


# The template transformers' conversion script gives the llava-hf OneVision checkpoints:
# each image as "<image>\n", all images before the text.
LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{{'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _build_llava_onevision(p: dict[str, Any]):
    """LLaVA-OneVision: a SigLIP tower on 28-px inputs (4 patches of 14 px: 4 features + 1
    newline per image in a multi-image prompt), a 2-layer projector, a Qwen2 decoder."""
    from transformers import (LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration,
                              LlavaOnevisionImageProcessor, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor)
    tok = build_tokenizer(LLAVA_ONEVISION_SPECIAL_TOKENS, extra_special_tokens={"image_token": "<image>",
                                                                                 "video_token": "<video>"})
    ids = _ids(tok, QWEN_SPECIAL_TOKENS + LLAVA_ONEVISION_SPECIAL_TOKENS)
    side, patch = 28, 14
    grid = [[side * a, side * b] for a in (1, 2) for b in (1, 2)]
    norm = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    improc = LlavaOnevisionImageProcessor(size={"height": side, "width": side}, image_grid_pinpoints=grid, **norm)
    vidproc = LlavaOnevisionVideoProcessor(size={"height": side, "width": side}, **norm)
    proc = LlavaOnevisionProcessor(image_processor=improc, video_processor=vidproc, tokenizer=tok,
                                   num_image_tokens=(side // patch) ** 2, vision_feature_select_strategy="full",
                                   chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE)
    cfg = LlavaOnevisionConfig(
        text_config=dict(model_type="qwen2", **_text_config(p, ids)),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=p["vision_hidden"],
                           intermediate_size=2 * p["vision_hidden"], num_hidden_layers=p["vision_depth"],
                           num_attention_heads=2, image_size=side, patch_size=patch, vision_use_head=False),
        image_token_index=ids["<image>"], video_token_index=ids["<video>"], image_grid_pinpoints=grid,
        vision_feature_select_strategy="full", vision_feature_layer=-1, vision_aspect_ratio="anyres_max_9",
        tie_word_embeddings=False, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    return LlavaOnevisionForConditionalGeneration(cfg), proc


_BUILDERS = {"qwen2_5_vl": _build_qwen2_5_vl, "internvl": _build_internvl, "llava_ov15": _build_llava_ov15,
             "qwen3_vl": _build_qwen3_vl, "llava_onevision": _build_llava_onevision}


def build_tiny_model(family: str, out_dir: str, *, seed: int = 0, preset: str = "tiny") -> str:
    """Build a random model of ``family`` and save it (weights, processor, chat template) to ``out_dir``.

    The folder is written to a temporary sibling and renamed, so a half-built model is
    never mistaken for a finished one. Returns ``out_dir``. For ``llava_ov15`` the folder
    also holds the model code (``modeling_tiny_ov15.py``) and an ``auto_map``, so it loads
    only with ``trust_remote_code=True``, like the hub model.
    """
    if family not in _BUILDERS:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(TINY_FAMILIES)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    compat.require_lane(family, family_lanes(family))       # e.g. Qwen3-VL needs transformers 5.x
    torch.manual_seed(seed)
    model, processor = _BUILDERS[family](PRESETS[preset])
    model.eval()
    remote_code = []
    if family == "llava_ov15":
        from .tiny_ov15 import modeling_tiny_ov15 as remote
        remote_code.append(remote.__file__)
    return save_model_folder(out_dir, model, processor,
                             {"family": family, "kind": TINY_RANDOM, "seed": seed, "preset": preset,
                              "note": "random weights built offline by ladbench demo-model; answers are meaningless"},
                             extra_files=remote_code)


def save_model_folder(out_dir: str, model: Any, processor: Any, metadata: dict[str, Any],
                      extra_files: Sequence[str] = ()) -> str:
    """Save a tiny model like a hub folder (weights, processor, chat template, ``extra_files``)
    plus its ``ladbench_tiny.json`` (``metadata``: what it is, how it was made). The folder is
    written to a temporary sibling and renamed over ``out_dir``, so a half-built model is never
    mistaken for a finished one. Returns ``out_dir`` as an absolute path."""
    out_dir = os.path.abspath(out_dir)
    tmp_dir = out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    model.save_pretrained(tmp_dir)
    processor.save_pretrained(tmp_dir)
    for path in extra_files:
        shutil.copy(path, os.path.join(tmp_dir, os.path.basename(path)))
    with open(os.path.join(tmp_dir, METADATA_FILE), "w", encoding="utf-8") as f:
        json.dump(metadata, f, indent=1)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp_dir, out_dir)
    return out_dir
