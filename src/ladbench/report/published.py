"""The paper's published numbers (Xian et al., ICML 2026; ../shared/spec/PUBLISHED_RESULTS.md)
and when a study is comparable with them.

A study's (model, benchmark) is comparable when it ran the paper's model (hub id), on
the paper's dataset, setting and N, with the paper's protocol: 1,000 evaluation
instances, T = 5 orderings, |D_cal| = 5, K = 2, tau = 5. Cost (Table 2) depends on the
hardware and is not compared.
"""

from __future__ import annotations

from dataclasses import dataclass

from ladbench.methods import METHODS
from ladbench.variants import VARIANTS

__all__ = ["PAPER_MODELS", "PAPER_PROTOCOL", "PUBLISHED", "Published", "protocol_mismatches", "readout_of_label"]

# Display name in the paper -> Hugging Face hub id.
PAPER_MODELS = {
    "Qwen2.5-VL-3B": "Qwen/Qwen2.5-VL-3B-Instruct",
    "LLaVA-OV-1.5-8B": "lmms-lab/LLaVA-OneVision-1.5-8B-Instruct",
    "InternVL3-8B": "OpenGVLab/InternVL3-8B-HF",
}
PAPER_PROTOCOL = {"n_instances": 1000, "n_orderings": 5, "n_cal": 5, "top_k": 2, "tau": 5.0}


@dataclass(frozen=True)
class Published:
    """One published row for one model.

    ``kind`` says where the reproduced number is found: ``"method"`` = the evaluation
    of the first variant with ``prompt`` (method ``key``); ``"transfer"`` = the same
    with the calibration from ``cal`` (source, setting, N); ``"ablation"`` = the row
    labelled ``key`` of the analysis' Table 4 grid.
    """

    table: str
    model: str  # display name, a key of PAPER_MODELS
    source: str  # dataset source evaluated on (coco, flickr8k)
    setting: str
    n: int
    kind: str
    prompt: str
    key: str
    label: str  # the row's name in the paper
    acc: float
    acc_std: float | None = None
    rstd: float | None = None
    cons: float | None = None
    cal: tuple[str, str, int] | None = None


_MODEL_ORDER = ("Qwen2.5-VL-3B", "LLaVA-OV-1.5-8B", "InternVL3-8B")


def readout_of_label(label: str) -> tuple[str, str]:
    """(prompt variant of the cache, method of its evaluation) of a row the paper labels
    ``label``: a method's label (read from the variant it reads) or a prompt variant's (read
    out by its first method), as the registries state them."""
    readouts = {m.label: (m.reads, name) for name, m in METHODS.items() if m.reads is not None}
    readouts.update({v.label: (v.name, v.methods[0]) for v in VARIANTS.values()})
    try:
        return readouts[label]
    except KeyError:
        raise ValueError(f"published row {label!r} is the label of no registered method or prompt variant") from None


