# Shared by all included files: the validated config, output paths, and helpers that map
# config entries to the inputs and command-line flags of each stage.
import os
import shlex
import sys

from ladbench.config import (ConfigError, benchmark_parts, check_environment, layer_range_arg, load_schema,
                             model_layer_range, read_yaml, startup_warnings, study_benchmarks, validate_config)
from ladbench.atomic import LockedError, lock_output_dir
from ladbench.cli import keep_caches_under, put_ladbench_on_path
from ladbench.plan import benchmark_path, cache_path
from ladbench.data.reference_tables import CAPTIONS_FILE as REFERENCE_CAPTIONS, CATEGORIES_FILE as REFERENCE_CATEGORIES
from ladbench.methods import METHODS
from ladbench.variants import PLUGINS_ENV, variant as prompt_variant

# Everything knowable at start-up is checked here, before any job runs: each config file
# (duplicate keys, with their line), every value against the schema, the names that refer
# to each other, and what the config names on this machine (model folders, offline caches).
_SOURCE = " ".join(str(path) for path in workflow.overwrite_configfiles) or "config.yaml"
try:
    for _path in workflow.overwrite_configfiles:
        read_yaml(_path)
    validate_config(config, load_schema(workflow.source_path("../schemas/config.schema.yaml")), source=_SOURCE)
    check_environment(config, source=_SOURCE)
except ConfigError as error:
    raise WorkflowError(f"invalid configuration: {error}")
for _warning in startup_warnings(config):
    print(f"WARNING: {_SOURCE}: {_warning}", file=sys.stderr)
# The config's plugins (imported by validate_config: they register variants and methods) are
# imported by every `ladbench` command the jobs run too.
os.environ[PLUGINS_ENV] = ",".join(config["plugins"])

# The jobs run `ladbench`, found beside the Python running Snakemake (no venv activation).
put_ladbench_on_path()

OUT = config["output_dir"].rstrip("/")
# Nothing under $HOME: the jobs' library caches go under the output folder (README "Reliability").
keep_caches_under(f"{OUT}/.cache")

# One workflow per output folder: when there is work to do (not on a dry run, nor in a
# cluster job), the workflow takes {OUT}/.workflow.lock; a second one, started from any
# folder, stops here naming the first. Released at the end (or when the process dies).
_OUTPUT_LOCK = []


onstart:
    try:
        _OUTPUT_LOCK.append(lock_output_dir(OUT))
    except LockedError as error:
        raise WorkflowError(str(error)) from None


onsuccess:
    for _lock in _OUTPUT_LOCK:
        _lock.release()


onerror:
    for _lock in _OUTPUT_LOCK:
        _lock.release()
LOGS = f"{OUT}/logs"
REPORT = f"{OUT}/report"

MODELS = list(config["models"])
VARIANTS = list(config["inference"]["variants"])
BENCHMARKS = study_benchmarks(config)
CAL_SEEDS = config["calibration"]["seeds"]
N_CAL = config["calibration"]["n_cal"]



# Every output path of the study is built by the helpers below (named `*_file`, `*_dir`),
# called with names or with wildcard patterns such as "{model}"; no rule spells a path.
# Nothing reads identity back out of these paths: every output records what it is.
def log_file(*parts):
    """``{OUT}/logs/<stage>/<name>/.../<last>.log``: the log of one job."""
    return f"{LOGS}/{'/'.join(parts)}.log"


def flags(**options):
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


# ---- datasets -------------------------------------------------------------------------
def dataset_config(name):
    return config["datasets"][name]


def raw_dataset_files(name):
    """Where the captions, instances and image folder of a dataset are read from."""
    ds = dataset_config(name)
    if ds["source"] == "synthetic":
        root = scenes_dir(name)
        return {
            "captions": f"{root}/annotations/captions.json",
            "instances": f"{root}/annotations/instances.json",
            "images": f"{root}/images",
        }
    root = ds.get("root", "")
    defaults = {
        "coco": {
            "captions": f"{root}/annotations/captions_val2014.json",
            "instances": f"{root}/annotations/instances_val2014.json",
            "images": f"{root}/val2014",
        },
        "flickr8k": {
            "captions": f"{root}/annotations/captions.json",
            "instances": None,
            "images": f"{root}/Flicker8k_Dataset",
        },
    }[ds["source"]]
    return {
        "captions": ds.get("captions_json", defaults["captions"]),
        "instances": ds.get("instances_json", defaults["instances"]),
        "images": ds.get("images_dir", defaults["images"]),
    }


