"""The README's examples run as written: every fenced block marked ```sh runnable``` is
run, command by command, in a folder holding a finished demo run and the workflow files
(as the repository root is after `make demo`)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from workflow_runner import ROOT, environment

pytestmark = pytest.mark.slow


def runnable_commands(markdown: str) -> list[str]:
    """Commands of the ```sh runnable blocks (backslash-continued lines joined)."""
    commands = []
    for block in re.findall(r"^```sh runnable\n(.*?)^```", markdown, re.S | re.M):
        commands += [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    return commands


def test_the_readme_marks_commands_as_runnable():
    commands = runnable_commands((ROOT / "README.md").read_text())
    assert any(command.startswith("ladbench evaluate") for command in commands), commands


@pytest.mark.parametrize("command", runnable_commands((ROOT / "README.md").read_text()))
def test_readme_command_runs_as_written(command, demo_run, tmp_path):
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    shutil.copytree(demo_run / "results", workdir / "results")
    for name in ("Snakefile", "config.yaml", "workflow"):
        (workdir / name).symlink_to(ROOT / name)
    result = subprocess.run(["bash", "-c", command], cwd=workdir, env=environment(), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
