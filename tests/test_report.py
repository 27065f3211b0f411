"""Report: tables in the paper's layouts (Markdown, CSV, LaTeX, HTML) with "–" for missing
inputs, the side by side with the published numbers, the figures, and (slow) regenerating
every table and figure from the cached intermediates without rerunning inference or
calibration, plus `snakemake --report`."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from ladbench.atomic import signed
from ladbench import metrics
from ladbench.cli import main
from ladbench.report.published import PAPER_MODELS, PUBLISHED
from ladbench.report.render import Block, Cell, Table, to_csv, to_latex, to_markdown
from ladbench.report.study import load_study
from ladbench.report.tables import paper_comparison_rows, pass_cost_cells, table1, table2, table3

LLAVA = "LLaVA-OV-1.5-8B"


# --------------------------------------------------------------------------- fixtures


def evaluation_document(acc_target: float, n_instances: int, n_orderings: int = 5, n: int = 4, seed: int = 0,
                        methods=("vanilla", "pride", "lad"), tau: float = 5.0) -> dict:
    """An evaluation JSON (formats §6) whose methods are correct on ~acc_target of the rows."""
    rng = np.random.default_rng(seed)
    order = np.stack([np.stack([rng.permutation(n) for _ in range(n_orderings)]) for _ in range(n_instances)])
    target = rng.integers(0, n, (n_instances, n_orderings))
    summaries = {}
    for index, method in enumerate(methods):
        wrong = (target + 1 + rng.integers(0, n - 1, target.shape)) % n
        pred = np.where(rng.random(target.shape) < acc_target + 0.05 * index, target, wrong)
        summaries[method] = metrics.summarize(pred, target, order, n, n_boot=200, seed=0)
    return {"n_instances": n_instances, "n_orderings": n_orderings, "n_candidates": n,
            "settings": {"top_k": 2, "tau": tau}, "methods": summaries}


def write_json(path: Path, document: dict) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(signed(document)))      # as the stages sign them (an unsigned one is refused)
    return str(path)


def write_evaluation(out: Path, model: str, benchmark: str, variant: str, document: dict,
                     cal_benchmark: str | None = None) -> str:
    """An evaluation JSON at the workflow's path, recording what it is as `ladbench evaluate` does."""
    cal_benchmark = cal_benchmark or benchmark
    identity = {"model": model, "benchmark": benchmark, "variant": variant, "cal_benchmark": cal_benchmark}
    path = out / "eval" / model / benchmark / variant / f"cal-{cal_benchmark}.json"
    return write_json(path, {**identity, **document})


def write_cache_stub(path: Path, n_eval_rows: int, n_cal_rows: int, **attrs) -> str:
    """A cache with only what the report reads: `split` and the attributes (model, benchmark_name
    and variant_name default to the workflow's path .../{model}/{benchmark}/{variant}.h5)."""
    names = {"model": path.parts[-3], "benchmark_name": path.parts[-2], "variant_name": path.stem}
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.create_dataset("split", data=np.r_[np.zeros(n_eval_rows, np.int8), np.ones(n_cal_rows, np.int8)])
        for key, value in {**names, **attrs}.items():
            f.attrs[key] = value
    return str(path)


# --------------------------------------------------------------------------- rendering


def small_table() -> Table:
    rows = [["Random", "Vanilla", Cell(51.7, 1.38, 49.91, 53.49)], ["Random", "CoT", Cell()]]
    return Table("t", "A title", ["Setting", "Method", "m_1 Acc"], [Block("coco, N = 4", rows)], ["A note: 50% & more"])


def test_cell_text_shows_estimate_spread_interval_and_missing_marker():
    assert Cell(51.7, 1.38, 49.91, 53.49).text() == "51.70±1.38 [49.9, 53.5]"
    assert Cell(0.8234, None, 0.8, 0.85, digits=3).text() == "0.823 [0.80, 0.85]"
    assert Cell(54.16, 1.98, note="parsed 97.0%").text() == "54.16±1.98 (parsed 97.0%)"
    assert Cell().text() == Cell(float("nan")).text() == "–"


