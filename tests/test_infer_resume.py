"""``ladbench infer`` end to end: a run killed with SIGKILL at any moment (inside a chunk
write, inside the assembly of the finished file, at random) resumes losing at most the chunk
in flight and ends equal to an uninterrupted run; a finished cache is never rewritten unless
its inputs changed; generative and permavg variants write their extra datasets."""
from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from conftest_models import FAMILIES, TINY_IMAGE_SIZE, make_demo_benchmark
from ladbench.inference.cache import partial_path, read_cache

pytestmark = [pytest.mark.slow, pytest.mark.lanes]

CHUNK = 2
# Imports the CLI once, then for each line on stdin forks a job that runs it (printing the
# job's pid, then "ended" when it is gone): a kill costs no interpreter start. Each batch is
# slowed down (as on a big model), and each signature of a file too: a chunk file (or the
# finished file) is half written then, so a kill can land inside a write. The job notes in
# $KILL_MARK which file it is signing.
FORKING_DRIVER = textwrap.dedent("""
    import os, sys, time
    from ladbench import hdf5
    from ladbench.cli import main
    from ladbench.inference import runner
    real_batch, real_sign = runner.RowRunner.launch_scores, hdf5.sign
    def slow_batch(self, rows):
        time.sleep(0.1)
        return real_batch(self, rows)
    def slow_sign(h5):
        with open(os.environ["KILL_MARK"], "a") as mark:
            mark.write(h5.filename + "\\n")
        time.sleep(0.15)
        real_sign(h5)
    runner.RowRunner.launch_scores, hdf5.sign = slow_batch, slow_sign
    from ladbench.models import load_adapter      # every module a job imports, imported once
    load_adapter("qwen2_5_vl", sys.argv[sys.argv.index("--model-path") + 1], device="cpu")
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1), os.dup2(quiet, 2)
            try:
                main(sys.argv[1:])
            finally:
                os._exit(0)
        print(pid, flush=True)
        os.waitpid(pid, 0)
        print("ended", flush=True)
""")


def _infer_args(model, bench, images, out, *extra):
    return ["infer", "--benchmark", str(bench), "--images", str(images), "--out", str(out),
            "--model-name", "tiny", "--family", "qwen2_5_vl", "--model-path", model, "--device", "cpu",
            "--image-size", str(TINY_IMAGE_SIZE), "--chunk-size", str(CHUNK), *extra]


def _run_cli(args):
    from ladbench.cli import main
    main(args)


def _done_rows(path) -> set[int]:
    """The rows the work folder of ``path`` holds (read while a writer may be adding chunks)."""
    try:
        return set(np.flatnonzero(read_cache(str(path), require_complete=False)["done"]).tolist())
    except (OSError, ValueError):          # not created yet, or finished and removed meanwhile
        return set()


def _signing(mark: Path, what: str) -> bool:
    """Whether the driver is signing a file of this kind now (the last file it noted)."""
    lines = mark.read_text().split() if mark.exists() else []
    last = lines[-1] if lines else ""
    return {"chunk": "/chunk-" in last, "finished": last.endswith(".tmp") and "/chunk-" not in last}[what]


#: When each killed run is killed: inside a chunk write, at random moments, inside the
#: assembly of the finished file (the seed is fixed, so a failure can be replayed).
KILLS = ("chunk", 0.5, "chunk", 0.5, "chunk", "finished")