def reference_table_files(name):
    """The reference implementation's caption and category tables a dataset reads, if any."""
    folder = dataset_config(name).get("reference_tables")
    return [f"{folder}/{table}" for table in (REFERENCE_CAPTIONS, REFERENCE_CATEGORIES)] if folder else []


def annotation_files(name):
    """The files the image table is made from: the raw dataset's, where the reference's tables
    (when given) replace the instances file."""
    files = raw_dataset_files(name)
    return {**files, "instances": None} if reference_table_files(name) else files


def scenes_dir(name):
    """The demo's synthetic scenes of a dataset (images and annotation files)."""
    return f"{OUT}/data/{name}/raw"


def download_marker(name):
    return f"{OUT}/data/{name}/download.done"


def image_table(name):
    return f"{OUT}/data/{name}/images.json"


def features_file(name):
    return f"{OUT}/data/{name}/features.h5"


# ---- CLIP ----------------------------------------------------------------------------
TINY_CLIP_DIR = f"{OUT}/models/tiny_clip"


def clip_inputs(wildcards):
    return [TINY_CLIP_DIR] if config["clip"]["tiny"] else []


def clip_flags():
    clip = config["clip"]
    if clip["tiny"]:
        # `ladbench demo-clip` writes this config and checkpoint; they load like a real model.
        model, pretrained = "ladbench-tiny-clip", f"{TINY_CLIP_DIR}/ladbench-tiny-clip.pt"
        model_config = f"{TINY_CLIP_DIR}/ladbench-tiny-clip.json"
    else:
        model, pretrained, model_config = clip["model"], clip["pretrained"], None
    return flags(
        model=model, pretrained=pretrained, model_config=model_config, batch_size=clip["batch_size"],
        workers=clip["workers"], device=clip["device"],
    )


# ---- models --------------------------------------------------------------------------
def tiny_model_dir(model):
    return f"{OUT}/models/{model}"


def model_dir(model):
    """A tiny model is built into the study's folder; a real one is a hub id or folder."""
    spec = config["models"][model]
    return tiny_model_dir(model) if spec["tiny"] else spec["path"]


def model_inputs(wildcards):
    return [model_dir(wildcards.model)] if config["models"][wildcards.model]["tiny"] else []


# Tiny models with an `organism` section are trained (organism.smk); the others are random.
ORGANISMS = [m for m in MODELS if config["models"][m]["tiny"] and "organism" in config["models"][m]]
RANDOM_TINY = [m for m in MODELS if config["models"][m]["tiny"] and m not in ORGANISMS]


def name_pattern(names):
    """A wildcard constraint matching exactly ``names`` (nothing when there are none)."""
    return "|".join(names) or "(?!)"


ORGANISM_PATTERN = name_pattern(ORGANISMS)
RANDOM_TINY_PATTERN = name_pattern(RANDOM_TINY)


def organism_flags(wildcards):
    """The organism learns the study's prompt at its sizes and image resolution, on scenes
    drawn like the synthetic dataset's; its own section sets the rest (steps, seed, pull...)."""
    scene_sizes = [d["image_size"] for d in config["datasets"].values() if d["source"] == "synthetic"]
    return flags(n_candidates=config["benchmarks"]["n_candidates"], image_size=config["inference"]["image_size"],
                 scene_size=scene_sizes[0] if scene_sizes else None, **config["models"][wildcards.model]["organism"])


# ---- paths of the later stages -------------------------------------------------------
def benchmark_file(benchmark):
    return benchmark_path(config, benchmark)    # the path `ladbench plan` reads row counts from


def cache_file(model, benchmark, variant):
    return cache_path(config, model, benchmark, variant)    # the path `ladbench plan` reads rates from


# inference.shards > 1: each cache is merged from this many shard caches (infer jobs).
SHARDS = config["inference"]["shards"]