def test_latex_cells_use_the_same_layout_with_latex_marks_and_escaping():
    table = Table("t", "T", ["m"], [Block("b", [[Cell(51.7, 1.38, 49.91, 53.49)], [Cell(3.0, note="97% & x_y")]])], [])
    latex = to_latex(table)
    assert r"51.70$\pm$1.38 {\scriptsize[49.9, 53.5]}" in latex
    assert r"3.00 {\scriptsize(97\% \& x\_y)}" in latex


def test_markdown_csv_and_latex_carry_the_same_numbers():
    table = small_table()
    markdown = to_markdown(table)
    assert "| Random | Vanilla | 51.70±1.38 [49.9, 53.5] |" in markdown and "| Random | CoT | – |" in markdown
    rows = list(csv.DictReader(io.StringIO(to_csv(table))))
    assert rows[0]["block"] == "coco, N = 4" and float(rows[0]["m_1 Acc"]) == 51.7
    assert float(rows[0]["m_1 Acc ci_high"]) == 53.49 and rows[1]["m_1 Acc"] == ""
    latex = to_latex(table)
    assert r"51.70$\pm$1.38 {\scriptsize[49.9, 53.5]}" in latex and r"m\_1 Acc" in latex
    assert r"Random & CoT & -- \\" in latex


def test_a_row_of_the_wrong_width_is_refused_with_the_table_named():
    with pytest.raises(ValueError, match="table t"):
        Table("t", "x", ["a", "b"], [Block("", [["only one"]])])


# --------------------------------------------------------------------------- tables


@pytest.fixture
def toy_study(tmp_path):
    """One model, two benchmarks, a vanilla and an instruction cache (no CoT / SC), a transfer."""
    out = tmp_path / "results"
    evaluations = []
    for b_index, benchmark in enumerate(("toy_random_N4", "toy_adversarial_N4")):
        evaluations.append(write_evaluation(out, "m", benchmark, "vanilla", evaluation_document(0.5, 30, seed=b_index)))
        evaluations.append(write_evaluation(out, "m", benchmark, "instruction",
                                            evaluation_document(0.4, 30, seed=10 + b_index, methods=("vanilla",))))
    evaluations.append(write_evaluation(out, "m", "toy_adversarial_N4", "vanilla", evaluation_document(0.3, 30, seed=7),
                                        cal_benchmark="toy_random_N4"))
    caches = [write_cache_stub(out / "cache" / "m" / "toy_random_N4" / "vanilla.h5", 150, 24, rows_per_s=15.0,
                               peak_rss_mb=800.0, peak_cuda_mb=float("nan"), device="cpu", model_path="local/m")]
    return load_study(models=["m"], benchmarks=["toy_random_N4", "toy_adversarial_N4"],
                      variants={"vanilla": "vanilla", "instruction": "instruction", "cot": "cot"},
                      evaluations=evaluations, caches=caches, n_cal=5, dataset_sources={"toy": "synthetic"})


def test_table1_keeps_the_paper_rows_and_dashes_what_was_not_run(toy_study):
    table = table1(toy_study)
    (block,) = table.blocks
    assert [row[:2] for row in block.rows[:6]] == [
        ["Random", "Vanilla"], ["Random", "Instruction"], ["Random", "CoT"], ["Random", "PriDe"],
        ["Random", "Self-Consistency"], ["Random", "Ours (LAD)"]]
    by_method = {row[1]: row for row in block.rows if row[0] == "Random"}
    assert all(cell.missing for cell in by_method["CoT"][2:]) and all(c.missing for c in by_method["Self-Consistency"][2:])
    vanilla = toy_study.evaluations[("m", "toy_random_N4", "vanilla", "toy_random_N4")]["methods"]["vanilla"]
    acc = by_method["Vanilla"][2]
    assert (acc.value, acc.std, acc.low, acc.high) == (
        vanilla["acc_mean"], vanilla["acc_std"], vanilla["acc_mean_ci_low"], vanilla["acc_mean_ci_high"])
    instruction = toy_study.evaluations[("m", "toy_random_N4", "instruction", "toy_random_N4")]["methods"]["vanilla"]
    assert by_method["Instruction"][2].value == instruction["acc_mean"]  # the instruction cache's vanilla readout


