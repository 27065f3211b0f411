"""Calibration from a cache's calibration rows (METHOD.md §4): pure numpy.

A calibration pool of ``C`` instances was run under all ``N`` cyclic left-shifts of
its candidate list, so the arrays are

- ``cal_scores``      [C, N(shift), N(position)]   candidate scores per physical position,
- ``cal_attn``        [C, N(shift), Lyr, N]        last-query attention mass per layer and image,
- ``cal_target_pos``  [C, N(shift)]                physical position of the ground truth.

``|D_cal|`` instances are drawn from the pool (a seeded draw, so several draws can be
fitted for one study) and give the conditional score matrix ``L``, the bias matrix
``B`` with its gain ``k`` (Eqs. 1-5), the attention prior per layer (Eq. 7) and two
PriDe priors (the reference implementation's and the original paper's).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ladbench.atomic import read_signed_npz, write_signed_npz
from ladbench.settings import Settings, setting

__all__ = [
    "Calibration",
    "attention_prior",
    "bias_matrix",
    "draw_calibration_instances",
    "empty_position_warnings",
    "fit_calibration",
    "log_softmax",
    "pride_log",
    "pride_prior_original",
    "pride_prior_reference",
    "score_matrix",
]

ScoreAverage = Literal["reference", "paper"]
CalibrationSource = Literal["pool", "evaluation_head"]

# Inside every log of a probability or an attention mass (METHOD §5): keeps exact zeros finite.
EPS = 1e-20
# The original PriDe code (chujiezheng/LLM-MCQ-Bias) takes log(p + 1e-10) of every probability,
# in the prior's estimate and on the test side: pride_original_logs = "floor" (default) does the
# same; "exact" takes exact logs (they differ once probabilities fall below about 1e-10).
PRIDE_LOG_FLOOR = 1e-10
PRIDE_ORIGINAL_LOGS = ("floor", "exact")
# How L averages the calibration scores: the reference implementation (default) or the paper (Eqs. 1-3).
SCORE_AVERAGES = ("reference", "paper")
# A position where no calibration row has its ground truth: an error (default), or "zero", the
# reference's (its row of L is 0, with a warning). Every instance is run under all N cyclic
# shifts, so it happens only with rows missing.
EMPTY_POSITIONS = ("error", "zero")


@dataclass(frozen=True)
class FitSettings(Settings):
    """How a calibration is fitted (config ``calibration``; the flags of ``calibrate`` and ``analyze``)."""

    section = "calibration"

    score_average: str = setting(SCORE_AVERAGES[0], "reference: average raw scores; paper: average probabilities, "
                                 "then log (Eqs. 1-3)", choices=SCORE_AVERAGES)
    pride_original_logs: str = setting(
        PRIDE_ORIGINAL_LOGS[0], "the pride_original method: floor = log(p + 1e-10) everywhere, as the original PriDe "
        "code (chujiezheng/LLM-MCQ-Bias); exact = exact logs. They differ only where probabilities fall below about "
        "1e-10", choices=PRIDE_ORIGINAL_LOGS)
    empty_positions: str = setting(
        EMPTY_POSITIONS[0], "a position where no calibration row has its ground truth (only with rows missing: every "
        "instance is run under all N cyclic shifts): error = stop; zero = the reference's, a row of zeros in L, with "
        "a warning in the evaluation output", choices=EMPTY_POSITIONS)

    def kwargs(self) -> dict[str, str]:
        """:func:`fit_calibration`'s options."""
        return {"average": self.score_average, "pride_original_logs": self.pride_original_logs,
                "empty_positions": self.empty_positions}


