"""`ladbench plan`: every inference job of a study with its rows, generated tokens and
estimated GPU hours (measured rates from existing caches, else a GPU benchmark's rates given
with --rates, else assumed ones), and the wall time on G GPUs."""
from __future__ import annotations

import numpy as np
import pytest

from ladbench.cli import main
from ladbench.config import REPO_ROOT, load_config
from ladbench.inference.cache import CacheLayout, CacheWriter, plan_rows
from ladbench.plan import (ASSUMED_GENERATED_TOKENS_PER_S, ASSUMED_ROWS_PER_S_N4, Job, bench_rates, cache_path,
                           plan_jobs, read_bench_rates, wall_seconds)

from test_cache import BENCH


def paper(tmp_path, shards=1):
    config = load_config(REPO_ROOT / "config.yaml")
    config["output_dir"] = str(tmp_path)          # no benchmark files, no caches: all from the config
    config["inference"]["shards"] = shards
    return config


def test_paper_study_jobs_by_hand(tmp_path):
    jobs = plan_jobs(paper(tmp_path))
    assert len(jobs) == 3 * 4 * 6 == 72 and all(j.rate == "assumed" and j.shards == 1 for j in jobs)
    by = {(j.model, j.benchmark, j.variant): j for j in jobs}
    vanilla = by["qwen2_5_vl_3b", "coco_random_N4", "vanilla"]
    assert vanilla.rows == 1000 * 5 + 100 * 4 and vanilla.generated_tokens == 0
    assert vanilla.seconds == pytest.approx(5400 / ASSUMED_ROWS_PER_S_N4)
    permavg = by["internvl3_8b", "coco_adversarial_N8", "permavg"]
    assert permavg.rows == 1000 * 5 * 8 + 100 * 8
    assert permavg.seconds == pytest.approx(40800 / (ASSUMED_ROWS_PER_S_N4 * 4 / 8))
    assert by["llava_ov15_8b", "coco_random_N4", "sc"].generated_tokens == 5400 * 10 * 512
    assert by["llava_ov15_8b", "coco_random_N4", "cot"].generated_tokens == 5400 * 1024


def test_shards_split_rows_and_shorten_the_wall_time_not_the_gpu_hours(tmp_path):
    whole, sharded = plan_jobs(paper(tmp_path)), plan_jobs(paper(tmp_path, shards=4))
    assert len(sharded) == 4 * len(whole)
    assert sum(j.rows for j in sharded) == sum(j.rows for j in whole)
    assert sum(j.gpu_hours for j in sharded) == pytest.approx(sum(j.gpu_hours for j in whole))
    for gpus in (8, 32):
        wall = wall_seconds(sharded, gpus)
        assert wall >= max(sum(j.seconds for j in sharded) / gpus, max(j.seconds for j in sharded)) - 1e-6
        assert wall < wall_seconds(whole, gpus)
    assert wall_seconds(sharded, 1) == pytest.approx(sum(j.seconds for j in sharded))


def job(seconds, gpus=1):
    return Job("m", "b", "v", 0, 1, 1, 0, seconds, gpus, "assumed")


def test_wall_time_by_hand():
    # longest first on 2 GPUs: 3 | 3, then 2 | 2 (5, 5), then 2 -> 7
    assert wall_seconds([job(2), job(3), job(2), job(3), job(2)], 2) == 7
    # a 2-GPU job waits for both GPUs: 4 on one, the pair from 4 to 6, then 1 -> 7 (a list
    # schedule, longest first; not the optimum, 6, and Snakemake's order may differ)
    assert wall_seconds([job(4), job(2, gpus=2), job(1)], 2) == 7
    with pytest.raises(ValueError, match="needs 2 GPUs"):
        wall_seconds([job(1, gpus=2)], 1)


def demo_with_a_measured_cache(tmp_path, model: str, benchmark: str) -> dict:
    """The demo's config with one finished vanilla cache of ``model`` on ``benchmark`` at 2 rows/s."""
    config = load_config(REPO_ROOT / "workflow" / "demo" / "config.yaml")
    config["output_dir"] = str(tmp_path)
    plan = plan_rows(BENCH)
    writer = CacheWriter.open(cache_path(config, model, benchmark, "vanilla"), plan, CacheLayout(3, 2, 1),
                              {"config_sha256": "x"})
    writer.write(np.arange(len(plan)), {"seconds": np.full(len(plan), 0.5, np.float32)})
    writer.finish(writer.throughput())
    return config


