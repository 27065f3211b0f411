"""Study configuration: load a YAML file, fill defaults and validate it against the schema.

The schema (``workflow/schemas/config.schema.yaml``) is the single description of every
key. Validation fills defaults in place (like ``snakemake.utils.validate``) and turns the
first schema violation into a :class:`ConfigError` that names the offending key path and
the file, e.g. ``config.yaml: lad.top_k: 'two' is not of type 'integer'``.
"""

from __future__ import annotations

import copy
import importlib
import math
import os
import re
import reprlib
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import jsonschema
import yaml

from ladbench.families import layer_range_arg, parse_layer_range  # noqa: F401 (the config's layer ranges)
from ladbench.names import benchmark_parts, study_benchmarks  # noqa: F401 (the study's names)
from ladbench.settings import carrier_name, check_section, schema_properties, setting_fields

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


#: The key that turns on Snakemake's YTE templating: the config's ``?...`` expressions would
#: run as Python when Snakemake loads it. A config is data: the key is refused wherever it is.
YTE_KEY = "__use_yte__"


class _CodeInConfig(yaml.MarkedYAMLError):
    """A construct that would run code (YTE templating) where data is expected."""


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader (no Python tags), refusing a key given twice in one mapping (PyYAML
    keeps the last) and Snakemake's YTE switch (:data:`YTE_KEY`)."""

    def construct_mapping(self, node, deep=False):
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key == YTE_KEY:
                raise _CodeInConfig(problem=f"{YTE_KEY} turns on Snakemake's YTE templating, which runs the Python in "
                                    "the config's ?-expressions; a config is data: remove it",
                                    problem_mark=key_node.start_mark)
            try:
                seen = key in first_line
            except TypeError:  # an unhashable key; the base class reports it
                continue
            if seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given on line {first_line[key] + 1})", key_node.start_mark)
            first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def read_yaml(path: Path | str) -> Any:
    """A YAML file's content; a syntax error or a duplicate key is a :class:`ConfigError`
    naming the file, line and column."""
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.load(handle, Loader=_StrictLoader)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8") from None
    except _CodeInConfig as exc:
        raise ConfigError(f"{path}: line {exc.problem_mark.line + 1}: {exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        context = f" ({exc.context})" if exc.context else ""
        raise ConfigError(f"{path}: not valid YAML: {where}{exc.problem}{context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


#: Snakemake's two spellings of the option that names config files (it refuses abbreviations).
CONFIGFILE_FLAGS = ("--configfile", "--configfiles")


def command_line_configfiles(argv: Sequence[str]) -> list[str]:
    """The files a Snakemake command line names with ``--configfile`` (``nargs="+"``: the values
    run up to the next option; ``--configfile=x`` too), in order, before any ``--``."""
    files, taking = [], False
    for arg in argv:
        if arg == "--":
            break
        flag, equals, value = arg.partition("=")
        if arg in CONFIGFILE_FLAGS:
            taking = True
        elif equals and flag in CONFIGFILE_FLAGS:
            files.append(value)
            taking = False
        elif taking and not arg.startswith("-"):
            files.append(arg)
        else:
            taking = False
    return files


def refuse_code_in_configfiles(argv: Sequence[str] | None = None) -> None:
    """Stop Snakemake, one line, if a ``--configfile`` on its command line is not plain data.

    Snakemake (9.x) loads a ``--configfile`` while it parses its own command line, evaluating
    its YTE expressions, before any workflow code. Only the workflow's profiles are read
    earlier, so each of them calls this (``workflow/profiles/*/config.yaml``, ``profiles/``):
    the files are read here with the strict loader (:func:`read_yaml`: no YTE switch, no
    duplicate key, UTF-8), before Snakemake opens them."""
    for path in command_line_configfiles(sys.argv[1:] if argv is None else argv):
        try:
            read_yaml(path)
        except ConfigError as error:
            print(f"invalid configuration: {error}", file=sys.stderr)
            raise SystemExit(1) from None


def _extend_with_defaults(validator_class):
    """A validator class that writes each subschema's ``default`` into missing keys.

    Defaults are filled while descending, so a default object (e.g. ``lad: {}``) gets its
    own nested defaults too.
    """
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, subschema in properties.items():
                if "default" in subschema and key not in instance:
                    instance[key] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_DefaultFillingValidator = _extend_with_defaults(jsonschema.Draft202012Validator)


def load_schema(path: Path | str = SCHEMA_PATH) -> dict:
    """The schema file, filled from the code (:func:`fill_schema`)."""
    with open(path) as handle:
        return fill_schema(yaml.safe_load(handle))


def fill_schema(schema: Any) -> Any:
    """Fill, in place and at any depth, what the schema file names in the code rather than states:

    - ``x-registry: module:NAME``: the node's ``enum`` is the names of that registry (families,
      methods, prompt variants; plugins add to the last two);
    - ``x-settings-of: module:NAME``: a block per entry of that registry whose ``settings``
      carrier has fields (each prompt variant's own settings), marked ``x-settings``;
    - ``x-settings: [module:Class, ...]``: the block's properties are those of the named settings
      carriers (:func:`ladbench.settings.schema_properties`; ``x-defaults: false`` leaves their
      defaults to the code).

    Names are imported when the schema loads, so this module sits below the modules it names."""
    if isinstance(schema, list):
        for item in schema:
            fill_schema(item)
    if not isinstance(schema, dict):
        return schema
    if "x-registry" in schema:
        schema["enum"] = list(_named(schema["x-registry"]))
    if "x-settings-of" in schema:
        blocks = schema.setdefault("properties", {})
        for name, entry in _named(schema["x-settings-of"]).items():
            if name not in blocks and any(True for _ in setting_fields(entry.settings)):
                blocks[name] = {"type": "object", "additionalProperties": False, "default": {},
                                "x-settings": [carrier_name(entry.settings)]}
    for value in list(schema.values()):
        fill_schema(value)
    for carrier in settings_carriers(schema):
        schema["properties"] = {**schema_properties(carrier, schema.get("x-defaults", True)),
                                **schema.get("properties", {})}
    return schema


def _named(name: str) -> Any:
    """The object ``module:attribute`` names."""
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


def settings_carriers(block: Mapping) -> list[type]:
    """The settings dataclasses a schema block names (``x-settings``: ``module:Class`` each)."""
    return [_named(name) for name in block.get("x-settings", [])]


def settings_blocks(schema: Mapping, config: Any, where: str = "") -> Iterator[tuple[type, dict, str]]:
    """(carrier, the config's block, its key path) for every ``x-settings`` block of the schema
    that the config holds, at any depth (``models.<name>.organism`` included)."""
    if not isinstance(config, dict):
        return
    for carrier in settings_carriers(schema):
        yield carrier, config, where
    properties = schema.get("properties", {})
    for key, value in config.items():
        sub = properties.get(key, schema.get("additionalProperties"))
        if isinstance(sub, dict):
            yield from settings_blocks(sub, value, f"{where}.{key}" if where else str(key))


#: The most values a config may hold once its YAML aliases (``*name``) are expanded: the
#: paper's holds a few hundred; an alias bomb (aliases of aliases) holds billions and would
#: exhaust the memory of whatever walks it.
MAX_CONFIG_VALUES = 100_000
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist, _SHORT.maxstring, _SHORT.maxother = 2, 4, 4, 60, 60


def short_repr(value: Any) -> str:
    """A value as an error message shows it: never whole when it is large."""
    return _SHORT.repr(value)


def _check_size(config: Any, source: str) -> None:
    """Refuse a config of more than :data:`MAX_CONFIG_VALUES` values (counted, not expanded)."""
    count, stack = 0, [config]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise ConfigError(f"{source}: more than {MAX_CONFIG_VALUES:,} values once its YAML aliases (*name) are "
                              "expanded; a study config is far smaller (an alias bomb?)")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _check_finite(node: Any, source: str, path: str = "") -> None:
    """Every number must be finite: no setting of the study means anything at infinity or NaN
    (YAML's .inf / .nan pass a schema's type: number)."""
    if isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(f"{source}: {path or '(top level)'}: {node} is not a finite number")
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        _check_finite(value, source, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key))


def _message(error: jsonschema.ValidationError) -> str:
    """The validator's message, with the offending value shortened if it is large."""
    text = error.message
    if len(text) > 300:
        whole = repr(error.instance)
        text = text.replace(whole, short_repr(error.instance)) if whole in text else f"{text[:200]} … {text[-80:]}"
    return text


def key_path(error: jsonschema.ValidationError) -> str:
    """``lad.tau`` or ``models.qwen.layer_range[1]`` for a validation error."""
    text = ""
    for part in error.absolute_path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _most_specific(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """Descend into oneOf/anyOf failures to the error deepest in the document."""
    if error.context:
        return _most_specific(max(error.context, key=lambda e: len(e.absolute_path)))
    return error


# `reproduce: reference` sets every protocol choice to the authors' reference implementation's
# (brightXian/LAD), the one that produced the published numbers; docs/method.md tabulates them.
REFERENCE_PROTOCOL: dict[tuple[str, str], Any] = {
    ("benchmarks", "orderings"): "shared",            # one list of T shuffles (build_shuffles)
    ("benchmarks", "ordering_seed"): 42,              # its evaluation's set_seed(42), whatever the draw's seed
    ("benchmarks", "category_rule"): "reference",     # skip candidates whose categories contain the anchor's
    ("benchmarks", "draw"): "reference",              # data/build_eval_dataset.py's instances
    ("benchmarks", "similarity_dtype"): "float16",    # its float16 dot products (and their ties)
    ("inference", "image_size"): 336,
    ("inference", "score_mode"): "reference",         # raw logits when every identifier is one token
    ("inference", "greedy_reply"): True,              # needed by vanilla_generate
    ("calibration", "source"): "evaluation_head",     # the first |D_cal| evaluation instances
    ("calibration", "score_average"): "reference",
    ("calibration", "pride_original_logs"): "floor",  # the original PriDe code's log(p + 1e-10)
    ("calibration", "empty_positions"): "zero",       # a position without rows: L's row 0, with a warning
    ("lad", "layer_mean"): "reference",
    ("lad", "mixture"): "reference",
    ("lad", "layer_ties"): "argsort",                 # its np.argsort (result depends on numpy's build)
    ("lad", "k_beyond_range"): "lower",
    ("lad", "layers_beyond_depth"): "absent",         # layers past the model's last: attention 0, prior 0
    ("evaluation", "acc_ddof"): 1,
    ("evaluation", "edge_statistics"): "reference",   # std 0.0 at T = 1; RStd over the positions seen
    ("evaluation", "reply_parse"): "int",             # int() of each digit run of the greedy reply
}
# ... and its Vanilla is the parsed greedy reply: evaluated beside the argmax readout.
REFERENCE_METHODS = ("vanilla_generate",)


def apply_reproduce(config: dict, schema: Mapping, source: str = "config") -> dict:
    """``reproduce: reference``: set every key of :data:`REFERENCE_PROTOCOL` (in place). A key
    the file sets to another value is a conflict, reported instead of silently overridden."""
    if config.get("reproduce", "none") != "reference":
        return config
    for (section, key), value in REFERENCE_PROTOCOL.items():
        block = config.setdefault(section, {})
        if not isinstance(block, dict):
            continue  # the schema reports the wrong type
        if key in block and block[key] != value:
            raise ConfigError(f"{source}: {section}.{key}: {short_repr(block[key])} conflicts with reproduce: reference, "
                              f"which sets it to {value!r}; remove one of the two")
        block[key] = value
    evaluation = config.setdefault("evaluation", {})
    if isinstance(evaluation, dict):
        default = schema["properties"]["evaluation"]["properties"]["methods"]["default"]
        methods = evaluation.setdefault("methods", copy.deepcopy(default))
        if isinstance(methods, list):
            methods += [m for m in REFERENCE_METHODS if m not in methods]
    return config


def validate_config(config: dict, schema: Mapping | None = None, source: str = "config") -> dict:
    """Fill defaults into ``config`` (in place) and validate it; returns ``config``.

    Raises :class:`ConfigError` naming ``source`` and the key path of the first problem.
    """
    schema = load_schema() if schema is None else schema
    _check_size(config, source)
    _load_plugins(config, source)
    schema = with_registered_names(schema)
    apply_reproduce(config, schema, source)
    analysis = config.get("analysis")
    given_dcal_sizes = analysis.get("dcal_sizes") if isinstance(analysis, dict) else None
    validator = _DefaultFillingValidator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        error = _most_specific(errors[0])
        raise ConfigError(f"{source}: {key_path(error)}: {_message(error)}")
    _check_finite(config, source)
    _check_settings(config, schema, source)
    _check_cross_references(config, source)
    _check_dcal_sizes(config, given_dcal_sizes, source)
    return config


def _check_dcal_sizes(config: dict, given: Any, source: str) -> None:
    """|D_cal| sizes the file gives beyond the calibration pool: an error (the sweep would clip
    them to the pool, silently giving another sweep than asked). The defaults, which run up to
    the paper's 100, are clipped as documented."""
    if given is None:
        return
    pool = config["benchmarks"]["n_calibration_pool"]
    beyond = [size for size in given if size > pool]
    if beyond:
        raise ConfigError(f"{source}: analysis.dcal_sizes: {short_repr(beyond)} above benchmarks.n_calibration_pool "
                          f"({pool}); |D_cal| draws come from that pool, so list sizes up to {pool} or raise it")


def _check_settings(config: dict, schema: Mapping, source: str) -> None:
    """Values whose one validator is a settings class of the code (not restated in the schema):
    each section's carriers (``x-settings``) check its keys, and the one parser of layer ranges
    (:func:`ladbench.families.parse_layer_range`, as LAD's settings do) the models' ranges."""
    try:
        for carrier, block, where in settings_blocks(schema, config):
            check_section(carrier, block, where)
        for name, model in config["models"].items():
            if "layer_range" in model:
                try:
                    parse_layer_range(model["layer_range"])
                except ValueError as error:
                    raise ValueError(f"models.{name}.layer_range: {error}") from None
    except ValueError as error:
        raise ConfigError(f"{source}: {error}") from None


def _load_plugins(config: dict, source: str) -> None:
    """Import the installed plugins and the modules of the config's ``plugins`` list
    (ladbench.plugins): they register variants and methods."""
    from ladbench.plugins import load_plugins

    plugins = config.get("plugins") or []
    if isinstance(plugins, list) and all(isinstance(name, str) for name in plugins):   # else the schema says why
        try:
            load_plugins(plugins)
        except ValueError as error:
            raise ConfigError(f"{source}: plugins: {error}") from None


def with_registered_names(schema: Mapping) -> dict:
    """A copy of ``schema`` filled again (:func:`fill_schema`) after the plugins are loaded: its
    registries' enums and the prompt variants' settings blocks then hold the plugins' too."""
    return fill_schema(copy.deepcopy(dict(schema)))


def _check_cross_references(config: dict, source: str) -> None:
    """Constraints the schema cannot express: names that must refer to other entries."""
    benchmarks = config.setdefault("benchmarks", {})
    benchmarks.setdefault("datasets", sorted(config["datasets"]))
    for name in benchmarks["datasets"]:
        if name not in config["datasets"]:
            raise ConfigError(
                f"{source}: benchmarks.datasets: '{name}' is not a key of datasets "
                f"(known: {', '.join(sorted(config['datasets']))})"
            )
    for name, dataset in config["datasets"].items():
        if dataset["source"] != "synthetic" and "root" not in dataset and not (
            "images_dir" in dataset and "captions_json" in dataset
        ):
            raise ConfigError(
                f"{source}: datasets.{name}: give root (download folder) or images_dir + captions_json"
            )
    from ladbench.families import family_entry
    for name, model in config["models"].items():
        entry = family_entry(model["family"])
        if entry.remote_code and not model["trust_remote_code"]:
            raise ConfigError(
                f"{source}: models.{name}.trust_remote_code: family {model['family']} runs the model's own "
                "code (from the hub, or the tiny stand-in's folder); set it to true to allow that"
            )
        template = model.get("chat_template")
        if template and not os.path.isfile(os.path.expanduser(template)):
            raise ConfigError(f"{source}: models.{name}.chat_template: no file {template}")
        if model["tiny"] and not entry.tiny_build:
            raise ConfigError(f"{source}: models.{name}.tiny: family {model['family']} has no tiny build; "
                              "name a family or give the model's path")
    study = set(study_benchmarks(config))
    for i, transfer in enumerate(config["evaluation"]["transfer"]):
        pair = [transfer["calibrate_on"], transfer["evaluate_on"]]
        (cal_dataset, _, cal_n), (test_dataset, _, test_n) = map(benchmark_parts, pair)
        for key, benchmark, dataset in zip(("calibrate_on", "evaluate_on"), pair, (cal_dataset, test_dataset)):
            if dataset not in config["datasets"]:
                raise ConfigError(
                    f"{source}: evaluation.transfer[{i}].{key}: dataset of '{benchmark}' is not a key of datasets"
                )
        if cal_n != test_n:
            raise ConfigError(f"{source}: evaluation.transfer[{i}]: {pair[0]} and {pair[1]} differ in N")
        for key, benchmark in zip(("calibrate_on", "evaluate_on"), pair):
            if benchmark not in study:
                raise ConfigError(
                    f"{source}: evaluation.transfer[{i}].{key}: {benchmark} is not a benchmark of the study "
                    f"(benchmarks.datasets x settings x n_candidates: {', '.join(sorted(study))})")
    if not 0 < config["calibration"]["n_cal"] <= benchmarks["n_calibration_pool"]:
        raise ConfigError(
            f"{source}: calibration.n_cal: {config['calibration']['n_cal']} must be at most "
            f"benchmarks.n_calibration_pool ({benchmarks['n_calibration_pool']})"
        )


# A Hugging Face hub id: "name" or "owner/name" (what is not one is read as a local folder).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# A revision that cannot move: a full commit hash (a branch or tag can be changed by its owner).
_COMMIT = re.compile(r"[0-9a-f]{40}")
_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids the hub (read when asked, not at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def check_environment(config: dict, source: str = "config") -> None:
    """Start-up checks of what the config names on this machine (after :func:`validate_config`):
    a model path that is not a hub id must be an existing folder; with ``HF_HUB_OFFLINE`` set, a
    hub model must already be in the local Hugging Face cache; a CLIP checkpoint file must exist."""
    from ladbench.families import family_lanes, installed_lane, lane_venv

    lane = installed_lane()
    for name, model in config["models"].items():
        lanes = family_lanes(model["family"])
        if lane not in lanes:
            raise ConfigError(f"{source}: models.{name}: family {model['family']!r} runs only on the "
                              f"{' / '.join(lanes)} lane, and this is the {lane} lane: run it from {lane_venv(lanes)}")
        if model["tiny"]:
            continue
        path = model["path"]
        if os.path.isdir(os.path.expanduser(path)):
            continue
        if not _HUB_ID.fullmatch(path):
            raise ConfigError(f"{source}: models.{name}.path: {path!r} is no folder on this machine (and not a "
                              "hub id such as Qwen/Qwen2.5-VL-3B-Instruct)")
        if hub_offline():
            from huggingface_hub import constants, try_to_load_from_cache

            if not isinstance(try_to_load_from_cache(path, "config.json", revision=model["revision"]), str):
                raise ConfigError(
                    f"{source}: models.{name}: {path} (revision {model['revision']}) is not in the Hugging Face "
                    f"cache {constants.HF_HUB_CACHE} and HF_HUB_OFFLINE is set; download it there once with "
                    "network access (huggingface-cli download), point HF_HOME to a cache holding it, or unset "
                    "HF_HUB_OFFLINE")
    clip = config["clip"]
    pretrained = clip["pretrained"]
    looks_like_file = "/" in pretrained or pretrained.endswith(_CHECKPOINT_SUFFIXES)
    if not clip["tiny"] and looks_like_file and not os.path.isfile(os.path.expanduser(pretrained)):
        raise ConfigError(f"{source}: clip.pretrained: no checkpoint file {pretrained!r} on this machine")


def remote_code_warning(path: str, revision: str | None, trust_remote_code: bool, key: str) -> str | None:
    """The warning for running a hub repository's own code at a revision that can change
    (``key``: the config key or flag that pins it), or None."""
    if not trust_remote_code or os.path.isdir(os.path.expanduser(path)) or _COMMIT.fullmatch(revision or ""):
        return None
    return (f"trust_remote_code runs Python code from the hub repository {path} at revision {revision or 'main'!r}, "
            "which its owners can change at any time (and with it what runs on this machine); pin "
            f"{key} to a reviewed 40-character commit hash (README, 'Pinning model code')")


def startup_warnings(config: dict) -> list[str]:
    """Risks worth a line at start-up: remote code from a hub revision that can change."""
    warnings = []
    for name, model in config["models"].items():
        if not model["tiny"]:
            warning = remote_code_warning(model["path"], model["revision"], model["trust_remote_code"],
                                          f"models.{name}.revision")
            if warning:
                warnings.append(f"models.{name}: {warning}")
    return warnings


def load_config(path: Path | str, schema_path: Path | str = SCHEMA_PATH) -> dict:
    """Read a YAML study file and return it validated, with defaults filled."""
    path = Path(path)
    config = read_yaml(path) or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    return validate_config(config, load_schema(schema_path), source=str(path))


def model_layer_range(model: dict) -> tuple[int, ...] | None:
    """A model entry's ``layer_range`` (parsed: ``None`` for all), or its family's default."""
    from ladbench.families import layer_range_for
    return layer_range_for(model["family"], model.get("layer_range"))
