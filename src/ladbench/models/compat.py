"""The one place that knows which transformers lane is installed, and what differs.

ladbench runs on two lanes (README "Which lane for what"), each with its own lock file:

* paper lane, transformers 4.53 (``requirements-lock.txt``): reproduces the published
  numbers;
* current lane, transformers 5.x (``requirements-current.txt``): today's models.

Adapters and the tiny builds ask this module instead of testing versions themselves, so
every version difference the code knows about is listed here.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any, Iterator

import transformers

from ladbench import families

#: major version of the installed transformers (4: paper lane, 5: current lane)
TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])
#: the lane this interpreter runs
LANE = "current" if TRANSFORMERS_MAJOR >= 5 else "paper"


def on_current_lane() -> bool:
    return LANE == "current"


def dtype_kwarg(dtype: Any) -> dict[str, Any]:
    """``from_pretrained`` keyword for the weight dtype: ``torch_dtype`` became ``dtype`` in 5.x."""
    return {"dtype": dtype} if on_current_lane() else {"torch_dtype": dtype}


#: forward keywords 4.53's Qwen-VL / decoder models take that 5.x's no longer accept or need
#: (``cache_position`` was removed; Qwen2.5-VL's ``rope_deltas`` is no longer a forward input)
_REMOVED_FORWARD_KWARGS = ("cache_position", "rope_deltas")


def forward_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for a base-model forward call, without the keywords this lane does not take."""
    if not on_current_lane():
        return kwargs
    return {k: v for k, v in kwargs.items() if k not in _REMOVED_FORWARD_KWARGS}


def crop_cache(cache: Any, length: int) -> None:
    """Cut a KV cache back to its first ``length`` positions (4.53's ``crop`` takes the length to
    keep; 5.x's takes minus the number of positions to remove)."""
    cache.crop(length - cache.get_seq_length() if on_current_lane() else length)


@contextlib.contextmanager
def cache_rollback(cache: Any, length: int) -> Iterator[None]:
    """Run continuation steps on a prefill's KV cache, then put it back to its first ``length``
    positions: cropped (5.x: sliding-window and convolution layers record what they would drop,
    so the crop can undo it) and with the recurrent states of linear-attention layers, which no
    crop can undo, restored from a copy."""
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    layers = getattr(cache, "layers", None) or []
    saved = {i: {k: v.clone() for k, v in layer.recurrent_states.items() if v is not None}
             for i, layer in enumerate(layers) if getattr(layer, "recurrent_states", None)}
    try:
        yield
    finally:
        crop_cache(cache, length)
        for i, states in saved.items():
            layers[i].recurrent_states.update(states)


def plain_kv(cache: Any) -> list[list[Any]] | None:
    """Each layer's ``[keys, values]`` ([B, H, T, D]) of a KV cache whose every layer is a plain
    full-attention layer (4.53: a ``DynamicCache``; 5.x: ``DynamicLayer``s), which the decode loop
    may cut, repeat and join along the batch; None for any other cache (sliding-window,
    linear-attention or static layers keep state a batch join would have to know about)."""
    if on_current_lane():
        layers = getattr(cache, "layers", None) or []
        if not layers or any(type(layer).__name__ != "DynamicLayer" or not layer.is_initialized for layer in layers):
            return None
        return [[layer.keys, layer.values] for layer in layers]
    if type(cache).__name__ != "DynamicCache" or not len(cache.key_cache):
        return None
    return [[k, v] for k, v in zip(cache.key_cache, cache.value_cache)]


def set_plain_kv(cache: Any, kv: list[list[Any]]) -> None:
    """Put ``kv`` (what :func:`plain_kv` returned, cut or joined) back into ``cache``."""
    if on_current_lane():
        for layer, (keys, values) in zip(cache.layers, kv):
            layer.keys, layer.values = keys, values
        return
    cache.key_cache, cache.value_cache = [k for k, _ in kv], [v for _, v in kv]
    cache._seen_tokens = int(kv[0][0].shape[-2])


