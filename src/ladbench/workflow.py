"""The workflow's logic, in Python that tests and linters read: the Snakefile's rules take their
paths, target lists, flags and the methods of each cache from a :class:`Study` built here from
the validated config (:func:`start`). ``workflow/rules/common.smk`` keeps only what Snakemake
itself needs (its config, its ``report()`` marks, the start-up hooks).

Every output path of the study is built by a ``*_file`` / ``*_dir`` method of
:class:`ladbench.study_paths.StudyPaths`, called with names or with wildcard patterns such as
``"{model}"``; no rule spells a path. Nothing reads identity back out of these paths: every
output records what it is.
"""

from __future__ import annotations

import itertools
import os
import shlex
import sys
from typing import Any, Callable, Sequence

from ladbench.analysis import SweepSettings
from ladbench.benchmark import BenchmarkSettings
from ladbench.calibration import FitSettings
from ladbench.clip import TINY_CLIP_NAME, ClipSettings
from ladbench.config import (benchmark_parts, check_environment, layer_range_arg, load_schema, model_layer_range,
                             read_yaml, startup_warnings, study_benchmarks, validate_config)
from ladbench.evaluation import default_methods
from ladbench.inference.runner import InferenceSettings
from ladbench.methods import METHODS, LadSettings, ReadoutSettings
from ladbench.metrics import Bootstrap
from ladbench.model_checks import check_hub_models, check_models
from ladbench.report.explorer import Thumbnails
from ladbench.report.render import TABLE_FORMATS
from ladbench.report.tables import TABLE_BUILDERS
from ladbench.settings import command_options
from ladbench.plugins import PLUGINS_ENV
from ladbench.study_paths import FIGURES, StudyPaths

__all__ = ["Study", "StudyFlags", "StudyTargets", "flags", "keep_caches_under", "name_pattern", "put_ladbench_on_path", "start"]


def flags(**options: Any) -> str:
    """Command-line flags from keyword options: tau=5 -> --tau 5; True -> bare flag;
    False/None -> omitted; lists -> repeated values."""
    parts = []
    for key, value in options.items():
        flag = f"--{key.replace('_', '-')}"
        if value is None or value is False:
            continue
        if value is True:
            parts.append(flag)
        elif isinstance(value, (list, tuple)):
            parts.append(f"{flag} {' '.join(shlex.quote(str(v)) for v in value)}")
        else:
            parts.append(f"{flag} {shlex.quote(str(value))}")
    return " ".join(parts)


def cpu_threads(tiny: bool) -> int:
    """Cores a CPU job of the models (features, infer) claims: 2, or 1 for a tiny model, whose
    matrices are too small for a second thread to pay; so the demo's other jobs run beside the
    organism's single-threaded training instead of waiting for both cores until it ends."""
    return 1 if tiny else 2


def name_pattern(names: Sequence[str]) -> str:
    """A wildcard constraint matching exactly ``names`` (nothing when there are none)."""
    return "|".join(names) or "(?!)"


def _unmarked(path: str, **_: Any) -> str:
    """Snakemake's ``report()`` where there is no Snakemake (the paths unchanged)."""
    return path


# --------------------------------------------------------------------------- start-up


def start(config: dict, config_files: Sequence[str], schema_path: str,
          report: Callable[..., Any] = _unmarked, in_job: bool = False) -> tuple[Study, list[str]]:
    """Everything knowable at start-up, checked before any job runs: each config file (duplicate
    keys, with their line), every value against the schema (defaults filled into ``config``),
    the names that refer to each other and what the config names on this machine (model
    folders, offline caches). Returns the study (``report``: Snakemake's ``report()``) and the
    warnings to print; raises ConfigError. ``in_job``: the Snakemake of one job (a cluster
    job's): what the config names is checked again on its machine, which may not be its run's,
    but not the models' files, which its run checked (and warned of) at its start."""
    source = config_source(config_files)
    for path in config_files:
        read_yaml(path)
    validate_config(config, load_schema(schema_path), source=source)
    check_environment(config, source=source)
    if in_job:
        return Study(config, report), []
    warnings = startup_warnings(config) + check_models(config, source)      # each model's config.json, if here
    return Study(config, report), [f"{source}: {warning}" for warning in warnings]


