"""The whole DAG on the embedded demo: every stage runs, and a change reruns only what
depends on it (Snakemake's params/input triggers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from workflow_runner import DEMO_CONFIG, copy_run, planned_jobs, snakemake

pytestmark = pytest.mark.slow

# Every rule of workflow/rules/report.smk that makes a file (tables and figures).
REPORT_RULES = {"report_table", "report_confusion", "report_figures", "report_model_figures", "report_explorer",
                "report_explorer_index"}


def edited_config(tmp_path: Path, **sections) -> Path:
    config = yaml.safe_load(DEMO_CONFIG.read_text())
    for section, values in sections.items():
        config[section].update(values)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def mtimes(root: Path, pattern: str) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in sorted(root.glob(pattern))}


@pytest.mark.lanes        # `make test-current`: the demo DAG on the current lane too
def test_every_stage_produces_its_outputs(demo_run):
    out = demo_run / "results" / "demo"
    for benchmark in ("scenes_random_N4", "scenes_adversarial_N4"):
        bench = json.loads((out / "benchmarks" / f"{benchmark}.json").read_text())
        assert len(bench["eval"]) == 12 and len(bench["calibration"]) == 6
        assert (out / "cache" / "tiny_qwen2_5_vl" / benchmark / "vanilla.h5").exists()
        assert (out / "calibration" / "tiny_qwen2_5_vl" / benchmark / "vanilla" / "dcal5_seed0.npz").exists()
        evaluation = json.loads((out / "eval" / "tiny_qwen2_5_vl" / benchmark / "vanilla" / f"cal-{benchmark}.json").read_text())
        assert set(evaluation["methods"]) == set(yaml.safe_load(DEMO_CONFIG.read_text())["evaluation"]["methods"])
        instruction = out / "eval" / "tiny_qwen2_5_vl" / benchmark / "instruction" / f"cal-{benchmark}.json"
        assert set(json.loads(instruction.read_text())["methods"]) == {"vanilla"}
        for ext in ("png", "pdf"):
            figure = out / "report" / "figures" / f"confusion_tiny_qwen2_5_vl_{benchmark}_vanilla.{ext}"
            assert figure.stat().st_size > 1000
    assert (out / "data" / "scenes" / "features.h5").exists()
    transfer = out / "eval" / "tiny_qwen2_5_vl" / "scenes_adversarial_N4" / "vanilla" / "cal-scenes_random_N4.json"
    assert "scenes_random_N4" in json.loads(transfer.read_text())["calibrations"][0]
    table = (out / "report" / "table1.md").read_text()
    assert "Ours (LAD)" in table and "PriDe" in table and "Adversarial" in table
    import transformers
    from ladbench.inference.cache import read_cache_attributes
    from ladbench.models.compat import LANE
    versions = read_cache_attributes(str(out / "cache" / "tiny_qwen2_5_vl" / "scenes_random_N4" / "vanilla.h5"))["versions"]
    assert versions["lane"] == LANE and versions["transformers"] == transformers.__version__    # which lane wrote it


def test_nothing_reruns_when_nothing_changed(demo_run):
    assert planned_jobs(demo_run) == {}


def test_changing_tau_reruns_evaluation_and_report_only(demo_run, tmp_path):
    workdir = copy_run(demo_run, tmp_path)
    config = edited_config(tmp_path, lad={"tau": 3.0})
    jobs = planned_jobs(workdir, configfile=config)
    assert set(jobs) == {"evaluate", "analyze", *REPORT_RULES, "all"}

    before = mtimes(workdir, "results/demo/cache/**/*.h5") | mtimes(workdir, "results/demo/calibration/**/*.npz")
    evals_before = mtimes(workdir, "results/demo/eval/**/*.json")
    snakemake(workdir, configfile=config)
    assert mtimes(workdir, "results/demo/cache/**/*.h5") | mtimes(workdir, "results/demo/calibration/**/*.npz") == before
    after = mtimes(workdir, "results/demo/eval/**/*.json")
    assert all(after[p] > evals_before[p] for p in evals_before)
    evaluation = json.loads(next(iter(after)).read_text())
    assert evaluation["settings"]["tau"] == 3.0


def test_changing_dcal_refits_calibration_without_inference(demo_run, tmp_path):
    workdir = copy_run(demo_run, tmp_path)
    config = edited_config(tmp_path, calibration={"n_cal": 3})
    jobs = planned_jobs(workdir, configfile=config)
    assert set(jobs) == {"calibrate", "evaluate", "analyze", *REPORT_RULES, "all"}
    assert "infer" not in jobs


# Regenerating the report from cached intermediates: tests/test_report.py.


def test_a_second_workflow_on_the_same_output_folder_refuses_naming_the_first(tmp_path):
    """Snakemake locks its working folder's .snakemake/; the study's own lock is in output_dir,
    so a workflow started from another folder on the same output_dir stops before any job."""
    import subprocess

    from ladbench.atomic import lock_output_dir
    from workflow_runner import environment, snakemake_command

    config = yaml.safe_load(DEMO_CONFIG.read_text())
    config["output_dir"] = str(tmp_path / "study")
    configfile = tmp_path / "config.yaml"
    configfile.write_text(yaml.safe_dump(config))
    (tmp_path / "elsewhere").mkdir()
    lock = lock_output_dir(tmp_path / "study")               # the first workflow (here: this test) holds it
    try:
        assert planned_jobs(tmp_path / "elsewhere", configfile=configfile)      # a dry run is not stopped
        second = subprocess.run(snakemake_command(tmp_path / "elsewhere", "--cores", "1", configfile=configfile),
                                capture_output=True, text=True, env=environment(), timeout=600)
    finally:
        lock.release()
    output = second.stdout + second.stderr
    assert second.returncode != 0 and "is in use by another workflow: locked by pid" in output, output[-3000:]
    assert "Traceback" not in output
    assert not (tmp_path / "study" / "data").exists()                          # no job ran