# setting, N, method | Acc std RStd Cons. for each model in _MODEL_ORDER
_TABLES_1_AND_6 = """
random 4 Vanilla          | 51.70 1.38 36.27 6.61  | 67.52 1.06 25.43 19.90 | 69.04 2.09 28.38 18.50
random 4 Instruction      | 48.96 0.97 35.80 4.20  | 50.50 1.61 34.61 5.90  | 67.52 1.69 26.27 19.60
random 4 CoT              | 54.16 1.98 36.75 8.20  | 45.40 1.56 34.15 3.31  | 77.96 1.46 12.45 37.70
random 4 PriDe            | 63.76 0.88 36.24 17.70 | 68.00 0.91 33.07 32.10 | 76.32 0.90 18.33 35.90
random 4 Self-Consistency | 63.24 1.31 20.35 15.70 | 41.90 4.55 19.09 0.00  | 69.20 1.35 24.06 22.00
random 4 Ours (LAD)       | 94.94 0.52 4.20 84.30  | 98.66 0.36 0.88 96.50  | 94.84 0.40 5.93 80.70
adversarial 4 Vanilla          | 38.04 1.84 32.21 4.10  | 49.56 1.20 16.62 13.90 | 61.00 0.84 25.22 19.00
adversarial 4 Instruction      | 35.92 1.61 33.76 2.80  | 39.22 1.79 28.64 3.90  | 57.14 1.18 29.95 15.20
adversarial 4 CoT              | 42.24 0.73 18.85 3.41  | 36.24 1.06 34.04 2.71  | 61.08 1.00 14.13 20.50
adversarial 4 PriDe            | 47.80 0.48 28.80 10.40 | 53.84 0.58 31.77 20.80 | 64.16 1.29 20.65 30.40
adversarial 4 Self-Consistency | 42.20 2.09 12.96 3.70  | 35.70 2.66 11.63 1.50  | 61.70 1.35 21.40 20.00
adversarial 4 Ours (LAD)       | 65.72 0.61 13.71 40.90 | 71.06 1.10 10.23 51.30 | 76.64 1.45 7.89 54.10
random 8 Vanilla          | 28.68 1.55 28.86 1.20 | 31.56 2.01 38.82 0.10 | 51.00 1.70 31.27 5.80
random 8 Instruction      | 28.86 1.74 28.24 1.30 | 26.72 2.59 35.49 0.20 | 45.44 1.57 29.28 3.10
random 8 CoT              | 31.94 2.52 29.39 2.91 | 30.50 1.90 37.19 1.30 | 31.84 1.21 12.50 0.70
random 8 PriDe            | 34.62 1.80 30.40 2.30 | 41.52 0.63 34.51 1.00 | 54.52 2.13 29.87 4.30
random 8 Ours (LAD)       | 93.10 1.02 3.68 76.80 | 94.92 0.40 3.33 84.10 | 90.54 0.94 13.89 66.70
adversarial 8 Vanilla          | 19.58 1.09 28.48 1.20 | 24.88 1.63 32.58 0.30 | 37.00 1.88 29.86 3.30
adversarial 8 Instruction      | 19.02 0.59 30.17 0.80 | 22.02 1.36 33.49 0.10 | 34.06 1.35 26.35 2.60
adversarial 8 CoT              | 23.34 1.51 23.15 1.81 | 22.66 0.87 31.02 0.40 | 20.34 0.97 13.61 0.10
adversarial 8 PriDe            | 25.30 0.87 28.52 2.30 | 28.70 1.32 28.37 0.20 | 38.22 2.02 30.25 1.40
adversarial 8 Ours (LAD)       | 52.96 1.53 13.36 28.00 | 55.34 1.04 11.10 28.10 | 65.00 0.66 7.79 35.20
"""

# Table 4 (LLaVA-OV-1.5-8B, COCO adversarial, N = 4): analysis label | Acc std RStd Cons.
_TABLE4 = """
attn_readout_no_prior_K2 | Attn readout, no prior, K=2  | 42.36 0.92 37.65 9.50
attn_readout_prior_K2    | Attn readout, prior, K=2     | 64.38 1.04 10.17 45.30
all_layers_prior         | All layers, prior            | 61.50 0.84 15.93 34.10
dynamic_no_prior_K2      | Dynamic, no prior, K=2       | 58.90 0.17 26.65 31.70
dynamic_prior_K1         | Dynamic, prior, K=1          | 68.16 0.98 11.68 46.30
dynamic_prior_K2         | Dynamic, prior, K=2          | 71.06 1.10 10.23 51.30
dynamic_prior_K4         | Dynamic, prior, K=4          | 68.38 1.16 12.33 48.30
dynamic_prior_K8         | Dynamic, prior, K=8          | 66.66 1.21 12.41 44.90
"""

# Table 3 (LLaVA-OV-1.5-8B, N = 4): calibrate on, evaluate on | Vanilla, PriDe, Ours (Acc std)
_TABLE3 = """
flickr8k random | coco random     | 67.52 1.06 | 62.54 1.31 | 97.78 0.40
coco random     | flickr8k random | 57.58 0.72 | 64.36 1.40 | 95.92 0.16
coco random     | coco adversarial | 49.56 1.20 | 43.00 0.94 | 65.94 0.57
coco adversarial | coco random    | 67.52 1.06 | 68.88 0.83 | 96.98 0.22
"""

