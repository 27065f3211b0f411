"""`benchmarks.draw: reference`: the instances of the reference's data/build_eval_dataset.py.

Written from its documented behaviour (docs/method.md, "Benchmarks"): Python's `random`
seeded; the pool by `random.sample` over the sorted names of the images with categories;
each sequence's anchor the first of `random.sample(pool, N)`; random distractors by
`random.sample` over the pool without the anchor; hard negatives ranked by a stable sort
of float16 `np.dot` similarities; `random.shuffle` once per sequence; one stream, the
random set first and then the adversarial set.
"""

from __future__ import annotations

import json
import random

import h5py
import numpy as np
import pytest

from ladbench import benchmark as bm
from ladbench.cli import build_parser
from ladbench.data.coco import table_fingerprint, write_image_table

# --- a hand-computed draw ---------------------------------------------------------------
#
# Six images; sorted by file name they are a(12) b(14) c(11) d(15) e(13) f(10). With seed 0:
#   random.sample(range(6), 4)            -> [3, 5, 0, 1]: the pool is d f a b
#   random set, sequence 0: sample(range(4), 3) -> [3, 1, 2]: anchor b; the pool without b
#     (d f a): sample(range(3), 2) -> [1, 2]: f a; shuffle([b, f, a]) by [1, 0, 2] -> f b a
#   sequence 1: [1, 3, 0]: anchor f; pool without f (d a b): [0, 1]: d a; [1, 0, 2] -> d f a
#   adversarial set, sequence 0: [2, 0, 3]: anchor a; shuffle [0, 1, 2]
#   sequence 1: [3, 2, 0]: anchor b; shuffle [0, 2, 1]
# Image embeddings at angles a 0, b 10, d 30, f 60 degrees (c, e are not in the pool): a's two
# most similar are b, d (members a b d, order kept); b's are a, d (members b a d -> b d a).
# Captions are orthogonal and every category set different, so neither rule excludes anyone.

HAND_NAMES = {10: "f.jpg", 11: "c.jpg", 12: "a.jpg", 13: "e.jpg", 14: "b.jpg", 15: "d.jpg"}
HAND_ANGLES = {"a": 0, "b": 10, "c": 45, "d": 30, "e": 80, "f": 60}


def hand_dataset():
    ids = sorted(HAND_NAMES)
    angles = np.radians([HAND_ANGLES[HAND_NAMES[i][0]] for i in ids])
    image = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    text = np.eye(len(ids))
    rows = [{"image_id": i, "file_name": HAND_NAMES[i], "caption": f"caption {HAND_NAMES[i][0]}",
             "categories": [k + 1]} for k, i in enumerate(ids)]
    table = {"dataset": "hand", "image_root": "/nowhere", "has_categories": True, "images": rows}
    features = {"image_id": np.array(ids), "image_emb": image.astype(np.float16), "text_emb": text.astype(np.float16)}
    return table, features


def reference(table, features, setting, **kwargs):
    args = dict(n_candidates=3, n_eval=2, n_calibration=0, n_orderings=1, pool_size=4, seed=0,
                calibration_source="evaluation_head", draw="reference", similarity_dtype="float16")
    return bm.build_benchmark(table, features, setting, **{**args, **kwargs})


def test_the_reference_draw_by_hand():
    table, features = hand_dataset()
    random_set = reference(table, features, "random")
    assert [(i["target"], i["candidates"]) for i in random_set["eval"]] == [(14, [10, 14, 12]), (10, [15, 10, 12])]
    adversarial = reference(table, features, "adversarial")
    assert [(i["target"], i["candidates"]) for i in adversarial["eval"]] == [(12, [12, 14, 15]), (14, [14, 15, 12])]
    assert adversarial["eval"][0]["caption"] == "caption a"
    assert random_set["draw"] == "reference" and random_set["similarity_dtype"] == "float16"
    # one stream: the adversarial set follows the random set, so it depends on its length
    shorter = reference(table, features, "adversarial", n_eval=1)
    assert shorter["eval"][0]["target"] != adversarial["eval"][0]["target"]


