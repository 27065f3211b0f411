"""What the torch-free code (the Snakemake workflow, the methods) knows about each model family.

Stated here once (:data:`FAMILY_REGISTRY`); the adapters (``ladbench.models``) carry the rest
of a family's knowledge.
"""
from __future__ import annotations

from dataclasses import dataclass

#: The reference's LAD layer search range, "layers 21..35 of a 36-layer decoder", as
#: ``(first, last, of)``: on a model of another depth it covers the same share of the decoder
#: (:func:`scale_layer_range`), e.g. layers 16..27 of 28.
REFERENCE_LAYER_RANGE = (21, 35, 36)

#: The transformers lanes (README "Which lane for what"): the paper's (4.53.x) and the current (5.x).
LANES = ("paper", "current")

#: How the vision tower runs (``models/vision.py``): every image of a batch together
#: (Qwen2.5-VL-style towers), the same with each block under ``torch.compile``, or
#: transformers' own code (for comparison).
VISION_TOWERS = ("batched", "compiled", "native")
#: Which features LLaVA-OneVision-1.5's RICE-ViT (hub code) gives each image of a tower call
#: (``models/llava_ov15.py``): what the hub code computes for each prompt alone, or each image's own.
RICE_FEATURES = ("per_prompt", "per_image")
#: A model's weights dtype (``models/base.resolve_dtype``); auto: bfloat16 on a GPU, float32 on the CPU.
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: Where a model runs: a GPU when one is visible (auto), the CPU, or a (numbered) GPU.
DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?"


@dataclass(frozen=True)
class Family:
    """Everything the project states about one model family, once; the adapter class
    (``ladbench.models.<adapter>``) holds what needs torch.

    ``adapter``: ``"module:Class"`` under ``ladbench.models``, imported when a model loads.
    ``lanes``: the transformers lanes it runs on. ``layer_range``: LAD's layer search range
    for a model whose config sets none, ``(first, last, of)`` (scaled to the model's depth).
    ``tiny_build``: ``ladbench demo-model`` can build a tiny random model of it
    (``models/tiny.py``). ``remote_code``: it runs the checkpoint's own code
    (``trust_remote_code`` must be set). ``why``: what the hand-written adapter adds over
    ``auto``, or why the family is one lane only (docs, errors)."""

    adapter: str
    lanes: tuple[str, ...] = LANES
    layer_range: tuple[int, int, int] = REFERENCE_LAYER_RANGE
    tiny_build: bool = True
    remote_code: bool = False
    why: str = ""
    #: the inference settings that this family alone reads (part of its caches' identity only)
    own_settings: tuple[str, ...] = ()


#: Every model family. ``auto`` derives what the others state by hand from the model and its
#: processor (any image-text-to-text architecture of transformers 5.x; models/auto.py).
FAMILY_REGISTRY: dict[str, Family] = {
    "qwen2_5_vl": Family("qwen2_5_vl:Qwen25VLAdapter",
                         why="the batched vision tower (models/vision.py) and the paper lane's published numbers"),
    "internvl": Family("internvl:InternVLAdapter",
                       why="the paper lane (auto needs transformers 5.x); on the current lane auto writes its cache"),
    "llava_ov15": Family("llava_ov15:LlavaOV15Adapter", lanes=("paper",), remote_code=True,
                         why="the checkpoint's own code, which does not run on transformers 5.x",
                         own_settings=("rice_features",)),
    "qwen3_vl": Family("qwen3_vl:Qwen3VLAdapter", lanes=("current",),
                       why="nothing over auto, which writes its cache; kept so that studies naming it keep their caches"),
    "llava_onevision": Family("llava_onevision:LlavaOnevisionAdapter",
                              why="the paper lane (auto needs transformers 5.x); on the current lane auto writes its cache"),
    "auto": Family("auto:AutoAdapter", lanes=("current",), tiny_build=False,
                   why="reads each image's tokens from the processor's replacement offsets, new in transformers 5.x"),
}

#: The inference settings that one family or another alone reads.
FAMILY_SETTINGS = tuple(sorted({name for f in FAMILY_REGISTRY.values() for name in f.own_settings}))
#: The family names, in registry order.
FAMILIES = tuple(FAMILY_REGISTRY)
#: The families ``ladbench demo-model`` builds tiny.
TINY_FAMILIES = tuple(name for name, family in FAMILY_REGISTRY.items() if family.tiny_build)
#: LAD's default layer search range per family (the paper's config states its ranges explicitly).
DEFAULT_LAYER_RANGES: dict[str, tuple[int, int, int]] = {name: f.layer_range for name, f in FAMILY_REGISTRY.items()}