def test_rates_measured_in_existing_caches_are_used(tmp_path):
    model, benchmark = "tiny_qwen2_5_vl", "scenes_random_N4"
    config = demo_with_a_measured_cache(tmp_path, model, benchmark)
    jobs = {(j.model, j.benchmark, j.variant): j for j in plan_jobs(config)}
    measured = jobs[model, benchmark, "vanilla"]
    assert measured.rate == "measured (this cache)" and measured.seconds == pytest.approx(measured.rows / 2.0)
    similar = jobs[model, "scenes_adversarial_N4", "vanilla"]     # same model, N and kind
    assert similar.rate == "measured (similar cache)" and similar.seconds == pytest.approx(similar.rows / 2.0)
    other_model = jobs["organism_qwen2_5_vl", benchmark, "vanilla"]  # rates are never borrowed across models
    assert other_model.rate == "assumed"


def test_plan_command_prints_jobs_totals_and_what_is_assumed(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)      # the demo's output_dir is relative: no caches of an earlier `make demo`
    main(["plan", "--configfile", str(REPO_ROOT / "workflow" / "demo" / "config.yaml"), "--gpus", "2"])
    out = capsys.readouterr().out
    # the demo: 2 models (the random tiny one and the organism) x 4 benchmarks x the vanilla cache
    assert "8 inference jobs" in out and "wall time of the inference on 2 GPU(s)" in out and "ASSUMED" in out


def bench_file(tmp_path, device="cuda", archs=("qwen2_5_vl_3b",), name="bench.json"):
    """A bench_inference.py --json file: scoring at N = 4 (batch 1, 8, 32) and N = 8 (batch 8),
    and the decode loop's generation rates, of each architecture."""
    import json
    document = {"device": device, "gpu": {arch: {"throughput": [
        {"n": 4, "batch": 1, "rows_per_s": 5.0}, {"n": 4, "batch": 8, "rows_per_s": 20.0},
        {"n": 4, "batch": 32, "rows_per_s": 25.0},
        {"n": 8, "batch": 8, "rows_per_s": 8.0, "score_ahead": False},            # the comparison runs: no rate,
        {"n": 8, "batch": 8, "rows_per_s": 9.0, "score_ahead": True, "decide_on_host": False},  # wherever they are
        {"n": 8, "batch": 8, "rows_per_s": 30.0, "vision_tower": "compiled", "cudnn_attention": True},
        {"n": 8, "batch": 8, "rows_per_s": 31.0, "vision_tower": "batched", "cudnn_attention": False},
        {"n": 8, "batch": 8, "rows_per_s": 10.0, "rows_per_s_steady": 12.0}]}
        for arch in archs},
        "generation": [{"variant": "sc", "model": arch, "batch": 4, "samples": 10, "slots": 64,
                        "ours_tokens_per_s": 2000.0} for arch in archs]}
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def test_a_gpu_benchmarks_rates_price_the_jobs_no_cache_measured(tmp_path):
    config = paper(tmp_path)                                  # batch size 4: the nearest measured is 8
    model, rates = read_bench_rates(f"qwen2_5_vl_3b={bench_file(tmp_path)}")
    jobs = {(j.model, j.benchmark, j.variant): j for j in plan_jobs(config, {model: rates})}
    n4, n8 = jobs[model, "coco_random_N4", "vanilla"], jobs[model, "coco_random_N8", "vanilla"]
    assert n4.rate == "benchmark (N = 4, batch 8)" and n4.seconds == pytest.approx(n4.rows / 20.0)
    # where the run's second half has its own rate (the start-up left out), that one
    assert n8.rate == "benchmark (N = 8, batch 8, second half)" and n8.seconds == pytest.approx(n8.rows / 12.0)
    sc, cot = jobs[model, "coco_random_N4", "sc"], jobs[model, "coco_random_N4", "cot"]
    assert sc.rate == "benchmark (64 sequences in flight)" and sc.generated_tokens == sc.rows * 10 * 512  # at their limit
    assert sc.seconds == pytest.approx(sc.generated_tokens / 2000.0)
    assert cot.rate == "assumed" and cot.seconds == pytest.approx(cot.generated_tokens / ASSUMED_GENERATED_TOKENS_PER_S)
    assert jobs["internvl3_8b", "coco_random_N4", "vanilla"].rate == "assumed"      # only the model it was given for
    config["models"][model]["batch_size"] = 32                # the model's own batch size picks the entry
    config["benchmarks"]["n_candidates"] = [4, 12]
    jobs = {(j.model, j.benchmark, j.variant): j for j in plan_jobs(config, {model: rates})}
    assert jobs[model, "coco_random_N4", "vanilla"].rate == "benchmark (N = 4, batch 32)"
    n12 = jobs[model, "coco_random_N12", "vanilla"]           # not measured: the nearest N, scaled as the prompt grows
    assert n12.rate == "benchmark (N = 8 x 8/12, batch 8, second half)" and n12.seconds == pytest.approx(n12.rows / (12.0 * 8 / 12))
    with pytest.raises(ValueError, match=r"^--rates: no model 'qwen' in the config \(its models: qwen2_5_vl_3b, "):
        plan_jobs(config, {"qwen": rates})


