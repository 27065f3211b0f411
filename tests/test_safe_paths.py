"""Paths that a shell would misread are only ever data: the demo DAG with an output folder
and a dataset folder containing spaces, quotes, ``$(...)`` and backticks runs to the end
without executing anything, with `ladbench` found without activating the venv; and its
files are byte-identical to the ones another demo run wrote in another folder."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from workflow_runner import DEMO_CONFIG, ROOT, snakemake_command

pytestmark = pytest.mark.slow

# Each would create a file named `pwned` if a shell ever evaluated it.
HOSTILE = "it's \"quoted\" $(touch pwned) `touch pwned`; touch pwned"
DEMO = yaml.safe_load(DEMO_CONFIG.read_text())
SCENES = DEMO["datasets"]["scenes"]


def plain_path_environment() -> dict:
    """The environment without the venv's bin folder on PATH (as with `.venv/bin/snakemake`
    typed in a fresh shell)."""
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    return env


def hostile_config(tmp_path: Path, download: bool = False) -> tuple[Path, Path]:
    """The demo study, writing below a hostile output folder, with its scenes read as an
    existing MS-COCO-format copy from a hostile dataset folder (made here, as the demo would)."""
    root = tmp_path / f"data {HOSTILE}"
    if not download:
        subprocess.run(
            [sys.executable, "-m", "ladbench", "demo-scenes", "--out", str(root), "--n-images", str(SCENES["n_images"]),
             "--image-size", str(SCENES["image_size"]), "--seed", str(SCENES["seed"])],
            check=True, capture_output=True,
        )
    config = dict(DEMO, output_dir=f"out {HOSTILE}/demo")
    dataset = {"source": "coco", "root": str(root), "download": download}
    if not download:
        dataset |= {"images_dir": f"{root}/images", "captions_json": f"{root}/annotations/captions.json",
                    "instances_json": f"{root}/annotations/instances.json"}
    config["datasets"] = {"scenes": dataset}
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, root


#: how long one Snakemake run of the hostile-path demo may take
RUN_LIMIT_S = 1500


def run(workdir: Path, configfile: Path, *args: str) -> str:
    result = subprocess.run(snakemake_command(workdir, *args, configfile=configfile), capture_output=True, text=True,
                            env=plain_path_environment(), timeout=RUN_LIMIT_S)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


def no_marker_anywhere(*folders: Path) -> None:
    for folder in folders:
        assert not list(folder.rglob("pwned")), f"a shell evaluated a path: {list(folder.rglob('pwned'))}"


def test_download_command_passes_a_hostile_root_as_one_argument(tmp_path):
    config, root = hostile_config(tmp_path, download=True)
    workdir = tmp_path / "run"
    target = f"out {HOSTILE}/demo/data/scenes/download.done"
    output = run(workdir, config, "--dry-run", "--printshellcmds", "--cores", "1", target)
    command = next(line for line in output.splitlines() if "ladbench download" in line)
    words = shlex.split(command.split("ladbench download", 1)[1])
    assert words == ["--dataset", "coco", "--dest", str(root), ">", f"out {HOSTILE}/demo/logs/download/scenes.log",
                     "2>&1"]
    no_marker_anywhere(tmp_path, ROOT)


@pytest.mark.timeout(RUN_LIMIT_S + 60)   # the whole demo DAG in the body (pyproject's `timeout` is shorter)
def test_demo_dag_with_hostile_paths_completes_and_is_byte_identical(demo_run, tmp_path):
    config, _ = hostile_config(tmp_path)
    workdir = tmp_path / "run"
    run(workdir, config, "--cores", "2")
    no_marker_anywhere(tmp_path, ROOT, demo_run)

    ours, theirs = workdir / f"out {HOSTILE}" / "demo", demo_run / "results" / "demo"
    assert (ours / "report" / "table1.md").read_text() == (theirs / "report" / "table1.md").read_text()
    same_bytes = [*sorted((theirs / "benchmarks").glob("*.json")), theirs / "data" / "scenes" / "features.h5",
                  *sorted(p for p in (theirs / "models").rglob("*") if p.is_file()),
                  *sorted((theirs / "report" / "figures").glob("*.p[dn][fg]"))]    # PDFs carry no date
    assert len(same_bytes) > 10
    for path in same_bytes:
        assert (ours / path.relative_to(theirs)).read_bytes() == path.read_bytes(), path.relative_to(theirs)

    caches = sorted((theirs / "cache").rglob("*.h5"))
    assert caches
    for path in caches:
        with h5py.File(path, "r") as a, h5py.File(ours / path.relative_to(theirs), "r") as b:
            assert a.attrs["config_sha256"] == b.attrs["config_sha256"]
            assert set(a) == set(b)
            for name in set(a) - {"seconds"}:  # wall-clock timings differ by nature
                np.testing.assert_array_equal(a[name][()], b[name][()], err_msg=f"{path}: {name}")
    evaluation = json.loads(next((ours / "eval").rglob("*.json")).read_text())
    assert evaluation["methods"]