# Tables 7 and 8 (LLaVA-OV-1.5-8B, COCO, accuracy only): setting N | values in the columns below
_TABLE7_COLUMNS = ("Raw attention", "Purified attention")
_TABLE7 = """
random 4 | 91.08 96.14
random 8 | 80.78 91.16
adversarial 4 | 42.36 64.38
adversarial 8 | 32.84 48.48
"""
_TABLE8_COLUMNS = ("SoFA", "Permutation averaging")
_TABLE8 = """
random 4 | 59.70 99.04
random 8 | 32.16 92.86
adversarial 4 | 43.26 74.32
adversarial 8 | 25.34 60.16
"""


def _lines(text: str) -> list[list[str]]:
    return [[part.strip() for part in line.split("|")] for line in text.strip().splitlines()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split()]


def _tables_1_and_6() -> list[Published]:
    rows = []
    for head, *per_model in _lines(_TABLES_1_AND_6):
        setting, n, label = head.split(maxsplit=2)
        prompt, method = readout_of_label(label)
        table = "Table 1" if int(n) == 4 else "Table 6"
        for model, numbers in zip(_MODEL_ORDER, per_model):
            acc, std, rstd, cons = _floats(numbers)
            rows.append(Published(table, model, "coco", setting, int(n), "method", prompt, method, label,
                                  acc, std, rstd, cons))
    return rows


def _table4() -> list[Published]:
    rows = []
    for key, label, numbers in _lines(_TABLE4):
        acc, std, rstd, cons = _floats(numbers)
        rows.append(Published("Table 4", "LLaVA-OV-1.5-8B", "coco", "adversarial", 4, "ablation", "vanilla", key,
                              label, acc, std, rstd, cons))
    return rows


def _table3() -> list[Published]:
    rows = []
    for cal, target, *numbers in _lines(_TABLE3):
        cal_source, cal_setting = cal.split()
        source, setting = target.split()
        for label, values in zip(("Vanilla", "PriDe", "Ours (LAD)"), numbers):
            prompt, method = readout_of_label(label)
            acc, std = _floats(values)
            rows.append(Published("Table 3", "LLaVA-OV-1.5-8B", source, setting, 4, "transfer", prompt, method,
                                  f"{label}, calibrated on {cal}", acc, std, cal=(cal_source, cal_setting, 4)))
    return rows


def _accuracy_table(name: str, text: str, columns) -> list[Published]:
    rows = []
    for head, numbers in _lines(text):
        setting, n = head.split()
        for label, acc in zip(columns, _floats(numbers)):
            prompt, method = readout_of_label(label)
            rows.append(Published(name, "LLaVA-OV-1.5-8B", "coco", setting, int(n), "method", prompt, method, label, acc))
    return rows


PUBLISHED: tuple[Published, ...] = tuple(
    _tables_1_and_6() + _table3() + _table4()
    + _accuracy_table("Table 7", _TABLE7, _TABLE7_COLUMNS)
    + _accuracy_table("Table 8", _TABLE8, _TABLE8_COLUMNS)
)


def protocol_mismatches(evaluation: dict, n_cal: int | None) -> list[str]:
    """Why an evaluation document's protocol differs from the paper's (empty = same)."""
    settings = evaluation.get("settings", {})
    observed = {
        "n_instances": evaluation.get("n_instances"),
        "n_orderings": evaluation.get("n_orderings"),
        "n_cal": n_cal,
        "top_k": settings.get("top_k"),
        "tau": settings.get("tau"),
    }
    return [
        f"{key} = {observed[key]} (paper: {expected:g})"
        for key, expected in PAPER_PROTOCOL.items()
        if observed[key] is None or float(observed[key]) != float(expected)
    ]
