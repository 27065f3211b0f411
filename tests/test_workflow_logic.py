"""The workflow's logic (ladbench.workflow), without Snakemake: the start-up checks, the
command lines each rule hands its stage (parsed by the stage's own parser), the target lists,
the methods and calibrations of each cache, the paths and the report's marks. The DAG tests
(test_workflow.py, test_config.py) run the same code through a Snakefile."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from ladbench.cli import build_parser
from ladbench.config import ConfigError
from ladbench.evaluation import default_methods
from ladbench.methods import METHODS, LadSettings
from ladbench.stages.options import from_args
from ladbench.workflow import Study, flags, start

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
DEMO = ROOT / "workflow" / "demo" / "config.yaml"
PAPER = ROOT / "config.yaml"


def study_of(path: Path, edit=None, tmp_path: Path | None = None, **report) -> Study:
    config = yaml.safe_load(path.read_text())
    if edit:
        edit(config)
    if tmp_path is not None:
        path = tmp_path / "study.yaml"
        path.write_text(yaml.safe_dump(config))
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("HF_HUB_OFFLINE", raising=False)      # the paper's models are on the hub, not here
        study, _ = start(config, [str(path)], str(SCHEMA), **report)
    return study


@pytest.fixture(scope="module")
def paper():
    return study_of(PAPER)


@pytest.fixture(scope="module")
def demo():
    return study_of(DEMO)


def parsed(command: str, *argv: str):
    """``ladbench <command> argv`` parsed by the stage's own parser (an unknown flag: SystemExit)."""
    words = command.split()
    return build_parser(words[0]).parse_args([*words, *(word for arg in argv for word in shlex.split(arg))])


def test_start_validates_the_config_and_fills_its_defaults(tmp_path):
    study = study_of(DEMO, lambda c: c.pop("lad", None), tmp_path)
    assert study.config["lad"]["tau"] == LadSettings().tau                       # the carrier's default
    with pytest.raises(ConfigError, match=r"^\S+study.yaml: lad.tau: tau must be > 0, got -1.0$"):
        study_of(DEMO, lambda c: c.update(lad={"tau": -1.0}), tmp_path)
    with pytest.raises(ConfigError, match=r"evaluation.transfer.*nope_random_N4"):
        study_of(DEMO, lambda c: c["evaluation"].update(
            transfer=[{"calibrate_on": "nope_random_N4", "evaluate_on": "scenes_random_N4"}]), tmp_path)


def test_every_rule_hands_its_stage_flags_the_stage_knows(paper, demo):
    """Each rule's options, parsed by its command's parser, give the config's values."""
    for study in (paper, demo):
        lad = LadSettings(**study.config["lad"])
        for model in study.models:
            for benchmark in study.benchmarks:
                for variant in study.variants:
                    w = SimpleNamespace(model=model, benchmark=benchmark, variant=variant, cal_benchmark=benchmark)
                    args = parsed("evaluate", study.evaluation_flags(w), "--cache c.h5 --out e.json")
                    assert args.methods == study.variant_methods(variant) and not args.transfer
                    assert replace(from_args(LadSettings, args), layer_range=lad.layer_range) == lad
                    infer = parsed("infer", study.infer_flags(w), "--benchmark b.json --images i.json --out c.h5")
                    assert (infer.model_name, infer.variant_name, infer.prompt) == (model, variant, study.prompt(variant))
                analysis = parsed("analyze", study.analysis_flags(w), "--cache c.h5 --out a.json")
                assert analysis.seeds == study.cal_seeds and analysis.n_cal == study.n_cal
        for dataset in study.config["datasets"]:
            parsed("captions", study.captions_flags(SimpleNamespace(dataset=dataset)), "--dataset d --out t.json")
            parsed("benchmark", study.benchmark_flags(SimpleNamespace(dataset=dataset)),
                   "--images t --features f --setting random --n-candidates 4 --out b.json")
        parsed("features", study.clip_flags(), "--images t.json --out f.h5")
        parsed("calibrate", study.calibration_flags(), "--cache c.h5 --out c.npz")
        parsed("explore", study.explorer_flags(), "--cache c.h5 --calibration c.npz --evaluation e.json --out p.html")
        parsed("report tables", study.study_flags(), study.table_flags(), "--evaluations e --out-dir r")
    for model in demo.organisms:
        parsed("train-organism", demo.organism_flags(SimpleNamespace(model=model)), "--out o")