def test_rates_files_are_refused_in_one_line_naming_them(tmp_path):
    cpu, two = bench_file(tmp_path, device="cpu", name="cpu.json"), bench_file(tmp_path, archs=("a", "b"), name="two.json")
    (tmp_path / "text.json").write_text("not json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"device": "cuda", "generation": [{"variant": "cot", "model": "a", "slots": 64, '
                   '"ours_tokens_per_s": 1.0, "ours_decode_step_s": "fast", "ours_prefill_s_per_row": 0.1}]}')
    for spec, message in [("qwen", "expected MODEL=FILE"), (f"m={tmp_path / 'missing.json'}", "missing.json: No such file"),
                          (f"m={tmp_path / 'text.json'}", "text.json: not a JSON file of benchmarks/bench_inference.py"),
                          (f"m={cpu}", "cpu.json: measured on 'cpu', not a GPU"),
                          (f"m={two}", "two.json holds the rates of a, b: name one, m=FILE#ARCH"),
                          (f"m={two}#c", "two.json holds no rates of 'c'"),
                          (f"m={bad}", r"bad.json: a measurement of 'a' is not as bench_inference.py writes it "
                                       r"\(ValueError: could not convert string to float: 'fast'\)")]:
        with pytest.raises(ValueError, match=message):
            read_bench_rates(spec)
    assert read_bench_rates(f"m={two}#b")[1].source == f"{two}#b"


def test_a_cache_measured_rate_wins_over_a_benchmarks(tmp_path):
    model, benchmark = "tiny_qwen2_5_vl", "scenes_random_N4"
    config = demo_with_a_measured_cache(tmp_path, model, benchmark)
    _, rates = read_bench_rates(f"{model}={bench_file(tmp_path)}")
    jobs = {(j.model, j.benchmark, j.variant): j for j in plan_jobs(config, {model: rates})}
    assert jobs[model, benchmark, "vanilla"].rate == "measured (this cache)"
    assert jobs[model, "scenes_random_N8", "vanilla"].rate == "benchmark (N = 8, batch 8, second half)"


def test_plan_command_takes_rates_and_names_their_files(capsys, tmp_path, monkeypatch):
    """... and the GPU that measured them, where the file names it (files before 2026-11-27 do not)."""
    import json
    monkeypatch.chdir(tmp_path)
    path = bench_file(tmp_path)
    config = str(REPO_ROOT / "workflow" / "demo" / "config.yaml")
    main(["plan", "--configfile", config, "--rates", f"tiny_qwen2_5_vl={path}"])
    out = capsys.readouterr().out
    assert f"4 job(s) at BENCHMARK rates (tiny_qwen2_5_vl: {path}#qwen2_5_vl_3b)" in out
    assert "4 job(s) at ASSUMED rates" in out
    path.write_text(json.dumps({**json.loads(path.read_text()), "gpu_name": "NVIDIA H200"}))
    main(["plan", "--configfile", config, "--rates", f"tiny_qwen2_5_vl={path}"])
    assert f"(tiny_qwen2_5_vl: {path}#qwen2_5_vl_3b (NVIDIA H200))" in capsys.readouterr().out


def test_a_models_rates_files_are_merged(tmp_path):
    """A GPU session writes scoring.json and generation.json apart: both price the model's jobs."""
    import json
    scoring, generation = bench_file(tmp_path, name="scoring.json"), tmp_path / "generation.json"
    generation.write_text(json.dumps({"device": "cuda", "generation": [          # a run of before `slots`
        {"variant": "cot", "model": "qwen2_5_vl_3b", "batch": 8, "samples": 1, "ours_tokens_per_s": 800.0},
        {"variant": "sc", "model": "qwen2_5_vl_3b", "batch": 4, "samples": 10, "slots": 64,
         "ours_tokens_per_s": 2500.0}]}))
    rates = bench_rates([f"qwen2_5_vl_3b={scoring}", f"qwen2_5_vl_3b={generation}"])
    assert sorted((e.prompt, e.slots, e.tokens_per_s) for e in rates["qwen2_5_vl_3b"].generation) == [
        ("cot", 8, 800.0), ("sc", 64, 2500.0)]                                                  # the later file's
    assert rates["qwen2_5_vl_3b"].source == f"{scoring}#qwen2_5_vl_3b + {generation}#qwen2_5_vl_3b"
    jobs = {(j.model, j.benchmark, j.variant): j for j in plan_jobs(paper(tmp_path), rates)}
    assert [jobs["qwen2_5_vl_3b", "coco_random_N4", v].rate for v in ("vanilla", "cot", "sc")] == [
        "benchmark (N = 4, batch 8)", "benchmark (8 sequences in flight)", "benchmark (64 sequences in flight)"]