def shard_file(model, benchmark, variant, shard):
    return f"{OUT}/shards/{model}/{benchmark}/{variant}/{shard}-of-{SHARDS}.h5"


def shard_files(wildcards):
    return [shard_file(wildcards.model, wildcards.benchmark, wildcards.variant, i) for i in range(SHARDS)]


def calibration_file(model, benchmark, variant, seed, n_cal=None):
    n_cal = N_CAL if n_cal is None else n_cal
    return f"{OUT}/calibration/{model}/{benchmark}/{variant}/dcal{n_cal}_seed{seed}.npz"


def evaluation_file(model, benchmark, variant, cal_benchmark=None, ext="json"):
    """The evaluation's JSON (ext json) or its predictions (ext npz)."""
    return f"{OUT}/eval/{model}/{benchmark}/{variant}/cal-{cal_benchmark or benchmark}.{ext}"


def benchmark_dataset(benchmark):
    return benchmark_parts(benchmark)[0]


# ---- captions ----
def captions_inputs(wildcards):
    """Synthetic scenes and downloads are made by the workflow; local copies must exist."""
    ds = dataset_config(wildcards.dataset)
    tables = reference_table_files(wildcards.dataset)
    if ds["source"] == "synthetic":
        return [scenes_dir(wildcards.dataset), *tables]
    if ds["download"]:
        return [download_marker(wildcards.dataset), *tables]
    return [f for f in annotation_files(wildcards.dataset).values() if f is not None] + tables


def captions_flags(wildcards):
    files = annotation_files(wildcards.dataset)
    return flags(
        captions_json=files["captions"], instances_json=files["instances"], image_root=files["images"],
        reference_tables=dataset_config(wildcards.dataset).get("reference_tables"),
        files_outside_root=dataset_config(wildcards.dataset)["files_outside_root"],
    )


# ---- benchmark ----
def benchmark_inputs(wildcards):
    return {"images": image_table(wildcards.dataset), "features": features_file(wildcards.dataset)}


def benchmark_flags(wildcards):
    bench = config["benchmarks"]
    return flags(
        n_eval=bench["n_eval"], n_calibration=bench["n_calibration_pool"],
        n_orderings=bench["n_orderings"], pool_size=bench["pool_size"], seed=bench["seed"],
        caption_sim_max=bench["caption_sim_max"], category_rule=bench["category_rule"],
        orderings=bench["orderings"], calibration_source=config["calibration"]["source"],
        draw=bench["draw"], similarity_dtype=bench["similarity_dtype"],
    )


# ---- infer ----
def infer_on_gpu(wildcards):
    return not config["models"][wildcards.model]["tiny"] and config["inference"]["device"] != "cpu"


def infer_threads(wildcards):
    """2 on the CPU; on a GPU one for the model's process plus one per DataLoader worker (default 8)."""
    if not infer_on_gpu(wildcards):
        return 2
    workers = config["inference"].get("workers")
    return 1 + (8 if workers is None else workers)


def infer_gpus(wildcards):
    """GPUs of one infer job (its `gpu` resource): the model's gpus_per_job, 0 on the CPU.
    The job claims that many distinct devices itself (`ladbench infer --gpus`)."""
    return config["models"][wildcards.model]["gpus_per_job"] if infer_on_gpu(wildcards) else 0


def infer_flags(wildcards):
    model = config["models"][wildcards.model]
    inference = config["inference"]
    variant = inference["variants"][wildcards.variant]
    return flags(
        model_name=wildcards.model, variant_name=wildcards.variant, family=model["family"],
        model_path=model_dir(wildcards.model),
        revision=None if model["tiny"] else model["revision"],
        trust_remote_code=model["trust_remote_code"],
        prompt=variant["prompt"], identifiers=variant["identifiers"],
        score_mode=inference["score_mode"], image_size=inference["image_size"],
        batch_size=model.get("batch_size", inference["batch_size"]), chunk_size=inference["chunk_size"],
        workers=inference.get("workers"), vision_tower=inference["vision_tower"],
        group_by_length=inference["group_by_length"],
        dtype=inference["dtype"], device=inference["device"],
        store_head_attention=inference["store_head_attention"], no_greedy_reply=not inference["greedy_reply"],
        shard_index=wildcards.get("shard"), shard_count=SHARDS if SHARDS > 1 else None,
        **prompt_setting_options(variant["prompt"]),
    )


