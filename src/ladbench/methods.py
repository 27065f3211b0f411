"""Every logit- and attention-level method as a pure numpy function of cached arrays.

Shapes (docs/formats.md §4): ``scores`` [..., N] per physical position, ``attn``
[..., Lyr, N] (last-query attention mass per layer per image span). Any leading batch
shape works, e.g. [I, T, N] for an evaluation cache. Predictions are physical
positions (argmax over the last axis).

LAD (METHOD.md §5) is split into its steps so each can be switched between the
reference implementation's behaviour (the default; its numbers are the published
ones) and the paper's equations:

1. :func:`select_layers`      top-K layers by attention strength (Eqs. 8-9), in a layer range;
2. :func:`purified_attention` log pi~ (Eqs. 10-11), ``layer_mean="reference"|"paper"``;
3. :func:`sharpen`            pi = softmax(tau log pi~) (Eq. 12);
4. :func:`expected_bias`      prior_j from pi and B (Eq. 13), ``mixture="reference"|"paper"``;
5. :func:`lad`                s' = s - prior (Eq. 14).

:data:`METHODS` maps a method name to its :class:`Method` entry, a ``callable(arrays,
calibration, settings) -> predictions [I, T]`` that also says whether it needs a
calibration, its label and which prompt variant's cache it reads; :func:`ablation_grid`,
:func:`tau_sweep` and friends list the rows of Tables 4 and 7 and Figure 6 as
:class:`MethodRow` entries (a label, a method and its settings).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable, Iterable, Literal, Mapping, Protocol, Sequence

import numpy as np

from ladbench.calibration import EPS, log_softmax, pride_log
from ladbench.families import parse_layer_range, scale_layer_range

__all__ = [
    "METHODS",
    "LadSettings",
    "Method",
    "MethodRow",
    "ablation_grid",
    "check_compatible",
    "evaluate_rows",
    "expected_bias",
    "identity_indexed",
    "lad",
    "lad_scores",
    "layer_selection_mask",
    "method",
    "layer_strength",
    "paper_vs_reference_grid",
    "permutation_average",
    "predict",
    "predict_identity_under_orderings",
    "pride",
    "purified_attention",
    "raw_attention",
    "register_method",
    "select_layers",
    "selection_warnings",
    "sharpen",
    "tau_sweep",
    "top_k_sweep",
    "vanilla",
    "parse_reference_replies",
    "reply_parse_warnings",
    "with_absent_layers",
]

# Each switchable LAD step: the reference implementation (default) or the paper's equation.
Choice = Literal["reference", "paper"]
# Layer selection's small rules (the paper states neither). Default: among layers of equal
# strength the HIGHEST index is kept (what the reference's "last K of an ascending sort" does
# with a stable sort), and a K larger than the layer range is lowered to the range's size (the
# reference's rule). The alternatives: the lowest index, or "argsort": the reference's own
# call, numpy's default (unstable) argsort of the layers' mean attention, whose order among
# equal values depends on numpy's build (AVX-512 sorting networks); an error.
LAYER_TIES = ("highest", "lowest", "argsort")
K_BEYOND_RANGE = ("lower", "error")
# A layer range past the model's last layer (the reference's 21-35 on a 28-layer model): clip
# it (default), or "absent", the reference's arithmetic: the layers that do not exist take
# part with attention 0 and calibration prior 0 (log 1e-20), so a K beyond the layers that
# exist averages them in.
LAYERS_BEYOND_DEPTH = ("clip", "absent")
# How vanilla_generate reads a greedy reply: "exact", the last digit run that spells an
# identifier 1..N; "int", the reference's: int() of each run of decimal digits (leading
# zeros and any Unicode decimal digit count), the last value in 1..N.
REPLY_PARSES = ("exact", "int")


# --------------------------------------------------------------------------- inputs


class EvalArraysLike(Protocol):
    """What the registry needs from an evaluation cache (``ladbench.stages.arrays.EvalArrays``)."""

    scores: np.ndarray  # [I, T, N]
    attn: np.ndarray  # [I, T, Lyr, N]
    target_pos: np.ndarray  # [I, T]
    order: np.ndarray  # [I, T, N]


class CalibrationLike(Protocol):
    """What the methods need from a calibration (``ladbench.calibration.Calibration``)."""

    B: np.ndarray  # [N, N]
    attn_prior: np.ndarray  # [Lyr, N]
    pride_prior: np.ndarray  # [N]
    pride_original_prior: np.ndarray  # [N]


@dataclass(frozen=True)
class LadSettings:
    """Test-time settings of LAD and the attention readouts (defaults: the paper's)."""

    top_k: int = 2
    tau: float = 5.0
    # inclusive, 0-based; None = every layer; (first, last, of): layers first..last of an
    # of-layer decoder, scaled to the model's depth (a family default, ladbench.families)
    layer_range: tuple[int, ...] | None = None
    use_prior: bool = True  # False: the "no prior" ablation (no division by a_prior)
    all_layers: bool = False  # True: average every layer of layer_range instead of the top-K
    layer_mean: Choice = "reference"
    mixture: Choice = "reference"
    layer_ties: str = LAYER_TIES[0]
    k_beyond_range: str = K_BEYOND_RANGE[0]
    layers_beyond_depth: str = LAYERS_BEYOND_DEPTH[0]
    reply_parse: str = REPLY_PARSES[0]  # a readout's setting (vanilla_generate), carried with the methods'

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if not 0 < self.tau < math.inf:            # an infinite tau flattens every row: LAD predicts position 1
            raise ValueError(f"tau must be > 0 and finite, got {self.tau}")
        for name in ("layer_mean", "mixture"):
            if getattr(self, name) not in ("reference", "paper"):
                raise ValueError(f"{name} must be 'reference' or 'paper', got {getattr(self, name)!r}")
        for name, allowed in (("layer_ties", LAYER_TIES), ("k_beyond_range", K_BEYOND_RANGE),
                              ("layers_beyond_depth", LAYERS_BEYOND_DEPTH), ("reply_parse", REPLY_PARSES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        object.__setattr__(self, "layer_range", parse_layer_range(self.layer_range))

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any] | LadSettings | None) -> LadSettings:
        """Build from a settings dict; keys not used by the methods are ignored, types are checked."""
        if settings is None:
            return cls()
        if isinstance(settings, LadSettings):
            return settings
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in settings.items() if key in known})

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable view (layer_range as a list or None)."""
        out = asdict(self)
        out["layer_range"] = None if self.layer_range is None else list(self.layer_range)
        return out


def check_compatible(scores: np.ndarray, attn: np.ndarray | None, calibration: CalibrationLike) -> None:
    """Raise a clear error when a calibration does not fit a cache (e.g. a bad transfer)."""
    n = scores.shape[-1]
    if calibration.B.shape != (n, n):
        raise ValueError(
            f"calibration has N = {calibration.B.shape[0]} candidates but the cache has N = {n}; "
            "a calibration can only be transferred between benchmarks with the same N"
        )
    if attn is not None and calibration.attn_prior.shape != attn.shape[-2:]:
        raise ValueError(
            f"calibration attention prior is [Lyr, N] = {list(calibration.attn_prior.shape)} but the cache's "
            f"attention is {list(attn.shape[-2:])}; the calibration must come from the same model"
        )


# --------------------------------------------------------------------------- logit-level


def vanilla(scores: np.ndarray) -> np.ndarray:
    """Vanilla: the scores unchanged (prediction = argmax, same as greedy decoding)."""
    return np.asarray(scores)


def predict(corrected: np.ndarray) -> np.ndarray:
    """Predicted physical position: argmax over the last axis (first maximum on ties)."""
    return np.argmax(corrected, axis=-1)


def pride(scores: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """PriDe: subtract a (log) prior over positions from every row's scores."""
    return np.asarray(scores, dtype=np.float64) - np.asarray(prior, dtype=np.float64)


