"""What a study's inference will cost, before running it.

Lists every inference job the config makes (model x benchmark x variant x shard) with its
rows, the tokens it may generate and its estimated GPU hours, and the study's wall time on
G GPUs. Rates come from caches already written for the study (``rows_per_s``,
``generated_tokens_per_s`` and the mean ``n_generated`` per row, docs/formats.md §4): the
same job's cache, else another cache of the same model, N and kind (scoring or
generating); else, for a model given a benchmark's rates (``--rates MODEL=FILE``: what
``benchmarks/bench_inference.py --device cuda`` measured on the model's architecture at full
size with random weights), those; else the conservative defaults below, marked "assumed".
Generated tokens without a measurement from a cache are the upper bound (every reply runs to
its length limit). A benchmark's generation is its own run's, with short replies: where the
file keeps its seconds apart, a job costs its rows' prefills and a decode step per token of each
sequence in flight (:class:`GenerationRate`), else the run's tokens/s. No torch, no model: it
reads the config, benchmark files where they exist, cache attributes and the benchmark JSON
files given.
"""

from __future__ import annotations

import heapq
import json
import math
import os
from dataclasses import dataclass

from ladbench.config import study_benchmarks
from ladbench.inference.runner import DECODE_WAYS, InferenceSettings, decode_sequences
from ladbench.settings import setting_defaults
from ladbench.study_paths import StudyPaths
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


@dataclass(frozen=True)
class BenchRates:
    """The GPU rates ``benchmarks/bench_inference.py --device cuda`` measured for one architecture
    (full size, random weights: the arithmetic of the real model, not its replies)."""

    source: str                                              # FILE#ARCH, and the GPU's name where the file has it
    scoring: tuple[tuple[int, int, float, str], ...] = ()    # (N, batch, rows/s of `ladbench infer`, over what)
    generation: tuple["GenerationRate", ...] = ()

    def rows_per_s(self, n: int, batch: int) -> tuple[float, str] | None:
        """Scoring rows/s at N = ``n`` and the measured batch nearest ``batch`` (on a log scale,
        the smaller on a tie), and how it was taken; at the nearest N measured when ``n`` was
        not, scaled by N'/N (a row's prompt grows with N), as the assumed rate is."""
        if not self.scoring:
            return None
        measured_n = min({e[0] for e in self.scoring}, key=lambda m: (abs(m - n), m))
        m, b, rate, over = _nearest_on_log_scale([e for e in self.scoring if e[0] == measured_n], batch)
        return rate * m / n, f"N = {m}{f' x {m}/{n}' if m != n else ''}, batch {b}{over}"

    def generation_rate(self, prompt: str, way: str, slots: int, reply_limit: int) -> "GenerationRate | None":
        """The generation of ``prompt`` the ``way`` it decodes (``inference.decode``) measured at the
        sequences in flight nearest ``slots`` (on a log scale, the smaller on a tie), and of those
        the one whose replies ran nearest the job's ``reply_limit`` (a longer reply's decode steps
        read a longer KV cache; a file that did not record its limit comes last); None where that
        way was not measured."""
        entries = [e for e in self.generation if e.prompt == prompt and e.way == way]
        if not entries:
            return None
        nearest = _nearest_on_log_scale(entries, slots, size_of=lambda e: e.slots).slots
        return min((e for e in entries if e.slots == nearest),
                   key=lambda e: math.inf if e.reply_limit is None else abs(math.log(e.reply_limit / reply_limit)))

    def merged(self, other: "BenchRates") -> "BenchRates":
        """Both files' rates for one model (a GPU session writes scoring and generation apart);
        the later file's generation of a prompt, a way, a number of sequences and a reply limit wins."""
        later = {e.key for e in other.generation}
        kept = tuple(e for e in self.generation if e.key not in later)
        return BenchRates(f"{self.source} + {other.source}", self.scoring + other.scoring, kept + other.generation)


