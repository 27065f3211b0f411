"""Stage `infer`: run a model over a benchmark into a resumable HDF5 cache (docs/formats.md
§4); the work is in :mod:`ladbench.inference.runner`. Each prompt variant's own settings
become flags ``--<variant>-<field>`` (from the registry, :mod:`ladbench.variants`)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from ladbench.cli import output_file
from ladbench.inference import runner
from ladbench.families import FAMILIES
from ladbench.inference.runner import EXECUTION_GROUP, PROMPT_GROUP, InferenceSettings, run_inference
from ladbench.settings import setting_fields
from ladbench.stages.options import add_arguments, argument_section, from_args
from ladbench.variants import VARIANTS, variant, variant_names

log = logging.getLogger(runner.__name__)


def add_variant_arguments(parser: argparse.ArgumentParser) -> None:
    """``--<variant>-<field>`` for every setting of every variant (not given: the carrier's default)."""
    for entry in VARIANTS.values():
        if not any(True for _ in setting_fields(entry.settings)):
            continue
        group = parser.add_argument_group(f"{entry.label} (--prompt {entry.name}; config inference.prompt_settings."
                                          f"{entry.name})")
        add_arguments(group, entry.settings, prefix=f"{entry.name}_", unset=True)


def options_from_args(name: str, args: argparse.Namespace) -> Any:
    """The settings of variant ``name`` from the flags of :func:`add_variant_arguments`."""
    entry = variant(name)
    return entry.options({f.name: getattr(args, f"{name}_{f.name}", None) for f in setting_fields(entry.settings)})


def _settings_from_args(args: argparse.Namespace) -> InferenceSettings:
    return from_args(InferenceSettings, args, options=options_from_args(args.prompt, args))


def run(args: argparse.Namespace) -> None:
    from ladbench.config import remote_code_warning

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    warning = remote_code_warning(args.model_path, args.revision, args.trust_remote_code, "--revision")
    if warning:
        log.warning(warning)
    from ladbench.inference.devices import claim_for_device
    claim = claim_for_device(args.gpus, args.device)   # before torch initialises CUDA; held until exit
    print(run_inference(_settings_from_args(args)))
    del claim


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("infer", help="run a model over a benchmark into a resumable HDF5 cache",
                              description=runner.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("inputs and output")
    g.add_argument("--benchmark", required=True, help="benchmark JSON (docs/formats.md §3)")
    g.add_argument("--images", required=True, help="image table JSON (docs/formats.md §1)")
    g.add_argument("--out", required=True, type=output_file(".h5"), help="cache HDF5 to write or resume (docs/formats.md §4)")
    g = p.add_argument_group("model")
    g.add_argument("--model-name", required=True, help="short model name stored in the cache (e.g. qwen2_5_vl_3b)")
    g.add_argument("--family", default="auto", choices=FAMILIES,
                   help="model family (selects the adapter; default auto: derived from the model, current lane)")
    g.add_argument("--model-path", required=True, help="hub id or local folder of the model")
    g = p.add_argument_group(PROMPT_GROUP)
    g.add_argument("--prompt", default=InferenceSettings.prompt, choices=variant_names(),
                   help="prompt / cache variant (the registry ladbench.variants)")
    add_arguments(p, InferenceSettings)    # each field under its group: model, prompt and scoring, execution...
    add_variant_arguments(p)          # each variant's own settings: --sofa-sigma, --sc-samples, ...
    argument_section(p, EXECUTION_GROUP).add_argument(
        "--gpus", type=int, default=0,
        help="claim this many GPUs no other ladbench job on this machine holds and show CUDA only those (0: no claim; "
             "a CUDA_VISIBLE_DEVICES already set for the job is respected)")
    p.set_defaults(func=run)