# --------------------------------------------------------------------------- layer selection


def layer_strength(attn: np.ndarray) -> np.ndarray:
    """Attention strength per layer ``S^(l) = sum_k a_k^(l)`` (Eq. 8): [..., Lyr]."""
    return np.asarray(attn).sum(axis=-1)


def _candidate_layers(n_layers: int, layer_range: tuple[int, ...] | None) -> np.ndarray:
    """Layer indices searched by the selection: all, or ``lo..hi`` inclusive.

    A range that runs past the last layer is clipped to it (the reference's default 21-35
    on a 28-layer model searches 21-27); one that starts past it is an error. A range
    ``(lo, hi, of)`` (a family default) is first scaled from an ``of``-layer decoder to this one.
    """
    if layer_range is None:
        return np.arange(n_layers)
    lo, hi = scale_layer_range(*layer_range, n_layers) if len(layer_range) == 3 else layer_range
    if not 0 <= lo < n_layers or hi < lo:
        raise ValueError(f"layer_range {layer_range} is outside the model's layers 0..{n_layers - 1}")
    return np.arange(lo, min(hi, n_layers - 1) + 1)


def select_layers(
    attn: np.ndarray, top_k: int, layer_range: tuple[int, int] | None = None, *,
    ties: str = LAYER_TIES[0], k_beyond_range: str = K_BEYOND_RANGE[0],
) -> np.ndarray:
    """Indices [..., K] of the ``top_k`` strongest layers of each row (Eq. 9), strongest first.

    Only layers in ``layer_range`` (inclusive, 0-based; ``None`` = all) compete. Among
    layers of equal strength, ``ties="highest"`` (the reference) keeps the higher index,
    ``"lowest"`` the lower, ``"argsort"`` whichever numpy's default argsort of the layers'
    mean attention puts last (the reference's call; its order among equals depends on
    numpy's build). A ``top_k`` beyond the range's size is lowered to it
    (``k_beyond_range="lower"``, the reference) or an error (``"error"``).
    """
    attn = np.asarray(attn)
    candidates = _candidate_layers(attn.shape[-2], layer_range)
    top_k = effective_top_k(top_k, candidates.size, k_beyond_range, layer_range)
    strength = _ranked_strength(attn, candidates, ties)
    if ties == "highest":
        # a stable sort of the reversed candidates puts the higher index first among equals
        order = candidates.size - 1 - np.argsort(-strength[..., ::-1], axis=-1, kind="stable")[..., :top_k]
    elif ties == "lowest":
        order = np.argsort(-strength, axis=-1, kind="stable")[..., :top_k]
    elif ties == "argsort":
        order = np.argsort(strength, axis=-1)[..., ::-1][..., :top_k]   # numpy's default kind, as the reference
    else:
        raise ValueError(f"layer ties must be one of {LAYER_TIES}, got {ties!r}")
    return candidates[order]