# The sections whose carriers hold required inputs or whose keys the workflow also reads itself
# (inference: shards, a model's batch size; clip: a tiny model): section -> (the stage, its keys
# that are no carrier's: config key -> the stage's argument or None when the workflow's own,
# the carrier's keys the workflow replaces). Every key of the carriers is checked (a new field
# is found, set to another value, and must arrive).
HAND_OVER = {
    "inference": ("infer", {"shards": "shard_count", "variants": None, "prompt_settings": None}, set()),
    "benchmarks": ("benchmark", {"datasets": None, "settings": None, "n_candidates": None}, set()),  # targets, wildcards
    "clip": ("features", {"tiny": None}, {"model", "pretrained"}),    # a tiny CLIP: clip_flags names its own files
}


def other_value(f):
    """A valid value of the setting field ``f`` other than its default (choices, bounds, pattern)."""
    from ladbench.settings import kind

    meta, default = f.metadata, f.default
    if meta.get("choices"):
        return next(c for c in meta["choices"] if c != default)
    if kind(f) is bool:
        return not default
    if meta.get("pattern"):
        return next(c for c in ("cpu", "cuda:1", "x") if c != default and re.fullmatch(meta["pattern"], c))
    if default is None:
        return (meta.get("minimum") or 0) + 2
    value = default + 1 if kind(f) is int else default / 2
    return value if meta.get("maximum") is None or value <= meta["maximum"] else default - 1


@pytest.mark.parametrize("section", HAND_OVER)
def test_every_key_of_these_sections_reaches_its_stage(section, tmp_path):
    """Each key, set to a value other than its default, arrives in the stage's parsed arguments."""
    from ladbench.config import load_schema, settings_carriers
    from ladbench.settings import config_key, setting_fields

    command, own, replaced = HAND_OVER[section]
    block = load_schema()["properties"][section]
    carried = {config_key(f): f for carrier in settings_carriers(block) for f in setting_fields(carrier)
               if f.metadata["config"] and f.metadata["flag"] and config_key(f) not in replaced}
    keys = set(block["properties"])
    assert keys == set(carried) | set(own) | replaced, f"map the new keys of {section}: {sorted(keys - set(carried))}"
    changed = {key: other_value(f) for key, f in carried.items()}
    dests = {key: f.name for key, f in carried.items()}
    if section == "inference":
        changed["shards"], dests["shards"] = 2, "shard_count"

    def edit(config):
        config.setdefault(section, {}).update(changed)
        for model in config["models"].values():
            model.pop("batch_size", None)          # a model's own batch size wins over the section's (tested below)
    study = study_of(DEMO, edit, tmp_path)
    w = SimpleNamespace(model=study.models[0], benchmark=study.benchmarks[0], variant="vanilla", dataset="scenes",
                        shard="0")
    options = {"infer": lambda: study.infer_flags(w), "benchmark": lambda: study.benchmark_flags(w),
               "features": study.clip_flags}[command]()
    args = parsed(command, options, REQUIRED[command])
    for key, dest in dests.items():
        assert getattr(args, dest) == changed[key], (section, key)
    if section == "inference":
        study.config["models"][w.model]["batch_size"] = 4
        assert parsed(command, study.infer_flags(w), REQUIRED[command]).batch_size == 4


REQUIRED = {"infer": "--benchmark b --images i --out c.h5", "benchmark": "--images t --features f --setting random "
            "--n-candidates 4 --out b.json", "features": "--images t.json --out f.h5"}


def test_a_transfer_evaluation_says_so_and_reads_the_other_benchmarks_calibrations(demo):
    (target,) = [t for t in demo.config["evaluation"]["transfer"]][:1]
    w = SimpleNamespace(model=demo.models[0], benchmark=target["evaluate_on"], variant="vanilla",
                        cal_benchmark=target["calibrate_on"])
    assert parsed("evaluate", demo.evaluation_flags(w), "--cache c --out e.json").transfer
    calibrations = demo.evaluation_inputs(w)["calibrations"]
    assert calibrations == [demo.calibration_file(w.model, target["calibrate_on"], "vanilla", seed)
                            for seed in demo.cal_seeds]
    assert demo.evaluation_file(w.model, w.benchmark, "vanilla", w.cal_benchmark) in demo.transfers


