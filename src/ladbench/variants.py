"""Prompt variants: every way the ``infer`` stage asks a model, each declared once (a registry).

A :class:`PromptVariant` states

- its prompt text (a builder from :mod:`ladbench.inference.prompts`);
- its kind: ``scoring`` (one forward pass per row: candidate scores and attention) or
  ``generative`` (replies, parsed into the position they name);
- its row plan: whether every ordering is also shown at its N cyclic shifts (N rows per
  ordering: permutation averaging), and how many replies a row samples (self-consistency);
- its own settings: a settings carrier (:mod:`ladbench.settings`; config
  ``inference.prompt_settings.<variant>``, flags ``--<variant>-<field>``), and which of them
  enter the cache hash (``config_sha256``);
- the methods that read its cache (``ladbench evaluate``'s default; the first is its readout
  in the tables);
- its label and place in the tables (Table 1 or 8, and Table 2's passes).

The infer stage, ``evaluate``, ``plan``, the report and the config schema's enums derive from
:data:`VARIANTS`. Torch-free: hooks that need torch import it when called.

Adding a variant is one :func:`register_variant` call. Outside this file it goes in a plugin
(:mod:`ladbench.plugins`: an installed entry point, or a module named in the config's
``plugins`` list).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from ladbench.inference import prompts
from ladbench.registry import Registry
from ladbench.settings import Settings, setting

__all__ = ["PromptVariant", "VARIANTS", "prompt_sha256", "prompt_text", "register_variant",
           "setting", "variant", "variant_names"]

SCORING, GENERATIVE = "scoring", "generative"


# A variant's settings are a carrier (ladbench.settings): each field states its default, bounds
# and help once; ``hashed=False`` keeps a field that does not change the cache's content out of
# its identity (the others enter the cache hash as ``<variant>_<field>``).


@dataclass(frozen=True)
class NoSettings(Settings):
    """A variant without settings of its own."""


@dataclass(frozen=True)
class SofaSettings(Settings):
    sigma: float = setting(0.5, "future image-to-image attention weight, in [0, 1]", minimum=0, maximum=1)
    every: int = setting(2, "apply SoFA in every n-th decoder layer from layer 0", minimum=1)


@dataclass(frozen=True)
class CotSettings(Settings):
    max_new_tokens: int = setting(1024, "greedy reply length limit", minimum=1)


@dataclass(frozen=True)
class ScSettings(Settings):
    samples: int = setting(10, "sampled replies per row (majority vote)", minimum=1)
    temperature: float = setting(0.7, "sampling temperature", above=0)
    top_k: int = setting(40, "top-k of the sampling", minimum=1)
    max_new_tokens: int = setting(512, "reply length limit", minimum=1)


def _sofa_masks(adapter, inputs, modules, settings: SofaSettings):
    """SoFA's attention masks on every ``settings.every``-th layer, active during the prefill."""
    from ladbench.models.attention import SofaMask, sofa_attention_bias, sofa_layers
    bias = sofa_attention_bias(inputs["attention_mask"], inputs["input_ids"] == adapter.image_token_id,
                               settings.sigma, adapter.model.dtype)
    return SofaMask([modules[i] for i in sofa_layers(len(modules), settings.every)], bias)


def _sampler_identity() -> dict[str, str]:
    from ladbench.inference.sampling import SAMPLER       # the sampling scheme changes the replies
    return {"sampler": SAMPLER}


