"""What the methods read besides the arrays: LAD's test-time settings (config ``lad``) and the
readouts' (config ``evaluation.reply_parse``), each field stating its default, allowed values
and help once (:mod:`ladbench.settings` derives the flags, the schema's block and the
workflow's hand-over from them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from ladbench.families import parse_layer_range
from ladbench.settings import Settings, setting, setting_fields

__all__ = ["CHOICES", "K_BEYOND_RANGE", "LAYERS_BEYOND_DEPTH", "LAYER_TIES", "REPLY_PARSES", "Choice", "LadSettings",
           "MethodSettings", "ReadoutSettings"]

# Each switchable LAD step: the reference implementation (default) or the paper's equation.
Choice = Literal["reference", "paper"]
CHOICES = ("reference", "paper")
# Layer selection's small rules (the paper states neither). Default: among layers of equal
# strength the HIGHEST index is kept (what the reference's "last K of an ascending sort" does
# with a stable sort), and a K larger than the layer range is lowered to the range's size (the
# reference's rule). The alternatives: the lowest index, or "argsort": the reference's own
# call, numpy's default (unstable) argsort of the layers' mean attention, whose order among
# equal values depends on numpy's build (AVX-512 sorting networks); an error.
LAYER_TIES = ("highest", "lowest", "argsort")
K_BEYOND_RANGE = ("lower", "error")
# A layer range past the model's last layer (the reference's 21-35 on a 28-layer model): clip
# it (default), or "absent", the reference's arithmetic: the layers that do not exist take
# part with attention 0 and calibration prior 0 (log 1e-20), so a K beyond the layers that
# exist averages them in.
LAYERS_BEYOND_DEPTH = ("clip", "absent")
# How vanilla_generate reads a greedy reply: "exact", the last digit run that spells an
# identifier 1..N; "int", the reference's: int() of each run of decimal digits (leading
# zeros and any Unicode decimal digit count), the last value in 1..N.
REPLY_PARSES = ("exact", "int")
#: what a given layer range with windowed layers does (LadSettings.windowed_layers)
WINDOWED_LAYERS = ("refuse", "unseen")


@dataclass(frozen=True)
class LadSettings(Settings):
    """LAD's test-time settings (config ``lad``; defaults: the reference implementation's, whose
    numbers are the published ones). The layer range is a model's (``models.*.layer_range``,
    else its family's); ``use_prior`` and ``all_layers`` are the ablations' switches."""

    section = "lad"

    top_k: int = setting(2, "K: layers kept by attention strength (0: none, a uniform posterior, as the reference "
                         "computes it)", minimum=0)
    tau: float = setting(5.0, "sharpening temperature of the purified attention (> 0)", above=0,
                         below=float("inf"))     # an infinite tau flattens every row: LAD predicts position 1
    # inclusive, 0-based; None = every layer; (first, last, of): layers first..last of an
    # of-layer decoder, scaled to the model's depth (a family default, ladbench.families)
    layer_range: tuple[int, ...] | None = setting(
        None, "layer search range: all (the paper) or first:last, 0-based inclusive, clipped to the model's last "
        "layer, or first:last/of: layers first..last of an of-layer decoder, scaled to the model's depth (default: "
        "the cache's model family's, as in the config, e.g. 21:35/36, the reference's)", kind=str, config=False)
    use_prior: bool = setting(True, "divide by the attention prior (False: the 'no prior' ablation)",
                              config=False, flag=False)
    all_layers: bool = setting(False, "average every layer of layer_range instead of the top-K (an ablation)",
                               config=False, flag=False)
    layer_mean: Choice = setting("reference", "purified attention: reference = log of the mean over layers; paper = "
                                 "mean of the logs (Eqs. 10-11)", choices=CHOICES)
    mixture: Choice = setting("reference", "expected bias: reference = mix the bias rows in log space; paper = in "
                              "probability space (Eq. 13)", choices=CHOICES)
    layer_ties: str = setting(
        LAYER_TIES[0], "layer selection, layers of equal strength: highest = keep the higher layer index (what the "
        "reference's 'last K of an ascending sort' gives with a stable sort); lowest = the lower; argsort = the "
        "reference's own call, numpy's default argsort of the layers' mean attention (not stable: its result depends "
        "on numpy's build). Rows where it decides are counted in the evaluation output's warnings", choices=LAYER_TIES)
    k_beyond_range: str = setting(
        K_BEYOND_RANGE[0], "top_k larger than the model's layer range: lower = use every layer of the range (the "
        "reference implementation; a warning in the evaluation output); error = stop", choices=K_BEYOND_RANGE)
    layers_beyond_depth: str = setting(
        LAYERS_BEYOND_DEPTH[0], "a layer range past the model's last layer (the reference's 21-35 on a 28-layer "
        "model): clip = search only the layers that exist; absent = the reference's arithmetic, the missing layers "
        "take part with attention 0 and calibration prior 0 (log 1e-20), so a K beyond the layers that exist "
        "averages them in (rows where it does are counted in the evaluation output's warnings)",
        choices=LAYERS_BEYOND_DEPTH)

    windowed_layers: str = setting(
        WINDOWED_LAYERS[0], "a model's layer_range that holds layers with a sliding window (docs/method.md, "
        "'Windowed layers'): refuse = stop at start-up; unseen = run, with those layers left out of the selection as "
        "unseen (their attention is never read as zero); read by the start-up checks", choices=WINDOWED_LAYERS,
        flag=False)
    # the layers the selection leaves out, from the cache (its attention_windows): set by the
    # stages from the cache's attributes, never by the user
    unseen_layers: tuple[int, ...] = setting((), "layers left out of the selection (sliding windows)", kind=int,
                                             config=False, flag=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "layer_range", parse_layer_range(self.layer_range))   # any form, checked
        object.__setattr__(self, "unseen_layers", tuple(int(layer) for layer in self.unseen_layers))

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | None) -> LadSettings:
        """The settings an output records (an evaluation's ``settings``; other keys are ignored)."""
        known = {f.name for f in setting_fields(cls)}
        return cls(**{key: value for key, value in (record or {}).items() if key in known})


@dataclass(frozen=True)
class ReadoutSettings(Settings):
    """How a readout of a cache's replies is read (config ``evaluation``)."""

    section = "evaluation"

    reply_parse: str = setting(
        REPLY_PARSES[0], "how the method vanilla_generate reads a greedy reply: exact = the last run of digits that "
        "spells an identifier 1..N; int = the reference's, int() of each run of decimal digits, so '03' and "
        "non-ASCII digits count (replies read differently are counted in the evaluation output's warnings)",
        choices=REPLY_PARSES)


@dataclass(frozen=True)
class MethodSettings:
    """Everything a method may read besides the arrays and the calibration."""

    lad: LadSettings = LadSettings()
    readout: ReadoutSettings = ReadoutSettings()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, flat (as an evaluation records its settings)."""
        return {**self.lad.as_dict(), **self.readout.as_dict()}
