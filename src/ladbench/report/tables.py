"""The paper's tables from a :class:`~ladbench.report.study.Study` (evaluation and analysis
files, cache attributes): pure functions returning :class:`~ladbench.report.render.Table`.

Each table keeps the paper's layout (PUBLISHED_RESULTS.md); a number the study did not
compute (a variant not configured, a K larger than the model's layer range) is "–".
Every accuracy cell reads ``mean±std over orderings [95% bootstrap CI of the mean]``.
"""

from __future__ import annotations

from typing import Any, Callable

from ladbench.report.published import PAPER_MODELS, PUBLISHED, Published, protocol_mismatches
from ladbench.report.render import Block, Cell, Table
from ladbench.config import benchmark_parts
from ladbench.methods import METHODS, readout_methods
from ladbench.variants import VARIANTS, PromptVariant
from ladbench.provenance import demo_note, demo_suffix
from ladbench.report.study import SETTING_NAMES, Study

__all__ = [
    "DISPLAY_NAMES",
    "TABLE_BUILDERS",
    "acc_cell",
    "metric_cell",
    "pass_cost_cells",
    "build_tables",
    "divergence_table",
    "lad_variants_table",
    "paper_comparison_table",
    "table1",
    "table2",
    "table3",
    "table4",
    "table7",
    "table8",
]

#: a method's or prompt variant's name -> its label (the registries' ``label``)
DISPLAY_NAMES = {**{name: v.label for name, v in VARIANTS.items()}, **{name: m.label for name, m in METHODS.items()}}

CELL_NOTE = (
    "Cells: Acc = mean ± std over the T orderings (%; sample std, ddof = evaluation.acc_ddof, 1 by default as the "
    "reference) [95% bootstrap interval of the mean over instances]; "
    "RStd = std over the N positions of the per-position recall (%) [interval]; "
    "Cons. = % of instances answered with the same image under every ordering [interval]. "
    "'–': not computed in this study."
)


def table1_rows() -> list[tuple[str, str, str, bool]]:
    """Table 1's rows in order: (label, prompt variant of the cache, method, always shown).
    The prompt variants placed in Table 1 (read out by their first method) and the methods
    with a Table 1 place (read from the variant they read), ordered by place. Rows the paper
    has are always shown ('–' when not run); the others only when the study evaluated them."""
    rows = [(v.place, v.label, v.name, v.methods[0]) for v in VARIANTS.values() if v.table == "table1"]
    rows += [(m.place, m.label, m.reads, name) for name, m in METHODS.items() if m.place is not None]
    published = {row.label for row in PUBLISHED if row.table in ("Table 1", "Table 6")}
    return [(label, prompt, method, label in published)
            for _, label, prompt, method in sorted(rows, key=lambda row: row[0])]


def variants_in_order(table: str | None = None) -> list[PromptVariant]:
    """The registered prompt variants by place (those placed in ``table`` when given)."""
    return sorted((v for v in VARIANTS.values() if table is None or v.table == table), key=lambda v: v.place)


# --------------------------------------------------------------------------- cells


def acc_cell(m: dict | None) -> Cell:
    """Acc: mean ± std over orderings with the bootstrap interval of the mean; for generative
    methods (parse success below 100%) the parse success as a note."""
    if not m:
        return Cell()
    note = ""
    if m.get("parse_success") is not None and m["parse_success"] < 100.0:
        note = f"parsed {m['parse_success']:.1f}%"
    return Cell(m.get("acc_mean"), m.get("acc_std"), m.get("acc_mean_ci_low"), m.get("acc_mean_ci_high"), note)


def metric_cell(m: dict | None, key: str) -> Cell:
    """RStd / Cons. / parse success with its bootstrap interval."""
    if not m:
        return Cell()
    return Cell(m.get(key), None, m.get(f"{key}_ci_low"), m.get(f"{key}_ci_high"))


def three_cells(m: dict | None) -> list[Cell]:
    return [acc_cell(m), metric_cell(m, "rstd"), metric_cell(m, "cons")]


