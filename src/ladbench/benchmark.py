"""Benchmark construction (METHOD §7): evaluation instances, a disjoint calibration pool, orderings.

Steps, all fixed by ``seed``:

1. Eligible images: rows of the image table with a finite image embedding (see
   ``--skip-bad-images`` of the features stage) and, for datasets with instance
   annotations, a non-empty category set. Datasets without categories (Flickr8k) keep
   every image.
2. Pool: ``pool_size`` eligible images drawn without replacement (all of them if there
   are fewer, with a note on stderr; the recorded ``pool_size`` is the actual one).
3. Targets: ``n_eval + n_calibration`` distinct pool images; the first ``n_eval`` are the
   evaluation targets, the rest the calibration targets, so no target image is shared.
   Steps 1-3 depend only on the table, the features and the seed: every setting and
   every N built from them has the same targets.
4. Distractors (``N - 1`` per target, distinct, never the target):
   - ``random``: uniform over the pool.
   - ``adversarial``: among pool images whose caption embedding has cosine similarity
     ``< caption_sim_max`` with the target's caption and that pass the category rule,
     the ``N - 1`` with the highest image-embedding cosine similarity to the target
     (ties broken by pool position). Category rule ``reference`` (default): skip a
     candidate whose category set contains the target's (target ⊆ candidate);
     ``paper``: skip only an identical category set. For a dataset without categories
     the category rule is disabled (recorded as ``"category_rule": "none"``) and only
     the caption-similarity rule applies.
   Mining is matrix work on blocks of targets: two [block, pool] similarity products
   and one [block, pool] category-overlap product, then a top-k per row.
5. The target plus its distractors are shuffled into the instance's base order.
6. Orderings (evaluation instances only): the identity plus ``T - 1`` distinct other
   random permutations of ``range(N)``. ``orderings="shared"`` (default, the reference
   implementation's protocol): ONE such list for the whole benchmark, applied to every
   instance, drawn as the reference's ``build_shuffles`` draws it (Python's ``random``
   seeded with ``seed``, ``random.sample`` of ``range(N)``, repeats skipped), so its
   "Acc ± std over orderings" is the spread over T fixed reorderings of the benchmark.
   ``"per_instance"``: each instance draws its own list (from the numpy stream of step 4).
   Every instance still carries its ``orderings`` (formats.md §3), so readers need not care.
7. Calibration instances: ``calibration_source="pool"`` (default) keeps the targets of
   step 3, disjoint from the evaluation set; ``"evaluation_head"`` (the reference's
   protocol) makes the calibration instances copies of the FIRST ``n_calibration``
   evaluation instances (their base order; the calibration stage then takes the first
   |D_cal| of them instead of a seeded draw). The evaluation set is the same either way.

``draw="reference"`` replaces steps 2, 3, 4 (random setting) and 5 by the draw of the
reference's ``data/build_eval_dataset.py`` (:func:`reference_draw`): Python's ``random``
seeded with ``seed``; the pool drawn by ``random.sample`` over the eligible images sorted
by file name; each sequence's anchor the first of ``random.sample(pool, N)`` (anchors may
repeat); random distractors by ``random.sample`` over the pool without the anchor; every
sequence shuffled once with ``random.shuffle``; ONE stream for the whole script, the
random set first and then the adversarial set, so the adversarial set depends on the
random one. Its evaluation instances are the script's sequences (``n_seq = n_eval``); the
adversarial distractors are mined as in step 4 (the script ranks the same way: stable
sort by image similarity, the pool order breaking ties). Calibration instances from the
``pool`` source continue the stream after the script's two sets (random, then
adversarial), an anchor that is an evaluation target of the same setting drawn again.

``similarity_dtype="float16"`` computes the mining's similarities as numpy computes the
dot product of two float16 vectors (the reference's ``np.dot`` on its float16 CLIP
features: products summed in float32 in index order, the sum rounded to float16), so its
exact ties, broken by pool position, come out as the reference's (:func:`float16_dot_estimate`).

The output (docs/formats.md §3) carries additive keys beyond the contract: ``pool_size``,
``n_eval``, ``n_calibration``, ``caption_sim_max`` and ``category_rule`` (adversarial),
``features`` (CLIP model and weights identity), ``ordering_scheme`` (``shared`` /
``per_instance``) with ``orderings`` (the shared list, shared only),
``calibration_source`` (``pool`` / ``evaluation_head``), ``draw`` (``distinct`` /
``reference``) and ``similarity_dtype`` (``float32`` / ``float16``).
"""

