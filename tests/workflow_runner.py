"""Run the Snakemake workflow of this checkout in a scratch folder, for the DAG tests."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from session_folders import session_folder

ROOT = Path(__file__).resolve().parents[1]
FULL_DEMO_CONFIG = ROOT / "workflow" / "demo" / "config.yaml"

# The DAG tests check mechanics (what runs, reruns, resumes), not results: they run the demo
# without its trained model organism and at a small size (the organism's own test,
# test_organism.py, runs it). Derived from the demo config so the two never drift apart.
MECHANICS_SIZES = {"n_eval": 12, "n_candidates": [4], "pool_size": 160}
MECHANICS_SCENES = 160
# A second prompt variant, so the tests see more than one cache per benchmark (the demo
# itself runs only `vanilla`, to stay within its time budget).
MECHANICS_VARIANTS = {"instruction": {"prompt": "instruction", "identifiers": "digits"}}


def mechanics_config(destination: Path) -> Path:
    """The demo config minus the organism (models with an ``organism`` section), at mechanics size."""
    config = yaml.safe_load(FULL_DEMO_CONFIG.read_text())
    config["models"] = {name: {key: value for key, value in spec.items() if key != "batch_size"}
                        for name, spec in config["models"].items() if "organism" not in spec}
    config["benchmarks"].update(MECHANICS_SIZES)
    config["inference"]["variants"].update(MECHANICS_VARIANTS)
    for dataset in config["datasets"].values():
        dataset["n_images"] = MECHANICS_SCENES
    config["evaluation"]["transfer"] = [
        t for t in config["evaluation"].get("transfer", [])
        if all(t[key].endswith(f"_N{MECHANICS_SIZES['n_candidates'][0]}") for key in ("calibrate_on", "evaluate_on"))]
    destination.mkdir(parents=True, exist_ok=True)
    path = destination / "mechanics.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


DEMO_CONFIG = mechanics_config(Path(session_folder("ladbench-mechanics-config-")))


def environment(extra: dict | None = None) -> dict:
    """The tests' interpreter's bin folder first on PATH, so rules find `ladbench`; ``extra``
    variables are added (a PYTHONPATH in front of the one set)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for key, value in (extra or {}).items():
        env[key] = os.pathsep.join(filter(None, [value, env.get(key)])) if key == "PYTHONPATH" else value
    return env


def demo_config_with(folder: Path, **inference) -> Path:
    """A copy of the demo config in ``folder`` with ``inference`` keys changed (e.g. shards=2)."""
    config = yaml.safe_load(DEMO_CONFIG.read_text())
    config["inference"].update(inference)
    path = folder / "demo-config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def snakemake_command(workdir: Path, *args: str, configfile: Path = DEMO_CONFIG) -> list[str]:
    """The command line running this checkout's Snakefile inside ``workdir``."""
    return [
        str(Path(sys.executable).parent / "snakemake"), "--snakefile", str(ROOT / "Snakefile"),
        "--directory", str(workdir), "--configfile", str(configfile), *args,
    ]


def snakemake(workdir: Path, *args: str, configfile: Path = DEMO_CONFIG, timeout: int = 1200,
              extra_env: dict | None = None) -> str:
    """Run snakemake on 2 local cores inside ``workdir``; returns its output."""
    command = snakemake_command(workdir, "--cores", "2", *args, configfile=configfile)
    result = subprocess.run(command, capture_output=True, text=True, env=environment(extra_env), timeout=timeout)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({result.returncode}):\n{output[-6000:]}")
    return output


def planned_jobs(workdir: Path, configfile: Path = DEMO_CONFIG) -> dict[str, int]:
    """Rule -> job count that a dry run plans (empty when nothing needs to run)."""
    output = snakemake(workdir, "--dry-run", configfile=configfile)
    match = re.search(r"Job stats:\n.*?\n-+\s+-+\n(.*?)\ntotal", output, re.S)
    if not match:
        return {}
    jobs = {}
    for line in match.group(1).splitlines():
        name, count = line.split()
        jobs[name] = int(count)
    return jobs


def copy_run(run: Path, destination: Path) -> Path:
    """A copy of a finished run (outputs, mtimes and Snakemake's metadata) to change freely."""
    workdir = destination / "run"
    shutil.copytree(run, workdir, symlinks=True)
    return workdir