def test_killed_at_any_moment_keeps_every_finished_chunk_and_ends_equal(tiny_model, tmp_path):
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=4, n_orderings=2, n_cal=2)   # 8 + 8 rows
    reference = tmp_path / "reference.h5"
    _run_cli(_infer_args(model, bench, images, reference))

    killed, driver, mark = tmp_path / "killed.h5", tmp_path / "driver.py", tmp_path / "signing.txt"
    driver.write_text(FORKING_DRIVER)
    jobs = subprocess.Popen([sys.executable, str(driver), *_infer_args(model, bench, images, killed)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, "KILL_MARK": str(mark)})
    rng = random.Random(22)
    inside = 0
    try:
        for when in KILLS:
            mark.unlink(missing_ok=True)
            jobs.stdin.write("run\n")
            jobs.stdin.flush()
            pid = int(jobs.stdout.readline())
            deadline = time.time() + 120
            while not mark.exists():                                  # started writing (model loaded)
                assert time.time() < deadline, "the job wrote nothing within 120 s"
                time.sleep(0.01)
            if isinstance(when, float):
                time.sleep(rng.uniform(0, when))
            else:
                while not _signing(mark, when) and not killed.exists():
                    assert time.time() < deadline, f"the job never wrote a {when} file"
                    time.sleep(0.005)
                inside += not killed.exists()
            before = _done_rows(killed)                  # what had finished before the kill
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            assert jobs.stdout.readline().strip() == "ended"
            after = _done_rows(killed)
            assert before <= after, f"killed ({when}): finished rows {sorted(before - after)} were lost"
            if killed.exists():
                break
    finally:
        jobs.kill()
        jobs.wait()
    assert inside >= 3, "too few kills landed inside a write"
    assert not killed.exists() and after, "the kills came too late to test resuming"

    _run_cli(_infer_args(model, bench, images, killed))             # resume
    resumed, ref = read_cache(str(killed)), read_cache(str(reference))
    for key in ("scores", "attn", "attn_text", "order", "target_pos", "split", "instance", "ordering"):
        np.testing.assert_allclose(resumed[key], ref[key], atol=1e-6, rtol=0, err_msg=key)
    # the greedy reply (the reference's Vanilla readout) is stored for every row, resumed or not
    np.testing.assert_array_equal(resumed["greedy_tokens"], ref["greedy_tokens"])
    np.testing.assert_array_equal(resumed["greedy_text"], ref["greedy_text"])
    assert (resumed["greedy_tokens"] >= 0).all()
    assert resumed.attrs["config_sha256"] == ref.attrs["config_sha256"]
    total = len(ref["done"])
    assert resumed.attrs["last_run_rows"] == total - len(after)    # only the missing rows were computed
    # the rate covers the rows of every run, not only the last
    assert np.all(resumed["seconds"] > 0) and resumed.attrs["timed_rows"] == total
    assert resumed.attrs["rows_per_s"] == pytest.approx(total / resumed["seconds"].astype(np.float64).sum(), rel=1e-5)
    assert not os.path.exists(partial_path(str(killed))) and not os.path.exists(f"{killed}.lock")


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


# Runs `ladbench infer` with every decode step slowed down (as on a big model), so that a kill
# lands while the decode loop still has chunks in flight.
SLOW_DECODE = textwrap.dedent("""
    import sys, time
    from ladbench.cli import main
    from ladbench.inference import decode
    real = decode.SlotDecoder.step
    def slow(self, flight, replies):
        time.sleep(0.03)
        return real(self, flight, replies)
    decode.SlotDecoder.step = slow
    main(sys.argv[1:])
""")


def test_a_generation_killed_mid_stream_keeps_its_written_chunks_and_resumes_equal(tiny_model, tmp_path):
    """One decode loop runs across the chunks: each chunk is written as soon as its rows have
    ended, not at the end of the loop, so a kill keeps them, and the rerun computes only the rest."""
    model = tiny_model("qwen2_5_vl")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=4, n_orderings=2, n_cal=2)   # 8 + 8 rows
    sc = ["--prompt", "sc", "--sc-samples", "3", "--sc-max-new-tokens", "6", "--batch-size", "2"]
    reference, killed = tmp_path / "reference.h5", tmp_path / "killed.h5"
    _run_cli(_infer_args(model, bench, images, reference, *sc))
    job = subprocess.Popen([sys.executable, "-c", SLOW_DECODE, *_infer_args(model, bench, images, killed, *sc)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not _done_rows(killed):
            assert job.poll() is None and time.time() < deadline, "no chunk was written while the loop ran"
            time.sleep(0.01)
        job.send_signal(signal.SIGKILL)
        job.wait()
    finally:
        job.kill()
    kept = _done_rows(killed)
    total = len(read_cache(str(reference))["done"])
    assert 0 < len(kept) < total and not killed.exists()
    _run_cli(_infer_args(model, bench, images, killed, *sc))                # resume
    resumed, ref = read_cache(str(killed)), read_cache(str(reference))
    for key in ("text", "sample_parsed", "parsed", "n_generated"):
        assert (resumed[key] == ref[key]).all(), key
    assert resumed.attrs["last_run_rows"] == total - len(kept)


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