from __future__ import annotations

import math
import os
import random
import sys
from pathlib import PurePosixPath
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import numpy as np
from tqdm import tqdm

from ladbench.atomic import json_one_item_per_line, read_signed_json, signed
from ladbench.data.coco import table_fingerprint
from ladbench.settings import Settings, setting

SETTINGS = ("random", "adversarial")
CATEGORY_RULES = ("reference", "paper")
ORDERING_SCHEMES = ("shared", "per_instance")  # first: the default (the reference's)
CALIBRATION_SOURCES = ("pool", "evaluation_head")  # first: the default (disjoint from the evaluation set)
DRAWS = ("distinct", "reference")  # first: the default (distinct targets shared by both settings and every N)
SIMILARITY_DTYPES = ("float32", "float16")  # first: the default; float16: numpy's float16 dot, the reference's
_BLOCK = 256  # targets per similarity block: 256 x 20,000 float32 = 20 MB per matrix


class BenchmarkError(ValueError):
    """The benchmark cannot be built as asked; the message names the cause."""


# --- selection of images ----------------------------------------------------------------

def eligible_rows(categories: list[list[int]], image_emb: np.ndarray, has_categories: bool,
                  listed: list[bool] | None = None) -> np.ndarray:
    """Indices of rows that may enter the pool: finite embedding and, if the dataset has categories,
    at least one, or (``listed``: an image table row's ``categories_listed``) listed in the
    reference's category table with an empty set, which the reference pools too."""
    finite = np.isfinite(image_emb).all(axis=1)
    if has_categories:
        listed = listed or [False] * len(categories)
        finite &= np.array([len(c) > 0 or flag for c, flag in zip(categories, listed)], dtype=bool)
    return np.flatnonzero(finite)


def draw_pool(eligible: np.ndarray, pool_size: int, rng: np.random.Generator) -> np.ndarray:
    """``pool_size`` eligible rows without replacement, in draw order (all rows if fewer)."""
    if pool_size < 2:
        raise BenchmarkError(f"--pool-size must be >= 2, got {pool_size}")
    size = min(pool_size, len(eligible))
    return rng.choice(eligible, size=size, replace=False)


def draw_targets(pool_len: int, n_eval: int, n_calibration: int, rng: np.random.Generator) -> np.ndarray:
    """Distinct pool positions of the targets: the first ``n_eval`` for evaluation, the rest
    for calibration (so the two sets are disjoint)."""
    if n_eval < 1 or n_calibration < 0:
        raise BenchmarkError(f"--n-eval must be >= 1 and --n-calibration >= 0, got {n_eval}, {n_calibration}")
    if n_eval + n_calibration > pool_len:
        raise BenchmarkError(f"the pool has {pool_len} images but {n_eval} evaluation + {n_calibration} "
                             "calibration instances need that many distinct target images; lower "
                             "--n-eval/--n-calibration or use a larger dataset")
    return rng.choice(pool_len, size=n_eval + n_calibration, replace=False)


# --- distractors ------------------------------------------------------------------------

def random_distractors(targets: np.ndarray, pool_len: int, n_distractors: int, rng: np.random.Generator) -> np.ndarray:
    """[len(targets), n_distractors] distinct pool positions drawn uniformly, never the target itself."""
    out = np.empty((len(targets), n_distractors), dtype=np.int64)
    for row, target in enumerate(targets.tolist()):
        # Draw from the pool without the target, then shift positions past it by one.
        draw = rng.choice(pool_len - 1, size=n_distractors, replace=False)
        out[row] = draw + (draw >= target)
    return out


def category_matrix(categories: list[list[int]]) -> np.ndarray:
    """Multi-hot float32 matrix [M, C] over the category ids that occur (float: BLAS products stay exact for counts)."""
    ids = sorted({c for cats in categories for c in cats})
    column = {c: j for j, c in enumerate(ids)}
    matrix = np.zeros((len(categories), max(1, len(ids))), dtype=np.float32)
    for row, cats in enumerate(categories):
        matrix[row, [column[c] for c in cats]] = 1.0
    return matrix


