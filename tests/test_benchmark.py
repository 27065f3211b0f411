"""Benchmark construction: every constraint of METHOD §7 / docs/formats.md §3 on produced sets."""

from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest

from ladbench import benchmark as bm
from ladbench.cli import build_parser
from ladbench.data.coco import table_fingerprint, write_image_table


# --- fixtures ---------------------------------------------------------------------------

def _unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make_dataset(n: int = 300, d: int = 16, seed: int = 0, n_categories: int = 5, has_categories: bool = True):
    """A table + features pair: random unit embeddings (float16, as stored) and random category sets.

    Every 17th image has no category and every 29th a NaN image embedding (an unreadable
    image), so the pool filter is exercised.
    """
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(np.arange(1, 50 * n), size=n, replace=False))
    # Clusters of look-alike images whose captions are often near-duplicates too, so the
    # hard negatives of a target are exactly where the caption rule bites.
    cluster = rng.integers(0, n // 10, size=n)
    centres = _unit_rows(rng, n // 10, d)
    image = centres[cluster] + 0.3 * _unit_rows(rng, n, d)
    image /= np.linalg.norm(image, axis=1, keepdims=True)
    text = centres[cluster] + 0.35 * _unit_rows(rng, n, d)
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    rows = []
    for i in range(n):
        cats = [] if (not has_categories or i % 17 == 0) else \
            sorted(rng.choice(np.arange(1, n_categories + 1), size=int(rng.integers(1, 4)), replace=False).tolist())
        rows.append({"image_id": int(ids[i]), "file_name": f"{ids[i]}.jpg", "caption": f"caption {ids[i]}",
                     "categories": cats})
    image16 = image.astype(np.float16)
    image16[::29] = np.nan
    table = {"dataset": "toy", "image_root": "/nowhere", "has_categories": has_categories,
             "skipped_files": [], "images": rows}
    features = {"image_id": ids, "image_emb": image16, "text_emb": text.astype(np.float16),
                "attrs": {"model": "toy", "pretrained": "none", "weights_sha256": "0" * 64}}
    return table, features


@pytest.fixture(scope="module")
def toy():
    return make_dataset()


def index_of(table):
    return {row["image_id"]: i for i, row in enumerate(table["images"])}


# --- checks shared by both settings -----------------------------------------------------

def check_common(doc, table, features, n, n_eval, n_cal, t):
    idx = index_of(table)
    emb = features["image_emb"]
    assert doc["n_candidates"] == n and doc["n_orderings"] == t
    assert len(doc["eval"]) == n_eval and len(doc["calibration"]) == n_cal
    assert [inst["id"] for inst in doc["eval"]] == list(range(n_eval))
    assert [inst["id"] for inst in doc["calibration"]] == list(range(n_cal))
    eval_targets = [inst["target"] for inst in doc["eval"]]
    cal_targets = [inst["target"] for inst in doc["calibration"]]
    assert len(set(eval_targets)) == n_eval and len(set(cal_targets)) == n_cal
    assert not set(eval_targets) & set(cal_targets), "evaluation and calibration share a target"
    for inst in doc["eval"] + doc["calibration"]:
        cands = inst["candidates"]
        assert len(cands) == n and len(set(cands)) == n
        assert cands.count(inst["target"]) == 1
        assert inst["caption"] == table["images"][idx[inst["target"]]]["caption"]
        for image_id in cands:  # only eligible images: categories (when the dataset has them) and finite
            row = idx[image_id]
            assert np.isfinite(emb[row].astype(np.float32)).all()
            if table["has_categories"]:
                assert table["images"][row]["categories"]
    for inst in doc["eval"]:
        orderings = inst["orderings"]
        assert len(orderings) == t
        assert orderings[0] == list(range(n))
        assert all(sorted(o) == list(range(n)) for o in orderings)
        assert len({tuple(o) for o in orderings}) == t
    for inst in doc["calibration"]:
        assert "orderings" not in inst


@pytest.mark.parametrize("n", [2, 4, 8, 12])
def test_random_setting_constraints(toy, n):
    table, features = toy
    t = min(5, math.factorial(n))
    doc = bm.build_benchmark(table, features, "random", n, n_eval=60, n_calibration=20, n_orderings=t,
                             pool_size=200, seed=3)
    check_common(doc, table, features, n, 60, 20, t)
    assert doc["pool_size"] == 200


def test_random_distractors_are_uniform_and_never_the_target():
    rng = np.random.default_rng(0)
    targets = np.array([0, 5, 9] * 4000)
    draws = bm.random_distractors(targets, 10, 3, rng)
    assert (draws != targets[:, None]).all()
    assert all(len(set(row)) == 3 for row in draws.tolist())
    # Each of the 9 non-target positions should be drawn with probability 3/9.
    for target in (0, 5, 9):
        rows = draws[targets == target]
        freq = np.bincount(rows.ravel(), minlength=10) / len(rows)
        expected = np.full(10, 3 / 9)
        expected[target] = 0
        assert np.abs(freq - expected).max() < 0.03


def brute_force_hard_negatives(table, features, pool_ids, target_id, k, sim_max, rule, has_categories,
                               dtype="float32"):
    """Reference oracle: per-pair Python loop, set semantics for categories; similarities in float64
    (``float32``: the float32 products agree away from ties) or numpy's own float16 ``np.dot``
    (``float16``, the reference's), ties broken by pool position."""
    idx = index_of(table)
    t = idx[target_id]

    def dot(name, c):
        if dtype == "float16":
            return float(np.dot(features[name][c].astype(np.float16), features[name][t].astype(np.float16)))
        return float(features[name][c].astype(np.float64) @ features[name][t].astype(np.float64))
    t_cats = set(table["images"][t]["categories"])
    scored = []
    for position, cand_id in enumerate(pool_ids):
        if cand_id == target_id:
            continue
        c = idx[cand_id]
        if dot("text_emb", c) >= sim_max:
            continue
        c_cats = set(table["images"][c]["categories"])
        if has_categories and ((rule == "reference" and t_cats <= c_cats) or (rule == "paper" and t_cats == c_cats)):
            continue
        scored.append((-dot("image_emb", c), position, cand_id))
    scored.sort()
    return [cand for _, _, cand in scored[:k]], scored


@pytest.mark.parametrize("dtype", bm.SIMILARITY_DTYPES)
@pytest.mark.parametrize("rule", ["reference", "paper"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_adversarial_matches_brute_force_oracle(toy, rule, n, dtype):
    table, features = toy
    doc = bm.build_benchmark(table, features, "adversarial", n, n_eval=40, n_calibration=10,
                             n_orderings=min(5, math.factorial(n)), pool_size=150, seed=7,
                             caption_sim_max=0.9, category_rule=rule, similarity_dtype=dtype)
    check_common(doc, table, features, n, 40, 10, min(5, math.factorial(n)))
    assert doc["category_rule"] == rule and doc["caption_sim_max"] == 0.9
    # Recover the pool exactly as documented: eligible rows, seeded draw.
    eligible = bm.eligible_rows([r["categories"] for r in table["images"]], features["image_emb"], True)
    pool_rows = np.random.default_rng(7).choice(eligible, size=150, replace=False)
    pool_ids = [table["images"][r]["image_id"] for r in pool_rows]
    constrained = 0
    for inst in doc["eval"] + doc["calibration"]:
        expected, scored = brute_force_hard_negatives(table, features, pool_ids, inst["target"], n - 1, 0.9, rule, True,
                                                      dtype)
        got = sorted(set(inst["candidates"]) - {inst["target"]})
        # Guard the oracle against float ties at the boundary (float32 BLAS vs float64 loop); float16's
        # exact ties are broken by pool position in both.
        if len(scored) > n - 1 and dtype == "float32":
            assert scored[n - 1][0] - scored[n - 2][0] > 1e-6
        assert got == sorted(expected)
        unconstrained, _ = brute_force_hard_negatives(table, features, pool_ids, inst["target"], n - 1, 9.0, rule, False)
        constrained += sorted(unconstrained) != sorted(expected)
    assert constrained > 0, "the fixture never exercised the caption/category rules"


def test_adversarial_constraints_hold_pairwise(toy):
    table, features = toy
    idx = index_of(table)
    doc = bm.build_benchmark(table, features, "adversarial", 6, n_eval=50, n_calibration=10,
                             pool_size=220, seed=1, caption_sim_max=0.85, category_rule="reference")
    for inst in doc["eval"] + doc["calibration"]:
        t = idx[inst["target"]]
        t_cats = set(table["images"][t]["categories"])
        for cand in inst["candidates"]:
            if cand == inst["target"]:
                continue
            c = idx[cand]
            sim = float(features["text_emb"][c].astype(np.float32) @ features["text_emb"][t].astype(np.float32))
            assert sim < 0.85 + 1e-6
            assert not t_cats <= set(table["images"][c]["categories"])


def test_category_rules_on_a_hand_example():
    # target {1}; candidates {1} (same set), {1,2} (superset), {2} (disjoint), {1} again
    target = bm.category_matrix([[1], [1], [1, 2], [2], [1]])
    pool = target
    ref = bm.category_blocked(pool[:1], pool, "reference")[0]
    paper = bm.category_blocked(pool[:1], pool, "paper")[0]
    assert ref.tolist() == [True, True, True, False, True]
    assert paper.tolist() == [True, True, False, False, True]
    # target {1, 2}: a candidate {1} is not a superset, {1, 2, 3} is.
    cats = bm.category_matrix([[1, 2], [1], [1, 2, 3]])
    assert bm.category_blocked(cats[:1], cats, "reference")[0].tolist() == [True, False, True]
    assert bm.category_blocked(cats[:1], cats, "paper")[0].tolist() == [True, False, False]


def test_planted_hard_negatives_are_found():
    """Image 0 is the target; 1 and 2 look like it but 1's caption is too close; 3, 4 are far."""
    image = np.array([[1, 0, 0], [0.99, 0.141, 0], [0.95, 0, 0.312], [0, 1, 0], [0, 0, 1]], dtype=np.float32)
    image /= np.linalg.norm(image, axis=1, keepdims=True)
    text = np.array([[1, 0, 0], [0.95, 0.312, 0], [0.5, 0.866, 0], [0, 1, 0], [0, 0, 1]], dtype=np.float32)
    got = bm.hard_distractors(np.array([0]), image, text, None, 2, 0.9, "reference")
    # 3 and 4 are both orthogonal to the target: a tie, broken by the smaller index.
    assert got.tolist() == [[2, 3]]
    # exactly as many admissible candidates as distractors needed: all of them, best first
    assert bm.hard_distractors(np.array([0]), image, text, None, 3, 0.9, "reference").tolist() == [[2, 3, 4]]


@pytest.mark.parametrize("dtype", bm.SIMILARITY_DTYPES)
def test_a_caption_exactly_at_the_threshold_is_not_below_it(dtype):
    """METHOD §7: a distractor's caption similarity must be *below* caption_sim_max. Image 1 looks
    most like the target and its caption's similarity is exactly 0.5 (exact in float16 too), so at
    a threshold of 0.5 it is skipped in both arithmetics, and taken just above it."""
    image = np.array([[1, 0, 0], [0.9, 0.1, 0], [0.8, 0, 0.2], [0, 1, 0]])
    image /= np.linalg.norm(image, axis=1, keepdims=True)
    text = np.array([[1, 0, 0], [0.5, 0.75, 0], [0, 1, 0], [0, 0, 1]])

    def mine(threshold):
        return bm.hard_distractors(np.array([0]), image, text, None, 1, threshold, "reference",
                                   similarity_dtype=dtype).tolist()
    assert mine(0.5) == mine(0.4999) == [[2]]   # 0.4999: float16's margin alone must not admit it
    assert mine(0.5001) == [[1]]


def test_the_smallest_pool_and_a_pool_used_up_by_targets_are_accepted():
    """A pool of 2 images is the least a benchmark needs (N = 2), and the targets may take every
    pool image; no evaluation instance, a negative count, or one target more than the pool is refused."""
    rng = np.random.default_rng(0)
    assert sorted(bm.draw_pool(np.array([5, 9]), 2, rng).tolist()) == [5, 9]
    assert sorted(bm.draw_targets(6, 4, 2, rng).tolist()) == list(range(6))
    assert len(bm.draw_targets(6, 6, 0, rng)) == 6 and len(bm.draw_targets(6, 1, 0, rng)) == 1
    for n_eval, n_calibration in [(0, 2), (3, -1), (4, 3)]:
        with pytest.raises(bm.BenchmarkError):
            bm.draw_targets(6, n_eval, n_calibration, rng)
    table, features = make_dataset(n=40)
    for draw in bm.DRAWS:
        doc = bm.build_benchmark(table, features, "random", 2, n_eval=1, n_calibration=1, pool_size=2, n_orderings=2,
                                 draw=draw)
        assert doc["pool_size"] == 2 and doc["eval"][0]["target"] != doc["calibration"][0]["target"]
    pool, targets, _, _ = bm.reference_draw(2, 2, 2, 1, 0, 0, "random")
    assert sorted(pool.tolist()) == [0, 1] and targets.shape == (1,)
    for n_eval, n_calibration in [(0, 2), (3, -1)]:
        with pytest.raises(bm.BenchmarkError, match="--n-eval must be >= 1"):
            bm.reference_draw(10, 10, 2, n_eval, n_calibration, 0, "random")
    with pytest.raises(bm.BenchmarkError, match="fewer than N = 3"):
        bm.reference_draw(10, 2, 3, 1, 0, 0, "random")


def test_a_pool_smaller_than_asked_is_noted_and_a_full_one_is_not(capsys):
    table, features = make_dataset(n=40)
    eligible = len(bm.eligible_rows([r["categories"] for r in table["images"]], features["image_emb"], True))
    for pool_size, noted in [(eligible, False), (eligible + 1, True)]:
        doc = bm.build_benchmark(table, features, "random", 2, n_eval=2, n_calibration=0, pool_size=pool_size,
                                 n_orderings=2)
        assert doc["pool_size"] == eligible
        assert (f"only {eligible} eligible images" in capsys.readouterr().err) is noted


def test_top_k_ties_go_to_smaller_index():
    scores = np.array([[0.5, 0.9, 0.5, 0.9, 0.1, 0.5]])
    assert bm.top_k_by_row(scores, 3).tolist() == [[1, 3, 0]]
    assert bm.top_k_by_row(scores, 2).tolist() == [[1, 3]]


def test_dataset_without_categories_uses_caption_rule_only():
    table, features = make_dataset(n=120, has_categories=False)
    doc = bm.build_benchmark(table, features, "adversarial", 4, n_eval=30, n_calibration=5, pool_size=100,
                             seed=2, category_rule="reference")
    assert doc["category_rule"] == "none"
    check_common(doc, table, features, 4, 30, 5, 5)
    eligible = bm.eligible_rows([r["categories"] for r in table["images"]], features["image_emb"], False)
    assert len(eligible) == 120 - len(range(0, 120, 29))  # only the NaN rows leave
    pool_rows = np.random.default_rng(2).choice(eligible, size=100, replace=False)
    pool_ids = [table["images"][r]["image_id"] for r in pool_rows]
    for inst in doc["eval"]:
        expected, _ = brute_force_hard_negatives(table, features, pool_ids, inst["target"], 3, 0.9, "reference", False)
        assert sorted(set(inst["candidates"]) - {inst["target"]}) == sorted(expected)


def test_same_seed_gives_identical_text_and_targets_shared_across_settings(toy):
    table, features = toy
    kwargs = dict(n_eval=30, n_calibration=10, pool_size=180, seed=11)
    a = bm.format_benchmark(bm.build_benchmark(table, features, "adversarial", 4, **kwargs))
    b = bm.format_benchmark(bm.build_benchmark(table, features, "adversarial", 4, **kwargs))
    assert a == b
    other = bm.format_benchmark(bm.build_benchmark(table, features, "adversarial", 4, **{**kwargs, "seed": 12}))
    assert other != a
    doc_a = json.loads(a)
    doc_r = bm.build_benchmark(table, features, "random", 8, **kwargs)
    assert [i["target"] for i in doc_a["eval"]] == [i["target"] for i in doc_r["eval"]]
    assert [i["target"] for i in doc_a["calibration"]] == [i["target"] for i in doc_r["calibration"]]


def test_orderings_identity_first_and_distinct():
    rng = np.random.default_rng(0)
    for n, t in [(2, 2), (3, 6), (4, 5), (12, 5)]:
        orderings = bm.distinct_orderings(n, t, rng)
        assert orderings[0] == list(range(n)) and len({tuple(o) for o in orderings}) == t
    with pytest.raises(bm.BenchmarkError, match="only 2 orderings"):
        bm.distinct_orderings(2, 5, rng)


def test_shared_orderings_are_the_reference_shuffles_by_hand():
    # random.seed(42); random.sample(range(4), 4) five times gives [0,3,1,2], [1,0,2,3],
    # [3,0,2,1], [1,0,2,3] (a repeat, skipped), [3,0,1,2]: the reference's build_shuffles(5, 4).
    assert bm.shared_orderings(4, 5, 42) == [[0, 1, 2, 3], [0, 3, 1, 2], [1, 0, 2, 3], [3, 0, 2, 1], [3, 0, 1, 2]]
    assert bm.shared_orderings(2, 2, 42) == [[0, 1], [1, 0]]
    with pytest.raises(bm.BenchmarkError, match="only 2 orderings"):
        bm.shared_orderings(2, 3, 42)


def test_shared_and_per_instance_orderings_are_recorded_and_keep_the_instances(toy):
    table, features = toy
    kwargs = dict(n_eval=30, n_calibration=10, pool_size=180, seed=42)
    shared = bm.build_benchmark(table, features, "random", 4, **kwargs)  # default: shared
    per_instance = bm.build_benchmark(table, features, "random", 4, orderings="per_instance", **kwargs)
    assert shared["ordering_scheme"] == "shared" and per_instance["ordering_scheme"] == "per_instance"
    assert shared["orderings"] == bm.shared_orderings(4, 5, 42) and "orderings" not in per_instance
    assert all(inst["orderings"] == shared["orderings"] for inst in shared["eval"])
    assert len({json.dumps(inst["orderings"]) for inst in per_instance["eval"]}) > 1
    strip = [{k: v for k, v in inst.items() if k != "orderings"} for inst in shared["eval"]]
    assert strip == [{k: v for k, v in inst.items() if k != "orderings"} for inst in per_instance["eval"]]
    assert shared["calibration"] == per_instance["calibration"]
    json.loads(bm.format_benchmark(shared))


def test_evaluation_head_calibration_copies_the_first_evaluation_instances(toy):
    table, features = toy
    kwargs = dict(n_eval=30, n_calibration=10, pool_size=180, seed=42)
    pool = bm.build_benchmark(table, features, "adversarial", 4, **kwargs)
    head = bm.build_benchmark(table, features, "adversarial", 4, calibration_source="evaluation_head", **kwargs)
    assert pool["calibration_source"] == "pool" and head["calibration_source"] == "evaluation_head"
    assert head["eval"] == pool["eval"]  # the evaluation set does not depend on the source
    assert [{k: v for k, v in inst.items() if k != "orderings"} for inst in head["eval"][:10]] == head["calibration"]
    with pytest.raises(bm.BenchmarkError, match="only --n-eval = 5"):
        bm.build_benchmark(table, features, "random", 4, n_eval=5, n_calibration=10, pool_size=180,
                           calibration_source="evaluation_head")
    every = bm.build_benchmark(table, features, "random", 4, n_eval=5, n_calibration=5, pool_size=180,
                               calibration_source="evaluation_head")   # all of them may calibrate
    assert [i["candidates"] for i in every["eval"]] == [i["candidates"] for i in every["calibration"]]


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_candidates=1), "must be >= 2"),
    (dict(n_candidates=2, n_orderings=5), "only 2 orderings"),
    (dict(n_candidates=4, n_eval=250, n_calibration=100), "distinct target images"),
    (dict(n_candidates=4, pool_size=3), "fewer than N = 4"),
    (dict(n_candidates=4, setting="hard"), "--setting"),
    (dict(n_candidates=4, category_rule="loose"), "category_rule must be one of"),
])
def test_bad_requests_raise_clear_errors(toy, kwargs, message):
    table, features = toy
    args = dict(setting="random", n_eval=10, n_calibration=5, pool_size=100, seed=0)
    args.update(kwargs)
    with pytest.raises(bm.BenchmarkError, match=message):
        bm.build_benchmark(table, features, **args)


