"""Planted-bias simulator: cache-shaped arrays with a known position bias, visual gain and
attention signal (pure numpy). Used by the tests and by ``benchmarks/bench_methods.py``.

Model of one forward pass (a row) showing identities ``order[p]`` at positions ``p``,
with the ground truth (identity ``g``) at position ``t``:

- scores:    ``s_p = relevance[order[p]] + bias[t, p] + row_noise * e_p``, where
  ``relevance[id] = gain * [id == g] + identity_noise * z_id`` is fixed per instance
  (how much each image matches the caption, whatever its position) and ``bias[t, p]``
  is the planted conditional position bias (it may depend on the target position ``t``);
- attention: per layer ``l``, ``a_p^(l) = strength_l * exp(position_prior[p] +
  contrast_l * [order[p] == f] + attn_noise * e'_p) / sum_q exp(position_prior[q])``:
  a positional pattern (e.g. recency) times a content signal on the "favoured" identity
  ``f``, which is the ground truth with probability ``attn_accuracy`` and a uniformly
  drawn distractor otherwise (fixed per instance, so attention is order-robust).
  Only the informative layers carry the content signal (``contrast_l > 0``), and they
  are the strongest, so the top-K layer selection finds them.

Because the content term is not renormalised per row, the calibration mean of the
attention is exactly proportional to ``exp(position_prior)`` in expectation, so the
purified attention's argmax is the favoured identity and the purified readout's accuracy
is ``attn_accuracy`` (up to the attention noise).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

__all__ = [
    "SimulatedCache",
    "SimulationSpec",
    "conditional_bias",
    "simulate_cache",
    "static_bias",
]


def conditional_bias(n: int, strength: float) -> np.ndarray:
    """A bias that depends on the target position: the position right after the target
    (cyclically) gets ``+strength``. Every column holds ``strength`` once, so the
    marginal (column mean) bias is uniform: nothing for PriDe to remove."""
    bias = np.zeros((n, n))
    bias[np.arange(n), (np.arange(n) + 1) % n] = strength
    return bias


def static_bias(values: np.ndarray) -> np.ndarray:
    """A bias that does not depend on the target position: ``bias[t, p] = values[p]``."""
    values = np.asarray(values, dtype=np.float64)
    return np.tile(values, (values.size, 1))


@dataclass(frozen=True)
class SimulationSpec:
    """Parameters of the planted model (see the module docstring)."""

    n_eval: int = 400
    n_orderings: int = 5
    n_cal_pool: int = 100
    n: int = 4
    n_layers: int = 8
    bias: np.ndarray | None = None  # [N, N]; None = no bias
    gain: float = 3.0
    identity_noise: float = 0.7
    row_noise: float = 0.3
    attn_accuracy: float = 0.9
    attn_contrast: float = 3.0
    attn_recency: float = 4.0  # position_prior[p] = attn_recency * p / (N - 1)
    informative_layers: tuple[int, ...] = (5, 6)
    informative_strength: float = 1.0
    other_strength: float = 0.3
    attn_noise: float = 0.2
    seed: int = 0


@dataclass(frozen=True)
class SimulatedCache:
    """Evaluation and calibration arrays shaped like an inference cache, plus the truth."""

    scores: np.ndarray  # [I, T, N]
    attn: np.ndarray  # [I, T, Lyr, N]
    target_pos: np.ndarray  # [I, T]
    order: np.ndarray  # [I, T, N]
    cal_scores: np.ndarray  # [C, N, N]
    cal_attn: np.ndarray  # [C, N, Lyr, N]
    cal_target_pos: np.ndarray  # [C, N]
    target_identity: np.ndarray  # [I]
    favoured_identity: np.ndarray  # [I] identity the attention's content signal points at
    relevance: np.ndarray  # [I, N] per identity
    spec: SimulationSpec = field(repr=False, default_factory=SimulationSpec)

    @property
    def oracle_pred(self) -> np.ndarray:
        """Unbiased predictions [I, T]: the position of the most relevant identity."""
        best = self.relevance.argmax(axis=1)
        return np.argmax(self.order == best[:, None, None], axis=-1)

    @property
    def attention_pred(self) -> np.ndarray:
        """Positions [I, T] of the favoured identity: an ideal attention readout."""
        return np.argmax(self.order == self.favoured_identity[:, None, None], axis=-1)


def _instances(n_instances: int, spec: SimulationSpec, rng: np.random.Generator):
    """Per instance: target identity, relevance per identity, favoured identity."""
    n = spec.n
    target = rng.integers(0, n, n_instances)
    relevance = spec.identity_noise * rng.standard_normal((n_instances, n))
    relevance[np.arange(n_instances), target] += spec.gain
    attention_right = rng.random(n_instances) < spec.attn_accuracy
    # a uniformly drawn distractor: target + 1..N-1 (mod N)
    distractor = (target + rng.integers(1, n, n_instances)) % n
    favoured = np.where(attention_right, target, distractor)
    return target, relevance, favoured


def _render(order, target, relevance, favoured, spec: SimulationSpec, rng: np.random.Generator):
    """Scores [I, R, N], attention [I, R, Lyr, N] and target positions [I, R] for orders [I, R, N]."""
    n_instances, n_rows, n = order.shape
    bias = np.zeros((n, n)) if spec.bias is None else np.asarray(spec.bias, dtype=np.float64)
    if bias.shape != (n, n):
        raise ValueError(f"bias must be [{n}, {n}], got {bias.shape}")
    target_pos = np.argmax(order == target[:, None, None], axis=-1)
    shown_relevance = np.take_along_axis(relevance[:, None, :].repeat(n_rows, 1), order, axis=-1)
    scores = shown_relevance + bias[target_pos] + spec.row_noise * rng.standard_normal(order.shape)

    position_prior = spec.attn_recency * np.arange(n) / max(n - 1, 1)
    strength = np.full(spec.n_layers, spec.other_strength)
    contrast = np.zeros(spec.n_layers)
    strength[list(spec.informative_layers)] = spec.informative_strength
    contrast[list(spec.informative_layers)] = spec.attn_contrast
    favoured_shown = (order == favoured[:, None, None]).astype(np.float64)  # [I, R, N]
    log_attn = (
        position_prior
        + contrast[:, None] * favoured_shown[:, :, None, :]
        + spec.attn_noise * rng.standard_normal((n_instances, n_rows, spec.n_layers, n))
    )
    attn = strength[:, None] * np.exp(log_attn) / np.exp(position_prior).sum()
    return scores, attn, target_pos


def simulate_cache(spec: SimulationSpec | None = None, **overrides) -> SimulatedCache:
    """Draw a simulated cache; keyword arguments override fields of ``spec``."""
    spec = replace(spec or SimulationSpec(), **overrides)
    if any(not 0 <= layer < spec.n_layers for layer in spec.informative_layers):
        raise ValueError(f"informative_layers {spec.informative_layers} outside 0..{spec.n_layers - 1}")
    rng = np.random.default_rng(spec.seed)
    n = spec.n

    # Evaluation: ordering 0 is the identity, the others random permutations.
    target, relevance, favoured = _instances(spec.n_eval, spec, rng)
    order = np.empty((spec.n_eval, spec.n_orderings, n), dtype=np.int64)
    order[:, 0] = np.arange(n)
    if spec.n_orderings > 1:
        order[:, 1:] = np.argsort(rng.random((spec.n_eval, spec.n_orderings - 1, n)), axis=-1)
    scores, attn, target_pos = _render(order, target, relevance, favoured, spec, rng)

    # Calibration pool: every instance under its N cyclic left-shifts (formats.md §3).
    cal_target, cal_relevance, cal_favoured = _instances(spec.n_cal_pool, spec, rng)
    shifts = (np.arange(n)[None, :] + np.arange(n)[:, None]) % n  # shifts[s, p] = (p + s) % N
    cal_order = np.broadcast_to(shifts, (spec.n_cal_pool, n, n)).copy()
    cal_scores, cal_attn, cal_target_pos = _render(cal_order, cal_target, cal_relevance, cal_favoured, spec, rng)

    return SimulatedCache(
        scores=scores, attn=attn, target_pos=target_pos, order=order,
        cal_scores=cal_scores, cal_attn=cal_attn, cal_target_pos=cal_target_pos,
        target_identity=target, favoured_identity=favoured, relevance=relevance, spec=spec,
    )
