"""The benchmark scripts run, at toy sizes, and what they print is right: counts that follow
from their arguments, numbers that agree with each other and with what the method must do
on the scripts' planted biases. Their timings are read by people from a full run, never
asserted. Without this, a refactor can break a script that nothing else imports, as one
once did, or leave it printing wrong numbers."""
from __future__ import annotations

import getpass
import gzip
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from benchmark_scripts import BENCHMARKS, load_script

# what every run shares and reuses, so that it does not grow run by run: torch's compile cache
SHARED_CACHES = {f"torchinductor_{getpass.getuser()}"}
NUMBER = r"(-?[0-9.]+(?:e[+-]?[0-9]+)?|nan)"


def run_script(name: str, *args: str, timeout: float = 600) -> str:
    """``benchmarks/<name>`` run with a temporary folder of its own, which it must leave empty:
    the random models and inputs it builds there take hundreds of MB a run."""
    with tempfile.TemporaryDirectory(prefix="ladbench-bench-tmp-") as tmp:
        done = subprocess.run([sys.executable, str(BENCHMARKS / name), *args], capture_output=True, text=True,
                              timeout=timeout, env=dict(os.environ, TMPDIR=tmp))
        assert done.returncode == 0, f"{name} failed:\n{done.stderr[-3000:]}"
        left = sorted(set(os.listdir(tmp)) - SHARED_CACHES)
        assert not left, f"{name} left {left} in the temporary folder"
    return done.stdout


