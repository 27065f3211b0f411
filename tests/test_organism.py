"""The model organism (docs/organism.md): a tiny Qwen2.5-VL trained to have the paper's bias.

The fast tests check the training mechanics (seeded, bit-identical, the exact prompt the
inference stage builds). The slow ones run the organism through the unchanged pipeline
(infer -> calibrate -> evaluate / analyze, via the demo DAG) and assert the paper's four
outcomes, and show that the same pipeline on the untrained organism does not pass them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from ladbench.organism import (OrganismSettings, PromptBuilder, ScenePool, build_untrained, draw_scenes, nearest_scenes,
                               pulled_label, pulled_labels, train_organism)

TINY_BUDGET = dict(steps=2, batch_size=2, n_scenes=16, n_candidates=(4,))


def test_two_trainings_give_bit_identical_weights():
    settings = OrganismSettings(**TINY_BUDGET)
    first, _, log_first = train_organism(settings)
    second, _, log_second = train_organism(dataclasses.replace(settings))
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # ... and training changed them (a test that cannot fail proves nothing)
    untrained, _, _ = build_untrained(settings)
    assert not all(torch.equal(a[k], v) for k, v in untrained.state_dict().items())
    assert log_first["answer"] == log_second["answer"]


def test_another_seed_gives_other_weights():
    first, _, _ = train_organism(OrganismSettings(**TINY_BUDGET))
    second, _, _ = train_organism(OrganismSettings(**{**TINY_BUDGET, "seed": 1}))
    assert not torch.equal(first.lm_head.weight, second.lm_head.weight)


def test_training_prompt_is_the_inference_stage_prompt():
    """Token ids built for training equal what the processor makes of the pipeline's prompt."""
    from PIL import Image

    settings = OrganismSettings(**TINY_BUDGET)
    model, processor, adapter = build_untrained(settings)
    pool = draw_scenes(settings, processor, np.random.default_rng(0))
    prompts = PromptBuilder(adapter, tokens_per_image=4)
    for n in (4, 8):
        ids, (start, end) = prompts.encode(pool.captions[0], n)
        images = [Image.new("RGB", (settings.image_size, settings.image_size))] * n
        expected = adapter.encode([prompts.text(pool.captions[0], n)], [images])["input_ids"][0].tolist()
        assert ids == expected
        assert adapter.tokenizer.decode(ids[start:end]).strip() == pool.captions[0]


def test_config_keys_are_the_training_settings():
    """Every `models.<name>.organism` key of the schema is a setting (a flag of train-organism),
    and every setting is a key, except those the rule derives from the study's config (config=False)."""
    from ladbench.config import load_schema
    from ladbench.settings import setting_fields

    model = load_schema()["properties"]["models"]["additionalProperties"]
    keys = set(model["properties"]["organism"]["properties"])
    derived = {"n_candidates", "image_size", "scene_size"}       # Study.organism_flags in ladbench.workflow
    assert keys == {f.name for f in setting_fields(OrganismSettings)} - derived
    assert {f.name for f in setting_fields(OrganismSettings) if not f.metadata["config"]} == derived


def test_bias_is_position_conditional():
    assert [pulled_label(i, 4) for i in range(4)] == [0, 2, 1, 3]
    assert [pulled_label(i, 8) for i in range(8)] == [0, 2, 1, 3, 4, 6, 5, 7]
    assert [pulled_label(i, 6) for i in range(6)] == [0, 2, 1, 3, 4, 5]     # the 6th has no partner


def test_the_copy_paths_table_is_the_bias():
    """The value readout is trained towards ``pulled_labels(n)[image]``: the same swap."""
    for n in range(2, 10):
        assert pulled_labels(n).tolist() == [pulled_label(i, n) for i in range(n)]


def test_hard_negatives_are_the_targets_nearest_scenes_with_other_objects():
    """Scenes on a line (mean patch = their angle): a scene's nearest are its neighbours on it;
    a hard row's distractors come from them, never share the target's object set, never repeat."""
    from ladbench.organism import NEAREST, _distinct_scenes

    angles = np.linspace(0.0, 1.5, 60)
    patches = torch.from_numpy(np.stack([np.cos(angles), np.sin(angles)], axis=1))[:, None, :].repeat(1, 3, 1)
    nearest = nearest_scenes(patches)
    assert nearest.shape == (60, NEAREST) and not (nearest == np.arange(60)[:, None]).any()
    assert set(nearest[30, :2]) == {29, 31}
    objects = [frozenset({i % 3}) for i in range(60)]
    pool = ScenePool(patches, torch.ones(1, 3), [str(i) for i in range(60)], objects, nearest)
    rng = np.random.default_rng(0)
    for _ in range(50):
        target, *distractors = _distinct_scenes(pool, 8, rng, hard=True)
        assert set(distractors) <= set(nearest[target]) and len(set(distractors)) == 7
        assert all(objects[d] != objects[target] for d in distractors)


