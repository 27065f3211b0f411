"""The inference cache's rows as the arrays the pure methods take (``methods.EvalArraysLike``).

The reshaping and its layout checks live in :class:`ladbench.inference.cache.InferenceCache`;
this module only names the arrays the methods use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ladbench.inference.cache import InferenceCache


@dataclass(frozen=True)
class EvalArrays:
    scores: np.ndarray  # [I, T, N] per physical position (permavg: [I, T, N(shift), N])
    attn: np.ndarray  # [I, T, Lyr, N]
    target_pos: np.ndarray  # [I, T]
    order: np.ndarray  # [I, T, N] identity shown at each position
    parsed: np.ndarray | None = None  # [I, T] generative variants: parsed position, -1 unparsable
    greedy_text: np.ndarray | None = None  # [I, T] str: the two-token greedy reply (method vanilla_generate)


@dataclass(frozen=True)
class CalibrationArrays:
    scores: np.ndarray  # [C, N(shift), N]
    attn: np.ndarray  # [C, N(shift), Lyr, N]
    target_pos: np.ndarray  # [C, N(shift)]
    source: str = "pool"  # the benchmark's calibration_source: how |D_cal| instances are taken from the pool
    pride_original_logs: str = "floor"  # how the original PriDe's prior takes logs (a fit option, not cached)
    empty_positions: str = "error"  # a position without rows: error, or a row of zeros (a fit option, not cached)


def eval_arrays(cache: InferenceCache) -> EvalArrays:
    optional = {key: cache.eval_view(key) for key in ("parsed", "greedy_text") if key in cache}
    return EvalArrays(*(cache.eval_view(k) for k in ("scores", "attn", "target_pos", "order")), **optional)


def calibration_arrays(cache: InferenceCache) -> CalibrationArrays:
    return CalibrationArrays(*(cache.calibration_view(k) for k in ("scores", "attn", "target_pos")),
                             source=cache.attrs.get("calibration_source", "pool"))
