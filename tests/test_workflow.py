"""The whole DAG on the embedded demo: every stage runs, and a change reruns only what
depends on it (Snakemake's params/input triggers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from workflow_runner import DEMO_CONFIG, planned_jobs, snakemake

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> Path:
    """One full demo run, shared by the tests of this module (they copy it before changing it)."""
    workdir = tmp_path_factory.mktemp("demo")
    snakemake(workdir)
    return workdir


def copy_run(demo_run: Path, tmp_path: Path) -> Path:
    workdir = tmp_path / "run"
    shutil.copytree(demo_run, workdir, symlinks=True)
    return workdir


def edited_config(tmp_path: Path, **sections) -> Path:
    config = yaml.safe_load(DEMO_CONFIG.read_text())
    for section, values in sections.items():
        config[section].update(values)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def mtimes(root: Path, pattern: str) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in sorted(root.glob(pattern))}


def test_every_stage_produces_its_outputs(demo_run):
    out = demo_run / "results" / "demo"
    for benchmark in ("scenes_random_N4", "scenes_adversarial_N4"):
        bench = json.loads((out / "benchmarks" / f"{benchmark}.json").read_text())
        assert len(bench["eval"]) == 12 and len(bench["calibration"]) == 6
        assert (out / "cache" / "tiny_qwen2_5_vl" / benchmark / "vanilla.h5").exists()
        assert (out / "calibration" / "tiny_qwen2_5_vl" / benchmark / "vanilla" / "dcal5_seed0.npz").exists()
        evaluation = json.loads((out / "eval" / "tiny_qwen2_5_vl" / benchmark / "vanilla" / f"cal-{benchmark}.json").read_text())
        assert set(evaluation["methods"]) == {"vanilla", "pride", "lad"}
        for ext in ("png", "pdf"):
            figure = out / "report" / "figures" / f"confusion_tiny_qwen2_5_vl_{benchmark}_vanilla.{ext}"
            assert figure.stat().st_size > 1000
    assert (out / "data" / "scenes" / "features.h5").exists()
    table = (out / "report" / "table1.md").read_text()
    assert "Ours (LAD)" in table and "PriDe" in table and "Adversarial" in table


def test_nothing_reruns_when_nothing_changed(demo_run):
    assert planned_jobs(demo_run) == {}


def test_changing_tau_reruns_evaluation_and_report_only(demo_run, tmp_path):
    workdir = copy_run(demo_run, tmp_path)
    config = edited_config(tmp_path, lad={"tau": 3.0})
    jobs = planned_jobs(workdir, configfile=config)
    assert set(jobs) == {"evaluate", "report_table", "report_confusion", "all"}

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
    assert set(jobs) == {"calibrate", "evaluate", "report_table", "report_confusion", "all"}
    assert "infer" not in jobs


def test_figures_regenerate_from_cached_intermediates(demo_run, tmp_path):
    workdir = copy_run(demo_run, tmp_path)
    shutil.rmtree(workdir / "results" / "demo" / "report")
    jobs = planned_jobs(workdir)
    assert set(jobs) == {"report_table", "report_confusion", "all"}
    snakemake(workdir)
    assert (workdir / "results" / "demo" / "report" / "table1.md").exists()
