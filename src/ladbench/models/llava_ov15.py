"""LLaVA-OneVision-1.5 adapter (hub code, ``lmms-lab/LLaVA-OneVision-1.5-8B-Instruct``).

The model class ships inside the checkpoint, so loading runs code from the model folder:
this adapter does so ONLY when the caller passes ``trust_remote_code=True`` (the study's
config marks the model as trusted) and never asks on stdin. Layout: Qwen2-VL style image
tokens ``<|vision_start|> <|image_pad|>*k <|vision_end|>``; a Qwen3 text model (q/k norms,
1-D RoPE) at ``model.model.language_model.layers``.
"""
from __future__ import annotations

import inspect
import sys
import types
from functools import partial
from typing import Any, Sequence

import torch

from ladbench.families import RICE_FEATURES
from .base import ModelAdapter, OneDimRopeMixin


class LlavaOV15Adapter(OneDimRopeMixin, ModelAdapter):
    image_start_token = "<|vision_start|>"
    image_end_token = "<|vision_end|>"
    image_token = "<|image_pad|>"
    # the shared Qwen2.5-VL processor emits it; the OV-1.5 model does not take it
    drop_input_keys = ("mm_token_type_ids",)
    # the hub code's decoder layers look their attention class up in their own table (eager, sdpa,
    # flash_attention_2; a KeyError for the capture's name), and its eager class does not run
    own_attention_table = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        visual = self.model.model.visual
        #: the RICE-ViT's feature selection (None: a tower without per-image class tokens, the stand-in's)
        self.rice = RiceFeatures(self.model.model) if is_rice_tower(visual) else None

    def apply_settings(self, settings: Any) -> None:
        if self.rice is not None:
            self.rice.mode = settings.rice_features

    def use_batched_vision(self) -> tuple[str, ...]:
        """The tiny stand-in's tower is transformers' Qwen2.5-VL tower: batched like Qwen2.5-VL's. The real
        model's RICE-ViT (hub code) attends within each image in one call (:func:`use_grouped_rice_attention`)."""
        from .vision import is_qwen2_5_vision_tower, use_batched_vision
        visual = self.model.model.visual
        if is_rice_tower(visual):
            use_grouped_rice_attention(visual)
        if not is_qwen2_5_vision_tower(visual):
            return ()
        use_batched_vision(visual, compiled=self.vision == "compiled")
        return ("image_grid_thw",)

    @classmethod
    def _load_processor(cls, model_path: str, *, revision: str | None, trust_remote_code: bool) -> Any:
        cls._require_trust(model_path, trust_remote_code)
        return super()._load_processor(model_path, revision=revision, trust_remote_code=trust_remote_code)

    @classmethod
    def _load_model(cls, model_path: str, *, text_impl: str, trust_remote_code: bool, **kw: Any) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM
        cls._require_trust(model_path, trust_remote_code)
        return AutoModelForCausalLM.from_pretrained(
            model_path, trust_remote_code=True, attn_implementation=cls.attn_implementation(text_impl), **kw)

    @staticmethod
    def _require_trust(model_path: str, trust_remote_code: bool) -> None:
        if not trust_remote_code:
            raise PermissionError(
                f"{model_path}: LLaVA-OneVision-1.5 runs model code shipped with the checkpoint; mark the model "
                "as trusted in the config (trust_remote_code: true / --trust-remote-code) to load it")


def is_rice_tower(visual: torch.nn.Module) -> bool:
    """Whether ``visual`` is the hub code's RICE-ViT: one class token per image (``class_embedding``),
    blocks, and a patch merger."""
    return all(hasattr(visual, name) for name in ("class_embedding", "blocks", "merger"))


