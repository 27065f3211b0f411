"""LLaVA-OneVision-1.5's RICE-ViT (hub code) takes the k-th image of a tower call's features from
positions shifted back by k, so a prompt's features depend on the batch it is in. ``RiceFeatures``
(models/llava_ov15.py) makes them the prompt's own: checked here on a toy tower with the hub
code's layout and selection (the real tower's code ships with the checkpoint; its tiny build was
checked the same way outside CI: docs/method.md). Its SDPA attention builds a dense mask over all
images of a call; ``use_grouped_rice_attention`` attends within each image in one call instead."""
from __future__ import annotations

import copy
import itertools
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ladbench.models.llava_ov15 import RiceFeatures, feature_positions, is_rice_tower, use_grouped_rice_attention

START = 7           # the image-start marker of the toy prompts


class _Block(nn.Module):
    """Attention within each segment (an image and its class token), then a residual MLP."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.qkv, self.mlp = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, hidden: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(hidden).chunk(3, dim=-1)
        scores = (q @ k.T).masked_fill(segments[:, None] != segments[None, :], float("-inf"))
        hidden = hidden + scores.softmax(-1) @ v
        return hidden + torch.tanh(self.mlp(hidden))


class _Merger(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Linear(4 * dim, dim)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlp(hidden.reshape(-1, self.mlp.in_features))


class ToyRice(nn.Module):
    """The hub tower's layout: a class token before each image's patches, blocks that attend within
    an image, the class tokens taken out from ``cu[i] + 1`` on (``cu`` counting patches without
    them), then a merger of 4 consecutive positions."""

    def __init__(self, dim: int = 8, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed                      # a revision that takes each image's own patches
        self.patch_embed = nn.Linear(3, dim)
        self.class_embedding = nn.Parameter(torch.randn(dim))
        self.blocks = nn.ModuleList([_Block(dim) for _ in range(2)])
        self.merger = _Merger(dim)

    def forward(self, pixels: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        counts = grid_thw.prod(-1).tolist()
        pieces, segments = [], []
        for image, part in enumerate(torch.split(self.patch_embed(pixels), counts)):
            pieces += [self.class_embedding[None], part]
            segments += [image] * (len(part) + 1)
        hidden, segments = torch.cat(pieces), torch.tensor(segments)
        for block in self.blocks:
            hidden = block(hidden, segments)
        cu = [0, *itertools.accumulate(counts)]
        shift = range(len(counts)) if self.fixed else [0] * len(counts)
        return self.merger(torch.cat([hidden[cu[i] + 1 + shift[i]:cu[i + 1] + 1 + shift[i]]
                                      for i in range(len(counts))]))


class ToyBase(nn.Module):
    """The base model: the image tokens' prompts in ``input_ids``, the tower called with the grids."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(vision_start_token_id=START)
        self.visual = ToyRice()

    def forward(self, input_ids=None, pixel_values=None, image_grid_thw=None):
        return self.visual(pixel_values, grid_thw=image_grid_thw)


def _inputs(images_per_prompt: list[int], seed: int = 0):
    """Prompts holding that many images each (unequal sizes: 4 or 8 patches), their pixels and grids."""
    generator = torch.Generator().manual_seed(seed)
    grids = torch.tensor([[1, 2, 2 + 2 * (i % 2)] for i in range(sum(images_per_prompt))])
    pixels = torch.randn(int(grids.prod(-1).sum()), 3, generator=generator)
    width = max(images_per_prompt) + 1
    ids = torch.tensor([[START] * n + [0] * (width - n) for n in images_per_prompt])
    return ids, pixels, grids


