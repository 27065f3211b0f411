"""The flags of the settings carriers (:mod:`ladbench.settings`), generated from their fields
(:func:`add_arguments`) and read back into them (:func:`from_args`), and those shared by the
stages that run methods on a cache (evaluate, analyze): :class:`ladbench.methods.LadSettings`,
:class:`ladbench.methods.ReadoutSettings` and :class:`ladbench.metrics.Bootstrap`."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any, Mapping

from ladbench.families import layer_range_for
from ladbench.methods import LadSettings, MethodSettings, ReadoutSettings
from ladbench.metrics import Bootstrap
from ladbench.settings import config_key, is_sequence, kind, option_name, plain, setting_fields
from ladbench.windows import unseen_layers


def add_arguments(parser, cls: type, prefix: str = "", unset: bool = False, **flag_defaults: Any) -> None:
    """One flag per field of ``cls`` (``--<prefix><key>``, read into ``<prefix><name>``), with the
    field's default, type, choices and help, listed under its ``group`` (the parser's section of
    that title, made if missing); ``flag_defaults`` replace a flag's default (e.g. None: "decided
    later"); ``unset``: every flag's default is None (a flag not given leaves the field to whoever
    reads it: a prompt variant's settings)."""
    for f in setting_fields(cls):
        if not f.metadata["flag"]:
            continue
        target = argument_section(parser, f.metadata.get("group"))
        name = f"--{(prefix + option_name(f)).replace('_', '-')}"
        default = None if unset else flag_defaults.get(f.name, f.default)
        shown = f" (default {_shown(f.default)})" if f.name not in flag_defaults and f.default is not None else ""
        options: dict[str, Any] = {"dest": prefix + f.name, "help": f"{f.metadata['help']}{shown}"}
        if kind(f) is bool and not is_sequence(f):
            target.add_argument(name, action=argparse.BooleanOptionalAction, default=default, **options)
            continue
        if f.metadata.get("choices") is not None:
            options["choices"] = f.metadata["choices"]
        if is_sequence(f):
            options["nargs"] = "+"
            default = plain(default)
        target.add_argument(name, type=kind(f), default=default, **options)


def seed(text: str) -> int:
    """An argparse ``type`` for a seed: a non-negative integer (numpy's generators take no other);
    argparse's error names the flag."""
    value = int(text)                     # a ValueError: argparse's "invalid seed value"
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed is a non-negative integer, got {value}")
    return value


def argument_section(parser, title: str | None):
    """The parser's argument group called ``title`` (made if missing); the parser itself for None."""
    if title is None:
        return parser
    for group in getattr(parser, "_action_groups", ()):     # argparse keeps its sections there
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def from_args(cls: type, args: argparse.Namespace, **values: Any) -> Any:
    """``cls`` from the flags of :func:`add_arguments` and from the command's own flags of its
    other fields (the same name: InferenceSettings' inputs); ``values`` are given by the caller
    (settings without a flag, or flags whose meaning depends on the inputs)."""
    flagged = {f.name for f in setting_fields(cls) if f.metadata["flag"]}
    inputs = {f.name for f in fields(cls) if hasattr(args, f.name)} - {f.name for f in setting_fields(cls)}
    given = {name: getattr(args, name) for name in flagged | inputs if name not in values}
    given = {name: tuple(value) if isinstance(value, list) else value for name, value in given.items()}
    try:
        return cls(**given, **values)
    except ValueError as error:          # a field's check names its config key: name its flag here
        flag = next((option_name(f) for f in setting_fields(cls)
                     if f.name in given and f.metadata["flag"] and str(error).startswith(f"{config_key(f)} ")), None)
        if flag is None:
            raise
        raise ValueError(f"--{flag.replace('_', '-')}: {error}") from None


def add_method_arguments(group) -> None:
    """LAD's test-time settings (``lad.*`` and ``models.*.layer_range`` in the config) and the readouts'."""
    add_arguments(group, LadSettings, layer_range=None)      # no --layer-range: the cache's model family's
    add_arguments(group, ReadoutSettings)


def add_bootstrap_arguments(group) -> None:
    add_arguments(group, Bootstrap)


def bootstrap_settings(args: argparse.Namespace) -> Bootstrap:
    return from_args(Bootstrap, args)


def method_settings(args: argparse.Namespace, cache_attrs: Mapping[str, Any]) -> MethodSettings:
    """The flags' settings; without --layer-range, the default of the cache's model family. The
    layers with a sliding window (the cache's ``attention_windows``) are left out as unseen."""
    layer_range = layer_range_for(cache_attrs.get("family"), args.layer_range)
    unseen = unseen_layers(cache_attrs.get("attention_windows"))
    return MethodSettings(from_args(LadSettings, args, layer_range=layer_range, unseen_layers=unseen),
                          from_args(ReadoutSettings, args))