def prompt_setting_options(prompt):
    """The prompt variant's own settings (inference.prompt_settings.<prompt>) as the infer
    stage's --<prompt>-<setting> flags."""
    settings = config["inference"]["prompt_settings"].get(prompt, {})
    return {f"{prompt}_{key}": value for key, value in settings.items()}


# ---- evaluate ----
def variant_methods(name):
    """Methods for a cache: the configured ones on vanilla-prompt caches; its prompt variant's
    own otherwise (ladbench.variants: Instruction and SoFA, vanilla argmax; CoT/SC, parsed answers)."""
    prompt = config["inference"]["variants"][name]["prompt"]
    if prompt == "vanilla":
        return config["evaluation"]["methods"]
    return list(prompt_variant(prompt).methods)


def needs_calibration(name):
    """Whether a method evaluated on the cache variant ``name`` reads a calibration."""
    return any(METHODS[method].needs_calibration for method in variant_methods(name))


def evaluation_inputs(wildcards):
    inputs = {"cache": cache_file(wildcards.model, wildcards.benchmark, wildcards.variant)}
    if needs_calibration(wildcards.variant):
        inputs["calibrations"] = [
            calibration_file(wildcards.model, wildcards.cal_benchmark, wildcards.variant, seed)
            for seed in CAL_SEEDS
        ]
    return inputs


def lad_options(model):
    """LAD's test-time settings for ``model`` (shared by evaluate and analyze)."""
    lad = config["lad"]
    return dict(layer_range=layer_range_arg(model_layer_range(config["models"][model])), top_k=lad["top_k"],
                tau=lad["tau"], layer_mean=lad["layer_mean"], mixture=lad["mixture"], layer_ties=lad["layer_ties"],
                k_beyond_range=lad["k_beyond_range"], layers_beyond_depth=lad["layers_beyond_depth"],
                reply_parse=config["evaluation"]["reply_parse"])   # a readout's, carried with the methods' settings


def bootstrap_options():
    evaluation = config["evaluation"]
    return dict(bootstrap=evaluation["bootstrap"], ci=evaluation["ci"], seed=evaluation["seed"],
                acc_ddof=evaluation["acc_ddof"], edge_statistics=evaluation["edge_statistics"])


def evaluation_flags(wildcards):
    return flags(**lad_options(wildcards.model), methods=variant_methods(wildcards.variant), **bootstrap_options(),
                 transfer=wildcards.cal_benchmark != wildcards.benchmark)


EVALUATIONS = [evaluation_file(m, b, v) for m in MODELS for b in BENCHMARKS for v in VARIANTS]
# Calibrate on one benchmark, evaluate on another (Table 3): evaluation.transfer.
TRANSFERS = [
    evaluation_file(m, t["evaluate_on"], v, t["calibrate_on"])
    for m in MODELS
    for v in VARIANTS
    if needs_calibration(v)
    for t in config["evaluation"]["transfer"]
]


# ---- report ----
# The analysis stage (ablations, sweeps, divergence, profiles of one vanilla-prompt cache)
# and the report (tables and figures from evaluation/analysis files and cache attributes).
from ladbench.report.render import TABLE_FORMATS
from ladbench.report.tables import TABLE_BUILDERS


# Variants whose cache holds vanilla-prompt scores and attention (the analysed ones).
VANILLA_VARIANTS = [v for v in VARIANTS if config["inference"]["variants"][v]["prompt"] == "vanilla"]


def analysis_file(model, benchmark, variant, ext="json"):
    return f"{OUT}/analysis/{model}/{benchmark}/{variant}.{ext}"


def analysis_flags(wildcards):
    sweeps = config["analysis"]  # Figure 6's and Table 4's sweeps (defaults in the schema)
    return flags(
        **lad_options(wildcards.model),
        n_cal=N_CAL, seeds=CAL_SEEDS, score_average=config["calibration"]["score_average"],
        pride_original_logs=config["calibration"]["pride_original_logs"],
        empty_positions=config["calibration"]["empty_positions"],
        dcal_sizes=sweeps["dcal_sizes"], dcal_draws=sweeps["dcal_draws"], taus=sweeps["taus"],
        **bootstrap_options(),
    )