class RiceFeatures:
    """Which output positions LLaVA-OneVision-1.5's RICE-ViT (hub code) gives each image.

    The tower puts a class token before each image's patches, runs its blocks (attention within
    each image and its class token), and takes the class tokens out again before the patch merger.
    It takes image i's patches from positions ``cu[i] + 1`` on, where ``cu`` counts patches
    WITHOUT the class tokens. Image i's own patches start at ``cu[i] + i + 1``. So image i gets
    its patches shifted back by i positions: the class token and the last i patches of the images
    before it in, its own last i patches out. (The NVIDIA NeMo Automodel review of a copy of this
    tower, PR #1922, describes the same.) In a batch of prompts, i counts the images of every
    prompt before, so a prompt's features depend on the batch it is in.

    This selection makes the output depend on the prompt alone. It takes the last block's output
    (the blocks see each image on its own, so batching changes nothing there) and hands the merger
    image i's positions from ``cu[i] + 1 + shift`` on, with the shift:
    - ``per_prompt``: the images of the prompts before i's (their class tokens), so each prompt
      gets what the hub code computes for it alone, a batch of one, as the published numbers
      were presumably made: its first image its own patches, its k-th shifted back by k;
    - ``per_image``: all images before i, so each image gets its own patches.
    The prompts are the rows of the ``input_ids`` the base model is called with (one read of the
    image-marker counts per row; the tower itself reads each image's size back). A tower call
    outside the base model counts as one prompt. ``per_prompt`` checks that the hub code's own
    selection is the shifted one it emulates (one comparison per tower call), so that a revision
    that selects otherwise is refused rather than emulated wrongly."""

    def __init__(self, base_model: torch.nn.Module, mode: str = RICE_FEATURES[0]) -> None:
        self.mode = mode
        self.start_token_id = base_model.config.vision_start_token_id
        visual = base_model.visual
        self._grid: torch.Tensor | None = None
        self._hidden: torch.Tensor | None = None
        self._images_per_prompt: list[int] | None = None
        base_model.register_forward_pre_hook(self._prompts, with_kwargs=True)
        base_model.register_forward_hook(self._forget_prompts)
        visual.register_forward_pre_hook(self._tower_call, with_kwargs=True)
        visual.blocks[-1].register_forward_hook(self._last_block)
        visual.merger.register_forward_pre_hook(self._merger_input)

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        if value not in RICE_FEATURES:
            raise ValueError(f"rice_features must be one of {', '.join(RICE_FEATURES)}; got {value!r}")
        self._mode = value

    def _prompts(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is not None and kwargs.get("pixel_values") is not None:
            self._images_per_prompt = (input_ids == self.start_token_id).sum(-1).tolist()

    def _forget_prompts(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        self._images_per_prompt = None

    def _tower_call(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        self._grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)

    def _last_block(self, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        self._hidden = output

    def _merger_input(self, module: torch.nn.Module, args: tuple) -> tuple[torch.Tensor]:
        hidden, self._hidden = self._hidden, None
        patches = self._grid.prod(-1).tolist()
        if self.mode == "per_prompt":          # emulating the hub's selection: it must be the one running
            known = hidden[feature_positions(patches, [0] * len(patches)).to(hidden.device)]
            if not torch.equal(args[0], known):
                raise RuntimeError(
                    "this revision of LLaVA-OneVision-1.5's hub code does not take image features where the "
                    "revisions ladbench knows do (positions shifted back by the images before: docs/method.md); "
                    "per_prompt would not be what it computes: set inference.rice_features: per_image")
        index = feature_positions(patches, self.shifts(len(patches)))
        return (hidden[index.to(hidden.device)],)

    def shifts(self, n_images: int) -> list[int]:
        """Each image's shift: the images of the prompts before its own, or all images before it
        (``per_image``)."""
        if self.mode == "per_image":
            return list(range(n_images))
        prompts = self._images_per_prompt or [n_images]
        if sum(prompts) != n_images:
            raise RuntimeError(f"the prompts hold {sum(prompts)} images but the vision tower got {n_images}")
        before = [sum(prompts[:p]) for p in range(len(prompts))]
        return [first for first, count in zip(before, prompts) for _ in range(count)]


def feature_positions(patches: Sequence[int], shifts: Sequence[int]) -> torch.Tensor:
    """The positions of the tower's last-block output (a class token before each image's patches)
    that the merger gets for each image, on the host: ``cu[i] + 1 + shift`` on, for image i's
    ``patches[i]`` positions, with ``cu`` the patch counts before i WITHOUT the class tokens (so the
    patch's own index plus 1 + its image's shift). A shift of i gives image i exactly its own
    patches; a shift of 0 is the hub code's selection."""
    offsets = torch.repeat_interleave(torch.tensor(shifts) + 1, torch.tensor(patches))
    return torch.arange(len(offsets)) + offsets


def use_grouped_rice_attention(visual: torch.nn.Module) -> int:
    """Make each RICE-ViT block's SDPA attention attend within each image and its class token as ONE
    call over [images, heads, length, head dim] (``vision.AttentionGroups``; a reshape when the images
    are of one size, as a study's are). The hub code builds a dense [S, S] mask over every image of
    the call, S being all their patches, filled by a Python loop of slices read back from the device,
    in every block, and attends over it. That is S x S scores where the images need the sum of their
    lengths squared: as many times the arithmetic as the call has images (16 for the study's batch of
    4 at N = 4; 128 images of 577 positions, a batch of 32, make a 5.5 GB mask). The same keys reach
    each query (the rest were masked out); the blocks' weights and the hub code's own rotary function
    are used. The eager class (the reference path) is left as shipped. Returns how many blocks changed."""
    changed, plans = 0, _CallGroups()
    for block in visual.blocks:
        attn = block.attn
        rotary = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb_vision", None)
        if not (type(attn).__name__.endswith("SdpaAttention") and rotary is not None and _known_interface(attn)):
            continue                            # the eager class, or a revision this was not written for
        attn.forward = types.MethodType(partial(_grouped_rice_attention, rotary=rotary, plans=plans), attn)
        changed += 1
    return changed


def _known_interface(attn: torch.nn.Module) -> bool:
    """The hub code's RICE attention as read: ``qkv``, ``proj``, ``num_heads``, and a forward of
    (hidden_states, cu_seqlens, rotary_pos_emb, position_embeddings)."""
    params = list(inspect.signature(attn.forward).parameters)
    return (all(hasattr(attn, name) for name in ("qkv", "proj", "num_heads"))
            and params == ["hidden_states", "cu_seqlens", "rotary_pos_emb", "position_embeddings"])


class _CallGroups:
    """The attention groups of the tower call under way, found from its ``cu_seqlens`` once for all
    its blocks (one read of the lengths per call: the hub code passes every block the same tensor)."""

    def __init__(self) -> None:
        self.last: tuple[torch.Tensor, Any] | None = None

    def groups(self, cu_seqlens: torch.Tensor, device: torch.device):
        from .vision import AttentionGroups
        if self.last is None or self.last[0] is not cu_seqlens:
            self.last = (cu_seqlens, AttentionGroups.build(cu_seqlens.diff().tolist(), device))
        return self.last[1]


def _grouped_rice_attention(attn: torch.nn.Module, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                            rotary_pos_emb: torch.Tensor | None = None,
                            position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, *,
                            rotary, plans: _CallGroups) -> torch.Tensor:
    seq = hidden_states.shape[0]
    q, k, v = attn.qkv(hidden_states).reshape(seq, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    if position_embeddings is None:
        emb = torch.cat((rotary_pos_emb, rotary_pos_emb), dim=-1)
        position_embeddings = (emb.cos(), emb.sin())
    q, k = rotary(q, k, *position_embeddings)
    groups = plans.groups(cu_seqlens, hidden_states.device)
    return attn.proj(groups.attend(q, k, v, q.shape[-1] ** -0.5))