def _ranked_strength(attn: np.ndarray, candidates: np.ndarray, ties: str) -> np.ndarray:
    """What the selection ranks the candidate layers by: their strength (Eq. 8), or for the
    "argsort" rule the reference's own quantity, the mean over the N images (same order, but
    its float64 values and so its ties are the reference's)."""
    if ties == "argsort":
        return np.asarray(attn, dtype=np.float64)[..., candidates, :].mean(axis=-1)
    return layer_strength(attn)[..., candidates]


def with_absent_layers(attn: np.ndarray, layer_range: tuple[int, ...] | None, beyond_depth: str,
                       *priors: np.ndarray) -> tuple[np.ndarray, ...]:
    """``attn`` [..., Lyr, N] and any ``priors`` [Lyr, N], extended by layers of zeros up to
    ``layer_range``'s last layer when ``beyond_depth="absent"`` and the range runs past the
    model (the reference hooks the layers of its range whatever the depth; one that does not
    exist keeps attention 0 and prior 0). Otherwise unchanged (the range is clipped later)."""
    if beyond_depth not in LAYERS_BEYOND_DEPTH:
        raise ValueError(f"layers_beyond_depth must be one of {LAYERS_BEYOND_DEPTH}, got {beyond_depth!r}")
    attn = np.asarray(attn)
    missing = 0 if layer_range is None or len(layer_range) == 3 else layer_range[1] + 1 - attn.shape[-2]
    if beyond_depth == "clip" or missing <= 0:
        return (attn, *priors)

    def extended(values: np.ndarray) -> np.ndarray:
        values = np.asarray(values)
        return np.concatenate([values, np.zeros(values.shape[:-2] + (missing, values.shape[-1]), values.dtype)], axis=-2)

    return (extended(attn), *map(extended, priors))


def effective_top_k(top_k: int, n_candidates: int, k_beyond_range: str = K_BEYOND_RANGE[0],
                    layer_range: tuple[int, int] | None = None) -> int:
    """The K actually used: ``top_k``, or the range's size when it is smaller and the rule is "lower"."""
    if top_k <= n_candidates:
        return top_k
    if k_beyond_range == "lower":
        return n_candidates
    if k_beyond_range == "error":
        raise ValueError(f"top_k = {top_k} but the layer range {layer_range} holds only {n_candidates} layers")
    raise ValueError(f"k_beyond_range must be one of {K_BEYOND_RANGE}, got {k_beyond_range!r}")