def _generative_note() -> str:
    return ("CoT, Self-Consistency and Vanilla (greedy reply, parsed; the reference's Vanilla readout: two greedy "
            "tokens, the last integer in 1..N): the answer parsed from the generated text; an unparsable reply "
            "counts as wrong, and the parse success is given in brackets when below 100%. Vanilla: argmax of the "
            "candidate scores.")


# --------------------------------------------------------------------------- Tables 1 / 6


def table1(study: Study) -> Table:
    """Tables 1 (N = 4) and 6 (N = 8): Setting x Method rows, Acc / RStd / Cons. per model;
    one block per dataset and N."""
    header = ["Setting", "Method"] + [f"{m} {c}" for m in study.models for c in ("Acc", "RStd", "Cons.")]
    blocks = []
    for dataset in study.datasets():
        for n in study.sizes():
            members = [b for b in study.benchmarks if benchmark_parts(b)[0] == dataset and benchmark_parts(b)[2] == n]
            rows = []
            for benchmark in members:
                setting = SETTING_NAMES.get(benchmark_parts(benchmark)[1], benchmark_parts(benchmark)[1])
                for label, prompt, method, always in table1_rows():
                    if not always and not any(study.method_metrics(m, benchmark, prompt, method) for m in study.models):
                        continue
                    cells = []
                    for model in study.models:
                        cells += three_cells(study.method_metrics(model, benchmark, prompt, method))
                    rows.append([setting, label] + cells)
            if rows:
                paper = {4: "Table 1", 8: "Table 6"}.get(n)
                blocks.append(Block(f"{dataset}, N = {n}" + (f" (paper: {paper})" if paper else ""), rows))
    instances = _instances_note(study)
    return Table(
        "table1",
        "Accuracy, position bias and consistency (layout of Tables 1 and 6)",
        header,
        blocks,
        [CELL_NOTE, _generative_note(), instances,
         "Vanilla, PriDe and Ours (LAD) share one cached forward pass per row (the vanilla prompt); Instruction, "
         "CoT and Self-Consistency come from their own caches."],
    )


def _instances_note(study: Study) -> str:
    sizes = sorted({(e.get("n_instances"), e.get("n_orderings")) for e in study.evaluations.values()},
                   key=lambda pair: tuple(-1 if v is None else v for v in pair))
    if not sizes:
        return "No evaluation files."
    described = ", ".join(f"{i} instances x T = {t} orderings" for i, t in sizes)
    sources = sorted({e.get("calibration_source") for e in study.evaluations.values()} - {None})
    where = {"pool": "drawn from a calibration pool disjoint from the evaluation set",
             "evaluation_head": "the first |D_cal| evaluation instances, as the reference implementation"}
    calibration = "; ".join(where.get(source, source) for source in sources) or "source not recorded"
    return (f"Evaluation set: {described}; |D_cal| = {study.n_cal if study.n_cal is not None else '?'} "
            f"calibration instances ({calibration}).")


# --------------------------------------------------------------------------- Table 2


def pass_cost_cells(attrs: dict | None, n_orderings: int | None) -> list[Cell]:
    """Latency of one pass over the test set (s) and peak memory (MB) from a cache's attributes.

    One pass = one ordering of every evaluation instance: the cache's evaluation rows
    divided by T (for permutation averaging that includes its N shifts per ordering),
    at the rate the inference job measured.
    """
    if not attrs:
        return [Cell(), Cell()]
    rate, n_eval_rows = attrs.get("rows_per_s"), attrs.get("n_eval_rows")
    latency = None
    if _positive(rate) and n_eval_rows and n_orderings:
        latency = n_eval_rows / n_orderings / rate
    peak_cuda = attrs.get("peak_cuda_mb")
    if _positive(peak_cuda):
        memory = Cell(peak_cuda, digits=0, note="GPU")
    else:
        memory = Cell(attrs.get("peak_rss_mb"), digits=0, note=f"RSS, {attrs.get('device', '?')}")
    return [Cell(latency, digits=1), memory]


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and value == value and value > 0


