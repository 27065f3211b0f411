"""Start-up checks of each configured model, from its ``config.json``, before any job runs
(the workflow's :func:`ladbench.workflow.start` and ``ladbench where``).

A model is refused in one line naming its config key and the cause when ``family: auto``
refuses its architecture (what ``ladbench models`` lists as refused: images through
cross-attention, a processor that takes one image per prompt, ...), when its folder has no chat
template and the config gives none (``models.<name>.chat_template``; auto lays the prompt out
with the model's own), or when its layer range holds layers with a sliding window
(:mod:`ladbench.windows`) and ``lad.windowed_layers`` is ``refuse``. The family's lane is
checked before (:func:`ladbench.config.check_environment`).

Where the ``config.json`` is read from: a local folder, a tiny build already made, or a hub
model already in the local Hugging Face cache, always (no network). A hub model not in that
cache has its ``config.json`` alone (a few KB) fetched into the cache (:class:`HubFetch`) by
``ladbench where`` and by the workflow when a run starts jobs (its ``onstart``:
:func:`check_hub_models`); the model's download later reuses it, and the next start-up reads
it with no network. Not fetched: with ``HF_HUB_OFFLINE`` set (then a hub model must be in the
cache already), on a dry run (``snakemake -n`` reads the cache only: as cheap as without the
hub), in a cluster job (its Snakefile is read again; the run's start fetched already), and
after the hub failed to answer once (one request, :data:`HUB_TIMEOUT_S`, no retries): one
warning names the models left, which their infer job checks when it loads them, as it checks
every model. A tiny model not built yet is checked after its build, by its infer job.

It returns, for the console (the workflow prints them before any job runs; under Snakemake a
job's own output goes to its log only), the automatic changes the methods will make to a
readable model's layer range and K: a range clipped to the decoder's depth, windowed layers
left out, K lowered to the layers that remain.
"""
from __future__ import annotations

import os
from functools import partial
from typing import Any

from ladbench.config import ConfigError, hub_offline, layer_range_arg, model_layer_range
from ladbench.methods.kernels import _candidate_layers, effective_top_k
from ladbench.study_paths import StudyPaths
from ladbench.windows import (ATTENTION_LAYER_TYPES, compact, layer_windows, read_model_config, text_config,
                              windowed_range_problem)

#: seconds the start-up checks wait for the hub to answer a request (its one probe, each config.json)
HUB_TIMEOUT_S = 3


def check_models(config: dict, source: str = "config", fetch: bool = False) -> list[str]:
    """The checks above, for every model of ``config`` (validated); the console's warnings.
    ``fetch``: fetch the ``config.json`` of hub models not in the local cache (:class:`HubFetch`)."""
    warnings, paths = [], StudyPaths(config)
    hub = HubFetch() if fetch else None
    for name, model in config["models"].items():
        folder = paths.model_dir(name)
        fetch_one = partial(hub, name) if hub and not model["tiny"] else None
        try:
            model_config = read_model_config(folder, None if model["tiny"] else model.get("revision"), fetch_one)
        except ValueError as error:                  # not JSON (UnicodeDecodeError is one too)
            raise ConfigError(f"{source}: models.{name}: its config.json cannot be read ({error})") from None
        if model_config is None:
            continue
        if model["family"] == "auto":
            problem = auto_refusal(model_config, folder, paths.chat_template_file(name))
            if problem:
                raise ConfigError(f"{source}: models.{name}: {problem}")
        warnings += _range_warnings(name, model, model_config, config["lad"], source)
    return warnings + ([hub.warning()] if hub and hub.left else [])


def check_hub_models(config: dict, source: str = "config") -> list[str]:
    """:func:`check_models` of the hub models whose ``config.json`` is not in the local cache,
    fetched now (the workflow's start of a run: the others were checked when it read the config)."""
    missing = {name: model for name, model in config["models"].items()
               if not model["tiny"] and read_model_config(model["path"], model.get("revision")) is None}
    return check_models({**config, "models": missing}, source, fetch=True) if missing else []


class HubFetch:
    """Fetches hub models' ``config.json`` into the local Hugging Face cache, one at a time, until
    the hub fails to answer; ``left``: the models not fetched, and why (:meth:`warning`)."""

    def __init__(self) -> None:
        self.left: dict[str, str] = {}
        #: why nothing more is fetched (None: the hub has not failed yet)
        self.stopped: str | None = "HF_HUB_OFFLINE is set" if hub_offline() else None
        self._asked = False

    def __call__(self, name: str, repo_id: str, revision: str | None) -> str | None:
        """The fetched file of ``models.<name>`` (``repo_id`` at ``revision``), or None."""
        if self.stopped is None and not self._asked:
            self._asked = True
            self.stopped = hub_unreachable()       # one request: no retries of each download on a dead network
        if self.stopped is not None:
            self.left[name] = self.stopped
            return None
        try:
            return download_config(repo_id, revision)
        except Exception as error:                  # noqa: BLE001 (any failure leaves the check to the infer job)
            response = getattr(error, "response", None)
            if response is None:                    # no answer (a gated or missing repository has one): stop asking
                self.stopped = f"the hub stopped answering ({type(error).__name__})"
            status = f" {response.status_code}" if getattr(response, "status_code", None) else ""
            self.left[name] = f"{repo_id} at {revision or 'main'}: {type(error).__name__}{status}"
            return None

    def warning(self) -> str:
        """One line naming the models left to be checked when their infer job loads them."""
        causes = list(dict.fromkeys(self.left.values()))
        return (f"{', '.join(f'models.{name}' for name in self.left)}: config.json not fetched from the hub "
                f"({'; '.join(causes)}): checked when their infer job loads them, not at start-up")


def hub_unreachable() -> str | None:
    """Why the hub cannot be reached (one HEAD request, no retries, :data:`HUB_TIMEOUT_S`), or None.
    Through huggingface_hub's own session: its proxies and endpoint (``HF_ENDPOINT``)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session
    try:
        get_session().head(constants.ENDPOINT, timeout=HUB_TIMEOUT_S)
    except Exception as error:                      # noqa: BLE001 (no DNS, no route, a timeout, a proxy's refusal)
        return f"no answer from {constants.ENDPOINT} within {HUB_TIMEOUT_S} s: {type(error).__name__}"
    return None


def download_config(repo_id: str, revision: str | None) -> str:
    """``config.json`` of ``repo_id`` at ``revision``, downloaded into the local Hugging Face
    cache (where the model's download finds it); its path."""
    from huggingface_hub import hf_hub_download
    return hf_hub_download(repo_id, "config.json", revision=revision, etag_timeout=HUB_TIMEOUT_S)


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