def start_run(config: dict, config_files: Sequence[str]) -> list[str]:
    """The start-up checks of the hub models not on this machine yet, from their ``config.json``
    fetched now (:func:`ladbench.model_checks.check_hub_models`): the workflow's ``onstart``, so
    only a run with jobs to do asks the hub, not a dry run nor a cluster job. Returns the
    warnings to print; raises ConfigError."""
    source = config_source(config_files)
    return [f"{source}: {warning}" for warning in check_hub_models(config, source)]


def config_source(config_files: Sequence[str]) -> str:
    """How the console names the study's config files."""
    return " ".join(map(str, config_files)) or "config.yaml"


def put_ladbench_on_path() -> None:
    """Put the folder of the running interpreter first on PATH when it holds the ``ladbench``
    command, so that the workflow's jobs run the ``ladbench`` of the Python that runs
    Snakemake: ``.venv/bin/snakemake`` works without activating the venv. (With
    ``--use-conda`` a job's conda environment is activated in front of it.)"""
    folder = os.path.dirname(sys.executable)
    if os.path.exists(os.path.join(folder, "ladbench")):
        os.environ["PATH"] = os.pathsep.join([folder, os.environ.get("PATH", "")])


def keep_caches_under(folder: str) -> None:
    """Make the workflow's jobs keep library caches under ``folder`` (the study's output folder)
    rather than under $HOME: matplotlib's font cache and config (else ~/.cache/matplotlib and
    ~/.config/matplotlib). Hugging Face's cache is left where the user keeps it: their models
    are there."""
    os.environ["MPLCONFIGDIR"] = os.path.abspath(os.path.join(folder, "matplotlib"))


# --------------------------------------------------------------------------- the study
# Three pieces, one concern each: where every file is (StudyPaths, ladbench.study_paths), what
# the rules must make and from what (StudyTargets), what each rule's command is told
# (StudyFlags: flags, threads, GPUs). Study joins them for the rules.


