"""What every model adapter provides, and the code the families share.

An adapter is the ONLY place that knows a model family: how to load it, how its chat
template lays out images and text, which marker tokens delimit an image's token span
(METHOD §3), where its decoder self-attention modules live, and how positions continue
after a prefill (for KV-cache continuation steps). Everything downstream (attention
capture, candidate scoring, the cache) talks to models through this interface only.

The hand-written families use a ChatML-style template (``<|im_start|>`` /
``<|im_end|>``), take images through their own processor, and expose a base model
(``model.model``) whose output is the last hidden state, plus an ``lm_head``. Family
``auto`` (``models/auto.py``) derives all of this from the model and its processor instead.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Sequence

import torch
from PIL import Image

from ladbench.families import DEVICE_PATTERN, VISION_TOWERS, family_lanes
from .attention import CAPTURE_ATTENTION, register_capture_attention, route_own_sdpa, sdpa_kernel_mask

from . import compat, kernels, rotary
from .folder import chat_template_file, check_model_folder
from .templates import bounded_template
from .vision import compiled_towers

log = logging.getLogger(__name__)


def not_full_attention(text_config: Any) -> str | None:
    """Why not every decoder layer attends to the whole sequence (None: every one does): other
    layer kinds (sliding windows, linear attention), or a sliding window for all."""
    kinds = sorted(set(getattr(text_config, "layer_types", None) or ["full_attention"]) - {"full_attention"})
    if kinds:
        return f"its decoder has {', '.join(kinds)} layers"
    if getattr(text_config, "use_sliding_window", False):
        return "its text config sets use_sliding_window"
    return None


#: the host's word on whether a prefill batch has padding (``encode_on_host(for_prefill=True)``),
#: so that the masks its kernels get are decided without reading the padding mask back
PADDED_KEY = "ladbench_padded"
#: a prefill input: the image tokens' flat positions in the batch, found on the host
#: (:func:`image_token_index`), where the prefill puts the image features (``placed_image_features``)
IMAGE_TOKEN_INDEX = "ladbench_image_token_index"


def without_host_decisions(inputs: dict[str, Any]) -> dict[str, Any]:
    """A prefill's inputs without what the host decided (``PADDED_KEY``, ``IMAGE_TOKEN_INDEX``):
    transformers' forward then decides both itself, reading them back from the device."""
    return {k: v for k, v in inputs.items() if k not in (PADDED_KEY, IMAGE_TOKEN_INDEX)}


def image_token_index(input_ids: torch.Tensor, image_token_id: int, features: int) -> torch.Tensor:
    """The flat positions [B * T] of the image tokens of a batch's ``input_ids`` (on the host), in
    order: where ``masked_scatter`` would put the image features, one token each. As many as the
    ``features`` the images give, else transformers' error (which it checks by a read-back)."""
    index = (input_ids.flatten() == image_token_id).nonzero().squeeze(1)
    if len(index) != features:
        raise ValueError(f"Image features and image tokens do not match: tokens: {len(index)}, features {features}")
    return index


@dataclass
class PrefillState:
    """What a prefill pass leaves behind for continuation steps.

    ``past_key_values`` is the model's KV cache (None when not requested);
    ``attention_mask`` the 2-D padding mask [B, T]; ``position_offset`` a family-specific
    tensor needed to continue positions (Qwen2.5-VL: its M-RoPE ``rope_deltas`` [B, 1];
    1-D RoPE families: the last real position per row [B, 1]); ``model_kwargs`` what
    ``generate`` keeps between its steps (family auto: the prompt's ids and model inputs).
    """

    past_key_values: Any
    attention_mask: torch.Tensor
    position_offset: torch.Tensor | None
    seq_len: int
    model_kwargs: dict[str, Any] | None = None
    #: whether any row of the batch is padded, known on the host (``PADDED_KEY``); None: unknown
    padded: bool | None = None


