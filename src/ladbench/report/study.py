"""The report's inputs, indexed: evaluation JSONs (docs/formats.md §6), analysis JSONs
(§8) and the attributes of the inference caches (§4: timing, memory, model identity).

Each file is recognised by what it records about itself, never by its path (any folder
layout works): the model, benchmark and cache variant that evaluation and analysis
documents carry at their top level (``model``, ``benchmark``, ``variant``, and for an
evaluation ``cal_benchmark``), and a cache's attributes ``model``, ``benchmark_name`` and
``variant_name``.

Only the caches' attributes and row count are read, never their arrays, so the report
stays cheap however large the caches are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ladbench.config import benchmark_parts
from ladbench.inference.cache import read_cache_attributes
from ladbench.inputs import MismatchError, check_made_from_caches
from ladbench.records import read_analysis, read_evaluation

__all__ = ["Study", "accuracy_by_n", "load_study", "parse_assignments"]

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
    analysis_files: dict[tuple[str, str, str], Path] = field(default_factory=dict)  # for the .npz beside each

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

    def model_kinds(self) -> dict[str, str | None]:
        """Each model's kind (tiny-random, tiny-organism, pretrained) as its files record it:
        the caches' ``model_kind`` attribute, else the evaluation and analysis documents."""
        kinds: dict[str, str | None] = {model: None for model in self.models}
        documents = [((m, a), doc) for (m, *a), doc in self.caches.items()]
        documents += [((m, a), doc) for (m, *a), doc in self.evaluations.items()]
        documents += [((m, a), doc) for (m, *a), doc in self.analyses.items()]
        for (model, _), doc in documents:
            if kinds.get(model) is None and doc and doc.get("model_kind"):
                kinds[model] = str(doc["model_kind"])
        return kinds

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


def _identity(path: Path, record: Mapping[str, Any], fields: Sequence[str], what: str) -> tuple[str, ...]:
    """The key of a report input from what the file records; one line naming the file if it does not."""
    missing = [name for name in fields if not record.get(name)]
    if missing:
        raise ValueError(f"{what} {path}: records no {', '.join(missing)} (made by an older ladbench); "
                         "rerun the workflow to rewrite it")
    return tuple(str(record[name]) for name in fields)


# What each kind of input records about itself (docs/formats.md §4, §6, §8), in key order.
EVALUATION_KEY = ("model", "benchmark", "variant", "cal_benchmark")
ANALYSIS_KEY = ("model", "benchmark", "variant")
CACHE_KEY = ("model", "benchmark_name", "variant_name")


def _index(paths: Sequence[str | Path], load, fields: Sequence[str], what: str,
           where: dict[tuple[str, ...], Path] | None = None) -> dict[tuple[str, ...], Any]:
    """Each file's content by the key it records; ``where`` (if given) receives each key's path."""
    out: dict[tuple[str, ...], Any] = {}
    where = {} if where is None else where
    for path in map(Path, paths):
        record = load(path)
        key = _identity(path, record, fields, what)
        if key in out:
            raise ValueError(f"{what}s {where[key]} and {path} are both {'/'.join(key)}; give one of them")
        out[key], where[key] = record, path
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
    analysis_files: dict = {}
    study = Study(
        models=list(models),
        benchmarks=list(benchmarks),
        variants=dict(variants),
        evaluations=_index(evaluations, read_evaluation, EVALUATION_KEY,
                           "evaluation file"),
        analyses=_index(analyses, read_analysis, ANALYSIS_KEY, "analysis file",
                        analysis_files),
        analysis_files=analysis_files,
        caches=_index(caches, read_cache_attributes, CACHE_KEY, "inference cache"),
        n_cal=n_cal,
        dataset_sources=dict(dataset_sources or {}),
    )
    check_made_from_caches(study.evaluations, study.caches, "evaluation")
    check_made_from_caches(study.analyses, study.caches, "analysis")
    _check_prompts(study)
    return study


def _check_prompts(study: Study) -> None:
    """Refuse a file whose variant ran another prompt than ``--variants`` gives that variant
    (its numbers would land in another method's row)."""
    recorded = [("evaluation", key, doc.get("prompt")) for key, doc in study.evaluations.items()]
    recorded += [("analysis", key, doc.get("prompt")) for key, doc in study.analyses.items()]
    recorded += [("cache", key, attrs.get("variant")) for key, attrs in study.caches.items()]
    for what, key, prompt in recorded:
        expected = study.variants.get(key[2])
        if prompt and expected and prompt != expected:
            raise MismatchError(f"the {what} of {'/'.join(key)} records prompt {prompt!r}, but --variants gives "
                                f"{key[2]}={expected}; give the files of this study's variants")


def accuracy_by_n(study, model: str, methods=("vanilla", "pride", "lad")) -> dict:
    """``{(dataset, setting): {method: {N: metrics}}}`` of one model's vanilla-prompt evaluations."""
    out: dict = {}
    for benchmark in study.benchmarks:
        dataset, setting, n = benchmark_parts(benchmark)
        panel = out.setdefault((dataset, setting), {})
        for method in methods:
            metrics = study.method_metrics(model, benchmark, "vanilla", method)
            if metrics is not None:
                panel.setdefault(method, {})[n] = metrics
    return out
