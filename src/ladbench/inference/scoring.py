"""Candidate scores s(x) from next-token logits (METHOD §2), through a prefix trie.

Each identifier is tokenised as it appears as the first thing of the assistant's reply.
The identifiers' token sequences form a trie. At each trie node, the next token is
normalised over the valid tokens at that node only (restricted softmax): the children of
the node, plus the end-of-turn token when an identifier ends at that node and another
identifier continues it (e.g. "1" vs "10", "11", "12"). ``log P(c)`` is the sum over the
steps of its path. Logits at a node below the root come from a continuation step that
appends the node's prefix to the prompt reusing the prefill's KV cache.

Score modes:

* ``reference`` (default, the published numbers): when every identifier is ONE token and
  none is a prefix of another, the raw step-1 logit of each identifier's token; otherwise
  the joint restricted log-probability.
* ``joint``: always the joint restricted log-probability (the paper's Appendix B).

The array math is numpy; the model is touched only through the ``logits_at`` mapping.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

SCORE_MODES = ("reference", "joint")

Prefix = tuple[int, ...]


@dataclass
class IdentifierTrie:
    """Token paths of the candidate identifiers and the trie nodes they pass through."""

    identifiers: list[str]
    paths: list[Prefix]
    end_token: int
    #: node (token prefix) -> sorted valid next tokens (children, + end token when an identifier ends there)
    valid_next: dict[Prefix, list[int]] = field(default_factory=dict)

    @classmethod
    def build(cls, identifiers: Sequence[str], encode: Callable[[str], list[int]], end_token: int) -> "IdentifierTrie":
        """``encode(text)`` returns the token ids of ``text`` as the start of the reply (no special tokens)."""
        paths = [tuple(encode(s)) for s in identifiers]
        for s, p in zip(identifiers, paths):
            if not p:
                raise ValueError(f"identifier {s!r} encodes to no tokens")
            if end_token in p:
                raise ValueError(f"identifier {s!r} contains the end token {end_token}")
        if len(set(paths)) != len(paths):
            dup = [s for s, p in zip(identifiers, paths) if paths.count(p) > 1]
            raise ValueError(f"identifiers {dup} encode to the same tokens; they cannot be told apart")
        children: dict[Prefix, set[int]] = {}
        for p in paths:
            for d in range(len(p)):
                children.setdefault(p[:d], set()).add(p[d])
        ends = set(paths)
        valid = {node: sorted(kids | ({end_token} if node in ends else set())) for node, kids in children.items()}
        return cls(list(identifiers), paths, end_token, valid)

    @property
    def single_token(self) -> bool:
        """True when every identifier is one token and none continues another (the raw-logit case)."""
        return all(len(p) == 1 for p in self.paths) and list(self.valid_next) == [()]

    def nodes_needing_logits(self, mode: str) -> list[Prefix]:
        """Trie nodes whose next-token logits the score needs (``()`` = the prefill's own logits)."""
        check_mode(mode)
        if mode == "reference" and self.single_token:
            return [()]
        return sorted(self.valid_next, key=lambda p: (len(p), p))


def check_mode(mode: str) -> None:
    if mode not in SCORE_MODES:
        raise ValueError(f"unknown score mode {mode!r}; choose one of {', '.join(SCORE_MODES)}")


def restricted_log_softmax(logits: np.ndarray, token_ids: Sequence[int]) -> np.ndarray:
    """log-softmax of ``logits[..., token_ids]`` over those tokens only: [..., len(token_ids)] (float64)."""
    sub = np.asarray(logits, dtype=np.float64)[..., list(token_ids)]
    top = sub.max(axis=-1, keepdims=True)
    return sub - top - np.log(np.exp(sub - top).sum(axis=-1, keepdims=True))


def trie_scores(trie: IdentifierTrie, logits_at: Mapping[Prefix, np.ndarray], mode: str) -> np.ndarray:
    """Candidate scores [B, N] (float64) from next-token logits [B, V] at the needed trie nodes.

    ``logits_at`` must hold ``trie.nodes_needing_logits(mode)``. Candidate k's joint score is
    ``sum_d log p_restricted(path_k[d] | path_k[:d])``, plus ``log p_restricted(end | path_k)``
    when path_k is itself a node with continuations.
    """
    nodes = trie.nodes_needing_logits(mode)
    missing = [n for n in nodes if n not in logits_at]
    if missing:
        raise KeyError(f"logits missing for trie nodes {missing}")
    if mode == "reference" and trie.single_token:       # raw logits of single-token identifiers
        first = np.asarray(logits_at[()], dtype=np.float64)
        return first[..., [p[0] for p in trie.paths]]
    logp = {node: restricted_log_softmax(logits_at[node], trie.valid_next[node]) for node in nodes}
    batch = np.asarray(logits_at[()]).shape[0]
    scores = np.zeros((batch, len(trie.paths)))
    for k, path in enumerate(trie.paths):
        steps = [(path[:d], path[d]) for d in range(len(path))]
        if path in trie.valid_next:         # identifier is a prefix of another: it must also END here
            steps.append((path, trie.end_token))
        for node, token in steps:
            scores[:, k] += logp[node][:, trie.valid_next[node].index(token)]
    return scores


def identifier_encoder(tokenizer) -> Callable[[str], list[int]]:
    """Tokenise an identifier as the first text of the reply (after the template's "assistant\\n").

    Qwen-family pre-tokenisation never merges across that newline, so the identifier's
    tokens equal its standalone tokenisation; this is checked for every identifier, since
    a tokenizer that merged them would make the scores those of the wrong token sequence.
    """
    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    newline = ids("\n")

    def encode(text: str) -> list[int]:
        alone, in_context = ids(text), ids("\n" + text)
        if in_context[: len(newline)] != newline or in_context[len(newline):] != alone:
            raise ValueError(f"identifier {text!r} tokenises differently after a newline ({in_context}) than "
                             f"alone ({alone}); the reply-start tokenisation is ambiguous for this tokenizer")
        return alone
    return encode
