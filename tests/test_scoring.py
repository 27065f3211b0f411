"""Candidate scoring (prefix trie, restricted normalisation, KV-cache continuation),
identifier formats, prompts, and answer parsing."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest_models import FAMILIES, demo_runner
from ladbench.inference.prompts import MAX_CANDIDATES, identifiers, majority_vote, parse_answer_is, parse_last_identifier
from ladbench.inference.scoring import IdentifierTrie, identifier_encoder, restricted_log_softmax, trie_scores
from ladbench.variants import prompt_sha256, prompt_text

pytestmark = pytest.mark.lanes

END = 99
# toy vocabulary: "1".."9" -> 1..9, "0" -> 10; multi-digit strings are one token per digit
TOY = {str(d): d for d in range(1, 10)} | {"0": 10}


def toy_encode(text: str) -> list[int]:
    return [TOY[ch] for ch in text]


# ----------------------------------------------------------------------------- trie
def test_trie_structure_digits_to_twelve():
    trie = IdentifierTrie.build([str(i) for i in range(1, 13)], toy_encode, END)
    assert trie.paths[9] == (1, 10) and trie.paths[11] == (1, 2)
    assert trie.valid_next[()] == list(range(1, 10))                     # first tokens of all candidates
    assert trie.valid_next[(1,)] == [1, 2, 10, END]                       # continuations of "1" plus EOS
    assert not trie.single_token
    assert trie.nodes_needing_logits("reference") == [(), (1,)]           # >1 token: joint even in reference
    single = IdentifierTrie.build([str(i) for i in range(1, 9)], toy_encode, END)
    assert single.single_token and single.nodes_needing_logits("reference") == [()]
    assert single.nodes_needing_logits("joint") == [()]


def test_restricted_log_softmax_by_hand():
    logits = np.array([[0.0, np.log(3.0), 5.0, np.log(1.0)]])
    got = restricted_log_softmax(logits, [1, 3])                          # only tokens 1 and 3 compete: 3 vs 1
    np.testing.assert_allclose(got, np.log([[0.75, 0.25]]), atol=1e-12)


def test_trie_scores_by_hand():
    ids = ["1", "2", "10"]                                                # "1" is a prefix of "10"
    trie = IdentifierTrie.build(ids, toy_encode, END)
    vocab = 100
    root, after1 = np.full((1, vocab), -50.0), np.full((1, vocab), -50.0)
    root[0, 1], root[0, 2] = np.log(0.6), np.log(0.2)                     # restricted: 0.75 / 0.25
    after1[0, END], after1[0, 10] = np.log(1.0), np.log(3.0)              # restricted: EOS .25, "0" .75
    got = trie_scores(trie, {(): root, (1,): after1}, "joint")
    np.testing.assert_allclose(np.exp(got), [[0.75 * 0.25, 0.25, 0.75 * 0.75]], atol=1e-12)
    assert np.isclose(np.exp(got).sum(), 1.0)                             # a proper distribution over candidates


def test_reference_mode_is_raw_logits_and_joint_is_restricted_log_prob():
    trie = IdentifierTrie.build(["1", "2", "3"], toy_encode, END)
    logits = np.random.default_rng(0).normal(size=(2, 20))
    np.testing.assert_array_equal(trie_scores(trie, {(): logits}, "reference"), logits[:, [1, 2, 3]])
    joint = trie_scores(trie, {(): logits}, "joint")
    np.testing.assert_allclose(joint, restricted_log_softmax(logits, [1, 2, 3]))
    # same argmax, joint = reference minus a per-row constant
    shift = joint - logits[:, [1, 2, 3]]
    np.testing.assert_allclose(shift, np.repeat(shift[:, :1], 3, axis=1))


def test_restricted_log_softmax_normalises_the_last_axis_of_any_rank():
    logits = np.log([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(restricted_log_softmax(logits, [0, 3]), np.log([0.2, 0.8]), atol=1e-12)
    stacked = np.stack([logits, logits[::-1]])[:, None, :].repeat(3, axis=1)       # [2, 3, 4]
    np.testing.assert_allclose(np.exp(restricted_log_softmax(stacked, [0, 3])),
                               np.broadcast_to(np.array([[0.2, 0.8], [0.8, 0.2]])[:, None, :], (2, 3, 2)), atol=1e-12)


def test_trie_rejects_ambiguous_identifiers():
    with pytest.raises(ValueError, match="same tokens"):
        IdentifierTrie.build(["1", "1"], toy_encode, END)
    # the message names the identifiers that collide, and only those
    with pytest.raises(ValueError, match=r"identifiers \['x', 'y'\] encode"):
        IdentifierTrie.build(["1", "x", "2", "y"], lambda s: toy_encode(s) if s.isdigit() else [7], END)
    with pytest.raises(ValueError, match="end token"):
        IdentifierTrie.build(["1"], lambda s: [END], END)


class ToyTokenizer:
    """A tokenizer with a BOS it adds only when asked, a newline token, one token per digit, and,
    when ``merges`` is set, a token for a digit right after a newline (as a byte-level BPE that
    merged across the newline would)."""

    BOS, NEWLINE, MERGED = 50, 51, 60

    def __init__(self, merges: bool = False) -> None:
        self.merges = merges

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        ids = [self.BOS] if add_special_tokens else []
        for i, ch in enumerate(text):
            if ch == "\n":
                ids.append(self.NEWLINE)
            elif self.merges and i > 0 and text[i - 1] == "\n":
                ids.append(self.MERGED + TOY[ch])
            else:
                ids.append(TOY[ch])
        return {"input_ids": ids}


def test_identifier_encoder_takes_the_replys_tokens_without_special_tokens():
    encode = identifier_encoder(ToyTokenizer())
    assert encode("1") == [1] and encode("10") == [1, 10]                 # no BOS: the reply starts mid-sequence


def test_identifier_encoder_refuses_a_tokenizer_that_merges_after_the_newline():
    """The newline stays its own token but the identifier after it becomes another token: the
    standalone tokens would score the wrong sequence."""
    tokenizer = ToyTokenizer(merges=True)
    assert tokenizer("\n1", add_special_tokens=False)["input_ids"][:1] == [ToyTokenizer.NEWLINE]
    with pytest.raises(ValueError, match="tokenises differently after a newline"):
        identifier_encoder(tokenizer)("1")


# ------------------------------------------------------------------------ formats, prompts
def test_identifier_formats():
    assert identifiers("digits", 12)[-3:] == ["10", "11", "12"]
    assert identifiers("upper", 4) == ["A", "B", "C", "D"] and identifiers("lower", 2) == ["a", "b"]
    assert identifiers("roman", 9)[3:] == ["IV", "V", "VI", "VII", "VIII", "IX"]
    assert identifiers("words", 3) == ["first", "second", "third"]
    with pytest.raises(ValueError, match="identifier format"):
        identifiers("emoji", 4)
    assert identifiers("digits", 1) == ["1"] and identifiers("words", 1) == ["first"]      # one candidate is allowed
    for n in (0, MAX_CANDIDATES + 1):
        with pytest.raises(ValueError, match="number of candidates"):
            identifiers("digits", n)


def test_vanilla_digit_prompt_is_the_reference_text():
    assert prompt_text("vanilla", 4, "a dog") == (
        "Given 4 images indexed from 1 to 4, identify the image that best matches the provided caption. "
        "Respond with the index number only and nothing else.\nCaption: a dog\nAnswer: ")
    assert "randomly shuffled" in prompt_text("instruction", 4, "a dog")
    assert prompt_text("cot", 8, "a dog").endswith("Answer: <think>")
    assert "The answer is <index>" in prompt_text("sc", 8, "a dog")
    assert "from A to D" in prompt_text("vanilla", 4, "x", "upper")
    assert "first, second, third and fourth" in prompt_text("vanilla", 4, "x", "words")
    assert "indexed as first and second," in prompt_text("vanilla", 2, "x", "words")
    assert "indexed as first," in prompt_text("vanilla", 1, "x", "words")
    assert prompt_sha256("vanilla", 4, "digits") == prompt_sha256("sofa", 4, "digits")
    assert prompt_sha256("vanilla", 4, "digits") != prompt_sha256("instruction", 4, "digits")


def test_answer_parsing():
    assert parse_last_identifier("<think>maybe 2 or 13</think> 3", 4) == 2
    assert parse_last_identifier("no digits here", 4) == -1
    assert parse_last_identifier("the answer: 12", 12) == 11 and parse_last_identifier("12", 8) == -1
    assert parse_last_identifier("not II but III", 4, "roman") == 2
    assert parse_last_identifier("The Second one", 4, "words") == 1
    assert parse_answer_is("I see 1 and 3. The answer is 2. Also 4", 4) == 1
    assert parse_answer_is("I see 1 and 3", 4) == 2                     # falls back to the last valid integer
    # the stated answer wins over identifiers written after it (words, and a case the format does not use)
    assert parse_answer_is("The answer is Second, not third.", 4, "words") == 1
    assert parse_answer_is("The answer is B, not A. the answer is c", 4, "upper") == 1
    assert majority_vote([0, 0, 1]) == 0                                   # position 0 is an answer like any other
    assert majority_vote([2, 1, -1, 1, 2]) == 2 and majority_vote([-1, -1]) == -1 and majority_vote([0, 3, 3]) == 3


# ------------------------------------------------------------------------ on real tiny models
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_tokenizer_identifier_tokens(family, tiny_adapter):
    adapter = tiny_adapter(family)
    encode = identifier_encoder(adapter.tokenizer)
    assert all(len(encode(str(d))) == 1 for d in range(1, 10))
    assert encode("10") == encode("1") + encode("0")                      # digits are split, as in Qwen
    for fmt in ("upper", "lower", "roman", "words"):
        IdentifierTrie.build(identifiers(fmt, 12), encode, adapter.end_of_turn_id)   # all distinguishable


def _extend(inputs, tokens):
    """The prompt with ``tokens`` appended to every row (for a full re-forward)."""
    add = torch.tensor([list(tokens)] * inputs["input_ids"].shape[0], dtype=torch.long)
    out = dict(inputs)
    out["input_ids"] = torch.cat([inputs["input_ids"], add], 1)
    out["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(add)], 1)
    if "mm_token_type_ids" in inputs:                # transformers 5.x's Qwen-VL processors: 0 = text token
        out["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(add)], 1)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_kv_continuation_equals_full_reforward(family, tiny_adapter, tmp_path):
    adapter = tiny_adapter(family)
    runner = demo_runner(adapter, tmp_path, 4)
    inputs = runner.encode_rows([0, 3])                                       # left padded batch
    _, state = adapter.prefill(inputs, use_cache=True)
    tok = adapter.tokenizer.convert_tokens_to_ids
    for prefix in ([tok("1")], [tok("1"), tok("2")], [tok("3")]):        # one- and two-token continuations
        cont = adapter.continue_logits(state, prefix)
        full, _ = adapter.prefill(_extend(inputs, prefix), use_cache=False)
        assert torch.allclose(cont, full, atol=1e-4, rtol=0), (prefix, (cont - full).abs().max())
    assert state.past_key_values.get_seq_length() == inputs["input_ids"].shape[1]    # cache cropped back


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["digits", "roman", "words"])
def test_joint_scores_at_n12_equal_full_reforward_restricted_probs(fmt, tiny_adapter, tmp_path):
    family = "qwen2_5_vl"
    adapter = tiny_adapter(family)
    runner = demo_runner(adapter, tmp_path, 12, bench_options=dict(n_eval=2, n_orderings=2, n_cal=1),
                         identifiers=fmt, score_mode="reference")
    rows = [0, 2]
    got = runner.score_batch(rows)["scores"]
    # independent computation: every candidate's path by full re-forwards, restricted softmax per step
    inputs = runner.encode_rows(rows)
    trie = runner.trie
    assert not trie.single_token
    full_logits = {node: adapter.prefill(_extend(inputs, list(node)), use_cache=False)[0].numpy()
                   for node in trie.valid_next}
    expected = np.zeros_like(got, dtype=np.float64)
    for k, path in enumerate(trie.paths):
        steps = [(path[:d], path[d]) for d in range(len(path))]
        if path in trie.valid_next:
            steps.append((path, adapter.end_of_turn_id))
        for node, token in steps:
            valid = trie.valid_next[node]
            lg = full_logits[node][:, valid].astype(np.float64)
            expected[:, k] += lg[:, valid.index(token)] - np.log(np.exp(lg).sum(1))
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.exp(got).sum(1), 1.0, atol=1e-4)       # a distribution over the 12 candidates