def layer_selection_mask(
    attn: np.ndarray, top_k: int, layer_range: tuple[int, int] | None = None, all_layers: bool = False, *,
    ties: str = LAYER_TIES[0], k_beyond_range: str = K_BEYOND_RANGE[0],
) -> np.ndarray:
    """Boolean mask [..., Lyr] of the layers each row averages over.

    ``all_layers=True`` keeps every layer of ``layer_range`` (the "All layers" ablation);
    otherwise the per-row top-K of :func:`select_layers`.
    """
    attn = np.asarray(attn)
    n_layers = attn.shape[-2]
    mask = np.zeros(attn.shape[:-1], dtype=bool)
    if all_layers:
        mask[..., _candidate_layers(n_layers, layer_range)] = True
        return mask
    selected = select_layers(attn, top_k, layer_range, ties=ties, k_beyond_range=k_beyond_range)
    np.put_along_axis(mask, selected, True, axis=-1)
    return mask


def selection_warnings(attn: np.ndarray, settings: "LadSettings") -> list[str]:
    """Where the layer-selection rules decided something (recorded in the evaluation output):
    K lowered to the range's size, and rows whose K-th and (K+1)-th strongest layers tie
    (there the tie rule picks the layer)."""
    if settings.all_layers:
        return []
    n_layers = np.shape(attn)[-2]
    attn, = with_absent_layers(attn, settings.layer_range, settings.layers_beyond_depth)
    candidates = _candidate_layers(attn.shape[-2], settings.layer_range)
    warnings = []
    k = effective_top_k(settings.top_k, candidates.size, settings.k_beyond_range, settings.layer_range)
    if k < settings.top_k:
        warnings.append(f"top_k = {settings.top_k} is larger than the {candidates.size} layers of the range "
                        f"{settings.layer_range or 'all'}; K lowered to {k} (k_beyond_range = lower, the reference's rule)")
    if k < candidates.size:
        strength = np.sort(_ranked_strength(attn, candidates, settings.layer_ties), axis=-1)[..., ::-1]
        tied = int((strength[..., k - 1] == strength[..., k]).sum())
        if tied:
            rule = ("the layer numpy's argsort put last was kept (its order among equal values depends on "
                    "numpy's build)" if settings.layer_ties == "argsort" else f"the {settings.layer_ties} layer index was kept")
            warnings.append(f"{tied} of {strength[..., 0].size} rows have a tie at the K-th strongest layer; "
                            f"{rule} (layer_ties = {settings.layer_ties})")
    if attn.shape[-2] > n_layers:
        selected = select_layers(attn, settings.top_k, settings.layer_range, ties=settings.layer_ties,
                                 k_beyond_range=settings.k_beyond_range)
        absent = int((selected >= n_layers).any(axis=-1).sum())
        if absent:
            warnings.append(f"{absent} of {selected[..., 0].size} rows average in layers {n_layers}.."
                            f"{attn.shape[-2] - 1}, which the model does not have (attention 0, prior log 1e-20; "
                            "layers_beyond_depth = absent, the reference's arithmetic)")
    return warnings


def reply_parse_warnings(arrays: EvalArraysLike, settings: "LadSettings") -> list[str]:
    """Where reading the greedy replies by int() (``reply_parse = int``) names another
    position than reading them as identifiers (recorded in the evaluation output)."""
    texts = getattr(arrays, "greedy_text", None)
    if texts is None or settings.reply_parse == "exact":
        return []
    n = np.shape(arrays.scores)[-1]
    differ = int((parse_reference_replies(texts, n, "int") != parse_reference_replies(texts, n, "exact")).sum())
    if not differ:
        return []
    return [f"{differ} of {np.size(texts)} greedy replies name another position when each run of digits is read by "
            "int() (leading zeros, non-ASCII decimal digits; reply_parse = int, the reference's)"]