def resolve_device(device: str) -> str:
    """Map ``auto`` to ``cuda`` when a GPU is visible, else ``cpu``; validate the rest."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(DEVICE_PATTERN, device):
        raise ValueError(f"--device must be auto, cpu or cuda[:i]; got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device!r} asked for, but torch sees no CUDA device")
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """``auto`` is bfloat16 on GPU (what the paper's models were released in) and float32 on CPU."""
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in table:
        raise ValueError(f"--dtype must be one of auto, {', '.join(table)}; got {dtype!r}")
    return table[dtype]


def resize_square(image: Image.Image, size: int) -> Image.Image:
    """Resize to ``size`` x ``size`` with bicubic filtering, as the reference does before the processor."""
    return image.convert("RGB").resize((size, size), Image.BICUBIC)


class ModelAdapter:
    """Base class: one subclass per model family (see the module docstring)."""

    #: the family's name, its key in ``ladbench.families.FAMILY_REGISTRY`` (set by ``ladbench.models``)
    family: ClassVar[str] = ""
    #: the transformers class a native family loads with (remote-code families override _load_model)
    model_class: ClassVar[str] = ""
    #: marker tokens that open / close one image's token span (inclusive, METHOD §3)
    image_start_token: ClassVar[str] = ""
    image_end_token: ClassVar[str] = ""
    #: the placeholder token the vision features are scattered into
    image_token: ClassVar[str] = ""
    #: token that ends an assistant turn; the "EOS" of the restricted normalisation
    end_of_turn_token: ClassVar[str] = "<|im_end|>"
    #: keys the processor returns that this family's base model does not accept
    drop_input_keys: ClassVar[tuple[str, ...]] = ()
    #: the processor takes each prompt's images as one list (it treats several images per
    #: prompt differently from one); otherwise one flat list in prompt order
    nested_images: ClassVar[bool] = False
    #: the text decoder's attention modules pick their kernel from a table of their own (a
    #: decoder shipped with the checkpoint) instead of transformers' ``AttentionInterface``, so
    #: the capture's name means nothing to them: the capture loads them with SDPA and routes
    #: their own call of torch's SDPA through it (``attention.route_own_sdpa``)
    own_attention_table: ClassVar[bool] = False

    def __init__(self, model: torch.nn.Module, processor: Any, *, model_path: str,
                 revision: str | None = None, attention: str = "sdpa", vision: str = "batched",
                 template_source: str | None = None) -> None:
        if vision not in VISION_TOWERS:
            raise ValueError(f"vision tower must be one of {', '.join(VISION_TOWERS)}; got {vision!r}")
        self.model = model
        self.processor = processor
        self.model_path = model_path
        self.revision = revision
        #: where the chat template came from: a file the config gave, else the model's folder
        self.template_source = template_source or chat_template_file(model_path)
        self.attention = attention
        native_only = self._native_tower_only(attention)
        self.vision = "native" if native_only else vision
        #: input keys kept on the host by ``to_device`` (read on the host by our code, never by a kernel)
        self.host_input_keys: tuple[str, ...] = ()
        if self.vision != "native":
            self.host_input_keys = self.use_batched_vision()
        if vision == "compiled" and not compiled_towers(model):
            log.warning("vision tower 'compiled': nothing of this %s model is compiled (%s); its tower runs uncompiled",
                        self.family, native_only or "only Qwen2.5-VL-style towers run batched")
        #: patch embeddings run as a matrix product on a GPU (models/kernels.py); the eager path stays the reference's
        self.linear_patch_embeddings = kernels.use_linear_patch_embedding(model) if attention != "eager" else 0
        #: gated MLPs of an unaligned hidden width, padded on a GPU (models/kernels.py); likewise
        self.padded_mlps = kernels.pad_unaligned_mlps(model) if attention != "eager" else 0
        #: RMSNorms normalised by torch's fused kernel on a GPU (models/kernels.py); likewise
        self.fused_norms = kernels.use_fused_rms_norms(model) if attention != "eager" else 0
        #: the family's rewrites that give the model's very bits with fewer operations (every device)
        self.exact_rewrites_made = self.exact_rewrites() if attention != "eager" else 0
        if attention == "capture" and self.own_attention_table:
            route_own_sdpa(self.attention_modules())
        self.resolve_tokens()
        tok = self.tokenizer
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else self.end_of_turn_id

    @staticmethod
    def _native_tower_only(attention: str) -> str | None:
        """Why the vision tower must run as transformers ships it whatever was asked, or None:
        the eager path stays the reference's, for comparisons, and the current lane always runs
        transformers' tower (``compat.batched_vision_supported``)."""
        if attention == "eager":
            return "the eager reference runs transformers' tower"
        if not compat.batched_vision_supported():
            return "the current lane runs transformers' tower"
        return None

    def resolve_tokens(self) -> None:
        """Set the ids of the family's tokens (``image_start_id``, ``image_end_id``,
        ``image_token_id``: the placeholder the vision features go to, ``end_of_turn_id``)."""
        self.image_start_id = self._token_id(self.image_start_token)
        self.image_end_id = self._token_id(self.image_end_token)
        self.image_token_id = self._token_id(self.image_token)
        self.end_of_turn_id = self._token_id(self.end_of_turn_token)

    # ---------------------------------------------------------------- loading
    @classmethod
    def load(cls, model_path: str, *, revision: str | None = None, dtype: str = "auto",
             device: str = "auto", trust_remote_code: bool = False,
             attention: str = "capture", vision: str = "batched",
             chat_template: str | None = None) -> "ModelAdapter":
        """Load model + processor from a hub id or a local folder (same code path for both).

        ``attention`` is ``capture`` (fast kernel with last-row capture, the default),
        ``sdpa`` (plain fast kernel, no capture: for timing baselines) or ``eager``
        (the reference path, ``output_attentions`` works). ``vision`` is ``batched`` (our
        batched vision tower where the family has one, see ``models/vision.py``) or ``native``
        (transformers' own; always on the eager path). On GPU the weights are placed with
        ``device_map="auto"``; on CPU everything is float32 unless told otherwise.
        ``chat_template``: a Jinja file with the chat template of a checkpoint released without
        one (the config's ``models.<name>.chat_template``), used only when the processor has none.
        """
        compat.require_lane(cls.family, family_lanes(cls.family))
        check_model_folder(model_path)          # damaged or hostile files: one line naming the file
        cls.refuse_before_loading(model_path, revision=revision, trust_remote_code=trust_remote_code)
        dev = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, dev)
        text_impl = {"capture": CAPTURE_ATTENTION, "sdpa": "sdpa", "eager": "eager"}.get(attention)
        if text_impl is None:
            raise ValueError(f"attention must be capture, sdpa or eager; got {attention!r}")
        if text_impl == CAPTURE_ATTENTION:
            register_capture_attention()
        load_kw: dict[str, Any] = {**compat.dtype_kwarg(torch_dtype), "revision": revision}
        if dev.startswith("cuda"):
            load_kw["device_map"] = "auto" if dev == "cuda" else dev
        processor = cls._load_processor(model_path, revision=revision, trust_remote_code=trust_remote_code)
        template_file = None
        if chat_template and not getattr(processor, "chat_template", None):
            processor.chat_template, template_file = read_chat_template(chat_template), chat_template
        load_impl = "sdpa" if text_impl == CAPTURE_ATTENTION and cls.own_attention_table else text_impl
        model = cls._load_model(model_path, text_impl=load_impl, trust_remote_code=trust_remote_code, **load_kw)
        model.eval()
        if not dev.startswith("cuda"):
            model.to(dev)
        return cls(model, processor, model_path=model_path, revision=revision, attention=attention, vision=vision,
                   template_source=template_file)

    @classmethod
    def refuse_before_loading(cls, model_path: str, *, revision: str | None, trust_remote_code: bool) -> None:
        """Family hook: refuse, in one line, a model the family cannot run before anything loads."""

    @classmethod
    def _load_processor(cls, model_path: str, *, revision: str | None, trust_remote_code: bool) -> Any:
        from transformers import AutoProcessor, ProcessorMixin
        # trust_remote_code is always passed explicitly: with None, transformers may ask on stdin
        processor = AutoProcessor.from_pretrained(model_path, revision=revision,
                                                  trust_remote_code=trust_remote_code)
        if not isinstance(processor, ProcessorMixin):
            # AutoProcessor silently falls back to the bare tokenizer when it cannot find a processor
            raise ValueError(f"{model_path}: AutoProcessor returned {type(processor).__name__}, not a "
                             "multimodal processor (is processor_config.json / preprocessor_config.json there?)")
        return processor

    @classmethod
    def _load_model(cls, model_path: str, *, text_impl: str, trust_remote_code: bool, **kw: Any) -> torch.nn.Module:
        """Load through the family's native transformers class (``model_class``)."""
        import transformers

        model_class = getattr(transformers, cls.model_class)
        return model_class.from_pretrained(model_path, attn_implementation=cls.attn_implementation(text_impl), **kw)

    @staticmethod
    def attn_implementation(text_impl: str) -> dict[str, str]:
        """Per-sub-config attention choice: the capture function only on the text decoder."""
        return {"text_config": text_impl, "vision_config": "sdpa" if text_impl != "eager" else "eager"}

    # ------------------------------------------------------------- properties
    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def text_config(self) -> Any:
        return self.model.config.get_text_config()

    @property
    def n_layers(self) -> int:
        return len(self.attention_modules())

    @property
    def n_heads(self) -> int:
        return int(self.text_config.num_attention_heads)

    def _token_id(self, token: str) -> int:
        tid = self.tokenizer.convert_tokens_to_ids(token)
        if tid is None or tid == self.tokenizer.unk_token_id:
            raise ValueError(f"{self.model_path}: the tokenizer has no token {token!r}, which the "
                             f"{self.family} adapter needs")
        return int(tid)

    # -------------------------------------------------------------- structure
    def decoder_layers(self) -> Sequence[torch.nn.Module]:
        """The text decoder layers, in order (layer index = position in this list)."""
        return list(self.model.model.language_model.layers)

    def attention_modules(self) -> list[torch.nn.Module]:
        """The self-attention module of every text decoder layer."""
        return [layer.self_attn for layer in self.decoder_layers()]

    def attention_windows(self) -> list[int]:
        """The sliding window of each captured layer's attention (0: none, the whole prompt;
        ladbench.windows): the modules' own ``sliding_window``, what they pass their kernel."""
        return [int(getattr(module, "sliding_window", None) or 0) for module in self.attention_modules()]

    @property
    def takes_kernel_mask(self) -> bool:
        """Whether the prefill and its continuations may hand the decoder the mask its kernel gets
        (:func:`~.attention.sdpa_kernel_mask`) instead of the 2-D padding mask: SDPA kernels (eager
        adds the mask as numbers) on full-attention layers only (a sliding window's, a
        linear-attention layer's mask is not the padding), of a decoder of transformers' own, whose
        masking takes a 4-D mask as it is (one shipped with a checkpoint may read it otherwise)."""
        return (self.attention != "eager" and not_full_attention(self.text_config) is None
                and type(self.attention_modules()[0]).__module__.startswith("transformers.models."))

    def kernel_mask(self, mask: torch.Tensor, n_queries: int, padded: bool | None) -> torch.Tensor | None:
        """The attention mask to hand the decoder for the last ``n_queries`` positions of ``mask``
        [B, K]. Given the 2-D mask, transformers reads it back to see whether it can drop it
        (``padding_mask.all()``: on a GPU the host then waits for everything queued before, the
        whole vision tower in a prefill); where the host knows ``padded`` it is decided here, equal
        to what transformers would build. Unknown, or not :attr:`takes_kernel_mask`: the 2-D mask."""
        if padded is None or not self.takes_kernel_mask:
            return mask
        return sdpa_kernel_mask(mask, n_queries, padded)

    def apply_settings(self, settings: Any) -> None:
        """Family hook: take up the inference settings (``InferenceSettings``) that concern this
        family alone, such as LLaVA-OV-1.5's ``rice_features``. Default: none."""

    def exact_rewrites(self) -> int:
        """Family hook: rewrite parts of the model's computation that transformers repeats (the
        same values computed in every layer) so that they run once, giving the very same bits on
        every device; returns how many were made. Default: none."""
        return 0

    def use_batched_vision(self) -> tuple[str, ...]:
        """Family hook: switch the vision tower to a batched implementation if the family has one
        (its blocks compiled where :attr:`vision` is ``compiled``); returns the input keys that
        should then stay on the host. Default: native tower."""
        return ()

    # ----------------------------------------------------------------- inputs
    def chat_text(self, prompt: str, n_images: int) -> str:
        """The full prompt string: ``n_images`` images first, then ``prompt``, through the
        model's own chat template with the generation prompt added (METHOD §1)."""
        messages = [{"role": "user", "content": [{"type": "image"} for _ in range(n_images)]
                     + [{"type": "text", "text": prompt}]}]
        with self.template_errors():
            return self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    @contextlib.contextmanager
    def template_errors(self) -> Iterator[None]:
        """A chat template that raises, leaves its sandbox, recurses or goes past its bounds
        (models/templates.py): one line naming the file it came from. Every render goes through
        here, so the bounds are in place in whichever process renders (DataLoader workers too)."""
        import jinja2
        compat.bound_chat_templates(bounded_template)
        try:
            yield
        except (jinja2.TemplateError, RecursionError, MemoryError) as exc:
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise ValueError(f"{self.template_source}: the model's chat template failed "
                             f"({reason}); use the model's original chat template") from None

    def encode(self, texts: Sequence[str], images: Sequence[Sequence[Image.Image]]) -> dict[str, torch.Tensor]:
        """Tokenise a batch of prompts with their images (flat, in prompt order), left padded, on the device."""
        return self.to_device(self.encode_on_host(texts, images))

    def processor_images(self, images: Sequence[Sequence[Image.Image]]) -> list:
        """A batch's images as the processor takes them: each prompt's as one list
        (``nested_images``), else one flat list in prompt order."""
        return [list(row) for row in images] if self.nested_images else [im for row in images for im in row]

    def encode_on_host(self, texts: Sequence[str], images: Sequence[Sequence[Image.Image]], *,
                       for_prefill: bool = False) -> dict[str, torch.Tensor]:
        """``encode`` without the move to the device (CPU work only: runs in DataLoader workers).
        ``for_prefill`` adds what ``prefill`` would otherwise compute itself (``prefill_extras``)."""
        inputs = self.processor(text=list(texts), images=self.processor_images(images), return_tensors="pt",
                                padding=True, padding_side="left")
        out = {k: v for k, v in inputs.items() if k not in self.drop_input_keys}
        if "pixel_values" in out and out["pixel_values"].is_floating_point():
            out["pixel_values"] = out["pixel_values"].to(self.model.dtype)       # cast here: half the copy
        if for_prefill:
            out.update(self.prefill_extras(out))
            out[PADDED_KEY] = bool((out["attention_mask"] == 0).any())     # on the host: free
            features = self.image_feature_count(out) if "pixel_values" in out else None
            if features is not None:
                out[IMAGE_TOKEN_INDEX] = image_token_index(out["input_ids"], self.image_token_id, features)
        return out

    def encode_with_spans(self, texts: Sequence[str], images: Sequence[Sequence[Image.Image]], *,
                          for_prefill: bool = False) -> tuple[dict[str, torch.Tensor], list[list[tuple[int, int]]]]:
        """``encode_on_host`` and each row's image spans (:meth:`image_spans`, in padded positions)."""
        inputs = self.encode_on_host(texts, images, for_prefill=for_prefill)
        return inputs, [self.image_spans(row) for row in inputs["input_ids"].tolist()]

    def prefill_extras(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Family hook: host-computed prefill inputs (e.g. position ids) that would otherwise be
        computed inside the forward pass with host syncs. Default: none."""
        return {}

    def to_device(self, inputs: dict[str, Any], *, for_prefill: bool = False) -> dict[str, Any]:
        """Move host inputs to the model's device (asynchronously from pinned memory); for our
        ``prefill``, the ``host_input_keys`` stay on the host (generation gets everything moved).
        Values that are not tensors (Unlimited-OCR's per-image ``num_local_patches`` and
        ``patches_grid``: lists its forward reads on the host) reach the forward as they are."""
        device, keep = self.device, self.host_input_keys if for_prefill else ()
        return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) and k not in keep else v
                for k, v in inputs.items()}

    def image_spans(self, input_ids: Sequence[int]) -> list[tuple[int, int]]:
        """Token spans ``[start, end)`` of each image, start and end markers included (METHOD §3)."""
        spans, start = [], None
        for pos, tid in enumerate(input_ids):
            if tid == self.image_start_id:
                if start is not None:
                    raise ValueError(f"nested {self.image_start_token!r} at token {pos}")
                start = pos
            elif tid == self.image_end_id:
                if start is None:
                    raise ValueError(f"{self.image_end_token!r} without an opening marker at token {pos}")
                spans.append((start, pos + 1))
                start = None
        if start is not None:
            raise ValueError(f"unclosed {self.image_start_token!r} at token {start}")
        return spans

    # ---------------------------------------------------------------- forward
    def prefill_position_ids(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """Explicit position ids for the prefill, or None to let the model compute them."""
        return None

    @torch.no_grad()
    def prefill(self, inputs: dict[str, torch.Tensor], *, use_cache: bool) -> tuple[torch.Tensor, PrefillState]:
        """One forward pass over the whole prompt; returns the next-token logits [B, V]
        (float32) and the state continuation steps need. Only the last position goes
        through the LM head (a full-vocabulary projection of every position is waste)."""
        kwargs = dict(inputs)
        padded = kwargs.pop(PADDED_KEY, None)
        seq_len = int(inputs["input_ids"].shape[1])
        kwargs["attention_mask"] = self.kernel_mask(inputs["attention_mask"], seq_len, padded)
        pos = self.prefill_position_ids(inputs) if "position_ids" not in inputs else None
        if pos is not None:
            kwargs["position_ids"] = pos
        out = self.model.model(**compat.forward_kwargs(self.placed_image_features(kwargs)), use_cache=use_cache,
                               return_dict=True)
        hidden = out.last_hidden_state[:, -1:]
        logits = self.model.get_output_embeddings()(hidden)[:, -1].float()
        state = PrefillState(past_key_values=out.past_key_values if use_cache else None,
                             attention_mask=inputs["attention_mask"],
                             position_offset=self._position_offset(inputs, out), seq_len=seq_len, padded=padded)
        return logits, state

    def image_feature_count(self, inputs: dict[str, torch.Tensor]) -> int | None:
        """Family hook: how many image-feature tokens the batch's pixel inputs give, known on the
        host; None (the default) leaves the features' placement to transformers' forward, which
        checks the count by reading it back from the device once the whole tower has run."""
        return None

    def image_features(self, kwargs: dict[str, Any]) -> torch.Tensor:
        """Family hook (where :meth:`image_feature_count` is given): the vision tower's features of
        the batch's images [tokens, hidden], in prompt order, as transformers' forward computes
        them; takes the pixel inputs out of the forward's ``kwargs``."""
        raise NotImplementedError

    def placed_image_features(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The prefill's keyword arguments with the prompt embedded and the image features copied
        into the image tokens' places found on the host (``IMAGE_TOKEN_INDEX``; the values
        transformers' ``masked_scatter`` writes, without its read-back check), as
        ``inputs_embeds``; as they are where the places are not known."""
        index = kwargs.pop(IMAGE_TOKEN_INDEX, None)
        if index is None:
            return kwargs
        embeds = self.model.model.get_input_embeddings()(kwargs["input_ids"])
        features = self.image_features(kwargs)
        embeds.view(-1, embeds.shape[-1]).index_copy_(0, index, features.to(embeds.dtype))
        return {**kwargs, "input_ids": None, "inputs_embeds": embeds}

    def _position_offset(self, inputs: dict[str, torch.Tensor], out: Any) -> torch.Tensor | None:
        """Family hook: what ``continuation_position_ids`` needs from the prefill."""
        return None

    def continuation_position_ids(self, state: PrefillState, n_new: int) -> torch.Tensor | None:
        """Position ids of ``n_new`` tokens appended after the prefill (None = model default)."""
        return None

    @torch.no_grad()
    def continue_logits(self, state: PrefillState, new_tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Next-token logits [B, V] after appending ``new_tokens`` (the same ids for every row,
        or a [B, k] tensor of each row's own ids, e.g. its greedy reply) to the prefilled
        prompt, reusing the prefill's KV cache; the cache is cropped back afterwards so
        several continuations can share one prefill."""
        if state.past_key_values is None:
            raise ValueError("continue_logits needs a prefill run with use_cache=True")
        batch = state.attention_mask.shape[0]
        if isinstance(new_tokens, torch.Tensor):
            ids = new_tokens.to(device=self.device, dtype=torch.long)
        else:
            ids = torch.tensor([list(new_tokens)] * batch, dtype=torch.long, device=self.device)
        n_new = ids.shape[1]
        mask = torch.cat([state.attention_mask, torch.ones_like(ids, dtype=state.attention_mask.dtype)], dim=1)
        mask = self.kernel_mask(mask, n_new, state.padded)
        cache_position = torch.arange(state.seq_len, state.seq_len + n_new, device=self.device)
        kwargs: dict[str, Any] = dict(input_ids=ids, attention_mask=mask, past_key_values=state.past_key_values,
                                      use_cache=True, cache_position=cache_position, return_dict=True)
        pos = self.continuation_position_ids(state, n_new)
        if pos is not None:
            kwargs["position_ids"] = pos
        with compat.cache_rollback(state.past_key_values, state.seq_len):
            out = self.model.model(**compat.forward_kwargs(kwargs))
            hidden = out.last_hidden_state[:, -1:]
            return self.model.get_output_embeddings()(hidden)[:, -1].float()

    def decode_positions(self, state: PrefillState) -> torch.Tensor:
        """Position ids of the first token after the prefill, batch at dim -2 ([B, 1], or
        [A, B, 1] for multi-axis RoPE): the decode loop (``inference/decode.py``) adds one per step."""
        pos = self.continuation_position_ids(state, 1)
        if pos is None:
            raise NotImplementedError(f"{type(self).__name__} states no continuation positions")
        return pos

    @torch.no_grad()
    def decode_logits(self, cache: Any, ids: torch.Tensor, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor) -> torch.Tensor:
        """One decode step: next-token logits [B, V] (float32) after appending ``ids`` [B, 1] at
        ``position_ids`` to ``cache`` (kept: the loop owns the cache); ``attention_mask`` [B, T + 1]
        (or its 4-D form [B, 1, 1, T + 1]) covers the cache and the new token."""
        length = attention_mask.shape[-1] - 1
        kwargs = dict(input_ids=ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True,
                      position_ids=position_ids, return_dict=True,
                      cache_position=torch.arange(length, length + 1, device=ids.device))
        hidden = self.model.model(**compat.forward_kwargs(kwargs)).last_hidden_state[:, -1:]
        return self.model.get_output_embeddings()(hidden)[:, -1].float()

    def end_token_ids(self) -> list[int]:
        """Tokens that end a reply: the end of the turn, and the model's own EOS tokens."""
        eos = self.model.generation_config.eos_token_id
        return sorted({self.end_of_turn_id, *([] if eos is None else [eos] if isinstance(eos, int) else eos)})

    @torch.no_grad()
    def generate(self, inputs: dict[str, torch.Tensor], **generation_kwargs: Any) -> tuple[list[str], torch.Tensor]:
        """Generate replies for a batch (left padded), each sequence stopping at its own end
        token; returns the new text per sequence and its token count [B'] (the end token
        included; B' = B x num_return_sequences)."""
        ends = self.end_token_ids()
        out = self.model.generate(**inputs, eos_token_id=ends, pad_token_id=self.pad_token_id, **generation_kwargs)
        new = out[:, inputs["input_ids"].shape[1]:]
        ended = torch.isin(new, torch.tensor(ends, device=new.device))
        counts = torch.where(ended.any(-1), ended.int().argmax(-1) + 1, new.shape[1])
        return self.tokenizer.batch_decode(new, skip_special_tokens=True), counts


class OneDimRopeMixin:
    """Position handling of decoders with plain 1-D RoPE (InternVL's Qwen2, OV-1.5's Qwen3).

    With left padding the model's default positions (``arange``) would start every row at
    the padding; RoPE scores are shift-invariant, but generation in transformers counts
    positions from the first real token, so we do the same for exact batch == single-row
    equivalence.
    """

    def prefill_position_ids(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        mask = inputs["attention_mask"].long()
        return (mask.cumsum(-1) - 1).clamp(min=0)

    def _position_offset(self, inputs: dict[str, torch.Tensor], out: Any) -> torch.Tensor:
        return inputs["attention_mask"].long().sum(-1, keepdim=True) - 1          # last real position [B, 1]

    def continuation_position_ids(self, state: PrefillState, n_new: int) -> torch.Tensor:
        steps = torch.arange(1, n_new + 1, device=state.position_offset.device).view(1, -1)
        return state.position_offset + steps

    def exact_rewrites(self) -> int:
        """The queries and keys rotated with swapped halves and the sine signed once per forward
        (``models/rotary.py``): the same bits, a negation fewer for q and for k in every layer (and
        in a decode step their concatenations and four slices, for two rolls)."""
        return rotary.roll_one_dim_rope(self.model.model.language_model)


def read_chat_template(path: str) -> str:
    """The chat template in the Jinja file ``path`` (a config's ``models.<name>.chat_template``);
    one line naming the file where it cannot be read or is empty."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            template = f.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: the chat template file cannot be read ({getattr(error, 'strerror', None) or error})") from None
    if not template.strip():
        raise ValueError(f"{path}: the chat template file is empty")
    return template
