"""``ladbench infer`` end to end: a run killed with SIGKILL resumes losing at most one
chunk and ends equal to an uninterrupted run; a finished cache is never rewritten unless
its inputs changed; generative and permavg variants write their extra datasets."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

from conftest_models import FAMILIES, TINY_IMAGE_SIZE, make_demo_benchmark
from ladbench.inference.cache import partial_path, read_cache

pytestmark = [pytest.mark.slow, pytest.mark.lanes]

CHUNK = 3
# Runs the real CLI, with each batch slowed down (as on a big model) so the kill lands mid-run.
SLOW_DRIVER = textwrap.dedent("""
    import sys, time
    from ladbench.inference import runner
    real = runner.RowRunner.score_batch
    def slow(self, rows):
        time.sleep(0.4)
        return real(self, rows)
    runner.RowRunner.score_batch = slow
    from ladbench.cli import main
    main(sys.argv[1:])
""")


def _infer_args(model, bench, images, out, *extra):
    return ["infer", "--benchmark", str(bench), "--images", str(images), "--out", str(out),
            "--model-name", "tiny", "--family", "qwen2_5_vl", "--model-path", model, "--device", "cpu",
            "--image-size", str(TINY_IMAGE_SIZE), "--chunk-size", str(CHUNK), *extra]


def _run_cli(args):
    from ladbench.cli import main
    main(args)


def _done_rows(path) -> int:
    try:
        with h5py.File(partial_path(str(path)), "r", locking=False) as f:
            return int(f["done"][()].sum())
    except (OSError, KeyError):
        return 0


def test_killed_run_resumes_and_equals_uninterrupted_run(tiny_model, tmp_path):
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=3, n_orderings=2, n_cal=2)   # 6 + 8 rows
    reference = tmp_path / "reference.h5"
    _run_cli(_infer_args(model, bench, images, reference))

    killed = tmp_path / "killed.h5"
    driver = tmp_path / "driver.py"
    driver.write_text(SLOW_DRIVER)
    proc = subprocess.Popen([sys.executable, str(driver), *_infer_args(model, bench, images, killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    try:
        deadline = time.time() + 120
        while _done_rows(killed) < CHUNK:                # first chunk flushed
            assert proc.poll() is None, "the job ended before it could be killed"
            assert time.time() < deadline, "no chunk written within 120 s"
            time.sleep(0.05)
        seen = _done_rows(killed)
        time.sleep(0.5)                                  # let it get into the next chunk
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    after_kill = _done_rows(killed)
    assert after_kill >= seen and after_kill % CHUNK == 0          # whole chunks, nothing flushed lost
    assert not killed.exists()                                      # only the work file: nothing for Snakemake to delete
    partial = read_cache(str(killed), require_complete=False)
    assert not partial.attrs["complete"] and partial["done"].sum() == after_kill
    total = len(partial["done"])
    assert after_kill < total, "kill came too late to test resuming"

    _run_cli(_infer_args(model, bench, images, killed))             # resume
    resumed, ref = read_cache(str(killed)), read_cache(str(reference))
    for key in ("scores", "attn", "attn_text", "order", "target_pos", "split", "instance", "ordering"):
        np.testing.assert_allclose(resumed[key], ref[key], atol=1e-6, rtol=0, err_msg=key)
    # the greedy reply (the reference's Vanilla readout) is stored for every row, resumed or not
    np.testing.assert_array_equal(resumed["greedy_tokens"], ref["greedy_tokens"])
    np.testing.assert_array_equal(resumed["greedy_text"], ref["greedy_text"])
    assert (resumed["greedy_tokens"] >= 0).all()
    assert resumed.attrs["config_sha256"] == ref.attrs["config_sha256"]
    assert resumed.attrs["last_run_rows"] == total - after_kill   # only the missing rows were computed
    # the rate covers the rows of both runs, not only the resumed part
    assert np.all(resumed["seconds"] > 0) and resumed.attrs["timed_rows"] == total
    assert resumed.attrs["rows_per_s"] == pytest.approx(total / resumed["seconds"].astype(np.float64).sum(), rel=1e-5)


def test_finished_cache_is_not_rewritten_unless_inputs_change(tiny_model, tmp_path):
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=1, n_orderings=2, n_cal=1)
    out = tmp_path / "c.h5"
    _run_cli(_infer_args(model, bench, images, out))
    stamp = (os.stat(out).st_ino, os.stat(out).st_mtime_ns)
    _run_cli(_infer_args(model, bench, images, out, "--batch-size", "2"))    # batch size: same content
    assert (os.stat(out).st_ino, os.stat(out).st_mtime_ns) == stamp
    first = read_cache(str(out))
    _run_cli(_infer_args(model, bench, images, out, "--identifiers", "upper"))   # a real change
    second = read_cache(str(out))
    assert second.attrs["identifiers"] == "upper" and second.attrs["config_sha256"] != first.attrs["config_sha256"]
    assert not np.allclose(second["scores"], first["scores"])


def test_a_finished_cache_takes_the_names_it_is_asked_for_without_recomputing(tiny_model, tmp_path):
    """Model and variant names change no number (not hashed): a finished cache found again under
    other names keeps its rows and gets the names, so what it records matches the config."""
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=1, n_orderings=2, n_cal=1)
    out = tmp_path / "c.h5"
    _run_cli(_infer_args(model, bench, images, out, "--variant-name", "plain"))
    first = read_cache(str(out))
    assert (first.attrs["model"], first.attrs["variant_name"], first.attrs["variant"]) == ("tiny", "plain", "vanilla")
    args = _infer_args(model, bench, images, out, "--variant-name", "renamed")
    args[args.index("--model-name") + 1] = "other"
    _run_cli(args)
    second = read_cache(str(out))
    assert (second.attrs["model"], second.attrs["variant_name"]) == ("other", "renamed")
    assert second.attrs["config_sha256"] == first.attrs["config_sha256"]
    assert second.attrs["last_run_s"] == first.attrs["last_run_s"]          # no row was run again
    np.testing.assert_array_equal(second["scores"], first["scores"])


def test_limit_rows_leaves_an_incomplete_cache(tiny_model, tmp_path):
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=1, n_orderings=2, n_cal=1)
    out = tmp_path / "c.h5"
    _run_cli(_infer_args(model, bench, images, out, "--limit-rows", "2"))
    c = read_cache(str(out), require_complete=False)
    assert c["done"].sum() == 2 and not c.attrs["complete"]
    _run_cli(_infer_args(model, bench, images, out))
    assert read_cache(str(out))["done"].all()


@pytest.mark.parametrize("family", [f for f in ("qwen2_5_vl", "llava_ov15") if f in FAMILIES])
def test_generative_variants_store_texts_and_parsed_answers(family, tiny_model, tmp_path):
    model = tiny_model(family)
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=1, n_orderings=2, n_cal=1)
    cot, sc = tmp_path / "cot.h5", tmp_path / "sc.h5"
    base = _infer_args(model, bench, images, cot, "--prompt", "cot", "--cot-max-new-tokens", "6", "--batch-size", "2")
    base[base.index("qwen2_5_vl")] = family
    extra = ["--trust-remote-code"] if family == "llava_ov15" else []
    _run_cli(base + extra)
    c = read_cache(str(cot))
    assert c["text"].shape == (6,) and c["parsed"].dtype == np.int16 and np.isnan(c["scores"]).all()
    assert all(isinstance(t, str) for t in c["text"])
    sc_args = [a if a != str(cot) else str(sc) for a in base] + extra
    sc_args[sc_args.index("cot")] = "sc"
    _run_cli(sc_args + ["--sc-samples", "3", "--sc-max-new-tokens", "5"])
    s = read_cache(str(sc))
    assert s["text"].shape == (6, 3) and s["sample_parsed"].shape == (6, 3)
    assert ((s["parsed"] >= -1) & (s["parsed"] < 4)).all()
    # a second run of the same sampling settings is identical (seeded per row)
    _run_cli([a if a != str(sc) else str(tmp_path / "sc2.h5") for a in sc_args] + ["--sc-samples", "3",
                                                                                     "--sc-max-new-tokens", "5"])
    assert (read_cache(str(tmp_path / "sc2.h5"))["text"] == s["text"]).all()


def test_permavg_rows_and_shift_zero_equals_vanilla(tiny_model, tmp_path):
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=2, n_orderings=2, n_cal=1)
    van, perm = tmp_path / "vanilla.h5", tmp_path / "permavg.h5"
    _run_cli(_infer_args(model, bench, images, van))
    _run_cli(_infer_args(model, bench, images, perm, "--prompt", "permavg"))
    v, p = read_cache(str(van)), read_cache(str(perm))
    assert p.eval_view("scores").shape == (2, 2, 4, 4) and "shift" in p
    np.testing.assert_allclose(p.eval_view("scores")[:, :, 0], v.eval_view("scores"), atol=1e-5)
    np.testing.assert_allclose(p.calibration_view("attn"), v.calibration_view("attn"), atol=1e-6)