def test_a_generation_rate_is_taken_at_the_sequences_in_flight_nearest_the_jobs(tmp_path):
    """The paper's config on a GPU keeps 64 sequences in flight (batch 4: CoT 4 x 1, SC 4 x 10, both
    below 64); with ``decode_slots`` set, that many. A benchmark that measured the loop at 64, at
    its prefill group's alone and with every sequence in flight gives each job the rate nearest its own."""
    import json
    path = tmp_path / "generation.json"
    path.write_text(json.dumps({"device": "cuda", "generation": [
        {"variant": "cot", "model": "a", "batch": 4, "samples": 1, "slots": 64, "ours_tokens_per_s": 3200.0,
         "group_slots": 4, "group_tokens_per_s": 400.0, "wide_slots": 160, "wide_tokens_per_s": 6000.0}]}))
    _, rates = read_bench_rates(f"qwen2_5_vl_3b={path}")
    assert [(e.prompt, e.way, e.slots, e.tokens_per_s) for e in rates.generation] == [
        ("cot", "slots", 64, 3200.0), ("cot", "slots", 4, 400.0), ("cot", "slots", 160, 6000.0)]
    config = paper(tmp_path)
    cot = {(j.model, j.benchmark, j.variant): j for j in plan_jobs(config, {"qwen2_5_vl_3b": rates})}[
        "qwen2_5_vl_3b", "coco_random_N4", "cot"]
    assert cot.rate == "benchmark (64 sequences in flight)" and cot.seconds == pytest.approx(cot.generated_tokens / 3200)
    config["inference"]["decode_slots"] = 6
    cot = {(j.model, j.benchmark, j.variant): j for j in plan_jobs(config, {"qwen2_5_vl_3b": rates})}[
        "qwen2_5_vl_3b", "coco_random_N4", "cot"]
    assert cot.rate == "benchmark (4 sequences in flight)" and cot.seconds == pytest.approx(cot.generated_tokens / 400)
    config["inference"]["decode_slots"] = 256
    cot = {(j.model, j.benchmark, j.variant): j for j in plan_jobs(config, {"qwen2_5_vl_3b": rates})}[
        "qwen2_5_vl_3b", "coco_random_N4", "cot"]
    assert cot.rate == "benchmark (160 sequences in flight)" and cot.seconds == pytest.approx(cot.generated_tokens / 6000)


def split_generation_file(tmp_path):
    """A generation measurement of 2026-11-28 on: each run's seconds apart (the loop's second run,
    static shapes) beside its tokens/s, at N = 4, 64 sequences in flight, and plain generate."""
    import json
    path = tmp_path / "generation.json"
    path.write_text(json.dumps({"device": "cuda", "generation": [
        {"variant": "cot", "model": "a", "n": 4, "batch": 4, "samples": 1, "slots": 64, "ours_tokens_per_s": 400.0,
         "ours_prefill_s_per_row": 0.2, "ours_decode_step_s": 0.05,             # the first run's: not the one priced
         "ours_second_run_prefill_s_per_row": 0.15, "ours_second_run_decode_step_s": 0.025,
         "static_tokens_per_s": 450.0, "static_prefill_s_per_row": 0.14, "static_decode_step_s": 0.005,
         "graphs_tokens_per_s": 440.0, "graphs_prefill_s_per_row": 0.145, "graphs_decode_step_s": 0.004,
         "plain_tokens_per_s": 80.0}]}))
    return read_bench_rates(f"qwen2_5_vl_3b={path}")[1]


