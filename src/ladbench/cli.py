"""``ladbench``: one subcommand per workflow stage.

The Snakemake rules call these subcommands, so every stage can also be run by hand:
``ladbench <subcommand> --help`` lists its flags. A stage module is imported only when
its subcommand runs, so light stages (calibrate, evaluate, report) never import torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

# subcommand -> module whose register(subparsers) defines it
SUBCOMMANDS = {
    "download": "ladbench.data.download",
    "demo-scenes": "ladbench.data.synthetic",
    "captions": "ladbench.data.coco",
    "flickr8k-to-coco": "ladbench.data.coco",
    "demo-clip": "ladbench.features",
    "features": "ladbench.features",
    "benchmark": "ladbench.benchmark",
    "demo-model": "ladbench.models.tiny",
    "infer": "ladbench.inference.runner",
    "merge-shards": "ladbench.stages.merge_shards",
    "plan": "ladbench.stages.plan",
    "calibrate": "ladbench.stages.calibrate",
    "evaluate": "ladbench.stages.evaluate",
    "analyze": "ladbench.stages.analyze",
    "report": "ladbench.report.cli",
}


def _register_where(subparsers) -> None:
    parser = subparsers.add_parser(
        "where", help="validate a study config and print where its tables and figures are"
    )
    parser.add_argument("--configfile", default="config.yaml", help="study config (YAML)")
    parser.set_defaults(func=_where)


def _where(args: argparse.Namespace) -> None:
    from ladbench.config import load_config

    config = load_config(args.configfile)
    report = Path(config["output_dir"]) / "report"
    print(f"Config {args.configfile} is valid.")
    print(f"Tables (Markdown; also .csv, .tex, .html beside them): {report}/")
    for table in sorted(report.glob("*.md")):
        print(f"  {table}")
    figures = sorted(report.glob("figures/*.png"))
    print(f"Figures (PNG and PDF): {report}/figures/ ({len(figures)} figures)")
    for figure in figures:
        print(f"  {figure}")
    if all(model["tiny"] for model in config["models"].values()):
        print("These come from tiny random models: they show the pipeline's mechanics, not results.")
    print("One HTML report with every table and figure: snakemake --report report.html "
          f"--configfile {args.configfile}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; with ``only``, import just the module defining that subcommand."""
    parser = argparse.ArgumentParser(
        prog="ladbench",
        description="Position bias in multimodal LLMs for multi-image retrieval, and LAD debiasing.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="<subcommand>", required=True)
    _register_where(subparsers)
    modules = [SUBCOMMANDS[only]] if only in SUBCOMMANDS else sorted(set(SUBCOMMANDS.values()))
    for name in modules:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as error:
        # Bad input: one clear line naming the file or key; LADBENCH_DEBUG=1 shows the traceback.
        if os.environ.get("LADBENCH_DEBUG"):
            raise
        print(f"ladbench {args.command}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