@dataclass(frozen=True)
class GenerationRate:
    """One generation run of a benchmark file (``bench_inference.py --generation``): the way it
    decoded, the sequences it kept in flight, its generated tokens/s over the whole run and, in
    files since 2026-11-28, its seconds apart: the prefills' per row (at N = ``n``) and the rest
    per decode step. A benchmark's replies are short (64 tokens on a GPU), so its tokens/s is
    mostly its prefills'; a study's replies run to 512 or 1,024 tokens, which the split prices."""

    prompt: str
    way: str                                    # inference.decode: slots, static or generate
    slots: int                                  # sequences in flight
    tokens_per_s: float
    prefill_s_per_row: float | None = None
    decode_step_s: float | None = None
    n: int | None = None                        # the candidates of the rows measured
    run: str = ""                               # which run the split is of ("second run": shapes met before)
    reply_limit: int | None = None              # the longest reply the run allowed (files since 2026-11-28)

    @property
    def key(self) -> tuple[str, str, int, int | None]:
        return self.prompt, self.way, self.slots, self.reply_limit

    def split(self) -> bool:
        return self.prefill_s_per_row is not None and self.decode_step_s is not None

    def attrs(self, n: int) -> tuple[dict, str]:
        """Cache-like attributes of a job at N = ``n`` (:func:`job_seconds`), and their label. The
        prefill per row scales by N / the measured N (a row's prompt grows with N, as the scoring
        rates' do); a step's time is the benchmark's, at the KV lengths of its replies (the label
        gives their limit where the file recorded it)."""
        way = "" if self.way == DECODE_WAYS[0] else f"{self.way}, "
        replies = f", replies to {self.reply_limit} tokens" if self.reply_limit else ""
        label = f"{way}{self.slots} sequences in flight{replies}"
        if not self.split():
            return {"generated_tokens_per_s": self.tokens_per_s}, f"benchmark ({label})"
        scale = n / self.n if self.n else 1.0
        scaled = f" x {n}/{self.n}" if self.n and self.n != n else ""
        return ({"prefill_s_per_row": self.prefill_s_per_row * scale, "decode_step_s": self.decode_step_s,
                 "decode_slots": self.slots},
                f"benchmark ({label}{f', {self.run}' if self.run else ''}: prefill {self.prefill_s_per_row:.3f} s/row"
                f"{scaled} + {1e3 * self.decode_step_s:.1f} ms/step)")


def _nearest_on_log_scale(entries: list, size: int, size_of=lambda e: e[1]):
    """The measurement whose size (a batch, sequences in flight: ``size_of`` it; a scoring entry's
    second field) is nearest ``size`` on a log scale, the smaller on a tie."""
    return min(entries, key=lambda e: (abs(math.log(size_of(e) / size)), size_of(e)))


def bench_rates(specs: list[str]) -> dict[str, BenchRates]:
    """The ``--rates`` options by model key, a model's files merged."""
    by_model: dict[str, BenchRates] = {}
    for spec in specs:
        model, rates = read_bench_rates(spec)
        by_model[model] = by_model[model].merged(rates) if model in by_model else rates
    return by_model