def _mean_over_mask(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of ``values`` [..., Lyr, N] over the layers where ``mask`` [..., Lyr] is True."""
    weights = mask[..., None].astype(np.float64)
    return (values * weights).sum(axis=-2) / weights.sum(axis=-2)


# --------------------------------------------------------------------------- attention


def raw_attention(
    attn: np.ndarray, top_k: int = LadSettings.top_k, layer_range: tuple[int, int] | None = None,
    all_layers: bool = False, *,
    ties: str = LAYER_TIES[0], k_beyond_range: str = K_BEYOND_RANGE[0],
    layers_beyond_depth: str = LAYERS_BEYOND_DEPTH[0],
) -> np.ndarray:
    """Raw attention evidence [..., N]: mean of ``a^(l)`` over the selected layers, no prior.

    Its argmax is the "Raw attention" readout (Table 7; "Attn readout, no prior" of Table 4).
    """
    attn, = with_absent_layers(np.asarray(attn, dtype=np.float64), layer_range, layers_beyond_depth)
    mask = layer_selection_mask(attn, top_k, layer_range, all_layers, ties=ties, k_beyond_range=k_beyond_range)
    return _mean_over_mask(attn, mask)


def purified_attention(
    attn: np.ndarray,
    attn_prior: np.ndarray,
    *,
    top_k: int = LadSettings.top_k,
    layer_range: tuple[int, int] | None = None,
    layer_mean: Choice = "reference",
    use_prior: bool = True,
    all_layers: bool = False,
    ties: str = LAYER_TIES[0],
    k_beyond_range: str = K_BEYOND_RANGE[0],
    layers_beyond_depth: str = LAYERS_BEYOND_DEPTH[0],
) -> np.ndarray:
    """``log pi~`` [..., N] (Eqs. 10-11) over the selected layers ``L*``.

    - ``layer_mean="reference"``: ``log(mean_l a_k^(l)) - mean_l log a_prior,k^(l)``;
    - ``layer_mean="paper"``:     ``mean_l (log a_k^(l) - log a_prior,k^(l))``.

    ``use_prior=False`` drops the prior term (the "no prior" ablation). Every log has
    ``EPS = 1e-20`` inside. The layer set is chosen from ``attn`` alone (strength), so
    the prior never affects which layers are used.
    """
    attn = np.asarray(attn, dtype=np.float64)
    attn_prior = np.asarray(attn_prior, dtype=np.float64)
    if attn_prior.shape != attn.shape[-2:]:
        raise ValueError(f"attn_prior shape {attn_prior.shape} does not match attention [..., Lyr, N] {attn.shape}")
    attn, attn_prior = with_absent_layers(attn, layer_range, layers_beyond_depth, attn_prior)
    mask = layer_selection_mask(attn, top_k, layer_range, all_layers, ties=ties, k_beyond_range=k_beyond_range)
    log_prior = np.log(attn_prior + EPS)
    if layer_mean == "reference":
        log_evidence = np.log(_mean_over_mask(attn, mask) + EPS)
        if not use_prior:
            return log_evidence
        return log_evidence - _mean_over_mask(np.broadcast_to(log_prior, attn.shape), mask)
    if layer_mean == "paper":
        log_ratio = np.log(attn + EPS) - (log_prior if use_prior else 0.0)
        return _mean_over_mask(log_ratio, mask)
    raise ValueError(f"layer_mean must be 'reference' or 'paper', got {layer_mean!r}")


def sharpen(log_pi: np.ndarray, tau: float) -> np.ndarray:
    """Posterior over positions ``pi = softmax(tau * log pi~)`` (Eq. 12)."""
    logits = tau * np.asarray(log_pi, dtype=np.float64)
    logits = logits - logits.max(axis=-1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(axis=-1, keepdims=True)


def expected_bias(pi: np.ndarray, B: np.ndarray, mixture: Choice = "reference") -> np.ndarray:
    """Expected log-bias per position [..., N] under the posterior ``pi`` (Eq. 13).

    - ``"reference"``: ``prior_j = sum_i pi_i B[i, j]`` (mix in log space);
    - ``"paper"``:     ``prior_j = log sum_i pi_i exp(B[i, j])`` (mix in probability space).

    Both agree when ``pi`` is one-hot; by Jensen the paper's is never below the reference's.
    """
    pi = np.asarray(pi, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    if mixture == "reference":
        return pi @ B
    if mixture == "paper":
        # log-sum-exp with the column maximum factored out so exp never overflows
        column_max = B.max(axis=0)
        return column_max + np.log(pi @ np.exp(B - column_max))
    raise ValueError(f"mixture must be 'reference' or 'paper', got {mixture!r}")


def lad(
    scores: np.ndarray,
    attn: np.ndarray,
    calibration: CalibrationLike,
    *,
    top_k: int = LadSettings.top_k,
    tau: float = LadSettings.tau,
    layer_range: tuple[int, int] | None = LadSettings.layer_range,
    use_prior: bool = LadSettings.use_prior,
    all_layers: bool = LadSettings.all_layers,
    layer_mean: Choice = LadSettings.layer_mean,
    mixture: Choice = LadSettings.mixture,
    layer_ties: str = LadSettings.layer_ties,
    k_beyond_range: str = LadSettings.k_beyond_range,
    layers_beyond_depth: str = LadSettings.layers_beyond_depth,
) -> np.ndarray:
    """LAD's corrected scores ``s' = s - prior(pi(attn))`` [..., N] (Eqs. 8-14); the defaults
    are :class:`LadSettings`'."""
    scores = np.asarray(scores, dtype=np.float64)
    check_compatible(scores, attn, calibration)
    log_pi = purified_attention(
        attn, calibration.attn_prior, top_k=top_k, layer_range=layer_range,
        layer_mean=layer_mean, use_prior=use_prior, all_layers=all_layers, ties=layer_ties,
        k_beyond_range=k_beyond_range, layers_beyond_depth=layers_beyond_depth,
    )
    return scores - expected_bias(sharpen(log_pi, tau), calibration.B, mixture)


# --------------------------------------------------------------------------- permutation averaging


def identity_indexed(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Re-index per-position values [..., N] by image identity: ``out[..., order[..., p]] = values[..., p]``."""
    values = np.asarray(values)
    order = np.asarray(order)
    if order.shape != values.shape:
        raise ValueError(f"order shape {order.shape} does not match values {values.shape}")
    out = np.empty(values.shape, dtype=np.result_type(values, np.float64))
    np.put_along_axis(out, order.astype(np.intp), values, axis=-1)
    return out


def permutation_average(scores_by_shift: np.ndarray, order_by_shift: np.ndarray) -> np.ndarray:
    """Scores per image identity [..., N], averaged over the permutations on axis -2.

    ``scores_by_shift[..., s, p]`` is the score of position ``p`` under permutation ``s``
    and ``order_by_shift[..., s, p]`` the identity shown there (METHOD §6).
    """
    return identity_indexed(scores_by_shift, order_by_shift).mean(axis=-2)


def predict_identity_under_orderings(identity: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Physical positions [I, T] where each instance's chosen identity [I] is shown under each ordering."""
    hits = np.asarray(order) == np.asarray(identity)[:, None, None]
    return np.argmax(hits, axis=-1)


# --------------------------------------------------------------------------- registry

MethodFn = Callable[[EvalArraysLike, CalibrationLike, "Mapping[str, Any] | LadSettings | None"], np.ndarray]


def _vanilla_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings=None) -> np.ndarray:
    return predict(vanilla(arrays.scores))


def _pride_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings=None) -> np.ndarray:
    check_compatible(arrays.scores, None, calibration)
    return predict(pride(arrays.scores, calibration.pride_prior))


