"""The study configs validate, defaults are filled, and a bad value names its key."""

import copy
from pathlib import Path

import pytest
import yaml

from ladbench.config import (ConfigError, layer_range_arg, load_config, load_schema, model_layer_range,
                             parse_layer_range, settings_carriers, validate_config)
from ladbench.methods import LadSettings
from ladbench.settings import config_key, option_name, plain, schema_properties, setting_fields

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "config.yaml"
DEMO = ROOT / "workflow" / "demo" / "config.yaml"


def raw(path):
    return yaml.safe_load(path.read_text())


def test_paper_config_describes_the_paper_study():
    config = load_config(PAPER)
    assert set(config["models"]) == {"qwen2_5_vl_3b", "llava_ov15_8b", "internvl3_8b"}
    paths = {m["path"] for m in config["models"].values()}
    assert paths == {
        "Qwen/Qwen2.5-VL-3B-Instruct",
        "OpenGVLab/InternVL3-8B-HF",
        "lmms-lab/LLaVA-OneVision-1.5-8B-Instruct",
    }
    bench = config["benchmarks"]
    assert bench["n_candidates"] == [4, 8] and bench["settings"] == ["random", "adversarial"]
    assert bench["n_eval"] == 1000 and bench["n_orderings"] == 5 and bench["seed"] == 42
    assert config["calibration"]["n_cal"] == 5
    # the paper's LAD settings are the reference implementation's: LadSettings' defaults
    assert config["lad"] == {key: entry["default"] for key, entry in schema_properties(LadSettings).items()}
    assert config["clip"]["model"] == "ViT-L-14-quickgelu" and config["clip"]["pretrained"] == "openai"


def test_demo_config_is_offline():
    config = load_config(DEMO)
    assert all(d["source"] == "synthetic" for d in config["datasets"].values())
    assert all(m["tiny"] for m in config["models"].values())
    assert config["clip"]["tiny"]


def test_defaults_are_filled_in_nested_sections():
    config = raw(DEMO)
    del config["lad"]
    validate_config(config)
    assert config["lad"]["tau"] == 5.0 and config["lad"]["top_k"] == 2
    assert config["evaluation"]["ci"] == 0.95


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda c: c["lad"].update(tau=-1), "lad.tau"),
        (lambda c: c["lad"].update(top_k="two"), "lad.top_k"),
        (lambda c: c["benchmarks"].update(n_candidates=[1]), "benchmarks.n_candidates[0]"),
        (lambda c: c["models"]["tiny_qwen2_5_vl"].update(family="gpt"), "models.tiny_qwen2_5_vl.family"),
        (lambda c: c["models"]["tiny_qwen2_5_vl"].update(layer_range=[3]), "models.tiny_qwen2_5_vl.layer_range"),
        (lambda c: c["inference"].update(batchsize=3), "inference"),
        (lambda c: c["calibration"].update(n_cal=50), "calibration.n_cal"),
        (lambda c: c["benchmarks"].update(datasets=["nope"]), "benchmarks.datasets"),
    ],
)
def test_bad_values_name_their_key(edit, key):
    config = copy.deepcopy(raw(DEMO))
    edit(config)
    with pytest.raises(ConfigError) as error:
        validate_config(config, source="study.yaml")
    assert str(error.value).startswith(f"study.yaml: {key}")


