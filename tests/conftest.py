"""Shared test set-up: offline Hugging Face hub, a private HF_HOME and cache folders (nothing
written under $HOME), quiet progress bars."""

import os
import tempfile
from pathlib import Path

import pytest

# Before anything imports transformers: never reach a hub, never touch ~/.cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="ladbench-hf-home-"))
# Nothing under $HOME: matplotlib's, Snakemake's and any other library's caches and configs
# go to folders of this session in the temporary folder.
for _variable in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
    os.environ[_variable] = tempfile.mkdtemp(prefix=f"ladbench-{_variable.lower()}-")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Tiny-model fixtures (built once per session), shared by the model and inference tests.
from conftest_models import auto_adapter, hf_offline, tiny_adapter, tiny_arch_model, tiny_model  # noqa: E402,F401


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """One full run of the demo DAG, shared by the workflow tests (copy it before changing it)."""
    from workflow_runner import snakemake

    workdir = tmp_path_factory.mktemp("demo")
    snakemake(workdir)
    return workdir