def _pride_original_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings=None) -> np.ndarray:
    # The original subtracts the log prior from log(p + 1e-10) of the test probabilities.
    # With exact logs, log-softmax differs from the raw scores by one constant per row, so
    # subtracting from the scores predicts the same. A calibration written before the floor
    # existed was fitted with exact logs.
    check_compatible(arrays.scores, None, calibration)
    logs = getattr(calibration, "settings", {}).get("pride_original_logs", "exact")
    scores = arrays.scores if logs == "exact" else pride_log(np.exp(log_softmax(arrays.scores)), logs)
    return predict(pride(scores, calibration.pride_original_prior))


def lad_scores(scores: np.ndarray, attn: np.ndarray, calibration: CalibrationLike, settings=None) -> np.ndarray:
    """:func:`lad` under a settings object or mapping (LAD's debiased scores)."""
    lad_settings = asdict(LadSettings.from_mapping(settings))
    del lad_settings["reply_parse"]   # a readout's setting, not LAD's
    return lad(scores, attn, calibration, **lad_settings)


def _lad_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings=None) -> np.ndarray:
    return predict(lad_scores(arrays.scores, arrays.attn, calibration, settings))


def _raw_attention_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings=None) -> np.ndarray:
    s = LadSettings.from_mapping(settings)
    return predict(raw_attention(arrays.attn, s.top_k, s.layer_range, s.all_layers, ties=s.layer_ties,
                                 k_beyond_range=s.k_beyond_range, layers_beyond_depth=s.layers_beyond_depth))


