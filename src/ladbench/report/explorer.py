"""The instance explorer: one self-contained HTML page per (model, benchmark, cache variant)
showing, per evaluation instance and ordering, where the model looked against what it said
(docs/formats.md §7).

Built from an inference cache (§4), the calibration the evaluation used first (§5) and the
evaluation (§6, its JSON and the predictions ``.npz`` beside it), with the benchmark (§3) for
the captions and the image table (§1) for the thumbnails; it never runs a model. Every
number on the page is computed here by the project's own functions (``ladbench.methods``,
``ladbench.analysis``); the page's script only draws, filters and counts them:

- per position: the Vanilla candidate probability (softmax of the scores), the attention
  share over every layer, over LAD's selected layers (the raw attention evidence) and
  purified (``softmax(log pi~)``, :func:`ladbench.analysis.position_profiles`), and the
  PriDe and LAD posteriors (softmax of the corrected scores);
- per method of the evaluation: its predicted position (from the evaluation's ``.npz``);
- per layer and position: the share of the image attention (the detail heat map) and
  which layers LAD selected;
- the logits-attention gap of each row: the selected layers' attention share on the target
  minus the Vanilla probability of the target (large: the model looked at the right image
  and said another one).

The page embeds every distinct image once as a small JPEG thumbnail and the arrays as
base64 typed arrays rounded to what the eye needs (per mille for shares and probabilities,
1/255 for the heat map), so a 1,000-instance x 5-ordering N = 8 benchmark stays a few tens
of MB (``benchmarks/bench_explorer.py``). It opens from ``file://`` with no server: no
request leaves the page (its Content-Security-Policy forbids it).
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ladbench import methods
from ladbench.analysis import attention_shares, position_profiles
from ladbench.atomic import atomic_write_text, file_digest
from ladbench.benchmark import load_benchmark
from ladbench.calibration import Calibration, log_softmax
from ladbench.data.coco import image_digests, image_paths, load_image_table, read_image
from ladbench.inference.cache import read_cache
from ladbench.provenance import LABELS, title_with_kind
from ladbench.records import evaluation_predictions, read_evaluation
from ladbench.settings import Settings, setting
from ladbench.arrays import EvalArrays, eval_arrays
from ladbench.inputs import MismatchError, check_benchmark_table, check_calibrations

__all__ = [
    "FORMAT",
    "PER_POSITION",
    "Thumbnails",
    "card_flags",
    "explorer_document",
    "explorer_index",
    "logits_attention_gap",
    "render_page",
    "write_explorer",
]

FORMAT = 1
# Thumbnails: longest side in pixels and JPEG quality (small: the page holds every image).
THUMBNAIL_SIZE = 64
THUMBNAIL_QUALITY = 70
# The per-position rows of each card, in the order shown: array name -> label.
PER_POSITION = {
    "probability": "Vanilla p",
    "attention_all": "attn, all layers",          # but those with a sliding window (docs/method.md)
    "attention_share": "attn, LAD layers",
    "purified_share": "purified attn",
    "pride": "PriDe p",
    "lad": "LAD p",
}
# Rounding: shares and probabilities in per mille, the heat map in 1/255.
PER_MILLE = 1000
HEAT_LEVELS = 255


@dataclass(frozen=True)
class Thumbnails(Settings):
    """How the images are embedded (config ``report``): longest side (px) and JPEG quality."""

    section = "report"

    size: int = setting(THUMBNAIL_SIZE, "the instance explorer's thumbnails, longest side in pixels (each distinct "
                        "image embedded once)", minimum=8, maximum=512, key="thumbnail_size")
    quality: int = setting(THUMBNAIL_QUALITY, "JPEG quality of the explorer's thumbnails", minimum=1, maximum=95,
                           key="thumbnail_quality")

    def encode(self, path: str | Path, sha256: str | None = None, table_path: str | None = None) -> str:
        """A ``data:`` URI of the image at ``path`` (its bytes checked against ``sha256``, what the
        image table ``table_path`` records) as a small JPEG."""
        from PIL import UnidentifiedImageError

        try:
            with read_image(path, sha256, table_path) as image:
                image.draft("RGB", (self.size, self.size))   # JPEG: decode at a reduced scale (fast)
                image = image.convert("RGB")
                image.thumbnail((self.size, self.size))
                buffer = io.BytesIO()
                image.save(buffer, format="JPEG", quality=self.quality, optimize=True)
        except FileNotFoundError:                     # read_image's line says where the images should be
            raise
        except (OSError, UnidentifiedImageError) as error:
            raise ValueError(f"{path}: not a readable image ({error})") from None
        return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


# --------------------------------------------------------------------------- numbers


def softmax(scores: np.ndarray) -> np.ndarray:
    return np.exp(log_softmax(scores))


def logits_attention_gap(attention_share: np.ndarray, probability: np.ndarray, target_pos: np.ndarray) -> np.ndarray:
    """Per row [...]: the attention share on the target minus the candidate probability of the target."""
    target = np.asarray(target_pos)[..., None].astype(np.intp)
    take = lambda values: np.take_along_axis(np.asarray(values), target, axis=-1)[..., 0]  # noqa: E731
    return take(attention_share) - take(probability)


def per_position_values(arrays: EvalArrays, calibration: Calibration, settings: methods.LadSettings) -> dict[str, np.ndarray]:
    """The card's rows [I, T, N] (:data:`PER_POSITION`), from the project's method functions."""
    _, profiles = position_profiles(arrays, calibration, settings)
    every_layer = methods.raw_attention(arrays.attn, methods.LadSettings(layer_range=None, all_layers=True,
                                                                         unseen_layers=settings.unseen_layers))
    values = {
        "probability": profiles["probability"],
        "attention_all": attention_shares(every_layer),
        "attention_share": profiles["attention_share"],
        "purified_share": profiles["purified_share"],
        "pride": softmax(methods.pride(arrays.scores, calibration.pride_prior)),
        "lad": softmax(methods.lad(arrays.scores, arrays.attn, calibration, settings)),
    }
    return {name: values[name] for name in PER_POSITION}


def card_flags(predictions: Mapping[str, np.ndarray], target_pos: np.ndarray) -> dict[str, np.ndarray]:
    """Per row [I, T]: ``right_<method>`` for every ``pred_<method>`` and the two divergences
    (the attention readout right, Vanilla wrong): what the page's filters count."""
    target = np.asarray(target_pos)
    right = {name[len("pred_"):]: np.asarray(pred) == target for name, pred in predictions.items()
             if name.startswith("pred_")}
    flags = {f"right_{name}": value for name, value in right.items()}
    for readout in ("raw_attention", "purified_attention"):
        if readout in right and "vanilla" in right:
            flags[f"divergence_{readout}"] = right[readout] & ~right["vanilla"]
    return flags