def table_rows(text: str, first_cell: str) -> list[list[str]]:
    """The cells of the Markdown table rows of ``text`` whose first cell is ``first_cell``."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|")]
    return [row for row in rows if row[0] == first_cell]


def test_bench_methods_counts_and_results_at_a_toy_size():
    instances, orderings, pool, draws = 40, 5, 10, 2
    out = run_script("bench_methods.py", "--n", "4", "5", "--instances", str(instances), "--orderings", str(orderings),
                     "--pool", str(pool), "--layers", "16", "--layer-range", "6", "15", "--bootstrap", "50",
                     "--draws", str(draws))
    assert out.startswith(f"{instances} instances x {orderings} orderings, 16 layers, pool {pool}, ")
    results = re.findall(
        rf"N = (\d+): Acc vanilla {NUMBER}, PriDe {NUMBER}, LAD {NUMBER} \[{NUMBER}, {NUMBER}\], ideal attention "
        rf"{NUMBER}; LAD - PriDe = {NUMBER} \(p = {NUMBER}\); Spearman purified attention {NUMBER} vs logits {NUMBER}",
        out)
    assert [int(r[0]) for r in results] == [4, 5]
    for result in results:
        vanilla, pride, lad, low, high, ideal, difference, p_value, rho_attention, rho_logits = map(float, result[1:])
        assert all(0 <= acc <= 100 for acc in (vanilla, pride, lad, low, high, ideal))
        assert low <= lad <= high
        assert difference == pytest.approx(lad - pride, abs=0.11)       # printed to one decimal each
        assert 0 < p_value <= 1
        # the simulated cache plants a position bias in the logits and the answer in the attention
        assert lad > vanilla and lad > pride and rho_attention > rho_logits
    for n in (4, 5):
        steps = {row[1]: row[2:] for row in table_rows(out, str(n))}
        assert steps["simulate cache"][0] == str(instances * orderings + pool * n)
        assert steps["fit calibrations (draws x 2 score averages)"][0] == str(2 * draws)
        assert steps["predict LAD + PriDe for the other draws"][0] == str(2 * (draws - 1))
        rows = int(steps["predict every row, first draw"][0])
        assert int(steps["summarize every row (50 resamples)"][0]) == rows + 1   # + LAD, paper average
        timed = [float(v[1]) for name, v in steps.items() if name not in ("simulate cache",) and "total" not in name]
        total = float(steps["**total (without simulation)**"][1].strip("*"))
        assert total == pytest.approx(sum(timed), abs=0.0005 * (len(timed) + 1))


def test_bench_hard_negatives_builds_what_it_was_asked_at_a_toy_size():
    out = run_script("bench_hard_negatives.py", "--n", "4", "6", "--images", "600", "--pool-size", "500",
                     "--dim", "16", "--n-eval", "20", "--n-calibration", "5")
    assert out.startswith("inputs: 600 images x 16-d built in ")
    built = re.findall(rf"(\w+) +N= *(\d+): (\d+) eval \+ (\d+) calibration instances from a pool of (\d+) in {NUMBER} s",
                       out)
    assert [(setting, int(n)) for setting, n, *_ in built] == [
        ("adversarial", 4), ("random", 4), ("adversarial", 6), ("random", 6)]
    assert all((n_eval, n_cal, pool) == ("20", "5", "500") for _, _, n_eval, n_cal, pool, _ in built)


@pytest.mark.slow
def test_bench_inference_runs_on_the_tiny_model(tmp_path):
    out = run_script("bench_inference.py", "--preset", "tiny", "--n", "4", "--reps", "1", "--image-size", "56",
                     "--proxies", "--proxy-families", "internvl", "--json", str(tmp_path / "raw.json"))
    raw = json.loads((tmp_path / "raw.json").read_text())
    timing = {r["method"]: r for r in raw["timing"]}
    assert set(timing) == {"bare", "ours", "reference"} and {r["n"] for r in raw["timing"]} == {4}
    assert len({r["seq_len"] for r in raw["timing"]}) == 1                # one prompt, timed three ways
    assert all(0 < r["min_s"] <= r["median_s"] and r["cpu_min_s"] > 0 for r in raw["timing"])
    (row,) = table_rows(out, "4")                                           # one table row per N
    assert row[1] == str(timing["ours"]["seq_len"])
    speed_up = 3 * timing["reference"]["min_s"] / timing["ours"]["min_s"]   # the reference runs once per method
    assert float(row[-1].rstrip("x")) == pytest.approx(speed_up, abs=0.006)
    proxies = {(r["preset"], r["code"]): r for r in raw["proxies"]}
    assert set(proxies) == {("tiny", "ours"), ("tiny", "ours, native tower"), ("tiny internvl", "ours")}
    for r in proxies.values():                                              # counts per batch, shown per row
        assert r["batch"] == 8 and r["syncs_per_row"] == pytest.approx(r["item_per_row"] + r["tolist_cpu_per_row"])
        assert (r["syncs_per_row"] * r["batch"]).is_integer() and (r["aten_ops_per_row"] * r["batch"]).is_integer()
        assert (r["non_view_ops_per_row"] * r["batch"]).is_integer() and 0 < r["non_view_ops_per_row"] < r["aten_ops_per_row"]
    # the batched vision tower syncs with the host less than transformers' own, per image
    assert proxies["tiny", "ours"]["syncs_per_row"] < proxies["tiny", "ours, native tower"]["syncs_per_row"]
    # and nothing in the step reads a value back from the device (the host decides the padding and the
    # image features' places): the copy back at the end, and the tower's read of the host-side grids
    assert proxies["tiny", "ours"]["item_per_row"] == proxies["tiny internvl", "ours"]["item_per_row"] == 0
    assert table_rows(out, "tiny")[0][:4] == ["tiny", "4", "8", "ours"]
    assert table_rows(out, "tiny internvl")[0][:4] == ["tiny internvl", "4", "8", "ours"]


@pytest.mark.lanes
def test_bench_inference_counts_family_auto_per_architecture(tmp_path):
    from ladbench.families import installed_lane
    if installed_lane() != "current":
        pytest.skip("family auto runs on the current lane")
    out = run_script("bench_inference.py", "--n", "4", "--architectures", "llava", "--image-size", "56",
                     "--json", str(tmp_path / "raw.json"))
    (row,) = json.loads((tmp_path / "raw.json").read_text())["proxies"]
    assert (row["architecture"], row["code"], row["n"], row["batch"]) == ("llava", "auto", 4, 8)
    assert 0 <= row["vision_syncs_per_row"] <= row["syncs_per_row"]        # the tower is part of the step
    assert (row["vision_syncs_per_row"] * row["batch"]).is_integer() and row["aten_ops_per_row"] > 0
    assert table_rows(out, "llava")[0][:3] == ["llava", "4", "8"]


def test_bench_checksums_reads_the_paper_size_cache():
    out = run_script("bench_checksums.py", "--n", "4", "--reps", "1")
    head, *ways = out.splitlines()
    found = re.fullmatch(rf"cache of (\d+) rows, {NUMBER} MB, read whole \(min of 1\):", head)
    assert found, out
    rows, megabytes = (float(v) for v in found.groups())
    assert rows == 1000 * 5 + 100 * 4                                       # 1,000 x 5 orderings + 100 x N
    # float32 [R, N], [R, L, N], [R, L]; int16 order [R, N]; int32 greedy tokens [R, 2]
    assert megabytes == pytest.approx(rows * (4 * 4 + 36 * 4 * 4 + 36 * 4 + 2 * 4 + 4 * 2) / 2 ** 20, abs=0.05)
    times = {}
    for line in ways:
        found = re.fullmatch(rf"  (.+?) +{NUMBER} ms  \({NUMBER}x no checksums, {NUMBER}x Fletcher-32\)", line)
        assert found, out
        times[found.group(1)] = [float(v) for v in found.groups()[1:]]
    assert list(times) == ["no checksums", "Fletcher-32", "Fletcher-32 + content digest"]
    plain, fletcher = times["no checksums"][0], times["Fletcher-32"][0]
    for seconds, to_plain, to_fletcher in times.values():
        assert to_plain == pytest.approx(seconds / plain, rel=0.05, abs=0.01)
        assert to_fletcher == pytest.approx(seconds / fletcher, rel=0.05, abs=0.01)


@pytest.mark.slow
def test_bench_scaleout_runs_on_the_tiny_model():
    out = run_script("bench_scaleout.py", "--device", "cpu", "--n", "4", "--instances", "2", "--orderings", "2",
                     "--image-size", "56", "--shards", "2", "--batch-sizes", "1", "2", "--cot-max-new-tokens", "4")
    assert len(table_rows(out, "1")) == 2 and len(table_rows(out, "2 shards")) == 1
    # 2 x 2 evaluation + 1 x 4 calibration rows: each shard's 4 rows are one batch of 4, so the merged
    # cache holds exactly the unsharded scores
    assert float(re.search(rf"max \|merged - unsharded\| score: {NUMBER}", out).group(1)) == 0
    cot = {row[0]: row[1:] for row in table_rows(out, "1")[1:] + table_rows(out, "2")}
    assert set(cot) == {"1", "2"}
    for rows_per_s, tokens_per_s, tokens, _ in cot.values():
        assert 0 < int(tokens) <= 8 * 4                                      # at most 4 new tokens per row
        assert float(rows_per_s) > 0 and float(tokens_per_s) > 0
    assert cot["2"][3] == "True" and cot["1"][2] == cot["2"][2]              # batching changes no reply


def test_organism_seeds_sweeps_the_demo_recipe_with_changes_the_schema_checks(tmp_path):
    """organism_seeds.py trains the demo's organism spec per seed; ``--set`` changes the recipe
    through the config (so a variant is measured without editing code), and the schema
    rejects a key that is not a setting, naming it."""
    import argparse

    from ladbench.config import ConfigError, load_config

    seeds = load_script("organism_seeds")
    assert seeds.setting("steps=900") == ("steps", 900) and seeds.setting("lr=0.005") == ("lr", 0.005)
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        seeds.setting("steps")
    path, names = seeds.sweep_config(tmp_path, [3, 4], {"steps": 900})
    models = load_config(path)["models"]
    assert set(models) == set(names.values()) == {"organism_seed3", "organism_seed4"}
    assert [models[names[s]]["organism"] for s in (3, 4)] == [{"seed": 3, "steps": 900}, {"seed": 4, "steps": 900}]
    path, _ = seeds.sweep_config(tmp_path, [0], {"stepz": 900})
    with pytest.raises(ConfigError, match="stepz"):
        load_config(path)


def test_bench_inference_generation_counts_the_decode_loop_against_generate(tmp_path):
    from ladbench.models import compat
    out = run_script("bench_inference.py", "--generation", "--n", "4", "--image-size", "56", "--threads", "1",
                     "--gen-rows", "8", "--gen-batch", "2", "--gen-samples", "2", "--gen-max-new-tokens", "8",
                     "--gen-chunk", "4", "--gen-slots", "6", "--json", str(tmp_path / "raw.json"))
    rows = {r["variant"]: r for r in json.loads((tmp_path / "raw.json").read_text())["generation"]}
    assert set(rows) == {"cot", "sc"}
    for r in rows.values():
        assert r["same_replies"] and r["syncs_per_step_max"] <= 1 and r["ours_prefilled_rows_per_row"] == 1
        assert 0 < r["non_view_ops_per_step"] < r["aten_ops_per_step"]
        # a prefill reads back at most the grids the batched tower keeps on the host (its plans made
        # by the timed runs before: tests/test_decode.py counts a first prefill's apart); the current
        # lane runs transformers' own tower, which reads its grids back itself
        if compat.batched_vision_supported():
            assert r["syncs_per_later_prefill_max"] <= 1 and r["syncs_first_prefill"] <= 1
        assert r["ours_useful_fraction"] == r["useful_tokens"] / r["ours_token_slots"] >= 0.9
        assert r["plain_useful_fraction"] <= r["ours_useful_fraction"]
        assert r["static_same_replies"] and r["static_ring_columns"] > 0 and r["static_tokens_per_s"] > 0
        assert r["static_cudagraph_skips"] == 0                     # the CPU's step is not compiled
        # the ring as CUDA graphs: on the CPU its eager step (no graph to replay), the same replies
        assert r["graphs_same_replies"] and r["graphs_tokens_per_s"] > 0 and r["graphs_ring_columns"] > 0
        assert not r["graphs_replayed"] and r["graphs_captures"] == 0 and r["graphs_capture_failed"] is None
        # what a replay takes out of a ring step's launches: the forward's layers become one launch
        assert 0 < r["graphs_ops_per_step"] < r["ring_ops_per_step"] / 2
        assert 0 < r["static_kv_copies_per_token"] < r["ours_kv_copies_per_token"]
        # a ring reads every column of every slot at each step; the slab only its sequences' widest
        assert 0 < r["static_kv_reads_held"] < r["ours_kv_reads_held"] <= 1
        assert r["ours_kv_reads_per_token"] < r["static_kv_reads_per_token"] == r["graphs_kv_reads_per_token"]
        # chunks of 4 rows (2 groups), one at a time and through one loop: the same replies, both counted
        # (which takes fewer steps depends on the reply lengths: tests/test_decode.py checks the drain)
        assert r["chunks"] == 2 and r["streamed_same_replies"]
        assert r["streamed_decode_steps"] > 0 and r["alone_decode_steps"] > 0
        # 6 sequences in flight (--gen-slots), beside the prefill group's 2 x S alone: the same replies
        assert r["slots"] == 6 and r["group_slots"] == 2 * r["samples"] and r["group_same_replies"]
        assert r["group_decode_steps"] > 0 and r["group_tokens_per_s"] > 0
        # every sequence in flight at once (8 rows x S, more than the 6 slots): the same replies, fewer steps
        assert r["wide_slots"] == 8 * r["samples"] and r["wide_same_replies"]
        assert 0 < r["wide_decode_steps"] < r["decode_steps"] and r["wide_decode_step_s"] > 0
        # the other attention for one query position (here the GPU's, packed on the KV heads)
        assert r["packed_tokens_per_s"] > 0 and r["repeat_kv_tokens_per_s"] == r["ours_tokens_per_s"]
        # without cuDNN's attention (the CPU has none: the same kernels, the same replies)
        assert r["no_cudnn_same_replies"] and r["no_cudnn_second_run_tokens_per_s"] > 0
        # each run's seconds apart: its prefills' per row and the rest per decode step, which add up to it
        for run, seconds, steps in (("ours", "ours_s", "decode_steps"), ("ours_second_run", "ours_second_run_s",
                                    "decode_steps"), ("static", "static_s", "static_decode_steps"),
                                    ("graphs", "graphs_s", "graphs_decode_steps")):
            prefill, step = r[f"{run}_prefill_s_per_row"], r[f"{run}_decode_step_s"]
            assert prefill > 0 and step > 0 and r[f"{run}_prefill_s"] == pytest.approx(prefill * r["rows"])
            assert r[f"{run}_prefill_s"] + step * r[steps] == pytest.approx(r[seconds])
    assert rows["sc"]["plain_prefilled_rows_per_row"] == 2 and rows["cot"]["plain_prefilled_rows_per_row"] == 1
    assert [cells[:4] for cells in table_rows(out, "sc")] == [["sc", "8 x 2", "cpu", "8 (2)"]]


def test_bench_inference_traces_one_device_step_of_the_split(tmp_path):
    """``--trace``: the split of the GPU part (here the small architecture on the CPU) leaves one
    profiled step per N, a Chrome trace and the table of its operators, and names them."""
    run_script("bench_inference.py", "--arch", "qwen2_5_vl_3b", "--arch-scale", "small", "--n", "4", "--reps", "1",
               "--gpu-parts", "split", "--image-size", "56", "--threads", "1", "--trace", str(tmp_path / "traces"),
               "--json", str(tmp_path / "raw.json"))
    (split,) = json.loads((tmp_path / "raw.json").read_text())["gpu"]["qwen2_5_vl_3b"]["split"]
    trace = split["trace"]
    with gzip.open(trace["chrome_trace"], "rt") as handle:
        events = json.load(handle)["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)
    assert "aten::mm" in Path(trace["operators"]).read_text()


def test_bench_inference_generation_saves_the_ratio_to_generate_first(tiny_model, tmp_path):
    """A lent GPU's minutes are few and a part may run out of time: the generation benchmark saves
    after each measurement, the loop first (run twice, its first run and its second), then plain
    ``generate`` on the same rows (the issue's ratio), the static shapes as CUDA graphs, the other
    one-query attention (twice too), the loop without cuDNN's attention (twice too), the prefill
    group's width, the static shapes compiled, every sequence in flight (here 4 rows x 2 samples
    against 6 slots), the replies' equality, the host syncs, the chunks, the ring's launches; each
    save holds everything the earlier ones did."""
    bench = load_script("bench_inference")
    args = bench.parser().parse_args(["--generation", "--n", "4", "--image-size", "56", "--threads", "1",
                                      "--gen-variants", "sc", "--gen-rows", "4", "--gen-batch", "2", "--gen-samples",
                                      "2", "--gen-max-new-tokens", "6", "--gen-chunk", "2", "--gen-slots", "6"])
    results: list[dict] = []
    saved: list[set[str]] = []
    bench.generation_worker(tiny_model("qwen2_5_vl"), "tiny", args, results, lambda: saved.append(set(results[-1])))
    first = saved[0]
    assert {"ours_tokens_per_s", "ours_rows_per_s", "slots", "ours_second_run_tokens_per_s", "max_new_tokens"} <= first
    assert not first & {"plain_tokens_per_s", "group_tokens_per_s", "packed_tokens_per_s", "static_tokens_per_s",
                        "same_replies", "syncs_per_step_max", "streamed_decode_steps", "decode_step_trace"}  # no --trace
    assert all(earlier < later for earlier, later in zip(saved, saved[1:])) and len(saved) == 12
    assert {"plain_tokens_per_s", "plain_rows_per_s", "reply_lengths"} <= saved[1] and "graphs_tokens_per_s" in saved[2]
    assert {"packed_tokens_per_s", "repeat_kv_second_run_tokens_per_s"} <= saved[3]
    assert {"no_cudnn_tokens_per_s", "no_cudnn_second_run_tokens_per_s"} <= saved[4] and "group_tokens_per_s" in saved[5]
    assert "static_tokens_per_s" in saved[6] and "wide_tokens_per_s" in saved[7] and "same_replies" in saved[8]
    assert results[0]["model"] == "tiny" and results[0]["same_replies"] and results[0]["group_same_replies"]
    assert (results[0]["max_new_tokens"], results[0]["end_boost"]) == (6, 2.0)
    # what ladbench plan reads of a run stopped after its second save: the loop's rate at its width
    from ladbench.plan import _generation_rates
    stopped = {key: results[0][key] for key in saved[1]}
    (rate, plain) = _generation_rates(stopped)
    assert (rate.prompt, rate.way, rate.slots, rate.tokens_per_s) == ("sc", "slots", 6, results[0]["ours_tokens_per_s"])
    assert rate.run == "second run" and rate.n == 4 and rate.reply_limit == 6
    assert (rate.prefill_s_per_row, rate.decode_step_s) == (results[0]["ours_second_run_prefill_s_per_row"],
                                                           results[0]["ours_second_run_decode_step_s"])
    assert (plain.way, plain.slots, plain.split()) == ("generate", 2 * 2, False)   # generate: the group's, whole runs


def test_bench_inference_generation_measures_what_it_is_asked_in_its_order_at_the_studys_reply_limit(tiny_model):
    """``--gen-measure``: after the loop's own two runs only the measurements named, in the order
    named (a GPU part at the study's reply lengths wants the CUDA graphs before plain ``generate``);
    ``--gen-max-new-tokens study``: each variant's own limit, as the study runs it, recorded."""
    from ladbench.variants import variant
    bench = load_script("bench_inference")
    args = bench.parser().parse_args(["--generation", "--n", "4", "--image-size", "56", "--threads", "1",
                                      "--gen-rows", "2", "--gen-batch", "2", "--gen-samples", "2",
                                      "--gen-max-new-tokens", "study", "--end-boost", "0",
                                      "--gen-measure", "graphs", "plain"])
    model = tiny_model("qwen2_5_vl")
    for prompt in ("cot", "sc"):
        runner, _ = bench._generation_runner(model, prompt, args)
        assert runner.s.options.max_new_tokens == variant(prompt).options().max_new_tokens
        assert runner.adapter.model.get_output_embeddings().weight[runner.adapter.end_of_turn_id].abs().max() == 0
    args.gen_max_new_tokens, args.gen_variants = 3, ["sc"]
    results: list[dict] = []
    saved: list[set[str]] = []
    bench.generation_worker(model, "tiny", args, results, lambda: saved.append(set(results[-1])))
    assert len(saved) == 3 and "graphs_tokens_per_s" in saved[1] and "plain_tokens_per_s" not in saved[1]
    assert "plain_tokens_per_s" in saved[2] and not saved[2] & {"static_tokens_per_s", "same_replies", "chunks"}
    assert (results[0]["max_new_tokens"], results[0]["end_boost"]) == (3, 0.0) and results[0]["reply_lengths"] == [3]
    with pytest.raises(SystemExit):
        bench.parser().parse_args(["--generation", "--gen-max-new-tokens", "long"])


def test_bench_inference_generation_goes_on_past_a_failed_measurement(tiny_model, tmp_path, monkeypatch):
    """On a GPU the static shapes' compilation may fail where the CPU's eager run did not: the
    failure is recorded (what, and the error's last line) and the measurements after it are
    still made; the table says "-" where a figure is missing and lists the failure."""
    bench = load_script("bench_inference")
    timed = bench._timed_decode

    def static_fails(runner, prepared, rows, device, **settings):
        if settings.get("decode") == "static":
            raise RuntimeError("compiling the decode step\nBackendCompilerFailed: no CUDA graphs here")
        return timed(runner, prepared, rows, device, **settings)
    monkeypatch.setattr(bench, "_timed_decode", static_fails)
    args = bench.parser().parse_args(["--generation", "--n", "4", "--image-size", "56", "--threads", "1",
                                      "--gen-variants", "cot", "--gen-rows", "4", "--gen-batch", "2",
                                      "--gen-max-new-tokens", "4", "--gen-chunk", "2"])
    results: list[dict] = []
    bench.generation_worker(tiny_model("qwen2_5_vl"), "tiny", args, results)
    (r,) = results
    assert r["failed"] == [{"what": "static shapes", "error": "RuntimeError: BackendCompilerFailed: no CUDA graphs here"}]
    assert not any(key.startswith("static_") for key in r)
    assert r["same_replies"] and r["syncs_per_step_max"] <= 1 and r["streamed_same_replies"]
    json.dumps(r)                                                      # what --json writes
    table = bench.generation_table(results)
    (cells,) = table_rows(table, "cot")
    headers = [header for header, _ in bench.GENERATION_COLUMNS]
    static_column = headers.index(
        "static shapes: replies equal, useful / token slots, tokens/s, ms / decode step, CUDA graphs skipped")
    assert cells[static_column] == "-" and cells[headers.index("replies equal")] == "True"
    assert "- failed (cot): static shapes: RuntimeError: BackendCompilerFailed: no CUDA graphs here" in table


def test_bench_inference_gpu_part_goes_on_past_a_failed_measurement(tmp_path, monkeypatch):
    """Part 3 on a GPU: an `infer` run that fails at one N and a split whose profiler fails leave
    the other measurements made and both failures listed, in the results and under the tables."""
    bench = load_script("bench_inference")
    monkeypatch.setattr(bench, "arch_model", lambda arch, args: str(tmp_path / arch))

    def throughput(model_dir, n, batch, *rest):
        if n == 4:
            raise RuntimeError("ladbench infer failed:\n...\ntorch.OutOfMemoryError: CUDA out of memory")
        return {"n": n, "batch": batch, "rows_per_s": 2.0, "rows_per_s_steady": 2.5, "gpu_util_mean": 50.0,
                "gpu_util_batches": 75.0,
                "wall_s": 30.0, "batches_wall_s": 20.0, "batch_size_used": batch}

    def worker(kind, n, args, *, model_dir, extra=()):
        split = {"n": n, "batch": 8, "prepare_ms": 1.0, "vision_ms": 2.0, "decoder_ms": 3.0, "capture_and_scoring_ms": 4.0}
        return [dict(split, trace=None, failed=[{"what": f"trace at N = {n}", "error": "RuntimeError: CUPTI"}])]
    monkeypatch.setattr(bench, "infer_throughput", throughput)
    monkeypatch.setattr(bench, "_run_worker", worker)
    args = bench.parser().parse_args(["--arch", "qwen2_5_vl_3b", "--n", "4", "8", "--gpu-parts", "throughput",
                                      "split", "--batches", "32", "--trace", str(tmp_path / "traces")])
    results: dict = {}
    saves = []
    bench.gpu(args, results, lambda: saves.append(json.dumps(results)))
    r = results["qwen2_5_vl_3b"]
    assert [t["n"] for t in r["throughput"]] == [8] and [s["n"] for s in r["split"]] == [4, 8]
    assert r["failed"] == [{"what": "infer rows/s at N = 4, batch 32", "error": "RuntimeError: torch.OutOfMemoryError: CUDA out of memory"}]
    assert len(saves) == 4                                        # after each measurement, the failed one too
    table = bench.gpu_tables(results)
    assert [cells for cells in table_rows(table, "8") if cells[1] == "32"] == [
        ["8", "32", "one batch ahead", "2.00 / 2.50", "50 / 75", "30.0 / 20.0", "32"]]
    assert "- failed (qwen2_5_vl_3b): infer rows/s at N = 4, batch 32: RuntimeError: torch.OutOfMemoryError: CUDA out of memory" in table
    assert "- failed (qwen2_5_vl_3b): trace at N = 8: RuntimeError: CUPTI" in table
    from ladbench.plan import read_bench_rates                   # plan prices the N it has
    (tmp_path / "scoring.json").write_text(json.dumps({"device": "cuda", "gpu": results}))
    _, rates = read_bench_rates(f"qwen2_5_vl_3b={tmp_path / 'scoring.json'}")
    assert rates.scoring == ((8, 32, 2.5, ", second half"),)


def test_bench_inference_split_is_kept_when_its_trace_fails(tiny_model, tmp_path, monkeypatch):
    bench = load_script("bench_inference")

    def no_profiler(*args, **kwargs):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")
    monkeypatch.setattr(bench, "trace_step", no_profiler)
    split = bench.split_worker(4, tiny_model("qwen2_5_vl"), 2, 56, "cpu", 1, str(tmp_path / "traces"))
    assert split["trace"] is None and split["vision_ms"] > 0 and split["capture_and_scoring_ms"] is not None
    assert split["failed"] == [{"what": "trace at N = 4", "error": "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"}]


def test_bench_inference_builds_an_architecture_once_into_arch_dir(tmp_path, monkeypatch):
    """``--arch-dir``: the first run builds the model there, later runs reuse it (a GPU session's
    three parts pay for one build); a build killed halfway (no config.json) is not reused."""
    bench = load_script("bench_inference")
    builds = []

    def build(arch, out_dir, *, small, device):
        builds.append((arch, small, device))
        (Path(out_dir) / "config.json").write_text("{}")
        return out_dir
    monkeypatch.setattr(bench, "build_architecture", build)
    args = bench.parser().parse_args(["--arch", "qwen2_5_vl_3b", "--arch-scale", "small", "--arch-dir", str(tmp_path)])
    first = bench.arch_model("qwen2_5_vl_3b", args)
    assert bench.arch_model("qwen2_5_vl_3b", args) == first and builds == [("qwen2_5_vl_3b", True, "cpu")]
    assert Path(first).name == "qwen2_5_vl_3b" and Path(first).parent.name == "small-float32"
    (Path(first) / "config.json").unlink()
    assert bench.arch_model("qwen2_5_vl_3b", args) == first and len(builds) == 2
    args.device = "cuda"                                  # another dtype: another build, beside the first
    assert Path(bench.arch_model("qwen2_5_vl_3b", args)).parent.name == "small-bfloat16" and len(builds) == 3


def test_gpu_utilisation_is_averaged_over_the_batches_between_the_bars_first_and_last_lines():
    """An infer run's steady state: from its progress bar's opening line to its closing one (model
    load and exit outside), the samples in that window averaged."""
    bench = load_script("bench_inference")
    lines = [(0.5, "loading\n"), (2.0, "infer bench/standard:   0%|\n"), (12.0, "infer bench/standard:  50%|\n"),
             (15.0, "WARNING: x\n"), (20.0, "infer bench/standard: 100%|\n"), (21.0, "done\n")]
    assert bench.bar_window(lines, "infer bench/") == (2.0, 20.0)
    assert all(math.isnan(t) for t in bench.bar_window(lines[:2], "infer bench/"))
    sampler = bench.UtilisationSampler()
    sampler.samples = [(1.0, 0.0), (2.0, 60.0), (10.0, 80.0), (20.0, 100.0), (22.0, 0.0)]
    assert sampler.mean == 48.0 and sampler.mean_between(2.0, 20.0) == 80.0
    assert math.isnan(sampler.mean_between(3.0, 4.0))


def test_steady_rows_per_s_leaves_out_the_first_half_of_the_rows():
    """A run's first batch pays its start-up: the rate of its second half does not."""
    import numpy as np
    bench = load_script("bench_inference")
    seconds = np.array([2.0, 2.0, 0.5, 0.5, 0.25, 0.25, np.nan], dtype=np.float32)     # the last row not run
    assert bench.steady_rows_per_s(seconds) == 3 / 1.0
    assert math.isnan(bench.steady_rows_per_s(np.full(3, np.nan)))


@pytest.mark.slow
def test_gpu_session_script_runs_its_commands_on_the_cpu(tmp_path):
    """``GPU_SESSION_SMOKE=1 bash benchmarks/gpu_session.sh PART ...``: every command of the script a
    lent GPU runs (the attention kernels, CoT and SC generation with a decode step's profile and at the
    study's reply limits, scoring
    with traces for both architectures, the plan, the patch embedding, the padded widths, the
    compiled vision block, the fused norms), on the CPU at the small architectures, so that a flag renamed between
    GPU sessions fails here and not on the GPU. Each part writes its file; plan refuses the CPU's
    rates, naming the first file, which shows it was handed them; $OUT (the device tool's folder,
    8 files at most) gets them all as one archive, packed every second while the parts write (a
    pack that meets a file being written is no failure: a run on a clean clone here once failed
    on it). A part it does not know is refused before anything runs, and so is a python that
    cannot import the benchmark's modules."""
    import tarfile
    out, device_out = tmp_path / "out", tmp_path / "device-out"
    # packed every second, so that packs meet the parts writing their files (tar's "file changed")
    env = dict(os.environ, GPU_SESSION_DIR=str(out), OUT=str(device_out), GPU_SESSION_SMOKE="1",
               PYTHON=sys.executable, TMPDIR=str(tmp_path), GPU_SESSION_PACK_EVERY="1")

    def session(*parts: str, **changes: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(BENCHMARKS / "gpu_session.sh"), *parts], cwd=BENCHMARKS.parent,
                              env={**env, **changes}, capture_output=True, text=True, timeout=900)
    refused = session("scoring", "decoder")
    assert refused.returncode == 2 and "unknown part 'decoder'" in refused.stderr and not out.exists()
    blocker = tmp_path / "blocker"                       # a python without jsonschema, as a GPU machine's was
    (blocker / "jsonschema").mkdir(parents=True)
    (blocker / "jsonschema" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'jsonschema'\")\n")
    missing = session("cot", PYTHONPATH=str(blocker), GPU_SESSION_DIR=str(tmp_path / "refused"))
    assert missing.returncode == 3 and "No module named 'jsonschema'" in missing.stderr
    assert "make gpu-wheels" in missing.stderr and not (tmp_path / "refused" / "generation_cot.json").exists()
    done = session("attention", "scoring", "internvl", "cot", "sc", "cot_study", "sc_study", "internvl_gen",
                   "internvl_study", "patch", "widths", "vision", "norms")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "gpu.txt").read_text().splitlines() == ["no nvidia-smi (cpu)", "plan: exit 2"]
    for name, arch, ns in (("scoring", "qwen2_5_vl_3b", [4, 8]), ("scoring_internvl", "internvl3_8b", [4])):
        scoring = json.loads((out / f"{name}.json").read_text())["gpu"][arch]
        # 8 rows (--gpu-rows) beside the calibration pool's N
        # at its first N, the Qwen part also runs one batch at a time (--one-at-a-time), with its vision
        # blocks compiled (--compiled-vision) and without cuDNN's attention (--no-cudnn), and both parts
        # with transformers' read-backs (--read-back)
        ways = [(t["n"], t["rows"] - t["n"], t["score_ahead"], t["decide_on_host"], t["vision_tower"],
                 t["cudnn_attention"]) for t in scoring["throughput"]]
        qwen = name == "scoring"
        assert ways == ([(4, 8, True, True, "batched", True)] + [(4, 8, False, True, "batched", True)] * qwen
                        + [(4, 8, True, False, "batched", True)] + [(4, 8, True, True, "compiled", True)] * qwen
                        + [(4, 8, True, True, "batched", False)] * qwen
                        + [(n, 8, True, True, "batched", True) for n in ns[1:]])
        assert [s["n"] for s in scoring["split"]] == ns
        assert all(Path(s["trace"]["chrome_trace"]).is_file() for s in scoring["split"])
        assert all(0 < t["batches_wall_s"] < t["wall_s"] for t in scoring["throughput"])     # its bar was read
        assert all(t["rows_per_s_steady"] > 0 for t in scoring["throughput"])
    for name, model, variant, rows, samples in (("generation_cot", "qwen2_5_vl_3b", "cot", 4, 1),
                                                ("generation_sc", "qwen2_5_vl_3b", "sc", 2, 2),
                                                ("generation_internvl_cot", "internvl3_8b", "cot", 2, 1),
                                                ("generation_internvl_sc", "internvl3_8b", "sc", 2, 2)):
        (entry,) = json.loads((out / f"{name}.json").read_text())["generation"]
        assert (entry["variant"], entry["model"], entry["rows"], entry["samples"]) == (variant, model, rows, samples)
        assert entry["same_replies"] and entry["static_same_replies"] and "streamed_decode_steps" in entry
        assert entry["ours_second_run_tokens_per_s"] > 0 and entry["repeat_kv_second_run_tokens_per_s"] > 0
        assert Path(entry["decode_step_trace"]["operators"]).is_file()
    # the study parts: every reply at its limit (the smoke's 4 tokens for the study's own), the loop's
    # two runs, then only the CUDA graphs and, for the 3B's SC, plain generate
    for name, model, variant, measured in (
            ("generation_cot_study", "qwen2_5_vl_3b", "cot", set()),
            ("generation_sc_study", "qwen2_5_vl_3b", "sc", {"plain_tokens_per_s"}),
            ("generation_internvl_cot_study", "internvl3_8b", "cot", set()),
            ("generation_internvl_sc_study", "internvl3_8b", "sc", set())):
        (entry,) = json.loads((out / f"{name}.json").read_text())["generation"]
        assert (entry["variant"], entry["model"], entry["max_new_tokens"], entry["end_boost"]) == (variant, model, 4, 0.0)
        assert entry.get("reply_lengths", [4]) == [4]
        assert entry["ours_second_run_decode_step_s"] > 0 and entry["graphs_decode_step_s"] > 0
        assert {"plain_tokens_per_s", "static_tokens_per_s", "same_replies"} & set(entry) == measured
    assert f"--rates: {out / 'scoring.json'}: measured on 'cpu', not a GPU" in (out / "plan.txt").read_text()
    patch = json.loads((out / "patch_embed.json").read_text())["results"]
    assert [(r["rows"], r["max_rel_diff"] < 1e-5) for r in patch] == [(64, True)] * 2
    widths = json.loads((out / "aligned_widths.json").read_text())["results"]
    assert [(r["rows"], r["widths"]["shipped"], r["widths"]["padded_64"], r["max_rel_diff"] < 1e-5) for r in widths] == [
        (64, 3420, 3456, True), (4, 151674, 151680, True), (64, 151674, 151680, True)]
    # the block's capture only (backend eager): the same operations, so the same bits, in one graph per kind
    vision = json.loads((out / "vision_block.json").read_text())["results"]
    assert [(r["layers"], r["rows"], r["max_rel_diff"]) for r in vision] == [("windowed", 576, 0.0), ("full", 576, 0.0)]
    # on the CPU in float32 the fused norm gives transformers' bits, from the same six operations
    norms = json.loads((out / "norms.json").read_text())["results"]
    assert [(r["rows"], r["equal_bits"], r["operations"]) for r in norms] == [
        (256, 1.0, {"shipped": 6, "fused": 6})] * 3 + [(64, 1.0, {"shipped": 6, "fused": 6})] * 2
    attention = json.loads((out / "attention.json").read_text())["rows"]
    assert {(r["model"], r["masked"]) for r in attention} == {(m, k) for m in ("qwen2_5_vl_3b", "internvl3_8b")
                                                               for k in (True, False)}
    assert all(r["max_rel_diff"] < 1e-5 and ("packed_no_cudnn_fresh_ms" in r) == r["masked"] for r in attention)
    assert [p.name for p in device_out.iterdir()] == ["session.tgz"]
    with tarfile.open(device_out / "session.tgz") as packed:
        names = {Path(n).relative_to(".").as_posix() for n in packed.getnames() if n != "."}
    assert names == {p.relative_to(out).as_posix() for p in out.rglob("*")}
    assert not list(tmp_path.rglob("small-float32"))            # the parts' model builds, removed
