"""Command-line options shared by the stages that run methods on a cache (evaluate, analyze)."""

from __future__ import annotations

import argparse

from ladbench.config import parse_layer_range
from ladbench.methods import LadSettings


def add_lad_arguments(group) -> None:
    """LAD's test-time settings (``lad.*`` and ``models.*.layer_range`` in the config)."""
    group.add_argument("--layer-range", default="21:35",
                       help="layer search range: all (the paper) or first:last, 0-based inclusive, clipped to "
                       "the model's last layer (default 21:35, the reference's)")
    group.add_argument("--top-k", type=int, default=2, help="K: layers kept by attention strength")
    group.add_argument("--tau", type=float, default=5.0, help="sharpening temperature")
    group.add_argument("--layer-mean", choices=["reference", "paper"], default="reference",
                       help="purified attention: log of the layer mean (reference) or mean of logs (paper, Eqs. 10-11)")
    group.add_argument("--mixture", choices=["reference", "paper"], default="reference",
                       help="expected bias: mix B's rows in log space (reference) or probability space (paper, Eq. 13)")


def add_bootstrap_arguments(group, default_resamples: int) -> None:
    group.add_argument("--bootstrap", type=int, default=default_resamples,
                       help="bootstrap resamples over instances (0: no intervals)")
    group.add_argument("--ci", type=float, default=0.95, help="confidence level")
    group.add_argument("--seed", type=int, default=0, help="bootstrap seed")


def lad_settings(args: argparse.Namespace) -> LadSettings:
    return LadSettings(
        top_k=args.top_k, tau=args.tau, layer_range=parse_layer_range(args.layer_range),
        layer_mean=args.layer_mean, mixture=args.mixture,
    )