def read_bench_rates(spec: str) -> tuple[str, BenchRates]:
    """``MODEL=FILE`` or ``MODEL=FILE#ARCH`` (``ladbench plan --rates``): the config's model
    ``MODEL`` and the rates FILE (a ``bench_inference.py --json`` file of a GPU run) holds for
    its one architecture, or for ARCH."""
    model, equals, where = spec.partition("=")
    if not (model and equals and where):
        raise ValueError(f"--rates {spec!r}: expected MODEL=FILE (or MODEL=FILE#ARCH)")
    path, _, arch = where.partition("#")
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except OSError as exc:
        raise ValueError(f"--rates: {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"--rates: {path}: not a JSON file of benchmarks/bench_inference.py") from None
    device = str(document.get("device", "")) if isinstance(document, dict) else ""
    if not device.startswith("cuda"):
        raise ValueError(f"--rates: {path}: measured on {device or 'no device'!r}, not a GPU; GPU hours take a "
                         "GPU's rates (bench_inference.py --device cuda)")
    scoring = {name: parts.get("throughput") or [] for name, parts in (document.get("gpu") or {}).items()}
    generation = [entry for entry in document.get("generation") or [] if isinstance(entry, dict)]
    archs = sorted(set(scoring) | {str(entry.get("model")) for entry in generation})
    if not arch and len(archs) != 1:
        raise ValueError(f"--rates: {path} holds the rates of {', '.join(archs) or 'no architecture'}: name one, "
                         f"{model}=FILE#ARCH")
    arch = arch or archs[0]
    if arch not in archs:
        raise ValueError(f"--rates: {path} holds no rates of {arch!r} (it has {', '.join(archs) or 'none'})")
    gpu = document.get("gpu_name")
    try:
        return model, BenchRates(
            f"{path}#{arch}" + (f" ({gpu})" if isinstance(gpu, str) and gpu else ""),
            tuple(rate for e in scoring.get(arch, []) if _stage_way(e) for rate in _scoring_rates(e)),
            tuple(rate for e in generation if e.get("model") == arch for rate in _generation_rates(e)))
    except (KeyError, TypeError, ValueError) as exc:          # a field missing, or not a number
        raise ValueError(f"--rates: {path}: a measurement of {arch!r} is not as bench_inference.py writes it "
                         f"({type(exc).__name__}: {exc})") from None


def _stage_way(entry: dict) -> bool:
    """Whether a benchmark's ``infer`` run ran the stage's own way, not a way it is compared with:
    every inference setting it records (``score_ahead``, ``vision_tower``...) at its default."""
    return all(entry[name] == default for name, default in setting_defaults(InferenceSettings).items() if name in entry)


def _scoring_rates(entry: dict) -> list[tuple[int, int, float, str]]:
    """An ``infer`` run's rows/s: over the second half of its rows where the file has it (a
    study's job runs thousands of rows and pays the start-up of its first batches once; files
    before 2026-11-27 have only the rate over every row), else over every row."""
    steady, every = float(entry.get("rows_per_s_steady") or 0), float(entry.get("rows_per_s") or 0)
    rate, over = (steady, ", second half") if steady > 0 else (every, "")
    return [(int(entry["n"]), int(entry["batch"]), rate, over)] if rate > 0 else []


def _generation_rates(entry: dict) -> list[GenerationRate]:
    """The generation runs of one measurement: the decode loop's at its ``slots`` (a run before
    they were recorded had its prefill group's, batch x samples) with the split of its second run
    where the file has it (of its first, else), at the prefill group's alone and with every
    sequence in flight where it also ran so, with static shapes (compiled, and as CUDA graphs of the
    eager step), and plain ``generate`` (the
    prefill group's sequences)."""
    group = int(entry.get("batch", 1)) * int(entry.get("samples", 1))
    slots = entry.get("slots") or group
    run = "second run" if entry.get("ours_second_run_decode_step_s") is not None else ""
    measured = [("slots", slots, "ours", "ours_second_run" if run else "ours", run),
                ("slots", entry.get("group_slots"), "group", "group", ""),
                ("slots", entry.get("wide_slots"), "wide", "wide", ""),
                ("static", slots, "static", "static", ""),
                ("graphs", slots, "graphs", "graphs", ""),
                ("generate", group, "plain", None, "")]
    n = entry.get("n")
    rates = []
    for way, size, rate_name, split_name, split_run in measured:
        rate = float(entry.get(f"{rate_name}_tokens_per_s", 0) or 0)
        if not size or rate <= 0:
            continue
        prefill, step = (entry.get(f"{split_name}_prefill_s_per_row"), entry.get(f"{split_name}_decode_step_s")) \
            if split_name else (None, None)
        rates.append(GenerationRate(str(entry["variant"]), way, int(size), rate,
                                    None if prefill is None else float(prefill), None if step is None else float(step),
                                    int(n) if n else None, split_run if step is not None else "",
                                    int(limit) if (limit := entry.get("max_new_tokens")) else None))
    return rates


def cache_path(config: dict, model: str, benchmark: str, variant: str) -> str:
    """Where the workflow writes the cache of one inference job."""
    return StudyPaths(config).cache_file(model, benchmark, variant)


def benchmark_path(config: dict, benchmark: str) -> str:
    """Where the workflow writes a benchmark file."""
    return StudyPaths(config).benchmark_file(benchmark)


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
    return prompt_variant(prompt).max_generated_per_row(prompt_options(config, prompt))


def prompt_options(config: dict, prompt: str):
    """The settings of a prompt variant in this config (its defaults where it gives none)."""
    return prompt_variant(prompt).options(config["inference"]["prompt_settings"].get(prompt))


def decode_way(config: dict) -> str:
    """How a config's generative jobs decode (``inference.decode``)."""
    return config["inference"].get("decode") or DECODE_WAYS[0]


def decode_slots(config: dict, prompt: str, batch: int) -> int:
    """The sequences a job of ``prompt`` keeps in flight on a GPU at the config's settings
    (``generate``: a batch's rows, each sample its own sequence, whatever ``decode_slots``)."""
    samples = prompt_variant(prompt).samples_per_row(prompt_options(config, prompt))
    if decode_way(config) == "generate":
        return samples * batch
    return decode_sequences(samples, batch, config["inference"].get("decode_slots"), gpu=True)


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
    tokens = rows * max_generated_per_row(config, prompt)          # unless a cache measured them
    if attrs and attrs.get("decode_step_s") is not None:              # a benchmark's seconds apart
        steps = math.ceil(tokens / attrs["decode_slots"])             # every sequence in flight to its limit
        return rows * attrs["prefill_s_per_row"] + steps * attrs["decode_step_s"], tokens
    if attrs and attrs.get("generated_tokens_per_s", 0) > 0:
        if attrs.get("timed_rows", 0) > 0 and "generated_tokens" in attrs:
            tokens = round(rows * attrs["generated_tokens"] / attrs["timed_rows"])
        return tokens / attrs["generated_tokens_per_s"], tokens
    return tokens / ASSUMED_GENERATED_TOKENS_PER_S, tokens


def benchmark_attrs(config: dict, model: str, prompt: str, n: int, rates: BenchRates) -> tuple[dict, str] | None:
    """Cache-like rate attributes of a job from a benchmark's rates, and their label; None
    where the benchmark did not measure that kind of job."""
    batch = config["models"][model].get("batch_size") or config["inference"]["batch_size"]
    if _generating(prompt):
        taken = rates.generation_rate(prompt, decode_way(config), decode_slots(config, prompt, batch),
                                      prompt_options(config, prompt).max_new_tokens)
        return None if taken is None else taken.attrs(n)
    taken = rates.rows_per_s(n, batch)
    return None if taken is None else ({"rows_per_s": taken[0]}, f"benchmark ({taken[1]})")


def plan_jobs(config: dict, bench: dict[str, BenchRates] | None = None) -> list[Job]:
    """Every inference job of the study with its estimated cost; ``bench``: benchmark rates by
    model key (:func:`read_bench_rates`), used where no cache measured the job."""
    from ladbench.config import benchmark_parts

    bench = bench or {}
    unknown = sorted(set(bench) - set(config["models"]))
    if unknown:
        raise ValueError(f"--rates: no model {unknown[0]!r} in the config (its models: {', '.join(config['models'])})")
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
                if attrs is None and model in bench:
                    attrs, source = benchmark_attrs(config, model, prompt, n, bench[model]) or (None, "assumed")
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


def report(jobs: list[Job], gpus: int, bench: dict[str, BenchRates] | None = None) -> str:
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
    benchmarked = sum(j.rate.startswith("benchmark") for j in jobs)
    if benchmarked:
        sources = ", ".join(f"{model}: {rates.source}" for model, rates in (bench or {}).items())
        lines.append(f"{benchmarked} job(s) at BENCHMARK rates ({sources}): the architecture at full size with random "
                     "weights on a GPU; generation's replies at their length limit")
    if assumed:
        lines.append(f"{assumed} job(s) at ASSUMED rates (no cache measured yet): {ASSUMED_ROWS_PER_S_N4:g} rows/s "
                     f"at N = 4 (x 4/N), {ASSUMED_GENERATED_TOKENS_PER_S:g} generated tokens/s, replies at their "
                     "length limit; conservative guesses for a 3-8B model on one GPU, not measurements")
    return "\n".join(lines)
