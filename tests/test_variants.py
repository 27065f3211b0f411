"""The prompt-variant registry (ladbench.variants) and the method registry's metadata: the
schema, the infer stage, evaluate and the report derive from them; the caches of the
existing variants keep their identity; a variant registered in one place (a plugin) runs
through the workflow."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import numpy as np
import pytest
import yaml

from ladbench.config import ConfigError, load_schema, validate_config
from ladbench.inference.prompts import IDENTIFIER_FORMATS
from ladbench.methods import METHODS
from ladbench.plugins import load_plugins
from ladbench.variants import VARIANTS, PromptVariant, SofaSettings, prompt_sha256, prompt_text, variant

DEMO = Path(__file__).resolve().parents[1] / "workflow" / "demo" / "config.yaml"


def _inference_schema() -> dict:
    return load_schema()["properties"]["inference"]["properties"]


# --------------------------------------------------------------------------- one fact, one place


def test_the_schema_lists_exactly_the_registered_variants():
    enum = _inference_schema()["variants"]["additionalProperties"]["properties"]["prompt"]["enum"]
    assert enum == list(VARIANTS)


def test_the_schema_states_each_variants_settings_as_its_dataclass():
    blocks = _inference_schema()["prompt_settings"]["properties"]
    with_settings = {name for name, v in VARIANTS.items() if fields(v.settings)}
    assert set(blocks) == with_settings
    for name in with_settings:
        declared = {f.name: f.default for f in fields(VARIANTS[name].settings) if f.default is not MISSING}
        assert {key: spec["default"] for key, spec in blocks[name]["properties"].items()} == declared, name


def test_the_default_methods_on_vanilla_caches_are_the_vanilla_variants():
    methods = load_schema()["properties"]["evaluation"]["properties"]["methods"]
    assert tuple(methods["default"]) == VARIANTS["vanilla"].methods


def test_method_metadata_lives_on_the_registry():
    assert {n for n, m in METHODS.items() if m.needs_calibration} == {"pride", "pride_original", "lad",
                                                                        "purified_attention"}
    assert {n for n, m in METHODS.items() if m.reads_shifts} == {"permutation_average"}
    for name, method in METHODS.items():
        assert method.label and (method.reads is None or method.reads in VARIANTS), name
    for v in VARIANTS.values():
        assert v.methods and all(m in METHODS for m in v.methods), v.name
    # methods that read no single variant are listed by the variants that they read
    assert {v.name for v in VARIANTS.values() if "generated" in v.methods} == {"cot", "sc"}


# --------------------------------------------------------------------------- behaviour unchanged

# Taken on main before the registry existed (ladbench 0a7ce5f): the cache identity of each
# variant at its defaults, and every prompt text. A change here makes old caches unusable.
HASHED_SETTINGS_SHA256 = {
    "vanilla": "5f25b47f1c2477ddb009126fdc1194f73face5868fbd74c10f27a257842c3a4a",
    "instruction": "4ccae454ba9c38f4a117983f26013b1305565a716a36f9d9732640128596d8ad",
    "sofa": "4960ccf8f1657c0a7c15dbea43ff7917687d1407443659b29666508c005547c9",
    "permavg": "5ab2753a3eace367d321dd7314d6a0be73165276bf1fd1d98552aade4df7c86d",
    "cot": "5f374ce11d2fc4e42818d3201222e2c36f00b64fc800db193ce082d603d45ba6",
    "sc": "3b695bc4e06ebb2844c9f290baecfdac563969556b1acd15d8fad3ffd354c778",
}
# Taken at 58efa05 (cache format 2): config_sha256 of the fixed files of the test below.
FIXED_INPUTS_CONFIG_SHA256 = "7b500d65c06629a69bcb12f07721efaa4d9ac3909ff97f1e246747442f5351f4"
PROMPTS_SHA256 = "b2dc22faa75743cea592cc2062964f13cf90e5c5af4f8684002a378454a2ed3f"


def _settings(prompt: str, **overrides):
    from ladbench.inference.runner import InferenceSettings
    return InferenceSettings(benchmark="b.json", images="i.json", out="o.h5", model_name="m", family="qwen2_5_vl",
                             model_path="Qwen/Qwen2.5-VL-3B-Instruct", prompt=prompt, **overrides)


def _digest(document) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("prompt", list(HASHED_SETTINGS_SHA256))
def test_the_cache_identity_of_each_existing_variant_is_unchanged(prompt):
    assert _digest(_settings(prompt).hashed_fields()) == HASHED_SETTINGS_SHA256[prompt]


def test_the_cache_identity_of_fixed_input_files_is_unchanged(tmp_path):
    """A cache's whole identity over fixed inputs: the settings, the benchmark file's bytes, the
    image table's content, the model folder's config and weights, and the cache format. A change in
    any rule here (a format number, what a fingerprint reads) rebuilds every cache a user has, GPU
    hours of them; where that is meant, the digest below changes in the same commit."""
    from ladbench.inference.runner import InferenceSettings, config_sha256
    bench = tmp_path / "benchmark.json"
    bench.write_bytes(b'{"n_candidates": 4, "eval": []}')
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(b'{"model_type": "qwen2_5_vl"}')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    (model / "README.md").write_text("not part of the identity")
    table = {"image_root": str(tmp_path / "anywhere"),
             "images": [{"image_id": 1, "file_name": "a.jpg", "caption": "a dog"},
                        {"image_id": 2, "file_name": "b.jpg", "caption": "a cat", "sha256": "0" * 64}]}
    settings = InferenceSettings(benchmark=str(bench), images="i.json", out="o.h5", model_name="m", family="qwen2_5_vl",
                                 model_path=str(model), prompt="vanilla")
    assert config_sha256(settings, str(bench), table) == FIXED_INPUTS_CONFIG_SHA256


def test_the_prompt_texts_are_unchanged():
    texts = {f"{v}/{fmt}/{n}": prompt_sha256(v, n, fmt)
             for v in HASHED_SETTINGS_SHA256 for fmt in IDENTIFIER_FORMATS for n in (2, 4, 8, 12)}
    assert _digest(texts) == PROMPTS_SHA256


def test_a_variants_settings_enter_its_caches_identity_only():
    default = _settings("sofa").hashed_fields()
    changed = _settings("sofa", options=SofaSettings(sigma=0.25)).hashed_fields()
    assert changed == {**default, "sofa_sigma": 0.25}
    assert not any(key.startswith(("sofa_", "sc_", "cot_")) for key in _settings("vanilla").hashed_fields())
    with pytest.raises(ValueError, match="SofaSettings"):
        _settings("vanilla", options=SofaSettings()).validate()


def test_infer_flags_come_from_the_registry():
    from ladbench.cli import build_parser
    from ladbench.stages.infer import _settings_from_args

    base = ["infer", "--benchmark", "b", "--images", "i", "--out", "o.h5", "--model-name", "m",
            "--family", "qwen2_5_vl", "--model-path", "p"]
    args = build_parser("infer").parse_args(base + ["--prompt", "sc", "--sc-samples", "3"])
    options = _settings_from_args(args).options
    assert (options.samples, options.temperature, options.max_new_tokens) == (3, 0.7, 512)
    with pytest.raises(ValueError, match="must be >= 1"):
        _settings_from_args(build_parser("infer").parse_args(base + ["--prompt", "sc", "--sc-samples", "0"]))


# --------------------------------------------------------------------------- evaluate


def _shifted_cache(path, pick_first: float, prefer: int) -> dict:
    """A permavg cache (N = 4, one instance, two orderings, each at its 4 cyclic shifts): every
    row scores position 0 by ``pick_first`` more and image ``prefer`` by 1 more."""
    from ladbench.inference.cache import CacheLayout, CacheWriter, plan_rows

    n = 4
    bench = {"n_candidates": n, "n_orderings": 2, "calibration": [],
             "eval": [{"id": 0, "caption": "c", "target": 10 + prefer, "candidates": [10 + k for k in range(n)],
                       "orderings": [[0, 1, 2, 3], [3, 2, 1, 0]]}]}
    plan = plan_rows(bench, shifts_per_ordering=True)
    scores = (plan.order == prefer).astype(np.float32) + np.array([pick_first, 0, 0, 0], np.float32)
    writer = CacheWriter.open(str(path), plan, CacheLayout(n, 2, n_heads=1),
                              {"config_sha256": "t", "model": "toy", "variant": "permavg", "n_candidates": n,
                               "n_layers": 2})
    writer.write(np.arange(len(plan)), {"scores": scores, "attn": np.full((len(plan), 2, n), 0.2, np.float32),
                                        "attn_text": np.full((len(plan), 2), 0.2, np.float32)})
    writer.finish({"rows_per_s": 1.0})
    return bench


def test_a_permavg_cache_is_evaluated_by_its_variants_method(tmp_path):
    from ladbench.cli import main

    cache = tmp_path / "permavg.h5"
    _shifted_cache(cache, pick_first=10.0, prefer=2)
    out = tmp_path / "eval.json"
    main(["evaluate", "--cache", str(cache), "--bootstrap", "0", "--out", str(out)])
    result = json.loads(out.read_text())
    # averaged over the shifts, the bias toward position 0 falls on every image alike: image 2 wins,
    # and it sits at position 2 (1) of the unshifted first (second) ordering, the target's
    assert list(result["methods"]) == ["permutation_average"] and result["n_orderings"] == 2
    assert result["methods"]["permutation_average"]["acc_mean"] == 100.0
    assert np.load(out.with_suffix(".npz"))["pred_permutation_average"].tolist() == [[2, 1]]
    with pytest.raises(SystemExit):
        main(["evaluate", "--cache", str(cache), "--methods", "vanilla", "--bootstrap", "0", "--out", str(out)])


# --------------------------------------------------------------------------- a new variant in one place

TOY_PLUGIN = '''
from ladbench.inference.prompts import answer_prompt
from ladbench.variants import PromptVariant, register_variant

register_variant(PromptVariant("toy", "Toy (look closely)", answer_prompt("Look closely at every image."),
                               table="table1", place=2.5))
'''


@pytest.fixture
def toy_plugin(tmp_path, monkeypatch):
    """The toy variant's plugin module on sys.path; the registry restored afterwards."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "ladbench_toy_variant.py").write_text(TOY_PLUGIN)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr("ladbench.plugins._LOADED", [])
    yield folder
    VARIANTS.pop("toy", None)
    sys.modules.pop("ladbench_toy_variant", None)


