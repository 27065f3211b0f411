"""What the torch-free code (the Snakemake workflow, the methods) knows about each model family.

Stated here once; the adapters (``ladbench.models``) carry the rest of a family's knowledge.
"""
from __future__ import annotations

#: The reference's LAD layer search range, "layers 21..35 of a 36-layer decoder", as
#: ``(first, last, of)``: on a model of another depth it covers the same share of the decoder
#: (:func:`scale_layer_range`), e.g. layers 16..27 of 28.
REFERENCE_LAYER_RANGE = (21, 35, 36)

#: LAD's layer search range for a model whose config sets no ``layer_range``, per family.
#: The paper's config states its ranges explicitly; these serve today's models.
DEFAULT_LAYER_RANGES: dict[str, tuple[int, int, int]] = {
    "qwen2_5_vl": REFERENCE_LAYER_RANGE,
    "internvl": REFERENCE_LAYER_RANGE,
    "llava_ov15": REFERENCE_LAYER_RANGE,
    "qwen3_vl": REFERENCE_LAYER_RANGE,
    "llava_onevision": REFERENCE_LAYER_RANGE,
}


#: The transformers lanes (README "Which lane for what"): the paper's (4.53.x) and the current (5.x).
LANES = ("paper", "current")

#: Families that run on one lane only (every other family runs on both): LLaVA-OneVision-1.5's
#: hub code does not run on transformers 5.x; Qwen3-VL's class exists only from 5.x on.
ONE_LANE_FAMILIES: dict[str, tuple[str, ...]] = {"llava_ov15": ("paper",), "qwen3_vl": ("current",)}


class LaneError(ValueError):
    """A family asked of the transformers lane that cannot run it; the message names the venv that can."""


def family_lanes(family: str) -> tuple[str, ...]:
    """The lanes ``family`` runs on."""
    return ONE_LANE_FAMILIES.get(family, LANES)


def installed_lane() -> str:
    """The lane of the installed transformers, read from its metadata (without importing it)."""
    from importlib.metadata import version

    return "current" if int(version("transformers").split(".")[0]) >= 5 else "paper"


def lane_venv(lanes: tuple[str, ...]) -> str:
    """Where a family of ``lanes`` runs (the remedy in lane errors)."""
    return ".venv (make install)" if "paper" in lanes else ".venv-current (make install-current)"

#: Every model family: each has a default layer range, an adapter and a tiny offline build
#: (tests/test_models_tiny.py checks all three).
FAMILIES = tuple(DEFAULT_LAYER_RANGES)


def default_layer_range(family: str) -> tuple[int, int, int]:
    """The family's default layer range ``(first, last, of)`` (clear error for unknown names)."""
    try:
        return DEFAULT_LAYER_RANGES[family]
    except KeyError:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(sorted(DEFAULT_LAYER_RANGES))}") from None


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