def test_each_cache_gets_its_variants_methods_and_calibrations_only_when_one_reads_them(paper):
    assert paper.variant_methods("vanilla") == paper.config["evaluation"]["methods"]
    for variant in paper.variants:
        prompt = paper.prompt(variant)
        if prompt != "vanilla":
            assert paper.variant_methods(variant) == default_methods(prompt)
        needs = any(METHODS[m].needs_calibration for m in paper.variant_methods(variant))
        assert paper.needs_calibration(variant) == needs
        w = SimpleNamespace(model=paper.models[0], benchmark=paper.benchmarks[0], variant=variant,
                            cal_benchmark=paper.benchmarks[0])
        assert ("calibrations" in paper.evaluation_inputs(w)) == needs
    assert paper.needs_calibration("vanilla") and not paper.needs_calibration("cot")


def test_the_target_lists_follow_the_config(paper):
    models, benchmarks, variants = paper.models, paper.benchmarks, paper.variants
    vanilla = [v for v in variants if paper.prompt(v) == "vanilla"]
    calibrated = [v for v in variants if paper.needs_calibration(v)]
    assert len(paper.evaluations) == len(paper.caches) == len(models) * len(benchmarks) * len(variants)
    assert paper.analyses == [paper.analysis_file(m, b, v) for m in models for b in benchmarks for v in vanilla]
    assert len(paper.transfers) == len(models) * len(calibrated) * len(paper.config["evaluation"]["transfer"])
    assert paper.explorer_keys == [(m, b, v) for m in models for b in benchmarks for v in vanilla if v in calibrated]
    figures = paper.report_figures()
    n_formats = len(paper.config["report"]["figure_formats"])
    assert len(figures) == n_formats * (4 * len(models) * len(benchmarks) * len(vanilla) + 2 * len(models))


def test_no_two_outputs_share_a_path_and_all_lie_in_the_output_folder(paper):
    w = SimpleNamespace(model=paper.models[0], benchmark=paper.benchmarks[0], variant="vanilla")
    outputs = [*paper.evaluations, *paper.transfers, *paper.analyses, *paper.caches, *paper.explorers,
               paper.explorer_index, *paper.table_files(), *paper.report_figures(),
               *(paper.evaluation_file(*key, ext="npz") for key in paper.explorer_keys),
               *(paper.analysis_file(m, b, v, "npz") for m, b, v in paper.explorer_keys),
               *(paper.benchmark_file(b) for b in paper.benchmarks), *paper.shard_files(w),
               *(paper.calibration_file(m, b, v, s) for m, b, v in paper.explorer_keys for s in paper.cal_seeds),
               *(f(d) for d in paper.config["datasets"] for f in (paper.image_table, paper.features_file))]
    assert len(outputs) == len(set(outputs))
    assert all(path.startswith(paper.out + "/") for path in outputs)


def test_shards_split_a_cache_into_numbered_jobs(tmp_path):
    study = study_of(DEMO, lambda c: c["inference"].update(shards=3), tmp_path)
    w = SimpleNamespace(model=study.models[0], benchmark=study.benchmarks[0], variant="vanilla")
    assert [Path(p).name for p in study.shard_files(w)] == ["0-of-3.h5", "1-of-3.h5", "2-of-3.h5"]
    assert study.infer_output().endswith("/{variant}/{shard}-of-3.h5") and study.infer_log().endswith("{shard}-of-3.log")
    assert study_of(DEMO).infer_output() == study.cache_file("{model}", "{benchmark}", "{variant}")
    args = parsed("infer", study.infer_flags(SimpleNamespace(**vars(w), shard="1")), "--benchmark b --images i --out c.h5")
    assert (args.shard_index, args.shard_count) == (1, 3)
    unsharded = parsed("infer", study_of(DEMO).infer_flags(w), "--benchmark b --images i --out c.h5")
    assert unsharded.shard_count == 1


