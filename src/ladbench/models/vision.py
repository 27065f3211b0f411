"""Qwen2.5-VL's vision tower, batched: every image of a batch in one pass, no host syncs per layer.

Paper lane (transformers 4.53) only: 5.x restructured the tower, and the current lane runs
transformers' own (``compat.batched_vision_supported``; 5.x's tower builds no dense
all-images mask, but makes one attention call per window and reads the window lengths on
the host in every layer).

transformers' tower (4.53) recomputes window indices and rotary tables in Python for every
call, and without flash-attention's variable-length kernel it builds one dense
[patches, patches] mask over ALL images of the call (quadratic in the number of images)
and reads ``.item()`` in every layer. Here the same computation is organised around what a
study actually feeds it, images resized to one square, i.e. usually one distinct grid:

* per distinct grid (t, h, w), once: the window order of its patches, its rotary cos/sin
  in that order, its window lengths (from the tower's own ``get_window_index`` and
  ``rot_pos_emb``, so the order is the native one by construction);
* per distinct list of grids (a batch), once: the batch's permutation, its cos/sin, and how
  its patches group into windows and into images (cached, reused by every later batch);
* per layer: ONE ``scaled_dot_product_attention`` call, over [windows, heads, window
  length, head dim] in windowed layers and [images, heads, patches, head dim] in
  full-attention layers. Groups of unequal length (edge windows of a grid that is not a
  multiple of the window, unequal image grids) are padded to the longest and the padded
  keys masked; when all groups are equal (the usual case) it is a plain reshape.

Patches attend only within their window (windowed layers) or their image (full layers),
exactly as in the native tower, so the features equal the native joint encoding (tested in
float32 within 1e-5 on unequal grids with partial edge windows). The block weights are used
through the block's own submodules (``norm1``, ``attn.qkv``, ``attn.proj``, ``norm2``,
``mlp``), the merger is the tower's own.
"""
from __future__ import annotations

import types
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ladbench.families import VISION_TOWERS  # noqa: F401  (the implementations an adapter can run)
from .rotary import rotate, signed_sin

_PLANS_ATTR = "_ladbench_batch_plans"
_STEP_ATTR = "_ladbench_block_step"     # how the batched forward runs a block: eager or compiled
_MAX_CACHED_PLANS = 64            # distinct batch compositions kept (a study usually has one)

Grid = tuple[int, int, int]


