"""A synthetic study for the explorer's tests and benchmark: images, image table, benchmark,
an inference cache with a planted divergence (the attention follows the target, the scores
favour fixed positions), its calibration and its evaluation, written as the stages write
them (the calibration and the evaluation by the `ladbench` commands themselves)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ladbench.atomic import file_digest
from ladbench.cli import main
from ladbench.inference.cache import CacheLayout, CacheWriter, plan_rows

METHODS = ("vanilla", "pride", "lad", "raw_attention", "purified_attention")


def write_images(folder: Path, count: int, size: tuple[int, int], rng: np.random.Generator) -> list[str]:
    """``count`` photo-like JPEGs (smooth colour fields with grain: they compress like photos,
    not like flat drawings)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    width, height = size
    names = []
    for k in range(count):
        coarse = rng.uniform(0, 255, size=(6, 8, 3)).astype(np.uint8)
        field = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BILINEAR), dtype=np.float64)
        grain = rng.normal(0, 14, size=field.shape)
        name = f"img_{k:06d}.jpg"
        Image.fromarray(np.clip(field + grain, 0, 255).astype(np.uint8)).save(folder / name, quality=90)
        names.append(name)
    return names


def build_study(folder: Path, *, instances: int = 12, orderings: int = 3, n: int = 4, layers: int = 4, pool: int = 6,
                image_size: tuple[int, int] = (48, 36), seed: int = 0, images: bool = True,
                caption_texts: tuple[str, ...] = ("<b>&</b>",)) -> dict[str, str]:
    """Every file an explorer page is built from; returns their paths. Each caption ends in one
    of ``caption_texts`` (in turn): markup that must stay text."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n_images = (instances + pool) * n
    names = write_images(folder / "images", n_images, image_size, rng) if images else [f"img_{k:06d}.jpg" for k in range(n_images)]
    table = {"dataset": "synth", "image_root": str(folder / "images"), "has_categories": False,
             "images": [{"image_id": k, "file_name": name, "caption": f"scene {k}", "categories": []}
                        for k, name in enumerate(names)]}
    (folder / "images.json").write_text(json.dumps(table))

    def instance(i: int, first: int, with_orderings: bool) -> dict:
        candidates = list(range(first, first + n))
        rng.shuffle(candidates)
        entry = {"id": i, "caption": f"caption of scene {candidates[0]} {caption_texts[i % len(caption_texts)]}",
                 "target": candidates[0],
                 "candidates": candidates}
        if with_orderings:
            entry["orderings"] = shared
        return entry

    shared = [list(range(n))] + [rng.permutation(n).tolist() for _ in range(orderings - 1)]
    bench = {"dataset": "synth", "setting": "random", "n_candidates": n, "n_orderings": orderings,
             "ordering_scheme": "shared", "orderings": shared,
             "eval": [instance(i, i * n, True) for i in range(instances)],
             "calibration": [instance(c, (instances + c) * n, False) for c in range(pool)]}
    bench_path = folder / "synth_random_N4.json"
    bench_path.write_text(json.dumps(bench))

    plan = plan_rows(bench)
    rows = len(plan)
    target = plan.target_pos.astype(np.intp)
    onehot = np.eye(n)[target]
    # scores: the content (a target bonus) plus a position bias that favours position 0
    scores = 1.2 * onehot + np.where(np.arange(n) == 0, 1.5, 0.0) + rng.normal(0, 0.8, size=(rows, n))
    # attention: every layer looks at the target more, the last layers most, with noise
    weight = np.linspace(0.2, 2.0, layers)[None, :, None]
    attn = rng.uniform(0.05, 0.15, size=(rows, layers, n)) * (1 + weight * onehot[:, None, :] * rng.uniform(0, 2, (rows, 1, 1)))
    attrs = {"config_sha256": f"synth-{seed}-{instances}-{n}", "model": "toy", "model_path": "toy", "model_kind": "tiny-random",
             "revision": "", "family": "qwen2_5_vl", "variant": "vanilla", "variant_name": "vanilla", "identifiers": "digits",
             "score_mode": "reference", "prompt_sha256": f"vanilla{n}", "n_candidates": n, "n_layers": layers,
             "benchmark": str(bench_path), "benchmark_name": f"synth_random_N{n}", "benchmark_sha256": file_digest(bench_path),
             "calibration_source": "pool"}
    cache = folder / "cache.h5"
    writer = CacheWriter.open(str(cache), plan, CacheLayout(n, layers, n_heads=2), attrs)
    writer.write(np.arange(rows), {"scores": scores.astype(np.float32), "attn": attn.astype(np.float32),
                                   "attn_text": np.full((rows, layers), 0.2, np.float32)})
    writer.finish({"rows_per_s": 1.0})
    calibration = folder / "dcal5_seed0.npz"
    main(["calibrate", "--cache", str(cache), "--n-cal", str(min(5, pool)), "--out", str(calibration)])
    evaluation = folder / "eval.json"
    main(["evaluate", "--cache", str(cache), "--calibration", str(calibration), "--methods", *METHODS,
          "--layer-range", "all", "--bootstrap", "0", "--out", str(evaluation)])
    return {"cache": str(cache), "calibration": str(calibration), "evaluation": str(evaluation),
            "benchmark": str(bench_path), "images": str(folder / "images.json")}