def test_a_generation_job_is_priced_as_its_prefills_and_a_step_per_token_in_flight(tmp_path):
    """A benchmark's replies stop at 64 tokens, the paper's CoT at 1,024: its whole-run tokens/s is
    mostly the prefills'. Where the file has the run's seconds apart, a job costs its rows'
    prefills (scaled by N / 4 at N = 8) and a decode step per token of each of the 64 sequences in
    flight, every reply at its limit (by hand: 5,400 rows x 0.15 s + ceil(5,400 x 1,024 / 64) x 25 ms)."""
    rates, config = split_generation_file(tmp_path), paper(tmp_path)
    jobs = {(j.model, j.benchmark, j.variant): j for j in plan_jobs(config, {"qwen2_5_vl_3b": rates})}
    n4, n8 = jobs["qwen2_5_vl_3b", "coco_random_N4", "cot"], jobs["qwen2_5_vl_3b", "coco_random_N8", "cot"]
    assert n4.rows == 5400 and n4.generated_tokens == 5400 * 1024
    assert n4.seconds == pytest.approx(5400 * 0.15 + 86400 * 0.025) == 810 + 2160
    assert n4.rate == "benchmark (64 sequences in flight, second run: prefill 0.150 s/row + 25.0 ms/step)"
    assert n8.seconds == pytest.approx(5800 * 0.15 * 8 / 4 + 5800 * 1024 / 64 * 0.025)
    assert n8.rate == "benchmark (64 sequences in flight, second run: prefill 0.150 s/row x 8/4 + 25.0 ms/step)"
    # the whole run's 400 tokens/s would have priced it at 5,400 x 1,024 / 400 s: 4.7 times more here
    assert 5400 * 1024 / 400 / n4.seconds == pytest.approx(4.66, abs=0.01)
    assert jobs["qwen2_5_vl_3b", "coco_random_N4", "sc"].rate == "assumed"        # no SC measured


def test_a_generation_job_is_priced_the_way_its_config_decodes(tmp_path):
    """``inference.decode: static`` takes the static shapes' measurement, ``graphs`` the same ring's
    as CUDA graphs, ``generate`` plain
    generate's (its whole run: at the prefill group's batch x S sequences, with no split)."""
    rates, config = split_generation_file(tmp_path), paper(tmp_path)

    def cot(decode):
        config["inference"]["decode"] = decode
        return {(j.model, j.benchmark, j.variant): j for j in plan_jobs(config, {"qwen2_5_vl_3b": rates})}[
            "qwen2_5_vl_3b", "coco_random_N4", "cot"]
    static, graphs, plain = cot("static"), cot("graphs"), cot("generate")
    assert static.rate == "benchmark (static, 64 sequences in flight: prefill 0.140 s/row + 5.0 ms/step)"
    assert static.seconds == pytest.approx(5400 * 0.14 + 86400 * 0.005)
    assert graphs.rate == "benchmark (graphs, 64 sequences in flight: prefill 0.145 s/row + 4.0 ms/step)"
    assert graphs.seconds == pytest.approx(5400 * 0.145 + 86400 * 0.004)
    assert plain.rate == "benchmark (generate, 4 sequences in flight)"
    assert plain.seconds == pytest.approx(5400 * 1024 / 80.0)


def test_a_generation_job_is_priced_at_the_reply_limit_nearest_its_own(tmp_path):
    """A GPU session times the loop with replies stopped at 64 tokens and, in its study parts, at
    the variant's own limit (CoT 1,024): a longer reply's steps read a longer KV cache. Both files
    are kept, whatever their order, and a CoT job takes the run whose limit is nearest its 1,024; a
    file that recorded no limit (before 2026-11-28) only where nothing else was measured."""
    import json

    def generation(name, limit, step):
        entry = {"variant": "cot", "model": "a", "n": 4, "batch": 4, "samples": 1, "slots": 64, "ours_tokens_per_s": 400.0,
                 "ours_second_run_prefill_s_per_row": 0.15, "ours_second_run_decode_step_s": step}
        path = tmp_path / name
        path.write_text(json.dumps({"device": "cuda", "generation": [{**entry, **limit}]}))
        return f"qwen2_5_vl_3b={path}"
    short, study, unrecorded = (generation("short.json", {"max_new_tokens": 64}, 0.004),
                                generation("study.json", {"max_new_tokens": 1024}, 0.006),
                                generation("old.json", {}, 0.003))
    config = paper(tmp_path)

    def cot(*specs):
        jobs = {(j.model, j.benchmark, j.variant): j for j in plan_jobs(config, bench_rates(list(specs)))}
        return jobs["qwen2_5_vl_3b", "coco_random_N4", "cot"]
    for specs in ((short, study), (study, short), (unrecorded, short, study)):
        job = cot(*specs)
        assert job.seconds == pytest.approx(5400 * 0.15 + 86400 * 0.006)
        assert job.rate == ("benchmark (64 sequences in flight, replies to 1024 tokens, second run: prefill 0.150 "
                            "s/row + 6.0 ms/step)")
    assert "replies to 64 tokens" in cot(unrecorded, short).rate
    assert cot(unrecorded).seconds == pytest.approx(5400 * 0.15 + 86400 * 0.003)