def _purified_attention_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings=None) -> np.ndarray:
    # argmax of pi = argmax of log pi~: tau and the mixture do not matter for this readout.
    s = LadSettings.from_mapping(settings)
    check_compatible(arrays.scores, arrays.attn, calibration)
    log_pi = purified_attention(
        arrays.attn, calibration.attn_prior, top_k=s.top_k, layer_range=s.layer_range,
        layer_mean=s.layer_mean, use_prior=s.use_prior, all_layers=s.all_layers, ties=s.layer_ties,
        k_beyond_range=s.k_beyond_range, layers_beyond_depth=s.layers_beyond_depth,
    )
    return predict(log_pi)


def _permutation_average_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings=None) -> np.ndarray:
    # A permavg cache ([I, T, N(shift), N]): per instance x ordering, average the scores per
    # image identity over the N cyclic shifts of that ordering and report where the chosen
    # identity sits in the unshifted ordering (shift 0). Any other cache ([I, T, N]): average
    # over the T orderings (T passes) and report the chosen identity's position under every
    # ordering: Cons. is 100% by design.
    if np.ndim(arrays.scores) == 4:
        identity = permutation_average(arrays.scores, arrays.order).argmax(axis=-1)          # [I, T]
        return np.argmax(np.asarray(arrays.order)[:, :, 0] == identity[..., None], axis=-1)
    identity = np.argmax(permutation_average(arrays.scores, arrays.order), axis=-1)
    return predict_identity_under_orderings(identity, arrays.order)


def parse_reference_replies(texts: np.ndarray, n: int, rule: str = REPLY_PARSES[0]) -> np.ndarray:
    """Physical position each reply names, as the reference parses a Vanilla reply: the last
    integer of the text in 1..n (digits identifiers); -1 when there is none (counted wrong).
    ``rule`` (:data:`REPLY_PARSES`): "exact", a run of digits must spell the identifier; "int",
    each run is read by int() as the reference does ("03", "３" and "٣" name 3)."""
    from ladbench.inference.prompts import parse_last_identifier, parse_last_int  # stdlib only (re)

    if rule not in REPLY_PARSES:
        raise ValueError(f"reply_parse must be one of {REPLY_PARSES}, got {rule!r}")
    texts = np.asarray(texts, dtype=object)
    parsed = [parse_last_int(str(text), n) if rule == "int" else parse_last_identifier(str(text), n, "digits")
              for text in texts.ravel().tolist()]
    return np.array(parsed, dtype=np.int64).reshape(texts.shape)


def _vanilla_generate_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings=None) -> np.ndarray:
    # The reference's Vanilla: greedy two-token reply, parsed; unparsable = -1 (wrong, and the
    # parse rate is the summary's parse_success).
    texts = getattr(arrays, "greedy_text", None)
    if texts is None:
        raise ValueError("method 'vanilla_generate' needs the cache's greedy replies (greedy_text); run the "
                         "infer stage without --no-greedy-reply (config inference.greedy_reply: true)")
    return parse_reference_replies(texts, arrays.scores.shape[-1], LadSettings.from_mapping(settings).reply_parse)


def _generated_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings=None) -> np.ndarray:
    # Generative variants (CoT, self-consistency) store the parsed answer; -1 = unparsable.
    parsed = getattr(arrays, "parsed", None)
    if parsed is None:
        raise ValueError("method 'generated' needs the cache's 'parsed' answers (CoT / self-consistency caches)")
    return np.asarray(parsed).astype(np.int64)


