"""The paper's figures from evaluation predictions (docs/formats.md §6) and analysis files (§8).

Every figure uses the Okabe-Ito colour-blind-safe palette (viridis for heat maps), labels
both axes in words, and is written as PNG and/or PDF by :func:`save_figure`.

- :func:`confusion_figure`            Fig. 1 / 8: position confusion matrices, Vanilla vs LAD
- :func:`score_profile_figure`        Fig. 2: candidate probabilities per ground-truth position
- :func:`attention_vs_scores_figure`  Fig. 3: attention evidence vs scores per position
- :func:`accuracy_vs_n_figure`        Fig. 5: accuracy vs N
- :func:`calibration_sweeps_figure`   Fig. 6: accuracy vs |D_cal| and vs tau
- :func:`divergence_figure`           order robustness of logits vs attention (METHOD §9)
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ladbench.atomic import replacing_together  # noqa: E402
from ladbench.methods import METHODS  # noqa: E402
from ladbench.metrics import confusion_matrix  # noqa: E402
from ladbench.report.study import SETTING_NAMES  # noqa: E402
from ladbench.report.tables import DISPLAY_NAMES  # noqa: E402

__all__ = [
    "SIGNAL_COLORS",
    "method_colors",
    "method_markers",
    "OKABE_ITO",
    "accuracy_vs_n_figure",
    "attention_vs_scores_figure",
    "calibration_sweeps_figure",
    "confusion_figure",
    "divergence_figure",
    "save_figure",
    "score_profile_figure",
]

# Okabe & Ito (2008), distinguishable with every common colour-vision deficiency.
OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky_blue": "#56B4E9", "green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7",
}
# The signals' colours; a method's own are its registration's (Method.color, Method.marker).
SIGNAL_COLORS = {"probability": OKABE_ITO["vermillion"], "attention_share": OKABE_ITO["sky_blue"],
                 "purified_share": OKABE_ITO["green"], "logits": OKABE_ITO["vermillion"]}


def method_colors() -> dict[str, str]:
    """Each method's colour (those that declared one) and each signal's."""
    return {**{name: OKABE_ITO[m.color] for name, m in METHODS.items() if m.color}, **SIGNAL_COLORS}


def method_markers() -> dict[str, str]:
    """Different markers too, so the lines stay apart in greyscale print."""
    return {name: m.marker for name, m in METHODS.items() if m.marker}


plt.rcParams.update({"font.size": 10, "axes.titlesize": 10, "axes.labelsize": 10, "legend.fontsize": 9,
                     "axes.spines.top": False, "axes.spines.right": False})


def _name(method: str) -> str:
    return METHODS[method].label if method in METHODS else DISPLAY_NAMES.get(method, method)


def _positions(n: int) -> list[str]:
    return [str(i + 1) for i in range(n)]


def _label_position_panel(ax, position: int, n_rows: int, n: int, ylabel: str) -> None:
    """Axes of one per-ground-truth-position panel (Figs. 2 and 3): shares in [0, 1] per candidate position."""
    ax.set_title(f"ground truth at {position + 1} ({n_rows} rows)")
    ax.set_xticks(np.arange(n), _positions(n))
    ax.set_ylim(0, 1)
    ax.set_xlabel("candidate position")
    ax.set_ylabel(ylabel)


def _grid(n_panels: int, max_columns: int = 4, width: float = 3.0, height: float = 2.7):
    columns = min(n_panels, max_columns)
    rows = int(np.ceil(n_panels / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns + 0.6, height * rows + 0.6), squeeze=False)
    for ax in axes.ravel()[n_panels:]:
        ax.set_visible(False)
    return fig, axes.ravel()[:n_panels]


# --------------------------------------------------------------------------- Fig. 1 / 8


def confusion_figure(predictions: Mapping[str, np.ndarray], methods: Sequence[str] = ("vanilla", "lad"), title: str = ""):
    """Position confusion matrices (ground-truth position x predicted position), row-normalised,
    one panel per method (Fig. 1 / Fig. 8). Methods absent from ``predictions`` are skipped."""
    target = predictions["target_pos"]
    n = predictions["order"].shape[-1]
    shown = [m for m in methods if f"pred_{m}" in predictions]
    if not shown:
        raise ValueError(f"none of the methods {list(methods)} has predictions (pred_<method>) in the file")
    fig, axes = plt.subplots(1, len(shown), figsize=(3.6 * len(shown) + 0.8, 3.4), squeeze=False)
    image = None
    for ax, method in zip(axes[0], shown):
        prediction = predictions[f"pred_{method}"]
        counts = confusion_matrix(prediction, target, n)
        rates = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
        image = ax.imshow(rates, vmin=0, vmax=1, cmap="viridis")
        accuracy = 100.0 * np.mean(prediction == target)
        ax.set_title(f"{_name(method)} (Acc {accuracy:.1f}%)")
        ax.set_xlabel("predicted position")
        ax.set_ylabel("ground-truth position")
        ax.set_xticks(range(n), _positions(n))
        ax.set_yticks(range(n), _positions(n))
        if n <= 8:
            for i in range(n):
                for j in range(n):
                    ax.text(j, i, f"{rates[i, j]:.2f}", ha="center", va="center", fontsize=8,
                            color="black" if rates[i, j] > 0.6 else "white")
    fig.colorbar(image, ax=axes[0].tolist(), label="fraction of the row")
    if title:
        fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------- Fig. 2 and 3


def score_profile_figure(arrays: Mapping[str, np.ndarray], max_lines: int = 30, title: str = ""):
    """Fig. 2: for each ground-truth position, the candidate probabilities (softmax of the
    scores) of individual rows (thin lines, at most ``max_lines``) and their mean (bold).

    ``arrays`` is an analysis ``.npz``: ``probability`` [I, T, N], ``target_pos`` [I, T].
    A position-biased model has similar curves whatever the ground truth.
    """
    probability, target = np.asarray(arrays["probability"]), np.asarray(arrays["target_pos"])
    n = probability.shape[-1]
    rows, targets = probability.reshape(-1, n), target.reshape(-1)
    fig, axes = _grid(n)
    x = np.arange(n)
    rng = np.random.default_rng(0)  # a fixed sample of rows, so the figure is reproducible
    for position, ax in enumerate(axes):
        members = rows[targets == position]
        ax.axvspan(position - 0.4, position + 0.4, color=OKABE_ITO["yellow"], alpha=0.35, lw=0,
                   label="ground truth")
        if len(members):
            sample = members[rng.permutation(len(members))[:max_lines]]
            for row in sample:
                ax.plot(x, row, color=method_colors()["probability"], alpha=0.18, lw=0.8)
            ax.plot(x, members.mean(axis=0), color=OKABE_ITO["black"], lw=2.2, marker="o", label="mean")
        _label_position_panel(ax, position, len(members), n, "P(candidate) from the scores")
    axes[0].legend(loc="upper right", frameon=False)
    fig.suptitle(title or "Candidate probabilities per ground-truth position (thin: individual rows)")
    fig.tight_layout()
    return fig


def attention_vs_scores_figure(arrays: Mapping[str, np.ndarray], title: str = ""):
    """Fig. 3: per ground-truth position, the mean share each position gets from the scores
    (softmax), from the raw attention evidence and from the purified attention (bars with
    ± one std). Attention that follows the content peaks at the ground truth."""
    signals = ("probability", "attention_share", "purified_share")
    labels = {"probability": "scores (softmax)", "attention_share": "raw attention share",
              "purified_share": "purified attention"}
    target = np.asarray(arrays["target_pos"]).reshape(-1)
    n = np.asarray(arrays["probability"]).shape[-1]
    fig, axes = _grid(n)
    x = np.arange(n)
    width = 0.27
    for position, ax in enumerate(axes):
        mask = target == position
        ax.axvspan(position - 0.45, position + 0.45, color=OKABE_ITO["yellow"], alpha=0.35, lw=0)
        for offset, signal in zip((-width, 0.0, width), signals):
            values = np.asarray(arrays[signal]).reshape(-1, n)[mask]
            if not len(values):
                continue
            std = values.std(axis=0, ddof=1) if len(values) > 1 else None
            ax.bar(x + offset, values.mean(axis=0), width, yerr=std, capsize=2, color=method_colors()[signal],
                   label=labels[signal], error_kw={"lw": 0.8})
        _label_position_panel(ax, position, int(mask.sum()), n, "share per position")
    axes[0].legend(loc="upper right", frameon=False)
    fig.suptitle(title or "Attention evidence versus scores per position (highlight: ground truth)")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- Fig. 5


def accuracy_vs_n_figure(
    accuracy: Mapping[tuple[str, str], Mapping[str, Mapping[int, dict]]],
    methods: Sequence[str] = ("vanilla", "pride", "lad"),
    title: str = "",
):
    """Fig. 5: accuracy versus the number of candidates N, one panel per dataset and setting.

    ``accuracy[(dataset, setting)][method][n]`` is an evaluation metrics dict (acc_mean and
    its interval); the error bars are the 95% bootstrap intervals.
    """
    panels = list(accuracy)
    if not panels:
        raise ValueError("accuracy_vs_n_figure: no evaluation to plot")
    fig, axes = _grid(len(panels), max_columns=2, width=3.8, height=3.0)
    for ax, (dataset, setting) in zip(axes, panels):
        sizes = set()
        for index, method in enumerate(methods):
            points = accuracy[(dataset, setting)].get(method, {})
            if not points:
                continue
            ns = sorted(points)
            sizes.update(ns)
            mean = np.array([points[n]["acc_mean"] for n in ns])
            low = np.array([_or_nan(points[n].get("acc_mean_ci_low")) for n in ns])
            high = np.array([_or_nan(points[n].get("acc_mean_ci_high")) for n in ns])
            dodge = (index - (len(methods) - 1) / 2) * 0.12  # keeps overlapping error bars apart
            ax.errorbar(np.array(ns) + dodge, mean, yerr=np.nan_to_num(np.vstack([mean - low, high - mean])),
                        capsize=3, marker=method_markers().get(method, "o"), color=method_colors().get(method),
                        label=_name(method))
        if sizes:
            ns = np.array(sorted(sizes))
            ax.plot(ns, 100.0 / ns, color="grey", lw=0.8, ls=":", marker="_", label="chance (1/N)")
        ax.set_xticks(sorted(sizes))
        ax.set_xlim(min(sizes, default=2) - 0.8, max(sizes, default=12) + 0.8)
        ax.set_ylim(0, 100)
        ax.set_xlabel("number of candidate images N")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{dataset}, {SETTING_NAMES.get(setting, setting)}")
    axes[0].legend(frameon=False)
    fig.suptitle(title or "Accuracy versus N (bars: 95% bootstrap interval)")
    fig.tight_layout()
    return fig


def _or_nan(value) -> float:
    return float("nan") if value is None else float(value)


# --------------------------------------------------------------------------- Fig. 6


def _vanilla_accuracy(analysis: dict) -> float | None:
    for row in analysis.get("readouts", []):
        if row.get("method") == "vanilla" and row.get("metrics"):
            return row["metrics"]["acc_mean"]
    return None


def calibration_sweeps_figure(analysis: dict, title: str = ""):
    """Fig. 6: accuracy versus |D_cal| (mean ± std over calibration draws, dots: draws) and
    versus tau (LAD with its 95% bootstrap interval), Vanilla as the dashed reference."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.4))
    vanilla = _vanilla_accuracy(analysis)
    sweep = analysis.get("dcal_sweep", [])
    sizes = np.array([row["n_cal"] for row in sweep])
    for method in ("lad", "pride", "purified_attention"):
        spreads = [row["methods"].get(method) for row in sweep]
        if not sweep or any(s is None for s in spreads):
            continue
        mean = np.array([s["acc_mean"]["mean"] for s in spreads])
        std = np.array([s["acc_mean"]["std"] for s in spreads])
        color = method_colors()[method]
        left.plot(sizes, mean, marker=method_markers()[method], color=color, label=_name(method))
        left.fill_between(sizes, mean - std, mean + std, color=color, alpha=0.18, lw=0)
        for size, s in zip(sizes, spreads):
            left.scatter(np.full(len(s["acc_mean"]["values"]), size), s["acc_mean"]["values"], s=9, color=color, alpha=0.5)
    if len(sizes):
        left.set_xscale("log")
        left.set_xticks(sizes, [str(s) for s in sizes])
        left.minorticks_off()
    left.set_xlabel("calibration instances |D_cal|")
    left.set_ylabel("accuracy (%)")
    left.set_title("accuracy vs |D_cal| (band: ± std over draws)")

    rows = [r for r in analysis.get("tau_sweep", []) if r.get("metrics")]
    if rows:
        taus = np.array([r["tau"] for r in rows])
        mean = np.array([r["metrics"]["acc_mean"] for r in rows])
        low = np.array([_or_nan(r["metrics"].get("acc_mean_ci_low")) for r in rows])
        high = np.array([_or_nan(r["metrics"].get("acc_mean_ci_high")) for r in rows])
        right.plot(taus, mean, marker=method_markers()["lad"], color=method_colors()["lad"], label=_name("lad"))
        right.fill_between(taus, low, high, color=method_colors()["lad"], alpha=0.18, lw=0, label="95% interval")
        right.set_xticks(taus)
    right.set_xlabel("sharpening temperature τ")
    right.set_ylabel("accuracy (%)")
    right.set_title("accuracy vs τ")
    for ax in (left, right):
        if vanilla is not None:
            ax.axhline(vanilla, color=method_colors()["vanilla"], ls="--", lw=1, label="Vanilla")
        ax.set_ylim(0, 100)
        ax.legend(frameon=False, fontsize=8)
    fig.suptitle(title or "Sensitivity to the calibration size and to τ")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- divergence


