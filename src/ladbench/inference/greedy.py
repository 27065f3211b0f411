"""The reference implementation's Vanilla readout, from one prefill (METHOD §6; issue #12).

The reference answers Vanilla by greedy decoding of two new tokens (``generate`` with
``max_new_tokens=2``, the model's own generation config otherwise), decodes them without
special tokens, strips the text and parses the last integer in 1..N (an unparsable reply
is wrong). Its greedy first token ranges over the whole vocabulary, so it need not be an
identifier, and a two-token reply such as "1" "0" reads as 10 (out of range at N = 4).

Here the same two tokens come from the scoring pass itself: the first is the argmax of
the prefill's last-position logits, the second the argmax after appending each row's
first token through one KV-cache continuation step. What ``generate`` would change is
reproduced too: a repetition penalty of the model's generation config (it is applied
even in greedy search) and the stop after an end-of-sequence token. The cache stores the
tokens and the decoded text; the parse happens at evaluation (``vanilla_generate``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def repetition_penalty(adapter) -> float:
    """The repetition penalty ``generate`` applies for this model (1.0 = none)."""
    config = getattr(adapter.model, "generation_config", None)
    penalty = getattr(config, "repetition_penalty", None)
    return float(penalty) if penalty else 1.0


def penalty_applied(logits, penalty: float):
    """transformers' repetition penalty rule, on the logits of tokens already seen: each moves
    towards 0, divided by ``penalty`` where positive and multiplied where negative. (The
    greedy readout picks the seen logits by token id, the decode loop by a vocabulary mask.)"""
    import torch
    return torch.where(logits < 0, logits * penalty, logits / penalty)


def _penalised(logits, seen_ids, penalty: float):
    """The repetition penalty on the logits of the tokens in ``seen_ids`` [B, S]."""
    if penalty == 1.0:
        return logits
    return logits.scatter(1, seen_ids, penalty_applied(logits.gather(1, seen_ids), penalty))


def greedy_reply_tokens(adapter, last_logits, state, inputs: dict):
    """The two greedy reply tokens of each row, on the device: int64 [B, 2].

    ``last_logits`` [B, V] are the prefill's last-position logits (full vocabulary),
    ``state`` its KV state (``prefill(..., use_cache=True)``), ``inputs`` the encoded batch.
    Left padding is replaced by each row's last token before the repetition penalty, so
    a padded row is penalised exactly as the same row alone (the reference's batch of one).
    No host synchronisation.
    """
    import torch
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    seen = torch.where(mask.bool(), ids, ids[:, -1:])
    penalty = repetition_penalty(adapter)
    first = _penalised(last_logits, seen, penalty).argmax(-1, keepdim=True)               # [B, 1]
    second_logits = adapter.continue_logits(state, first)
    second = _penalised(second_logits, torch.cat([seen, first], 1), penalty).argmax(-1, keepdim=True)
    return torch.cat([first, second], 1)


def greedy_reply_texts(tokenizer, tokens: np.ndarray, stop_ids: Sequence[int]) -> list[str]:
    """Each row's reply as the reference reads it: the tokens up to and including the first
    stop token (generation ends there), decoded without special tokens, stripped."""
    stops = set(int(t) for t in stop_ids)
    texts = []
    for row in np.asarray(tokens).tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        texts.append(tokenizer.decode(row[:end], skip_special_tokens=True).strip())
    return texts


def greedy_outputs(adapter, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """The cache datasets of the greedy reply (docs/formats.md §4) from host tokens [B, 2]."""
    tokens = np.asarray(tokens)
    return {"greedy_tokens": tokens.astype(np.int32),
            "greedy_text": np.array(greedy_reply_texts(adapter.tokenizer, tokens, adapter.end_token_ids()),
                                    dtype=object)}