def family_entry(name: str) -> Family:
    """The registry entry of ``name`` (clear error for unknown names)."""
    try:
        return FAMILY_REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(sorted(FAMILY_REGISTRY))}") from None


def family_lanes(name: str) -> tuple[str, ...]:
    """The lanes ``name`` runs on."""
    return family_entry(name).lanes


class LaneError(ValueError):
    """A family asked of the transformers lane that cannot run it; the message names the venv that can."""


def installed_lane() -> str:
    """The lane of the installed transformers, read from its metadata (without importing it)."""
    from importlib.metadata import version

    return "current" if int(version("transformers").split(".")[0]) >= 5 else "paper"


def lane_venv(lanes: tuple[str, ...]) -> str:
    """Where a family of ``lanes`` runs (the remedy in lane errors)."""
    return ".venv (make install)" if "paper" in lanes else ".venv-current (make install-current)"


def default_layer_range(family: str) -> tuple[int, int, int]:
    """The family's default layer range ``(first, last, of)`` (clear error for unknown names)."""
    return family_entry(family).layer_range


def layer_range_for(family: str | None, given=None) -> tuple[int, ...] | None:
    """LAD's layer search range of a model, decided here alone: ``given`` (any form
    :func:`parse_layer_range` reads; ``"all"``: every layer), else the family's default, else
    (a cache that records no family) the reference's range scaled to the model's depth."""
    if given is not None:
        return parse_layer_range(given)
    return default_layer_range(family) if family else REFERENCE_LAYER_RANGE


def scale_layer_range(first: int, last: int, of: int, n_layers: int) -> tuple[int, int]:
    """Layers ``first..last`` of an ``of``-layer decoder, for a decoder of ``n_layers``: the
    half-open share ``[first, last + 1) / of`` of the depth, rounded to whole layers."""
    lo = round(first * n_layers / of)
    hi = round((last + 1) * n_layers / of) - 1
    return min(lo, n_layers - 1), max(min(hi, n_layers - 1), min(lo, n_layers - 1))


#: A layer range, in its one representation: ``None`` (every layer), ``(first, last)``
#: (0-based, inclusive, clipped to the model's last layer) or ``(first, last, of)`` (layers
#: first..last of an ``of``-layer decoder, scaled to the model's depth: a family default).
#: The config writes it ``all`` / ``[first, last]``, the command line ``all`` / ``first:last`` /
#: ``first:last/of``; :func:`parse_layer_range` reads every form, :func:`layer_range_arg` writes
#: the command-line one.


def parse_layer_range(value) -> tuple[int, ...] | None:
    """The one parser of a layer range, from any of its forms: ``None`` or ``"all"``, text
    ``"21:35"`` / ``"21:35/36"``, or a sequence ``[21, 35]`` / ``(21, 35, 36)``; checks
    ``0 <= first <= last (< of)``."""
    if value is None or value == "all":
        return None
    if isinstance(value, str):
        try:
            span, _, of = value.partition("/")
            parts = tuple(int(part) for part in span.split(":")) + ((int(of),) if of else ())
            if len(parts) not in (2, 3):
                raise ValueError
        except ValueError:
            raise ValueError(f"layer range '{value}': expected 'all', 'first:last' or 'first:last/of', "
                             "e.g. 21:35 or 21:35/36") from None
    else:
        parts = tuple(value)
        if len(parts) not in (2, 3) or not all(isinstance(v, int) or float(v).is_integer() for v in parts):
            raise ValueError(f"layer range {list(parts)}: expected [first, last] or [first, last, of]")
        parts = tuple(int(v) for v in parts)
    first, last, *depth = parts
    if not 0 <= first <= last or (depth and last >= depth[0]):
        raise ValueError(f"layer range {layer_range_arg(parts)}: need 0 <= first <= last (< of)")
    return parts


def layer_range_arg(value) -> str:
    """The command-line form of a layer range (any form :func:`parse_layer_range` reads):
    ``all``, ``first:last`` or ``first:last/of``."""
    if value is None or value == "all":
        return "all"
    text = f"{value[0]}:{value[1]}"
    return text if len(value) == 2 else f"{text}/{value[2]}"