def test_demo_tables_say_which_numbers_come_from_which_tiny_model(tmp_path):
    """Labels come from the caches' model_kind attribute (not from names or paths): a model
    named like a real one but recorded as the organism is labelled the organism."""
    from ladbench.report.tables import build_tables

    out = tmp_path / "results"
    kinds = {"qwen_real_looking": "tiny-organism", "other": "tiny-random", "real": "pretrained"}
    evaluations, caches = [], []
    for model, kind in kinds.items():
        evaluations.append(write_evaluation(out, model, "toy_random_N4", "vanilla",
                                            evaluation_document(0.5, 30, seed=1)))
        caches.append(write_cache_stub(out / "cache" / model / "toy_random_N4" / "vanilla.h5", 150, 24,
                                       model_kind=kind, rows_per_s=15.0))
    study = load_study(models=list(kinds), benchmarks=["toy_random_N4"], variants={"vanilla": "vanilla"},
                       evaluations=evaluations, caches=caches, n_cal=5)
    for table in build_tables(study).values():
        assert table.title.endswith("[demo: trained model organism and random tiny models]")
        assert "qwen_real_looking is a tiny trained model organism" in table.notes[0]
        assert "other is a tiny random model" in table.notes[0] and "real is" not in table.notes[0]
    only_real = load_study(models=["real"], benchmarks=["toy_random_N4"], variants={"vanilla": "vanilla"},
                           evaluations=evaluations[2:], caches=caches[2:], n_cal=5)
    assert not any("demo" in t.title.lower() for t in build_tables(only_real).values())


def test_table2_latency_is_one_test_set_pass_at_the_measured_rate(toy_study):
    # 150 evaluation rows = 30 instances x T = 5 at 15 rows/s: one ordering of the test set takes 2 s.
    latency, memory = pass_cost_cells(toy_study.cache("m", "toy_random_N4", "vanilla"), 5)
    assert latency.value == pytest.approx(2.0) and memory.value == 800.0 and "RSS" in memory.note
    gpu = pass_cost_cells({"rows_per_s": 4.0, "n_eval_rows": 8000, "peak_cuda_mb": 16489.0}, 5)
    assert gpu[0].value == pytest.approx(400.0) and gpu[1].note == "GPU"
    rows = table2(toy_study).blocks[0].rows
    assert rows[0][2].value == pytest.approx(2.0) and rows[1][2].missing  # adversarial cache not given


def test_table3_lists_the_transfer(toy_study):
    (block,) = table3(toy_study).blocks
    assert block.rows[0][0] == "toy(R) → toy(A), N=4"
    transfer = toy_study.evaluations[("m", "toy_adversarial_N4", "vanilla", "toy_random_N4")]["methods"]
    assert block.rows[0][3].value == transfer["lad"]["acc_mean"]


def test_tables_cli_writes_every_table_in_every_format(toy_study, tmp_path):
    evaluations = [str(p) for p in (tmp_path / "results" / "eval").rglob("*.json")]
    out = tmp_path / "report"
    main(["report", "tables", "--models", "m", "--benchmarks", "toy_random_N4", "toy_adversarial_N4",
          "--variants", "vanilla=vanilla", "instruction=instruction", "--evaluations", *evaluations,
          "--n-cal", "5", "--out-dir", str(out)])
    for name in ("table1", "table2", "table3", "table4", "table7", "table8", "divergence", "lad_variants", "paper_comparison"):
        for fmt in ("md", "csv", "tex", "html"):
            assert (out / f"{name}.{fmt}").stat().st_size > 0, f"{name}.{fmt}"
    assert "No input for this table" in (out / "table4.md").read_text()  # no analysis files given
    assert "–" in (out / "table8.md").read_text()  # no SoFA / permutation-averaging caches
    assert "not among the study's models" in (out / "paper_comparison.md").read_text()