# --------------------------------------------------------------------------- encoding


def _packed(values: np.ndarray, dtype: str, scale: float | None = None) -> dict[str, Any]:
    """A typed array for the page: little-endian bytes in base64, with its shape (and the
    scale that turns the stored integers back into the values)."""
    values = np.asarray(values, dtype=np.float64 if scale else None)
    if scale:
        values = np.rint(np.nan_to_num(values, nan=0.0) * scale)
    data = np.ascontiguousarray(values, dtype=np.dtype(dtype).newbyteorder("<"))
    out: dict[str, Any] = {"dtype": data.dtype.name, "shape": list(data.shape),
                           "data": base64.b64encode(data.tobytes()).decode("ascii")}
    if scale:
        out["scale"] = scale
    return out


def _unpacked(entry: Mapping[str, Any]) -> np.ndarray:
    """Inverse of :func:`_packed` (the tests read a page's numbers back with it)."""
    data = np.frombuffer(base64.b64decode(entry["data"]), dtype=np.dtype(entry["dtype"]).newbyteorder("<"))
    data = data.reshape(entry["shape"])
    return data / entry["scale"] if "scale" in entry else data


# --------------------------------------------------------------------------- inputs


def _load_predictions(evaluation_path: str | Path, evaluation: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The predictions written with the evaluation (checked: its digest, and that it is the pair's)."""
    data = evaluation_predictions(evaluation_path, dict(evaluation))
    return {name: values for name, values in data.items() if name.startswith("pred_") or name == "target_pos"}


def _check_evaluation(evaluation_path, evaluation: Mapping[str, Any], cache_path, attrs: Mapping[str, Any],
                      calibration_path) -> None:
    """The evaluation must come from this cache, and its first calibration draw (the one its
    predictions were made with) must be ``calibration_path``."""
    recorded = ((evaluation.get("inputs") or {}).get("cache") or {}).get("config_sha256")
    if recorded != attrs.get("config_sha256"):
        raise MismatchError(f"{evaluation_path} was made from another cache than {cache_path} (config_sha256 "
                            f"{recorded} vs {attrs.get('config_sha256')}); give the evaluation of this cache")
    calibrations = (evaluation.get("inputs") or {}).get("calibrations") or []
    if not calibrations:
        raise MismatchError(f"{evaluation_path} used no calibration, but PriDe and LAD need one: give the evaluation "
                            "of a cache variant evaluated with them")
    if calibrations[0].get("sha256") != file_digest(calibration_path):
        raise MismatchError(f"{calibration_path} is not the calibration {evaluation_path} made its predictions with "
                            f"(its first draw, {calibrations[0].get('path')}); give that one")


def _benchmark(path: str | None, attrs: Mapping[str, Any], cache_path) -> tuple[str, dict]:
    """The cache's benchmark: ``path``, else the one the cache records; either must be the file it was made from."""
    path = path or attrs.get("benchmark")
    if not path:
        raise ValueError(f"{cache_path} records no benchmark path; give --benchmark")
    if not Path(path).exists():
        raise FileNotFoundError(f"{path}: the cache's benchmark is not there; give --benchmark")
    if file_digest(path) != attrs.get("benchmark_sha256"):
        raise MismatchError(f"{path} is not the benchmark {cache_path} was made from (benchmark_sha256 differs)")
    return str(path), load_benchmark(path)


def _thumbnails(bench: Mapping[str, Any], bench_path: str, images_path: str | None,
                thumbnails: Thumbnails, progress: bool) -> tuple[list[list[int]], list[str], list[int]]:
    """Each instance's candidates as indices into the distinct images, the images' thumbnails
    (empty without an image table) and their image ids."""
    from tqdm import tqdm

    ids = list(dict.fromkeys(int(c) for inst in bench["eval"] for c in inst["candidates"]))
    index = {image_id: k for k, image_id in enumerate(ids)}
    candidates = [[index[int(c)] for c in inst["candidates"]] for inst in bench["eval"]]
    if images_path is None:
        return candidates, [], ids
    table = load_image_table(images_path)
    check_benchmark_table(bench_path, bench, images_path, table)
    paths = image_paths(table)
    missing = [image_id for image_id in ids if image_id not in paths]
    if missing:
        raise MismatchError(f"{images_path} does not list image ids {missing[:5]} that {bench_path} uses")
    digests = image_digests(table)
    uris = [thumbnails.encode(paths[image_id], digests[image_id], images_path) for image_id in tqdm(ids, desc="thumbnails", disable=not progress)]
    return candidates, uris, ids


# --------------------------------------------------------------------------- the page


def explorer_document(
    cache_path: str,
    calibration_path: str,
    evaluation_path: str,
    *,
    benchmark_path: str | None = None,
    images_path: str | None = None,
    thumbnails: Thumbnails = Thumbnails(),
    progress: bool = False,
) -> dict[str, Any]:
    """Everything one explorer page shows, as a JSON-ready document (see the module docstring)."""
    cache = read_cache(cache_path)
    attrs = cache.attrs
    if cache.has_shifts or "parsed" in cache:
        raise ValueError(f"{cache_path}: the explorer needs a cache of scores and attention, not a "
                         f"{attrs.get('variant')!r} cache")
    evaluation = read_evaluation(evaluation_path)
    _check_evaluation(evaluation_path, evaluation, cache_path, attrs, calibration_path)
    calibration = Calibration.from_npz(calibration_path)
    check_calibrations(cache_path, attrs, [(calibration_path, calibration)], transfer=bool(evaluation.get("transfer")))
    arrays = eval_arrays(cache)
    predictions = _load_predictions(evaluation_path, evaluation)
    if not np.array_equal(predictions.pop("target_pos"), arrays.target_pos):
        raise MismatchError(f"{evaluation_path}: its predictions are not of {cache_path}'s rows (target positions differ)")
    settings = methods.LadSettings.from_record(evaluation.get("settings"))
    bench_path, bench = _benchmark(benchmark_path, attrs, cache_path)
    candidates, uris, image_ids = _thumbnails(bench, bench_path, images_path, thumbnails, progress)

    values = per_position_values(arrays, calibration, settings)
    layer_share = attention_shares(arrays.attn)
    selected = methods.layer_selection_mask(arrays.attn, settings)
    gap = logits_attention_gap(values["attention_share"], values["probability"], arrays.target_pos)
    names = [name for name in evaluation["methods"] if f"pred_{name}" in predictions]
    kind = attrs.get("model_kind") or evaluation.get("model_kind")
    n_instances, n_orderings, n = arrays.scores.shape
    title = f"{attrs.get('model')}: {attrs.get('benchmark_name')} ({attrs.get('variant_name')} cache)"
    return {
        "format": FORMAT,
        "title": title_with_kind(title, kind),
        "model": attrs.get("model"), "model_kind": kind, "kind_label": LABELS.get(kind),
        "benchmark": attrs.get("benchmark_name"), "dataset": evaluation.get("dataset"),
        "setting": evaluation.get("setting"), "variant": attrs.get("variant_name"), "prompt": attrs.get("variant"),
        "n_instances": int(n_instances), "n_orderings": int(n_orderings), "n_candidates": int(n),
        "n_layers": int(arrays.attn.shape[-2]),
        "settings": settings.as_dict(),
        "inputs": {"cache": str(cache_path), "cache_config_sha256": attrs.get("config_sha256"),
                   "calibration": str(calibration_path), "evaluation": str(evaluation_path),
                   "benchmark": bench_path, "images": images_path},
        "methods": [{"name": name, "label": methods.METHODS[name].label if name in methods.METHODS else name,
                     "acc_mean": evaluation["methods"][name].get("acc_mean"),
                     "recall_per_position": evaluation["methods"][name].get("recall_per_position"),
                     "confusion": evaluation["methods"][name].get("confusion")} for name in names],
        "per_position": [{"name": name, "label": label} for name, label in PER_POSITION.items()],
        "captions": [str(inst["caption"]) for inst in bench["eval"]],
        "candidates": candidates,
        "image_ids": image_ids,
        "thumbnails": uris,
        "arrays": {
            "target_pos": _packed(arrays.target_pos, "u1"),
            "order": _packed(arrays.order, "u1"),
            **{f"pred_{name}": _packed(predictions[f"pred_{name}"], "i1") for name in names},
            **{name: _packed(value, "<u2", PER_MILLE) for name, value in values.items()},
            "gap": _packed(gap, "<i2", PER_MILLE),
            "layer_share": _packed(layer_share, "u1", HEAT_LEVELS),
            "selected": _packed(selected, "u1"),
        },
    }


def _asset(name: str) -> str:
    return resources.files("ladbench.report").joinpath("assets", name).read_text(encoding="utf-8")


def _script_json(document: Any) -> str:
    """JSON safe inside a <script> element: ``<``, ``>`` and ``&`` written as JSON escapes, so no
    text of the inputs (a caption ``<!--<script>``, an output folder named ``<!--``) can close
    the element or switch the HTML parser into the script states where ``</script>`` no longer
    closes it (the page was blank); non-ASCII (U+2028 included) is escaped too."""
    text = json.dumps(document, separators=(",", ":"), allow_nan=False, ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


#: What inside an inline <script> makes the HTML parser end it early or never (HTML's script
#: data states): none may occur in a page's scripts, whatever the inputs.
_SCRIPT_HAZARDS = re.compile(r"<!--|<script|</script", re.IGNORECASE)
_INLINE_SCRIPTS = re.compile(r"<script\b[^>]*>(.*?)</script>", re.IGNORECASE | re.DOTALL)


def check_page(page: str, document: Mapping[str, Any], where: str | Path) -> None:
    """The explorer checks its own output: the page has its two scripts, none holds text that
    would end it early or never, and its data element reads back as ``document``; otherwise the
    page would show no cards, and this is an error naming ``where``."""
    scripts = _INLINE_SCRIPTS.findall(page)
    problem = None
    if len(scripts) != 2:
        problem = f"{len(scripts)} inline scripts where 2 were written"
    elif any(_SCRIPT_HAZARDS.search(script) for script in scripts):
        problem = "a script holds '<!--', '<script' or '</script'"
    elif json.loads(scripts[0]) != json.loads(json.dumps(document, allow_nan=False)):
        problem = "its data does not read back as written"
    if problem:
        raise ValueError(f"{where}: the page would not render its cards ({problem}); not written")


def render_page(document: Mapping[str, Any], body: str = "explorer.html", script: str = "explorer.js") -> str:
    """The self-contained HTML page: the page template with its body, style, script and data inlined."""
    page = _asset("page.html")
    for placeholder, text in (("<!--BODY-->", _asset(body)), ("/*STYLE*/", _asset("explorer.css")),
                              ("/*SCRIPT*/", _asset(script)), ("/*DATA*/", _script_json(document)),
                              ("<!--TITLE-->", html.escape(document["title"]))):
        page = page.replace(placeholder, text, 1)
    return page


def write_explorer(document: Mapping[str, Any], out: str | Path) -> None:
    """Write the page atomically, once it passed :func:`check_page`."""
    page = render_page(document)
    check_page(page, document, out)
    atomic_write_text(out, page)


# --------------------------------------------------------------------------- the index


def explorer_index(entries: Sequence[tuple[str, str]], out: str | Path) -> dict[str, Any]:
    """The index page's document: one row per explorer page, from its evaluation.

    ``entries``: (page path, evaluation JSON path) pairs; links are relative to ``out``'s folder.
    """
    import os

    rows = []
    for page, evaluation_path in entries:
        evaluation = read_evaluation(evaluation_path)
        predictions = _load_predictions(evaluation_path, evaluation)
        flags = card_flags(predictions, predictions["target_pos"])
        kind = evaluation.get("model_kind")
        rows.append({
            "href": Path(os.path.relpath(page, Path(out).parent)).as_posix(),
            "model": evaluation.get("model"), "model_kind": kind, "kind_label": LABELS.get(kind),
            "benchmark": evaluation.get("benchmark"), "dataset": evaluation.get("dataset"),
            "setting": evaluation.get("setting"), "n_candidates": evaluation.get("n_candidates"),
            "variant": evaluation.get("variant"), "cards": int(predictions["target_pos"].size),
            "counts": {name: int(value.sum()) for name, value in flags.items()},
        })
    return {"format": FORMAT, "title": "Instance explorer: every page", "pages": rows}


def write_explorer_index(entries: Sequence[tuple[str, str]], out: str | Path) -> None:
    document = explorer_index(entries, out)
    page = render_page(document, "explorer_index.html", "explorer_index.js")
    check_page(page, document, out)
    atomic_write_text(out, page)