def test_ov15_requires_trusting_remote_code():
    config = raw(PAPER)
    config["models"]["llava_ov15_8b"]["trust_remote_code"] = False
    with pytest.raises(ConfigError, match="llava_ov15_8b.trust_remote_code"):
        validate_config(config)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("lad: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_layer_range_round_trip():
    assert parse_layer_range("all") is None
    assert parse_layer_range("21:35") == (21, 35)
    assert parse_layer_range("21:35/36") == (21, 35, 36)
    for layer_range in ("all", [21, 35], (21, 35, 36)):
        assert parse_layer_range(layer_range_arg(layer_range)) == (None if layer_range == "all" else tuple(layer_range))
    with pytest.raises(ValueError, match="first:last"):
        parse_layer_range("21-35")
    with pytest.raises(ValueError, match="< of"):
        parse_layer_range("21:36/36")


def test_a_model_without_layer_range_gets_its_family_default():
    from ladbench.families import DEFAULT_LAYER_RANGES
    config = load_config(CURRENT)
    schema_families = load_schema(ROOT / "workflow/schemas/config.schema.yaml")[
        "properties"]["models"]["additionalProperties"]["properties"]["family"]["enum"]
    assert sorted(DEFAULT_LAYER_RANGES) == sorted(schema_families)      # every family has one
    for name, model in config["models"].items():
        assert "layer_range" not in model, f"config.current.yaml sets {name}'s range: the default is the point"
        assert model_layer_range(model) == DEFAULT_LAYER_RANGES[model["family"]]
    paper = load_config(ROOT / "config.yaml")                            # the paper's ranges stay explicit
    assert {m["family"]: m["layer_range"] for m in paper["models"].values()} == {
        "qwen2_5_vl": [21, 35], "llava_ov15": [21, 35], "internvl": [21, 27]}


def test_transfer_pairs_are_checked():
    config = raw(DEMO)
    config["evaluation"]["transfer"] = [{"calibrate_on": "scenes_random_N4", "evaluate_on": "scenes_adversarial_N8"}]
    with pytest.raises(ConfigError, match=r"evaluation.transfer\[0\]: .* differ in N"):
        validate_config(config)
    config["evaluation"]["transfer"] = [{"calibrate_on": "coco_random_N4", "evaluate_on": "scenes_adversarial_N4"}]
    with pytest.raises(ConfigError, match=r"transfer\[0\].calibrate_on: dataset of 'coco_random_N4'"):
        validate_config(config)


# ---- start-up checks ------------------------------------------------------------------
def test_the_schema_lists_exactly_the_registered_methods():
    from ladbench.config import load_schema
    from ladbench.methods import METHODS
    enum = load_schema()["properties"]["evaluation"]["properties"]["methods"]["items"]["enum"]
    assert sorted(enum) == sorted(METHODS)


def test_an_unknown_method_is_refused_at_start_up():
    config = raw(DEMO)
    config["evaluation"]["methods"] = ["vanilla", "bogus"]
    with pytest.raises(ConfigError, match=r"evaluation.methods\[1\]: 'bogus' is not one of"):
        validate_config(config)


def test_a_transfer_to_a_benchmark_outside_the_study_is_refused():
    config = raw(DEMO)
    config["evaluation"]["transfer"] = [{"calibrate_on": "scenes_random_N12", "evaluate_on": "scenes_adversarial_N12"}]
    with pytest.raises(ConfigError, match=r"transfer\[0\].calibrate_on: scenes_random_N12 is not a benchmark of the study"):
        validate_config(config)


def test_yaml_errors_and_duplicate_keys_give_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("output_dir: x\nlad:\n  top_k: 2\n\ttau: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML: line 4, column 1: found character '\\t'"):
        load_config(bad)
    duplicate = tmp_path / "duplicate.yaml"
    duplicate.write_text("lad:\n  tau: 3\n  top_k: 2\n  tau: 4\n")
    with pytest.raises(ConfigError, match=r"line 4, column 3: duplicate key 'tau' \(first given on line 2\)"):
        load_config(duplicate)


def paper_with(**model):
    config = raw(PAPER)
    config["models"] = {"m": {"family": "qwen2_5_vl", **model}}
    return validate_config(config)


def test_a_model_path_that_is_no_folder_and_no_hub_id_is_refused(tmp_path, monkeypatch):
    from ladbench.config import check_environment
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    check_environment(paper_with(path="Qwen/Qwen2.5-VL-3B-Instruct"))      # a hub id: fetched later
    check_environment(paper_with(path=str(tmp_path)))                        # an existing folder
    for missing in (str(tmp_path / "nope"), "./models/qwen", "~/models/qwen", "models/qwen/3b"):
        with pytest.raises(ConfigError, match=r"models.m.path: .* is no folder on this machine"):
            check_environment(paper_with(path=missing))


def test_offline_a_hub_model_must_be_in_the_local_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from ladbench.config import check_environment
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    config = paper_with(path="Qwen/Qwen2.5-VL-3B-Instruct")
    with pytest.raises(ConfigError, match=f"models.m: Qwen/Qwen2.5-VL-3B-Instruct .* cache {tmp_path / 'hub'} "
                                          "and HF_HUB_OFFLINE is set"):
        check_environment(config)
    repo = tmp_path / "hub" / "models--Qwen--Qwen2.5-VL-3B-Instruct"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    (repo / "snapshots" / ("a" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("a" * 40) / "config.json").write_text("{}")
    check_environment(config)


def test_a_family_of_the_other_lane_is_refused_at_start_up(monkeypatch):
    from ladbench import families
    from ladbench.config import check_environment
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(families, "installed_lane", lambda: "current")
    with pytest.raises(ConfigError, match=r"models.m: family 'llava_ov15' runs only on the paper lane, and this "
                                          r"is the current lane: run it from .venv \(make install\)"):
        check_environment(paper_with(family="llava_ov15", path="lmms-lab/LLaVA-OneVision-1.5-8B-Instruct",
                                      trust_remote_code=True))
    check_environment(paper_with(family="qwen2_5_vl", path="Qwen/Qwen2.5-VL-3B-Instruct"))   # both lanes
    monkeypatch.setattr(families, "installed_lane", lambda: "paper")
    with pytest.raises(ConfigError, match=r"family 'qwen3_vl' runs only on the current lane"):
        check_environment(paper_with(family="qwen3_vl", path="Qwen/Qwen3-VL-2B-Instruct"))


def test_remote_code_from_an_unpinned_revision_is_warned_about():
    from ladbench.config import startup_warnings
    (warning,) = startup_warnings(load_config(PAPER))
    assert warning.startswith("models.llava_ov15_8b: trust_remote_code runs Python code")
    assert "pin models.llava_ov15_8b.revision" in warning
    pinned = raw(PAPER)
    pinned["models"]["llava_ov15_8b"]["revision"] = "0123456789abcdef0123456789abcdef01234567"
    assert startup_warnings(validate_config(pinned)) == []
    assert startup_warnings(load_config(DEMO)) == []


def test_the_workflow_stops_at_start_up_naming_the_key(tmp_path):
    import subprocess

    from workflow_runner import environment, snakemake_command
    config = raw(DEMO)
    config["evaluation"]["methods"] = ["vanilla", "bogus"]
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(snakemake_command(tmp_path, "--dry-run", configfile=path), capture_output=True, text=True,
                            env=environment(), timeout=300)
    assert result.returncode != 0
    assert "study.yaml: evaluation.methods[1]: 'bogus' is not one of" in result.stdout + result.stderr


def snakemake_start(workdir) -> tuple[str, set[str]]:
    """A dry run of this workflow on the demo's config in ``workdir``: its output, and the modules
    its process had imported when it ended."""
    import json
    import subprocess
    import sys

    from workflow_runner import FULL_DEMO_CONFIG, environment, snakemake_command
    command = snakemake_command(workdir, "--dry-run", "--cores", "1", configfile=FULL_DEMO_CONFIG)
    modules = workdir / "modules.json"
    script = ("import atexit, json, runpy, sys; path = sys.argv.pop(1); atexit.register(lambda: open(path, 'w')"
              ".write(json.dumps(sorted(sys.modules)))); sys.argv[0] = 'snakemake'; runpy.run_module('snakemake', "
              "run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", script, str(modules), *command[1:]], capture_output=True,
                            text=True, env=environment(), timeout=300)
    return result.stdout + result.stderr, set(json.loads(modules.read_text()))


def test_a_snakemake_start_imports_no_torch(tmp_path, tiny_model):
    """Snakemake reads the Snakefile, the config and its schema at every start: a dry run, and
    each job of a SLURM run, which runs a Snakemake of its own. The schema is filled from the
    settings carriers, the organism's among them; none of that may import torch or transformers
    (2026-11-28: the organism's settings came with its training's torch, which made the demo's
    dry run 5.0 s where it now takes 2.3 s, paid twice again by every SLURM job). Nor may the
    start-up checks of the models' config.json once the models are built: their windows are read
    from the file where it settles them (until 2026-11-29 each start after the demo's models were
    built imported transformers for them, 5 s more)."""
    import shutil

    from ladbench.study_paths import StudyPaths
    from workflow_runner import FULL_DEMO_CONFIG

    def torch_free(modules: set[str]) -> bool:
        return not {name.split(".")[0] for name in modules} & {"torch", "transformers"}
    output, imported = snakemake_start(tmp_path)
    assert "train_organism" in output, output[-3000:]                            # it planned the DAG
    assert "ladbench.organism_settings" in imported                             # the schema's carriers were read
    assert torch_free(imported)
    config = load_config(FULL_DEMO_CONFIG)
    files = [tmp_path / StudyPaths(config).model_dir(name) / "config.json" for name in config["models"]]
    for file in files:
        file.parent.mkdir(parents=True)
        file.write_text("{")
    output, _ = snakemake_start(tmp_path)                  # the start reads the demo's models' files there
    assert "its config.json cannot be read" in output, output[-3000:]
    built = tiny_model("qwen2_5_vl")              # the demo's models as demo_model builds them: config.json
    for file in files:
        shutil.copy(f"{built}/config.json", file)
    output, imported = snakemake_start(tmp_path)
    assert "train_organism" in output, output[-3000:]
    assert torch_free(imported)


def test_a_cluster_jobs_snakemake_leaves_the_model_checks_to_its_run(tmp_path):
    """A SLURM job runs two Snakemakes of its own (``--mode remote``, its one job targeted): the
    run that submitted it checked the models' files at its start, so they skip that. Here a
    model's config.json that cannot be read stops the run's start, naming it, and not a job's."""
    import subprocess

    from ladbench.study_paths import StudyPaths
    from workflow_runner import FULL_DEMO_CONFIG, environment, snakemake_command
    file = tmp_path / StudyPaths(load_config(FULL_DEMO_CONFIG)).model_dir("tiny_qwen2_5_vl") / "config.json"
    file.parent.mkdir(parents=True)
    file.write_text("{")

    def dry_run(*args: str) -> subprocess.CompletedProcess:
        command = snakemake_command(tmp_path, "--dry-run", "--cores", "1", *args, configfile=FULL_DEMO_CONFIG)
        return subprocess.run(command, capture_output=True, text=True, env=environment(), timeout=300)
    run = dry_run()
    assert run.returncode != 0 and "models.tiny_qwen2_5_vl: its config.json cannot be read" in run.stdout + run.stderr
    job = dry_run("--mode", "remote", "--target-jobs", "demo_scenes:dataset=scenes", "--allowed-rules", "demo_scenes")
    assert job.returncode == 0 and "demo_scenes" in job.stdout, job.stdout[-2000:] + job.stderr[-2000:]


def test_reproduce_reference_sets_every_protocol_choice(tmp_path):
    from ladbench.config import REFERENCE_PROTOCOL
    config = yaml.safe_load(open(DEMO))
    config["reproduce"] = "reference"
    del config["inference"]["image_size"]  # the demo shrinks images; the reference resizes to 336
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(path)
    for (section, key), value in REFERENCE_PROTOCOL.items():
        assert loaded[section][key] == value, (section, key)
    assert loaded["calibration"]["source"] == "evaluation_head" and loaded["benchmarks"]["orderings"] == "shared"
    assert "vanilla_generate" in loaded["evaluation"]["methods"]
    # without the switch the defaults stay (pool calibration), and a conflicting key is an error
    assert load_config(DEMO)["calibration"]["source"] == "pool"
    config["calibration"]["source"] = "pool"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match="calibration.source: 'pool' conflicts with reproduce: reference"):
        load_config(path)


