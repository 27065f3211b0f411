"""``family: auto``: an image-text-to-text model of transformers 5.x with nothing stated by hand.

What a family adapter states, derived here from the model and its processor:

* **the model class**: ``AutoModelForImageTextToText`` (the architecture's own class), the
  capture function on the text decoder only;
* **the prompt**: the model's own chat template, N image entries then the text (for a
  checkpoint released without one, the file its config entry gives: ``ModelAdapter.load``'s
  ``chat_template``);
* **the processor's inputs**: each prompt's images as one list, or one flat list where the
  processor has a ``multi_page`` option (:func:`reads_lists_as_pages`), and the inputs it
  returns only when asked (``mm_token_type_ids``) where the model's forward takes them; what
  it returns that is not a tensor (Unlimited-OCR's per-image ``num_local_patches`` and
  ``patches_grid``) stays on the host and reaches the forward as it is;
* **each image's token span**: the processor's own expansion of that image's placeholder
  (``text_replacement_offsets``, mapped to tokens through the tokenizer's character offsets)
  together with what the chat template writes around the placeholder for each image (e.g.
  Qwen's ``<|vision_start|>`` / ``<|vision_end|>``), trimmed at both ends to the tokenizer's
  added tokens: tiles, row and column separators, newline features and begin / end markers
  are inside, the text between images is not. The chat template's layout per image comes
  from rendering it with 0, 1, ..., N images (:meth:`AutoAdapter.template_layout`);
* **the decoder's attention modules**: one probe forward at load time (a left-padded batch of
  two prompts with two images each) lists the text decoder's modules that dispatch through
  the capture function; it checks that every decoder layer whose KV cache holds keys is among
  them, once each, and that the capture's last row, applied to the values, reproduces the
  kernel's own output (the capture sees the kernel's mask: causal, padding, sliding windows,
  bidirectional image blocks). Hybrid decoders (linear-attention or convolution layers between
  attention layers) capture their attention layers; ``attention_layers`` says which;
* **positions**: as ``generate`` computes them, through the model's own machinery
  (``_prepare_position_ids_for_generation`` for the prefill, ``_update_model_kwargs_for_generation``
  and ``prepare_inputs_for_generation`` for the tokens after it), 1-D and multi-axis RoPE alike;
* **the end of a turn**: the added token the chat template writes after an assistant
  message, else the generation config's first end-of-sequence token.

What cannot be derived is refused with one line naming the architecture and why:
:func:`architecture_refusal` (what transformers' classes tell, and the processors known to
take one image per prompt; also used by ``ladbench models`` and the start-up checks) before
anything loads, the template and probe checks after.
"""
from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image

from .attention import AttentionProbe

from . import compat
from .base import ModelAdapter, PrefillState
from .templates import TemplateLimit

#: the text of the prompts the chat template's layout is read from (a letter: no whitespace
#: or marker of the template can be mistaken for it)
_LAYOUT_TEXT = "x"
#: largest deviation, relative to the values' scale, between the capture's last row applied to
#: the values and the kernel's output, per weight dtype (accumulation order differs)
_PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
_HALF_PRECISION_TOLERANCE = 3e-2
#: inputs a processor returns only when asked (``return_<name>=True``); auto asks where the
#: model's forward takes them
_ON_REQUEST = ("mm_token_type_ids",)


class UnsupportedModel(ValueError):
    """``family: auto`` cannot run this model; the message says why, on one line."""


def _refused(model_type: str, reason: str) -> UnsupportedModel:
    return UnsupportedModel(f"family auto cannot run architecture {model_type!r}: {reason}")


#: Architectures whose processor is known to take one image per prompt, and how (refused by name
#: before anything loads; another such processor is refused at load, when it expands one image
#: placeholder of several)
ONE_IMAGE_PROCESSORS = {
    "shieldgemma2": "ShieldGemma2Processor classifies at most one image per sample",
    "kosmos-2.5": "Kosmos2_5Processor, named by its checkpoints, writes one image's 2,048 tokens before the text "
                  "itself, with no placeholder to expand; a chat template in the config would not change that",
}