def test_a_pool_of_every_eligible_image_by_hand():
    # c and e without categories: the eligible names are a b d f. With seed 42 and N = 2:
    #   random.sample(range(4), 10 -> 4) -> [0, 3, 1, 2]: the pool is a f b d
    #   random:      [1, 0]: anchor f; pool without f (a b d): sample(range(3), 1) -> [2]: d;
    #                shuffle([f, d]) by [1, 0] -> d f.   [0, 2]: anchor a; [1]: b; -> b a
    #   adversarial: [0, 3]: anchor a, most similar b; [1, 0] -> b a.
    #                [1, 2]: anchor f, most similar d (30 degrees apart); [1, 0] -> d f
    table, features = hand_dataset()
    for row in table["images"]:
        if row["file_name"] in ("c.jpg", "e.jpg"):
            row["categories"] = []
    kwargs = dict(n_candidates=2, pool_size=10, seed=42)
    random_set, adversarial = (reference(table, features, setting, **kwargs) for setting in bm.SETTINGS)
    assert random_set["pool_size"] == 4
    assert [(i["target"], i["candidates"]) for i in random_set["eval"]] == [(10, [15, 10]), (12, [14, 12])]
    assert [(i["target"], i["candidates"]) for i in adversarial["eval"]] == [(12, [14, 12]), (10, [15, 10])]


# --- the documented procedure, transcribed on names, against the vectorised draw ---------

def script_draw(table, features, n, n_seq, pool_size, seed, caption_sim_max=0.9):
    """The reference's documented draw, step by step on file names (both sets, one stream)."""
    rows = {row["file_name"]: (k, row) for k, row in enumerate(table["images"])}
    image, text = features["image_emb"], features["text_emb"]
    names = sorted(name for name, (_, row) in rows.items() if row["categories"])
    rng = random.Random(seed)
    pool = rng.sample(names, min(pool_size, len(names)))
    sets = {}
    for mode in ("random", "adversarial"):
        sets[mode] = []
        for _ in range(n_seq):
            anchor = rng.sample(pool, n)[0]
            (a, row) = rows[anchor]
            if mode == "random":
                negatives = rng.sample([p for p in pool if p != anchor], n - 1)
            else:
                scored = []
                for p in pool:
                    (c, other) = rows[p]
                    if p == anchor or set(row["categories"]) <= set(other["categories"]):
                        continue
                    if float(np.dot(text[a], text[c])) < caption_sim_max:
                        scored.append((p, float(np.dot(image[a], image[c]))))
                scored.sort(key=lambda item: item[1], reverse=True)
                negatives = [p for p, _ in scored[:n - 1]]
            sequence = [anchor, *negatives]
            rng.shuffle(sequence)
            sets[mode].append({"caption": row["caption"], "target": row["image_id"],
                               "candidates": [rows[p][1]["image_id"] for p in sequence]})
    return sets


def tied_dataset(n_images=90, seed=0):
    """Near-duplicate clusters on a coarse grid: many float16 similarities tie exactly; file
    names sort differently from image ids; every 7th image has no category."""
    rng = np.random.default_rng(seed)
    ids = np.arange(100, 100 + n_images)
    centres = rng.integers(-4, 5, size=(6, 6)).astype(float)
    member = rng.integers(0, len(centres), size=n_images)
    image = centres[member] + rng.integers(-1, 2, size=(n_images, 6)) * 0.25
    text = centres[member] + rng.normal(size=(n_images, 6))
    unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)  # noqa: E731
    rows = [{"image_id": int(i), "file_name": f"{rng.integers(1000, 9999)}_{i}.jpg", "caption": f"caption {i}",
             "categories": [] if k % 7 == 3 else
             sorted(rng.choice(np.arange(1, 5), size=int(rng.integers(1, 3)), replace=False).tolist())}
            for k, i in enumerate(ids)]
    table = {"dataset": "tied", "image_root": "/nowhere", "has_categories": True, "images": rows}
    return table, {"image_id": ids, "image_emb": unit(image), "text_emb": unit(text)}


@pytest.mark.parametrize("n, n_seq, pool_size, seed", [(2, 5, 10, 0), (4, 40, 60, 42), (6, 25, 77, 3), (3, 30, 500, 9)])
def test_the_reference_draw_is_the_documented_procedure(n, n_seq, pool_size, seed):
    table, features = tied_dataset()
    expected = script_draw(table, features, n, n_seq, pool_size, seed)
    for setting in bm.SETTINGS:
        doc = reference(table, features, setting, n_candidates=n, n_eval=n_seq, pool_size=pool_size, seed=seed)
        assert [{k: i[k] for k in ("caption", "target", "candidates")} for i in doc["eval"]] == expected[setting]


def test_float32_similarities_break_the_ties_otherwise():
    """The fixture has exact float16 ties that float32 similarities order differently (so the
    test above depends on similarity_dtype: float16)."""
    table, features = tied_dataset()
    expected = script_draw(table, features, 6, 25, 77, 3)["adversarial"]
    doc = reference(table, features, "adversarial", n_candidates=6, n_eval=25, pool_size=77, seed=3,
                    similarity_dtype="float32")
    assert [i["candidates"] for i in doc["eval"]] != [i["candidates"] for i in expected]


