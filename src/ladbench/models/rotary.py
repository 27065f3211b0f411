"""Rotary position embeddings rotated with the very same bits in fewer operations.

transformers rotates every query and key ``x`` of every layer as ``x * cos + rotate_half(x) *
sin``, where ``rotate_half(x) = cat(-x2, x1)`` (``x1``, ``x2``: the halves of the head's
channels): two slices, a negation and a concatenation for each of q and k, in every layer of
every forward. A decode step waits on the host's launches (docs/performance.md, "A decode step's
operations"), so each is paid in full, 36 layers a step for Qwen2.5-VL-3B.

Swapping the halves, ``cat(x2, x1)``, is one kernel (:func:`swap_halves`: ``torch.roll`` on a
decode step's contiguous states, with no slices), and the sign moves into the sine, once per
forward (:func:`signed_sin`: ``cat(-sin1, sin2)``): ``cat(x2, x1) * signed_sin`` is ``cat(x2 *
-sin1, x1 * sin2)``, and ``rotate_half(x) * sin`` is ``cat(-x2 * sin1, x1 * sin2)``. IEEE
arithmetic rounds ``-a * b`` and ``a * -b`` alike (rounding to nearest is symmetric), so the
products, their sum and the rotated states are the same bits (:func:`rotate`; tested on every
family that uses it, scores and replies compared bit for bit). Each layer then runs one negation
fewer for q and one for k, and in a decode step four slices fewer.

The embedding's forward hands its cos and the signed sin to the layers in a layout transformers'
own function never receives (M-RoPE: laid out, 3-D, ``models/qwen2_5_vl.py``; 1-D RoPE:
unsqueezed, 4-D, :func:`roll_one_dim_rope`), and the layers' function, wrapped once per process,
rotates by :func:`rotate` on that layout only; any other call goes to transformers' function as
it was. A model whose function is not transformers' formula (checked on the CPU when it is
rewritten: :func:`rotates_as_roll`), or whose layers do not call it by its name
(:func:`calls_by_name`), keeps its own.
"""
from __future__ import annotations

import functools
import inspect
import sys
from typing import Callable

import torch

from .kernels import replace_forward

