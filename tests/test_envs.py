"""The conda environments of the rules (envs/*.yaml) install exactly the paper lane's
locked set (requirements-lock.txt) and the package itself, nothing unpinned."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ENVS = sorted((ROOT / "envs").glob("*.yaml"))


def requirement_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def pins(lines) -> dict[str, str]:
    """name -> version of ``name==version`` lines (names normalised as pip does)."""
    out = {}
    for line in lines:
        name, sep, version = line.partition("==")
        assert sep and version, f"{line!r} is not pinned with =="
        out[name.strip().lower().replace("_", "-")] = version.strip()
    return out


def test_there_are_the_cpu_and_gpu_environments():
    assert [p.name for p in ENVS] == ["cpu.yaml", "gpu.yaml"]


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_environment_installs_the_locked_set_and_the_package(env):
    spec = yaml.safe_load(env.read_text())
    conda = [d for d in spec["dependencies"] if isinstance(d, str)]
    pip_sections = [d["pip"] for d in spec["dependencies"] if isinstance(d, dict)]
    # conda provides the interpreter the lock was made for and pip; pip everything else
    assert sorted(conda) == ["pip", "python=3.11"], conda
    assert len(pip_sections) == 1
    editable = [line for line in pip_sections[0] if line.startswith("-e")]
    # the checkout, seen from <workdir>/.snakemake/conda/ where conda runs pip
    assert editable == ["-e ../.."]
    assert (ROOT / "pyproject.toml").is_file() and (ROOT / "Snakefile").is_file()
    locked = pins(requirement_lines(ROOT / "requirements-lock.txt"))
    assert pins(line for line in pip_sections[0] if not line.startswith("-")) == locked


def installed_versions() -> dict[str, str]:
    """name -> version of every distribution of the running interpreter but the package itself
    (what ``pip freeze`` lists, names normalised as :func:`pins` does)."""
    from importlib.metadata import distributions
    found = {dist.metadata["Name"].lower().replace("_", "-"): dist.version for dist in distributions()}
    found.pop("ladbench", None)
    return {name: version for name, version in found.items() if name not in ("pip", "setuptools", "wheel")}


@pytest.mark.lanes
def test_the_current_lane_installs_only_what_its_lock_pins():
    """Every package of the installed current lane (dependencies too) is pinned in
    requirements-current.txt at the installed version; the lock may pin more (the slurm extra)."""
    from ladbench.models import compat
    if not compat.on_current_lane():
        pytest.skip("not on the current lane: requirements-current.txt pins the current lane's install")
    locked = pins(requirement_lines(ROOT / "requirements-current.txt"))
    installed = installed_versions()
    assert {name: version for name, version in installed.items() if locked.get(name) != version} == {}


def test_the_pin_check_can_fail():
    assert pins(["torch==2.14.1"]) != pins(["torch==2.14.0"])
    with pytest.raises(AssertionError):
        pins(["pillow"])


def test_a_test_of_the_current_lane_only_runs_in_make_test_current():
    """`make test-current` selects the tests marked ``lanes``; a test skipped off the current lane
    by a skipif of its own, without that mark, ran on neither lane (ten tests of windowed layers
    and family auto's refusals, until 2026-11-29). Such a test carries ``current_lane(reason)``,
    from which tests/conftest.py makes both the skip and the mark: `make test-current`'s selection
    holds those tests, and no test file skips by the lane any other way."""
    import re
    import subprocess
    import sys
    by_hand = re.compile(r"skipif\(\s*not\s+(compat\.)?on_current_lane\(\)")
    assert [p.name for p in sorted((ROOT / "tests").glob("*.py")) if by_hand.search(p.read_text())] == []
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-m", "lanes and not slurm", "tests/test_windows.py", "tests/test_hub_checks.py"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    selected = result.stdout
    assert "test_windows.py::test_a_mistral_text_model_windowed_on_every_layer" in selected, result.stdout[-2000:]
    assert "test_hub_checks.py::test_a_refused_architecture_on_the_hub_is_refused_before_any_job" in selected
    assert "test_windows.py::test_gemma3_layers_are_five_windowed_to_one_global" not in selected   # lane-free: not marked


@pytest.mark.lanes
def test_a_test_that_hangs_fails_naming_itself(tmp_path, pytestconfig):
    """The suite's time limit per test (pytest-timeout, pinned in both locks; pyproject's
    `timeout`) stops a test that never ends and names it, on either lane. Shortened here to 2 s."""
    import subprocess
    import sys
    assert float(pytestconfig.getini("timeout")) > 0           # this suite runs under one
    (tmp_path / "test_spins.py").write_text("def test_spins():\n    while True:\n        pass\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
                             "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "timeout=2", str(tmp_path / "test_spins.py")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout[-2000:]
    assert "FAILED test_spins.py::test_spins - Failed: Timeout (>2.0s) from pytest-timeout" in result.stdout, result.stdout[-2000:]