def category_blocked(target_cats: np.ndarray, pool_cats: np.ndarray, rule: str) -> np.ndarray:
    """[T, P] True where the category rule forbids the pool image as a distractor of the target.

    ``reference``: target's set ⊆ candidate's set; ``paper``: the two sets are equal.
    """
    overlap = target_cats @ pool_cats.T  # |target ∩ candidate|, exact small integers
    target_size = target_cats.sum(axis=1, keepdims=True)
    contains_target = overlap == target_size
    if rule == "reference":
        return contains_target
    if rule == "paper":
        return contains_target & (pool_cats.sum(axis=1)[None, :] == target_size)
    raise BenchmarkError(f"--category-rule must be one of {CATEGORY_RULES}, got {rule!r}")


def top_k_by_row(scores: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the k largest entries per row, best first; ties go to the smaller index.

    ``argpartition`` finds the top k in linear time; rows with a tie at the k-th value
    (duplicate images) are redone with a stable sort so the choice is deterministic.
    """
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    kth_value = np.take_along_axis(scores, part, axis=1).min(axis=1, keepdims=True)
    tied = (scores >= kth_value).sum(axis=1) > k
    for row in np.flatnonzero(tied):
        part[row] = np.argsort(-scores[row], kind="stable")[:k]
    picked = np.take_along_axis(scores, part, axis=1)
    order = np.lexsort((part, -picked), axis=1)  # by score descending, then index ascending
    return np.take_along_axis(part, order, axis=1)


def hard_distractors(targets: np.ndarray, image_emb: np.ndarray, text_emb: np.ndarray,
                     pool_cats: np.ndarray | None, n_distractors: int, caption_sim_max: float,
                     category_rule: str, pool_ids: np.ndarray | None = None, block: int = _BLOCK,
                     similarity_dtype: str = SIMILARITY_DTYPES[0]) -> np.ndarray:
    """Adversarial distractors (METHOD §7): [len(targets), n_distractors] pool positions.

    ``image_emb``/``text_emb`` are the pool's L2-normalised embeddings [P, D];
    ``pool_cats`` the pool's multi-hot categories or None (rule disabled). A target with
    fewer than ``n_distractors`` admissible candidates is an error naming its image id
    (from ``pool_ids``, else its pool position). ``similarity_dtype``: ``float32`` products,
    or ``float16`` ones computed as numpy's float16 dot (the reference's arithmetic).
    """
    if similarity_dtype not in SIMILARITY_DTYPES:
        raise BenchmarkError(f"--similarity-dtype must be one of {SIMILARITY_DTYPES}, got {similarity_dtype!r}")
    image_emb = np.asarray(image_emb, dtype=similarity_dtype)
    text_emb = np.asarray(text_emb, dtype=similarity_dtype)
    out = np.empty((len(targets), n_distractors), dtype=np.int64)
    starts = range(0, len(targets), block)
    for start in tqdm(starts, desc="hard negatives", unit="block", file=sys.stderr, disable=len(starts) < 4):
        rows = targets[start:start + block]
        admissible = _similarity_below(text_emb[rows], text_emb, caption_sim_max)
        if pool_cats is not None:
            admissible &= ~category_blocked(pool_cats[rows], pool_cats, category_rule)
        admissible[np.arange(len(rows)), rows] = False  # never the target itself
        counts = admissible.sum(axis=1)
        if (counts < n_distractors).any():
            bad = int(np.flatnonzero(counts < n_distractors)[0])
            name = f"image id {int(pool_ids[rows[bad]])}" if pool_ids is not None else f"pool position {int(rows[bad])}"
            raise BenchmarkError(f"target {name} has only {int(counts[bad])} admissible hard negatives "
                                 f"(caption similarity < {caption_sim_max}, category rule {category_rule}) "
                                 f"but N - 1 = {n_distractors} are needed")
        out[start:start + len(rows)] = _most_similar(image_emb[rows], image_emb, admissible, n_distractors)
    return out


def _similarity_below(rows: np.ndarray, pool: np.ndarray, threshold: float) -> np.ndarray:
    """[R, P] True where the similarity of a row to a pool image is below ``threshold``."""
    if rows.dtype != np.float16:
        return (rows @ pool.T) < threshold
    estimate, margin = float16_dot_estimate(rows, pool)
    below = estimate + margin < threshold
    unsure = np.nonzero(~below & (estimate - margin < threshold))   # only pairs this close to the threshold
    below[unsure] = float16_dot_pairs(rows, pool, *unsure) < threshold
    return below


def _most_similar(rows: np.ndarray, pool: np.ndarray, admissible: np.ndarray, k: int) -> np.ndarray:
    """[R, k] admissible pool positions of the highest similarity per row, ties to the smaller position."""
    if rows.dtype != np.float16:
        return top_k_by_row(np.where(admissible, rows @ pool.T, -np.inf), k)
    estimate, margin = float16_dot_estimate(rows, pool)
    # k pairs have a value >= (k-th largest estimate) - margin; a pair whose estimate is more
    # than twice the margin below it is beaten by all of them.
    kth = -np.partition(np.where(admissible, -estimate, np.inf), k - 1, axis=1)[:, k - 1:k]
    contenders = np.nonzero(admissible & (estimate >= kth - 2 * margin))
    scores = np.full(estimate.shape, -np.inf)
    scores[contenders] = float16_dot_pairs(rows, pool, *contenders)
    return top_k_by_row(scores, k)


# --- float16 similarities as numpy computes them ----------------------------------------

_FLOAT32_UNIT_ROUNDOFF = 2.0 ** -24


def float16_dot_estimate(rows: np.ndarray, pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(estimate [R, P], margin [R, 1])``: ``|np.dot(rows[r], pool[p]) - estimate| <= margin[r]``
    for numpy's dot product of two float16 vectors.

    numpy multiplies the float16 values (exact in float32), sums the products in float32 in
    index order and rounds the sum to float16. The float32 sum is within
    ``gamma_(D-1) * sum_i |x_i y_i| <= gamma_(D-1) |x| |y|`` of the exact dot product
    (recursive summation; Higham, Accuracy and Stability of Numerical Algorithms, §4.2), and
    the final rounding moves it by at most half a float16 step (2^-11 relative, 2^-25 below
    float16's normal range). The estimate is a float64 product, accurate far beyond that (1 %
    of margin covers it). Only pairs that these margins leave in doubt need
    :func:`float16_dot_pairs`, so the mining costs one BLAS product per block, as in float32.
    """
    a, b = np.asarray(rows, np.float64), np.asarray(pool, np.float64)
    n = a.shape[1]
    gamma = 1.01 * (n - 1) * _FLOAT32_UNIT_ROUNDOFF / (1 - (n - 1) * _FLOAT32_UNIT_ROUNDOFF)
    reach = np.linalg.norm(a, axis=1, keepdims=True) * np.linalg.norm(b, axis=1).max(initial=0.0)  # >= sum |x_i y_i|
    # + n float32 subnormal steps: the absolute error of sums below float32's normal range
    summation = gamma * reach + n * 2.0 ** -149
    return a @ b.T, summation + 2.0 ** -11 * (reach + summation) + 2.0 ** -25