#: set on a modeling module's rotary function once it is wrapped (once per process)
ROLLED_ATTR = "_ladbench_rolled"


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` [..., d] with its first half negated: the sign of ``rotate_half``, moved here."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def swap_halves(x: torch.Tensor) -> torch.Tensor:
    """``cat(x2, x1)`` in one kernel: ``torch.roll`` where ``x`` is contiguous (a decode step's one
    query position), else a concatenation of the halves' views (a prefill's transposed states,
    which ``torch.roll`` would first copy whole; on the CPU it is that concatenation either way)."""
    half = x.shape[-1] // 2
    if x.is_contiguous():
        return torch.roll(x, half, dims=-1)
    return torch.cat([x[..., half:], x[..., :half]], dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin``, bit for bit, with ``signed`` = :func:`signed_sin` of sin."""
    return x * cos + swap_halves(x) * signed


def rotates_as_roll(apply: Callable, *extra, axes: int = 0,
                    layout: Callable[[torch.Tensor], torch.Tensor] | None = None) -> bool:
    """Whether ``apply(q, k, cos, sin, *extra)`` (a modeling module's rotary function: q and k [B,
    H, T, d], cos and sin [B, T, d], or [axes, B, T, d] that ``layout`` lays out to [B, T, d]) gives
    :func:`rotate`'s bits, on small random tensors."""
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, 5, 8, generator=generator) for _ in range(2))
    cos, sin = (torch.randn(*((axes,) if axes else ()), 2, 5, 8, generator=generator) for _ in range(2))
    try:
        expected = apply(q, k, cos, sin, *extra)
    except Exception:                  # another signature, another layout: not transformers' formula
        return False
    if layout is not None:
        cos, sin = layout(cos), layout(sin)
    cos, signed = cos.unsqueeze(1), signed_sin(sin).unsqueeze(1)
    return all(isinstance(e, torch.Tensor) and e.shape == x.shape and torch.equal(e, rotate(x, cos, signed))
               for e, x in zip(expected, (q, k)))


def _rolling(apply: Callable) -> Callable:
    """``apply`` (1-D RoPE), which also takes the rewritten embedding's layout (cos [B, 1, T, d] and
    the signed sin) and then rotates by :func:`rotate`; a call with more than q, k, cos and sin, or
    with a partial rotary width, gets transformers' function on its own tables."""
    @functools.wraps(apply)
    def rolled(q, k, cos, sin, *args, **kwargs):
        if cos.dim() != 4:
            return apply(q, k, cos, sin, *args, **kwargs)
        if args or kwargs or q.shape[-1] != cos.shape[-1]:
            return apply(q, k, cos.squeeze(1), signed_sin(sin).squeeze(1), *args, **kwargs)
        return rotate(q, cos, sin), rotate(k, cos, sin)
    return rolled


def _unsqueezes_at_1(apply: Callable) -> bool:
    """Whether ``apply`` unsqueezes its tables at dim 1 unless told otherwise (q and k [B, H, T, d])."""
    parameter = inspect.signature(apply).parameters.get("unsqueeze_dim")
    return parameter is not None and parameter.default == 1


def calls_by_name(model: torch.nn.Module, name: str) -> bool:
    """Whether a module of ``model`` calls the modeling module's global ``name`` in its forward (the
    function a rewrite wraps must be the one the attention layers look up)."""
    codes = {getattr(inspect.unwrap(type(m).forward), "__code__", None) for m in model.modules()}
    return any(code is not None and name in code.co_names for code in codes)


def rewrite_rotation(text_model: torch.nn.Module, name: str, fits: Callable[[Callable], bool],
                     wrap: Callable[[Callable], Callable], lay_out: Callable[[torch.Tensor], torch.Tensor]) -> int:
    """The rotary rewrite of ``text_model`` (a decoder): its embedding's forward returns
    ``lay_out(cos)`` and the signed ``lay_out(sin)`` once per forward, and its modeling module's
    rotary function ``name`` is replaced, once per process, by ``wrap`` of it (which rotates by
    :func:`rotate` on that layout and hands any other call to the function as it was). Returns 1
    where it did; 0 where the decoder has no rotary embedding of its own, none of its modules
    calls ``name`` by that name, or the function does not ``fit`` (its signature, and
    :func:`rotates_as_roll`'s bits)."""
    module = sys.modules[type(text_model).__module__]
    apply = getattr(module, name, None)
    rotary = getattr(text_model, "rotary_emb", None)
    if apply is None or rotary is None or not calls_by_name(text_model, name):
        return 0
    if not getattr(apply, ROLLED_ATTR, False):
        if not fits(apply):
            return 0
        wrapped = wrap(apply)
        setattr(wrapped, ROLLED_ATTR, True)
        setattr(module, name, wrapped)
    shipped = type(rotary).forward

    def laid_out(rotary: torch.nn.Module, x: torch.Tensor, position_ids: torch.Tensor):
        cos, sin = shipped(rotary, x, position_ids)
        return lay_out(cos), signed_sin(lay_out(sin))
    replace_forward(rotary, laid_out)          # (a closure, not a partial: torch.compile traces the ring's step)
    return 1


def roll_one_dim_rope(text_model: torch.nn.Module) -> int:
    """Make ``text_model`` (a decoder with 1-D RoPE) rotate its queries and keys by :func:`rotate`:
    its rotary embedding returns cos [B, 1, T, d] and the signed sin once per forward, and its
    modeling module's ``apply_rotary_pos_emb`` (wrapped once per process) rotates with them
    (:func:`rewrite_rotation`; 1 where it did, else 0)."""
    return rewrite_rotation(text_model, "apply_rotary_pos_emb",
                            fits=lambda apply: _unsqueezes_at_1(apply) and rotates_as_roll(apply),
                            wrap=_rolling, lay_out=lambda table: table.unsqueeze(1))