# --------------------------------------------------------------------------- side by side


def paper_like_study(tmp_path, n_instances=1000, tau=5.0):
    """The paper's LLaVA model on COCO adversarial N = 4 with the paper's protocol."""
    out = tmp_path / "paper"
    benchmark = "coco_adversarial_N4"
    evaluation = write_evaluation(out, "llava", benchmark, "vanilla", evaluation_document(0.5, n_instances, tau=tau))
    cache = write_cache_stub(out / "cache" / "llava" / benchmark / "vanilla.h5", 10, 4,
                             model_path=PAPER_MODELS[LLAVA], rows_per_s=1.0)
    return load_study(models=["llava"], benchmarks=[benchmark], variants={"vanilla": "vanilla"},
                      evaluations=[evaluation], caches=[cache], n_cal=5, dataset_sources={"coco": "coco"})


def test_side_by_side_appears_when_the_study_matches_the_paper(tmp_path):
    study = paper_like_study(tmp_path)
    rows, reasons = paper_comparison_rows(study)
    vanilla_acc = [r for r in rows if r[0] == "Table 1" and r[3] == "Vanilla" and r[4] == "Acc"]
    assert len(vanilla_acc) == 1
    row = vanilla_acc[0]
    published = next(p for p in PUBLISHED if p.table == "Table 1" and p.model == LLAVA
                     and p.setting == "adversarial" and p.label == "Vanilla")
    assert row[6].value == published.acc == 49.56 and row[6].std == 1.20
    mine = study.evaluations[("llava", "coco_adversarial_N4", "vanilla", "coco_adversarial_N4")]["methods"]["vanilla"]
    assert row[7].value == pytest.approx(mine["acc_mean"] - 49.56)
    assert row[8] == ("yes" if mine["acc_mean_ci_low"] <= 49.56 <= mine["acc_mean_ci_high"] else "no")
    assert any("Qwen" in r for r in reasons)  # the other models were not run


def test_no_side_by_side_under_another_protocol(tmp_path):
    rows, reasons = paper_comparison_rows(paper_like_study(tmp_path, n_instances=50, tau=3.0))
    assert rows == []
    assert any("n_instances = 50 (paper: 1000)" in r and "tau = 3.0 (paper: 5)" in r for r in reasons)


def test_published_numbers_are_complete():
    tables = {p.table for p in PUBLISHED}
    assert tables == {"Table 1", "Table 3", "Table 4", "Table 6", "Table 7", "Table 8"}
    assert sum(p.table == "Table 1" for p in PUBLISHED) == 12 * 3
    assert sum(p.table == "Table 6" for p in PUBLISHED) == 10 * 3
    lad_random_8 = [p for p in PUBLISHED if p.table == "Table 6" and p.setting == "random" and p.label == "Ours (LAD)"]
    assert [p.acc for p in lad_random_8] == [93.10, 94.92, 90.54]


# --------------------------------------------------------------------------- the demo DAG