def divergence_figure(entries: Sequence[tuple[str, Mapping[str, np.ndarray], dict]], title: str = ""):
    """Order robustness per instance: Spearman rho across orderings of the values each signal
    gives to each image, for logits, raw attention and purified attention, per benchmark.

    ``entries``: (label, analysis .npz arrays, analysis ``divergence`` section). Dots are
    instances; the black marker and bar are the mean and its 95% bootstrap interval.
    """
    if not entries:
        raise ValueError("divergence_figure: nothing to plot")
    signals = (("logits", "rho_logits", "raw", "logits"), ("raw attention", "rho_attention_raw", "raw", "attention"),
               ("purified attention", "rho_attention_purified", "purified", "attention"))
    colors = {"logits": method_colors()["logits"], "raw attention": method_colors()["raw_attention"],
              "purified attention": method_colors()["purified_attention"]}
    fig, ax = plt.subplots(figsize=(max(4.5, 2.4 * len(entries) + 1.5), 3.6))
    rng = np.random.default_rng(0)
    step = 0.27
    for g, (_label, arrays, summary) in enumerate(entries):
        for s, (name, key, kind, part) in enumerate(signals):
            x = g + (s - 1) * step
            rho = np.asarray(arrays[key], dtype=float)
            rho = rho[~np.isnan(rho)]
            ax.scatter(x + rng.uniform(-0.07, 0.07, rho.size), rho, s=8, alpha=0.45, color=colors[name],
                       label=name if g == 0 else None)
            stats = summary.get(kind, {}).get(part, {})
            if stats.get("mean") is not None:
                low, high = stats.get("ci_low"), stats.get("ci_high")
                err = None if low is None else [[stats["mean"] - low], [high - stats["mean"]]]
                ax.errorbar([x], [stats["mean"]], yerr=err, fmt="_", color="black", markersize=14, capsize=3, lw=1.4)
    ax.axhline(0, color="grey", lw=0.6)
    ax.set_xticks(range(len(entries)), [e[0] for e in entries])
    ax.set_ylim(-1.05, 1.05)
    ax.set_ylabel("Spearman ρ across orderings\n(per instance)")
    ax.set_xlabel("benchmark")
    ax.legend(frameon=False, loc="lower right", fontsize=8)
    ax.set_title(title or "Do logits and attention follow the image or its position?")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- files


def save_figure(fig, outputs: Sequence[str | Path]) -> None:
    """Write ``fig`` to every path (format from the suffix), then close it."""
    save_figures([(fig, outputs)])


def save_figures(figures: Sequence[tuple[object, Sequence[str | Path]]]) -> None:
    """Write each figure to its paths (format from the suffix), all files replaced as one set
    (a killed job never leaves old figures beside new ones), then close them. A PDF carries no
    creation date, so the same data give the same bytes (PNGs carry none already)."""
    files = [(fig, path) for fig, outputs in figures for path in outputs]
    try:
        with replacing_together([path for _, path in files]) as temporaries:
            for tmp, (fig, path) in zip(temporaries, files):
                fmt = Path(path).suffix[1:]
                metadata = {"CreationDate": None} if fmt == "pdf" else None
                fig.savefig(tmp, format=fmt, dpi=150, bbox_inches="tight", metadata=metadata)
    finally:
        for fig, _ in figures:
            plt.close(fig)