def new_plain_cache(kv: list[list[Any]]) -> Any:
    """A ``DynamicCache`` holding ``kv`` (each layer's ``[keys, values]``, full attention)."""
    from transformers import DynamicCache
    if on_current_lane():
        return DynamicCache(ddp_cache_data=[(keys, values) for keys, values in kv])
    cache = DynamicCache()
    set_plain_kv(cache, kv)
    return cache


def new_ring_cache(kv: list[list[Any]], column: Any) -> Any:
    """A cache over preallocated per-layer ``[keys, values]`` buffers ([S, H, C, D], full attention)
    that writes each decode step's one new position at the device tensor ``column`` ([1], the
    same for every slot; advanced by the caller) and hands the attention the whole buffers: the
    static-shape store of the decode loop (``inference/decode.Ring``), which masks what each slot
    holds itself. Nothing in it depends on the sequence length, so a step can be compiled and
    captured in a CUDA graph (the buffers are marked as static addresses)."""
    import torch
    for keys, values in kv:
        torch._dynamo.mark_static_address(keys)
        torch._dynamo.mark_static_address(values)
    if on_current_lane():
        from transformers.cache_utils import Cache, StaticLayer

        class RingLayer(StaticLayer):
            def __init__(self, keys: Any, values: Any) -> None:
                super().__init__(max_cache_len=keys.shape[-2])
                self.keys, self.values, self.is_initialized = keys, values, True
                self.dtype, self.device = keys.dtype, keys.device

            def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
                self.keys.index_copy_(2, column, key_states)
                self.values.index_copy_(2, column, value_states)
                return self.keys, self.values

            def get_seq_length(self) -> int:      # positions and the 4-D mask are given: unused
                return 0
        return Cache(layers=[RingLayer(keys, values) for keys, values in kv])

    from transformers.cache_utils import Cache

    class RingCache(Cache):
        is_compileable = True

        def update(self, key_states: Any, value_states: Any, layer_idx: int, cache_kwargs: Any = None) -> tuple[Any, Any]:
            keys, values = kv[layer_idx]
            keys.index_copy_(2, column, key_states)
            values.index_copy_(2, column, value_states)
            return keys, values

        def get_seq_length(self, layer_idx: int | None = 0) -> int:
            return 0

        def get_max_cache_shape(self) -> int:
            return int(kv[0][0].shape[-2])
    return RingCache()


def new_slab_cache(slab: Any) -> Any:
    """A cache over the decode loop's :class:`~ladbench.inference.decode.Slab` (its sequences in
    flight in preallocated per-layer buffers): each layer's update writes the step's one new
    position through ``slab.append(layer, keys, values)`` and hands the attention what that returns
    (views of the buffers, every position of the flight); the loop gives the 4-D mask and the
    positions itself, so the length reported is the flight's width only for form's sake."""
    from transformers.cache_utils import Cache
    if on_current_lane():
        from transformers.cache_utils import DynamicLayer

        class SlabLayer(DynamicLayer):
            def __init__(self, layer: int) -> None:
                super().__init__()
                self.layer, self.is_initialized = layer, True
                self.dtype, self.device = slab.kv[layer][0].dtype, slab.kv[layer][0].device

            def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
                return slab.append(self.layer, key_states, value_states)

            def get_seq_length(self) -> int:
                return slab.width
        return Cache(layers=[SlabLayer(layer) for layer in range(len(slab.kv))])

    class SlabCache(Cache):
        def update(self, key_states: Any, value_states: Any, layer_idx: int, cache_kwargs: Any = None) -> tuple[Any, Any]:
            return slab.append(layer_idx, key_states, value_states)

        def get_seq_length(self, layer_idx: int | None = 0) -> int:
            return slab.width

        def get_max_cache_shape(self) -> None:
            return None
    return SlabCache()