class StudyTargets(StudyPaths):
    """The study's names (models, benchmarks, cache variants), the rules' target lists and
    each rule's inputs, from the paths. ``report`` marks an output for ``snakemake --report``
    (Snakemake's ``report()``; unchanged paths without it)."""

    def __init__(self, config: dict, report: Callable[..., Any] = _unmarked) -> None:
        super().__init__(config)
        self.report = report
        self.models = list(config["models"])
        self.variants = list(config["inference"]["variants"])
        self.benchmarks = study_benchmarks(config)
        self.cal_seeds = config["calibration"]["seeds"]
        # Tiny models with an `organism` section are trained (organism.smk); the others are random.
        tiny = [m for m in self.models if config["models"][m]["tiny"]]
        self.organisms = [m for m in tiny if "organism" in config["models"][m]]
        self.random_tiny = [m for m in tiny if m not in self.organisms]
        # variants whose cache holds vanilla-prompt scores and attention (the analysed ones)
        self.vanilla_variants = [v for v in self.variants if self.prompt(v) == "vanilla"]
        # an explorer page per vanilla-prompt cache whose evaluation used a calibration
        self.explorer_variants = [v for v in self.vanilla_variants if self.needs_calibration(v)]

    def prompt(self, variant: str) -> str:
        return self.config["inference"]["variants"][variant]["prompt"]

    def variant_methods(self, variant: str) -> list[str]:
        """The methods a cache is evaluated with (ladbench.evaluation.default_methods)."""
        return default_methods(self.prompt(variant), self.config["evaluation"]["methods"])

    def needs_calibration(self, variant: str) -> bool:
        """Whether a method evaluated on the cache variant ``variant`` reads a calibration."""
        return any(METHODS[method].needs_calibration for method in self.variant_methods(variant))

    # ---- inputs of the rules ----------------------------------------------------------------
    def captions_inputs(self, wildcards) -> list[str]:
        """Synthetic scenes and downloads are made by the workflow; local copies must exist."""
        ds = self.dataset(wildcards.dataset)
        tables = self.reference_table_files(wildcards.dataset)
        if ds["source"] == "synthetic":
            return [self.scenes_dir(wildcards.dataset), *tables]
        if ds["download"]:
            return [self.download_marker(wildcards.dataset), *tables]
        return [f for f in self.annotation_files(wildcards.dataset).values() if f is not None] + tables

    def clip_inputs(self, wildcards) -> list[str]:
        return [self.tiny_clip_dir] if self.config["clip"]["tiny"] else []

    def model_inputs(self, wildcards) -> list[str]:
        """A tiny model's folder (built by the workflow) and a chat template the config gives."""
        template = self.chat_template_file(wildcards.model)
        return ([self.model_dir(wildcards.model)] if self.config["models"][wildcards.model]["tiny"] else []) + (
            [template] if template else [])

    def benchmark_inputs(self, wildcards) -> dict[str, str]:
        return {"images": self.image_table(wildcards.dataset), "features": self.features_file(wildcards.dataset)}

    def benchmark_images(self, wildcards) -> str:
        """The image table of a benchmark's dataset."""
        return self.image_table(benchmark_parts(wildcards.benchmark)[0])

    def shard_files(self, wildcards) -> list[str]:
        return [self.shard_file(wildcards.model, wildcards.benchmark, wildcards.variant, i) for i in range(self.shards)]

    def infer_output(self) -> str:
        """What an infer job writes: the cache, or one shard of it (inference.shards > 1)."""
        if self.shards == 1:
            return self.cache_file("{model}", "{benchmark}", "{variant}")
        return self.shard_file("{model}", "{benchmark}", "{variant}", "{shard}")

    def infer_log(self) -> str:
        if self.shards == 1:
            return self.log_file("infer", "{model}", "{benchmark}", "{variant}")
        return self.log_file("infer", "{model}", "{benchmark}", "{variant}", f"{{shard}}-of-{self.shards}")

    def evaluation_inputs(self, wildcards) -> dict[str, Any]:
        inputs: dict[str, Any] = {"cache": self.cache_file(wildcards.model, wildcards.benchmark, wildcards.variant)}
        if self.needs_calibration(wildcards.variant):
            inputs["calibrations"] = [self.calibration_file(wildcards.model, wildcards.cal_benchmark, wildcards.variant,
                                                            seed) for seed in self.cal_seeds]
        return inputs

    def model_evaluations(self, wildcards) -> list[str]:
        """Same-benchmark evaluations of one model's vanilla-prompt caches (Fig. 5)."""
        return [self.evaluation_file(wildcards.model, b, v) for b in self.benchmarks for v in self.vanilla_variants]

    def model_analyses(self, wildcards) -> list[str]:
        return [self.analysis_file(wildcards.model, b, v) for b in self.benchmarks for v in self.vanilla_variants]

    def model_analysis_arrays(self, wildcards) -> list[str]:
        return [self.analysis_file(wildcards.model, b, v, "npz") for b in self.benchmarks for v in self.vanilla_variants]

    def explorer_inputs(self, wildcards) -> dict[str, str]:
        """What a page is built from: the cache, the evaluation's first calibration draw, the
        evaluation (JSON and predictions), the benchmark (captions) and the image table (thumbnails)."""
        model, benchmark, variant = wildcards.model, wildcards.benchmark, wildcards.variant
        return {
            "cache": self.cache_file(model, benchmark, variant),
            "calibration": self.calibration_file(model, benchmark, variant, self.cal_seeds[0]),
            "evaluation": self.evaluation_file(model, benchmark, variant),
            "predictions": self.evaluation_file(model, benchmark, variant, ext="npz"),
            "benchmark": self.benchmark_file(benchmark),
            "images": self.image_table(benchmark_parts(benchmark)[0]),
        }

    # ---- target lists ---------------------------------------------------------------------
    @property
    def caches(self) -> list[str]:
        return [self.cache_file(m, b, v) for m in self.models for b in self.benchmarks for v in self.variants]

    @property
    def evaluations(self) -> list[str]:
        return [self.evaluation_file(m, b, v) for m in self.models for b in self.benchmarks for v in self.variants]

    @property
    def transfers(self) -> list[str]:
        """Calibrate on one benchmark, evaluate on another (Table 3): evaluation.transfer."""
        return [self.evaluation_file(m, t["evaluate_on"], v, t["calibrate_on"]) for m in self.models
                for v in self.variants if self.needs_calibration(v) for t in self.config["evaluation"]["transfer"]]

    @property
    def analyses(self) -> list[str]:
        return [self.analysis_file(m, b, v) for m in self.models for b in self.benchmarks for v in self.vanilla_variants]

    def table_files(self) -> list[Any]:
        """Every table in every format; the HTML rendering goes into `snakemake --report`."""
        return [self.report(self.table_file(name, fmt), caption=f"../report/{name}.rst", category="Tables")
                if fmt == "html" else self.table_file(name, fmt)
                for name in TABLE_BUILDERS for fmt in TABLE_FORMATS]

    def figure_files(self, figure: str, subcategory: str) -> list[Any]:
        """A figure (a name of ``FIGURES``, its wildcards kept) in every configured format; the
        PNG (else the first format) goes into the HTML report with its caption."""
        stem, caption = FIGURES[figure]
        formats = self.config["report"]["figure_formats"]
        shown = "png" if "png" in formats else formats[0]
        return [self.report(self.figure_file(stem, ext), caption=f"../report/{caption}.rst", category="Figures",
                            subcategory=subcategory) if ext == shown else self.figure_file(stem, ext)
                for ext in formats]

    def report_figures(self) -> list[str]:
        """Every figure of the study: each of ``FIGURES`` for every cache (vanilla-prompt
        variants) or every model its stem names, in every figure format."""
        names = {"model": self.models, "benchmark": self.benchmarks, "variant": self.vanilla_variants}
        paths = []
        for stem, _ in FIGURES.values():
            wildcards = [name for name in names if f"{{{name}}}" in stem]
            for values in itertools.product(*(names[name] for name in wildcards)):
                paths += [self.figure_file(stem.format(**dict(zip(wildcards, values))), ext)
                          for ext in self.config["report"]["figure_formats"]]
        return paths

    @property
    def explorer_keys(self) -> list[tuple[str, str, str]]:
        return [(m, b, v) for m in self.models for b in self.benchmarks for v in self.explorer_variants]

    @property
    def explorers(self) -> list[str]:
        return [self.explorer_file(*key) for key in self.explorer_keys]