def test_a_plugin_variant_is_known_to_the_config_and_the_prompts(toy_plugin):
    config = yaml.safe_load(DEMO.read_text())
    config["inference"]["variants"]["toy"] = {"prompt": "toy"}
    with pytest.raises(ConfigError, match=r"inference.variants.toy.prompt: 'toy' is not one of"):
        validate_config(yaml.safe_load(yaml.safe_dump(config)))
    config["plugins"] = ["ladbench_toy_variant"]
    validate_config(config)
    assert "Look closely at every image. Respond with the index number" in prompt_text("toy", 4, "a cat")
    assert variant("toy").methods == ("vanilla",) and not variant("toy").generative
    config["plugins"] = ["no_such_plugin_module"]
    with pytest.raises(ConfigError, match="plugins: plugin module 'no_such_plugin_module' cannot be imported"):
        validate_config(config)


def install_entry_point(folder, module: str, name: str = "toy") -> None:
    """An installed distribution in ``folder`` (on sys.path) whose ``ladbench.plugins`` entry point names ``module``."""
    dist = folder / "ladbench_toy-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ladbench-toy\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[ladbench.plugins]\n{name} = {module}\n")


def test_an_installed_plugin_registers_through_its_entry_point(toy_plugin, monkeypatch):
    """Installed (an entry point of the ladbench.plugins group), the toy plugin needs no
    ``plugins`` entry in the config nor anything in the environment."""
    monkeypatch.delenv("LADBENCH_PLUGINS", raising=False)
    config = yaml.safe_load(DEMO.read_text())
    config["inference"]["variants"]["toy"] = {"prompt": "toy"}
    with pytest.raises(ConfigError, match=r"inference.variants.toy.prompt: 'toy' is not one of"):
        validate_config(yaml.safe_load(yaml.safe_dump(config)))
    install_entry_point(toy_plugin, "ladbench_toy_variant")
    validate_config(config)
    assert variant("toy").label == "Toy (look closely)"
    assert load_plugins() == ["ladbench_toy_variant"]           # imported once, however often asked


