"""Stage `report`: tables and figures from evaluation outputs only (no model, no calibration)."""

from __future__ import annotations

import argparse

import numpy as np

from ladbench.atomic import atomic_write_text


def register(subparsers) -> None:
    parser = subparsers.add_parser("report", help="tables and figures from evaluation outputs")
    kinds = parser.add_subparsers(dest="kind", metavar="<kind>", required=True)

    table = kinds.add_parser("table", help="Table 1 layout (Markdown)")
    table.add_argument(
        "--evaluations", nargs="+", required=True,
        help="evaluation files laid out as .../{model}/{benchmark}/{variant}/cal-{benchmark}.json",
    )
    table.add_argument("--models", nargs="+", required=True)
    table.add_argument("--benchmarks", nargs="+", required=True)
    table.add_argument("--variant", default="vanilla")
    table.add_argument("--out", required=True, help="output .md")
    table.set_defaults(func=run_table)

    confusion = kinds.add_parser("confusion", help="position confusion matrices, Vanilla vs LAD")
    confusion.add_argument("--predictions", required=True, help="evaluation .npz")
    confusion.add_argument("--methods", nargs="+", default=["vanilla", "lad"])
    confusion.add_argument("--out", nargs="+", required=True, help="output figure files (.png, .pdf)")
    confusion.set_defaults(func=run_confusion)


def run_table(args: argparse.Namespace) -> None:
    from ladbench.report.tables import table1_markdown

    atomic_write_text(args.out, table1_markdown(args.evaluations, args.models, args.benchmarks, args.variant))
    print(f"wrote {args.out}")


def run_confusion(args: argparse.Namespace) -> None:
    from ladbench.report.figures import confusion_figure, save_figure

    with np.load(args.predictions) as data:
        predictions = dict(data)
    save_figure(confusion_figure(predictions, args.methods), args.out)
    print("wrote " + ", ".join(args.out))
