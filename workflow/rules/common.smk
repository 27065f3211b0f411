# Shared by every rule file: the validated config, output paths, and helpers that map
# config entries to the inputs and command-line flags of each stage.
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from ladbench.config import ConfigError, layer_range_arg, validate_config, load_schema  # noqa: E402

try:
    validate_config(
        config,
        load_schema(workflow.source_path("../schemas/config.schema.yaml")),
        source=", ".join(map(str, workflow.overwrite_configfiles)) or "config.yaml",
    )
except ConfigError as error:
    raise WorkflowError(f"invalid configuration: {error}")

OUT = config["output_dir"].rstrip("/")
LOGS = f"{OUT}/logs"
# Run the project's CLI from this checkout, so the rules work in the project's venv and
# in per-rule conda environments (--sdm conda) alike.
LADBENCH = f"PYTHONPATH={shlex.quote(str(Path(workflow.basedir) / 'src'))}${{PYTHONPATH:+:$PYTHONPATH}} python -m ladbench"

DATASETS = config["benchmarks"]["datasets"]
SETTINGS = config["benchmarks"]["settings"]
SIZES = config["benchmarks"]["n_candidates"]
MODELS = list(config["models"])
VARIANTS = list(config["inference"]["variants"])
BENCHMARKS = [f"{d}_{s}_N{n}" for d in DATASETS for s in SETTINGS for n in SIZES]
CAL_SEEDS = config["calibration"]["seeds"]
N_CAL = config["calibration"]["n_cal"]


wildcard_constraints:
    dataset=r"[A-Za-z0-9][A-Za-z0-9.-]*",
    setting=r"random|adversarial",
    n=r"\d+",
    model="|".join(MODELS),
    variant="|".join(VARIANTS),
    benchmark=r"[A-Za-z0-9.-]+_(random|adversarial)_N\d+",
    cal_benchmark=r"[A-Za-z0-9.-]+_(random|adversarial)_N\d+",
    seed=r"\d+",


def flags(**options):
    """Command-line flags from keyword options: tau=5 -> --tau 5; True -> bare flag;
    False/None -> omitted; lists -> repeated values."""
    parts = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            parts.append(flag)
        elif isinstance(value, (list, tuple)):
            parts.append(flag + " " + " ".join(shlex.quote(str(v)) for v in value))
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
        root = f"{OUT}/data/{name}/raw"
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
        return f"--tiny-dir {TINY_CLIP_DIR} " + flags(batch_size=clip["batch_size"], workers=clip["workers"], device=clip["device"])
    return flags(
        model=clip["model"], pretrained=clip["pretrained"], batch_size=clip["batch_size"],
        workers=clip["workers"], device=clip["device"],
    )


# ---- models --------------------------------------------------------------------------
def model_dir(model):
    """A tiny model is built into the study's folder; a real one is a hub id or folder."""
    spec = config["models"][model]
    return f"{OUT}/models/{model}" if spec["tiny"] else spec["path"]


def model_inputs(wildcards):
    return [model_dir(wildcards.model)] if config["models"][wildcards.model]["tiny"] else []


# ---- paths of the later stages -------------------------------------------------------
def benchmark_file(benchmark):
    return f"{OUT}/benchmarks/{benchmark}.json"


def cache_file(model, benchmark, variant):
    return f"{OUT}/cache/{model}/{benchmark}/{variant}.h5"


def calibration_file(model, benchmark, variant, seed, n_cal=None):
    n_cal = N_CAL if n_cal is None else n_cal
    return f"{OUT}/calibration/{model}/{benchmark}/{variant}/dcal{n_cal}_seed{seed}.npz"


def evaluation_file(model, benchmark, variant, cal_benchmark=None):
    return f"{OUT}/eval/{model}/{benchmark}/{variant}/cal-{cal_benchmark or benchmark}.json"


def benchmark_dataset(benchmark):
    return benchmark.split("_")[0]


EVALUATIONS = [evaluation_file(m, b, v) for m in MODELS for b in BENCHMARKS for v in VARIANTS]
