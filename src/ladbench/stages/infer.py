"""Stage `infer`: run a model over a benchmark into a resumable HDF5 cache (docs/formats.md
§4); the work is in :mod:`ladbench.inference.runner`. Each prompt variant's own settings
become flags ``--<variant>-<field>`` (from the registry, :mod:`ladbench.variants`)."""

from __future__ import annotations

import argparse
import logging
from dataclasses import fields
from typing import Any

from ladbench.cli import output_file
from ladbench.inference import runner
from ladbench.inference.prompts import IDENTIFIER_FORMATS
from ladbench.families import FAMILIES
from ladbench.inference.runner import GPU_WORKERS, InferenceSettings, run_inference
from ladbench.inference.scoring import SCORE_MODES
from ladbench.variants import VARIANTS, variant, variant_names

log = logging.getLogger(runner.__name__)


def add_variant_arguments(parser: argparse.ArgumentParser) -> None:
    """``--<variant>-<field>`` for every setting of every variant (default: the dataclass's)."""
    for entry in VARIANTS.values():
        settings = fields(entry.settings)
        if not settings:
            continue
        group = parser.add_argument_group(f"{entry.label} (--prompt {entry.name}; config inference.prompt_settings."
                                          f"{entry.name})")
        for f in settings:
            group.add_argument(f"--{entry.name}-{f.name}".replace("_", "-"), dest=f"{entry.name}_{f.name}",
                               type=type(f.default), default=None, help=f"{f.metadata.get('help', '')} ({f.default})")


def options_from_args(name: str, args: argparse.Namespace) -> Any:
    """The settings of variant ``name`` from the flags of :func:`add_variant_arguments`."""
    entry = variant(name)
    return entry.options({f.name: getattr(args, f"{name}_{f.name}", None) for f in fields(entry.settings)})


def _settings_from_args(args: argparse.Namespace) -> InferenceSettings:
    names = InferenceSettings.__dataclass_fields__
    return InferenceSettings(**{k: getattr(args, k) for k in names if k != "options" and hasattr(args, k)},
                             options=options_from_args(args.prompt, args))


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
    g.add_argument("--revision", default=None, help="hub revision (commit / tag) to pin")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="allow model code shipped with the checkpoint (needed by llava_ov15; only for trusted models)")
    g.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="weights dtype; auto = bfloat16 on GPU, float32 on CPU")
    g.add_argument("--device", default="auto", help="auto, cpu or cuda (GPU: weights placed with device_map=auto)")
    g = p.add_argument_group("prompt and scoring")
    g.add_argument("--prompt", default="vanilla", choices=variant_names(),
                   help="prompt / cache variant (the registry ladbench.variants)")
    g.add_argument("--variant-name", default=None,
                   help="the config's name of this cache variant, recorded in the cache (default: the prompt)")
    g.add_argument("--identifiers", default="digits", choices=IDENTIFIER_FORMATS, help="candidate identifier format")
    g.add_argument("--score-mode", default="reference", choices=SCORE_MODES,
                   help="reference: raw logits when every identifier is one token, else joint restricted "
                        "log-probs (published numbers); joint: always joint restricted log-probs")
    g.add_argument("--image-size", type=int, default=336, help="images are resized to this square, bicubic (336)")
    g.add_argument("--store-head-attention", action="store_true", help="also store per-head attention (attn_heads)")
    g.add_argument("--no-greedy-reply", dest="greedy_reply", action="store_false",
                   help="do not store the two greedy reply tokens and their text (the reference's Vanilla readout, "
                        "method vanilla_generate; costs one KV-cache continuation step per batch)")
    add_variant_arguments(p)          # each variant's own settings: --sofa-sigma, --sc-samples, ...
    g = p.add_argument_group("generation (generative variants)")
    g.add_argument("--seed", type=int, default=0,
                   help="self-consistency: sampling seed (each sample is keyed by the seed, its row and its "
                        "index: see inference/sampling.py)")
    g = p.add_argument_group("execution")
    g.add_argument("--gpus", type=int, default=0,
                   help="claim this many GPUs no other ladbench job on this machine holds and show CUDA only "
                        "those (0: no claim; a CUDA_VISIBLE_DEVICES already set for the job is respected)")
    g.add_argument("--batch-size", type=int, default=1,
                   help="rows per forward pass (left padded); halved on running out of GPU memory")
    g.add_argument("--workers", type=int, default=None,
                   help=f"DataLoader workers preparing batches (images, processor) ahead of the model; "
                        f"0 = inline; default: 0 on the CPU, up to {GPU_WORKERS} on a GPU")
    g.add_argument("--group-by-length", action="store_true",
                   help="sort the rows of each chunk by prompt length before batching (less padding)")
    g.add_argument("--vision-tower", default="batched", choices=("batched", "native"),
                   help="batched: all images of a batch through the vision tower together (Qwen2.5-VL-style "
                        "towers); native: transformers' own (for comparison)")
    g.add_argument("--chunk-size", type=int, default=InferenceSettings.chunk_size,
                   help="rows per write to the cache (the most a kill can lose)")
    g.add_argument("--shard-index", type=int, default=0, help="run only shard i (0-based) of --shard-count")
    g.add_argument("--shard-count", type=int, default=1,
                   help="split the rows into this many contiguous shards (each its own cache; "
                        "`ladbench merge-shards` joins them)")
    g.add_argument("--limit-rows", type=int, default=None,
                   help="debugging: process at most this many pending rows, leave the cache incomplete")
    p.set_defaults(func=run)
