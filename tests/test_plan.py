"""`ladbench plan`: every inference job of a study with its rows, generated tokens and
estimated GPU hours (measured rates from existing caches, else assumed ones), and the
wall time on G GPUs."""
from __future__ import annotations

import numpy as np
import pytest

from ladbench.cli import main
from ladbench.config import REPO_ROOT, load_config
from ladbench.inference.cache import CacheLayout, CacheWriter, plan_rows
from ladbench.plan import ASSUMED_ROWS_PER_S_N4, Job, cache_path, plan_jobs, wall_seconds

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


def test_rates_measured_in_existing_caches_are_used(tmp_path):
    config = load_config(REPO_ROOT / "workflow" / "demo" / "config.yaml")
    config["output_dir"] = str(tmp_path)
    model, benchmark = "tiny_qwen2_5_vl", "scenes_random_N4"
    path = cache_path(config, model, benchmark, "vanilla")
    plan = plan_rows(BENCH)
    writer = CacheWriter.open(path, plan, CacheLayout(3, 2, 1), {"config_sha256": "x"})
    writer.write(np.arange(len(plan)), {"seconds": np.full(len(plan), 0.5, np.float32)})   # 2 rows/s
    writer.finish(writer.throughput())
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