def test_too_few_hard_negatives_names_the_target(toy):
    table, features = toy
    with pytest.raises(bm.BenchmarkError, match=r"target image id \d+ has only"):
        bm.build_benchmark(table, features, "adversarial", 4, n_eval=10, n_calibration=1, pool_size=100,
                           caption_sim_max=-1.0)


def test_features_must_match_the_table(toy):
    table, features = toy
    shuffled = dict(features, image_id=features["image_id"][::-1])
    with pytest.raises(bm.BenchmarkError, match="image_id"):
        bm.build_benchmark(table, shuffled, "random", 4, n_eval=5, n_calibration=1)


def test_cli_writes_byte_identical_files(tmp_path, toy):
    table, features = toy
    write_image_table(table, tmp_path / "images.json")
    with h5py.File(tmp_path / "features.h5", "w") as h5:
        h5["image_id"] = features["image_id"]
        h5["image_emb"] = features["image_emb"]
        h5["text_emb"] = features["text_emb"]
        h5["done"] = np.ones(len(features["image_id"]), dtype=bool)
        h5.attrs.update(features["attrs"])
        h5.attrs["table_sha256"] = table_fingerprint(table)  # the features of this table
        h5.attrs["complete"] = True
    parser = build_parser(only="benchmark")
    outputs = []
    for name in ("a.json", "b.json"):
        args = parser.parse_args(["benchmark", "--images", str(tmp_path / "images.json"), "--features",
                                  str(tmp_path / "features.h5"), "--setting", "adversarial", "--n-candidates", "4",
                                  "--n-eval", "20", "--n-calibration", "5", "--pool-size", "150",
                                  "--out", str(tmp_path / name)])
        args.func(args)
        outputs.append((tmp_path / name).read_bytes())
    assert outputs[0] == outputs[1]
    doc = json.loads(outputs[0])
    assert doc["features"]["model"] == "toy" and doc["dataset"] == "toy"
    check_common(doc, table, features, 4, 20, 5, 5)
    assert not list(tmp_path.glob("*.tmp"))
