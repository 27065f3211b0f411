"""Shared test set-up: offline Hugging Face hub, a private HF_HOME and cache folders (nothing
written under $HOME), quiet progress bars."""

import os
from pathlib import Path

import pytest
from session_folders import session_folder

# Before anything imports transformers: never reach a hub, never touch ~/.cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if "HF_HOME" not in os.environ:
    os.environ["HF_HOME"] = session_folder("ladbench-hf-home-")
# Nothing under $HOME: matplotlib's, Snakemake's and any other library's caches and configs
# go to folders of this session in the temporary folder.
for _variable in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
    os.environ[_variable] = session_folder(f"ladbench-{_variable.lower()}-")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under pytest-xdist (`make test`: one worker per core) each worker's torch and BLAS would
# start one thread per core, so the machine ran twice as many busy threads as it has cores,
# spinning while they waited for one another (tests/test_decode.py on the current lane, two
# workers on two cores: 282 s, and 55 s with a core each). Each worker gets its share of the
# cores; the processes it starts inherit it (a Snakemake job gets its rule's `threads`
# instead). A value the caller set wins.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    _share = str(max(1, len(os.sched_getaffinity(0)) // _workers))
    for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, _share)

# Tiny-model fixtures (built once per session), shared by the model and inference tests.
from conftest_models import auto_adapter, hf_offline, tiny_adapter, tiny_arch_model, tiny_model  # noqa: E402,F401


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """One full run of the demo DAG, shared by the workflow tests (copy it before changing it).
    Under pytest-xdist (``make test``) the workers share one run: the first to need it builds
    it while the others wait on a lock, instead of each building its own."""
    from filelock import FileLock
    from workflow_runner import snakemake

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the folder above every worker's own
    workdir, done = shared / "demo", shared / "demo.done"
    with FileLock(str(shared / "demo.lock")):
        if not done.exists():
            workdir.mkdir(exist_ok=True)
            snakemake(workdir)
            done.touch()
    return workdir


#: the test files that take longest (minutes each), run first: ``make test`` hands whole files
#: to its workers (pytest-xdist ``--dist loadfile``) in collection order, so the long ones
#: start at once and the many short files fill the other worker meanwhile
LONGEST_FIRST = ("test_organism.py", "test_slurm.py", "test_shards.py", "test_safe_paths.py", "test_benchmarks.py",
                 "test_variants.py", "test_generation.py")


def pytest_collection_modifyitems(items: list) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def pytest_itemcollected(item) -> None:          # (before `-m lanes` selects among the items)
    """``@pytest.mark.current_lane(reason)``: a test of the current lane only is skipped elsewhere
    and marked ``lanes``, so that `make test-current` runs it. (A skip on the paper lane alone ran
    it nowhere: ten tests of windowed layers and family auto's refusals, until 2026-11-29.)"""
    from ladbench.models import compat
    mark = item.get_closest_marker("current_lane")
    if mark is None:
        return
    item.add_marker(pytest.mark.lanes)
    if not compat.on_current_lane():
        item.add_marker(pytest.mark.skip(reason=mark.args[0] if mark.args else "runs on the current lane only"))