CURRENT = ROOT / "config.current.yaml"


def test_current_config_studies_todays_models_on_the_current_lane():
    from ladbench.families import family_lanes
    config = load_config(CURRENT)
    families = {m["family"] for m in config["models"].values()}
    assert {"qwen3_vl", "llava_onevision"} <= families
    assert all("current" in family_lanes(f) for f in families)          # nothing that needs the paper lane
    qwen3 = sorted(m["path"] for m in config["models"].values() if m["family"] == "qwen3_vl")
    assert qwen3 == ["Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-8B-Instruct"]
    bench = config["benchmarks"]
    assert bench["n_candidates"] == [4, 8] and bench["settings"] == ["random", "adversarial"]


@pytest.mark.slow
@pytest.mark.lanes
def test_current_config_dry_run_plans_one_inference_per_model_and_benchmark(tmp_path, monkeypatch):
    from ladbench.families import installed_lane
    from workflow_runner import planned_jobs
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)       # hub ids are fetched later, not checked offline
    if installed_lane() == "paper":                          # Qwen3-VL needs the current lane: refused at start-up
        with pytest.raises(AssertionError, match=r"family 'qwen3_vl' runs only on the current lane, and this is "
                                                 r"the paper lane: run it from .venv-current"):
            planned_jobs(tmp_path, configfile=CURRENT)
        return
    jobs = planned_jobs(tmp_path, configfile=CURRENT)
    config = load_config(CURRENT)
    assert jobs["infer"] == len(config["models"]) * 4 * len(config["inference"]["variants"])   # 2 settings x 2 N
    assert jobs["download"] == 1 and jobs["all"] == 1


