"""Figures from evaluation predictions (docs/formats.md §6)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ladbench.metrics import confusion_matrix  # noqa: E402
from ladbench.report.tables import DISPLAY_NAMES  # noqa: E402


def confusion_figure(predictions: dict, methods=("vanilla", "lad")):
    """Position confusion matrices (ground-truth position x predicted position), row-normalised,
    one panel per method, like the paper's Fig. 1 / Fig. 8."""
    target = predictions["target_pos"]
    n = predictions["order"].shape[-1]
    shown = [m for m in methods if f"pred_{m}" in predictions]
    fig, axes = plt.subplots(1, len(shown), figsize=(3.6 * len(shown) + 0.8, 3.4), squeeze=False)
    for ax, method in zip(axes[0], shown):
        counts = confusion_matrix(predictions[f"pred_{method}"], target, n)
        rates = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
        image = ax.imshow(rates, vmin=0, vmax=1, cmap="viridis")
        ax.set_title(DISPLAY_NAMES.get(method, method))
        ax.set_xlabel("predicted position")
        ax.set_ylabel("ground-truth position")
        ax.set_xticks(range(n), [str(i + 1) for i in range(n)])
        ax.set_yticks(range(n), [str(i + 1) for i in range(n)])
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{rates[i, j]:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if rates[i, j] > 0.6 else "white")
    fig.colorbar(image, ax=axes[0].tolist(), label="fraction of the row")
    return fig


def save_figure(fig, outputs: list[str]) -> None:
    for path in outputs:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