def table2(study: Study) -> Table:
    """Table 2 (cost): per model and benchmark setting, the latency of one pass over the
    test set and the peak memory, per N, for each cached pass."""
    sizes = study.sizes()
    header = ["Setting", "Pass (methods)"] + [f"Latency s N={n}" for n in sizes] + [f"Peak MB N={n}" for n in sizes]
    blocks = []
    for model in study.models:
        rows = []
        for dataset in study.datasets():
            for setting in SETTING_NAMES:
                benchmarks = {n: f"{dataset}_{setting}_N{n}" for n in sizes}
                if not any(b in study.benchmarks for b in benchmarks.values()):
                    continue
                for entry in variants_in_order():
                    prompt, label = entry.name, entry.cost_label or entry.label
                    variants = study.variants_with_prompt(prompt)
                    if not variants:
                        continue
                    latency, memory = [], []
                    for n in sizes:
                        evaluation = study.evaluations.get((model, benchmarks[n], variants[0], benchmarks[n]), {})
                        lat, mem = pass_cost_cells(study.cache(model, benchmarks[n], variants[0]),
                                                   evaluation.get("n_orderings"))
                        latency.append(lat)
                        memory.append(mem)
                    setting_label = study.setting_label(next(iter(benchmarks.values())), with_n=False)
                    rows.append([setting_label, label] + latency + memory)
        blocks.append(Block(model, rows))
    return Table(
        "table2",
        "Cost of each cached pass (layout of Table 2)",
        header,
        blocks,
        [
            "Latency: seconds for one pass over the test set (one ordering of every evaluation instance), i.e. "
            "instances / measured rows per second of the inference job (timed over every row of the cache, "
            "across resumed runs, on the device named). "
            "Peak MB: peak GPU memory allocated by the job, or, on a CPU, the process's peak resident memory (RSS).",
            "Unlike the paper, where each method re-runs the model, every logit- and attention-level method "
            "(Vanilla, PriDe, Ours, the readouts and all ablations) reads ONE cached pass: their cost is that pass's. "
            "PriDe and LAD add the calibration rows (|pool| x N shifts, in the same cache) and milliseconds of numpy.",
        ],
    )


# --------------------------------------------------------------------------- Table 3


def _short_benchmark(benchmark: str) -> str:
    dataset, setting, _ = benchmark_parts(benchmark)
    return f"{dataset}({setting[0].upper()})"


def table3(study: Study) -> Table:
    """Table 3 (calibration transfer): calibrate on A, test on B; Vanilla, PriDe, Ours."""
    header = ["Setting", "Vanilla", "PriDe", "Ours (LAD)"]
    blocks = []
    for model in study.models:
        rows = []
        seen = set()
        for key in study.transfers():
            m, benchmark, variant, cal = key
            if m != model or study.variants.get(variant) != "vanilla" or (benchmark, cal) in seen:
                continue
            seen.add((benchmark, cal))
            n = benchmark_parts(benchmark)[2]
            label = f"{_short_benchmark(cal)} → {_short_benchmark(benchmark)}, N={n}"
            cells = []
            for method in ("vanilla", "pride", "lad"):
                prompt = METHODS[method].reads
                metrics = study.method_metrics(model, benchmark, prompt, method, cal)
                if metrics is None and not METHODS[method].needs_calibration:  # then the same in any evaluation
                    metrics = study.method_metrics(model, benchmark, prompt, method)
                cells.append(acc_cell(metrics))
            rows.append([label] + cells)
        blocks.append(Block(model, rows))
    return Table(
        "table3",
        "Calibration transfer: calibrate on A, test on B (layout of Table 3)",
        header,
        blocks,
        ["Acc (%) = mean ± std over orderings [95% bootstrap interval]. (R) random, (A) adversarial setting. "
         "Transfers come from evaluation.transfer in the config; Vanilla needs no calibration."],
    )


# --------------------------------------------------------------------------- Tables 4 and 7