def one_image_per_prompt(how: str) -> str:
    """The refusal of a processor that takes one image per prompt (``how``: what shows it)."""
    return f"its processor takes one image per prompt ({how}); the benchmark shows N images in one prompt"


@lru_cache(maxsize=None)
def architecture_refusal(model_type: str) -> str | None:
    """Why ``family: auto`` refuses ``model_type`` from what transformers' classes alone tell
    (no weights, no files), or None: not in the image-text-to-text mapping, a processor known to
    take one image per prompt (:data:`ONE_IMAGE_PROCESSORS`), an encoder-decoder, images through
    cross-attention, a processor class that does not report which tokens each image becomes. (Whether the
    decoder's attention dispatches through ``AttentionInterface``, and which processor a
    checkpoint without a mapped one uses, only loading tells.)"""
    import transformers
    from transformers import ProcessorMixin
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    class_name = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(model_type)
    if class_name is None:
        return f"not an image-text-to-text architecture of transformers {transformers.__version__}"
    model_class = getattr(transformers, class_name, None)
    if model_class is None:
        return f"transformers {transformers.__version__} does not export {class_name}"
    if model_type in ONE_IMAGE_PROCESSORS:
        return one_image_per_prompt(ONE_IMAGE_PROCESSORS[model_type])
    try:
        defaults = CONFIG_MAPPING[model_type]()
    except Exception:                      # noqa: BLE001 (a config without defaults: decided when the model loads)
        defaults = None
    if defaults is not None and defaults.is_encoder_decoder:
        return "an encoder-decoder model; the capture reads a decoder-only prompt"
    if defaults is not None and getattr(defaults.get_text_config(), "cross_attention_layers", None):
        return ("images enter the decoder through cross-attention layers, not as tokens of the prompt: there is no "
                "image span for the last token's attention to fall on")
    processor_class = getattr(transformers, PROCESSOR_MAPPING_NAMES.get(model_type) or "", None)
    if processor_class is not None and processor_class.replace_image_token is ProcessorMixin.replace_image_token:
        return (f"its processor ({processor_class.__name__}) does not report which tokens each image becomes "
                "(no replace_image_token)")
    return None


