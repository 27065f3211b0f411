"""Stage `report`: the paper's tables and figures from evaluation files, analysis files and
the inference caches' attributes only: it never runs a model nor fits a calibration.

    ladbench report tables         Tables 1/6, 2, 3, 4, 7, 8, divergence, LAD variants, paper side by side
    ladbench report confusion      Fig. 1/8 from an evaluation's predictions
    ladbench report figures        Figs. 2, 3 and 6 from one analysis
    ladbench report model-figures  Fig. 5 and the divergence figure of one model
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ladbench.provenance import title_with_kind
from ladbench.report.render import TABLE_FORMATS

__all__ = ["register"]



def _study_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", required=True, help="model names, in column order")
    parser.add_argument("--benchmarks", nargs="+", required=True, help="benchmark names, e.g. coco_random_N4, in row order")
    parser.add_argument("--variants", nargs="+", required=True,
                        help="cache variants as name=prompt (e.g. vanilla=vanilla cot=cot), in config order")
    parser.add_argument("--evaluations", nargs="*", default=[],
                        help="evaluation JSONs (each names its model, benchmark and variant; any path)")
    parser.add_argument("--analyses", nargs="*", default=[],
                        help="analysis JSONs (each names its model, benchmark and variant; any path)")


def register(subparsers) -> None:
    """Add the ``report`` subcommand and its kinds."""
    parser = subparsers.add_parser("report", help="tables and figures from cached intermediates",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = parser.add_subparsers(dest="kind", metavar="<kind>", required=True)

    tables = kinds.add_parser("tables", help="every table as Markdown, CSV and LaTeX")
    _study_arguments(tables)
    tables.add_argument("--caches", nargs="*", default=[],
                        help="inference caches (attributes only: Table 2, model ids; each names its model, benchmark "
                        "and variant; any path)")
    tables.add_argument("--n-cal", type=int, default=None, help="the study's |D_cal| (for the side by side)")
    tables.add_argument("--dataset-sources", nargs="*", default=[],
                        help="dataset name=source (coco, flickr8k, synthetic), for the side by side")
    tables.add_argument("--formats", nargs="+", choices=TABLE_FORMATS, default=list(TABLE_FORMATS),
                        help="table formats to write (html is the one shown by snakemake --report)")
    tables.add_argument("--out-dir", required=True, help="folder for <table>.<format>")
    tables.set_defaults(func=run_tables)

    confusion = kinds.add_parser("confusion", help="position confusion matrices, Vanilla vs LAD (Fig. 1/8)")
    confusion.add_argument("--predictions", required=True,
                           help="evaluation .npz (checked against the evaluation JSON beside it, written with it)")
    confusion.add_argument("--methods", nargs="+", default=["vanilla", "lad"], help="one panel per method")
    confusion.add_argument("--title", default="", help="figure title")
    confusion.add_argument("--out", nargs="+", required=True, help="output figure files (.png, .pdf)")
    confusion.set_defaults(func=run_confusion)

    figures = kinds.add_parser("figures", help="Figs. 2, 3 and 6 from one analysis (JSON + NPZ beside it)")
    figures.add_argument("--analysis", required=True, help="analysis JSON; its .npz must sit beside it")
    figures.add_argument("--title", default="", help="prefix of the figure titles (e.g. model and benchmark)")
    figures.add_argument("--profile", nargs="+", required=True, help="Fig. 2 outputs (.png, .pdf)")
    figures.add_argument("--attention", nargs="+", required=True, help="Fig. 3 outputs")
    figures.add_argument("--sweeps", nargs="+", required=True, help="Fig. 6 outputs")
    figures.set_defaults(func=run_figures)

    model = kinds.add_parser("model-figures", help="Fig. 5 (accuracy vs N) and the divergence figure of one model")
    _study_arguments(model)
    model.add_argument("--model", required=True, help="the model to draw")
    model.add_argument("--accuracy-vs-n", nargs="+", required=True, help="Fig. 5 outputs (.png, .pdf)")
    model.add_argument("--divergence", nargs="+", required=True, help="divergence figure outputs")
    model.set_defaults(func=run_model_figures)


def _load(args: argparse.Namespace, caches=(), n_cal=None, dataset_sources=()):
    from ladbench.report.study import load_study, parse_assignments

    return load_study(
        models=args.models, benchmarks=args.benchmarks, variants=parse_assignments(args.variants, "--variants"),
        evaluations=args.evaluations, analyses=args.analyses, caches=caches, n_cal=n_cal,
        dataset_sources=parse_assignments(dataset_sources, "--dataset-sources"),
    )


def run_tables(args: argparse.Namespace) -> None:
    from ladbench.report.render import write_tables
    from ladbench.report.tables import build_tables

    study = _load(args, args.caches, args.n_cal, args.dataset_sources)
    tables = [(table, [Path(args.out_dir) / f"{name}.{fmt}" for fmt in args.formats])
              for name, table in build_tables(study).items()]
    write_tables(tables)                       # every file replaced as one set
    for _, outputs in tables:
        print(f"wrote {', '.join(map(str, outputs))}")


def run_confusion(args: argparse.Namespace) -> None:
    from ladbench.report.figures import confusion_figure, save_figure

    from ladbench.records import evaluation_predictions

    predictions = evaluation_predictions(Path(args.predictions).with_suffix(".json"))
    kind = str(predictions.pop("model_kind", ""))
    save_figure(confusion_figure(predictions, args.methods, title_with_kind(args.title, kind)), args.out)
    print("wrote " + ", ".join(args.out))


def run_figures(args: argparse.Namespace) -> None:
    from ladbench.report.figures import (
        attention_vs_scores_figure,
        calibration_sweeps_figure,
        save_figures,
        score_profile_figure,
    )
    from ladbench.records import analysis_arrays, read_analysis

    analysis = read_analysis(args.analysis)
    arrays = analysis_arrays(args.analysis, analysis)
    kind = analysis.get("model_kind")
    prefix = f"{args.title}: " if args.title else ""
    save_figures([
        (score_profile_figure(arrays, title=title_with_kind(f"{prefix}candidate probabilities per ground-truth position", kind)),
         args.profile),
        (attention_vs_scores_figure(arrays, title=title_with_kind(f"{prefix}attention evidence vs scores per position", kind)),
         args.attention),
        (calibration_sweeps_figure(analysis, title=title_with_kind(f"{prefix}accuracy vs |D_cal| and vs τ", kind)), args.sweeps)])
    print("wrote " + ", ".join(args.profile + args.attention + args.sweeps))


def run_model_figures(args: argparse.Namespace) -> None:
    from ladbench.report.figures import accuracy_vs_n_figure, divergence_figure, save_figures
    from ladbench.records import analysis_arrays
    from ladbench.report.study import accuracy_by_n

    study = _load(args)
    if args.model not in study.models:
        raise ValueError(f"--model {args.model!r} is not one of --models {study.models}")
    kind = study.model_kinds().get(args.model)
    accuracy = accuracy_vs_n_figure(accuracy_by_n(study, args.model), title=title_with_kind(f"{args.model}: accuracy versus N", kind))
    entries = []
    for (model, benchmark, variant), analysis in study.analyses.items():   # keyed by what each file records
        if model == args.model and benchmark in study.benchmarks:
            arrays = analysis_arrays(study.analysis_files[(model, benchmark, variant)], analysis)
            entries.append((study.setting_label(benchmark), arrays, analysis["divergence"]))
    save_figures([(accuracy, args.accuracy_vs_n),
                  (divergence_figure(entries, title=title_with_kind(f"{args.model}: do logits and attention follow the image?", kind)),
                   args.divergence)])
    print("wrote " + ", ".join(args.accuracy_vs_n + args.divergence))
