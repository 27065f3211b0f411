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

import functools

import torch

#: Stored in the SC cache's hashed settings: a different sampler is a different cache.
SAMPLER = "gumbel-hash-v1"
_MASK = 0xFFFFFFFF
_TOKEN_SALT = 0x9E3779B9


def _mulmod32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 32-bit x and c, with c in two 16-bit halves: every product below
    2**48, so no int64 overflow, in six operations."""
    return (x * (c & 0xFFFF) + ((x * (c >> 16) & 0xFFFF) << 16)) & _MASK


def _mix(x: torch.Tensor) -> torch.Tensor:
    """murmur3's fmix32 on int64 tensors holding 32-bit values."""
    x = x & _MASK
    x = x ^ (x >> 16)
    x = _mulmod32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mulmod32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


@functools.lru_cache(maxsize=8)
def token_hashes(vocab: int, device: torch.device) -> torch.Tensor:
    """The hash of every token id [vocab], made once per vocabulary and device: a draw looks its
    top-k tokens' hashes up here instead of mixing them anew at every step (the same numbers)."""
    return _mix(torch.arange(vocab, device=device) + _TOKEN_SALT)


def uniform(keys: torch.Tensor, step: int | torch.Tensor, tokens: torch.Tensor, hashes: torch.Tensor) -> torch.Tensor:
    """Uniform numbers in (0, 1), one per (sequence key [B] of :func:`sequence_keys`, token id
    [B, K]), for ``step`` (one for all sequences, or each sequence's own [B]: the same numbers
    either way); ``hashes``: :func:`token_hashes` of the vocabulary."""
    h = _mix(keys ^ step)                                                # [B]
    h = _mix(h[:, None] ^ hashes[tokens])                                # [B, K]
    return (h.double() + 0.5) / 2.0 ** 32


def sequence_keys(seed: int, rows: torch.Tensor, n_samples: int) -> torch.Tensor:
    """Keys of ``n_samples`` sequences per row, in ``generate(num_return_sequences=S)``'s order
    (row-major): a hash of the seed, the row's index in the whole plan and the sample, mixed once
    more here so that a draw does not mix it again at every step."""
    rows = rows.long().repeat_interleave(n_samples)
    samples = torch.arange(n_samples, device=rows.device).repeat(len(rows) // max(n_samples, 1))
    return _mix(_mix(_mix(_mix(torch.full_like(rows, seed)) ^ rows) ^ samples))


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
        gumbel = -torch.log(-torch.log(uniform(keys, step, tokens, token_hashes(scores.shape[-1], scores.device))))
        return tokens.gather(-1, (values.double() / self.temperature + gumbel).argmax(-1, keepdim=True))[:, 0]