def test_calibration_from_the_pool_continues_the_stream():
    table, features = tied_dataset()
    kwargs = dict(n_candidates=4, n_eval=20, n_calibration=8, pool_size=60, seed=5)
    head = reference(table, features, "random", **kwargs)
    pool = reference(table, features, "random", **{**kwargs, "calibration_source": "pool"})
    assert pool["eval"] == head["eval"]                   # the script's sequences either way
    evaluation_targets = {i["target"] for i in pool["eval"]}
    assert not evaluation_targets & {i["target"] for i in pool["calibration"]}
    assert len(pool["calibration"]) == 8


def test_the_reference_draw_needs_distinct_file_names():
    table, features = hand_dataset()
    table["images"][1]["file_name"] = "sub/f.jpg"         # the same base name as image 10
    with pytest.raises(bm.BenchmarkError, match="f.jpg name more than one image"):
        reference(table, features, "random")


def test_the_default_draw_is_the_distinct_one():
    table, features = tied_dataset()
    kwargs = dict(n_eval=10, n_calibration=5, n_orderings=2, pool_size=60, seed=1)
    default = bm.build_benchmark(table, features, "adversarial", 4, **kwargs)
    assert default == bm.build_benchmark(table, features, "adversarial", 4, draw="distinct", **kwargs)
    assert default["draw"] == "distinct" and default["similarity_dtype"] == "float32"
    assert len({i["target"] for i in default["eval"] + default["calibration"]}) == 15


def test_cli_reference_draw_writes_byte_identical_files(tmp_path):
    table, features = tied_dataset()
    write_image_table(table, tmp_path / "images.json")
    with h5py.File(tmp_path / "features.h5", "w") as h5:
        for key in ("image_id", "image_emb", "text_emb"):
            h5[key] = features[key]
        h5["done"] = np.ones(len(features["image_id"]), dtype=bool)
        h5.attrs.update({"model": "toy", "pretrained": "none", "weights_sha256": "0" * 64,
                         "table_sha256": table_fingerprint(table), "complete": True})
    parser = build_parser(only="benchmark")
    texts = []
    for name in ("a.json", "b.json"):
        args = parser.parse_args(["benchmark", "--images", str(tmp_path / "images.json"), "--features",
                                  str(tmp_path / "features.h5"), "--setting", "adversarial", "--n-candidates", "4",
                                  "--n-eval", "30", "--n-calibration", "5", "--pool-size", "60", "--draw", "reference",
                                  "--similarity-dtype", "float16", "--out", str(tmp_path / name)])
        args.func(args)
        texts.append((tmp_path / name).read_bytes())
    assert texts[0] == texts[1]
    doc = json.loads(texts[0])
    assert doc["draw"] == "reference" and doc["similarity_dtype"] == "float16"
    expected = script_draw(table, features, 4, 30, 60, 42)["adversarial"]
    assert [i["candidates"] for i in doc["eval"]] == [i["candidates"] for i in expected]


# --- float16 similarities as numpy computes them ----------------------------------------

def numpys_dot(rows: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """``np.dot`` of every row with every pool vector, one pair at a time: the reference's similarities."""
    return np.array([[float(np.dot(r, p)) for p in pool] for r in rows])


def test_float16_dot_is_numpys_and_within_its_margin():
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(6, 768))
    pool = rows[rng.integers(0, 6, size=300)] + 0.2 * rng.normal(size=(300, 768))
    rows = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float16)
    pool = (pool / np.linalg.norm(pool, axis=1, keepdims=True)).astype(np.float16)
    numpy_dot = numpys_dot(rows, pool)
    r, c = np.nonzero(np.ones(numpy_dot.shape, dtype=bool))
    assert np.array_equal(bm.float16_dot_pairs(rows, pool, r, c).reshape(numpy_dot.shape), numpy_dot)
    estimate, margin = bm.float16_dot_estimate(rows, pool)
    assert (np.abs(numpy_dot - estimate) <= margin).all()
    assert margin.max() < 1e-3                           # tight enough that few pairs need the loop
    blas = (rows.astype(np.float32) @ pool.T.astype(np.float32)).astype(np.float16)
    assert (blas != numpy_dot).any()                     # float32 BLAS products round differently
    # The bound does not assume unit vectors: float16's rounding error grows with the product's size.
    for scale in (1 / 16, 16):
        scaled_rows, scaled_pool = rows * np.float16(scale), pool * np.float16(4)
        estimate, margin = bm.float16_dot_estimate(scaled_rows, scaled_pool)
        assert (np.abs(numpys_dot(scaled_rows, scaled_pool) - estimate) <= margin).all()
