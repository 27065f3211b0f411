"""Settings carriers: one frozen dataclass per section of settings, whose fields state each
setting once: its default, type, allowed values, bounds and help text.

Everything else derives from the fields, so that a new setting is one field:

- the command's flags (:func:`ladbench.stages.options.add_arguments`, read back by
  :func:`~ladbench.stages.options.from_args`);
- the config schema's block for the section (:func:`schema_properties`, filled into the
  schema's blocks marked ``x-settings`` by :func:`ladbench.config.load_schema`);
- the workflow's hand-over of the config's values to the command (:func:`command_options`);
- the validation, in the dataclass (:meth:`Settings.__post_init__`), which the config's
  check calls per key (:func:`check_section`).

A field's config key and flag are its name (``top_k``: ``lad.top_k``, ``--top-k``) unless
``key`` says otherwise (``option``: the flag's, where the two differ); ``config=False`` keeps
it out of the config's section (a setting given elsewhere, such as a model's layer range),
``flag=False`` off the command line (a setting that only the code varies, such as an
ablation's switch).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import MISSING, field, fields
from typing import Any, ClassVar, Iterator, Mapping

__all__ = ["Settings", "carrier_name", "check_section", "command_options", "config_key", "is_sequence", "kind",
           "option_name", "plain", "schema_properties", "setting", "setting_defaults", "setting_fields"]

_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def setting(default: Any, help: str, *, choices: tuple | None = None, pattern: str | None = None,
            minimum: float | None = None, maximum: float | None = None, above: float | None = None,
            below: float | None = None, kind: type | None = None, key: str | None = None, option: str | None = None,
            config: bool = True, flag: bool = True, group: str | None = None, **extra: Any) -> Any:
    """A field of a settings dataclass: its ``default`` (None: unset, no default in the schema)
    and ``help``; the ``choices`` it allows, or the regular expression ``pattern`` its text matches;
    its bounds (``minimum``/``maximum`` inclusive, ``above``/``below`` exclusive); ``kind``, the
    type of its value or, for a tuple, of its items (default: the default's); ``key``, its config
    key and flag name when not the field's name (``option``: the flag's name where it is not the
    config key); whether it is a key of the config's section (``config``) and a flag (``flag``);
    ``group``, the title of the command's help section its flag is listed under. ``extra`` is kept
    in the metadata (e.g. ``hashed``)."""
    metadata = {"help": help, "choices": choices, "pattern": pattern, "minimum": minimum, "maximum": maximum,
                "above": above, "below": below, "kind": kind, "key": key, "option": option, "config": config,
                "flag": flag, "group": group, **extra}
    return field(default=default, metadata=metadata)


class Settings:
    """Base of a settings dataclass: ``section`` is its block of the config (``lad``,
    ``evaluation``...); construction checks every field's choices and bounds."""

    section: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for f in setting_fields(type(self)):
            _check_value(f, getattr(self, f.name))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: tuples as lists."""
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}


def plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def setting_fields(cls: type) -> Iterator[dataclasses.Field]:
    """The fields of ``cls`` made by :func:`setting`."""
    return (f for f in fields(cls) if "help" in f.metadata)


def setting_defaults(cls: type) -> dict[str, Any]:
    """The defaults of ``cls``'s settings (fields made by :func:`setting`), by field name; a
    field without one is left out."""
    return {f.name: f.default for f in setting_fields(cls) if f.default is not MISSING}


def config_key(f: dataclasses.Field) -> str:
    return f.metadata.get("key") or f.name


def option_name(f: dataclasses.Field) -> str:
    """The flag's name (``--<name>`` with dashes): the config key unless ``option`` says otherwise."""
    return f.metadata.get("option") or config_key(f)


def kind(f: dataclasses.Field) -> type:
    """The type of the field's value (of its items for a tuple)."""
    if f.metadata.get("kind"):
        return f.metadata["kind"]
    default = f.default
    if isinstance(default, tuple):
        return type(default[0]) if default else str
    return type(default)


def is_sequence(f: dataclasses.Field) -> bool:
    return isinstance(f.default, tuple)


