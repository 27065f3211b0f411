"""CLIP image and caption embeddings into HDF5 (docs/formats.md §2), and the demo's tiny CLIP.

Every model, real or tiny, is loaded through the same call,
``open_clip.create_model_and_transforms(name, pretrained=<tag or checkpoint file>)``.
A custom architecture (the demo's tiny model) is first registered from its JSON config
with ``open_clip.add_model_config``; the config file's stem is the model name.

QuickGELU guard: the OpenAI CLIP weights were trained with QuickGELU. open_clip only
*warns* when they are loaded into a model whose config uses nn.GELU (e.g. ``ViT-L-14``
instead of ``ViT-L-14-quickgelu``) and the embeddings are then silently wrong; here that
combination is refused with a message naming the right model.

Weights identity: the sha256 of the checkpoint file actually loaded (for a tag, the file
in the user's open_clip / Hugging Face cache, which is also where the weights come from
when offline: set ``HF_HUB_OFFLINE=1``).

Resumption: the file is a :class:`ladbench.hdf5.ResumableFile` (built in ``<out>.partial``
with every dataset at full size and a ``done`` flag per row, written batch by batch, so
after a kill a rerun computes only the rows not yet flagged; ``complete`` set last, then
the rename). A file left by another model, other weights or another image table is
started over (with a warning).

Unreadable images: by default the first one stops the run with an error naming the file.
With ``--skip-bad-images`` its image embedding is written as NaN (its caption embedding
is still computed), the row is flagged done, and the count and file names are recorded
in the ``n_bad_images``/``bad_images`` attributes; the benchmark leaves such images out.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ladbench.atomic import atomic_path, atomic_write_json, file_digest
from ladbench.clip import TINY_CLIP_NAME, ClipSettings
from ladbench.data.coco import load_image_table, read_image, table_fingerprint
from ladbench.hdf5 import (ResumableFile, RowDataset, attributes, check_digest, discard_work, is_complete, reading,
                           writing)
from ladbench.progress import progress_bar

# Small enough to build and run in a second on a CPU; the text tower keeps open_clip's
# BPE vocabulary (49,408 tokens) because the stock tokenizer emits those ids.
TINY_CLIP_CONFIG: dict[str, Any] = {
    "embed_dim": 32,
    "quick_gelu": False,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}


class FeatureError(ValueError):
    """Features cannot be computed; the message names the file, model or weights at fault."""


# --- model loading ----------------------------------------------------------------------

def register_model_config(config_path: str | os.PathLike, model_name: str) -> None:
    """Register a custom open_clip architecture from its JSON config file.

    open_clip names a registered config after the file's stem, so the stem must equal
    ``model_name``.
    """
    import open_clip

    path = Path(config_path)
    if not path.is_file():
        raise FeatureError(f"--model-config {path}: file not found")
    if path.stem != model_name:
        raise FeatureError(f"--model-config {path}: open_clip names a config after its file stem "
                           f"('{path.stem}'), which must equal --model '{model_name}'")
    open_clip.add_model_config(path)


def check_quick_gelu(model_name: str, pretrained: str) -> None:
    """Refuse a pretrained tag whose activation (QuickGELU or GELU) differs from the model's.

    Only tags carry this information; a checkpoint file is the caller's responsibility.
    """
    import open_clip

    tag_cfg = open_clip.get_pretrained_cfg(model_name, pretrained) if not os.path.isfile(pretrained) else {}
    if not tag_cfg:
        return
    model_cfg = open_clip.get_model_config(model_name) or {}
    tag_quick, model_quick = bool(tag_cfg.get("quick_gelu", False)), bool(model_cfg.get("quick_gelu", False))
    if tag_quick != model_quick:
        if tag_quick:
            suggestion = f"use --model {model_name}-quickgelu"
        else:
            suggestion = f"use --model {model_name.removesuffix('-quickgelu')}"
        raise FeatureError(
            f"weights '{pretrained}' were trained with {'QuickGELU' if tag_quick else 'GELU'} but model "
            f"'{model_name}' uses {'QuickGELU' if model_quick else 'GELU'}: the embeddings would be silently "
            f"wrong; {suggestion}")


def resolve_weights(model_name: str, pretrained: str, cache_dir: str | None = None) -> Path:
    """The checkpoint file behind ``pretrained`` (a path, or a tag fetched into / read from the cache)."""
    import open_clip
    from open_clip import pretrained as oc_pretrained

    if os.path.isfile(pretrained):
        return Path(pretrained)
    tag_cfg = open_clip.get_pretrained_cfg(model_name, pretrained)
    if not tag_cfg:
        known = open_clip.list_pretrained_tags_by_model(model_name)
        raise FeatureError(f"--pretrained '{pretrained}' is neither a file nor a tag of '{model_name}' "
                           f"(known tags: {known})")
    try:
        path = oc_pretrained.download_pretrained(tag_cfg, cache_dir=cache_dir)
    except Exception as err:  # network errors, LocalEntryNotFoundError when offline, ...
        raise FeatureError(
            f"could not get the '{pretrained}' weights of '{model_name}' ({type(err).__name__}: {err}). "
            "On a machine with network access run this once to fill the cache (Hugging Face cache, "
            "HF_HOME), then rerun offline with HF_HUB_OFFLINE=1; or pass --pretrained /path/to/checkpoint") from err
    if not path or not os.path.isfile(path):
        raise FeatureError(f"open_clip returned no weights file for '{model_name}' / '{pretrained}'")
    return Path(path)


def pick_device(device: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU; ``cuda`` without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise FeatureError("--device cuda: no CUDA device is available")
    return torch.device(device)


def load_clip(model_name: str, pretrained: str, model_config: str | os.PathLike | None = None,
              device: str | torch.device = "cpu", cache_dir: str | None = None):
    """Load an open_clip model for inference.

    Returns ``(model, preprocess, tokenizer, weights_path)``; the model is in eval mode on
    ``device``. Raises :class:`FeatureError` for a QuickGELU mismatch or missing weights.
    """
    import open_clip

    if model_config is not None:
        register_model_config(model_config, model_name)
    if model_name not in open_clip.list_models():
        raise FeatureError(f"--model '{model_name}' is not an open_clip architecture "
                           "(pass --model-config for a custom one)")
    check_quick_gelu(model_name, pretrained)
    weights = resolve_weights(model_name, pretrained, cache_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the QuickGELU warning is handled above
        model, _, preprocess = open_clip.create_model_and_transforms(
            model_name, pretrained=pretrained, device=device, cache_dir=cache_dir)
    model.eval()
    return model, preprocess, open_clip.get_tokenizer(model_name), weights


def build_tiny_clip(out_dir: str | os.PathLike, seed: int = 0, name: str = TINY_CLIP_NAME) -> dict:
    """Save a tiny randomly initialised open_clip model: ``{name}.json`` config + ``{name}.pt`` weights.

    Also writes ``clip.json`` (model name, config and checkpoint file names, weights
    sha256) and checks that the checkpoint loads back through :func:`load_clip`. Returns
    that manifest with the files' full paths.
    """
    import open_clip

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    config_path, weights_path = out / f"{name}.json", out / f"{name}.pt"
    atomic_write_json(config_path, TINY_CLIP_CONFIG, indent=2)
    register_model_config(config_path, name)
    torch.manual_seed(seed)
    model = open_clip.create_model(name, pretrained=None)
    with atomic_path(weights_path) as tmp, open(tmp, "wb") as handle:
        # An open handle: given a path, torch.save names the archive's records after the
        # file (here the temporary, with the writer's pid), and the bytes differ per run.
        torch.save(model.state_dict(), handle)
    load_clip(name, str(weights_path), config_path)  # the same code path as a real model
    manifest = {"model": name, "model_config": config_path.name, "pretrained": weights_path.name,
                "weights_sha256": file_digest(weights_path), "seed": seed}
    # File names relative to the folder, so two builds in two places are byte-identical.
    atomic_write_json(out / "clip.json", manifest, indent=2)
    return {**manifest, "model_config": str(config_path), "pretrained": str(weights_path)}


# --- image decoding ---------------------------------------------------------------------

class ImageFiles(torch.utils.data.Dataset):
    """Rows of the image table, decoded and preprocessed; a decoding error is returned, not raised.

    Returning the error lets the main process decide (stop naming the file, or skip it)
    instead of a worker crashing with a traceback that hides the file name.
    """

    def __init__(self, paths: list[Path], rows: list[int], preprocess: Callable, digests: list[str | None] | None = None):
        self.paths, self.rows, self.preprocess = paths, rows, preprocess
        self.digests = digests or [None] * len(paths)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: int) -> tuple[int, torch.Tensor | None, str | None]:
        row = self.rows[item]
        try:
            with read_image(self.paths[row], self.digests[row]) as image:   # bytes checked against the table
                tensor = self.preprocess(image.convert("RGB"))
            return row, tensor, None
        except Exception as err:  # PIL raises several types for truncated/corrupt files
            return row, None, f"{type(err).__name__}: {err}"


def collate_rows(items: list[tuple[int, torch.Tensor | None, str | None]]) -> dict:
    """Batch rows; images that failed to decode stay out of the tensor and are listed apart."""
    good = [(row, tensor) for row, tensor, error in items if error is None]
    return {"rows": [row for row, _, _ in items],
            "good_rows": [row for row, _ in good],
            "pixels": torch.stack([tensor for _, tensor in good]) if good else None,
            "errors": {row: error for row, _, error in items if error is not None}}


# --- encoding ---------------------------------------------------------------------------

def l2_normalise(x: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm (float32)."""
    x = np.asarray(x, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@torch.no_grad()
def encode_image_batch(model, pixels: torch.Tensor, device: torch.device) -> np.ndarray:
    """L2-normalised image embeddings of a preprocessed batch, float32 [B, D]."""
    return l2_normalise(model.encode_image(pixels.to(device)).float().cpu().numpy())


@torch.no_grad()
def encode_text_batch(model, tokenizer, captions: list[str], device: torch.device) -> np.ndarray:
    """L2-normalised caption embeddings, float32 [B, D]."""
    return l2_normalise(model.encode_text(tokenizer(captions).to(device)).float().cpu().numpy())


# --- HDF5 -------------------------------------------------------------------------------

# What to do with a features file that cannot be read (the end of its one-line error).
REBUILD = "delete it and rerun the workflow (or `ladbench features`) to rebuild it"
# Rows per HDF5 chunk (1024 x 768 float16 embeddings: 1.5 MB).
CHUNK_ROWS = 1024


def _embedding_datasets(n_rows: int, dim: int) -> dict[str, RowDataset]:
    """The datasets filled batch by batch; rows of unreadable images keep their NaN."""
    return {name: RowDataset((n_rows, dim), np.float16, np.nan) for name in ("image_emb", "text_emb")}


def _warn(message: str) -> None:
    print(f"features: {message}", file=sys.stderr)


def compute_features(images_json: str | os.PathLike, out: str | os.PathLike, clip: ClipSettings | None = None, *,
                     skip_bad_images: bool = False, cache_dir: str | None = None) -> Path:
    """Embed every image and caption of an image table into ``out`` (docs/formats.md §2) with
    ``clip``'s model, weights and execution.

    Resumes a previous interrupted run of the same model, weights and table. Returns
    ``out`` as a Path. One process at a time writes ``out``: a second refuses at once.
    """
    clip = clip or ClipSettings()
    with writing(out, "features file"):
        return _compute_features(images_json, out, clip.model, clip.pretrained, clip.model_config, clip.batch_size,
                                 clip.workers, clip.device, skip_bad_images, cache_dir)


def _compute_features(images_json, out, model_name, pretrained, model_config, batch_size, workers, device,
                      skip_bad_images, cache_dir) -> Path:
    import open_clip

    if batch_size < 1:
        raise FeatureError(f"--batch-size must be >= 1, got {batch_size}")
    table = load_image_table(images_json)
    rows = table["images"]
    if not rows:
        raise FeatureError(f"{images_json}: the image table is empty")
    root = Path(table["image_root"])
    paths = [root / row["file_name"] for row in rows]
    captions = [row["caption"] for row in rows]
    image_ids = np.array([row["image_id"] for row in rows], dtype=np.int64)

    torch_device = pick_device(device)
    model, preprocess, tokenizer, weights = load_clip(model_name, pretrained, model_config, torch_device, cache_dir)
    dim = int(encode_text_batch(model, tokenizer, captions[:1], torch_device).shape[1])
    # A checkpoint file is recorded by name (its identity is weights_sha256), so the file
    # does not depend on the folder the study runs in.
    recorded = Path(pretrained).name if os.path.isfile(pretrained) else str(pretrained)
    attrs = {"model": model_name, "pretrained": recorded, "weights_sha256": file_digest(weights),
             "open_clip_version": open_clip.__version__, "table_sha256": table_fingerprint(table)}

    out = Path(out)
    fixed, datasets = {"image_id": image_ids}, _embedding_datasets(len(image_ids), dim)
    if is_complete(out, attrs, fixed, datasets):
        discard_work(out)
        return out  # finished earlier from the same inputs
    # Work in `<out>.partial` and rename when complete: a workflow manager deletes a job's
    # declared outputs before rerunning it, and an interrupted run must survive that.
    writer = ResumableFile.open(out, identity=attrs, fixed=fixed, datasets=datasets, chunk_rows=CHUNK_ROWS,
                                attrs={"n_bad_images": 0, "bad_images": "[]"}, warn=_warn)
    pending = writer.pending_rows().tolist()
    bad = json.loads(writer.attr("bad_images"))
    if pending:
        loader = torch.utils.data.DataLoader(
            ImageFiles(paths, pending, preprocess, [row.get("sha256") for row in rows]), batch_size=batch_size, shuffle=False,
            num_workers=workers, collate_fn=collate_rows, pin_memory=torch_device.type == "cuda")
        with progress_bar(len(rows), initial=len(rows) - len(pending), desc="features", unit="img") as bar:
            for batch in loader:
                embeddings, failed = _embed_batch(batch, paths, captions, model, tokenizer, torch_device,
                                                  skip_bad_images)
                bad.extend(failed)
                writer.write(batch["rows"], embeddings, {"bad_images": json.dumps(bad), "n_bad_images": len(bad)})
                bar.update(len(batch["rows"]))
    writer.finish()
    if bad:
        print(f"features: skipped {len(bad)} unreadable images (NaN embeddings), e.g. {bad[:3]}", file=sys.stderr)
    return out


def _embed_batch(batch: dict, paths: list[Path], captions: list[str], model, tokenizer, device: torch.device,
                 skip_bad_images: bool) -> tuple[dict[str, np.ndarray], list[str]]:
    """One batch's float16 embeddings (NaN image rows for images that failed to decode) and
    the files that failed."""
    if batch["errors"] and not skip_bad_images:
        row, error = next(iter(batch["errors"].items()))
        raise FeatureError(f"cannot read image {paths[row]} ({error}); fix or remove it, or pass "
                           "--skip-bad-images to leave unreadable images out")
    rows = batch["rows"]
    text = encode_text_batch(model, tokenizer, [captions[r] for r in rows], device)
    image = np.full(text.shape, np.nan, dtype=np.float32)
    if batch["good_rows"]:
        good = [rows.index(r) for r in batch["good_rows"]]
        image[good] = encode_image_batch(model, batch["pixels"], device)
    embeddings = {"text_emb": text.astype(np.float16), "image_emb": image.astype(np.float16)}
    return embeddings, [str(paths[r]) for r in sorted(batch["errors"])]


def load_features(path: str | os.PathLike, require_complete: bool = True) -> dict[str, Any]:
    """Read a features file: ``image_id``, ``image_emb``, ``text_emb`` (float16 arrays) and its attributes."""
    path = Path(path)
    if not path.is_file():
        raise FeatureError(f"{path}: features file not found (run `ladbench features`)")
    with reading(path, "features file", REBUILD) as h5:
        attrs = attributes(h5)
        if require_complete and not bool(attrs.get("complete", False)):
            raise FeatureError(f"{path}: features are incomplete (attribute complete is false); rerun `ladbench features`")
        for name in ("image_id", "image_emb", "text_emb"):
            if name not in h5:
                raise FeatureError(f"{path}: dataset '{name}' missing (docs/formats.md §2)")
        arrays = {name: ds[()] for name, ds in h5.items()}
    if attrs.get("complete", False):
        check_digest(path, attrs, arrays, "features file", REBUILD)
    data = {name: arrays[name] for name in ("image_id", "image_emb", "text_emb")}
    problem = embedding_problem(data)
    if problem:
        raise FeatureError(f"{path}: {problem}; rebuild it with `ladbench features`")
    data["attrs"] = attrs
    return data


def embedding_problem(data: dict[str, np.ndarray]) -> str | None:
    """A row no encoder writes (a digest proves who wrote a file, not what: a re-signed file is
    checked too), or None: an infinite value, or an all-zero row (no direction, so its cosine
    similarities are NaN). NaN image rows are the unreadable images ``--skip-bad-images`` left out."""
    for name in ("image_emb", "text_emb"):
        emb = np.asarray(data[name], dtype=np.float32)
        bad = np.isinf(emb).any(axis=1) | ~np.any(emb != 0, axis=1)
        if bad.any():
            row = int(np.argmax(bad))
            kind = "an infinite value" if np.isinf(emb[row]).any() else "only zeros"
            return (f"{name} row {row} (image {int(data['image_id'][row])}) holds {kind}, which no encoder writes "
                    f"({int(bad.sum())} such rows)")
    return None
