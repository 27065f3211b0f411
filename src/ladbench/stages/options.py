"""Command-line options and the printed summary line shared by the stages that run methods
on a cache (evaluate, analyze)."""

from __future__ import annotations

import argparse

from ladbench.config import parse_layer_range
from ladbench.methods import K_BEYOND_RANGE, LAYER_TIES, LadSettings
from ladbench.metrics import ACC_STD_DDOF


def add_lad_arguments(group) -> None:
    """LAD's test-time settings (``lad.*`` and ``models.*.layer_range`` in the config)."""
    group.add_argument("--layer-range", default="21:35",
                       help="layer search range: all (the paper) or first:last, 0-based inclusive, clipped to "
                       "the model's last layer (default 21:35, the reference's), or first:last/of: layers "
                       "first..last of an of-layer decoder, scaled to the model's depth (a family default)")
    group.add_argument("--top-k", type=int, default=2, help="K: layers kept by attention strength")
    group.add_argument("--tau", type=float, default=5.0, help="sharpening temperature")
    group.add_argument("--layer-mean", choices=["reference", "paper"], default="reference",
                       help="purified attention: log of the layer mean (reference) or mean of logs (paper, Eqs. 10-11)")
    group.add_argument("--mixture", choices=["reference", "paper"], default="reference",
                       help="expected bias: mix B's rows in log space (reference) or probability space (paper, Eq. 13)")
    group.add_argument("--layer-ties", choices=LAYER_TIES, default=LAYER_TIES[0],
                       help="layers of equal strength: keep the highest index (the reference) or the lowest")
    group.add_argument("--k-beyond-range", choices=K_BEYOND_RANGE, default=K_BEYOND_RANGE[0],
                       help="K larger than the layer range: lower K to the range's size (the reference) or stop")


def add_bootstrap_arguments(group, default_resamples: int) -> None:
    group.add_argument("--bootstrap", type=int, default=default_resamples,
                       help="bootstrap resamples over instances (0: no intervals)")
    group.add_argument("--ci", type=float, default=0.95, help="confidence level")
    group.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    group.add_argument("--acc-ddof", type=int, choices=(0, 1), default=ACC_STD_DDOF,
                       help=f"delta degrees of freedom of Acc's std over the T orderings (default {ACC_STD_DDOF}, "
                       "the reference's sample std)")


def lad_settings(args: argparse.Namespace) -> LadSettings:
    return LadSettings(
        top_k=args.top_k, tau=args.tau, layer_range=parse_layer_range(args.layer_range),
        layer_mean=args.layer_mean, mixture=args.mixture, layer_ties=args.layer_ties,
        k_beyond_range=args.k_beyond_range,
    )


def metrics_line(label: str, summary: dict) -> str:
    """``vanilla: Acc 51.70 ± 1.38  RStd 36.27  Cons 6.61``; "–" for a metric that is undefined
    on this set (None: e.g. RStd when some position never holds the target)."""
    m = {key: "–" if summary.get(key) is None else f"{summary[key]:.2f}"
         for key in ("acc_mean", "acc_std", "rstd", "cons")}
    return f"{label:>20s}: Acc {m['acc_mean']} ± {m['acc_std']}  RStd {m['rstd']}  Cons {m['cons']}"
