"""The names the workflow gives the study's benchmarks, ``<dataset>_<setting>_N<n>``: read by
the config's checks, the stages' input checks (:mod:`ladbench.inputs`) and the report. A
module of its own, below all of them (it imports nothing of the package)."""

from __future__ import annotations

__all__ = ["benchmark_parts", "study_benchmarks"]


def benchmark_parts(benchmark: str) -> tuple[str, str, int]:
    """``coco_random_N4`` -> ("coco", "random", 4): the names the workflow gives benchmarks."""
    try:
        dataset, setting, n = benchmark.split("_")
        return dataset, setting, int(n.lstrip("N"))
    except ValueError:
        raise ValueError(f"benchmark name {benchmark!r}: expected <dataset>_<random|adversarial>_N<n>") from None


def study_benchmarks(config: dict) -> list[str]:
    """The study's benchmark names, ``<dataset>_<setting>_N<n>``, in the workflow's order."""
    bench = config["benchmarks"]
    return [f"{d}_{s}_N{n}" for d in bench["datasets"] for s in bench["settings"] for n in bench["n_candidates"]]