@dataclass
class AttentionGroups:
    """How a flat sequence [S] splits into contiguous groups that attend only within themselves.

    Equal groups (``length`` set): a reshape to [S / length, length]. Unequal ones: ``gather``
    [G, Lmax] indexes the sequence (padding slots point at token 0), ``key_mask`` [G, 1, 1, Lmax]
    is True on real keys, ``valid`` lists the real slots of the flattened [G * Lmax] in order.
    """

    length: int | None
    gather: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None
    valid: torch.Tensor | None = None

    @classmethod
    def build(cls, lengths: Sequence[int], device: torch.device) -> "AttentionGroups":
        if len(set(lengths)) == 1:
            return cls(length=int(lengths[0]))
        longest = max(lengths)
        slot = torch.arange(longest)
        starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
        size = torch.tensor(lengths)
        real = slot[None, :] < size[:, None]                                    # [G, Lmax]
        gather = torch.where(real, starts[:, None] + slot[None, :], torch.zeros((), dtype=torch.long))
        return cls(length=None, gather=gather.to(device), key_mask=real[:, None, None, :].to(device),
                   valid=real.flatten().nonzero().squeeze(1).to(device))

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention within groups: [S, H, D] states -> [S, H * D] output."""
        seq, heads, dim = query.shape
        if self.length is not None:
            def grouped(t: torch.Tensor) -> torch.Tensor:
                return t.reshape(-1, self.length, heads, dim).transpose(1, 2)
            out = F.scaled_dot_product_attention(grouped(query), grouped(key), grouped(value), scale=scale)
            return out.transpose(1, 2).reshape(seq, heads * dim)

        def padded(t: torch.Tensor) -> torch.Tensor:
            return t[self.gather].transpose(1, 2)                               # [G, H, Lmax, D]
        out = F.scaled_dot_product_attention(padded(query), padded(key), padded(value), attn_mask=self.key_mask,
                                             scale=scale)
        return out.transpose(1, 2).reshape(-1, heads * dim)[self.valid]


@dataclass
class _GridPlan:
    """One grid's window order (merge units), rotary cos and signed sine (:func:`~.rotary.signed_sin`)
    in that order, window lengths (patches)."""

    window_index: torch.Tensor
    cos: torch.Tensor
    signed_sin: torch.Tensor
    window_lengths: list[int]
    n_patches: int


@dataclass
class BatchPlan:
    """Everything a batch of images with these grids needs, built once and reused."""

    patch_order: torch.Tensor          # [S] patches in window order (images one after another)
    restore: torch.Tensor              # [S / merge unit] merged tokens back to raster order
    cos: torch.Tensor                  # [S, 1, head dim], float32: one table for every head
    signed_sin: torch.Tensor           # likewise, the sine's first half negated (models/rotary.py)
    windows: AttentionGroups
    images: AttentionGroups


def _grid_plan(visual: torch.nn.Module, grid: Grid) -> _GridPlan:
    grid_t = torch.tensor([grid])
    window_index, cu_window = visual.get_window_index(grid_t)
    bounds = torch.unique_consecutive(torch.tensor(cu_window))
    n_patches = grid[0] * grid[1] * grid[2]
    unit = visual.spatial_merge_unit
    rotary = visual.rot_pos_emb(grid_t).cpu()
    rotary = rotary.reshape(n_patches // unit, unit, -1)[window_index].reshape(n_patches, -1)
    emb = torch.cat((rotary, rotary), dim=-1)
    return _GridPlan(window_index, emb.cos(), signed_sin(emb.sin()), bounds.diff().tolist(), n_patches)


def batch_plan(visual: torch.nn.Module, grids: Sequence[Grid], device: torch.device) -> BatchPlan:
    """The (cached) plan of a batch of images with these grids."""
    plans: OrderedDict = visual.__dict__.setdefault(_PLANS_ATTR, OrderedDict())
    key = (tuple(grids), str(device))
    if key in plans:
        plans.move_to_end(key)
        return plans[key]
    unit = visual.spatial_merge_unit
    per_grid = {g: _grid_plan(visual, g) for g in set(grids)}
    order, merged, windows, patches, offset = [], [], [], [], 0
    for g in grids:
        p = per_grid[g]
        merged.append(p.window_index + offset // unit)
        order.append((p.window_index[:, None] * unit + torch.arange(unit)).flatten() + offset)
        windows += p.window_lengths
        patches.append(p.n_patches)
        offset += p.n_patches
    plan = BatchPlan(patch_order=torch.cat(order).to(device), restore=torch.argsort(torch.cat(merged)).to(device),
                     cos=torch.cat([per_grid[g].cos for g in grids])[:, None].to(device),
                     signed_sin=torch.cat([per_grid[g].signed_sin for g in grids])[:, None].to(device),
                     windows=AttentionGroups.build(windows, device), images=AttentionGroups.build(patches, device))
    plans[key] = plan
    if len(plans) > _MAX_CACHED_PLANS:
        plans.popitem(last=False)
    return plan


def vision_block_step(block: torch.nn.Module, hidden: torch.Tensor, cos: torch.Tensor, signed: torch.Tensor,
                      groups: AttentionGroups) -> torch.Tensor:
    """One block of the tower on the batch's patches [S, hidden] in window order, attending within
    ``groups`` (the batch's windows or its images). q and k are rotated as transformers'
    ``apply_rotary_pos_emb_vision`` rotates them, in float32 and back, with the halves swapped and
    the sine signed (``cos``, ``signed`` [S, 1, head dim]: :func:`~.rotary.rotate`): the same bits,
    a negation fewer for each."""
    attn = block.attn
    q, k, v = attn.qkv(block.norm1(hidden)).reshape(hidden.shape[0], 3, attn.num_heads, -1).unbind(1)
    q, k = (rotate(x.float(), cos, signed).to(x.dtype) for x in (q, k))
    hidden = hidden + attn.proj(groups.attend(q, k, v, attn.scaling))
    return hidden + block.mlp(block.norm2(hidden))


def batched_vision_forward(visual: torch.nn.Module, hidden_states: torch.Tensor, grid_thw: torch.Tensor,
                           **_: object) -> torch.Tensor:
    """Drop-in for ``Qwen2_5_VisionTransformerPretrainedModel.forward``: merged features [S / 4, out] in
    the native (raster, image after image) order. ``grid_thw`` is best left on the host (no sync)."""
    grids = [tuple(g) for g in grid_thw.tolist()]            # the one host read (free when grid_thw is on the host)
    hidden = visual.patch_embed(hidden_states)
    plan = batch_plan(visual, grids, hidden.device)
    hidden = hidden[plan.patch_order]
    full_layers = set(visual.fullatt_block_indexes)
    step = visual.__dict__.get(_STEP_ATTR, vision_block_step)
    for layer, block in enumerate(visual.blocks):
        groups = plan.images if layer in full_layers else plan.windows
        hidden = step(block, hidden, plan.cos, plan.signed_sin, groups)
    return visual.merger(hidden)[plan.restore]


def is_qwen2_5_vision_tower(module: torch.nn.Module) -> bool:
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
    return isinstance(module, Qwen2_5_VisionTransformerPretrainedModel)


def use_batched_vision(visual: torch.nn.Module, *, compiled: bool = False) -> None:
    """Make this tower instance run :func:`batched_vision_forward` (its class stays untouched);
    ``compiled``: each block's step under ``torch.compile`` (:func:`compiled_block_step`)."""
    if not is_qwen2_5_vision_tower(visual):
        raise TypeError(f"the batched vision tower needs transformers' Qwen2.5-VL tower; got {type(visual).__name__}")
    visual.__dict__[_STEP_ATTR] = compiled_block_step() if compiled else vision_block_step
    visual.forward = types.MethodType(batched_vision_forward, visual)


def compiled_towers(model: torch.nn.Module) -> int:
    """How many of ``model``'s vision towers run their blocks compiled."""
    return sum(module.__dict__.get(_STEP_ATTR, vision_block_step) is not vision_block_step for module in model.modules())


def compiled_block_step(backend: str = "inductor") -> Callable[..., torch.Tensor]:
    """:func:`vision_block_step` under ``torch.compile``: its norms, rotary embedding, residual adds
    and gating fused into a few kernels, where eagerly each is a pass over the block's activations
    in memory (on an H200, a third of the tower's kernel time: benchmarks/bench_vision_block.py).
    One graph serves every block (their weights are its inputs) per layer kind (windowed or
    full) and batch shape; a second shape makes the patch count dynamic instead of compiling
    again and again. ``fullgraph``: a step that cannot be captured whole fails at once."""
    return torch.compile(vision_block_step, fullgraph=True, backend=backend)