def table4(study: Study) -> Table:
    """Table 4 (ablation): Strategy x Prior x K, for every model and benchmark analysed."""
    header = ["Strategy", "Prior", "K", "Acc", "RStd", "Cons."]
    blocks = []
    for model in study.models:
        for benchmark in study.benchmarks:
            analysis = study.analysis(model, benchmark)
            if analysis is None:
                blocks.append(Block(f"{model}, {benchmark}", []))
                continue
            rows = []
            for row in analysis.get("ablation", []):
                k = "–" if row.get("top_k") is None else str(row["top_k"])
                if any(w.startswith("top_k =") for w in row.get("warnings", [])):
                    k += "*"  # lowered to the range's size (lad.k_beyond_range: lower)
                rows.append([row["strategy"], "yes" if row["prior"] else "no", k] + three_cells(row.get("metrics")))
            blocks.append(Block(f"{model}, {benchmark}", rows))
    return Table(
        "table4",
        "Ablation of the attention readout, the prior and the layer selection (layout of Table 4)",
        header,
        blocks,
        [CELL_NOTE,
         "Attn readout: argmax of the attention evidence of the top-K layers, without (raw) or with (purified) "
         "the calibration prior. All layers: LAD averaging every layer. Dynamic: LAD with the top-K layers per "
         "instance. K*: larger than the layers searched, so every searched layer is used (the reference lowers K; "
         "with lad.k_beyond_range: error the row is '–'). From the analysis files (first calibration draw)."],
    )


def _readout_metrics(study: Study, model: str, benchmark: str, method: str) -> dict | None:
    """A Table 7 readout: from the evaluation when configured, else from the analysis."""
    metrics = study.method_metrics(model, benchmark, METHODS[method].reads, method)
    if metrics is not None:
        return metrics
    analysis = study.analysis(model, benchmark) or {}
    for row in analysis.get("readouts", []):
        if row.get("method") == method:
            return row.get("metrics")
    return None


def table7(study: Study) -> Table:
    """Table 7 (divergence): the registry's readouts (Vanilla, raw attention, purified attention, Ours), per setting."""
    columns = readout_methods()
    header = ["Setting"] + [METHODS[c].label if c != "lad" else "Ours" for c in columns]
    blocks = _accuracy_blocks(study, lambda model, b: [_readout_metrics(study, model, b, c) for c in columns])
    return Table(
        "table7",
        "Logits versus attention readouts (layout of Table 7)",
        header,
        blocks,
        ["Acc (%) = mean ± std over orderings [95% bootstrap interval]. Raw attention: argmax of the mean attention "
         "evidence of the top-K layers; Purified attention: the same divided by the calibration prior; Ours: LAD."],
    )


def _accuracy_blocks(study: Study, metrics_of: Callable[[str, str], list]) -> list[Block]:
    """One block per model, one row per benchmark setting: the accuracy cells of
    ``metrics_of(model, benchmark)`` (one metrics dict or None per column)."""
    return [Block(model, [[study.setting_label(b)] + [acc_cell(m) for m in metrics_of(model, b)]
                          for b in study.benchmarks])
            for model in study.models]


# --------------------------------------------------------------------------- Table 8


def table8(study: Study) -> Table:
    """Table 8 (other baselines): Vanilla, SoFA, permutation averaging, Ours, per setting."""
    columns = (("Vanilla", "vanilla", "vanilla"),
               *((v.label + (" (N passes)" if v.shifts_per_ordering else ""), v.name, v.methods[0])
                 for v in variants_in_order("table8")),
               ("Ours", "vanilla", "lad"))
    header = ["Setting"] + [c[0] for c in columns]
    blocks = _accuracy_blocks(study, lambda model, b: [study.method_metrics(model, b, prompt, method)
                                                       for _, prompt, method in columns])
    return Table(
        "table8",
        "Other debiasing baselines (layout of Table 8)",
        header,
        blocks,
        ["Acc (%) = mean ± std over orderings [95% bootstrap interval]. SoFA: the sofa cache read out by argmax; "
         "permutation averaging: scores of the N cyclic shifts of each ordering averaged per image (N forward passes)."],
    )