# --------------------------------------------------------------------------- each fact once

SCHEMA = load_schema(ROOT / "workflow/schemas/config.schema.yaml")

# Where each defaulted key of the schema is a default of the code: the stage command (and its
# argument) that the workflow passes it to. A `ladbench <stage>` run by hand must behave as the
# config's default does. The keys of the settings carriers are found by carrier_flags() below;
# this lists the others.
CLI_OF_KEY = {
    "models.*.family": [("infer", "family")],
    "datasets.*.n_images": [("demo-scenes", "n_images")], "datasets.*.image_size": [("demo-scenes", "image_size")],
    "datasets.*.seed": [("demo-scenes", "seed")],
    "datasets.*.files_outside_root": [("captions", "files_outside_root")],
    "calibration.source": [("benchmark", "calibration_source")],
    "inference.shards": [("infer", "shard_count")],
    "calibration.n_cal": [("calibrate", "n_cal"), ("analyze", "n_cal")],
    "calibration.seeds": [("analyze", "seeds")],
}
# Defaulted keys only the workflow reads (no stage command has a default for them), and the
# prompt variants' own settings (inference.prompt_settings: checked against the variant registry).
CHECKED_ELSEWHERE = ("inference.prompt_settings.",)
WORKFLOW_ONLY = {"reproduce", "output_dir", "plugins", "datasets.*.download", "clip.tiny", "benchmarks.settings",
                 "benchmarks.n_candidates", "models.*.revision", "models.*.trust_remote_code", "models.*.tiny",
                 "models.*.gpus_per_job", "inference.variants", "inference.variants.*.identifiers",
                 "evaluation.methods", "evaluation.transfer", "report.figure_formats",
                 "lad.windowed_layers"}          # read by the start-up checks (ladbench.model_checks)
