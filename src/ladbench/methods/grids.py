"""The rows of the ablation tables and sweeps (Tables 4 and 7, Figure 6): each a
:class:`MethodRow`, a label, a registered method and the :class:`LadSettings` it runs with,
listed around a base setting."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np

from ladbench.methods.kernels import CalibrationLike, EvalArraysLike
from ladbench.methods.registry import METHODS, ablation_methods
from ladbench.methods.settings import LadSettings, MethodSettings

__all__ = ["MethodRow", "ablation_grid", "evaluate_rows", "paper_vs_reference_grid", "tau_sweep", "top_k_sweep"]


@dataclass(frozen=True)
class MethodRow:
    """One row of an ablation table: a label, a registered method and its settings."""

    label: str
    method: str
    settings: LadSettings

    def predict(self, arrays: EvalArraysLike, calibration: CalibrationLike) -> np.ndarray:
        return METHODS[self.method](arrays, calibration, MethodSettings(lad=self.settings))


def ablation_grid(b: LadSettings = LadSettings()) -> list[MethodRow]:
    """Table 4's rows (and Table 7's readouts) around the base settings ``b``.

    "All layers" averages every layer of the model (``layer_range=None``), as the paper
    describes it; the other rows keep ``b``'s layer range.
    """
    rows = [
        MethodRow("attn_readout_no_prior_K2", "raw_attention", replace(b, top_k=2, use_prior=False)),
        MethodRow("attn_readout_prior_K2", "purified_attention", replace(b, top_k=2, use_prior=True)),
        MethodRow("all_layers_prior", "lad", replace(b, all_layers=True, layer_range=None, use_prior=True)),
        MethodRow("dynamic_no_prior_K2", "lad", replace(b, top_k=2, use_prior=False)),
    ]
    rows += [MethodRow(f"dynamic_prior_K{k}", "lad", replace(b, top_k=k, use_prior=True)) for k in (1, 2, 4, 8)]
    return rows + [MethodRow(name, name, b) for name in ablation_methods()]     # declared by the registry


def tau_sweep(b: LadSettings = LadSettings(), taus: Iterable[float] = range(1, 10)) -> list[MethodRow]:
    """LAD at each sharpening temperature (Figure 6, right)."""
    return [MethodRow(f"lad_tau{tau:g}", "lad", replace(b, tau=float(tau))) for tau in taus]


def top_k_sweep(b: LadSettings = LadSettings(), ks: Iterable[int] = (1, 2, 4, 8)) -> list[MethodRow]:
    """LAD with each number of selected layers K."""
    return [MethodRow(f"lad_K{k}", "lad", replace(b, top_k=int(k))) for k in ks]


def paper_vs_reference_grid(b: LadSettings = LadSettings()) -> list[MethodRow]:
    """LAD under the four combinations of layer mean and mixture (reference vs paper).

    The third switch, how ``L`` is averaged, is a calibration setting (``fit_calibration``).
    """
    return [
        MethodRow(f"lad_layer-{mean}_mixture-{mix}", "lad", replace(b, layer_mean=mean, mixture=mix))
        for mean in ("reference", "paper")
        for mix in ("reference", "paper")
    ]


def evaluate_rows(
    arrays: EvalArraysLike, calibration: CalibrationLike, rows: Sequence[MethodRow]
) -> dict[str, np.ndarray]:
    """Predictions [I, T] per row label."""
    labels = [row.label for row in rows]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate row labels in {labels}")
    return {row.label: row.predict(arrays, calibration) for row in rows}
