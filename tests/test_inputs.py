"""Stages refuse inputs that do not belong together, and damaged inputs, with one line
naming the files; outputs record the digests of what they were made from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from ladbench.cli import main
from ladbench.inference.cache import CacheLayout, CacheWriter, plan_rows, read_cache

LAYERS = 3


def benchmark(n: int, name: str = "scenes_random") -> dict:
    def instance(i: int) -> dict:
        return {"id": i, "caption": "c", "target": 100 * i, "candidates": [100 * i + k for k in range(n)],
                "orderings": [list(range(n)), list(range(n))[::-1]]}
    return {"dataset": name.split("_")[0], "setting": name.split("_")[1], "n_candidates": n, "n_orderings": 2,
            "eval": [instance(i) for i in range(4)], "calibration": [instance(10 + i) for i in range(3)]}


def write_cache(path, n: int = 4, model: str = "toy", variant: str = "vanilla", benchmark_name: str = "scenes_random",
                seed: int = 0, chunk_rows: int | None = None) -> str:
    """A complete cache with random scores; attributes as `ladbench infer` writes them."""
    bench = benchmark(n, benchmark_name)
    plan = plan_rows(bench)
    rows = len(plan)
    attrs = {"config_sha256": f"{model}-{variant}-{n}-{benchmark_name}-{seed}", "model": model, "model_path": model,
             "revision": "", "family": "qwen2_5_vl", "variant": variant, "variant_name": variant,
             "identifiers": "digits",
             "score_mode": "reference", "prompt_sha256": f"{variant}{n}", "n_candidates": n, "n_layers": LAYERS,
             "benchmark_name": f"{benchmark_name}_N{n}", "benchmark_sha256": f"sha-of-{benchmark_name}-{n}"}
    writer = CacheWriter.open(str(path), plan, CacheLayout(n, LAYERS, n_heads=2), attrs)
    rng = np.random.default_rng(seed)
    step = chunk_rows or rows
    for start in range(0, rows, step):
        idx = np.arange(start, min(rows, start + step))
        writer.write(idx, {"scores": rng.normal(size=(len(idx), n)).astype(np.float32),
                           "attn": rng.uniform(0.1, 1, size=(len(idx), LAYERS, n)).astype(np.float32),
                           "attn_text": np.full((len(idx), LAYERS), 0.2, np.float32)})
    writer.finish({"rows_per_s": 1.0})
    return str(path)


def calibrate(cache: str, out) -> str:
    main(["calibrate", "--cache", cache, "--n-cal", "2", "--out", str(out)])
    return str(out)


def evaluate(cache: str, *calibrations: str, extra=(), out=None) -> dict:
    out = out or cache.replace(".h5", ".eval.json")
    main(["evaluate", "--cache", cache, "--calibration", *calibrations, "--methods", "vanilla", "pride", "lad",
          "--layer-range", "all", "--bootstrap", "0", *extra, "--out", out])
    with open(out) as handle:
        return json.load(handle)


def refused(capsys, argv_or_call, *expected: str) -> str:
    """Run a CLI call that must fail with one line containing ``expected`` and no traceback."""
    with pytest.raises(SystemExit) as exit_info:
        argv_or_call()
    assert exit_info.value.code != 0
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    line = err.splitlines()[-1]  # (a library may warn before it)
    assert line.startswith("ladbench ") and ": error: " in line, err
    for text in expected:
        assert text in line, err
    return line


# --------------------------------------------------------------------- mismatched inputs
def test_evaluation_records_its_inputs(tmp_path):
    cache = write_cache(tmp_path / "a.h5")
    cal = calibrate(cache, tmp_path / "cal.npz")
    result = evaluate(cache, cal)
    assert result["inputs"]["cache"]["config_sha256"] == read_cache(cache).attrs["config_sha256"]
    assert result["inputs"]["cache"]["benchmark_sha256"] == "sha-of-scenes_random-4"
    from ladbench.atomic import file_digest
    assert result["inputs"]["calibrations"] == [
        {"path": cal, "sha256": file_digest(cal), "cache_config_sha256": read_cache(cache).attrs["config_sha256"]}]
    assert result["transfer"] is None


@pytest.mark.parametrize("other, what", [
    (dict(model="other_model"), "model 'other_model' vs 'toy'"),
    (dict(variant="instruction"), "variant 'instruction' vs 'vanilla'"),
    (dict(n=5), "n_candidates 5 vs 4"),
])
def test_a_calibration_of_another_model_prompt_or_n_is_refused(tmp_path, capsys, other, what):
    cache = write_cache(tmp_path / "test.h5")
    foreign = calibrate(write_cache(tmp_path / "foreign.h5", **other), tmp_path / "foreign.npz")
    refused(capsys, lambda: evaluate(cache, foreign), foreign, cache, what)


def test_a_calibration_of_another_benchmark_needs_a_declared_transfer_and_is_recorded(tmp_path, capsys):
    cache = write_cache(tmp_path / "adversarial.h5", benchmark_name="scenes_adversarial")
    other = calibrate(write_cache(tmp_path / "random.h5", benchmark_name="scenes_random"), tmp_path / "random.npz")
    refused(capsys, lambda: evaluate(cache, other), other, cache, "scenes_random_N4", "--transfer")
    result = evaluate(cache, other, extra=["--transfer"])
    assert result["transfer"] == {"calibrated_on": "scenes_random_N4", "benchmark_sha256": "sha-of-scenes_random-4"}


def test_calibration_draws_of_two_caches_are_refused(tmp_path, capsys):
    cache = write_cache(tmp_path / "test.h5")
    first = calibrate(cache, tmp_path / "first.npz")
    # same model, prompt and benchmark, but another cache (e.g. rebuilt with other settings)
    second = calibrate(write_cache(tmp_path / "rerun.h5", seed=1), tmp_path / "second.npz")
    refused(capsys, lambda: evaluate(cache, first, second), first, second, "different caches")


def test_a_calibration_without_a_record_of_its_cache_is_refused(tmp_path, capsys):
    from ladbench.calibration import Calibration
    cache = write_cache(tmp_path / "test.h5")
    cal = calibrate(cache, tmp_path / "cal.npz")
    old = tmp_path / "old.npz"
    Calibration.from_npz(cal).__class__(**{**Calibration.from_npz(cal).__dict__, "source": {}}).to_npz(old)
    refused(capsys, lambda: evaluate(cache, str(old)), str(old), "rerun `ladbench calibrate`")


def test_features_of_another_image_table_are_refused(tmp_path):
    from ladbench.stages.inputs import MismatchError, check_benchmark_table, check_features_table
    table = {"dataset": "scenes", "images": [{"image_id": 1, "file_name": "a.png", "caption": "a red circle"}]}
    from ladbench.data.coco import table_fingerprint
    check_features_table("f.h5", {"table_sha256": table_fingerprint(table)}, "images.json", table)
    edited = {**table, "images": [{**table["images"][0], "caption": "a blue circle"}]}
    with pytest.raises(MismatchError, match="f.h5 was computed from another image table than images.json"):
        check_features_table("f.h5", {"table_sha256": table_fingerprint(table)}, "images.json", edited)
    with pytest.raises(MismatchError, match="b.json is a benchmark of dataset 'coco' but images.json"):
        check_benchmark_table("b.json", {"dataset": "coco"}, "images.json", table)
    drawn_from_table = {"dataset": "scenes", "images_sha256": table_fingerprint(table)}
    check_benchmark_table("b.json", drawn_from_table, "images.json", table)
    with pytest.raises(MismatchError, match="b.json was drawn from another image table than images.json"):
        check_benchmark_table("b.json", drawn_from_table, "images.json", edited)


# ------------------------------------------------------------------------ damaged inputs
def flip_bytes_in_chunk(path, dataset: str, chunk: int = 0, count: int = 4) -> None:
    with h5py.File(path, "r") as h5:
        info = h5[dataset].id.get_chunk_info(chunk)
    with open(path, "r+b") as handle:
        handle.seek(info.byte_offset + info.size // 2)
        data = bytearray(handle.read(count))
        handle.seek(info.byte_offset + info.size // 2)
        handle.write(bytes(b ^ 0x5A for b in data))


def test_every_cache_and_feature_dataset_carries_checksums(tmp_path):
    cache = write_cache(tmp_path / "a.h5")
    with h5py.File(cache, "r") as h5:
        assert all(h5[name].fletcher32 for name in h5), [name for name in h5 if not h5[name].fletcher32]


def test_flipped_bytes_in_the_scores_are_refused_naming_the_file_and_the_rebuild(tmp_path, capsys):
    cache = write_cache(tmp_path / "a.h5", chunk_rows=8)
    cal = calibrate(cache, tmp_path / "cal.npz")
    flip_bytes_in_chunk(cache, "scores")
    refused(capsys, lambda: evaluate(cache, cal), cache, "corrupted", "rerun the workflow")


def test_corrupted_feature_embeddings_are_refused(tmp_path):
    from ladbench.features import load_features
    from ladbench.hdf5 import CHECKSUMS, HDF5FileError, open_h5
    path = tmp_path / "features.h5"
    with open_h5(path, "w") as h5:
        for name in ("image_id", "image_emb", "text_emb"):
            h5.create_dataset(name, data=np.arange(64, dtype=np.float16).reshape(8, 8), **CHECKSUMS)
        h5.attrs["complete"] = True
    assert load_features(path)["image_emb"].shape == (8, 8)
    flip_bytes_in_chunk(path, "image_emb")
    with pytest.raises(HDF5FileError, match=r"features.h5: features file: corrupted .*`ladbench features`"):
        load_features(path)


@pytest.mark.parametrize("damage, problem", [
    (lambda p: p.write_bytes(b"not an HDF5 file at all"), "not an HDF5 file"),
    (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 3]), "truncated"),
])
def test_a_damaged_cache_is_one_line(tmp_path, capsys, damage, problem):
    cache = write_cache(tmp_path / "a.h5")
    damage(tmp_path / "a.h5")
    refused(capsys, lambda: main(["calibrate", "--cache", cache, "--out", str(tmp_path / "c.npz")]), cache, problem)


def test_a_damaged_calibration_is_one_line(tmp_path, capsys):
    cache = write_cache(tmp_path / "a.h5")
    cal = tmp_path / "cal.npz"
    calibrate(cache, cal)
    cal.write_bytes(cal.read_bytes()[:100])
    refused(capsys, lambda: evaluate(cache, str(cal)), str(cal), "not a readable calibration file")


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    cache = tmp_path / "a.h5"
    cache.write_bytes(b"junk")
    monkeypatch.setenv("LADBENCH_DEBUG", "1")
    with pytest.raises(ValueError, match="not an HDF5 file"):
        main(["calibrate", "--cache", str(cache), "--out", str(tmp_path / "c.npz")])
    monkeypatch.delenv("LADBENCH_DEBUG")
    with pytest.raises(ValueError, match="not an HDF5 file"):
        main(["--debug", "calibrate", "--cache", str(cache), "--out", str(tmp_path / "c.npz")])


# ----------------------------------------------------------------- concurrent reading
READER = """
import sys, time, h5py
with h5py.File(sys.argv[1], "r") as handle:   # h5py's default: HDF5's file lock
    handle["rows"][()]
    print("open", flush=True)
    time.sleep(60)