REQUIRED_ARGS = {
    "captions": ["--captions-json", "c.json", "--image-root", "i", "--dataset", "d", "--out", "t.json"],
    "demo-scenes": ["--out", "scenes"],
    "benchmark": ["--images", "t.json", "--features", "f.h5", "--setting", "random", "--n-candidates", "4",
                  "--out", "b.json"],
    "infer": ["--benchmark", "b.json", "--images", "t.json", "--out", "c.h5", "--model-name", "m", "--model-path", "m"],
    "calibrate": ["--cache", "c.h5", "--out", "c.npz"],
    "analyze": ["--cache", "c.h5", "--out", "a.json"],
}


def schema_defaults(schema: dict, prefix: str = "") -> dict[str, object]:
    """Every ``default:`` of the schema by key path (``*`` for a mapping of named entries)."""
    out = {}
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        if "default" in sub and sub.get("type") != "object":
            out[path] = sub["default"]
        out.update(schema_defaults(sub, f"{path}."))
    if isinstance(schema.get("additionalProperties"), dict):
        out.update(schema_defaults(schema["additionalProperties"], f"{prefix}*."))
    return out


def carrier_blocks(schema: dict, prefix: str = ""):
    """(key path of the block, carrier) for every ``x-settings`` block of the schema, at any depth."""
    for carrier in settings_carriers(schema):
        yield prefix, carrier
    for key, sub in schema.get("properties", {}).items():
        yield from carrier_blocks(sub, f"{prefix}{key}.")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from carrier_blocks(schema["additionalProperties"], f"{prefix}*.")