ANALYSES = [analysis_file(m, b, v) for m in MODELS for b in BENCHMARKS for v in VANILLA_VARIANTS]
CACHES = [cache_file(m, b, v) for m in MODELS for b in BENCHMARKS for v in VARIANTS]


def study_flags():
    """What the report needs to read the files: names, orders and each variant's prompt."""
    variants = [f"{v}={config['inference']['variants'][v]['prompt']}" for v in VARIANTS]
    return flags(models=MODELS, benchmarks=BENCHMARKS, variants=variants)


def table_flags():
    sources = [f"{name}={spec['source']}" for name, spec in config["datasets"].items()]
    return flags(n_cal=N_CAL, dataset_sources=sources, formats=TABLE_FORMATS)


def table_files():
    """Every table in every format; the HTML rendering goes into `snakemake --report`."""
    files = []
    for name in TABLE_BUILDERS:
        for fmt in TABLE_FORMATS:
            path = f"{REPORT}/{name}.{fmt}"
            if fmt == "html":
                path = report(path, caption=f"../report/{name}.rst", category="Tables")
            files.append(path)
    return files


def figure_file(stem, ext):
    return f"{REPORT}/figures/{stem}.{ext}"


def figure_files(stem, caption, subcategory):
    """A figure in every configured format; the PNG (else the first format) goes into the
    HTML report with the caption (an .rst in workflow/report/)."""
    formats = config["report"]["figure_formats"]
    shown = "png" if "png" in formats else formats[0]
    files = []
    for ext in formats:
        path = figure_file(stem, ext)
        if ext == shown:
            path = report(path, caption=f"../report/{caption}.rst", category="Figures", subcategory=subcategory)
        files.append(path)
    return files


def expand_figures(stem, **wildcards):
    return expand(figure_file(stem, "{ext}"), ext=config["report"]["figure_formats"], **wildcards)


def model_evaluations(wildcards):
    """Same-benchmark evaluations of one model's vanilla-prompt caches (Fig. 5)."""
    return [evaluation_file(wildcards.model, b, v) for b in BENCHMARKS for v in VANILLA_VARIANTS]


def model_analyses(wildcards):
    return [analysis_file(wildcards.model, b, v) for b in BENCHMARKS for v in VANILLA_VARIANTS]


def model_analysis_arrays(wildcards):
    return [analysis_file(wildcards.model, b, v, "npz") for b in BENCHMARKS for v in VANILLA_VARIANTS]


# ---- instance explorer ----
# One page per vanilla-prompt cache whose evaluation used a calibration (PriDe and LAD need one).
EXPLORER_VARIANTS = [v for v in VANILLA_VARIANTS if needs_calibration(v)]


def explorer_file(model, benchmark, variant):
    return f"{REPORT}/explorer/{model}_{benchmark}_{variant}.html"


EXPLORER_INDEX = f"{REPORT}/explorer/index.html"
EXPLORER_KEYS = [(m, b, v) for m in MODELS for b in BENCHMARKS for v in EXPLORER_VARIANTS]
EXPLORERS = [explorer_file(*key) for key in EXPLORER_KEYS]


def explorer_inputs(wildcards):
    """What a page is built from: the cache, the evaluation's first calibration draw, the
    evaluation (JSON and predictions), the benchmark (captions) and the image table (thumbnails)."""
    model, benchmark, variant = wildcards.model, wildcards.benchmark, wildcards.variant
    return {
        "cache": cache_file(model, benchmark, variant),
        "calibration": calibration_file(model, benchmark, variant, CAL_SEEDS[0]),
        "evaluation": evaluation_file(model, benchmark, variant),
        "predictions": evaluation_file(model, benchmark, variant, ext="npz"),
        "benchmark": benchmark_file(benchmark),
        "images": image_table(benchmark_dataset(benchmark)),
    }


def explorer_flags():
    report_config = config["report"]
    return flags(thumbnail_size=report_config["thumbnail_size"], thumbnail_quality=report_config["thumbnail_quality"])


def output_folder(wildcards, output):
    """The folder of a rule's first output (where `report tables` writes every table)."""
    return os.path.dirname(output[0])
