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

# subcommand -> module whose register(subparsers) defines it: a thin module in
# ladbench.stages that parses the flags and calls the domain function
SUBCOMMANDS = {
    "download": "ladbench.stages.download",
    "demo-scenes": "ladbench.stages.demo_scenes",
    "captions": "ladbench.stages.captions",
    "flickr8k-to-coco": "ladbench.stages.flickr8k_to_coco",
    "demo-clip": "ladbench.stages.demo_clip",
    "features": "ladbench.stages.features",
    "benchmark": "ladbench.stages.benchmark",
    "demo-model": "ladbench.stages.demo_model",
    "models": "ladbench.stages.models",
    "train-organism": "ladbench.stages.train_organism",
    "infer": "ladbench.stages.infer",
    "merge-shards": "ladbench.stages.merge_shards",
    "plan": "ladbench.stages.plan",
    "calibrate": "ladbench.stages.calibrate",
    "evaluate": "ladbench.stages.evaluate",
    "analyze": "ladbench.stages.analyze",
    "report": "ladbench.stages.report",
    "explore": "ladbench.stages.explore",
    "explore-index": "ladbench.stages.explore",
}

#: Stages whose outputs must be the same bits on every x86-64 CPU: the demo's models built from
#: a seed (random weights, and the trained organism). Their torch runs on pinned CPU kernels
#: (ladbench.cpu_paths), set here, before anything imports torch.
PORTABLE_STAGES = ("demo-clip", "demo-model", "train-organism")


def output_file(*suffixes: str):
    """An argparse ``type`` for an output file: its name must end in one of ``suffixes``,
    the format the command writes. Anything else is refused before any work: the file would
    not be what its name says, and a file written beside it (``x.json`` -> ``x.npz``) could
    overwrite another output."""
    def check(text: str) -> str:
        if not text.endswith(suffixes):
            raise argparse.ArgumentTypeError(
                f"{text!r}: this command writes {' or '.join(suffixes)}; give a file name ending in it")
        return text
    return check


def _register_where(subparsers) -> None:
    parser = subparsers.add_parser(
        "where", help="validate a study config and print where its tables and figures are"
    )
    parser.add_argument("--configfile", default="config.yaml", help="study config (YAML)")
    parser.set_defaults(func=_where)


def _where(args: argparse.Namespace) -> None:
    from ladbench.config import check_environment, load_config, startup_warnings

    from ladbench.model_checks import check_models
    from ladbench.study_paths import StudyPaths

    config = load_config(args.configfile)
    check_environment(config, source=args.configfile)
    for warning in startup_warnings(config) + check_models(config, args.configfile, fetch=True):
        print(f"WARNING: {args.configfile}: {warning}", file=sys.stderr)
    report = Path(StudyPaths(config).report_dir)
    print(f"Config {args.configfile} is valid.")
    print(f"Tables (Markdown; also .csv, .tex, .html beside them): {report}/")
    for table in sorted(report.glob("*.md")):
        print(f"  {table}")
    figures = sorted(report.glob("figures/*.png"))
    print(f"Figures (PNG and PDF): {report}/figures/ ({len(figures)} figures)")
    for figure in figures:
        print(f"  {figure}")
    explorers = sorted(p for p in report.glob("explorer/*.html") if p.name != "index.html")
    print(f"Instance explorer ({len(explorers)} pages, open from disk): {report}/explorer/index.html")
    for name, model in config["models"].items():
        if model["tiny"] and "organism" in model:
            print(f"{name} is the trained model organism (docs/organism.md): a tiny model with a planted bias.")
        elif model["tiny"]:
            print(f"{name} is a tiny random model: its numbers show the pipeline's mechanics, not results.")
    print("One HTML report with every table and figure: snakemake --report report.html "
          f"--configfile {args.configfile}")


def one_line(error: BaseException) -> str:
    """The error's message on one line. An error raised in a DataLoader worker arrives
    re-raised with the worker's traceback in its message: its own last line is kept."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    if len(lines) > 1 and "Original Traceback" in str(error):
        return lines[-1].split(": ", 1)[-1]
    return " ".join(line.strip() for line in lines)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; with ``only``, import just the module defining that subcommand."""
    parser = argparse.ArgumentParser(
        prog="ladbench",
        description="Position bias in multimodal LLMs for multi-image retrieval, and LAD debiasing.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error instead of one line (also: LADBENCH_DEBUG=1)")
    subparsers = parser.add_subparsers(dest="command", metavar="<subcommand>", required=True)
    _register_where(subparsers)
    # in the workflow order of SUBCOMMANDS; a module defining several subcommands once
    modules = [SUBCOMMANDS[only]] if only in SUBCOMMANDS else list(dict.fromkeys(SUBCOMMANDS.values()))
    for name in modules:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> None:
    from ladbench.cpu_paths import pin_cpu_paths
    from ladbench.plugins import load_plugins

    argv = sys.argv[1:] if argv is None else argv
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    if command in PORTABLE_STAGES and not pin_cpu_paths():
        print(f"ladbench {command}: warning: torch was loaded before this call, so its CPU kernels are not pinned "
              "to the portable paths (ladbench.cpu_paths): these weights may differ in the last bits on another CPU",
              file=sys.stderr)
    try:
        load_plugins()          # installed ones and $LADBENCH_PLUGINS (set by the workflow from the config's plugins)
    except ValueError as error:
        print(f"ladbench: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    parser = build_parser(only=command)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError) as error:
        # A bad input file or value (ValueError, raised naming the file and the remedy) or a
        # file the system refuses (OSError: missing, permission, disk full): one line;
        # --debug or LADBENCH_DEBUG=1 shows the traceback.
        if args.debug or os.environ.get("LADBENCH_DEBUG"):
            raise
        print(f"ladbench {args.command}: error: {one_line(error)}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        # Ctrl-C: every output is written atomically or in resumable chunks, so what was
        # finished is on disk and a rerun goes on from there; no traceback.
        if args.debug or os.environ.get("LADBENCH_DEBUG"):
            raise
        print(f"ladbench {args.command}: interrupted (Ctrl-C); the work finished so far is kept, and a rerun goes on "
              "from it", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception as error:         # noqa: BLE001 (out of memory: the only other failure a user causes)
        if not is_out_of_memory(error) or args.debug or os.environ.get("LADBENCH_DEBUG"):
            raise
        print(f"ladbench {args.command}: error: out of memory ({one_line(error)[:200]}); a setting or an input is "
              "too large for this machine (smaller batches, fewer rows, a shorter input), or --debug shows where",
              file=sys.stderr)
        raise SystemExit(2) from None


def is_out_of_memory(error: BaseException) -> bool:
    """Python's MemoryError, or torch's (CPU or GPU) out-of-memory error, found by name so that
    torch need not be imported."""
    return isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or \
        "can't allocate memory" in str(error)


if __name__ == "__main__":
    main()