def test_a_registered_variant_needs_a_parser_when_generative():
    with pytest.raises(ValueError, match="needs parse"):
        PromptVariant("x", "X", prompt_text, kind="generative")


@pytest.mark.slow
def test_a_variant_registered_in_one_place_runs_through_the_demo_dag(tmp_path, toy_plugin):
    """The toy plugin, named in the config, through the demo DAG (one model, N = 4, one
    setting): its cache, its evaluation and its rows in Tables 1 and 2."""
    from workflow_runner import DEMO_CONFIG, snakemake

    config = yaml.safe_load(DEMO_CONFIG.read_text())
    config["plugins"] = ["ladbench_toy_variant"]
    config["inference"]["variants"] = {"toy": {"prompt": "toy", "identifiers": "digits"}}
    config["benchmarks"]["settings"] = ["random"]
    config["evaluation"]["transfer"] = []
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    workdir = tmp_path / "run"
    workdir.mkdir()
    snakemake(workdir, "results/demo/report/table1.md", configfile=path,
              extra_env={"PYTHONPATH": str(toy_plugin)})

    out = workdir / "results" / "demo"
    from ladbench.inference.cache import read_cache_attributes
    attrs = read_cache_attributes(str(out / "cache" / "tiny_qwen2_5_vl" / "scenes_random_N4" / "toy.h5"))
    assert attrs["variant"] == "toy" and attrs["prompt_sha256"] != prompt_sha256("vanilla", 4, "digits")
    evaluation = json.loads(
        (out / "eval" / "tiny_qwen2_5_vl" / "scenes_random_N4" / "toy" / "cal-scenes_random_N4.json").read_text())
    assert list(evaluation["methods"]) == ["vanilla"] and evaluation["prompt"] == "toy"
    rows = [line for line in (out / "report" / "table1.md").read_text().splitlines() if "Toy (look closely)" in line]
    assert len(rows) == 1 and rows[0].split("|")[3].strip() != "–"
    acc = evaluation["methods"]["vanilla"]["acc_mean"]
    assert rows[0].split("|")[3].strip().startswith(f"{acc:.2f}")
    assert "Toy (look closely)" in (out / "report" / "table2.md").read_text()
