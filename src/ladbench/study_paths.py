"""Where the workflow writes every output of a study, each path spelled once (a method of
:class:`StudyPaths`, called with names or with wildcard patterns such as ``"{model}"``).

Below the workflow and :mod:`ladbench.plan` (which finds the same benchmark and cache files to
read row counts and rates from): it knows the config's values and nothing of the stages.
Nothing reads identity back out of these paths: every output records what it is.
"""

from __future__ import annotations

from ladbench.data.reference_tables import CAPTIONS_FILE, CATEGORIES_FILE

__all__ = ["FIGURES", "StudyPaths"]

#: Every figure of the study: its name -> the file stem (wildcards: the figure is made per
#: cache, ``{variant}``, or per model) and the caption of the HTML report (workflow/report/).
FIGURES = {
    "confusion": ("confusion_{model}_{benchmark}_{variant}", "confusion"),
    "score_profile": ("score_profile_{model}_{benchmark}_{variant}", "score_profile"),
    "attention_vs_scores": ("attention_vs_scores_{model}_{benchmark}_{variant}", "attention_vs_scores"),
    "calibration_sweeps": ("calibration_sweeps_{model}_{benchmark}_{variant}", "calibration_sweeps"),
    "accuracy_vs_n": ("accuracy_vs_n_{model}", "accuracy_vs_n"),
    "divergence": ("divergence_{model}", "divergence_figure"),
}


class StudyPaths:
    """Every path of the study of one validated config."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.out = config["output_dir"].rstrip("/")

    @property
    def shards(self) -> int:
        """inference.shards > 1: each cache is merged from this many shard caches (infer jobs)."""
        return self.config["inference"]["shards"]

    @property
    def n_cal(self) -> int:
        return self.config["calibration"]["n_cal"]

    def log_file(self, *parts: str) -> str:
        """``{OUT}/logs/<stage>/<name>/.../<last>.log``: the log of one job."""
        return f"{self.out}/logs/{'/'.join(parts)}.log"

    # ---- datasets -------------------------------------------------------------------------
    def dataset(self, name: str) -> dict:
        return self.config["datasets"][name]

    def raw_dataset_files(self, name: str) -> dict[str, str | None]:
        """Where the captions, instances and image folder of a dataset are read from."""
        ds = self.dataset(name)
        if ds["source"] == "synthetic":
            root = self.scenes_dir(name)
            return {"captions": f"{root}/annotations/captions.json", "instances": f"{root}/annotations/instances.json",
                    "images": f"{root}/images"}
        root = ds.get("root", "")
        defaults = {
            "coco": {"captions": f"{root}/annotations/captions_val2014.json",
                     "instances": f"{root}/annotations/instances_val2014.json", "images": f"{root}/val2014"},
            "flickr8k": {"captions": f"{root}/annotations/captions.json", "instances": None,
                         "images": f"{root}/Flicker8k_Dataset"},
        }[ds["source"]]
        return {"captions": ds.get("captions_json", defaults["captions"]),
                "instances": ds.get("instances_json", defaults["instances"]),
                "images": ds.get("images_dir", defaults["images"])}

    def reference_table_files(self, name: str) -> list[str]:
        """The reference implementation's caption and category tables a dataset reads, if any."""
        folder = self.dataset(name).get("reference_tables")
        return [f"{folder}/{table}" for table in (CAPTIONS_FILE, CATEGORIES_FILE)] if folder else []

    def annotation_files(self, name: str) -> dict[str, str | None]:
        """The files the image table is made from: the raw dataset's, where the reference's
        tables (when given) replace the instances file."""
        files = self.raw_dataset_files(name)
        return {**files, "instances": None} if self.reference_table_files(name) else files

    def scenes_dir(self, name: str) -> str:
        """The demo's synthetic scenes of a dataset (images and annotation files)."""
        return f"{self.out}/data/{name}/raw"

    def download_marker(self, name: str) -> str:
        return f"{self.out}/data/{name}/download.done"

    def image_table(self, name: str) -> str:
        return f"{self.out}/data/{name}/images.json"

    def features_file(self, name: str) -> str:
        return f"{self.out}/data/{name}/features.h5"

    # ---- models ---------------------------------------------------------------------------
    @property
    def tiny_clip_dir(self) -> str:
        return f"{self.out}/models/tiny_clip"

    def tiny_model_dir(self, model: str) -> str:
        return f"{self.out}/models/{model}"

    def model_dir(self, model: str) -> str:
        """A tiny model is built into the study's folder; a real one is a hub id or folder."""
        spec = self.config["models"][model]
        return self.tiny_model_dir(model) if spec["tiny"] else spec["path"]

    def chat_template_file(self, model: str) -> str | None:
        """The chat template the config gives a model released without one (None: its own)."""
        return self.config["models"][model].get("chat_template")

    # ---- benchmarks, caches, calibrations, evaluations, analyses ----------------------------
    def benchmark_file(self, benchmark: str) -> str:
        return f"{self.out}/benchmarks/{benchmark}.json"

    def cache_file(self, model: str, benchmark: str, variant: str) -> str:
        return f"{self.out}/cache/{model}/{benchmark}/{variant}.h5"

    def shard_file(self, model: str, benchmark: str, variant: str, shard: int | str) -> str:
        return f"{self.out}/shards/{model}/{benchmark}/{variant}/{shard}-of-{self.shards}.h5"

    def calibration_file(self, model: str, benchmark: str, variant: str, seed: int | str,
                         n_cal: int | str | None = None) -> str:
        n_cal = self.n_cal if n_cal is None else n_cal
        return f"{self.out}/calibration/{model}/{benchmark}/{variant}/dcal{n_cal}_seed{seed}.npz"

    def evaluation_file(self, model: str, benchmark: str, variant: str, cal_benchmark: str | None = None,
                        ext: str = "json") -> str:
        """The evaluation's JSON (ext json) or its predictions (ext npz)."""
        return f"{self.out}/eval/{model}/{benchmark}/{variant}/cal-{cal_benchmark or benchmark}.{ext}"

    def analysis_file(self, model: str, benchmark: str, variant: str, ext: str = "json") -> str:
        return f"{self.out}/analysis/{model}/{benchmark}/{variant}.{ext}"

    # ---- report ---------------------------------------------------------------------------
    @property
    def report_dir(self) -> str:
        return f"{self.out}/report"

    def table_file(self, name: str, fmt: str) -> str:
        return f"{self.report_dir}/{name}.{fmt}"

    def figure_file(self, stem: str, ext: str) -> str:
        return f"{self.report_dir}/figures/{stem}.{ext}"

    def explorer_file(self, model: str, benchmark: str, variant: str) -> str:
        return f"{self.report_dir}/explorer/{model}_{benchmark}_{variant}.html"

    @property
    def explorer_index(self) -> str:
        return f"{self.report_dir}/explorer/index.html"