def _per_prompt(tower, images_per_prompt, pixels, grids) -> list[torch.Tensor]:
    """The tower on each prompt's images alone, split per image (merged tokens: patches / 4)."""
    out, first = [], 0
    patches = grids.prod(-1).tolist()
    for count in images_per_prompt:
        mine = slice(first, first + count)
        offset = sum(patches[:first])
        features = tower(pixels[offset:offset + sum(patches[mine])], grid_thw=grids[mine])
        out += list(torch.split(features, [p // 4 for p in patches[mine]]))
        first += count
    return out


def test_feature_positions_by_hand():
    # two images of 4 and 8 patches: positions 0 (class), 1-4, 5 (class), 6-13
    assert feature_positions([4, 8], [0, 0]).tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]       # the hub's
    assert feature_positions([4, 8], [0, 1]).tolist() == [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13]      # each its own


@torch.no_grad()
def test_per_prompt_gives_each_prompt_what_the_hub_code_gives_it_alone():
    torch.manual_seed(0)
    base = ToyBase()
    shipped = copy.deepcopy(base.visual)
    features = RiceFeatures(base)
    assert is_rice_tower(base.visual) and features.mode == "per_prompt"
    prompts = [3, 2, 3]
    ids, pixels, grids = _inputs(prompts)
    batched = base(input_ids=ids, pixel_values=pixels, image_grid_thw=grids)
    alone = torch.cat(_per_prompt(shipped, prompts, pixels, grids))
    torch.testing.assert_close(batched, alone, rtol=0, atol=1e-6)
    # the hub's own batched output differs: the batch reaches into every prompt after the first
    assert (shipped(pixels, grid_thw=grids) - alone).abs().max() > 1e-3
    # a tower call outside the base model is one prompt: the hub's own selection
    torch.testing.assert_close(base.visual(pixels, grid_thw=grids), shipped(pixels, grid_thw=grids), rtol=0, atol=0)


@torch.no_grad()
def test_per_image_gives_each_image_its_own_features():
    torch.manual_seed(1)
    base = ToyBase()
    shipped = copy.deepcopy(base.visual)
    features = RiceFeatures(base, "per_image")
    ids, pixels, grids = _inputs([2, 3])
    batched = base(input_ids=ids, pixel_values=pixels, image_grid_thw=grids)
    each = torch.cat(_per_prompt(shipped, [1] * 5, pixels, grids))    # one image alone: nothing before it
    torch.testing.assert_close(batched, each, rtol=0, atol=1e-6)
    features.mode = "per_prompt"                # a prompt's first image is the same both ways, the next ones not
    per_prompt = torch.split(base(input_ids=ids, pixel_values=pixels, image_grid_thw=grids), [1, 2, 1, 2, 1])
    mine = torch.split(batched, [1, 2, 1, 2, 1])
    assert torch.equal(per_prompt[0], mine[0]) and torch.equal(per_prompt[2], mine[2])
    assert (per_prompt[1] - mine[1]).abs().max() > 1e-3


def test_a_mode_outside_the_choices_and_a_count_mismatch_are_refused():
    base = ToyBase()
    with pytest.raises(ValueError, match="rice_features must be one of per_prompt, per_image; got 'fixed'"):
        RiceFeatures(base, "fixed")
    features = RiceFeatures(base)
    _, pixels, grids = _inputs([2, 2])
    three_markers = torch.tensor([[START, START], [START, 0]])
    with pytest.raises(RuntimeError, match="the prompts hold 3 images but the vision tower got 4"):
        base(input_ids=three_markers, pixel_values=pixels, image_grid_thw=grids)
    assert features.mode == "per_prompt"


def test_the_setting_enters_only_llava_ov15_caches_identity():
    from ladbench.inference.runner import InferenceSettings

    def identity(family, **overrides):
        return InferenceSettings(benchmark="b", images="i", out="o", model_name="m", family=family,
                                 model_path="org/model", **overrides).hashed_fields()
    assert "rice_features" not in identity("qwen2_5_vl")
    assert identity("qwen2_5_vl") == identity("qwen2_5_vl", rice_features="per_image")
    assert identity("llava_ov15")["rice_features"] == "per_prompt"
    assert identity("llava_ov15") != identity("llava_ov15", rice_features="per_image")


@torch.no_grad()
def test_per_prompt_refuses_a_tower_that_selects_otherwise():
    """A hub revision that took each image's own patches would make per_prompt's emulation wrong:
    refused in one line; per_image is what such a tower computes."""
    base = ToyBase()
    base.visual.fixed = True
    ids, pixels, grids = _inputs([2, 2])
    shipped = copy.deepcopy(base.visual)
    features = RiceFeatures(base)
    with pytest.raises(RuntimeError, match="per_prompt would not be what it computes: set inference.rice_features: "
                                           "per_image"):
        base(input_ids=ids, pixel_values=pixels, image_grid_thw=grids)
    features.mode = "per_image"
    torch.testing.assert_close(base(input_ids=ids, pixel_values=pixels, image_grid_thw=grids),
                               shipped(pixels, grid_thw=grids), rtol=0, atol=0)


def apply_rotary_pos_emb_vision(q, k, cos, sin):
    """The rotary function a hub module defines beside its attention class (rotate-half, in float32);
    ``use_grouped_rice_attention`` takes the module's own."""
    def rotated(t):
        half = t.shape[-1] // 2
        return torch.cat((-t[..., half:], t[..., :half]), dim=-1)
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    return ((q.float() * cos + rotated(q.float()) * sin).to(q.dtype),
            (k.float() * cos + rotated(k.float()) * sin).to(k.dtype))


class ToyRiceSdpaAttention(nn.Module):
    """The hub code's RICE attention interface and computation: qkv, the rotary, ONE SDPA call over
    every position of the call with a dense mask that lets each segment (``cu_seqlens``) see itself."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, hidden_states, cu_seqlens, rotary_pos_emb=None, position_embeddings=None):
        seq = hidden_states.shape[0]
        q, k, v = self.qkv(hidden_states).reshape(seq, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        q, k = apply_rotary_pos_emb_vision(q, k, *position_embeddings)
        mask = torch.zeros(1, seq, seq, dtype=torch.bool)
        for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
            mask[..., start:end, start:end] = True
        out = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), mask)
        return self.proj(out[0].transpose(0, 1).reshape(seq, -1))


class ToyRiceAttention(ToyRiceSdpaAttention):
    """The eager class of the same table (the reference path): left as shipped."""


@pytest.mark.parametrize("lengths", [[5, 5, 5], [5, 9, 3]], ids=["one size", "unequal"])
@torch.no_grad()
def test_grouped_rice_attention_equals_the_dense_mask(lengths):
    torch.manual_seed(0)
    dim, heads = 16, 2
    blocks = nn.ModuleList([nn.Module() for _ in range(3)])
    for block, cls in zip(blocks, (ToyRiceSdpaAttention, ToyRiceSdpaAttention, ToyRiceAttention)):
        block.attn = cls(dim, heads)
    visual = nn.Module()
    visual.blocks = blocks
    shipped = copy.deepcopy(visual)
    assert use_grouped_rice_attention(visual) == 2          # the SDPA classes; the eager one as shipped
    hidden = torch.randn(sum(lengths), dim)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    angles = torch.randn(sum(lengths), dim // heads // 2)
    emb = torch.cat((angles, angles), dim=-1)
    for mine, theirs in zip(visual.blocks, shipped.blocks):
        out = mine.attn(hidden, cu_seqlens=cu, position_embeddings=(emb.cos(), emb.sin()))
        torch.testing.assert_close(out, theirs.attn(hidden, cu_seqlens=cu, position_embeddings=(emb.cos(), emb.sin())),
                                   rtol=0, atol=1e-6)
    class OtherRevisionSdpaAttention(ToyRiceSdpaAttention):          # a forward this was not written for
        def forward(self, hidden_states, cu_seqlens, attention_mask=None, position_embeddings=None):
            return super().forward(hidden_states, cu_seqlens, None, position_embeddings)
    other = nn.Module()
    other.blocks = nn.ModuleList([nn.Module()])
    other.blocks[0].attn = OtherRevisionSdpaAttention(dim, heads)
    assert use_grouped_rice_attention(other) == 0
    # the rotary angles as the older interface passes them
    first = visual.blocks[0].attn
    torch.testing.assert_close(first(hidden, cu_seqlens=cu, rotary_pos_emb=angles),
                               first(hidden, cu_seqlens=cu, position_embeddings=(emb.cos(), emb.sin())), rtol=0, atol=0)