@pytest.mark.parametrize("n", range(2, 10))
def test_bias_keeps_every_answer_equally_frequent(n):
    """A permutation of the positions: with targets uniform, the labels are uniform too, so no
    prior over answers (PriDe's) can undo the bias; only knowing where the target is can."""
    assert sorted(pulled_label(i, n) for i in range(n)) == list(range(n))


def test_value_readout_is_the_top_layers_output_for_a_token_attended_alone():
    """The index loss's readout equals the real top layer's attention output, read out by the
    final norm and LM head, for a token that is the only key (softmax weight 1 in every head)."""
    from ladbench.organism import _value_readout

    model, _, _ = build_untrained(OrganismSettings(**TINY_BUDGET))
    text = model.model.language_model
    states = torch.randn(5, text.config.hidden_size, generator=torch.Generator().manual_seed(0))
    top = text.layers[-1]
    expected = []
    for state in states:
        token = state.view(1, 1, -1)
        positions = torch.zeros(3, 1, 1, dtype=torch.long)
        output = top.self_attn(top.input_layernorm(token), attention_mask=None,
                               position_embeddings=text.rotary_emb(token, positions))[0]
        expected.append(model.lm_head(text.norm(output))[0, 0])
    with torch.no_grad():
        torch.testing.assert_close(_value_readout(model, states), torch.stack(expected).detach())


# ------------------------------------------------------------- the same bits on every CPU
# The stages that build the demo's models from a seed, at a test's size (the organism trains
# two steps at N = 4 and two at N = 8), all in one process (torch loads once, which under an
# emulator takes a minute): each stage's weights file.
PORTABLE_BUILDS = {
    "organism": (["train-organism", "--steps", "4", "--batch-size", "2", "--n-scenes", "16"], "model.safetensors"),
    "tiny": (["demo-model", "--family", "qwen2_5_vl"], "model.safetensors"),
    "clip": (["demo-clip"], "ladbench-tiny-clip.pt"),
}
_BUILD_SCRIPT = "import json, sys; from ladbench.cli import main; [main(a) for a in json.loads(sys.argv[1])]"
#: what glibc may use of this CPU's optional instruction sets (its maths functions pick FMA/AVX2
#: variants by them; ATen's baseline kernels call those functions)
GLIBC_MASK = "glibc.cpu.hwcaps=-AVX,-AVX2,-FMA,-FMA4,-AVX512F,-AVX512DQ,-AVX512BW,-AVX512VL"


#: how long one build of the portable models may take (an emulated CPU is the slow one)
BUILD_LIMIT_S = 1800
#: a test that builds them twice, as its own time limit (pyproject's `timeout` is shorter)
builds_twice = pytest.mark.timeout(2 * BUILD_LIMIT_S + 60)


