"""Nothing is lost when the workflow is killed mid-inference: the rerun resumes the
partial cache (whole chunks kept) and ends with the same arrays as an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from ladbench.inference.cache import read_cache
from workflow_runner import copy_run, environment, snakemake, snakemake_command

pytestmark = pytest.mark.slow

CACHE = Path("results/demo/cache/tiny_qwen2_5_vl/scenes_random_N4/vanilla.h5")
ARRAYS = ("scores", "attn", "attn_text", "order", "target_pos", "done")


def rows_done(partial: Path) -> int:
    try:
        return int(read_cache(str(partial), require_complete=False)["done"].sum())
    except (OSError, ValueError):  # not created yet, or finished and removed meanwhile
        return 0


def kill_when_partly_done(workdir: Path, timeout: float = 300) -> int:
    """Start the workflow, SIGKILL it (and its jobs) once some chunks of the cache are
    written; returns the rows that were done then."""
    partial = workdir / f"{CACHE}.partial"
    process = subprocess.Popen(
        snakemake_command(workdir, "--cores", "2", str(CACHE)), env=environment(), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and process.poll() is None:
            done = rows_done(partial)
            if done > 0:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                return done
            time.sleep(0.05)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    pytest.fail("the workflow never wrote a chunk of the cache before finishing or timing out")


def read(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    with h5py.File(path, "r") as h5:
        return {k: h5[k][()] for k in ARRAYS}, dict(h5.attrs)


def test_killed_workflow_resumes_the_partial_cache(demo_run, tmp_path):
    workdir = copy_run(demo_run, tmp_path)
    (workdir / CACHE).unlink()  # the workflow is asked for this cache below

    done_at_kill = kill_when_partly_done(workdir)
    partial = workdir / f"{CACHE}.partial"
    assert partial.exists() and not (workdir / CACHE).exists()
    done_kept = rows_done(partial)
    assert done_kept >= done_at_kill  # nothing written before the kill was lost

    snakemake(workdir, "--unlock")
    snakemake(workdir, str(CACHE))
    resumed, attrs = read(workdir / CACHE)
    reference, reference_attrs = read(demo_run / CACHE)
    total = len(reference["done"])
    assert attrs["complete"] and resumed["done"].all()
    assert done_kept < total and attrs["last_run_rows"] == total - done_kept  # only the missing rows ran
    for name in ARRAYS:
        np.testing.assert_allclose(resumed[name], reference[name], rtol=0, atol=1e-5, err_msg=name)
    assert not partial.exists()
