"""The methods by name (:data:`METHODS`): each a :class:`Method`, a ``callable(arrays,
calibration, settings) -> predictions [I, T]`` (``settings``: a :class:`MethodSettings`) that
also says whether it needs a calibration, its label and which prompt variant's cache it
reads. ``evaluate``, the workflow's calibration inputs, the report and the schema's method
enum derive from it; a plugin adds to it with :func:`register_method`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ladbench.calibration import log_softmax, pride_log
from ladbench.methods.kernels import (CalibrationLike, EvalArraysLike, check_compatible, lad, parse_reference_replies,
                                      permutation_average, predict, predict_identity_under_orderings, pride,
                                      purified_attention, raw_attention, vanilla)
from ladbench.methods.settings import MethodSettings
from ladbench.registry import Registry

__all__ = ["METHODS", "Method", "MethodFn", "ablation_methods", "method", "readout_methods", "register_method"]

MethodFn = Callable[[EvalArraysLike, CalibrationLike, MethodSettings], np.ndarray]


def _vanilla_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings: MethodSettings) -> np.ndarray:
    return predict(vanilla(arrays.scores))


def _pride_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings: MethodSettings) -> np.ndarray:
    check_compatible(arrays.scores, None, calibration)
    return predict(pride(arrays.scores, calibration.pride_prior))


def _pride_original_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings: MethodSettings) -> np.ndarray:
    # The original subtracts the log prior from log(p + 1e-10) of the test probabilities.
    # With exact logs, log-softmax differs from the raw scores by one constant per row, so
    # subtracting from the scores predicts the same. A calibration written before the floor
    # existed was fitted with exact logs.
    check_compatible(arrays.scores, None, calibration)
    logs = getattr(calibration, "settings", {}).get("pride_original_logs", "exact")
    scores = arrays.scores if logs == "exact" else pride_log(np.exp(log_softmax(arrays.scores)), logs)
    return predict(pride(scores, calibration.pride_original_prior))


def _lad_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings: MethodSettings) -> np.ndarray:
    return predict(lad(arrays.scores, arrays.attn, calibration, settings.lad))


def _raw_attention_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings: MethodSettings) -> np.ndarray:
    return predict(raw_attention(arrays.attn, settings.lad))


def _purified_attention_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings: MethodSettings) -> np.ndarray:
    # argmax of pi = argmax of log pi~: tau and the mixture do not matter for this readout.
    check_compatible(arrays.scores, arrays.attn, calibration)
    return predict(purified_attention(arrays.attn, calibration.attn_prior, settings.lad))


def _permutation_average_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings: MethodSettings) -> np.ndarray:
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


def _vanilla_generate_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings: MethodSettings) -> np.ndarray:
    # The reference's Vanilla: greedy two-token reply, parsed; unparsable = -1 (wrong, and the
    # parse rate is the summary's parse_success).
    texts = getattr(arrays, "greedy_text", None)
    if texts is None:
        raise ValueError("method 'vanilla_generate' needs the cache's greedy replies (greedy_text); run the "
                         "infer stage without --no-greedy-reply (config inference.greedy_reply: true)")
    return parse_reference_replies(texts, arrays.scores.shape[-1], settings.readout.reply_parse)


def _generated_method(arrays: EvalArraysLike, calibration: CalibrationLike, settings: MethodSettings) -> np.ndarray:
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

    What else it joins, each declared here and nowhere else: ``readout``, its column among the
    readouts (Table 7 and the analysis files' ``readouts``; None: not one); ``ablation``, a row of
    the ablation table (Table 4, at the base settings, after LAD's own grid); ``color`` (an
    :data:`~ladbench.report.figures.OKABE_ITO` name) and ``marker``, its line in the figures
    that draw methods (None: matplotlib's next colour, a circle).
    """

    predict: MethodFn
    label: str
    needs_calibration: bool = False
    selects_layers: bool = False   # selects layers by attention strength (its warnings are recorded)
    reads: str | None = "vanilla"
    reads_shifts: bool = False
    place: float | None = None
    readout: float | None = None
    ablation: bool = False
    color: str | None = None
    marker: str | None = None

    def __call__(self, arrays: EvalArraysLike, calibration: CalibrationLike,
                 settings: MethodSettings = MethodSettings()) -> np.ndarray:
        return self.predict(arrays, calibration, settings)


METHODS: Registry[Method] = Registry("method", {
    "vanilla": Method(_vanilla_method, "Vanilla", place=1, readout=1, color="black", marker="o"),
    "vanilla_generate": Method(_vanilla_generate_method, "Vanilla (greedy reply, parsed)", place=7),
    "pride": Method(_pride_method, "PriDe", needs_calibration=True, place=4, color="orange", marker="s"),
    "pride_original": Method(_pride_original_method, "PriDe (original)", needs_calibration=True, place=8),
    "lad": Method(_lad_method, "Ours (LAD)", needs_calibration=True, selects_layers=True, place=6, readout=4,
                  color="blue", marker="D"),
    "raw_attention": Method(_raw_attention_method, "Raw attention", selects_layers=True, readout=2,
                            color="sky_blue", marker="v"),
    "purified_attention": Method(_purified_attention_method, "Purified attention", needs_calibration=True,
                                 selects_layers=True, readout=3, color="green", marker="^"),
    "permutation_average": Method(_permutation_average_method, "Permutation averaging", reads="permavg",
                                  reads_shifts=True),
    "generated": Method(_generated_method, "Generated answer", reads=None),
})


def register_method(name: str, method: Method) -> Method:
    """Add a method to the registry (a plugin module calls this at import)."""
    return METHODS.register(name, method)


def method(name: str) -> Method:
    return METHODS.lookup(name)


def readout_methods() -> list[str]:
    """The readouts (Table 7's columns, the analysis files' ``readouts``), in their declared order."""
    return sorted((name for name, m in METHODS.items() if m.readout is not None), key=lambda n: METHODS[n].readout)


def ablation_methods() -> list[str]:
    """The methods that declared a row of the ablation table (Table 4), in registration order."""
    return [name for name, m in METHODS.items() if m.ablation]