"""


def test_a_reader_holding_the_partial_cache_open_never_stops_the_writer(tmp_path):
    bench = benchmark(4)
    plan = plan_rows(bench)
    writer = CacheWriter.open(str(tmp_path / "c.h5"), plan, CacheLayout(4, LAYERS, n_heads=2),
                              {"config_sha256": "x", "n_candidates": 4})
    writer.write([0, 1], {"scores": np.zeros((2, 4), np.float32)})
    chunk = next(Path(writer.path).glob("chunk-*.h5"))          # a file of the work, read by h5dump, a notebook...
    reader = subprocess.Popen([sys.executable, "-c", READER, str(chunk)], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "open"
        rest = np.arange(2, len(plan))
        writer.write(rest, {"scores": np.ones((len(rest), 4), np.float32)})   # would fail on the lock
        assert read_cache(str(tmp_path / "c.h5"), require_complete=False)["done"].all()
        writer.finish({})
        assert reader.poll() is None  # the reader was not disturbed either
    finally:
        reader.kill()
        reader.wait()
    assert read_cache(str(tmp_path / "c.h5"))["scores"][1:].sum() == 4 * (len(plan) - 2)


# ------------------------------------------------------------------ no silent overwrite
@pytest.mark.parametrize("argv, wrong", [
    (["evaluate", "--cache", "{cache}", "--methods", "vanilla", "--out", "{dir}/eval.npz"], "eval.npz"),
    (["analyze", "--cache", "{cache}", "--out", "{dir}/eval.npz"], "eval.npz"),
    (["calibrate", "--cache", "{cache}", "--out", "{dir}/eval.json"], "eval.json"),
    (["infer", "--benchmark", "b.json", "--images", "i.json", "--model-name", "m", "--family", "qwen2_5_vl",
      "--model-path", "m", "--out", "{dir}/eval.json"], "eval.json"),
])
def test_an_output_named_for_another_format_is_refused_and_nothing_is_overwritten(tmp_path, capsys, argv, wrong):
    cache = write_cache(tmp_path / "a.h5")
    evaluate(cache, calibrate(cache, tmp_path / "cal.npz"), out=str(tmp_path / "eval.json"))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    argv = [a.format(cache=cache, dir=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert f"{wrong}': this command writes" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("workers", ["0", "1"])  # inline, and in a DataLoader worker (as on a GPU)
def test_an_unreadable_image_at_inference_is_one_line_naming_it(tiny_model, tmp_path, capsys, workers):
    from conftest_models import TINY_IMAGE_SIZE, make_demo_benchmark
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=1, n_orderings=1, n_cal=1)
    shown = json.loads(bench.read_text())["eval"][0]["candidates"][0]
    bad = tmp_path / "images" / f"{shown:04d}.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n but the rest is gone")
    argv = ["infer", "--benchmark", str(bench), "--images", str(images), "--out", str(tmp_path / "c.h5"),
            "--model-name", "tiny", "--family", "qwen2_5_vl", "--model-path", tiny_model("qwen2_5_vl"),
            "--device", "cpu", "--image-size", str(TINY_IMAGE_SIZE), "--workers", workers]
    refused(capsys, lambda: main(argv), str(bad), f"cannot read image {shown}", "restore the file")


def test_the_report_refuses_an_evaluation_made_from_another_cache(tmp_path):
    from ladbench.report.study import load_study
    from ladbench.stages.inputs import MismatchError
    # the report indexes files by what they record (model, benchmark, variant), not by their paths
    cache_dir = tmp_path / "caches"
    cache_dir.mkdir(parents=True)
    cache = write_cache(cache_dir / "vanilla.h5")
    evaluation = tmp_path / "an-evaluation.json"
    evaluate(cache, calibrate(cache, tmp_path / "cal.npz"), out=str(evaluation))
    study = dict(models=["toy"], benchmarks=["scenes_random_N4"], variants={"vanilla": "vanilla"},
                 evaluations=[evaluation], caches=[cache])
    load_study(**study)
    write_cache(cache_dir / "vanilla.h5", seed=1)   # the cache was rebuilt; the evaluation was not
    with pytest.raises(MismatchError, match="evaluation of toy/scenes_random_N4/vanilla/scenes_random_N4 was made "
                                            "from .* but the cache given for it has"):
        load_study(**study)