# --------------------------------------------------------------------------- beyond the paper


def _rho_cell(summary: dict | None) -> Cell:
    if not summary:
        return Cell()
    return Cell(summary.get("mean"), summary.get("std"), summary.get("ci_low"), summary.get("ci_high"), digits=3)


def divergence_table(study: Study) -> Table:
    """METHOD §9: order robustness (Spearman rho across orderings) of logits and attention."""
    header = ["Setting", "rho logits", "rho raw attention", "rho purified attention", "purified - logits"]
    blocks = []
    for model in study.models:
        rows = []
        for benchmark in study.benchmarks:
            analysis = study.analysis(model, benchmark)
            if analysis is None:
                continue
            raw = analysis.get("divergence", {}).get("raw", {})
            purified = analysis.get("divergence", {}).get("purified", {})
            rows.append([study.setting_label(benchmark), _rho_cell(raw.get("logits")), _rho_cell(raw.get("attention")),
                         _rho_cell(purified.get("attention")), _rho_cell(purified.get("attention_minus_logits"))])
        blocks.append(Block(model, rows))
    return Table(
        "divergence",
        "Logit-attention divergence: order robustness of each signal (METHOD §9)",
        header,
        blocks,
        ["Per instance: mean over pairs of orderings of the Spearman correlation between the values each signal gives "
         "to each IMAGE (not position); cells: mean ± std over instances [95% bootstrap interval of the mean]. "
         "Near 1: the signal follows the image content; near 0: it follows the position. Raw attention: evidence of "
         "the top-K layers; purified: divided by the calibration prior. The paper's rebuttal reports about "
         "0.82 ± 0.05 (attention) vs 0.25 ± 0.12 (logits) over 20 permutations."],
    )


def lad_variants_table(study: Study) -> Table:
    """LAD (and PriDe) with each step as in the reference implementation or the paper."""
    header = ["Setting", "Method", "Score average (L)", "Layer mean", "Mixture", "Acc", "RStd", "Cons."]
    blocks = []
    for model in study.models:
        rows = []
        for benchmark in study.benchmarks:
            analysis = study.analysis(model, benchmark)
            for row in (analysis or {}).get("paper_vs_reference", []):
                rows.append([study.setting_label(benchmark), DISPLAY_NAMES.get(row["method"], row["method"]),
                             row.get("score_average") or "–", row.get("layer_mean") or "–", row.get("mixture") or "–"]
                            + three_cells(row.get("metrics")))
        blocks.append(Block(model, rows))
    return Table(
        "lad_variants",
        "Paper versus reference implementation, step by step",
        header,
        blocks,
        [CELL_NOTE,
         "Score average (Eqs. 1-3): reference = mean of raw scores, paper = log of mean probabilities. Layer mean "
         "(Eqs. 10-11): reference = log of the mean attention, paper = mean of the log ratios. Mixture (Eq. 13): "
         "reference = in log space, paper = in probability space. PriDe (original): Zheng et al.'s prior."],
    )


# --------------------------------------------------------------------------- side by side


def _study_model_for(study: Study, hub_id: str) -> str | None:
    """The study's model name whose caches ran ``hub_id``."""
    for (model, _, _), attrs in study.caches.items():
        if attrs.get("model_path") == hub_id:
            return model
    return None


def _study_benchmark_for(study: Study, source: str, setting: str, n: int) -> str | None:
    for benchmark in study.benchmarks:
        dataset, b_setting, b_n = benchmark_parts(benchmark)
        if study.dataset_sources.get(dataset) == source and b_setting == setting and b_n == n:
            return benchmark
    return None


def _reproduced(study: Study, row: Published, model: str, benchmark: str) -> dict | None:
    if row.kind == "method":
        return study.method_metrics(model, benchmark, row.prompt, row.key) or (
            _readout_metrics(study, model, benchmark, row.key) if row.prompt == "vanilla" else None)
    if row.kind == "transfer":
        cal = _study_benchmark_for(study, *row.cal)
        return None if cal is None else study.method_metrics(model, benchmark, "vanilla", row.key, cal)
    if row.kind == "ablation":
        for entry in (study.analysis(model, benchmark) or {}).get("ablation", []):
            if entry.get("label") == row.key:
                return entry.get("metrics")
    return None