def float16_dot_pairs(rows: np.ndarray, pool: np.ndarray, row_index: np.ndarray, pool_index: np.ndarray) -> np.ndarray:
    """``np.dot(rows[r], pool[p])`` of float16 vectors for each pair, computed as numpy does
    (float32 products summed in index order, rounded to float16), as float64 [K]."""
    a = np.asarray(rows, np.float16)[row_index].astype(np.float32).T.copy()   # [D, K]: one row per step
    b = np.asarray(pool, np.float16)[pool_index].astype(np.float32).T.copy()
    total = np.zeros(a.shape[1], dtype=np.float32)
    for a_d, b_d in zip(a, b):
        total += a_d * b_d
    return total.astype(np.float16).astype(np.float64)


# --- orderings --------------------------------------------------------------------------

def require_orderings(n: int, t: int) -> None:
    """Raise unless ``t`` distinct orderings of ``n`` candidates exist (t <= n!)."""
    if t < 1:
        raise BenchmarkError(f"--n-orderings must be >= 1, got {t}")
    if math.factorial(n) < t:
        raise BenchmarkError(f"N = {n} candidates have only {math.factorial(n)} orderings, fewer than the "
                             f"{t} requested (--n-orderings); use --n-orderings <= {math.factorial(n)}")


def distinct_orderings(n: int, t: int, rng: np.random.Generator) -> list[list[int]]:
    """The identity followed by ``t - 1`` distinct non-identity random permutations of range(n)."""
    return _identity_then_distinct(n, t, lambda: rng.permutation(n).tolist())