class StudyFlags(StudyTargets):
    """What each rule's command is told: its flags (the settings carriers' hand-over and the
    names of its wildcards), its threads and its GPUs."""

    def settings_options(self, *carriers: type, **given: Any) -> dict[str, Any]:
        """The config's values of the carriers' keys, as a stage's options (ladbench.settings);
        ``given``: the values of a (single) carrier's fields that its section does not hold."""
        return {key: value for carrier in carriers
                for key, value in command_options(carrier, self.config[carrier.section], **given).items()}

    def scenes_flags(self, wildcards) -> str:
        ds = self.dataset(wildcards.dataset)
        return flags(n_images=ds["n_images"], image_size=ds["image_size"], seed=ds["seed"])

    def captions_flags(self, wildcards) -> str:
        files = self.annotation_files(wildcards.dataset)
        ds = self.dataset(wildcards.dataset)
        return flags(captions_json=files["captions"], instances_json=files["instances"], image_root=files["images"],
                     reference_tables=ds.get("reference_tables"), files_outside_root=ds["files_outside_root"])

    def clip_flags(self) -> str:
        if not self.config["clip"]["tiny"]:
            return flags(**self.settings_options(ClipSettings))
        # `ladbench demo-clip` writes this config and checkpoint; they load like a real model.
        stem = f"{self.tiny_clip_dir}/{TINY_CLIP_NAME}"
        return flags(**self.settings_options(ClipSettings, model=TINY_CLIP_NAME, pretrained=f"{stem}.pt",
                                             model_config=f"{stem}.json"))

    def organism_flags(self, wildcards) -> str:
        """The organism learns the study's prompt at its sizes and image resolution, on scenes
        drawn like the synthetic dataset's; its own section sets the rest (steps, seed, pull...)."""
        scene_sizes = [d["image_size"] for d in self.config["datasets"].values() if d["source"] == "synthetic"]
        return flags(n_candidates=self.config["benchmarks"]["n_candidates"],
                     image_size=self.config["inference"]["image_size"],
                     scene_size=scene_sizes[0] if scene_sizes else None,
                     **self.config["models"][wildcards.model]["organism"])

    def benchmark_flags(self, wildcards) -> str:
        return flags(**self.settings_options(BenchmarkSettings, calibration_source=self.config["calibration"]["source"]))

    def infer_on_gpu(self, wildcards) -> bool:
        return not self.config["models"][wildcards.model]["tiny"] and self.config["inference"]["device"] != "cpu"

    def infer_threads(self, wildcards) -> int:
        """On the CPU 2, or 1 for a tiny model (see ``cpu_threads``); on a GPU one for the model's
        process plus one per DataLoader worker (default 8)."""
        if not self.infer_on_gpu(wildcards):
            return cpu_threads(self.config["models"][wildcards.model]["tiny"])
        workers = self.config["inference"].get("workers")
        return 1 + (8 if workers is None else workers)

    def features_threads(self, wildcards) -> int:
        return cpu_threads(self.config["clip"]["tiny"])

    def infer_gpus(self, wildcards) -> int:
        """GPUs of one infer job (its `gpu` resource): the model's gpus_per_job, 0 on the CPU.
        The job claims that many distinct devices itself (`ladbench infer --gpus`)."""
        return self.config["models"][wildcards.model]["gpus_per_job"] if self.infer_on_gpu(wildcards) else 0

    def infer_flags(self, wildcards) -> str:
        model = self.config["models"][wildcards.model]
        variant = self.config["inference"]["variants"][wildcards.variant]
        options = self.settings_options(InferenceSettings)
        if "batch_size" in model:
            options["batch_size"] = model["batch_size"]         # a model's own batch size wins
        return flags(
            model_name=wildcards.model, variant_name=wildcards.variant, family=model["family"],
            model_path=self.model_dir(wildcards.model), revision=None if model["tiny"] else model["revision"],
            trust_remote_code=model["trust_remote_code"], chat_template=self.chat_template_file(wildcards.model),
            prompt=variant["prompt"], identifiers=variant["identifiers"],
            **options, shard_index=getattr(wildcards, "shard", None), shard_count=self.shards if self.shards > 1 else None,
            **self.prompt_setting_options(variant["prompt"]),
        )

    def prompt_setting_options(self, prompt: str) -> dict[str, Any]:
        """The prompt variant's own settings (inference.prompt_settings.<prompt>) as the infer
        stage's --<prompt>-<setting> flags."""
        settings = self.config["inference"]["prompt_settings"].get(prompt, {})
        return {f"{prompt}_{key}": value for key, value in settings.items()}

    def calibration_flags(self) -> str:
        return flags(**self.settings_options(FitSettings))

    def method_options(self, model: str) -> dict[str, Any]:
        """The methods' settings for ``model`` (shared by evaluate and analyze): its layer
        range and the lad and readout settings."""
        return dict(layer_range=layer_range_arg(model_layer_range(self.config["models"][model])),
                    **self.settings_options(LadSettings, ReadoutSettings))

    def evaluation_flags(self, wildcards) -> str:
        return flags(**self.method_options(wildcards.model), methods=self.variant_methods(wildcards.variant),
                     **self.settings_options(Bootstrap), transfer=wildcards.cal_benchmark != wildcards.benchmark)

    def analysis_flags(self, wildcards) -> str:
        return flags(**self.method_options(wildcards.model), n_cal=self.n_cal, seeds=self.cal_seeds,
                     **self.settings_options(FitSettings, SweepSettings, Bootstrap))

    def study_flags(self) -> str:
        """What the report needs to read the files: names, orders and each variant's prompt."""
        return flags(models=self.models, benchmarks=self.benchmarks,
                     variants=[f"{v}={self.prompt(v)}" for v in self.variants])

    def table_flags(self) -> str:
        sources = [f"{name}={spec['source']}" for name, spec in self.config["datasets"].items()]
        return flags(n_cal=self.n_cal, dataset_sources=sources, formats=TABLE_FORMATS)

    def explorer_flags(self) -> str:
        return flags(**self.settings_options(Thumbnails))


class Study(StudyFlags):
    """The study of one validated config, as the workflow's rules see it: its paths
    (:class:`~ladbench.study_paths.StudyPaths`), target lists and inputs (:class:`StudyTargets`)
    and each rule's flags (:class:`StudyFlags`)."""

    def prepare_jobs(self) -> None:
        """What the jobs inherit: the config's plugins (imported by every `ladbench` command),
        the `ladbench` beside the Python running Snakemake, and library caches kept under the
        output folder rather than $HOME (README "Reliability")."""
        os.environ[PLUGINS_ENV] = ",".join(self.config["plugins"])
        put_ladbench_on_path()
        keep_caches_under(f"{self.out}/.cache")


def output_folder(wildcards, output) -> str:
    """The folder of a rule's first output (where `report tables` writes every table)."""
    return os.path.dirname(output[0])