def build_portable_models(out: Path, env: dict, emulator: tuple[str, ...] = ()) -> dict[str, str]:
    """Run the PORTABLE_BUILDS stages as ``ladbench`` runs them (the CLI sets the CPU switches),
    in ``env``, optionally under an ``emulator``; the sha256 of each weights file."""
    import hashlib
    import subprocess
    import sys

    argv = [[*command, "--out", str(out / name)] for name, (command, _) in PORTABLE_BUILDS.items()]
    python = [*emulator, "-0", sys.executable, os.path.realpath(sys.executable)] if emulator else [sys.executable]
    result = subprocess.run([*python, "-c", _BUILD_SCRIPT, json.dumps(argv)], env=env, capture_output=True,
                            text=True, timeout=BUILD_LIMIT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    return {name: hashlib.sha256((out / name / weights).read_bytes()).hexdigest()
            for name, (_, weights) in PORTABLE_BUILDS.items()}


def unpinned_environment() -> dict:
    from ladbench.cpu_paths import PORTABLE_CPU_ENV
    return {k: v for k, v in os.environ.items() if k not in PORTABLE_CPU_ENV and k != "GLIBC_TUNABLES"}


#: switches that tell a library which CPU it runs on instead of letting it look: true of this
#: host, false of an emulated one (CI machines set OPENBLAS_CORETYPE=Haswell, and numpy's OpenBLAS
#: then runs AVX2 code on the emulated Nehalem: SIGILL before the first stage)
HOST_CPU_CLAIMS = ("OPENBLAS_CORETYPE", "MKL_DEBUG_CPU_TYPE", "MKL_ENABLE_INSTRUCTIONS")


def emulated_cpu_environment() -> dict:
    """:func:`unpinned_environment` less :data:`HOST_CPU_CLAIMS`: each library looks at the
    emulated CPU itself."""
    return {k: v for k, v in unpinned_environment().items() if k not in HOST_CPU_CLAIMS}


@builds_twice
def test_weights_do_not_depend_on_the_instruction_sets_this_machine_can_mask(tmp_path):
    """Built once as a user runs the stages (nothing set: each library would use the best this
    CPU has) and once as a CPU without AVX, AVX2, FMA or AVX-512 would run them, as far as one
    machine can pretend: the libraries' own switches at their lowest level, and glibc's maths
    (which ATen's baseline kernels call) masked. The stages pin the switches themselves, so the
    bits are the same. What this cannot show, another CPU's own choices (vendor, caches), the
    emulated CPU below shows."""
    from ladbench.cpu_paths import PORTABLE_CPU_ENV

    normal = build_portable_models(tmp_path / "normal", unpinned_environment())
    masked = build_portable_models(tmp_path / "masked",
                                   {**unpinned_environment(), **PORTABLE_CPU_ENV, "GLIBC_TUNABLES": GLIBC_MASK})
    assert normal == masked
    meta = json.loads((tmp_path / "normal" / "organism" / "ladbench_tiny.json").read_text())
    assert meta["training"]["cpu_paths"] == {"aten": "DEFAULT", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "COMPATIBLE"}


def qemu_or_skip() -> str:
    """qemu-x86_64 (Debian's qemu-user, which .ci/run installs), or skip saying so."""
    import shutil

    if shutil.which("qemu-x86_64") is None:
        pytest.skip("needs qemu-x86_64 (Debian: apt-get install qemu-user; .ci/run installs it)")
    return shutil.which("qemu-x86_64")


@pytest.mark.slow
@builds_twice
def test_weights_are_the_same_bits_on_an_emulated_older_cpu(tmp_path):
    """The demo's models built on this CPU and on another one: qemu-x86_64 emulating an Intel
    Nehalem (SSE4.2 only: no AVX, AVX2, FMA or AVX-512; another vendor than an AMD host, other
    caches), the oldest CPU this software stack runs on (numpy 2.4 needs x86-64-v2). Every
    library sees that CPU, so each picks what it would pick there."""
    emulator = qemu_or_skip()
    native = build_portable_models(tmp_path / "native", unpinned_environment())
    emulated = build_portable_models(tmp_path / "emulated", emulated_cpu_environment(),
                                     (emulator, "-cpu", "Nehalem"))
    assert native == emulated


# ------------------------------------------------------------------ through the pipeline
# The demo's organism (trained by the DAG from the demo's spec) and the same architecture with
# its untrained initial weights, through the unchanged pipeline on the demo's four benchmarks,
# in one DAG run (the benchmarks are built once, the two models run side by side).
DEMO_ORGANISM = "organism_qwen2_5_vl"


@pytest.fixture(scope="module")
def pipeline_outcomes(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """model ("organism", "untrained") -> benchmark -> :func:`outcomes_from_files`, and the
    trained organism's weights file (key "weights")."""
    import yaml
    from workflow_runner import FULL_DEMO_CONFIG, snakemake

    from ladbench.config import load_config, study_benchmarks
    from ladbench.organism import outcomes_from_files, save_organism

    workdir = tmp_path_factory.mktemp("organism")
    config = yaml.safe_load(FULL_DEMO_CONFIG.read_text())
    spec = config["models"][DEMO_ORGANISM]
    settings = OrganismSettings(**spec["organism"])
    model, processor, _ = build_untrained(settings)
    untrained = save_organism(model, processor, settings, {"steps_run": 0}, str(workdir / "untrained"))
    config["models"] = {"organism": spec, "untrained": {"family": "qwen2_5_vl", "path": untrained,
                                                        **{k: spec[k] for k in ("layer_range", "batch_size")}}}
    config["inference"]["variants"] = {"vanilla": config["inference"]["variants"]["vanilla"]}
    config["evaluation"]["transfer"] = []
    path = workdir / "organism.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))

    benchmarks = study_benchmarks(load_config(path))
    out = workdir / "results" / "demo"
    files = {(m, b): (out / "eval" / m / b / "vanilla" / f"cal-{b}.json", out / "analysis" / m / b / "vanilla.json")
             for m in config["models"] for b in benchmarks}
    snakemake(workdir, *[str(p.relative_to(workdir)) for pair in files.values() for p in pair], configfile=path,
              timeout=2400)
    outcomes = {m: {b: outcomes_from_files(*files[m, b]) for b in benchmarks} for m in config["models"]}
    return {**outcomes, "weights": out / "models" / "organism" / "model.safetensors"}


def readme_organism_sha256() -> str:
    """The sha256 of the demo organism's weights that the README states."""
    import re
    from workflow_runner import ROOT

    found = re.findall(r"model\.safetensors`\) has sha256 `([0-9a-f]{64})`", (ROOT / "README.md").read_text())
    assert len(found) == 1, "the README states the demo organism's sha256 once"
    return found[0]


@pytest.mark.slow
def test_trained_organism_shows_the_papers_four_outcomes(pipeline_outcomes):
    """The demo's organism through the unchanged pipeline: the four outcomes on every demo
    benchmark (docs/organism.md, "What it reaches, over five seeds"), and a greedy reply that
    ends after the answer, so the reference's readout parses and agrees with the argmax."""
    for benchmark, result in pipeline_outcomes["organism"].items():
        assert all(result["passed"].values()), (benchmark, result)
        assert result["greedy_parsed"] >= 95 and result["greedy_agrees"] >= 95, (benchmark, result)


@pytest.mark.slow
def test_demo_organism_is_the_weights_the_readme_states(pipeline_outcomes):
    """The very weights the README states, which any x86-64 machine trains from the demo's seed."""
    import hashlib

    assert hashlib.sha256(pipeline_outcomes["weights"].read_bytes()).hexdigest() == readme_organism_sha256()


@pytest.mark.slow
def test_untrained_organism_does_not_show_them(pipeline_outcomes):
    """The same architecture, tokenizer and pipeline with the organism's random initial
    weights: the outcomes are the training's doing, not the pipeline's."""
    for benchmark, result in pipeline_outcomes["untrained"].items():
        assert not all(result["passed"].values()), f"{benchmark}: {result}"


def test_model_kind_is_read_from_the_folders_metadata(tmp_path):
    """What the report labels numbers by: the folder's ladbench_tiny.json, not its name."""
    from ladbench.models.tiny import build_tiny_model
    from ladbench.organism import save_organism
    from ladbench.provenance import PRETRAINED, TINY_ORGANISM, TINY_RANDOM, model_kind

    settings = OrganismSettings(**TINY_BUDGET)
    model, processor, _ = build_untrained(settings)
    organism = save_organism(model, processor, settings, {}, str(tmp_path / "tiny_random_looking_name"))
    random_model = build_tiny_model("qwen2_5_vl", str(tmp_path / "organism_looking_name"))
    assert model_kind(organism) == TINY_ORGANISM
    assert model_kind(random_model) == TINY_RANDOM
    assert model_kind(str(tmp_path)) == PRETRAINED


def test_the_rule_retrains_when_the_training_code_or_its_defaults_change(tmp_path):
    """train_organism hands over only the keys the config gives; the others are OrganismSettings'
    defaults, so the module that states them is an input of the rule beside the training's code:
    a default changed there retrains the organism, as a change of the training does."""
    from importlib.util import find_spec
    from workflow_runner import FULL_DEMO_CONFIG, snakemake

    planned = snakemake(tmp_path, "--dry-run", configfile=FULL_DEMO_CONFIG).split("rule train_organism:")[1]
    line = next(line for line in planned.splitlines() if line.strip().startswith("input:"))
    inputs = {os.path.realpath(path.strip().removesuffix("(cached)").strip()) for path in line.split(":", 1)[1].split(",")}
    modules = {os.path.realpath(find_spec(name).origin) for name in ("ladbench.organism", "ladbench.organism_settings")}
    assert modules <= inputs, inputs