def command_flags() -> dict[str, dict[str, object]]:
    """subcommand -> its flags (``--name``) -> their defaults, read from the parsers."""
    from ladbench.cli import SUBCOMMANDS, build_parser

    out = {}
    for command in SUBCOMMANDS:
        (commands,) = [a for a in build_parser(command)._actions if command in (getattr(a, "choices", None) or {})]
        out[command] = {option: action.default for action in commands.choices[command]._actions
                        for option in action.option_strings}
    return out


def carrier_flags() -> dict[str, tuple[type, str, object]]:
    """Every config key of a settings carrier that has a flag: key path -> (carrier, flag, the field's default)."""
    return {f"{path}{config_key(f)}": (carrier, flag_of(f), plain(f.default))
            for path, carrier in carrier_blocks(SCHEMA) for f in setting_fields(carrier)
            if f.metadata["config"] and f.metadata["flag"] and not path.startswith(CHECKED_ELSEWHERE)}


def flag_of(f) -> str:
    return f"--{option_name(f).replace('_', '-')}"


def readers_of(carrier: type, flags_of: dict[str, dict[str, object]]) -> list[str]:
    """The commands that read ``carrier``: those with every flag of its fields."""
    wanted = {flag_of(f) for f in setting_fields(carrier) if f.metadata["flag"]}
    return [command for command, flags in flags_of.items() if wanted <= set(flags)]


def test_every_schema_default_is_the_default_of_the_stage_that_reads_it():
    from ladbench.cli import build_parser

    defaults = schema_defaults(SCHEMA)
    carried = carrier_flags()
    unmapped = ({key for key in defaults if not key.startswith(CHECKED_ELSEWHERE)} - set(CLI_OF_KEY) - set(carried)
                - WORKFLOW_ONLY)
    assert not unmapped, f"new schema defaults {sorted(unmapped)}: map each to the stage that reads it above"
    for key, commands in CLI_OF_KEY.items():
        assert key in defaults, f"{key}: no default in the schema"
        for command, dest in commands:
            parsed = vars(build_parser(command).parse_args([command, *REQUIRED_ARGS[command]]))
            assert parsed[dest] == defaults[key], f"{key}: schema {defaults[key]!r}, {command} {parsed[dest]!r}"
    flags_of = command_flags()
    for key, (carrier, flag, default) in carried.items():
        readers = readers_of(carrier, flags_of)
        assert readers, f"{key}: no command reads {carrier.__name__}"
        if key in defaults:           # a carrier's block may leave its defaults to the code (x-defaults: false)
            assert defaults[key] == default, key
            for command in readers:
                assert flags_of[command][flag] == default, f"{key}: schema {default!r}, {command} {flag}"