@pytest.mark.slow
def test_tables_and_figures_regenerate_from_cache_only_and_the_html_report_builds(demo_run, tmp_path):
    """Delete every table and figure, rerun: the dry run plans only report jobs, the caches and
    calibrations keep their mtimes, every table and figure is back, and `--report` builds."""
    from workflow_runner import copy_run, planned_jobs, snakemake

    tmp_path = copy_run(demo_run, tmp_path)
    out = tmp_path / "results" / "demo"
    intermediates = sorted([*out.glob("cache/**/*.h5"), *out.glob("calibration/**/*.npz"), *out.glob("analysis/**/*")])
    assert intermediates and any(p.suffix == ".h5" for p in intermediates)
    before = {p: p.stat().st_mtime_ns for p in intermediates}
    products = sorted(p.relative_to(out) for p in (out / "report").rglob("*") if p.is_file())
    assert len([p for p in products if p.parent.name == "figures"]) == 20  # 10 figures x (png, pdf)
    assert len([p for p in products if p.parent.name == "report"]) == 9 * 4  # 9 tables x 4 formats
    explorers = [p for p in products if p.parts[1] == "explorer"]
    assert len(explorers) == 2 + 1  # a page per vanilla cache (2 benchmarks), and the index

    shutil.rmtree(out / "report")
    jobs = planned_jobs(tmp_path)
    assert set(jobs) == {"report_table", "report_confusion", "report_figures", "report_model_figures", "report_explorer",
                         "report_explorer_index", "all"}
    assert not {"infer", "calibrate", "analyze", "evaluate"} & set(jobs)
    # with a $HOME of its own and no cache folder set: nothing of the workflow lands in it but
    # Snakemake's own source cache (README "Reliability"); matplotlib's goes under the output folder
    home = tmp_path.parent / "home"
    home.mkdir()
    snakemake(tmp_path, extra_env={"HOME": str(home), "MPLCONFIGDIR": "", "XDG_CACHE_HOME": "", "XDG_CONFIG_HOME": ""})
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert all(p == ".cache" or p.startswith(".cache/snakemake") for p in written), written
    assert (out / ".cache" / "matplotlib").is_dir()

    assert {p: p.stat().st_mtime_ns for p in intermediates} == before
    assert sorted(p.relative_to(out) for p in (out / "report").rglob("*") if p.is_file()) == products
    assert "Ours (LAD)" in (out / "report" / "table1.md").read_text()

    html = tmp_path / "report.html"
    log = snakemake(tmp_path, "--report", str(html))
    assert "Report created" in log
    text = html.read_text()
    for name in ("table1.html", "table4.html", "paper_comparison.html", "confusion_tiny_qwen2_5_vl_scenes_random_N4_vanilla.png",
                 "calibration_sweeps_tiny_qwen2_5_vl_scenes_adversarial_N4_vanilla.png", "divergence_tiny_qwen2_5_vl.png"):
        assert name in text, name
    assert "position confusion matrices" in text  # a caption
    for page in explorers:          # the report links every explorer page
        assert page.name in text and "Instance explorer" in text, page


# --------------------------------------------------------------------------- identity from the files


def test_the_report_reads_identity_from_the_files_not_their_folders(tmp_path):
    """Stage outputs written under folders named nothing like the workflow's layout (as after
    renaming a folder in common.smk) still fill the tables: every file says what it is."""
    from test_inputs import calibrate, write_cache

    from ladbench.report.tables import table1, table7

    cache = write_cache(tmp_path / "somewhere" / "a.h5", model="toy", variant="vanilla")
    calibration = calibrate(cache, tmp_path / "elsewhere" / "b.npz")
    evaluation = str(tmp_path / "renamed" / "c.json")
    analysis = str(tmp_path / "moved" / "d.json")
    for path in (evaluation, analysis):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    main(["evaluate", "--cache", cache, "--calibration", calibration, "--methods", "vanilla", "pride", "lad",
          "--layer-range", "all", "--bootstrap", "0", "--out", evaluation])
    main(["analyze", "--cache", cache, "--layer-range", "all", "--n-cal", "2", "--dcal-sizes", "1", "2",
          "--dcal-draws", "1", "--taus", "5", "--bootstrap", "0", "--out", analysis])
    study = load_study(models=["toy"], benchmarks=["scenes_random_N4"], variants={"vanilla": "vanilla"},
                       evaluations=[evaluation], analyses=[analysis], caches=[cache])

    assert set(study.evaluations) == {("toy", "scenes_random_N4", "vanilla", "scenes_random_N4")}
    assert set(study.analyses) == set(study.caches) == {("toy", "scenes_random_N4", "vanilla")}
    (block,) = table1(study).blocks
    by_method = {row[1]: row for row in block.rows}
    for method, name in (("Vanilla", "vanilla"), ("Ours (LAD)", "lad"), ("PriDe", "pride")):
        cell = by_method[method][2]
        (evaluation,) = study.evaluations.values()
        assert not cell.missing and cell.value == evaluation["methods"][name]["acc_mean"]
    readouts = [cell for block in table7(study).blocks for row in block.rows for cell in row[1:]]
    assert readouts and not any(cell.missing for cell in readouts)