def qwen_vl_rope_index(base_model: Any, inputs: dict[str, Any]) -> tuple[Any, Any]:
    """Qwen2.5-VL's M-RoPE ``(position_ids [3, B, T], rope_deltas [B, 1])`` for a prefill, computed
    by the model's own ``get_rope_index`` (5.x takes the processor's ``mm_token_type_ids``)."""
    if on_current_lane():
        return base_model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                         image_grid_thw=inputs.get("image_grid_thw"),
                                         attention_mask=inputs["attention_mask"])
    return base_model.get_rope_index(inputs["input_ids"], inputs.get("image_grid_thw"), None,
                                     attention_mask=inputs["attention_mask"])


def qwen_vl_padded_rope_deltas(rope_deltas: Any, attention_mask: Any) -> Any:
    """Qwen2.5-VL's ``rope_deltas`` [B, 1] relative to the PADDED prompt length (4.53's convention:
    next position = padded length + delta). 5.x counts from the real tokens of each row instead
    (next position = real length + delta), which differs by the row's left padding."""
    if not on_current_lane():
        return rope_deltas
    padding = attention_mask.shape[-1] - attention_mask.long().sum(-1, keepdim=True)
    return rope_deltas.to(padding.device) - padding


def image_features_tensor(out: Any) -> Any:
    """What a base model's ``get_image_features`` returns, as the features tensor (5.x returns the
    tower's output with the projected features as its ``pooler_output``)."""
    return out.pooler_output if hasattr(out, "pooler_output") else out


def batched_vision_supported() -> bool:
    """Our batched Qwen2.5-VL vision tower (models/vision.py) is written against 4.53's tower
    (``get_window_index`` / ``rot_pos_emb``); 5.x restructured the tower (module-level window and
    rotary helpers, a model output with ``pooler_output``), so the current lane runs the native one."""
    return not on_current_lane()


def bpe_tokenizer(tokenizer_class: Any, vocab: dict[str, int], merges: list[str], **kwargs: Any) -> Any:
    """A byte-level BPE tokenizer of ``tokenizer_class`` from an in-memory vocab and merges
    (4.53's fast classes convert from vocab/merges FILES; 5.x's take the vocab and merge pairs)."""
    if on_current_lane():
        return tokenizer_class(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], **kwargs)
    import json
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file, merges_file = os.path.join(tmp, "vocab.json"), os.path.join(tmp, "merges.txt")
        with open(vocab_file, "w", encoding="utf-8") as f:
            json.dump(vocab, f, ensure_ascii=False)
        with open(merges_file, "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "".join(m + "\n" for m in merges))
        return tokenizer_class(vocab_file=vocab_file, merges_file=merges_file, **kwargs)


def require_lane(family: str, lanes: tuple[str, ...]) -> None:
    """One-line start-up error when ``family`` does not run on the installed lane."""
    if LANE not in lanes:
        venv = families.lane_venv(lanes)
        raise families.LaneError(f"model family {family!r} runs only on the {' / '.join(lanes)} lane, not on this "
                           f"{LANE} lane (transformers {transformers.__version__}): run it from {venv}")


def bound_chat_templates(bounded: Any) -> None:
    """Make transformers compile every chat template through ``bounded(model, source)``, where
    ``model`` is an empty template of transformers' own environment (both lanes compile through
    ``chat_template_utils._compile_jinja_template``, looked up at each render); idempotent."""
    from functools import lru_cache

    from transformers.utils import chat_template_utils

    original = chat_template_utils._compile_jinja_template
    if getattr(original, "ladbench_bounded", False):
        return

    @lru_cache
    def compile_bounded(chat_template: str) -> Any:
        return bounded(original(""), chat_template)

    compile_bounded.ladbench_bounded = True
    compile_bounded.original = original          # transformers' own, for comparisons
    chat_template_utils._compile_jinja_template = compile_bounded
