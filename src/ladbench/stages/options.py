"""Command-line options and the printed summary line shared by the stages that run methods
on a cache (evaluate, analyze). Every default is the settings dataclass's (:class:`LadSettings`,
:class:`Bootstrap`), which tests/test_config.py checks against the config schema's."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from ladbench.config import parse_layer_range
from ladbench.families import REFERENCE_LAYER_RANGE, default_layer_range
from ladbench.methods import K_BEYOND_RANGE, LAYER_TIES, LAYERS_BEYOND_DEPTH, REPLY_PARSES, LadSettings
from ladbench.metrics import ACC_STD_DDOF, BOOTSTRAP_RESAMPLES, EDGE_STATISTICS, MAX_BOOTSTRAP_RESAMPLES

_LAD = LadSettings()


@dataclass(frozen=True)
class Bootstrap:
    """Options of :func:`ladbench.metrics.summarize`: bootstrap resamples, level, seed, the
    ddof of Acc's std and what undefined statistics read (every table row and sweep uses the
    same ones)."""

    n_boot: int = BOOTSTRAP_RESAMPLES
    ci: float = 0.95
    seed: int = 0
    acc_ddof: int = ACC_STD_DDOF
    edge_statistics: str = EDGE_STATISTICS[0]

    def __post_init__(self) -> None:
        if not 0 <= self.n_boot <= MAX_BOOTSTRAP_RESAMPLES:
            raise ValueError(f"--bootstrap {self.n_boot}: give 0 to {MAX_BOOTSTRAP_RESAMPLES:,} resamples (each holds "
                             "a count per instance in memory)")
        if self.seed < 0:
            raise ValueError(f"--seed {self.seed}: a seed is a non-negative integer")
        if not 0 < self.ci < 1:
            raise ValueError(f"--ci {self.ci}: a confidence level is between 0 and 1")

    def kwargs(self) -> dict[str, Any]:
        return asdict(self)


def add_lad_arguments(group) -> None:
    """LAD's test-time settings (``lad.*`` and ``models.*.layer_range`` in the config)."""
    group.add_argument("--layer-range", default=None,
                       help="layer search range: all (the paper) or first:last, 0-based inclusive, clipped to "
                       "the model's last layer, or first:last/of: layers first..last of an of-layer decoder, "
                       "scaled to the model's depth (default: the cache's model family's, as in the config, "
                       "e.g. 21:35/36, the reference's)")
    group.add_argument("--top-k", type=int, default=_LAD.top_k, help="K: layers kept by attention strength")
    group.add_argument("--tau", type=float, default=_LAD.tau, help="sharpening temperature")
    group.add_argument("--layer-mean", choices=["reference", "paper"], default=_LAD.layer_mean,
                       help="purified attention: log of the layer mean (reference) or mean of logs (paper, Eqs. 10-11)")
    group.add_argument("--mixture", choices=["reference", "paper"], default=_LAD.mixture,
                       help="expected bias: mix B's rows in log space (reference) or probability space (paper, Eq. 13)")
    group.add_argument("--layer-ties", choices=LAYER_TIES, default=_LAD.layer_ties,
                       help="layers of equal strength: keep the highest index, the lowest, or the one numpy's "
                       "default argsort puts last (the reference's call; depends on numpy's build)")
    group.add_argument("--k-beyond-range", choices=K_BEYOND_RANGE, default=_LAD.k_beyond_range,
                       help="K larger than the layer range: lower K to the range's size (the reference) or stop")
    group.add_argument("--layers-beyond-depth", choices=LAYERS_BEYOND_DEPTH, default=_LAD.layers_beyond_depth,
                       help="a layer range past the model's last layer: clip it, or absent: the missing layers take "
                       "part with attention 0 and prior 0 (the reference's arithmetic)")
    group.add_argument("--reply-parse", choices=REPLY_PARSES, default=_LAD.reply_parse,
                       help="vanilla_generate: a digit run must spell an identifier (exact), or is read by int() "
                       "(the reference: leading zeros and any Unicode decimal digit count)")


def add_bootstrap_arguments(group) -> None:
    defaults = Bootstrap()
    group.add_argument("--bootstrap", type=int, default=defaults.n_boot,
                       help=f"bootstrap resamples over instances (0: no intervals; default {defaults.n_boot})")
    group.add_argument("--ci", type=float, default=defaults.ci, help="confidence level")
    group.add_argument("--seed", type=int, default=defaults.seed, help="bootstrap seed")
    group.add_argument("--acc-ddof", type=int, choices=(0, 1), default=defaults.acc_ddof,
                       help=f"delta degrees of freedom of Acc's std over the T orderings (default {defaults.acc_ddof}, "
                       "the reference's sample std)")
    group.add_argument("--edge-statistics", choices=EDGE_STATISTICS, default=defaults.edge_statistics,
                       help="undefined statistics (Acc's std at T = 1, RStd with a position never holding the ground "
                       "truth): null (undefined), or the reference's 0.0 and RStd over the positions seen")


def bootstrap_settings(args: argparse.Namespace) -> Bootstrap:
    return Bootstrap(args.bootstrap, args.ci, args.seed, args.acc_ddof, args.edge_statistics)


def lad_settings(args: argparse.Namespace, cache_attrs: Mapping[str, Any]) -> LadSettings:
    """The flags' settings; without --layer-range, the default of the cache's model family
    (the reference's range, scaled to the model's depth, where the cache records no family)."""
    family = cache_attrs.get("family")
    layer_range = (parse_layer_range(args.layer_range) if args.layer_range is not None
                   else default_layer_range(family) if family else REFERENCE_LAYER_RANGE)
    return LadSettings(
        top_k=args.top_k, tau=args.tau, layer_range=layer_range,
        layer_mean=args.layer_mean, mixture=args.mixture, layer_ties=args.layer_ties,
        k_beyond_range=args.k_beyond_range, layers_beyond_depth=args.layers_beyond_depth, reply_parse=args.reply_parse,
    )


def metrics_line(label: str, summary: dict) -> str:
    """``vanilla: Acc 51.70 ± 1.38  RStd 36.27  Cons 6.61``; "–" for a metric that is undefined
    on this set (None: e.g. RStd when some position never holds the target)."""
    m = {key: "–" if summary.get(key) is None else f"{summary[key]:.2f}"
         for key in ("acc_mean", "acc_std", "rstd", "cons")}
    return f"{label:>20s}: Acc {m['acc_mean']} ± {m['acc_std']}  RStd {m['rstd']}  Cons {m['cons']}"
