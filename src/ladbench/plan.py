"""What a study's inference will cost, before running it.

Lists every inference job the config makes (model x benchmark x variant x shard) with its
rows, the tokens it may generate and its estimated GPU hours, and the study's wall time on
G GPUs. Rates come from caches already written for the study (``rows_per_s``,
``generated_tokens_per_s`` and the mean ``n_generated`` per row, docs/formats.md §4): the
same job's cache, else another cache of the same model, N and kind (scoring or
generating); else the conservative defaults below, marked "assumed". Generated tokens
without a measurement are the upper bound (every reply runs to its length limit). No
torch, no model: it reads the config, benchmark files where they exist, and cache
attributes.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass

from ladbench.config import study_benchmarks
from ladbench.variants import variant as prompt_variant

#: Assumed rates where nothing is measured: guesses on the slow side, not measurements
#: (recipes/gpu measured 3.7 rows/s at N = 4 and 1.95 at N = 8 on one H100 before
#: batching). Scoring: ASSUMED_ROWS_PER_S_N4 * 4 / N rows/s; generation: tokens/s summed
#: over a batch of sequences.
ASSUMED_ROWS_PER_S_N4 = 1.0
ASSUMED_GENERATED_TOKENS_PER_S = 100.0


@dataclass
class Job:
    model: str
    benchmark: str
    variant: str
    shard: int               # 0-based; of `shards`
    shards: int
    rows: int
    generated_tokens: int    # 0 for scoring variants
    seconds: float           # estimated, on `gpus` GPUs
    gpus: int
    rate: str                # where the rate comes from

    @property
    def gpu_hours(self) -> float:
        return self.seconds * self.gpus / 3600.0


def cache_path(config: dict, model: str, benchmark: str, variant: str) -> str:
    """Where the workflow writes the cache of one inference job (common.smk's ``cache_file``)."""
    return os.path.join(config["output_dir"], "cache", model, benchmark, f"{variant}.h5")


def tiny_model_path(config: dict, model: str) -> str:
    """Where the workflow builds a tiny model (``ladbench demo-model``) of the study."""
    return os.path.join(config["output_dir"], "models", model)


def benchmark_path(config: dict, benchmark: str) -> str:
    """Where the workflow writes a benchmark file (common.smk's ``benchmark_file``)."""
    return os.path.join(config["output_dir"], "benchmarks", f"{benchmark}.json")


def job_rows(config: dict, benchmark: str, n: int, prompt: str) -> int:
    """Rows of one cache: from the benchmark file if it exists, else from the config."""
    from ladbench.inference.cache import plan_rows

    path = benchmark_path(config, benchmark)
    if os.path.exists(path):
        from ladbench.benchmark import load_benchmark
        return len(plan_rows(load_benchmark(path), shifts_per_ordering=prompt_variant(prompt).shifts_per_ordering))
    bench = config["benchmarks"]
    return (bench["n_eval"] * bench["n_orderings"] * prompt_variant(prompt).rows_per_ordering(n)
            + bench["n_calibration_pool"] * n)


def max_generated_per_row(config: dict, prompt: str) -> int:
    """The most tokens a row of ``prompt`` generates, at the config's prompt settings."""
    entry = prompt_variant(prompt)
    return entry.max_generated_per_row(entry.options(config["inference"]["prompt_settings"].get(prompt)))


def measured_rates(config: dict) -> dict[tuple[str, str, str], dict]:
    """Rates recorded in the study's finished caches, by (model, benchmark, variant)."""
    from ladbench.inference.cache import read_cache_attributes

    rates = {}
    for model in config["models"]:
        for benchmark in study_benchmarks(config):
            for variant in config["inference"]["variants"]:
                path = cache_path(config, model, benchmark, variant)
                if not os.path.exists(path):
                    continue
                attrs = read_cache_attributes(path)
                if attrs.get("rows_per_s", 0) > 0:
                    rates[model, benchmark, variant] = attrs
    return rates


def _generating(prompt: str) -> bool:
    return prompt_variant(prompt).generative


def job_seconds(config: dict, rows: int, prompt: str, n: int, attrs: dict | None) -> tuple[float, int]:
    """(seconds, generated tokens) of ``rows`` rows at the rates of ``attrs`` (a cache's
    attributes) or, where it is None or lacks a generation rate, the assumed ones."""
    if not _generating(prompt):
        rate = attrs["rows_per_s"] if attrs else ASSUMED_ROWS_PER_S_N4 * 4 / n
        return rows / rate, 0
    if attrs and attrs.get("generated_tokens_per_s", 0) > 0 and attrs.get("timed_rows", 0) > 0:
        tokens = round(rows * attrs["generated_tokens"] / attrs["timed_rows"])
        return tokens / attrs["generated_tokens_per_s"], tokens
    tokens = rows * max_generated_per_row(config, prompt)
    return tokens / ASSUMED_GENERATED_TOKENS_PER_S, tokens


def plan_jobs(config: dict) -> list[Job]:
    """Every inference job of the study with its estimated cost."""
    from ladbench.config import benchmark_parts

    measured = measured_rates(config)
    shards = config["inference"]["shards"]
    jobs = []
    for model, spec in config["models"].items():
        gpus = 0 if spec["tiny"] or config["inference"]["device"] == "cpu" else spec["gpus_per_job"]
        for benchmark in study_benchmarks(config):
            n = benchmark_parts(benchmark)[2]
            for variant, vspec in config["inference"]["variants"].items():
                prompt = vspec["prompt"]
                attrs, source = measured.get((model, benchmark, variant)), "measured (this cache)"
                if attrs is None:   # another cache of this model with the same N and kind
                    attrs = next((a for (m, b, v), a in measured.items() if m == model
                                  and benchmark_parts(b)[2] == n
                                  and _generating(config["inference"]["variants"][v]["prompt"]) == _generating(prompt)),
                                 None)
                    source = "measured (similar cache)" if attrs else "assumed"
                rows = job_rows(config, benchmark, n, prompt)
                for shard in range(shards):
                    start, stop = rows * shard // shards, rows * (shard + 1) // shards
                    seconds, tokens = job_seconds(config, stop - start, prompt, n, attrs)
                    jobs.append(Job(model, benchmark, variant, shard, shards, stop - start, tokens, seconds,
                                    max(gpus, 1), source))
    return jobs


def wall_seconds(jobs: list[Job], gpus: int) -> float:
    """Wall time of running ``jobs`` on ``gpus`` GPUs, longest job first, each on the
    GPUs that free up first (a list schedule, as Snakemake's --resources gpu=G allows)."""
    if any(job.gpus > gpus for job in jobs):
        raise ValueError(f"a job needs {max(j.gpus for j in jobs)} GPUs (gpus_per_job) but --gpus is {gpus}")
    free = [0.0] * gpus
    end = 0.0
    for job in sorted(jobs, key=lambda j: -j.seconds):
        taken = [heapq.heappop(free) for _ in range(job.gpus)]
        finish = max(taken) + job.seconds
        for _ in taken:
            heapq.heappush(free, finish)
        end = max(end, finish)
    return end


def report(jobs: list[Job], gpus: int) -> str:
    lines = [f"{'model':<18} {'benchmark':<24} {'variant':<12} {'shard':>6} {'rows':>7} {'gen. tokens':>12} "
             f"{'GPU h':>7}  rate"]
    for j in jobs:
        shard = f"{j.shard + 1}/{j.shards}"
        lines.append(f"{j.model:<18} {j.benchmark:<24} {j.variant:<12} {shard:>6} {j.rows:>7} "
                     f"{j.generated_tokens:>12} {j.gpu_hours:>7.2f}  {j.rate}")
    total = sum(j.gpu_hours for j in jobs)
    longest = max(jobs, key=lambda j: j.seconds)
    assumed = sum(j.rate == "assumed" for j in jobs)
    lines += [
        f"{len(jobs)} inference jobs, {sum(j.rows for j in jobs)} rows, "
        f"{sum(j.generated_tokens for j in jobs)} generated tokens (at most), {total:.1f} GPU hours",
        f"longest job: {longest.seconds / 3600:.2f} h ({longest.model} {longest.benchmark} {longest.variant} "
        f"shard {longest.shard + 1}/{longest.shards})",
        f"wall time of the inference on {gpus} GPU(s): {wall_seconds(jobs, gpus) / 3600:.1f} h",
    ]
    if assumed:
        lines.append(f"{assumed} job(s) at ASSUMED rates (no cache measured yet): {ASSUMED_ROWS_PER_S_N4:g} rows/s "
                     f"at N = 4 (x 4/N), {ASSUMED_GENERATED_TOKENS_PER_S:g} generated tokens/s, replies at their "
                     "length limit; conservative guesses for a 3-8B model on one GPU, not measurements")
    return "\n".join(lines)