def _check_value(f: dataclasses.Field, value: Any) -> None:
    """The field's choices and bounds, for one value or each item of a tuple."""
    meta = f.metadata
    for item in (value if isinstance(value, (tuple, list)) else (value,)):
        if item is None:
            continue
        if meta.get("choices") is not None and item not in meta["choices"]:
            raise ValueError(f"{config_key(f)} must be one of {tuple(meta['choices'])}, got {item!r}")
        if meta.get("pattern") is not None and not re.fullmatch(meta["pattern"], str(item)):
            raise ValueError(f"{config_key(f)} must match {meta['pattern']}, got {item!r}")
        bounds = [(meta.get("minimum"), ">=", lambda v, b: v >= b), (meta.get("maximum"), "<=", lambda v, b: v <= b),
                  (meta.get("above"), ">", lambda v, b: v > b), (meta.get("below"), "<", lambda v, b: v < b)]
        for bound, sign, holds in bounds:
            if bound is not None and not holds(item, bound):
                must = "finite" if bound == float("inf") else f"{sign} {bound:,}"
                raise ValueError(f"{config_key(f)} must be {must}, got {item}")


# --------------------------------------------------------------------------- the config


def schema_properties(cls: type, defaults: bool = True) -> dict[str, dict]:
    """The config schema's properties of ``cls``'s section (type, allowed values, default and
    description per key); the bounds are checked by the dataclass (:func:`check_section`).
    ``defaults=False`` leaves the defaults out (the code's then apply: the config is not filled)."""
    properties = {}
    for f in setting_fields(cls):
        if not f.metadata["config"]:
            continue
        item: dict[str, Any] = {"type": _JSON_TYPES[kind(f)]}
        if f.metadata.get("choices") is not None:
            item["enum"] = list(f.metadata["choices"])
        if f.metadata.get("pattern") is not None:
            item["pattern"] = f"^(?:{f.metadata['pattern']})$"
        entry = {"type": "array", "items": item, "minItems": 1} if is_sequence(f) else dict(item)
        if defaults and f.default not in (MISSING, None):
            entry["default"] = plain(f.default)
        entry["description"] = f.metadata["help"]
        properties[config_key(f)] = entry
    return properties


def check_section(cls: type, values: Mapping[str, Any], where: str) -> None:
    """Each of ``values`` (a config section) that ``cls`` carries, checked by ``cls`` alone;
    a ValueError names ``<where>.<key>``."""
    # a carrier that also holds required inputs (InferenceSettings) cannot be made from one
    # setting: its fields' own checks stand alone there
    whole = all(f.default is not MISSING or f.default_factory is not MISSING for f in fields(cls))
    for f in setting_fields(cls):
        key = config_key(f)
        if key in values:
            value = values[key]
            try:
                if whole:
                    cls(**{f.name: tuple(value) if isinstance(value, list) else value})
                else:
                    _check_value(f, value)
            except ValueError as error:
                raise ValueError(f"{where}.{key}: {error}") from None


def carrier_name(cls: type) -> str:
    """``module:Class``, as a schema's ``x-settings`` names a carrier."""
    return f"{cls.__module__}:{cls.__qualname__}"


def command_options(cls: type, values: Mapping[str, Any], **given: Any) -> dict[str, Any]:
    """The config section's values of ``cls``'s keys as a command's options, keyed by flag name
    (the workflow writes them as ``--<key> <value>``), in the fields' order; ``given`` adds the
    values of fields the section does not hold (``config=False``), in their place. A switch at
    its default True is left out (the flag's default says it); set to False, its ``--no-`` form."""
    options = {}
    for f in setting_fields(cls):
        key = config_key(f)
        if f.name in given:
            options[option_name(f)] = given[f.name]
            continue
        if not (f.metadata["config"] and f.metadata["flag"] and key in values):
            continue
        if f.default is True and values[key] in (True, False):
            if values[key] is False:
                options[f"no_{option_name(f)}"] = True          # the flag's negative form (--no-<key>)
        else:
            options[option_name(f)] = values[key]
    unknown = set(given) - {f.name for f in setting_fields(cls)}
    if unknown:
        raise TypeError(f"{cls.__name__} has no settings {sorted(unknown)}")
    return options
