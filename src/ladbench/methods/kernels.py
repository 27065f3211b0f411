"""The numeric kernels of the methods: pure numpy functions of cached arrays.

Shapes (docs/formats.md §4): ``scores`` [..., N] per physical position, ``attn``
[..., Lyr, N] (last-query attention mass per layer per image span). Any leading batch
shape works, e.g. [I, T, N] for an evaluation cache. Predictions are physical
positions (argmax over the last axis).

LAD (METHOD.md §5) is split into its steps so each can be switched between the
reference implementation's behaviour (the default; its numbers are the published
ones) and the paper's equations; each step takes the :class:`LadSettings` (or the few
values it needs):

1. :func:`select_layers`      top-K layers by attention strength (Eqs. 8-9), in a layer range;
2. :func:`purified_attention` log pi~ (Eqs. 10-11), ``layer_mean="reference"|"paper"``;
3. :func:`sharpen`            pi = softmax(tau log pi~) (Eq. 12);
4. :func:`expected_bias`      prior_j from pi and B (Eq. 13), ``mixture="reference"|"paper"``;
5. :func:`lad`                s' = s - prior (Eq. 14).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from ladbench.calibration import EPS
from ladbench.families import scale_layer_range
from ladbench.windows import compact
from ladbench.methods.settings import K_BEYOND_RANGE, LAYER_TIES, LAYERS_BEYOND_DEPTH, REPLY_PARSES, Choice, LadSettings

__all__ = ["CalibrationLike", "EvalArraysLike", "check_compatible", "effective_top_k", "expected_bias",
           "identity_indexed", "lad", "layer_selection_mask", "layer_strength", "parse_reference_replies",
           "permutation_average", "predict", "predict_identity_under_orderings", "pride", "purified_attention",
           "raw_attention", "reply_parse_warnings", "select_layers", "selection_warnings", "sharpen", "vanilla",
           "with_absent_layers"]


# --------------------------------------------------------------------------- inputs


class EvalArraysLike(Protocol):
    """What the methods need from an evaluation cache (``ladbench.arrays.EvalArrays``)."""

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


def _candidate_layers(n_layers: int, layer_range: tuple[int, ...] | None, unseen: Sequence[int] = ()) -> np.ndarray:
    """Layer indices searched by the selection: all, or ``lo..hi`` inclusive.

    A range that runs past the last layer is clipped to it (the reference's default 21-35
    on a 28-layer model searches 21-27); one that starts past it is an error. A range
    ``(lo, hi, of)`` (a family default) is first scaled from an ``of``-layer decoder to this one.
    """
    if layer_range is None:
        layers = np.arange(n_layers)
    else:
        lo, hi = scale_layer_range(*layer_range, n_layers) if len(layer_range) == 3 else layer_range
        if not 0 <= lo < n_layers or hi < lo:
            raise ValueError(f"layer_range {layer_range} is outside the model's layers 0..{n_layers - 1}")
        layers = np.arange(lo, min(hi, n_layers - 1) + 1)
    if not len(unseen):
        return layers
    seen = layers[~np.isin(layers, unseen)]
    if not seen.size:
        raise ValueError(f"every layer of the layer range {layer_range or 'all'} has a sliding window (unseen: "
                         f"{list(unseen)}); choose a range with layers without one (docs/method.md, 'Windowed layers')")
    return seen


def select_layers(
    attn: np.ndarray, top_k: int, layer_range: tuple[int, int] | None = None, *,
    ties: str = LAYER_TIES[0], k_beyond_range: str = K_BEYOND_RANGE[0], unseen: Sequence[int] = (),
) -> np.ndarray:
    """Indices [..., K] of the ``top_k`` strongest layers of each row (Eq. 9), strongest first.

    Only layers in ``layer_range`` (inclusive, 0-based; ``None`` = all) compete. Among
    layers of equal strength, ``ties="highest"`` (the reference) keeps the higher index,
    ``"lowest"`` the lower, ``"argsort"`` whichever numpy's default argsort of the layers'
    mean attention puts last (the reference's call; its order among equals depends on
    numpy's build). A ``top_k`` beyond the range's size is lowered to it
    (``k_beyond_range="lower"``, the reference) or an error (``"error"``). The ``unseen``
    layers (sliding windows, ladbench.windows) never compete.
    """
    attn = np.asarray(attn)
    candidates = _candidate_layers(attn.shape[-2], layer_range, unseen)
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


def layer_selection_mask(attn: np.ndarray, settings: LadSettings) -> np.ndarray:
    """Boolean mask [..., Lyr] of the layers each row averages over.

    ``settings.all_layers`` keeps every layer of the layer range (the "All layers" ablation);
    otherwise the per-row top-K of :func:`select_layers`.
    """
    attn = np.asarray(attn)
    n_layers = attn.shape[-2]
    mask = np.zeros(attn.shape[:-1], dtype=bool)
    if settings.all_layers:
        mask[..., _candidate_layers(n_layers, settings.layer_range, settings.unseen_layers)] = True
        return mask
    selected = select_layers(attn, settings.top_k, settings.layer_range, ties=settings.layer_ties,
                             k_beyond_range=settings.k_beyond_range, unseen=settings.unseen_layers)
    np.put_along_axis(mask, selected, True, axis=-1)
    return mask


def selection_warnings(attn: np.ndarray, settings: LadSettings) -> list[str]:
    """Where the layer-selection rules decided something (recorded in the evaluation output):
    K lowered to the range's size, and rows whose K-th and (K+1)-th strongest layers tie
    (there the tie rule picks the layer)."""
    if settings.all_layers:
        return []
    n_layers = np.shape(attn)[-2]
    attn, = with_absent_layers(attn, settings.layer_range, settings.layers_beyond_depth)
    candidates = _candidate_layers(attn.shape[-2], settings.layer_range, settings.unseen_layers)
    warnings = []
    left_out = np.setdiff1d(_candidate_layers(attn.shape[-2], settings.layer_range), candidates)
    if left_out.size:
        warnings.append(f"layers {compact(left_out.tolist())} of the range {settings.layer_range or 'all'} have a "
                        "sliding window: left out of the selection as unseen (docs/method.md, 'Windowed layers')")
    k = effective_top_k(settings.top_k, candidates.size, settings.k_beyond_range, settings.layer_range)
    if k < settings.top_k:
        warnings.append(f"top_k = {settings.top_k} is larger than the {candidates.size} layers of the range "
                        f"{settings.layer_range or 'all'}; K lowered to {k} (k_beyond_range = lower, the reference's rule)")
    if k == 0:
        warnings.append("top_k = 0 selects no layer: LAD's posterior is uniform over the positions (the reference's "
                        "arithmetic)")
    if 0 < k < candidates.size:
        ranked = _ranked_strength(attn, candidates, settings.layer_ties)
        strength = np.sort(ranked, axis=-1)[..., ::-1]
        # a tie only among layers the model lacks (all zeros, prior 0) changes nothing, whichever is kept
        tied_group = ranked == strength[..., k - 1:k]
        matters = (tied_group & (candidates < n_layers)).any(axis=-1)
        tied = int(((strength[..., k - 1] == strength[..., k]) & matters).sum())
        if tied:
            rule = ("the layer numpy's argsort put last was kept (its order among equal values depends on "
                    "numpy's build)" if settings.layer_ties == "argsort" else f"the {settings.layer_ties} layer index was kept")
            warnings.append(f"{tied} of {strength[..., 0].size} rows have a tie at the K-th strongest layer; "
                            f"{rule} (layer_ties = {settings.layer_ties})")
    if attn.shape[-2] > n_layers:
        selected = select_layers(attn, settings.top_k, settings.layer_range, ties=settings.layer_ties,
                                 k_beyond_range=settings.k_beyond_range, unseen=settings.unseen_layers)
        absent = int((selected >= n_layers).any(axis=-1).sum())
        if absent:
            warnings.append(f"{absent} of {selected[..., 0].size} rows average in layers {n_layers}.."
                            f"{attn.shape[-2] - 1}, which the model does not have (attention 0, prior log 1e-20; "
                            "layers_beyond_depth = absent, the reference's arithmetic)")
    return warnings


def reply_parse_warnings(arrays: EvalArraysLike, rule: str) -> list[str]:
    """Where reading the greedy replies by int() (``reply_parse = int``) names another
    position than reading them as identifiers (recorded in the evaluation output)."""
    texts = getattr(arrays, "greedy_text", None)
    if texts is None or rule == "exact":
        return []
    n = np.shape(arrays.scores)[-1]
    differ = int((parse_reference_replies(texts, n, "int") != parse_reference_replies(texts, n, "exact")).sum())
    if not differ:
        return []
    return [f"{differ} of {np.size(texts)} greedy replies name another position when each run of digits is read by "
            "int() (leading zeros, non-ASCII decimal digits; reply_parse = int, the reference's)"]


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


def _mean_over_mask(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of ``values`` [..., Lyr, N] over the layers where ``mask`` [..., Lyr] is True; 0 where
    no layer is (K = 0: the same evidence for every position, so a uniform posterior, as the
    reference computes it)."""
    weights = mask[..., None].astype(np.float64)
    total, count = (values * weights).sum(axis=-2), weights.sum(axis=-2)
    return np.divide(total, count, out=np.zeros_like(total), where=count > 0)


# --------------------------------------------------------------------------- attention


def raw_attention(attn: np.ndarray, settings: LadSettings = LadSettings()) -> np.ndarray:
    """Raw attention evidence [..., N]: mean of ``a^(l)`` over the selected layers, no prior.

    Its argmax is the "Raw attention" readout (Table 7; "Attn readout, no prior" of Table 4).
    """
    attn, = with_absent_layers(np.asarray(attn, dtype=np.float64), settings.layer_range, settings.layers_beyond_depth)
    return _mean_over_mask(attn, layer_selection_mask(attn, settings))


def purified_attention(attn: np.ndarray, attn_prior: np.ndarray, settings: LadSettings = LadSettings()) -> np.ndarray:
    """``log pi~`` [..., N] (Eqs. 10-11) over the selected layers ``L*``.

    - ``settings.layer_mean="reference"``: ``log(mean_l a_k^(l)) - mean_l log a_prior,k^(l)``;
    - ``settings.layer_mean="paper"``:     ``mean_l (log a_k^(l) - log a_prior,k^(l))``.

    ``settings.use_prior=False`` drops the prior term (the "no prior" ablation). Every log has
    ``EPS = 1e-20`` inside. The layer set is chosen from ``attn`` alone (strength), so
    the prior never affects which layers are used.
    """
    attn = np.asarray(attn, dtype=np.float64)
    attn_prior = np.asarray(attn_prior, dtype=np.float64)
    if attn_prior.shape != attn.shape[-2:]:
        raise ValueError(f"attn_prior shape {attn_prior.shape} does not match attention [..., Lyr, N] {attn.shape}")
    attn, attn_prior = with_absent_layers(attn, settings.layer_range, settings.layers_beyond_depth, attn_prior)
    mask = layer_selection_mask(attn, settings)
    log_prior = np.log(attn_prior + EPS)
    if settings.layer_mean == "reference":
        log_evidence = np.log(_mean_over_mask(attn, mask) + EPS)
        if not settings.use_prior:
            return log_evidence
        return log_evidence - _mean_over_mask(np.broadcast_to(log_prior, attn.shape), mask)
    log_ratio = np.log(attn + EPS) - (log_prior if settings.use_prior else 0.0)    # "paper"
    return _mean_over_mask(log_ratio, mask)


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


def lad(scores: np.ndarray, attn: np.ndarray, calibration: CalibrationLike,
        settings: LadSettings = LadSettings()) -> np.ndarray:
    """LAD's corrected scores ``s' = s - prior(pi(attn))`` [..., N] (Eqs. 8-14)."""
    scores = np.asarray(scores, dtype=np.float64)
    check_compatible(scores, attn, calibration)
    log_pi = purified_attention(attn, calibration.attn_prior, settings)
    return scores - expected_bias(sharpen(log_pi, settings.tau), calibration.B, settings.mixture)


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
