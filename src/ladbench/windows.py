"""Sliding-window attention, read from a model's ``config.json`` without loading it (the
workflow's start-up checks use it too), and the layers LAD may read because of it.

A decoder layer with a sliding window of ``w`` tokens lets the last query see only the last
``w`` keys: in a prompt longer than that, the first images lie partly or wholly outside it and
their attention mass there is zero by construction, not by the model's choice (Gemma 3: five
layers of window 1,024 per global layer; an N = 4 prompt of 256-token images is about 1,150
tokens). The rule (docs/method.md, "Windowed layers"): a layer with a window counts as one
where the last token may not see every image; LAD's default layer range keeps only the layers
without one (:func:`unseen_layers`); a given range that holds windowed layers is refused
(:func:`windowed_range_problem`) unless ``lad.windowed_layers: unseen``, which runs it with those
layers left out of the selection, as unseen.

The window of each layer comes from the text config: ``layer_types`` (``sliding_attention``
/ ``full_attention``, transformers 5.x) with ``sliding_window``; else Gemma 3's older
``sliding_window_pattern`` (every p-th layer global); else ``sliding_window`` on every layer
unless ``use_sliding_window`` is false (Qwen2). transformers' config class fills what the file
omits (Mistral's default window 4,096) where the installed transformers knows the architecture;
it is not asked where the file alone says that no layer has a window (the demo's models, Qwen2's
``use_sliding_window: false``), since importing it imports torch, seconds at every start.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping, Sequence

#: what the file's ``layer_types`` calls a windowed layer
SLIDING_LAYER_TYPES = ("sliding_attention", "chunked_attention")
#: layers whose window covers generated tokens only, the prompt always seen whole (Unlimited-OCR):
#: for the readout (the last prompt token's attention) they have none
PROMPT_WHOLE_LAYER_TYPES = ("reference_sliding_attention",)
#: the ``layer_types`` of layers with self-attention (others: linear attention, convolution)
ATTENTION_LAYER_TYPES = ("full_attention",) + PROMPT_WHOLE_LAYER_TYPES + SLIDING_LAYER_TYPES


#: where a multimodal config.json keeps its text decoder's config
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text decoder's part of a (multimodal) config.json (the config itself when it has none)."""
    return next((config[k] for k in TEXT_CONFIG_KEYS if isinstance(config.get(k), dict)), config)


def layer_windows(config: Mapping[str, Any]) -> list[int]:
    """The sliding window of each decoder layer (0: none, the layer sees the whole prompt)."""
    text = _with_class_defaults(text_config(config))
    n_layers = int(text.get("num_hidden_layers") or 0)
    window = text.get("sliding_window")
    if not window or text.get("use_sliding_window") is False:
        return [0] * n_layers
    window = int(window)
    types = text.get("layer_types")
    if types:
        return [window if kind in SLIDING_LAYER_TYPES else 0 for kind in types]
    pattern = text.get("sliding_window_pattern")
    if pattern:
        return [0 if (i + 1) % int(pattern) == 0 else window for i in range(n_layers)]
    return [window] * n_layers


def _with_class_defaults(text: Mapping[str, Any]) -> Mapping[str, Any]:
    """``text`` with what transformers' config class of its model type adds (a window the file
    omits, ``layer_types`` computed from older keys); the file alone where it settles every
    layer's window itself, or where the installed transformers does not know the type."""
    model_type = text.get("model_type")
    if not model_type or _settled_by_the_file(text):
        return text
    keys = ("num_hidden_layers", "sliding_window", "layer_types", "sliding_window_pattern", "use_sliding_window")
    try:
        from transformers import AutoConfig
        resolved = AutoConfig.for_model(model_type, **{k: v for k, v in text.items() if k != "model_type"})
        # (a per-layer config refuses a global read of its window with an error of its own)
        return {**text, **{key: getattr(resolved, key) for key in keys if hasattr(resolved, key)}}
    except Exception:                  # noqa: BLE001 (an unknown type or an older lane: the file as written)
        return text


def _settled_by_the_file(text: Mapping[str, Any]) -> bool:
    """Whether ``text`` alone says that no layer has a window, whatever its config class would
    add: the depth given, and windows switched off or ``layer_types`` given without a windowed
    layer. (A window given as none is not enough: a class may set its own in its place.) Then
    transformers, and torch with it, need not be imported: about 5 s that every Snakemake start
    would pay, each SLURM job's two included."""
    if "num_hidden_layers" not in text:
        return False
    types = text.get("layer_types")
    return text.get("use_sliding_window") is False or (bool(types) and not any(kind in SLIDING_LAYER_TYPES
                                                                                 for kind in types))


def windowed(windows: Sequence[int]) -> list[int]:
    """The layers (indices into ``windows``) that have a sliding window."""
    return [i for i, w in enumerate(windows) if w]


def unseen_layers(windows: Sequence[int] | None) -> tuple[int, ...]:
    """The layers LAD leaves out of its selection: those with a sliding window (the rule above)."""
    return tuple(windowed(windows or ()))


def windowed_range_problem(windows: Sequence[int], candidates: Sequence[int]) -> str | None:
    """Why a given layer range may not be read (its windowed layers, named), or None."""
    inside = [layer for layer in candidates if 0 <= layer < len(windows) and windows[layer]]
    if not inside:
        return None
    sizes = sorted({windows[layer] for layer in inside})
    return (f"layers {compact(inside)} of the range have a sliding window of {'/'.join(map(str, sizes))} tokens: the "
            "last token may not see every image there (docs/method.md, 'Windowed layers'); choose layers without a "
            "window, or set lad.windowed_layers: unseen to leave them out as unseen")


def compact(layers: Sequence[int]) -> str:
    """``[20, 21, 22, 24]`` -> ``"20-22, 24"``."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def read_model_config(path: str, revision: str | None = None,
                      fetch: Callable[[str, str | None], str | None] | None = None) -> dict[str, Any] | None:
    """A model's ``config.json``: from its folder, or from the local Hugging Face cache for a hub
    id, else from what ``fetch(hub_id, revision)`` returns (the file, or None); None when there is
    none (a hub model not downloaded yet, not fetched: checked when infer loads it)."""
    folder = os.path.expanduser(path)
    if os.path.isdir(folder):
        file = os.path.join(folder, "config.json")
        if not os.path.isfile(file):
            return None
    else:
        try:
            from huggingface_hub import try_to_load_from_cache
            file = try_to_load_from_cache(path, "config.json", revision=revision)
        except Exception:              # noqa: BLE001 (not a valid hub id: the path checks say so)
            return None
        if not isinstance(file, str):
            file = fetch(path, revision) if fetch else None
            if file is None:
                return None
    with open(file, encoding="utf-8") as f:
        return json.load(f)
