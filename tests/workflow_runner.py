"""Run the Snakemake workflow of this checkout in a scratch folder, for the DAG tests."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIG = ROOT / "workflow" / "demo" / "config.yaml"


def environment() -> dict:
    """The tests' interpreter's bin folder first on PATH, so rules find `ladbench`."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def demo_config_with(folder: Path, **inference) -> Path:
    """A copy of the demo config in ``folder`` with ``inference`` keys changed (e.g. shards=2)."""
    import yaml

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


def snakemake(workdir: Path, *args: str, configfile: Path = DEMO_CONFIG, timeout: int = 1200) -> str:
    """Run snakemake on 2 local cores inside ``workdir``; returns its output."""
    command = snakemake_command(workdir, "--cores", "2", *args, configfile=configfile)
    result = subprocess.run(command, capture_output=True, text=True, env=environment(), timeout=timeout)
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
