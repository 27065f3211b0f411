"""Self-consistency sampling that does not depend on how rows are batched.

``torch.multinomial`` under one global seed gives a sequence a sample that depends on
every other sequence in its batch (they share the random stream), so a cache would change
with the batch size, with a resumed run's chunking and with sharding. Here sequence ``j``
draws its token at step ``t`` by the Gumbel-max trick with noise that is a hash of
``(seed, row, sample, t, token id)``: the argmax of ``logits / T + Gumbel`` over the top-k
tokens is an exact draw from ``softmax(top_k(logits) / T)``, and the draw is a function of
the sequence's own key and logits only. Greedy decoding then picks it (the processor
leaves only the drawn token finite), so ``generate(do_sample=False)`` samples, every
sequence stopping at its own end token.

The hash is a 32-bit integer mix (murmur3's finaliser) on int64 tensors, the same on the
CPU and the GPU. Sampled outputs are independent of batch size, chunking and shards up to
the floating-point differences batching makes in the logits themselves (none on the CPU
in float32 for the tiny models, where batch == single row exactly); they differ from what
``torch.manual_seed`` + ``multinomial`` gave before this sampler (caches made by older
versions carry no ``sampler`` setting and are therefore rebuilt).
"""
from __future__ import annotations

import torch

#: Stored in the SC cache's hashed settings: a different sampler is a different cache.
SAMPLER = "gumbel-hash-v1"
_MASK = 0xFFFFFFFF


def _mulmod32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 32-bit x and c, in two 16-bit halves: no int64 overflow."""
    return ((((x >> 16) * c) & _MASK) << 16) + (x & 0xFFFF) * c & _MASK


def _mix(x: torch.Tensor) -> torch.Tensor:
    """murmur3's fmix32 on int64 tensors holding 32-bit values."""
    x = x & _MASK
    x = x ^ (x >> 16)
    x = _mulmod32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mulmod32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def uniform(keys: torch.Tensor, step: int | torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Uniform numbers in (0, 1), one per (sequence key [B], token id [B, K]), for ``step`` (one
    for all sequences, or each sequence's own [B]: the same numbers either way)."""
    h = _mix(_mix(keys.long()) ^ step)                                   # [B]
    h = _mix(h[:, None] ^ _mix(tokens.long() + 0x9E3779B9))              # [B, K]
    return (h.double() + 0.5) / 2.0 ** 32


def sequence_keys(seed: int, rows: torch.Tensor, n_samples: int) -> torch.Tensor:
    """Keys of ``n_samples`` sequences per row, in ``generate(num_return_sequences=S)``'s order
    (row-major): a function of the seed, the row's index in the whole plan and the sample."""
    rows = rows.long().repeat_interleave(n_samples)
    samples = torch.arange(n_samples, device=rows.device).repeat(len(rows) // max(n_samples, 1))
    return _mix(_mix(_mix(torch.full_like(rows, seed)) ^ rows) ^ samples)


class KeyedSampler:
    """A transformers logits processor: keeps only the token each sequence draws at this
    step (``top_k`` tokens at ``temperature``, Gumbel noise keyed by the sequence)."""

    def __init__(self, keys: torch.Tensor, prompt_length: int, temperature: float, top_k: int) -> None:
        self.keys, self.prompt_length, self.temperature, self.top_k = keys, prompt_length, temperature, top_k

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_length
        drawn = self.draw(scores, self.keys.to(scores.device), step)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, drawn[:, None], 0.0)

    def draw(self, scores: torch.Tensor, keys: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
        """The token [B] each sequence (its key [B]) draws at ``step`` (one for all, or each
        sequence's own [B]: the number of tokens it has generated before) from ``scores`` [B, V]."""
        values, tokens = scores.float().topk(min(self.top_k, scores.shape[-1]), dim=-1)
        gumbel = -torch.log(-torch.log(uniform(keys, step, tokens)))
        return tokens.gather(-1, (values.double() / self.temperature + gumbel).argmax(-1, keepdim=True))[:, 0]
