"""Start-up checks of each configured model, from its ``config.json``, before any job runs
(the workflow's :func:`ladbench.workflow.start` and ``ladbench where``).

Where the model's ``config.json`` is on this machine (a local folder, a tiny build already
made, or a hub model already in the local Hugging Face cache), a model is refused in one line
naming its config key and the cause when ``family: auto`` refuses its architecture (what
``ladbench models`` lists as refused), when its folder has no chat template and the config
gives none (``models.<name>.chat_template``; auto lays the prompt out with the model's own), or
when its layer range holds layers with a sliding window
(:mod:`ladbench.windows`) and ``lad.windowed_layers`` is ``refuse``. A model whose
``config.json`` is not here yet (a hub id not downloaded, a tiny model not built) is checked
when its infer job loads it, as every model is. The family's lane is checked before
(:func:`ladbench.config.check_environment`).

It returns, for the console (the workflow prints them before any job runs; under Snakemake a
job's own output goes to its log only), the automatic changes the methods will make to a
readable model's layer range and K: a range clipped to the decoder's depth, windowed layers
left out, K lowered to the layers that remain.
"""
from __future__ import annotations

import os
from typing import Any

from ladbench.config import ConfigError, layer_range_arg, model_layer_range
from ladbench.methods.kernels import _candidate_layers, effective_top_k
from ladbench.study_paths import StudyPaths
from ladbench.windows import (ATTENTION_LAYER_TYPES, compact, layer_windows, read_model_config, text_config,
                              windowed_range_problem)



def check_models(config: dict, source: str = "config") -> list[str]:
    """The checks above, for every model of ``config`` (validated); the console's warnings."""
    warnings, paths = [], StudyPaths(config)
    for name, model in config["models"].items():
        folder = paths.model_dir(name)
        try:
            model_config = read_model_config(folder, None if model["tiny"] else model.get("revision"))
        except ValueError as error:                  # not JSON (UnicodeDecodeError is one too)
            raise ConfigError(f"{source}: models.{name}: its config.json cannot be read ({error})") from None
        if model_config is None:
            continue
        if model["family"] == "auto":
            problem = auto_refusal(model_config, folder, paths.chat_template_file(name))
            if problem:
                raise ConfigError(f"{source}: models.{name}: {problem}")
        warnings += _range_warnings(name, model, model_config, config["lad"], source)
    return warnings


def auto_refusal(model_config: dict[str, Any], folder: str, given_template: str | None = None) -> str | None:
    """Why ``family: auto`` refuses this model, from its config (and its folder when local, unless
    the study's config gives its chat template: ``given_template``), or None."""
    from ladbench.models.auto import architecture_refusal

    model_type = model_config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return "family auto cannot run it: its config.json names no model_type"
    reason = architecture_refusal(model_type)
    if not reason and not given_template and os.path.isdir(os.path.expanduser(folder)) and not has_chat_template(folder):
        reason = ("no chat template (the prompt is laid out by the model's own; add one to the folder, or give one "
                  "as models.<name>.chat_template)")
    return f"family auto cannot run architecture {model_type!r}: {reason}" if reason else None


def has_chat_template(folder: str) -> bool:
    """Whether a local model folder holds a chat template (its own file, or a processor's or
    tokenizer's config key: ``models.folder.CHAT_TEMPLATE_FILES``)."""
    from ladbench.models.folder import chat_template_file
    folder = os.path.expanduser(folder)
    return chat_template_file(folder) != folder


def _range_warnings(name: str, model: dict, model_config: dict, lad: dict, source: str) -> list[str]:
    """Refuse a given layer range with windowed layers (unless lad.windowed_layers: unseen); the
    automatic changes the methods will make to the range and to K, as warnings. (A hybrid
    decoder's cache holds its attention layers only: its range is read when it is loaded.)"""
    if not all(kind in ATTENTION_LAYER_TYPES for kind in text_config(model_config).get("layer_types") or ()):
        return []
    windows = layer_windows(model_config)
    layer_range = model_layer_range(model)
    if not windows:
        return []
    in_range = _candidate_layers(len(windows), layer_range).tolist()
    shown = layer_range_arg(layer_range)
    warnings = []
    if layer_range is not None and len(layer_range) == 2 and layer_range[1] >= len(windows) \
            and lad["layers_beyond_depth"] == "clip":
        warnings.append(f"models.{name}: its layer range {shown} runs past its {len(windows)} decoder layers: LAD "
                        f"searches layers {compact(in_range)}")
    problem = windowed_range_problem(windows, in_range)
    if problem and "layer_range" in model and lad["windowed_layers"] == "refuse":
        raise ConfigError(f"{source}: models.{name}.layer_range: {problem}")
    seen = [layer for layer in in_range if not windows[layer]]
    if not seen:
        raise ConfigError(f"{source}: models.{name}: every layer of its layer range {shown} has a sliding window; "
                          f"give models.{name}.layer_range with layers without one (docs/method.md, 'Windowed layers')")
    if problem:
        warnings.append(f"models.{name}: layers {compact([layer for layer in in_range if windows[layer]])} of its layer range "
                        f"{shown} have a sliding window: LAD reads layers {compact(seen)} only (docs/method.md, "
                        "'Windowed layers')")
    try:
        k = effective_top_k(lad["top_k"], len(seen), lad["k_beyond_range"], layer_range)
    except ValueError as error:
        raise ConfigError(f"{source}: models.{name}: {error}") from None
    if k < lad["top_k"]:
        warnings.append(f"models.{name}: lad.top_k = {lad['top_k']} lowered to {k}, the layers LAD reads in its range")
    return warnings
