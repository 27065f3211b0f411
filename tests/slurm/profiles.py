"""The profile the SLURM test runs: workflow/profiles/slurm/config.yaml with only
test-only settings layered over it, so the test proves the real profile.

The layering is done here rather than with Snakemake's own profile precedence, because a
command-line ``--set-resources`` replaces the profile's whole list instead of merging
into it, and the GPU requests of the real profile must survive.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SLURM_PROFILE = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"
RESOURCE_SECTIONS = ("default-resources", "set-resources")


def load_profile(path: Path = SLURM_PROFILE) -> dict:
    """A profile's config.yaml as a dict."""
    profile = yaml.safe_load(Path(path).read_text())
    if not isinstance(profile, dict):
        raise ValueError(f"{path}: a profile must be a YAML mapping, got {type(profile).__name__}")
    return profile


def merged(base: dict, overlay: dict) -> dict:
    """``base`` with ``overlay`` laid over it: nested mappings merge key by key, any other
    value of ``overlay`` replaces the one in ``base``. Neither argument is changed."""
    result = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _rule_resources(profile: dict):
    """Every resource mapping of a profile: default-resources and each rule's set-resources."""
    if isinstance(profile.get("default-resources"), dict):
        yield profile["default-resources"]
    for resources in (profile.get("set-resources") or {}).values():
        if isinstance(resources, dict):
            yield resources


def fit_to_node(profile: dict, cpus: int, memory_mb: int) -> dict:
    """A copy of ``profile`` whose jobs all fit one node of ``cpus`` CPUs and
    ``memory_mb`` MiB: memory requests capped at an even share per CPU (so one job per
    CPU can run at once), CPU and thread requests at the node's CPUs. GPU requests,
    runtimes and everything else are kept."""
    fitted = copy.deepcopy(profile)
    memory_share = memory_mb // max(cpus, 1)
    for resources in _rule_resources(fitted):
        if isinstance(resources.get("mem_mb"), int):
            resources["mem_mb"] = min(resources["mem_mb"], memory_share)
        if isinstance(resources.get("cpus_per_task"), int):
            resources["cpus_per_task"] = min(resources["cpus_per_task"], cpus)
    threads = fitted.get("set-threads") or {}
    for rule, count in threads.items():
        threads[rule] = min(count, cpus)
    # Rules' own `threads:` too (they become --cpus-per-task): none may exceed the node.
    fitted["max-threads"] = cpus
    return fitted


def ci_overlay(partition: str, slurm_logdir: Path, init_seconds: int = 2) -> dict:
    """The settings that only the test changes: its partition, a short wait before the
    first status check (the cluster's MinJobAge must be >= 3x this), and every job's
    SLURM log kept in ``slurm_logdir`` as evidence."""
    return {
        "default-resources": {"slurm_partition": partition},
        "slurm-init-seconds-before-status-checks": init_seconds,
        "slurm-logdir": str(slurm_logdir),
        "slurm-keep-successful-logs": True,
        "latency-wait": 10,  # one local file system: outputs show at once
    }


def ci_profile(cpus: int, memory_mb: int, partition: str, slurm_logdir: Path) -> dict:
    """workflow/profiles/slurm with the test overlay, fitted to the test node."""
    return fit_to_node(merged(load_profile(), ci_overlay(partition, slurm_logdir)), cpus, memory_mb)


def write_profile(profile: dict, folder: Path) -> Path:
    """Write ``profile`` as ``folder/config.yaml`` (atomically); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "config.yaml"
    tmp = folder / "config.yaml.tmp"
    tmp.write_text(yaml.safe_dump(profile, sort_keys=False))
    os.replace(tmp, target)
    return folder
