"""The benchmark scripts still run (mechanics only, at toy sizes; their timings are read by
people from a full run, never asserted). Without this, a refactor can break a script that
nothing else imports, as one once did."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_script(name: str, *args: str, timeout: float = 600) -> str:
    done = subprocess.run([sys.executable, str(BENCHMARKS / name), *args], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{name} failed:\n{done.stderr[-3000:]}"
    return done.stdout


def test_bench_methods_runs_at_a_toy_size():
    out = run_script("bench_methods.py", "--n", "4", "--instances", "40", "--pool", "10", "--layers", "16",
                     "--layer-range", "6", "15", "--bootstrap", "50", "--draws", "2")
    assert "N" in out and "s" in out


def test_bench_hard_negatives_runs_at_a_toy_size():
    out = run_script("bench_hard_negatives.py", "--n", "4", "--images", "600", "--pool-size", "500",
                     "--dim", "16", "--n-eval", "20", "--n-calibration", "5")
    assert out.strip()


@pytest.mark.slow
def test_bench_inference_runs_on_the_tiny_model(tmp_path):
    out = run_script("bench_inference.py", "--preset", "tiny", "--n", "4", "--reps", "1", "--image-size", "56",
                     "--proxies", "--json", str(tmp_path / "raw.json"))
    assert "| 4 |" in out                                  # one table row per N, every method measured
    assert "| tiny | 4 | 8 | ours |" in out                # the host-sync proxies
    assert (tmp_path / "raw.json").is_file()


def test_bench_checksums_runs():
    assert "with Fletcher-32" in run_script("bench_checksums.py", "--n", "4", "--reps", "1")