@dataclass(frozen=True)
class Method:
    """A registered method: its function and what the stages and the report need to know of it.

    ``reads``: the prompt variant (``ladbench.variants``) whose cache the tables read it from
    (None: each variant that lists it among its methods, e.g. ``generated`` for CoT and
    self-consistency). ``place``: its row in Table 1 among the variants' rows (None: not a
    Table 1 row). ``reads_shifts``: it reads a cache whose orderings are also shown at their N
    cyclic shifts (arrays [I, T, N(shift), N]) and returns positions in the unshifted orderings.
    """

    predict: MethodFn
    label: str
    needs_calibration: bool = False
    selects_layers: bool = False   # selects layers by attention strength (its warnings are recorded)
    reads: str | None = "vanilla"
    reads_shifts: bool = False
    place: float | None = None

    def __call__(self, arrays: EvalArraysLike, calibration: CalibrationLike, settings=None) -> np.ndarray:
        return self.predict(arrays, calibration, settings)


METHODS: dict[str, Method] = {
    "vanilla": Method(_vanilla_method, "Vanilla", place=1),
    "vanilla_generate": Method(_vanilla_generate_method, "Vanilla (greedy reply, parsed)", place=7),
    "pride": Method(_pride_method, "PriDe", needs_calibration=True, place=4),
    "pride_original": Method(_pride_original_method, "PriDe (original)", needs_calibration=True, place=8),
    "lad": Method(_lad_method, "Ours (LAD)", needs_calibration=True, selects_layers=True, place=6),
    "raw_attention": Method(_raw_attention_method, "Raw attention", selects_layers=True),
    "purified_attention": Method(_purified_attention_method, "Purified attention", needs_calibration=True,
                                 selects_layers=True),
    "permutation_average": Method(_permutation_average_method, "Permutation averaging", reads="permavg",
                                  reads_shifts=True),
    "generated": Method(_generated_method, "Generated answer", reads=None),
}


def register_method(name: str, method: Method) -> Method:
    """Add a method to the registry (a plugin module calls this at import)."""
    if name in METHODS:
        raise ValueError(f"method {name!r} is already registered")
    METHODS[name] = method
    return method


def method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(sorted(METHODS))}") from None


# --------------------------------------------------------------------------- ablation and sweep grids


@dataclass(frozen=True)
class MethodRow:
    """One row of an ablation table: a label, a registered method and its settings."""

    label: str
    method: str
    settings: LadSettings

    def predict(self, arrays: EvalArraysLike, calibration: CalibrationLike) -> np.ndarray:
        return METHODS[self.method](arrays, calibration, self.settings)


def ablation_grid(base: Mapping[str, Any] | LadSettings | None = None) -> list[MethodRow]:
    """Table 4's rows (and Table 7's readouts) around ``base`` settings.

    "All layers" averages every layer of the model (``layer_range=None``), as the paper
    describes it; the other rows keep ``base``'s layer range.
    """
    b = LadSettings.from_mapping(base)
    rows = [
        MethodRow("attn_readout_no_prior_K2", "raw_attention", replace(b, top_k=2, use_prior=False)),
        MethodRow("attn_readout_prior_K2", "purified_attention", replace(b, top_k=2, use_prior=True)),
        MethodRow("all_layers_prior", "lad", replace(b, all_layers=True, layer_range=None, use_prior=True)),
        MethodRow("dynamic_no_prior_K2", "lad", replace(b, top_k=2, use_prior=False)),
    ]
    rows += [MethodRow(f"dynamic_prior_K{k}", "lad", replace(b, top_k=k, use_prior=True)) for k in (1, 2, 4, 8)]
    return rows


def tau_sweep(base: Mapping[str, Any] | LadSettings | None = None, taus: Iterable[float] = range(1, 10)) -> list[MethodRow]:
    """LAD at each sharpening temperature (Figure 6, right)."""
    b = LadSettings.from_mapping(base)
    return [MethodRow(f"lad_tau{tau:g}", "lad", replace(b, tau=float(tau))) for tau in taus]


def top_k_sweep(base: Mapping[str, Any] | LadSettings | None = None, ks: Iterable[int] = (1, 2, 4, 8)) -> list[MethodRow]:
    """LAD with each number of selected layers K."""
    b = LadSettings.from_mapping(base)
    return [MethodRow(f"lad_K{k}", "lad", replace(b, top_k=int(k))) for k in ks]


def paper_vs_reference_grid(base: Mapping[str, Any] | LadSettings | None = None) -> list[MethodRow]:
    """LAD under the four combinations of layer mean and mixture (reference vs paper).

    The third switch, how ``L`` is averaged, is a calibration setting (``fit_calibration``).
    """
    b = LadSettings.from_mapping(base)
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
