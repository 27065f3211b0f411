"""Tables in the paper's layouts, from evaluation JSON files (docs/formats.md §6)."""

from __future__ import annotations

import json
from pathlib import Path

DISPLAY_NAMES = {
    "vanilla": "Vanilla",
    "instruction": "Instruction",
    "cot": "CoT",
    "pride": "PriDe",
    "pride_original": "PriDe (original)",
    "sc": "Self-Consistency",
    "lad": "Ours (LAD)",
    "raw_attention": "Raw attention",
    "purified_attention": "Purified attention",
}
SETTING_NAMES = {"random": "Random", "adversarial": "Adversarial"}


def split_benchmark(benchmark: str) -> tuple[str, str, int]:
    """``coco_random_N4`` -> ("coco", "random", 4)."""
    dataset, setting, n = benchmark.split("_")
    return dataset, setting, int(n.lstrip("N"))


def load_evaluation(path: Path) -> dict:
    with open(path) as handle:
        return json.load(handle)


def table1_rows(evaluations: dict[tuple[str, str], dict], models: list[str], benchmarks: list[str]) -> list[list[str]]:
    """Rows of a Table-1-style table: one per setting x method, three columns per model.

    ``evaluations[(model, benchmark)]`` is an evaluation JSON. Missing entries print "–".
    """
    rows = []
    for benchmark in benchmarks:
        _, setting, _ = split_benchmark(benchmark)
        method_names = []
        for model in models:
            for name in evaluations.get((model, benchmark), {}).get("methods", {}):
                if name not in method_names:
                    method_names.append(name)
        for name in method_names:
            row = [SETTING_NAMES.get(setting, setting), DISPLAY_NAMES.get(name, name)]
            for model in models:
                result = evaluations.get((model, benchmark), {}).get("methods", {}).get(name)
                if result is None:
                    row += ["–", "–", "–"]
                else:
                    row += [f"{result['acc_mean']:.2f}±{result['acc_std']:.2f}", f"{result['rstd']:.2f}", f"{result['cons']:.2f}"]
            rows.append(row)
    return rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def index_evaluations(paths: list[str], variant: str) -> dict[tuple[str, str], dict]:
    """Evaluation files keyed by (model, benchmark), from their documented location
    ``.../{model}/{benchmark}/{variant}/cal-{calibration benchmark}.json``; only the given
    variant and same-benchmark calibrations (no transfer) are kept."""
    evaluations = {}
    for path in map(Path, paths):
        model, benchmark, path_variant = path.parts[-4:-1]
        if path_variant == variant and path.stem == f"cal-{benchmark}":
            evaluations[(model, benchmark)] = load_evaluation(path)
    return evaluations


def table1_markdown(paths: list[str], models: list[str], benchmarks: list[str], variant: str) -> str:
    """Table 1's layout, one block per dataset and N."""
    evaluations = index_evaluations(paths, variant)
    header = ["Setting", "Method"] + [f"{m} {c}" for m in models for c in ("Acc", "RStd", "Cons.")]
    blocks = []
    groups: dict[tuple[str, int], list[str]] = {}
    for benchmark in benchmarks:
        dataset, _, n = split_benchmark(benchmark)
        groups.setdefault((dataset, n), []).append(benchmark)
    for (dataset, n), members in groups.items():
        example = evaluations.get((models[0], members[0]), {})
        blocks.append(
            f"## {dataset}, N = {n}\n\n"
            f"Acc: mean ± std over the {example.get('n_orderings', 'T')} orderings (%); RStd: std of the "
            f"per-position recall (%); Cons.: same image under every ordering (%); "
            f"{example.get('n_instances', '?')} instances.\n\n"
            + markdown_table(header, table1_rows(evaluations, models, members))
        )
    return "# Accuracy, position bias and consistency (Table 1 layout)\n\n" + "\n".join(blocks)