def paper_comparison_rows(study: Study) -> tuple[list[list[Any]], list[str]]:
    """Rows (Table, Model, Setting, Method, Metric, Reproduced, Published, Δ, Published in CI)
    for every published number the study can be compared with, and the reasons why the
    others cannot (models not run, benchmarks absent, another protocol)."""
    rows, reasons = [], []
    for row in PUBLISHED:
        hub_id = PAPER_MODELS[row.model]
        model = _study_model_for(study, hub_id)
        if model is None:
            reasons.append(f"{row.model} ({hub_id}) is not among the study's models")
            continue
        benchmark = _study_benchmark_for(study, row.source, row.setting, row.n)
        if benchmark is None:
            reasons.append(f"no {row.source} {row.setting} N={row.n} benchmark in the study")
            continue
        evaluation = study.evaluation(model, benchmark) or {}
        mismatch = protocol_mismatches(evaluation, study.n_cal)
        if mismatch:
            reasons.append(f"{model} on {benchmark}: {'; '.join(mismatch)}")
            continue
        metrics = _reproduced(study, row, model, benchmark)
        if metrics is None:
            reasons.append(f"{row.table} {row.label}: not computed for {model} on {benchmark}")
            continue
        published = (("Acc", row.acc, row.acc_std, acc_cell(metrics), "acc_mean"),
                     ("RStd", row.rstd, None, metric_cell(metrics, "rstd"), "rstd"),
                     ("Cons.", row.cons, None, metric_cell(metrics, "cons"), "cons"))
        for name, value, std, cell, _ in published:
            if value is None or cell.missing:
                continue
            inside = cell.low is not None and cell.high is not None and cell.low <= value <= cell.high
            rows.append([row.table, row.model, study.setting_label(benchmark), row.label, name, cell,
                         Cell(value, std), Cell(cell.value - value), "yes" if inside else "no"])
    return rows, list(dict.fromkeys(reasons))


def paper_comparison_table(study: Study) -> Table:
    """Side by side with the published numbers, where the study matches the paper's configuration."""
    rows, reasons = paper_comparison_rows(study)
    notes = [
        "Only where the study matches the paper: the paper's model (hub id), MS-COCO val2014 (or Flickr8k for "
        "Table 3), the same setting and N, 1,000 instances, T = 5, |D_cal| = 5, K = 2, tau = 5. "
        "Reproduced: this study [95% bootstrap interval]; Published: the paper (± std over orderings for Acc); "
        "Δ = reproduced - published; 'in CI': the published value lies inside the reproduced interval."
    ]
    if reasons:
        shown = reasons[:12]
        more = f" (and {len(reasons) - len(shown)} more)" if len(reasons) > len(shown) else ""
        notes.append("Not compared: " + "; ".join(shown) + more + ".")
    header = ["Table", "Model", "Setting", "Method", "Metric", "Reproduced", "Published", "Δ", "Published in CI"]
    return Table("paper_comparison", "Side by side with the published numbers", header,
                 [Block("", rows)], notes)


# --------------------------------------------------------------------------- all of them

TABLE_BUILDERS: dict[str, Callable[[Study], Table]] = {
    "table1": table1,
    "table2": table2,
    "table3": table3,
    "table4": table4,
    "table7": table7,
    "table8": table8,
    "divergence": divergence_table,
    "lad_variants": lad_variants_table,
    "paper_comparison": paper_comparison_table,
}


def build_tables(study: Study) -> dict[str, Table]:
    """Every table of the report, by file stem."""
    kinds = study.model_kinds()
    tables = {name: build(study) for name, build in TABLE_BUILDERS.items()}
    note = demo_note(kinds)
    for table in tables.values():            # demo numbers say so, in the title and first note
        table.title += demo_suffix(kinds.values())
        if note:
            table.notes.insert(0, note)
    return tables