@dataclass(frozen=True)
class PromptVariant:
    """One prompt variant (module docstring). ``text(n, caption, identifiers)`` is the text
    after the N images; ``place`` orders rows across Tables 1, 2 and 8 (Table 1 interleaves
    it with the methods' places, ``ladbench.methods``)."""

    name: str
    label: str
    text: Callable[[int, str, str], str]
    kind: str = SCORING
    methods: tuple[str, ...] = ("vanilla",)
    settings: type = NoSettings
    shifts_per_ordering: bool = False
    parse: Callable[[str, int, str], int] | None = None     # generative: the position a reply names
    sampled: bool = False          # generative: settings.samples keyed samples per row, majority vote
    prefill_hook: Callable | None = None     # (adapter, inputs, attention modules, settings) -> context
    hash_extra: Callable[[], dict] | None = None              # more identity of the cache's content
    table: str | None = None       # "table1" or "table8": where its row (column) is
    place: float = 0.0
    cost_label: str | None = None  # Table 2's pass; default: the label

    def __post_init__(self) -> None:
        if self.kind not in (SCORING, GENERATIVE):
            raise ValueError(f"variant {self.name!r}: kind must be {SCORING!r} or {GENERATIVE!r}, got {self.kind!r}")
        if self.kind == GENERATIVE and self.parse is None:
            raise ValueError(f"variant {self.name!r}: a generative variant needs parse")

    @property
    def generative(self) -> bool:
        return self.kind == GENERATIVE

    def options(self, values: Mapping[str, Any] | None = None) -> Any:
        """Its settings from ``values`` (a config block or flags; missing or None = the default)."""
        known = {f.name for f in fields(self.settings)}
        unknown = sorted(set(values or {}) - known)
        if unknown:
            raise ValueError(f"prompt variant {self.name!r} has no setting(s) {unknown}; known: {sorted(known)}")
        return self.settings(**{k: v for k, v in (values or {}).items() if v is not None})

    def hashed_settings(self, options: Any) -> dict[str, Any]:
        """The settings that change a cache's content, as ``<variant>_<field>``: part of its hash."""
        options = self.options() if options is None else options
        out = {f"{self.name}_{f.name}": getattr(options, f.name)
               for f in fields(options) if f.metadata.get("hashed", True)}
        return {**out, **(self.hash_extra() if self.hash_extra else {})}

    def samples_per_row(self, options: Any) -> int:
        return int(getattr(options, "samples", 1)) if self.sampled else 1

    def rows_per_ordering(self, n: int) -> int:
        return n if self.shifts_per_ordering else 1

    def max_generated_per_row(self, options: Any) -> int:
        """Most tokens a row generates (every reply at its length limit); 0 when scoring."""
        if not self.generative:
            return 0
        return self.samples_per_row(options) * int(options.max_new_tokens)


VARIANTS: Registry[PromptVariant] = Registry("prompt variant")


def register_variant(entry: PromptVariant) -> PromptVariant:
    """Add ``entry`` to the registry (a plugin module calls this at import)."""
    if not dataclasses.is_dataclass(entry.settings):
        raise ValueError(f"variant {entry.name!r}: settings must be a dataclass")
    return VARIANTS.register(entry.name, entry)


def variant(name: str) -> PromptVariant:
    return VARIANTS.lookup(name)


def variant_names() -> tuple[str, ...]:
    return tuple(VARIANTS)


def prompt_text(name: str, n: int, caption: str, fmt: str = "digits") -> str:
    """The text that follows the ``n`` images, for prompt variant ``name`` and identifier format."""
    return variant(name).text(n, caption, fmt)


def prompt_sha256(name: str, n: int, fmt: str) -> str:
    """Hash of the prompt template (caption left as a placeholder) for the cache metadata."""
    return hashlib.sha256(prompt_text(name, n, "{caption}", fmt).encode("utf-8")).hexdigest()


for _entry in (
    PromptVariant("vanilla", "Vanilla", prompts.answer_prompt(), methods=("vanilla", "pride", "lad"), place=1,
                  cost_label="Vanilla, PriDe, Ours (LAD) and the attention readouts (one shared pass)"),
    PromptVariant("instruction", "Instruction", prompts.answer_prompt(prompts.INSTRUCTION_SENTENCE),
                  table="table1", place=2),
    PromptVariant("sofa", "SoFA", prompts.answer_prompt(), settings=SofaSettings, prefill_hook=_sofa_masks,
                  table="table8", place=7),
    PromptVariant("permavg", "Permutation averaging", prompts.answer_prompt(), methods=("permutation_average",),
                  shifts_per_ordering=True, table="table8", place=8,
                  cost_label="Permutation averaging (N passes per row)"),
    PromptVariant("cot", "CoT", prompts.cot_prompt, kind=GENERATIVE, methods=("generated",),
                  settings=CotSettings, parse=prompts.parse_last_identifier, table="table1", place=3),
    PromptVariant("sc", "Self-Consistency", prompts.self_consistency_prompt, kind=GENERATIVE, methods=("generated",),
                  settings=ScSettings, parse=prompts.parse_answer_is, sampled=True, hash_extra=_sampler_identity,
                  table="table1", place=5),
):
    register_variant(_entry)
