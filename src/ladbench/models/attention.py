"""Exact last-query attention at the speed of the fast kernel.

The model runs with SDPA (the fused kernel; no T x T attention matrix is kept). For every
captured decoder layer, a registered attention function additionally computes the ONE
attention row the method needs, that of the last query position (METHOD §3), from the
same post-rotary query/key states, grouped KV heads expanded (on a GPU the query heads
packed on them instead), the same mask and scaling the kernel sees, and reduces it at once
to the attention mass per token segment (one segment per image span, one for all other
text tokens, one for padding). Cost per layer: H x T dot products, against H x T x T for
the kernel; memory: L x H x (N + 2) numbers.

The function is registered under :data:`CAPTURE_ATTENTION` in transformers'
``AttentionInterface`` AND ``AttentionMaskInterface`` (without the latter, transformers
4.53 builds no padding mask for an unknown name). It behaves exactly like SDPA for any
module not currently inside a :class:`LastRowCapture` context.

A decoder shipped with its checkpoint may pick its attention class from a table of its own
(LLaVA-OneVision-1.5's: eager, sdpa, flash_attention_2) and never consult the
``AttentionInterface``: it loads with SDPA, and :func:`route_own_sdpa` sends its own call of
torch's SDPA through the same capture (:func:`own_sdpa_forward`).

SoFA (METHOD §6) also lives here: :class:`SofaMask` swaps the attention mask of chosen
layers for one where image tokens see later image tokens with additive bias log(sigma).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import torch
from torch.overrides import TorchFunctionMode

from .kernels import on_gpu_kernels

#: The attention implementation name the adapters load text decoders with
#: (:meth:`ladbench.models.base.ModelAdapter.load`); :func:`register_capture_attention` defines it.
CAPTURE_ATTENTION = "ladbench_capture"
_CAPTURE_ATTR = "_ladbench_capture"
_SOFA_ATTR = "_ladbench_sofa_bias"
_PROBE_ATTR = "_ladbench_probe"
#: what a module asks of its attention call while one of :class:`_ModuleAttributes` holds it
_ASKED_ATTRS = (_CAPTURE_ATTR, _SOFA_ATTR, _PROBE_ATTR)
_ROUTED_ATTR = "_ladbench_routes_own_sdpa"
#: keyword arguments of an attention call that change what the kernel computes beyond the
#: mask, the scaling, a position bias and per-query sinks: the capture does not model them
#: (logit soft-capping, GPT-OSS's learned sinks under their own name)
UNMODELLED_KERNEL_KWARGS = ("softcap", "s_aux")


def last_row_attention(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None,
                       scaling: float | None) -> torch.Tensor:
    """Post-softmax attention of the last query position, float32 [B, H, Tk].

    ``query`` [B, H, Tq, d] and ``key`` [B, KV, Tk, d] are the states the kernel gets
    (after rotary embedding, before GQA expansion). ``attention_mask`` is what the kernel
    gets: None (pure causal, no padding: the last row sees every key), a 4-D boolean
    (True = attend) or additive float mask [B, 1, Tq, Tk'], or a 2-D padding mask [B, Tk].
    """
    batch, n_heads, _, dim = query.shape
    n_kv = key.shape[1]
    q = query[:, :, -1:, :].float()
    scale = scaling if scaling is not None else dim ** -0.5
    if packs_on(query.device):
        # a GPU's kernel choice (models/kernels.py): each group's query heads as rows of their KV
        # head, so no key is copied per query head; the CPU keeps the copy, its float32 bits
        # being the pinned caches' (the products' order differs in the last place)
        grouped = q.reshape(batch, n_kv, n_heads // n_kv, dim) @ key.float().transpose(-1, -2)
        scores = grouped.reshape(batch, n_heads, 1, key.shape[-2]) * scale
    else:
        k = key.float().repeat_interleave(n_heads // n_kv, dim=1)      # same head order as repeat_kv
        scores = (q @ k.transpose(-1, -2)) * scale                     # [B, H, 1, Tk]
    if attention_mask is not None:
        if attention_mask.dim() == 2:                                   # flash-style padding mask
            scores = scores.masked_fill(attention_mask[:, None, None, :] == 0, float("-inf"))
        else:
            m = attention_mask[:, :, -1:, : key.shape[-2]]
            scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m.float()
    return scores.softmax(dim=-1)[:, :, 0]


def sdpa_kernel_mask(key_mask: torch.Tensor, n_queries: int, padded: bool) -> torch.Tensor | None:
    """The mask transformers hands an SDPA kernel of a full-attention decoder for the last
    ``n_queries`` of the K positions of ``key_mask`` [B, K] (1: a real token), decided without
    reading ``key_mask``: the host says whether any key is ``padded``. None where transformers
    drops the mask (no padding, and one query or as many queries as keys: the kernel's own
    rule is the causal one); else the bool [B, 1, Q, K] mask in which the query at position
    K - Q + i sees the real keys up to its own position (the same values as transformers')."""
    keys = key_mask.shape[-1]
    if not padded and n_queries in (1, keys):
        return None
    positions = torch.arange(keys, device=key_mask.device)
    causal = positions[None, :] <= positions[keys - n_queries:, None]                  # [Q, K]
    return causal[None, None] & key_mask.bool()[:, None, None, :]


def segment_mass(rows: torch.Tensor, segment_ids: torch.Tensor, n_segments: int) -> torch.Tensor:
    """Sum attention rows [B, H, T] over token segments: [B, H, n_segments].

    ``segment_ids`` [B, T] gives each token's segment (0 .. n_segments - 1).
    """
    batch, heads, length = rows.shape
    index = segment_ids.to(rows.device).long().unsqueeze(1).expand(batch, heads, length)
    out = torch.zeros(batch, heads, n_segments, dtype=rows.dtype, device=rows.device)
    return out.scatter_add_(2, index, rows)


def folded_mask(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                attention_mask: torch.Tensor | None, position_bias: torch.Tensor | None,
                kwargs: dict[str, Any]) -> torch.Tensor:
    """The additive float mask [B, H | 1, Tq, Tk] SDPA builds from a ``position_bias`` (Inkling
    2's relative logits; zeros when None) and the attention mask, built here so that the
    capture sees what the kernel sees."""
    from transformers.integrations.sdpa_attention import create_position_bias_mask

    if position_bias is None:
        position_bias = query.new_zeros(1, 1, query.shape[2], key.shape[2])
    # SDPA's rule: the call's is_causal where it passes one, else the module's; one query sees every key
    said = kwargs.get("is_causal")
    is_causal = query.shape[2] > 1 and (getattr(module, "is_causal", True) if said is None else said)
    return create_position_bias_mask(position_bias.to(query.dtype), attention_mask, is_causal, query, key)


def with_sink(key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
              sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention sinks (``sinks`` [B, H, Tq, 1]: one extra logit per query and head, with no
    value, that only absorbs softmax mass) as one more key: a zero key and value whose logit
    the additive ``mask`` sets to the sink. The kernel then computes exactly the model's own
    ``softmax([logits, sink])[..., :-1] @ V``; the last column of its rows is the sink's share."""
    mask = mask.expand(sinks.shape[0], sinks.shape[1], -1, -1)
    mask = torch.cat([mask, sinks.to(mask.dtype)], dim=-1)
    key = torch.cat([key, key.new_zeros(*key.shape[:2], 1, key.shape[-1])], dim=2)
    value = torch.cat([value, value.new_zeros(*value.shape[:2], 1, value.shape[-1])], dim=2)
    return key, value, mask


def capture_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                              value: torch.Tensor, attention_mask: torch.Tensor | None,
                              scaling: float | None = None, **kwargs: Any):
    """SDPA, plus the last-row capture and SoFA mask of modules that asked for them. A position
    bias is folded into the mask here (as SDPA would), and attention sinks (``sinks=``) enter
    as one more key (:func:`with_sink`); the captured rows keep the prompt's keys only, so
    their mass is what the model gives the tokens, the sink's share apart (rows sum below 1)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    attention_mask = sofa_mask(module, query, attention_mask)
    n_keys = key.shape[2]
    sinks, position_bias = kwargs.pop("sinks", None), kwargs.pop("position_bias", None)
    if sinks is not None or position_bias is not None:
        attention_mask = folded_mask(module, query, key, attention_mask, position_bias, kwargs)
    if sinks is not None:
        key, value, attention_mask = with_sink(key, value, attention_mask, sinks)
    record_capture(module, query, key, attention_mask, scaling, n_keys, kwargs.get("sliding_window"))
    if packs_one_query(module, query, key, attention_mask, kwargs):
        output = one_query_attention(query, key, value, attention_mask, scaling)
    else:
        output = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    record_probe(module, query, key, value, attention_mask, scaling, n_keys, output[0], kwargs)
    return output


def sofa_mask(module: torch.nn.Module, query: torch.Tensor, attention_mask: Any) -> Any:
    """The SoFA bias a :class:`SofaMask` set on ``module``, in the prefill (as many queries as the
    bias has rows); else ``attention_mask``."""
    sofa_bias = getattr(module, _SOFA_ATTR, None)
    if sofa_bias is not None and query.shape[2] == sofa_bias.shape[-2]:
        return sofa_bias
    return attention_mask


def record_capture(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                   attention_mask: torch.Tensor | None, scaling: float | None, n_keys: int,
                   window: int | None) -> None:
    """Hand a :class:`LastRowCapture` holding ``module`` the last query's attention over the first
    ``n_keys`` keys, as the kernel computes it from these states and mask."""
    capture = getattr(module, _CAPTURE_ATTR, None)
    if capture is not None:
        recorder, layer = capture
        recorder.record(layer, last_row_attention(query, key, attention_mask, scaling)[..., :n_keys], window)


def record_probe(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, scaling: float | None, n_keys: int,
                 output: torch.Tensor, kwargs: dict[str, Any]) -> None:
    """Hand an :class:`AttentionProbe` holding ``module`` the captured row and the kernel's
    ``output`` [B, Tq, H, d]."""
    probe = getattr(module, _PROBE_ATTR, None)
    if probe is not None:
        probe.record(module, last_row_attention(query, key, attention_mask, scaling)[..., :n_keys],
                     value[:, :, :n_keys], output, kwargs)


def own_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                     scale: float | None = None, **kwargs: Any) -> torch.Tensor:
    """Torch's SDPA as ``module``'s own code called it (:func:`route_own_sdpa`), with the SoFA mask,
    the capture and the probe of :func:`capture_attention_forward`. The keys may come with the
    grouped heads already expanded (``repeat_kv``); a causal call without a mask is the kernel's
    top-left causal rule, which the capture gets as a mask where the queries are fewer than the keys."""
    sofa = sofa_mask(module, query, attn_mask)
    if sofa is not attn_mask:
        attn_mask, is_causal = sofa, False
    seen = attn_mask
    if is_causal and query.shape[2] != key.shape[2]:
        seen = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device).tril()[None, None]
    n_keys = key.shape[2]
    record_capture(module, query, key, seen, scale, n_keys, None)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kwargs)
    record_probe(module, query, key, value, seen, scale, n_keys, output.transpose(1, 2), {})
    return output


class _OwnSdpaCall(TorchFunctionMode):
    """While one attention module's forward runs: its call of torch's SDPA goes through
    :func:`own_sdpa_forward` (every other operation runs as called; the mode is off inside)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.scaled_dot_product_attention:
            return own_sdpa_forward(self.module, *args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def route_own_sdpa(modules: Sequence[torch.nn.Module]) -> None:
    """Make attention modules that call torch's SDPA themselves (a checkpoint's own decoder code,
    loaded with SDPA) take the capture, SoFA and the probe: while one of those holds a module, its
    forward runs under :class:`_OwnSdpaCall`; otherwise (decode steps) it runs as shipped, at no
    cost beyond one attribute check. Idempotent."""
    for module in modules:
        if not getattr(module, _ROUTED_ATTR, False):
            module.forward = _routed_forward(module, module.forward)
            setattr(module, _ROUTED_ATTR, True)


def _routed_forward(module: torch.nn.Module, forward):
    @functools.wraps(forward)
    def routed(*args: Any, **kwargs: Any):
        if not any(hasattr(module, attr) for attr in _ASKED_ATTRS):
            return forward(*args, **kwargs)
        with _OwnSdpaCall(module):
            return forward(*args, **kwargs)
    return routed


def packs_one_query(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                    attention_mask: torch.Tensor | None, kwargs: dict[str, Any]) -> bool:
    """Whether this attention call runs as :func:`one_query_attention`: one query position (a decode
    step, a continuation of one token) with grouped KV heads, a mask shared by the heads of a group
    (or none), no dropout and nothing else the kernel would apply (a soft cap), on a GPU.

    There transformers 4.53's SDPA path (``repeat_kv``) copies the whole KV cache once per query
    head of a group (8 times for Qwen2.5-VL-3B's 16 heads over 2 KV heads) in every layer of every
    decode step, memory traffic that grows with the cache and the sequences in flight while the
    attention arithmetic of one query is small; 5.x packs the query instead, as here, except when
    compiled (the static shapes' step). On the CPU the call stays transformers' own: the paper
    lane's float32 bits are the reference (caches, replies equal to earlier runs), and the packed
    query changes them in the last place (a GPU's bfloat16 kernels differ from eager anyway)."""
    if not packs_on(query.device) or query.shape[2] != 1:           # (the CPU pays one check per call)
        return False
    groups = getattr(module, "num_key_value_groups", 1)
    heads = query.shape[1]
    plain_kernel = not kwargs.get("dropout") and all(kwargs.get(name) is None for name in UNMODELLED_KERNEL_KWARGS)
    mask_packs = attention_mask is None or (attention_mask.dim() == 4 and attention_mask.shape[2] == 1
                                            and attention_mask.shape[1] in (1, heads))
    return groups > 1 and heads == key.shape[1] * groups and plain_kernel and mask_packs


def packs_on(device: torch.device) -> bool:
    """The devices :func:`packs_one_query` packs on: GPUs (``models/kernels.py``; tests set it for the CPU)."""
    return on_gpu_kernels(device)


def one_query_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scaling: float | None) -> tuple[torch.Tensor, None]:
    """SDPA of one query position [B, H, 1, d] on the KV heads [B, KV, Tk, d]: the H / KV query heads
    of each group become that many query rows of their KV head ([B, KV, H / KV, d]; ``repeat_kv``'s
    head order), so no key or value is copied; a mask [B, 1 | H, 1, Tk] is shared or packed alike.
    Returns what ``sdpa_attention_forward`` returns: ([B, 1, H, d], None)."""
    batch, heads = query.shape[:2]
    kv_heads = key.shape[1]

    def packed(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(t.shape[0], kv_heads, heads // kv_heads, t.shape[-1])
    mask = attention_mask
    if mask is not None:
        mask = mask[..., : key.shape[-2]]                 # as SDPA's path cuts a static cache's longer mask
        if mask.shape[1] == heads:
            mask = packed(mask)
    out = torch.nn.functional.scaled_dot_product_attention(packed(query), key, value, attn_mask=mask, scale=scaling,
                                                           is_causal=False)
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The padding mask [B, W] of one query position that sees every key of its row but the
    padding (a decode step; 1 or True: a real token) as the additive mask SDPA makes of its boolean
    form in every layer ([B, 1, 1, W] in the model's ``dtype``: 0 where a key is seen, -inf where
    not; the same values, so the same attention), to be made once per step instead; its rows start
    at multiples of 8 elements, the alignment the memory-efficient kernel asks of a mask (it
    would otherwise pad a copy of it in every layer)."""
    rows, width = mask.shape
    aligned = torch.zeros(rows, 1, 1, -(-width // 8) * 8, dtype=dtype, device=mask.device)[..., :width]
    return aligned.masked_fill_((mask == 0)[:, None, None, :], float("-inf"))


#: largest difference (relative to the output's scale) between SDPA on strided views of a KV
#: store and on contiguous copies of them that still reads as "the same kernel, the same values"
#: (a kernel that misreads the strides is off by the output's own scale); other dtypes: ``None``'s
STRIDED_READ_TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10, None: 2e-2}


@functools.lru_cache(maxsize=None)
def strided_kv_read_error(device: str, dtype: torch.dtype, kv_heads: int, head_dim: int, groups: int) -> float:
    """The largest relative difference between torch's SDPA of a decode step reading keys and
    values as strided views of a preallocated KV store ([rows, KV, columns, d], some rows and a
    window of columns, as :class:`~ladbench.inference.decode.Slab` hands them to the attention)
    and of contiguous copies of the same views, each with a padding mask and one query position
    per KV head group (``groups`` query rows per KV head: the query packed on the KV heads, or one
    query head per KV head), on ``device`` in ``dtype``. Measured once per process and shape.

    transformers 4.53 copies every key and value into contiguous memory before SDPA because the
    memory-efficient kernel of some torch releases returned wrong values for non-contiguous
    inputs with a mask (pytorch#112577); the slab's views skip that copy where the attention
    takes them as they are (the packed query on a GPU, transformers 5.x), so the loop asks the
    device's own kernels first. The meta device holds no values: 0 there."""
    if torch.device(device).type == "meta":
        return 0.0
    generator = torch.Generator().manual_seed(0)

    def drawn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)
    rows, used, columns, start, width = 5, 3, 320, 7, 291      # unaligned window, as a flight's is
    keys, values = drawn(rows, kv_heads, columns, head_dim), drawn(rows, kv_heads, columns, head_dim)
    key_view, value_view = keys[:used, :, start:start + width], values[:used, :, start:start + width]
    query = drawn(used, kv_heads, groups, head_dim)
    real = torch.arange(width, device=device)[None, :] >= torch.tensor([[0], [40], [width - 5]], device=device)
    mask = additive_mask(real, dtype)                              # the loop's form
    sdpa = torch.nn.functional.scaled_dot_product_attention
    strided = sdpa(query, key_view, value_view, attn_mask=mask).float()
    copied = sdpa(query, key_view.contiguous(), value_view.contiguous(), attn_mask=mask).float()
    return float((strided - copied).abs().max() / copied.abs().max().clamp(min=1e-12))


def strided_kv_read_right(error: float, dtype: torch.dtype) -> bool:
    """Whether a :func:`strided_kv_read_error` in ``dtype`` reads as the same kernel on the same
    values (within :data:`STRIDED_READ_TOLERANCE`)."""
    return error <= STRIDED_READ_TOLERANCE.get(dtype, STRIDED_READ_TOLERANCE[None])


def register_capture_attention() -> None:
    """Register :func:`capture_attention_forward` (idempotent) with transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(CAPTURE_ATTENTION, capture_attention_forward)
    AttentionMaskInterface.register(CAPTURE_ATTENTION, sdpa_mask)


class _ModuleAttributes:
    """Set an attribute on some modules for the duration of a ``with`` block."""

    def __init__(self, attr: str, values: dict[torch.nn.Module, Any]) -> None:
        self.attr, self.values = attr, values

    def __enter__(self):
        for module, value in self.values.items():
            setattr(module, self.attr, value)
        return self

    def __exit__(self, *exc: Any) -> None:
        for module in self.values:
            if hasattr(module, self.attr):
                delattr(module, self.attr)


class LastRowCapture(_ModuleAttributes):
    """Collect the last query row's attention mass per segment for every given layer.

    Use as ``with LastRowCapture(adapter.attention_modules(), segment_ids, n_segments) as cap:``
    around ONE forward pass; then ``cap.masses()`` is [B, L, H, n_segments] (float32).
    The model must have been loaded with the :data:`CAPTURE_ATTENTION` implementation.
    """

    def __init__(self, modules: Sequence[torch.nn.Module], segment_ids: torch.Tensor, n_segments: int) -> None:
        super().__init__(_CAPTURE_ATTR, {m: (self, i) for i, m in enumerate(modules)})
        self.n_layers = len(modules)
        self.segment_ids, self.n_segments = segment_ids, n_segments
        self._mass: dict[int, torch.Tensor] = {}
        #: the sliding window each layer's kernel applied (the attention call's ``sliding_window``; 0: none)
        self.windows: dict[int, int] = {}

    def record(self, layer: int, rows: torch.Tensor, window: int | None = None) -> None:
        if rows.shape[-1] != self.segment_ids.shape[-1]:
            raise RuntimeError(f"layer {layer}: attention row has {rows.shape[-1]} keys but the prompt has "
                               f"{self.segment_ids.shape[-1]} tokens (capture must wrap a prefill, not a cached step)")
        self._mass[layer] = segment_mass(rows, self.segment_ids, self.n_segments)
        self.windows[layer] = int(window or 0)

    def masses(self) -> torch.Tensor:
        missing = [i for i in range(self.n_layers) if i not in self._mass]
        if missing:
            raise RuntimeError(
                f"no attention captured for decoder layers {missing}: the model's attention modules do not "
                f"dispatch through transformers' AttentionInterface with implementation {CAPTURE_ATTENTION!r} "
                "(nor call torch's SDPA themselves, routed by route_own_sdpa)")
        return torch.stack([self._mass[i] for i in range(self.n_layers)], dim=1)

    def applied_windows(self) -> list[int]:
        """The sliding window each layer's kernel applied in the pass (0: none), in layer order."""
        return [self.windows.get(i, 0) for i in range(self.n_layers)]


class AttentionProbe(_ModuleAttributes):
    """Which of ``modules`` dispatch through the capture function in one forward pass, in call
    order, and whether the capture sees what the kernel sees there: the captured last row,
    applied to the values, must give the kernel's own output for the last query (a mask, a
    scaling, a soft cap or attention sinks the capture missed would make them differ).

    Use as ``with AttentionProbe(decoder.modules()) as probe:`` around one forward of a model
    loaded with :data:`CAPTURE_ATTENTION`; then ``probe.calls`` lists ``(module, deviation,
    unmodelled)``: the largest difference relative to the values' scale, and the names of the
    call's keyword arguments that change the kernel's result beyond what the capture models.
    """

    def __init__(self, modules) -> None:
        super().__init__(_PROBE_ATTR, {m: self for m in modules})
        self.calls: list[tuple[torch.nn.Module, float, tuple[str, ...]]] = []
        #: the sliding window each module's kernel applied (the call's ``sliding_window``; 0: none)
        self.windows: dict[torch.nn.Module, int] = {}

    def record(self, module: torch.nn.Module, rows: torch.Tensor, value: torch.Tensor, output: torch.Tensor,
               kwargs: dict[str, Any]) -> None:
        values = value.float().repeat_interleave(rows.shape[1] // value.shape[1], dim=1)   # [B, H, Tk, d]
        expected = (rows.unsqueeze(-2) @ values).squeeze(-2)                              # [B, H, d]
        kernel = output[:, -1].float()                                                    # [B, H, d]
        deviation = float((kernel - expected).abs().max() / values.abs().max().clamp(min=1e-12))
        unmodelled = tuple(name for name in UNMODELLED_KERNEL_KWARGS if kwargs.get(name) is not None)
        self.calls.append((module, deviation, unmodelled))
        self.windows[module] = int(kwargs.get("sliding_window") or 0)


def sofa_attention_bias(attention_mask: torch.Tensor, image_tokens: torch.Tensor, sigma: float,
                        dtype: torch.dtype) -> torch.Tensor:
    """Additive SoFA mask [B, 1, T, T]: causal + padding, except that an image token sees
    LATER image tokens too, with bias log(sigma) (METHOD §6).

    ``attention_mask`` [B, T] is the padding mask (1 = real token), ``image_tokens`` [B, T]
    marks image tokens (the visual placeholder tokens; the span markers stay causal).

    Definition: SoFA (Tian et al., CVPR 2025, "SoFt Attention") interpolates linearly between
    inter-image causal and bidirectional attention. This follows the reference
    implementation (METHOD §6): the -inf of every future image-to-image entry becomes
    log(sigma), i.e. the interpolation (1 - sigma) * causal + sigma * bidirectional of the
    0/1 attention-visibility mask, applied before the softmax (sigma = 0: causal, sigma = 1:
    bidirectional among image tokens). It applies to all image-token pairs, within and
    across images. Differences one may meet: interpolating the post-softmax attention
    matrices instead ((1 - sigma) A_causal + sigma A_bidir) is not the same function; the
    SoFA paper tunes sigma on a validation set (reference: fixed 0.5, every 2nd layer).

    Masked entries get the dtype's most negative finite value rather
    than -inf, so the all-padding query rows of left padding stay finite (their outputs are
    never attended to by real tokens).
    """
    length = attention_mask.shape[-1]
    device = attention_mask.device
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    keys_real = attention_mask.bool()[:, None, :]
    allowed = causal[None] & keys_real                                   # [B, T, T]
    neg = torch.finfo(dtype).min
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, neg)
    img = image_tokens.bool().to(device)
    future_images = img[:, :, None] & img[:, None, :] & ~causal[None]
    soft = math.log(sigma) if sigma > 0 else neg
    bias = bias.masked_fill(future_images, soft)
    return bias[:, None]


def sofa_layers(n_layers: int, every: int, start: int = 0) -> list[int]:
    """Indices of the layers SoFA modifies: every ``every``-th layer from ``start`` (reference: 0, 2, 4, ...)."""
    if every < 1:
        raise ValueError(f"SoFA every-n must be >= 1; got {every}")
    return list(range(start, n_layers, every))


class SofaMask(_ModuleAttributes):
    """Use ``bias`` (see :func:`sofa_attention_bias`) as the attention mask of the given modules."""

    def __init__(self, modules: Sequence[torch.nn.Module], bias: torch.Tensor) -> None:
        super().__init__(_SOFA_ATTR, {m: bias for m in modules})