class AutoAdapter(ModelAdapter):
    """Any architecture of transformers' image-text-to-text mapping that passes the checks above."""

    #: each prompt's images as one list (the processor's multi-image mode), unless the processor
    #: reads a nested list as the pages of one document (:func:`reads_lists_as_pages`)
    nested_images = True

    # ----------------------------------------------------------------- loading
    @classmethod
    def refuse_before_loading(cls, model_path: str, *, revision: str | None, trust_remote_code: bool) -> None:
        """Architectures auto cannot run (one line), before anything loads."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path, revision=revision, trust_remote_code=trust_remote_code)
        reason = architecture_refusal(config.model_type)
        if reason:
            raise _refused(config.model_type, reason)

    @classmethod
    def _load_model(cls, model_path: str, *, text_impl: str, trust_remote_code: bool, **kw: Any) -> torch.nn.Module:
        from transformers import AutoConfig, AutoModelForImageTextToText

        config = AutoConfig.from_pretrained(model_path, revision=kw.get("revision"), trust_remote_code=trust_remote_code)
        return AutoModelForImageTextToText.from_pretrained(
            model_path, config=config, trust_remote_code=trust_remote_code,
            attn_implementation=cls.attention_choice(config, text_impl), **kw)

    @staticmethod
    def attention_choice(config: Any, text_impl: str) -> str | dict[str, str]:
        """``attn_implementation``: ``text_impl`` on the text decoder's sub-config, the default
        (SDPA) elsewhere; eager everywhere for the reference path."""
        if text_impl == "eager":
            return "eager"
        text = config.get_text_config()
        key = next((k for k in config.sub_configs if getattr(config, k, None) is text), None)
        return {key: text_impl} if key else text_impl

    def __init__(self, model: torch.nn.Module, processor: Any, **kwargs: Any) -> None:
        super().__init__(model, processor, **kwargs)
        self.nested_images = not reads_lists_as_pages(processor)
        self.placeholder = text_placeholder(processor)
        if not isinstance(self.placeholder, str):
            raise self.refused("its processor names no image placeholder token (processor.image_token)")
        if not getattr(processor, "chat_template", None):
            raise self.refused(f"{self.model_path} has no chat template, and the prompt is laid out by the model's own "
                               "(for a checkpoint released without one, give one: models.<name>.chat_template)")
        self._added_ids = np.array(sorted(self.tokenizer.added_tokens_decoder), dtype=np.int64)
        forward = inspect.signature(model.forward).parameters
        self._position_ids_accepted = "position_ids" in forward
        #: inputs the model's forward takes that its processor returns only when asked (Cosmos3-Edge's
        #: ``mm_token_type_ids``, which its M-RoPE positions read)
        self._asked = {f"return_{name}": True for name in _ON_REQUEST if name in forward}
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}
        self._layouts: dict[int, list[tuple[int, int]]] = {}
        decoder_layers = self.decoder_layers()
        if len(decoder_layers) != self.text_config.num_hidden_layers:
            raise self.refused(f"its text decoder has {len(decoder_layers)} layers but its text config says "
                               f"{self.text_config.num_hidden_layers}")
        #: the decoder layers with self-attention, in order (all of them unless the decoder is hybrid)
        self.attention_layers: list[int] = []
        self._attention_modules: list[torch.nn.Module] = []
        self._windows: list[int] = []
        if self.attention == "capture":
            self._find_attention_modules()

    @property
    def model_type(self) -> str:
        return self.model.config.model_type

    def refused(self, reason: str) -> UnsupportedModel:
        return _refused(self.model_type, reason)

    # ------------------------------------------------------------------ tokens
    def resolve_tokens(self) -> None:
        config = self.model.config
        image_token_id = getattr(config, "image_token_id", None)
        if image_token_id is None:
            image_token_id = getattr(config, "image_token_index", None)
        self.image_token_id = int(image_token_id) if image_token_id is not None else None
        self.image_start_id = self.image_end_id = None
        self.end_of_turn_id = self._template_end_of_turn()

    def _template_end_of_turn(self) -> int:
        """The added token the chat template writes right after an assistant message (whitespace
        skipped), else the generation config's first end-of-sequence token."""
        sentinel = "Zq"
        messages = [{"role": "user", "content": [{"type": "text", "text": _LAYOUT_TEXT}]},
                    {"role": "assistant", "content": [{"type": "text", "text": sentinel}]}]
        with self.template_errors():
            try:
                text = self.processor.apply_chat_template(messages, tokenize=False)
            except TemplateLimit:
                raise                      # past its bounds: rendering it again would only wait again
            except Exception:              # noqa: BLE001 (a template that refuses this conversation: no reading)
                text = ""
        after = text.rpartition(sentinel)[2] if sentinel in text else ""
        added = set(self.tokenizer.added_tokens_decoder)
        for tid in self.tokenizer(after, add_special_tokens=False)["input_ids"]:
            if self.tokenizer.decode([tid]).strip():
                if tid in added:
                    return int(tid)
                break
        eos = self.model.generation_config.eos_token_id
        eos = eos if eos is not None else self.tokenizer.eos_token_id
        if eos is None:
            raise self.refused("neither its chat template nor its generation config says where a turn ends")
        return int(eos[0] if isinstance(eos, (list, tuple)) else eos)

    # --------------------------------------------------------------- structure
    def decoder_layers(self) -> Sequence[torch.nn.Module]:
        layers = getattr(self.model.get_decoder(), "layers", None)
        if not isinstance(layers, torch.nn.ModuleList):
            raise self.refused("its text decoder has no list of layers (decoder.layers)")
        return list(layers)

    def attention_modules(self) -> list[torch.nn.Module]:
        if self.attention != "capture":
            raise RuntimeError("the attention modules of family auto are found through the capture: load the model "
                               "with attention='capture'")
        return list(self._attention_modules)

    def _find_attention_modules(self) -> None:
        """The probe (module docstring): which modules of the text decoder dispatch through the
        capture, in which decoder layer, and does the capture see what the kernel sees."""
        rng = np.random.default_rng(0)
        images = [[Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)) for _ in range(2)]
                  for _ in range(2)]
        texts = [self.chat_text(prompt, 2) for prompt in ("Which image?", "Which of the two images shows it best?")]
        inputs, _ = self.encode_with_spans(texts, images, for_prefill=True)
        layer_of = {module: i for i, layer in enumerate(self.decoder_layers()) for module in layer.modules()}
        with AttentionProbe(self.model.get_decoder().modules()) as probe:
            _, state = self.prefill(self.to_device(inputs, for_prefill=True), use_cache=True)
        if not probe.calls:
            raise self.refused("its decoder's attention does not dispatch through transformers' AttentionInterface")
        tolerance = _PROBE_TOLERANCE.get(self.model.dtype, _HALF_PRECISION_TOLERANCE)
        modules: dict[int, torch.nn.Module] = {}
        for module, deviation, unmodelled in probe.calls:
            layer = layer_of.get(module)
            if layer is None:
                raise self.refused(f"a {type(module).__name__} outside the decoder layers dispatches through the capture")
            if layer in modules:
                raise self.refused(f"decoder layer {layer} makes more than one attention call per forward pass")
            if unmodelled:
                raise self.refused(f"decoder layer {layer}'s attention uses {', '.join(unmodelled)}, which the capture "
                                   "does not model")
            if deviation > tolerance:
                raise self.refused(f"decoder layer {layer}: the captured attention does not reproduce the kernel's "
                                   f"output (deviation {deviation:.2g}); the kernel sees something the capture does not")
            modules[layer] = module
        cached = _layers_holding_keys(state.past_key_values)
        missing = sorted(set(cached) - set(modules))
        if missing:
            raise self.refused(f"decoder layers {missing} keep keys in the KV cache but their attention does not go "
                               "through the capture")
        self.attention_layers = sorted(modules)
        self._attention_modules = [modules[i] for i in self.attention_layers]
        self._windows = [probe.windows[module] for module in self._attention_modules]

    def attention_windows(self) -> list[int]:
        """The sliding window each captured layer's kernel got in the probe forward (0: none)."""
        return list(self._windows)

    # ------------------------------------------------------------------ inputs
    def template_layout(self, n_images: int) -> list[tuple[int, int]]:
        """Per image k of a prompt of ``n_images``: how many characters the chat template writes
        before and after that image's placeholder for that image alone (its chunk), read by
        rendering the template with 0, 1, ..., ``n_images`` images."""
        if n_images not in self._layouts:
            renders = [self.chat_text(_LAYOUT_TEXT, k) for k in range(n_images + 1)]
            regions = [_difference(render, renders[0]) for render in renders]
            layout = []
            for k in range(1, n_images + 1):
                if not regions[k].startswith(regions[k - 1]):
                    raise self.refused("its chat template does not write images one after another")
                chunk = regions[k][len(regions[k - 1]):]
                if chunk.count(self.placeholder) != 1:
                    raise self.refused(f"its chat template writes image {k} as {chunk!r}, not with one "
                                       f"{self.placeholder!r}")
                before = chunk.index(self.placeholder)
                layout.append((before, len(chunk) - before - len(self.placeholder)))
            self._layouts[n_images] = layout
        return self._layouts[n_images]

    def encode_on_host(self, texts: Sequence[str], images: Sequence[Sequence[Image.Image]], *,
                       for_prefill: bool = False) -> dict[str, torch.Tensor]:
        return self.encode_with_spans(texts, images, for_prefill=for_prefill)[0]

    def encode_with_spans(self, texts: Sequence[str], images: Sequence[Sequence[Image.Image]], *,
                          for_prefill: bool = False) -> tuple[dict[str, torch.Tensor], list[list[tuple[int, int]]]]:
        """The processor's inputs (left padded) and each row's image spans (module docstring)."""
        inputs = self.processor(text=list(texts), images=self.processor_images(images), return_tensors="pt",
                                padding=True, padding_side="left", return_text_replacement_offsets=True,
                                return_offsets_mapping=True, **self._asked)
        replacements = inputs.pop("text_replacement_offsets", None)
        offsets = inputs.pop("offset_mapping", None)
        if not replacements or offsets is None:
            raise self.refused("its processor does not report each image's token expansion (text_replacement_offsets)")
        # every floating-point tensor in the weights' dtype, as ``BatchFeature.to(device, dtype)`` casts them
        # (Unlimited-OCR's pixel_values_local too), here: half the copy
        out = {k: v.to(self.model.dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
               for k, v in inputs.items()}
        ids = out["input_ids"].numpy()
        spans = [self._row_spans(ids[b], offsets[b].numpy(), [r for r in replacements[b] if r["type"] == "image"],
                                 len(images[b])) for b in range(len(texts))]
        if for_prefill:
            out.update(self.prefill_extras(out))
        return out, spans

    def _row_spans(self, ids: np.ndarray, offsets: np.ndarray, replaced: list[dict],
                   n_images: int) -> list[tuple[int, int]]:
        if len(replaced) == 1 < n_images:
            raise self.refused(one_image_per_prompt(f"it expanded 1 of the {n_images} image placeholders"))
        if len(replaced) != n_images:
            raise self.refused(f"its processor replaced {len(replaced)} image placeholders in a prompt of {n_images} images")
        real = offsets[:, 1] > offsets[:, 0]
        layout = self.template_layout(n_images)
        spans = []
        for (before, after), replacement in zip(layout, replaced):
            start, end = replacement["new_span"]
            chunk = np.flatnonzero(real & (offsets[:, 0] < end + after) & (offsets[:, 1] > start - before))
            marked = chunk[np.isin(ids[chunk], self._added_ids)]
            if not len(marked):
                raise self.refused("an image's tokens hold no token of the tokenizer's added vocabulary")
            spans.append((int(marked[0]), int(marked[-1]) + 1))
        self._check_spans(ids, spans)
        return spans

    def _check_spans(self, ids: np.ndarray, spans: list[tuple[int, int]]) -> None:
        """Spans in prompt order, disjoint, each with image features, and every feature token in one."""
        for (start, end), (next_start, _) in zip(spans, spans[1:]):
            if end > next_start:
                raise self.refused(f"the token spans of two images overlap ({start}:{end} and {next_start}:...)")
        if self.image_token_id is None:
            return
        inside = sum(int((ids[start:end] == self.image_token_id).sum()) for start, end in spans)
        if inside != int((ids == self.image_token_id).sum()) or any(
                not (ids[start:end] == self.image_token_id).any() for start, end in spans):
            raise self.refused("its image feature tokens do not fall one image's run each into the image spans")

    def image_spans(self, input_ids: Sequence[int]) -> list[tuple[int, int]]:
        raise NotImplementedError("family auto reads image spans from the processor: use encode_with_spans")

    # ----------------------------------------------------------------- forward
    def prefill_extras(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The prefill's position ids, as ``generate`` computes them (on the host)."""
        if not self._position_ids_accepted:
            return {}
        return {"position_ids": self.model._prepare_position_ids_for_generation(inputs["input_ids"], dict(inputs))}

    @torch.no_grad()
    def prefill(self, inputs: dict[str, torch.Tensor], *, use_cache: bool) -> tuple[torch.Tensor, PrefillState]:
        kwargs = dict(inputs)
        if self._position_ids_accepted and "position_ids" not in kwargs:
            kwargs.update(self.prefill_extras(kwargs))
        ids = kwargs.pop("input_ids")
        model_inputs = self.model.prepare_inputs_for_generation(ids, is_first_iteration=True, use_cache=use_cache,
                                                                **self._last_logits_only, **kwargs)
        out = self.model(**model_inputs, return_dict=True)
        state = PrefillState(past_key_values=out.past_key_values if use_cache else None,
                             attention_mask=inputs["attention_mask"], position_offset=None,
                             seq_len=int(ids.shape[1]), model_kwargs={"input_ids": ids, **kwargs})
        return out.logits[:, -1].float(), state

    @torch.no_grad()
    def continue_logits(self, state: PrefillState, new_tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        if state.past_key_values is None:
            raise ValueError("continue_logits needs a prefill run with use_cache=True")
        kwargs = dict(state.model_kwargs)
        prompt = kwargs.pop("input_ids")
        if isinstance(new_tokens, torch.Tensor):
            new = new_tokens.to(device=prompt.device, dtype=torch.long)
        else:
            new = torch.tensor([list(new_tokens)] * prompt.shape[0], dtype=torch.long, device=prompt.device)
        from transformers.modeling_outputs import CausalLMOutputWithPast
        kwargs = self.model._update_model_kwargs_for_generation(
            CausalLMOutputWithPast(past_key_values=state.past_key_values), kwargs, num_new_tokens=new.shape[1])
        model_inputs = self.model.prepare_inputs_for_generation(torch.cat([prompt, new], 1),
                                                                next_sequence_length=new.shape[1], use_cache=True,
                                                                **self._last_logits_only, **kwargs)
        with compat.cache_rollback(state.past_key_values, state.seq_len):
            return self.model(**model_inputs, return_dict=True).logits[:, -1].float()

    def decode_positions(self, state: PrefillState) -> torch.Tensor | None:
        """The prefill's last position ids (as ``generate`` computed them: 1-D or multi-axis)
        plus one; None where the model takes no position ids (it counts from the cache)."""
        pos = state.model_kwargs.get("position_ids")
        return None if pos is None else pos[..., -1:] + 1

    @torch.no_grad()
    def decode_logits(self, cache: Any, ids: torch.Tensor, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor | None) -> torch.Tensor:
        kwargs = {} if position_ids is None else {"position_ids": position_ids}
        out = self.model(input_ids=ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True,
                         return_dict=True, **self._last_logits_only, **kwargs)
        return out.logits[:, -1].float()


def text_placeholder(processor: Any) -> str | None:
    """What the chat template writes for one image and the processor expands: the processor's
    ``image_placeholder_token`` where it names one apart from the feature token it expands
    into (Qianfan-OCR: ``<image>`` -> ``<img><IMG_CONTEXT>*k</img>``), else ``image_token``."""
    separate = getattr(processor, "image_placeholder_token", None)
    return separate if isinstance(separate, str) else getattr(processor, "image_token", None)


def reads_lists_as_pages(processor: Any) -> bool:
    """Whether the processor has a ``multi_page`` option (GOT-OCR2): it then reads a prompt's
    list of images as the pages of one document, expanded together for one placeholder, and
    gives each image its own expansion only when the images come as one flat list."""
    return "multi_page" in getattr(getattr(processor, "valid_processor_kwargs", None), "__annotations__", {})


def _difference(text: str, base: str) -> str:
    """What ``text`` adds to ``base``: ``text`` without their longest common prefix and then
    their longest common suffix (of what is left)."""
    prefix = 0
    while prefix < min(len(text), len(base)) and text[prefix] == base[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(text), len(base)) - prefix and text[-1 - suffix] == base[-1 - suffix]:
        suffix += 1
    return text[prefix:len(text) - suffix]


def _layers_holding_keys(cache: Any) -> list[int]:
    """Indices of the cache's layers that hold attention keys (none for a cache without layers)."""
    layers = getattr(cache, "layers", None) or []
    return [i for i, layer in enumerate(layers) if isinstance(getattr(layer, "keys", None), torch.Tensor)
            and layer.keys.numel() > 0]