def test_the_schema_enums_are_the_registries():
    from ladbench import benchmark, calibration, methods, metrics
    from ladbench.families import FAMILIES
    from ladbench.inference.prompts import IDENTIFIER_FORMATS, MAX_CANDIDATES
    from ladbench.inference.scoring import SCORE_MODES
    from ladbench.models.vision import VISION_TOWERS

    p = SCHEMA["properties"]
    enums = {
        "families": (p["models"]["additionalProperties"]["properties"]["family"]["enum"], FAMILIES),
        "identifier formats": (p["inference"]["properties"]["variants"]["additionalProperties"]["properties"]
                               ["identifiers"]["enum"], IDENTIFIER_FORMATS),
        "score modes": (p["inference"]["properties"]["score_mode"]["enum"], SCORE_MODES),
        "vision towers": (p["inference"]["properties"]["vision_tower"]["enum"], VISION_TOWERS),
        "settings": (p["benchmarks"]["properties"]["settings"]["items"]["enum"], benchmark.SETTINGS),
        "orderings": (p["benchmarks"]["properties"]["orderings"]["enum"], benchmark.ORDERING_SCHEMES),
        "category rules": (p["benchmarks"]["properties"]["category_rule"]["enum"], benchmark.CATEGORY_RULES),
        "calibration sources": (p["calibration"]["properties"]["source"]["enum"], benchmark.CALIBRATION_SOURCES),
        "draws": (p["benchmarks"]["properties"]["draw"]["enum"], benchmark.DRAWS),
        "similarity dtypes": (p["benchmarks"]["properties"]["similarity_dtype"]["enum"], benchmark.SIMILARITY_DTYPES),
        "score averages": (p["calibration"]["properties"]["score_average"]["enum"], calibration.SCORE_AVERAGES),
        "PriDe logs": (p["calibration"]["properties"]["pride_original_logs"]["enum"], calibration.PRIDE_ORIGINAL_LOGS),
        "layer ties": (p["lad"]["properties"]["layer_ties"]["enum"], methods.LAYER_TIES),
        "K beyond range": (p["lad"]["properties"]["k_beyond_range"]["enum"], methods.K_BEYOND_RANGE),
        "layers beyond depth": (p["lad"]["properties"]["layers_beyond_depth"]["enum"], methods.LAYERS_BEYOND_DEPTH),
        "reply parses": (p["evaluation"]["properties"]["reply_parse"]["enum"], methods.REPLY_PARSES),
        "edge statistics": (p["evaluation"]["properties"]["edge_statistics"]["enum"], metrics.EDGE_STATISTICS),
        "empty positions": (p["calibration"]["properties"]["empty_positions"]["enum"], calibration.EMPTY_POSITIONS),
    }
    for name, (schema_enum, registry) in enums.items():
        assert list(schema_enum) == list(registry), name
    assert p["benchmarks"]["properties"]["n_candidates"]["items"]["maximum"] == MAX_CANDIDATES


@pytest.mark.parametrize("edit, key, message", [
    (lambda c: c["lad"].update(tau=0), "lad.tau", "tau must be > 0"),
    (lambda c: c["lad"].update(top_k=-1), "lad.top_k", "top_k must be >= 0"),
    (lambda c: c["analysis"].update(taus=[1, -2]), "analysis.taus", "taus must be > 0, got -2"),
    (lambda c: c["models"]["tiny_qwen2_5_vl"].update(layer_range=[5, 2]), "models.tiny_qwen2_5_vl.layer_range",
     "need 0 <= first <= last"),
])
def test_lad_settings_are_validated_by_their_one_validator(edit, key, message):
    config = copy.deepcopy(raw(DEMO))
    config.setdefault("analysis", {})
    edit(config)
    with pytest.raises(ConfigError, match=f"^study.yaml: {key}: .*{message}"):
        validate_config(config, source="study.yaml")


def test_one_layer_range_parser_reads_every_form():
    from ladbench.methods import LadSettings
    for form in ("21:35", [21, 35], (21, 35)):
        assert parse_layer_range(form) == (21, 35) == LadSettings(layer_range=form).layer_range
    for form in ("all", None):
        assert parse_layer_range(form) is None and LadSettings(layer_range=form).layer_range is None
    assert parse_layer_range("21:35/36") == parse_layer_range([21, 35, 36]) == (21, 35, 36)
    for bad in ("35:21", [35, 21], [1, 2, 3, 4], "1:40/36"):
        with pytest.raises(ValueError, match="layer range"):
            parse_layer_range(bad)


def test_a_model_without_family_runs_through_auto_which_has_no_tiny_build():
    config = raw(PAPER)
    config["models"] = {"m": {"path": "google/gemma-3-4b-it"}}
    assert validate_config(copy.deepcopy(config))["models"]["m"]["family"] == "auto"
    config["models"] = {"m": {"family": "auto", "tiny": True}}
    with pytest.raises(ConfigError, match=r"models.m.tiny: family auto has no tiny build"):
        validate_config(config)