def test_a_file_that_does_not_say_what_it_is_is_refused_naming_it(tmp_path):
    old = write_json(tmp_path / "eval" / "m" / "toy_random_N4" / "vanilla" / "cal-toy_random_N4.json",
                     evaluation_document(0.5, 10))   # folders as the workflow names them, but no record
    with pytest.raises(ValueError, match=f"evaluation file {old}: records no model, benchmark, variant, cal_benchmark"):
        load_study(models=["m"], benchmarks=["toy_random_N4"], variants={"vanilla": "vanilla"}, evaluations=[old])


def test_a_file_of_another_prompt_than_its_variant_is_refused(tmp_path):
    from ladbench.inputs import MismatchError
    cot = write_evaluation(tmp_path, "m", "toy_random_N4", "vanilla", {**evaluation_document(0.5, 10), "prompt": "cot"})
    with pytest.raises(MismatchError, match="records prompt 'cot', but --variants gives vanilla=vanilla"):
        load_study(models=["m"], benchmarks=["toy_random_N4"], variants={"vanilla": "vanilla"}, evaluations=[cot])


def test_a_killed_report_never_leaves_old_tables_beside_new_ones(toy_study, tmp_path, monkeypatch):
    """Every table file is replaced as one set: the old ones removed, then the new ones renamed
    in. Killed at each step of that in turn, each file is either new or missing (the rerun
    redoes it: Snakemake reruns a job whose outputs are missing), never old beside new; a
    failure while rendering leaves the old set untouched."""
    import os

    from ladbench.report.render import write_tables
    from ladbench.report.tables import build_tables

    tables = [(table, [tmp_path / "report" / f"{name}.{fmt}" for fmt in ("md", "csv")])
              for name, table in build_tables(toy_study).items()]
    files = [path for _, outputs in tables for path in outputs]
    real_replace = os.replace
    for kill_at in range(len(files) + 1):
        for path in files:
            path.parent.mkdir(exist_ok=True)
            path.write_text("old")
        def killed_after(renames, kill_at=kill_at):
            def replace(source, target):
                if renames["n"] == kill_at:
                    raise KeyboardInterrupt("killed")
                renames["n"] += 1
                real_replace(source, target)
            return replace
        monkeypatch.setattr(os, "replace", killed_after({"n": 0}))
        try:
            write_tables(tables)
        except KeyboardInterrupt:
            pass
        monkeypatch.setattr(os, "replace", real_replace)
        contents = [path.read_text() if path.exists() else None for path in files]
        assert "old" not in contents, f"killed after {kill_at} renames: old tables left beside new ones"
        assert contents.count(None) == len(files) - kill_at
    from ladbench.report.render import RENDERERS
    for path in files:
        path.write_text("old")
    monkeypatch.setitem(RENDERERS, ".csv", lambda table: 1 / 0)                # fails half way through
    with pytest.raises(ZeroDivisionError):
        write_tables(tables)
    assert all(path.read_text() == "old" for path in files) and not list((tmp_path / "report").glob("*.tmp"))