def test_a_datasets_files_come_from_its_root_unless_named(tmp_path):
    def local_coco(config):
        config["datasets"]["coco"] = {"source": "coco", "root": "/data/coco", "download": False,
                                      "captions_json": "/elsewhere/captions.json"}
    study = study_of(DEMO, local_coco, tmp_path)
    assert study.raw_dataset_files("coco") == {"captions": "/elsewhere/captions.json",
                                               "instances": "/data/coco/annotations/instances_val2014.json",
                                               "images": "/data/coco/val2014"}
    assert study.captions_inputs(SimpleNamespace(dataset="coco")) == [
        "/elsewhere/captions.json", "/data/coco/annotations/instances_val2014.json", "/data/coco/val2014"]
    assert study.captions_inputs(SimpleNamespace(dataset="scenes")) == [study.scenes_dir("scenes")]
    study.config["datasets"]["coco"]["reference_tables"] = "/ref"
    assert study.annotation_files("coco")["instances"] is None             # the reference's tables replace it
    assert study.captions_inputs(SimpleNamespace(dataset="coco"))[-2:] == [
        "/ref/" + Path(p).name for p in study.reference_table_files("coco")]


def test_the_report_marks_the_html_tables_and_one_format_of_each_figure(tmp_path):
    marked = []
    study = study_of(DEMO, lambda c: c.setdefault("report", {}).update(figure_formats=["pdf", "png"]), tmp_path,
                     report=lambda path, **how: marked.append((path, how)) or path)
    tables = study.table_files()
    assert [path for path, _ in marked] == [path for path in tables if path.endswith(".html")]
    marked.clear()
    study.figure_files("confusion", "Fig. 1")
    assert marked == [(f"{study.report_dir}/figures/confusion_{{model}}_{{benchmark}}_{{variant}}.png",
                       {"caption": "../report/confusion.rst", "category": "Figures", "subcategory": "Fig. 1"})]


def test_the_jobs_inherit_the_plugins_the_ladbench_and_the_caches_folder(tmp_path, monkeypatch):
    for key in ("LADBENCH_PLUGINS", "MPLCONFIGDIR", "PATH"):
        monkeypatch.setenv(key, os.environ.get(key, ""))         # restored afterwards
    study = study_of(DEMO, lambda c: c.update(output_dir=str(tmp_path / "out")), tmp_path)
    study.config["plugins"] = ["a_plugin", "another"]
    study.prepare_jobs()
    assert os.environ["LADBENCH_PLUGINS"] == "a_plugin,another"
    assert os.environ["MPLCONFIGDIR"] == str(tmp_path / "out" / ".cache" / "matplotlib")


def test_flags_spell_the_options():
    assert flags(tau=5, top_k=None, transfer=False, verbose=True, seeds=[0, 1], title="a b") == \
        "--tau 5 --verbose --seeds 0 1 --title 'a b'"


def test_tiny_models_cpu_jobs_claim_one_core_so_the_demo_runs_beside_the_organisms_training(paper, demo, tmp_path):
    """The organism's training holds one core for minutes; a CPU job claiming two could not
    start beside it (the demo's other core idled for the whole training before)."""
    for model in demo.models:
        assert demo.infer_threads(SimpleNamespace(model=model)) == 1, model
    assert demo.features_threads(SimpleNamespace(dataset="scenes")) == 1
    on_cpu = study_of(PAPER, lambda c: c["inference"].update(device="cpu"), tmp_path)
    assert {on_cpu.infer_threads(SimpleNamespace(model=m)) for m in on_cpu.models} == {2}   # real models, CPU
    assert paper.features_threads(SimpleNamespace(dataset="coco")) == 2
    assert {paper.infer_threads(SimpleNamespace(model=m)) for m in paper.models} == {9}    # GPU: 1 + 8 workers


def test_a_models_chat_template_reaches_its_infer_job_as_flag_and_input(tmp_path):
    """``models.<name>.chat_template`` (a checkpoint released without one): the infer job's
    --chat-template and one of its inputs (a changed file reruns it); a model without one has neither."""
    template = tmp_path / "template.jinja"
    template.write_text("{{ messages }}")
    study = study_of(DEMO, lambda c: next(iter(c["models"].values())).update(chat_template=str(template)), tmp_path)
    given, *others = study.models
    w = SimpleNamespace(model=given, benchmark=study.benchmarks[0], variant="vanilla")
    assert parsed("infer", study.infer_flags(w), "--benchmark b --images i --out c.h5").chat_template == str(template)
    assert str(template) in study.model_inputs(w)
    for model in others:
        w = SimpleNamespace(model=model, benchmark=study.benchmarks[0], variant="vanilla")
        assert parsed("infer", study.infer_flags(w), "--benchmark b --images i --out c.h5").chat_template is None
        assert str(template) not in study.model_inputs(w)
