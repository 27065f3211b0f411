"""Views of an inference cache's rows as the arrays the pure methods work on.

Rows are laid out as docs/formats.md §4 says: every evaluation instance x ordering
(instance-major), then every calibration instance x cyclic shift. These functions only
reshape; they check that the layout is complete so a partial cache fails loudly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

EVAL, CALIBRATION = 0, 1


@dataclass(frozen=True)
class EvalArrays:
    scores: np.ndarray  # [I, T, N] per physical position
    attn: np.ndarray  # [I, T, Lyr, N]
    target_pos: np.ndarray  # [I, T]
    order: np.ndarray  # [I, T, N] identity shown at each position


@dataclass(frozen=True)
class CalibrationArrays:
    scores: np.ndarray  # [C, N(shift), N]
    attn: np.ndarray  # [C, N(shift), Lyr, N]
    target_pos: np.ndarray  # [C, N(shift)]


def _grid(cache: Mapping[str, np.ndarray], split: int, source: str) -> tuple[np.ndarray, int, int]:
    """Row indices of one split as an [instances, per_instance] grid, checked complete."""
    rows = np.flatnonzero(np.asarray(cache["split"]) == split)
    if rows.size == 0:
        raise ValueError(f"{source}: no {'evaluation' if split == EVAL else 'calibration'} rows")
    instance = np.asarray(cache["instance"])[rows]
    position = np.asarray(cache["ordering"])[rows]
    n_inst, per = int(instance.max()) + 1, int(position.max()) + 1
    if rows.size != n_inst * per or np.any(instance != np.repeat(np.arange(n_inst), per)) or np.any(
        position != np.tile(np.arange(per), n_inst)
    ):
        raise ValueError(f"{source}: rows are not a complete instance x ordering grid (formats.md §4)")
    return rows, n_inst, per


def _take(cache, name, rows, n_inst, per):
    values = np.asarray(cache[name])[rows]
    return values.reshape(n_inst, per, *values.shape[1:])


def eval_arrays(cache: Mapping[str, np.ndarray], source: str = "cache") -> EvalArrays:
    rows, n_inst, per = _grid(cache, EVAL, source)
    return EvalArrays(*(_take(cache, k, rows, n_inst, per) for k in ("scores", "attn", "target_pos", "order")))


def calibration_arrays(cache: Mapping[str, np.ndarray], source: str = "cache") -> CalibrationArrays:
    rows, n_inst, per = _grid(cache, CALIBRATION, source)
    n = np.asarray(cache["scores"]).shape[1]
    if per != n:
        raise ValueError(f"{source}: {per} cyclic shifts per calibration instance, expected N = {n}")
    return CalibrationArrays(*(_take(cache, k, rows, n_inst, per) for k in ("scores", "attn", "target_pos")))
