"""The report's inputs, indexed: evaluation JSONs (docs/formats.md §6), analysis JSONs
(§8) and the attributes of the inference caches (§4: timing, memory, model identity).

Files are recognised by their documented locations:

- ``.../{model}/{benchmark}/{variant}/cal-{cal_benchmark}.json``  evaluation
- ``.../{model}/{benchmark}/{variant}.json``                      analysis
- ``.../{model}/{benchmark}/{variant}.h5``                        inference cache

Only the caches' attributes and row count are read, never their arrays, so the report
stays cheap however large the caches are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ladbench.atomic import read_json
from ladbench.config import benchmark_parts
from ladbench.inference.cache import read_cache_attributes
from ladbench.stages.inputs import check_made_from_caches

__all__ = ["Study", "load_study", "parse_assignments"]

SETTING_NAMES = {"random": "Random", "adversarial": "Adversarial"}


def parse_assignments(items: Iterable[str], flag: str) -> dict[str, str]:
    """``["a=b", "c=d"]`` -> {"a": "b", "c": "d"}; names the flag and item on a bad entry."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"{flag}: expected name=value, got {item!r}")
        out[name] = value
    return out


@dataclass
class Study:
    """Everything the tables and figures read, keyed by model, benchmark and variant.

    ``variants`` maps each cache variant name (config order) to its prompt (vanilla,
    instruction, cot, sc, sofa, permavg); ``dataset_sources`` each dataset name to its
    source (coco, flickr8k, synthetic); ``n_cal`` is the study's |D_cal|.
    """

    models: list[str]
    benchmarks: list[str]
    variants: dict[str, str]
    evaluations: dict[tuple[str, str, str, str], dict] = field(default_factory=dict)
    analyses: dict[tuple[str, str, str], dict] = field(default_factory=dict)
    caches: dict[tuple[str, str, str], dict] = field(default_factory=dict)
    n_cal: int | None = None
    dataset_sources: dict[str, str] = field(default_factory=dict)

    # ---- lookups ------------------------------------------------------------------------
    def variants_with_prompt(self, prompt: str) -> list[str]:
        """Variant names whose cache uses ``prompt``, in config order."""
        return [name for name, p in self.variants.items() if p == prompt]

    def method_metrics(
        self, model: str, benchmark: str, prompt: str, method: str, cal_benchmark: str | None = None
    ) -> dict | None:
        """Metrics of ``method`` on the first variant with ``prompt`` that has them; None if absent."""
        for variant in self.variants_with_prompt(prompt):
            evaluation = self.evaluations.get((model, benchmark, variant, cal_benchmark or benchmark))
            if evaluation and method in evaluation.get("methods", {}):
                return evaluation["methods"][method]
        return None

    def evaluation(self, model: str, benchmark: str, prompt: str = "vanilla") -> dict | None:
        """The same-benchmark evaluation document of the first variant with ``prompt``."""
        for variant in self.variants_with_prompt(prompt):
            evaluation = self.evaluations.get((model, benchmark, variant, benchmark))
            if evaluation:
                return evaluation
        return None

    def analysis(self, model: str, benchmark: str) -> dict | None:
        """The analysis of the first vanilla-prompt variant of (model, benchmark)."""
        for variant in self.variants_with_prompt("vanilla"):
            if (model, benchmark, variant) in self.analyses:
                return self.analyses[(model, benchmark, variant)]
        return None

    def cache(self, model: str, benchmark: str, variant: str) -> dict | None:
        return self.caches.get((model, benchmark, variant))

    def transfers(self) -> list[tuple[str, str, str, str]]:
        """(model, benchmark, variant, cal_benchmark) of every cross-benchmark evaluation."""
        return [key for key in self.evaluations if key[3] != key[1]]

    def datasets(self) -> list[str]:
        return list(dict.fromkeys(benchmark_parts(b)[0] for b in self.benchmarks))

    def sizes(self) -> list[int]:
        return sorted({benchmark_parts(b)[2] for b in self.benchmarks})

    def setting_label(self, benchmark: str, with_n: bool = True) -> str:
        """``Random N=4`` (the dataset is prefixed when the study has several)."""
        dataset, setting, n = benchmark_parts(benchmark)
        label = SETTING_NAMES.get(setting, setting)
        if with_n:
            label += f" N={n}"
        return f"{dataset} {label}" if len(self.datasets()) > 1 else label


def _index_evaluations(paths: Sequence[str | Path]) -> dict[tuple[str, str, str, str], dict]:
    out = {}
    for path in map(Path, paths):
        if not path.stem.startswith("cal-") or len(path.parts) < 4:
            raise ValueError(f"evaluation file {path}: expected .../{{model}}/{{benchmark}}/{{variant}}/cal-{{benchmark}}.json")
        model, benchmark, variant = path.parts[-4:-1]
        out[(model, benchmark, variant, path.stem[len("cal-"):])] = read_json(path, "evaluation file not found")
    return out


def _index_by_stem(paths: Sequence[str | Path], load, what: str) -> dict[tuple[str, str, str], Any]:
    out = {}
    for path in map(Path, paths):
        if len(path.parts) < 3:
            raise ValueError(f"{what} {path}: expected .../{{model}}/{{benchmark}}/{{variant}}{path.suffix}")
        out[(path.parts[-3], path.parts[-2], path.stem)] = load(path)
    return out


def load_study(
    *,
    models: Sequence[str],
    benchmarks: Sequence[str],
    variants: Mapping[str, str],
    evaluations: Sequence[str | Path] = (),
    analyses: Sequence[str | Path] = (),
    caches: Sequence[str | Path] = (),
    n_cal: int | None = None,
    dataset_sources: Mapping[str, str] | None = None,
) -> Study:
    """Read and index every input file of the report."""
    for benchmark in benchmarks:
        benchmark_parts(benchmark)  # validates the names early, with a clear message
    study = Study(
        models=list(models),
        benchmarks=list(benchmarks),
        variants=dict(variants),
        evaluations=_index_evaluations(evaluations),
        analyses=_index_by_stem(analyses, lambda p: read_json(p, "analysis file not found"), "analysis file"),
        caches=_index_by_stem(caches, read_cache_attributes, "inference cache"),
        n_cal=n_cal,
        dataset_sources=dict(dataset_sources or {}),
    )
    check_made_from_caches(study.evaluations, study.caches, "evaluation")
    check_made_from_caches(study.analyses, study.caches, "analysis")
    return study