def log_softmax(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable ``log softmax`` along ``axis``."""
    scores = np.asarray(scores, dtype=np.float64)
    shifted = scores - scores.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def draw_calibration_instances(n_pool: int, n_cal: int, seed: int, source: CalibrationSource = "pool") -> np.ndarray:
    """Sorted indices of ``n_cal`` distinct calibration instances of a pool of ``n_pool``.

    ``source="pool"``: a seeded permutation's first ``n_cal`` entries, so a given seed always
    gives the same set, and ``n_cal = n_pool`` gives the whole pool. ``"evaluation_head"``:
    the pool holds the first evaluation instances (benchmark ``calibration_source``), and,
    as the reference does, the first ``n_cal`` of them are taken; ``seed`` is not used.
    """
    if n_cal < 1:
        raise ValueError(f"|D_cal| (n_cal) must be at least 1, got {n_cal}")
    if n_cal > n_pool:
        raise ValueError(
            f"|D_cal| = {n_cal} calibration instances requested but the cache's calibration pool "
            f"has only {n_pool}; lower n_cal or build the benchmark with a larger pool"
        )
    if source == "evaluation_head":
        return np.arange(n_cal)
    if source != "pool":
        raise ValueError(f"calibration source must be 'pool' or 'evaluation_head', got {source!r}")
    rng = np.random.default_rng(seed)
    return np.sort(rng.permutation(n_pool)[:n_cal])


def _check_calibration_shapes(cal_scores: np.ndarray, cal_target_pos: np.ndarray) -> int:
    """Validate [C, N, N] scores and [C, N] target positions; return N."""
    if cal_scores.ndim != 3 or cal_scores.shape[1] != cal_scores.shape[2]:
        raise ValueError(
            f"cal_scores must be [C, N(shift), N(position)], got shape {cal_scores.shape}"
        )
    if cal_target_pos.shape != cal_scores.shape[:2]:
        raise ValueError(
            f"cal_target_pos shape {cal_target_pos.shape} does not match cal_scores {cal_scores.shape[:2]}"
        )
    n = cal_scores.shape[-1]
    if cal_target_pos.min() < 0 or cal_target_pos.max() >= n:
        raise ValueError(f"cal_target_pos has values outside 0..{n - 1}")
    return n


def score_matrix(
    cal_scores: np.ndarray, cal_target_pos: np.ndarray, average: ScoreAverage = "reference",
    empty_positions: str = EMPTY_POSITIONS[0],
) -> np.ndarray:
    """Conditional score matrix ``L`` [N, N] (Eqs. 1-3).

    ``L[i, j]`` is the average, over calibration rows whose ground truth sits at
    position ``i`` (the set ``D_cal^(i)``), of candidate ``j``'s score:

    - ``"reference"``: the mean of the raw scores ``s_j(x)`` (log domain);
    - ``"paper"``: the log of the mean of the probabilities ``softmax(s(x))_j`` over
      the ``N`` candidates.

    A position ``i`` without rows is an error, or with ``empty_positions="zero"`` a row of
    zeros (the reference's).
    """
    cal_scores = np.asarray(cal_scores, dtype=np.float64)
    cal_target_pos = np.asarray(cal_target_pos)
    n = _check_calibration_shapes(cal_scores, cal_target_pos)
    rows = cal_scores.reshape(-1, n)
    target = cal_target_pos.reshape(-1)
    if average == "reference":
        values = rows
    elif average == "paper":
        values = np.exp(log_softmax(rows))
    else:
        raise ValueError(f"score average must be 'reference' or 'paper', got {average!r}")
    if empty_positions not in EMPTY_POSITIONS:
        raise ValueError(f"empty_positions must be one of {EMPTY_POSITIONS}, got {empty_positions!r}")
    counts = np.bincount(target, minlength=n)
    missing = np.flatnonzero(counts == 0)
    if missing.size and empty_positions == "error":
        raise ValueError(f"no calibration row has its ground truth at position(s) {missing.tolist()} "
                         "(calibration.empty_positions: zero takes a row of zeros there, as the reference does)")
    # Sum the rows of each ground-truth position with one scatter-add, then divide.
    sums = np.zeros((n, n))
    np.add.at(sums, target, values)
    mean = sums / np.maximum(counts, 1)[:, None]
    L = mean if average == "reference" else np.log(mean + EPS)
    L[missing] = 0.0
    return L


def empty_position_warnings(cal_target_pos: np.ndarray, n: int) -> list[str]:
    """The warning recorded where :func:`score_matrix` took a row of zeros for positions without rows."""
    missing = np.flatnonzero(np.bincount(np.ravel(cal_target_pos), minlength=n) == 0).tolist()
    if not missing:
        return []
    return [f"no calibration row has its ground truth at position(s) {missing}: their row of L is 0 "
            "(calibration.empty_positions = zero, the reference's)"]


def bias_matrix(L: np.ndarray) -> tuple[np.ndarray, float]:
    """Bias matrix ``B`` [N, N] and gain ``k`` from ``L`` (Eqs. 4-5).

    ``k = max_{i, j != i} (L[i, i] - L[i, j])`` is the log of the estimated visual gain
    ``gamma``, and ``B[i, j] = L[i, j] - k [i == j]`` is ``log P_bias(j | i)``: the
    score of position ``j`` when the ground truth is at ``i`` with the ground truth's
    own visual advantage removed.

    The reference implementation also subtracts one constant from every entry of ``B``.
    That changes no prediction: every use of ``B`` (PriDe's column mean, LAD's expected
    bias under either mixture, since the posterior sums to one) then shifts all ``N``
    corrected scores of a row by the same constant, and the argmax is shift-invariant.
    It is therefore not applied here.
    """
    L = np.asarray(L, dtype=np.float64)
    if L.ndim != 2 or L.shape[0] != L.shape[1] or L.shape[0] < 2:
        raise ValueError(f"L must be a square [N, N] matrix with N >= 2, got shape {L.shape}")
    off_diagonal = ~np.eye(L.shape[0], dtype=bool)
    gaps = np.diag(L)[:, None] - L  # gaps[i, j] = L[i, i] - L[i, j]
    k = float(gaps[off_diagonal].max())
    B = L - k * np.eye(L.shape[0])
    return B, k


def attention_prior(cal_attn: np.ndarray) -> np.ndarray:
    """Attention prior ``a_prior`` [Lyr, N] (Eq. 7): mean attention over every calibration row.

    Because every instance contributes all ``N`` cyclic shifts, each image (relevant or
    not) sits at each position equally often, so the mean isolates the positional part.
    """
    cal_attn = np.asarray(cal_attn, dtype=np.float64)
    if cal_attn.ndim != 4:
        raise ValueError(f"cal_attn must be [C, N(shift), Lyr, N], got shape {cal_attn.shape}")
    return cal_attn.mean(axis=(0, 1))


def pride_prior_reference(B: np.ndarray) -> np.ndarray:
    """PriDe prior of the reference implementation: the column mean ``g[j] = mean_i B[i, j]``."""
    return np.asarray(B, dtype=np.float64).mean(axis=0)


def pride_log(probabilities: np.ndarray, logs: str = PRIDE_ORIGINAL_LOGS[0]) -> np.ndarray:
    """``log p`` as the original PriDe takes it: ``log(p + 1e-10)`` ("floor") or exact ("exact")."""
    if logs not in PRIDE_ORIGINAL_LOGS:
        raise ValueError(f"pride_original_logs must be one of {PRIDE_ORIGINAL_LOGS}, got {logs!r}")
    return np.log(np.asarray(probabilities, dtype=np.float64) + (PRIDE_LOG_FLOOR if logs == "floor" else EPS))


def pride_prior_original(
    cal_scores: np.ndarray, cal_target_pos: np.ndarray | None = None, logs: str = PRIDE_ORIGINAL_LOGS[0]
) -> np.ndarray:
    """Log prior over positions of the original PriDe (Zheng et al., 2023) [N].

    For each calibration instance, the observed probabilities ``P_s(p)`` of position
    ``p`` under its cyclic shifts ``s`` (softmax of the scores over the ``N``
    candidates) are combined as a normalised geometric mean over the shifts:

        prior_c(p) = softmax_p( mean_s log P_s(p) ),

    which is the prior that, under PriDe's model ``P_s(p) ∝ prior(p) P_debiased(identity
    at p)``, cancels the content because every identity visits every position once.
    These per-instance priors (probabilities) are averaged over the instances, and the
    log of the average is returned, to be subtracted from test log-probabilities.
    ``logs="floor"`` (default, the original code) takes every log as ``log(p + 1e-10)``;
    ``"exact"`` exact logs (1e-20 guard). (The original's other 1e-10 terms, in two
    normalising denominators, scale all positions alike and change no prediction.) The
    estimate uses no labels: ``cal_target_pos`` is accepted for a uniform signature and
    only validated.
    """
    cal_scores = np.asarray(cal_scores, dtype=np.float64)
    if cal_target_pos is not None:
        _check_calibration_shapes(cal_scores, np.asarray(cal_target_pos))
    elif cal_scores.ndim != 3 or cal_scores.shape[1] != cal_scores.shape[2]:
        raise ValueError(f"cal_scores must be [C, N(shift), N(position)], got shape {cal_scores.shape}")
    if logs == "exact":
        log_observed = log_softmax(cal_scores, axis=-1)  # [C, S, N]
    else:
        log_observed = pride_log(np.exp(log_softmax(cal_scores, axis=-1)), logs)
    per_instance = np.exp(log_softmax(log_observed.mean(axis=1), axis=-1))  # [C, N]
    return pride_log(per_instance.mean(axis=0), logs)


@dataclass(frozen=True)
class Calibration:
    """Everything the test-time methods need from a calibration draw (formats.md §5).

    ``settings`` records how it was fitted (``n_cal``, ``seed``, ``average``, pool size);
    ``source`` the cache it was fitted on (``ladbench.inputs.cache_identity``).
    """

    instances: np.ndarray  # [|D_cal|] indices into the cache's calibration pool
    L: np.ndarray  # [N, N]
    B: np.ndarray  # [N, N]
    k: float
    attn_prior: np.ndarray  # [Lyr, N]
    pride_prior: np.ndarray  # [N] reference PriDe (column mean of B)
    pride_original_prior: np.ndarray  # [N] log prior of the original PriDe
    settings: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # where a fitting rule decided (recorded in the evaluation output)

    def to_npz(self, path: str | os.PathLike) -> None:
        """Write the arrays (names of formats.md §5) plus ``settings_*`` scalars, atomically."""
        settings = {f"settings_{key}": np.asarray(value) for key, value in self.settings.items()}
        if self.source:
            settings["source"] = np.asarray(json.dumps(self.source, sort_keys=True))
        if self.warnings:
            settings["warnings"] = np.asarray(json.dumps(list(self.warnings)))
        write_signed_npz(path, dict(
            instances=self.instances,
            L=self.L,
            B=self.B,
            k=np.asarray(self.k),
            attn_prior=self.attn_prior,
            pride_prior=self.pride_prior,
            pride_original_prior=self.pride_original_prior,
            **settings,
        ))

    @classmethod
    def from_npz(cls, path: str | os.PathLike) -> "Calibration":
        """Read a calibration written by :meth:`to_npz`; one-line errors name the file (a
        missing array; a file that is no .npz, whose CRC-32 checks fail or whose arrays are not
        what its content digest records)."""
        required = ("instances", "L", "B", "k", "attn_prior", "pride_prior", "pride_original_prior")
        data = read_signed_npz(path, "calibration file", "delete it and rerun the workflow (or `ladbench calibrate`) "
                               "to rebuild it")
        missing = [name for name in required if name not in data]
        arrays = {name: data[name] for name in required if name in data}
        settings = {name[len("settings_"):]: data[name].item() for name in data if name.startswith("settings_")}
        source = json.loads(data["source"].item()) if "source" in data else {}
        warnings = tuple(json.loads(data["warnings"].item())) if "warnings" in data else ()
        if missing:
            raise ValueError(f"calibration file {path}: missing array(s) {missing}")
        return cls(
            instances=arrays["instances"],
            L=arrays["L"],
            B=arrays["B"],
            k=float(arrays["k"]),
            attn_prior=arrays["attn_prior"],
            pride_prior=arrays["pride_prior"],
            pride_original_prior=arrays["pride_original_prior"],
            settings=settings,
            source=source,
            warnings=warnings,
        )


def fit_calibration(
    cal_scores: np.ndarray,
    cal_attn: np.ndarray,
    cal_target_pos: np.ndarray,
    n_cal: int,
    seed: int,
    average: ScoreAverage = "reference",
    source: CalibrationSource = "pool",
    pride_original_logs: str = PRIDE_ORIGINAL_LOGS[0],
    empty_positions: str = EMPTY_POSITIONS[0],
) -> Calibration:
    """Draw ``n_cal`` instances of the pool (``seed``; the first ones for ``source =
    "evaluation_head"``) and fit every calibration quantity."""
    cal_scores = np.asarray(cal_scores, dtype=np.float64)
    cal_attn = np.asarray(cal_attn, dtype=np.float64)
    cal_target_pos = np.asarray(cal_target_pos)
    _check_calibration_shapes(cal_scores, cal_target_pos)
    if cal_attn.shape[:2] != cal_scores.shape[:2] or cal_attn.shape[-1] != cal_scores.shape[-1]:
        raise ValueError(
            f"cal_attn shape {cal_attn.shape} does not match cal_scores {cal_scores.shape} "
            "(expected [C, N, Lyr, N])"
        )
    instances = draw_calibration_instances(cal_scores.shape[0], n_cal, seed, source)
    scores, attn, target = cal_scores[instances], cal_attn[instances], cal_target_pos[instances]
    L = score_matrix(scores, target, average, empty_positions)
    B, k = bias_matrix(L)
    return Calibration(
        instances=instances,
        L=L,
        B=B,
        k=k,
        attn_prior=attention_prior(attn),
        pride_prior=pride_prior_reference(B),
        pride_original_prior=pride_prior_original(scores, target, pride_original_logs),
        settings={"n_cal": int(n_cal), "seed": int(seed), "average": average, "n_pool": int(cal_scores.shape[0]),
                  "source": source, "pride_original_logs": pride_original_logs, "empty_positions": empty_positions},
        warnings=tuple(empty_position_warnings(target, L.shape[0])),
    )