def shared_orderings(n: int, t: int, seed: int) -> list[list[int]]:
    """One list of ``t`` orderings for a whole benchmark, as the reference draws it.

    The identity first, then permutations from ``random.Random(seed).sample(range(n), n)``,
    a repeat of one already drawn (the identity included) skipped. The reference seeds
    Python's global ``random`` with 42 (``transformers.set_seed``) and draws nothing else
    from it before its shuffles, so with ``seed = 42`` these are its orderings for this N and T.
    """
    rng = random.Random(seed)
    return _identity_then_distinct(n, t, lambda: rng.sample(list(range(n)), n))


def _identity_then_distinct(n: int, t: int, draw: Callable[[], list[int]]) -> list[list[int]]:
    """The identity, then permutations from ``draw()`` until there are ``t``, repeats skipped."""
    require_orderings(n, t)
    orderings = [list(range(n))]
    seen = {tuple(orderings[0])}
    while len(orderings) < t:
        perm = draw()
        if tuple(perm) not in seen:
            seen.add(tuple(perm))
            orderings.append(perm)
    return orderings


# --- the reference's draw ---------------------------------------------------------------

def reference_draw(n_eligible: int, pool_size: int, n_candidates: int, n_eval: int, n_calibration: int,
                   seed: int, setting: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """The reference's ``data/build_eval_dataset.py`` draw, for ``setting`` (module docstring).

    The script's population lists enter ``random.sample``/``random.shuffle`` only through
    their length and order, so index ranges of the same length draw exactly what it draws.
    Returns ``pool`` (indices into the eligible images sorted by file name, in draw order),
    ``targets`` [n_eval + n_calibration] (pool positions: the ``n_eval`` sequences of the
    script, then ``n_calibration`` more from the continuing stream), the random setting's
    ``distractors`` [.., N - 1] (pool positions, in draw order; None for adversarial) and
    ``shuffles`` [.., N] (base order position i shows member ``shuffles[i]`` of
    ``[target, *distractors]``).
    """
    if pool_size < 2:
        raise BenchmarkError(f"--pool-size must be >= 2, got {pool_size}")
    if n_eval < 1 or n_calibration < 0:
        raise BenchmarkError(f"--n-eval must be >= 1 and --n-calibration >= 0, got {n_eval}, {n_calibration}")
    rng = random.Random(seed)
    pool = rng.sample(range(n_eligible), min(pool_size, n_eligible))
    size = len(pool)
    if size < n_candidates:
        raise BenchmarkError(f"the pool has {size} images, fewer than N = {n_candidates} candidates")

    def sequence(mode: str, taken: set[int] | frozenset[int] = frozenset()) -> tuple[int, list[int] | None, list[int]]:
        anchor = rng.sample(range(size), n_candidates)[0]   # the script keeps the first of N pool images
        while anchor in taken:
            anchor = rng.sample(range(size), n_candidates)[0]
        distractors = None
        if mode == "random":   # random.sample over the pool without the anchor, in pool order
            distractors = [j + (j >= anchor) for j in rng.sample(range(size - 1), n_candidates - 1)]
        shuffle = list(range(n_candidates))
        rng.shuffle(shuffle)
        return anchor, distractors, shuffle

    drawn = {mode: [sequence(mode) for _ in range(n_eval)] for mode in SETTINGS}   # random first, as the script
    for mode in SETTINGS:   # calibration sequences continue the stream, away from the evaluation targets
        taken = {anchor for anchor, _, _ in drawn[mode]}
        if n_calibration and len(taken) == size:
            raise BenchmarkError(f"the {n_eval} evaluation instances use every image of the pool as a target, so "
                                 "no calibration target is left; use --calibration-source evaluation_head or a "
                                 "larger --pool-size")
        drawn[mode] += [sequence(mode, taken) for _ in range(n_calibration)]
    targets, distractors, shuffles = zip(*drawn[setting])
    return (np.asarray(pool, dtype=np.int64), np.asarray(targets, dtype=np.int64),
            np.asarray(distractors, dtype=np.int64) if setting == "random" else None,
            np.asarray(shuffles, dtype=np.int64))


def by_file_name(eligible: np.ndarray, rows: list[dict]) -> np.ndarray:
    """The eligible rows sorted by file name (the reference names images by their base name)."""
    names = [PurePosixPath(rows[r]["file_name"]).name for r in eligible.tolist()]
    if len(set(names)) < len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise BenchmarkError(f"--draw reference names images by file name, and {_listed(twice)} name more "
                             "than one image of the table")
    return eligible[sorted(range(len(names)), key=names.__getitem__)]


def _listed(items: list[str], shown: int = 3) -> str:
    return ", ".join(items[:shown]) + (f" (and {len(items) - shown} more)" if len(items) > shown else "")


# --- assembly ---------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchmarkSettings(Settings):
    """How a benchmark is drawn (config ``benchmarks``; the setting and N are the job's)."""

    section = "benchmarks"

    n_eval: int = setting(1000, "Evaluation instances per benchmark.", minimum=1)
    n_calibration: int = setting(
        100, "Calibration instances per benchmark, disjoint from the evaluation ones; |D_cal| instances are drawn "
        "from them (0: none; the config's calibration.n_cal needs at least that many).", minimum=0,
        key="n_calibration_pool", option="n_calibration")
    n_orderings: int = setting(5, "T: orderings per evaluation instance (identity first).", minimum=1)
    pool_size: int = setting(20000, "Images drawn (with categories) to build instances from.", minimum=2)
    seed: int = setting(42, "Seed; the same seed gives a byte-identical file.", minimum=0)
    ordering_seed: int | None = setting(
        None, "Seed of the orderings, apart from the draw's: the reference has two seeds (its evaluation's "
        "set_seed(42) draws the shared orderings, its build_eval_dataset.py --seed the instances); unset: the seed.",
        minimum=0, kind=int)
    caption_sim_max: float = setting(
        0.9, "Adversarial setting: a distractor's caption cosine similarity to the anchor's must be below this.")
    category_rule: str = setting(
        CATEGORY_RULES[0], "Adversarial setting: reference = skip a candidate whose category set contains the "
        "anchor's; paper = skip only an identical category set.", choices=CATEGORY_RULES)
    orderings: str = setting(
        ORDERING_SCHEMES[0], "shared (the reference implementation's protocol): one list of T orderings (the "
        "identity, then distinct permutations from Python's random seeded with the seed, as the reference's "
        "build_shuffles) applied to every instance, so Acc's std is the spread over T fixed reorderings; "
        "per_instance: each instance draws its own T orderings.", choices=ORDERING_SCHEMES)
    # the config's calibration.source: where the calibration instances come from
    calibration_source: str = setting(
        CALIBRATION_SOURCES[0], "pool: calibration instances disjoint from the evaluation set; evaluation_head (the "
        "reference's): the first n_calibration evaluation instances.", choices=CALIBRATION_SOURCES, config=False)
    draw: str = setting(
        DRAWS[0], "distinct: distinct targets drawn with numpy, shared by both settings and every N (paired "
        "comparisons across settings and N); reference: the reference's data/build_eval_dataset.py draw, instance "
        "for instance (Python's random seeded with the seed, anchors may repeat, one stream for the random set and "
        "then the adversarial set). docs/method.md explains both.", choices=DRAWS)
    similarity_dtype: str = setting(
        SIMILARITY_DTYPES[0], "Adversarial mining's similarities: float32, or float16 computed as numpy's float16 "
        "dot product (the reference's arithmetic on its float16 CLIP features, with its exact ties broken by pool "
        "order).", choices=SIMILARITY_DTYPES)


def build_benchmark(table: dict, features: dict, setting: str, n_candidates: int,
                    settings: BenchmarkSettings | None = None, *, dataset: str | None = None,
                    **changes: Any) -> dict:
    """Build one benchmark document (docs/formats.md §3) from an image table and its features.

    ``features`` holds ``image_id``, ``image_emb``, ``text_emb`` arrays aligned with
    ``table["images"]`` (see :func:`ladbench.features.load_features`) and optional ``attrs``;
    ``changes`` replace fields of ``settings`` (default :class:`BenchmarkSettings`).
    """
    if setting not in SETTINGS:
        raise BenchmarkError(f"--setting must be one of {SETTINGS}, got {setting!r}")
    try:
        chosen = replace(settings or BenchmarkSettings(), **changes)
    except ValueError as error:
        raise BenchmarkError(str(error)) from None
    n_eval, n_calibration, n_orderings = chosen.n_eval, chosen.n_calibration, chosen.n_orderings
    pool_size, seed, caption_sim_max, draw = chosen.pool_size, chosen.seed, chosen.caption_sim_max, chosen.draw
    category_rule, orderings, similarity_dtype = chosen.category_rule, chosen.orderings, chosen.similarity_dtype
    calibration_source = chosen.calibration_source
    if calibration_source == "evaluation_head" and n_calibration > n_eval:
        raise BenchmarkError(f"--calibration-source evaluation_head takes the first --n-calibration ({n_calibration}) "
                             f"evaluation instances, but there are only --n-eval = {n_eval}")
    if n_candidates < 2:
        raise BenchmarkError(f"--n-candidates must be >= 2 (a target and at least one distractor), got {n_candidates}")
    require_orderings(n_candidates, n_orderings)

    rows = table["images"]
    ids = np.array([row["image_id"] for row in rows], dtype=np.int64)
    if not np.array_equal(ids, np.asarray(features["image_id"], dtype=np.int64)):
        raise BenchmarkError("the features' image_id list differs from the image table's; "
                             "rebuild the features from this images.json")
    categories = [row["categories"] for row in rows]
    has_categories = bool(table.get("has_categories", any(categories)))

    eligible = eligible_rows(categories, np.asarray(features["image_emb"]), has_categories,
                             [bool(row.get("categories_listed")) for row in rows])
    drawn_distractors = shuffles = None
    if draw == "reference":
        stream_calibration = n_calibration if calibration_source == "pool" else 0
        pool_index, targets, drawn_distractors, shuffles = reference_draw(
            len(eligible), pool_size, n_candidates, n_eval, stream_calibration, seed, setting)
        pool = by_file_name(eligible, rows)[pool_index]
    else:
        rng = np.random.default_rng(seed)
        pool = draw_pool(eligible, pool_size, rng)
    if len(pool) < pool_size:
        print(f"benchmark: only {len(pool)} eligible images, the pool is all of them (asked {pool_size})",
              file=sys.stderr)
    if len(pool) < n_candidates:
        raise BenchmarkError(f"the pool has {len(pool)} images, fewer than N = {n_candidates} candidates")
    if draw != "reference":
        targets = draw_targets(len(pool), n_eval, n_calibration, rng)

    # Everything below depends on N and the setting; a separate stream keeps steps 1-3 shared.
    rng_n = np.random.default_rng([seed, n_candidates, SETTINGS.index(setting)])
    if setting == "random":
        distractors = (drawn_distractors if drawn_distractors is not None
                       else random_distractors(targets, len(pool), n_candidates - 1, rng_n))
        rule_used = None
    else:
        pool_cats = category_matrix([categories[r] for r in pool]) if has_categories else None
        rule_used = category_rule if has_categories else "none"
        distractors = hard_distractors(
            targets, np.asarray(features["image_emb"])[pool], np.asarray(features["text_emb"])[pool],
            pool_cats, n_candidates - 1, caption_sim_max, rule_used, pool_ids=ids[pool],
            similarity_dtype=similarity_dtype)

    # Base order: the target and its distractors shuffled (pool positions -> image ids).
    base_orders = []
    for index, target in enumerate(targets.tolist()):
        members = [target] + distractors[index].tolist()
        shuffle = shuffles[index].tolist() if shuffles is not None else rng_n.permutation(n_candidates).tolist()
        base_orders.append([int(ids[pool[members[j]]]) for j in shuffle])

    def instance(number: int, index: int) -> dict:
        row = pool[targets[index]]
        return {"id": number, "caption": rows[row]["caption"], "target": int(ids[row]),
                "candidates": base_orders[index]}

    eval_instances = [instance(number, number) for number in range(n_eval)]
    ordering_seed = seed if chosen.ordering_seed is None else chosen.ordering_seed
    shared = shared_orderings(n_candidates, n_orderings, ordering_seed) if orderings == "shared" else None
    # per instance: the draw's stream unless the orderings have their own seed
    rng_t = rng_n if chosen.ordering_seed is None else np.random.default_rng([ordering_seed, n_candidates,
                                                                               SETTINGS.index(setting)])
    for inst in eval_instances:
        inst["orderings"] = [list(o) for o in shared] if shared else distinct_orderings(n_candidates, n_orderings, rng_t)
    # evaluation_head: the first evaluation instances (the pool targets drawn in step 3 stay
    # unused, so the evaluation set is the same under both sources)
    first_cal_target = 0 if calibration_source == "evaluation_head" else n_eval
    cal_instances = [instance(number, first_cal_target + number) for number in range(n_calibration)]

    doc: dict[str, Any] = {
        "dataset": dataset if dataset is not None else table["dataset"], "setting": setting,
        "images_sha256": table_fingerprint(table),   # the image table it was drawn from
        "n_candidates": n_candidates, "seed": seed, "n_orderings": n_orderings,
        "pool_size": int(len(pool)), "n_eval": n_eval, "n_calibration": n_calibration,
        "ordering_scheme": orderings, "calibration_source": calibration_source,
        "draw": draw, "similarity_dtype": similarity_dtype,
    }
    if ordering_seed != seed:                 # recorded only where it differs: a default file is unchanged
        doc["ordering_seed"] = ordering_seed
    if shared:
        doc["orderings"] = shared
    if setting == "adversarial":
        doc["caption_sim_max"] = caption_sim_max
        doc["category_rule"] = rule_used
    attrs = features.get("attrs", {})
    doc["features"] = {key: _plain(attrs[key]) for key in ("model", "pretrained", "weights_sha256") if key in attrs}
    doc["eval"] = eval_instances
    doc["calibration"] = cal_instances
    return doc


def _plain(value: Any) -> Any:
    """HDF5 attributes come back as numpy scalars/bytes; JSON needs plain Python values."""
    if isinstance(value, bytes):
        return value.decode()
    return value.item() if hasattr(value, "item") else value


def format_benchmark(doc: dict) -> str:
    """JSON text with one instance per line: valid JSON, diff-friendly, deterministic, signed
    (``content_sha256``)."""
    return json_one_item_per_line(signed(doc), ["eval", "calibration"])


def load_benchmark(path: str | os.PathLike) -> dict:
    """Read a benchmark file written by :func:`format_benchmark` (any JSON reader works too),
    checked against its content digest."""
    bench = read_signed_json(path, "benchmark file", "rebuild it with `ladbench benchmark` (or delete it and rerun "
                             "the workflow)", BenchmarkError)
    problem = benchmark_problem(bench)
    if problem:
        raise BenchmarkError(f"{path}: {problem}; rebuild it with `ladbench benchmark`")
    return bench


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def benchmark_problem(bench: Mapping[str, Any]) -> str | None:
    """What makes a benchmark document impossible (a digest proves who wrote a file, not that it
    holds a benchmark: a re-signed file is checked too), or None: integer ids, image ids and
    sizes, ``n_candidates`` distinct candidates holding the target, orderings that are
    permutations of the positions."""
    n = bench.get("n_candidates")
    if not _is_int(n) or n < 2:
        return f"n_candidates must be an integer >= 2, got {n!r}"
    positions = list(range(n))
    for split in ("eval", "calibration"):
        instances = bench.get(split)
        if not isinstance(instances, list):
            return f"{split} must be a list of instances"
        for i, inst in enumerate(instances):
            where = f"{split}[{i}]"
            if not isinstance(inst, Mapping):
                return f"{where} is not an instance (a JSON object)"
            for key in ("id", "target"):
                if not _is_int(inst.get(key)) or inst[key] < 0:
                    return f"{where}.{key} must be a non-negative integer, got {inst.get(key)!r}"
            candidates = inst.get("candidates")
            if (not isinstance(candidates, list) or len(candidates) != n or not all(map(_is_int, candidates))
                    or len(set(candidates)) != n):
                return f"{where}.candidates must be {n} distinct image ids, got {candidates!r}"
            if inst["target"] not in candidates:
                return f"{where}.target {inst['target']} is not one of its candidates"
            if split == "eval" and (not isinstance(inst.get("orderings"), list) or not inst["orderings"]):
                return f"{where}.orderings must be a non-empty list of orderings"
            for t, ordering in enumerate(inst["orderings"] if split == "eval" else []):
                if not isinstance(ordering, list) or not all(map(_is_int, ordering)) or sorted(ordering) != positions:
                    return f"{where}.orderings[{t}] must be a permutation of 0..{n - 1}, got {ordering!r}"
    return None
