"""The fast path (SDPA + last-row capture, the ``infer`` stage's batch step) equals the
reference path (eager attention with ``output_attentions``) on tiny models of every family:
attention mass within 1e-5, scores within 1e-4, and a left-padded batch equals batch size 1."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest_models import FAMILIES, TINY_IMAGE_SIZE, make_demo_benchmark
from ladbench.benchmark import load_benchmark
from ladbench.data.coco import load_image_table
from ladbench.models.attention import sofa_attention_bias, sofa_layers
from ladbench.inference.cache import plan_rows
from ladbench.inference.runner import InferenceSettings, RowRunner, image_paths
from ladbench.variants import SofaSettings

pytestmark = [pytest.mark.slow, pytest.mark.lanes]


def _runner(adapter, folder, n, family, **overrides) -> RowRunner:
    bench_path, images_path = make_demo_benchmark(folder, n)
    settings = InferenceSettings(benchmark=str(bench_path), images=str(images_path), out=str(folder / "c.h5"),
                                 model_name="tiny", family=family, model_path=adapter.model_path,
                                 image_size=TINY_IMAGE_SIZE, **overrides)
    bench = load_benchmark(bench_path)
    return RowRunner(adapter, settings, bench, plan_rows(bench),
                     image_paths(load_image_table(images_path)))


@torch.no_grad()
def _eager_reference(eager_adapter, inputs, n):
    """Next-token logits [B, V] and span masses [B, L, N] from eager ``output_attentions``."""
    out = eager_adapter.model.model(**inputs, output_attentions=True, use_cache=False, return_dict=True)
    logits = eager_adapter.model.get_output_embeddings()(out.last_hidden_state[:, -1]).float().numpy()
    ids = inputs["input_ids"].numpy()
    mass = np.zeros((ids.shape[0], len(out.attentions), n))
    for b in range(ids.shape[0]):
        spans = eager_adapter.image_spans(ids[b].tolist())
        for layer, att in enumerate(out.attentions):
            last_row = att[b, :, -1, :].double().numpy()                 # [H, T]
            for k, (start, end) in enumerate(spans):
                mass[b, layer, k] = last_row[:, start:end].sum(axis=1).mean()
    return logits, mass


@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize("family", FAMILIES)
def test_capture_equals_eager_output_attentions(family, n, tiny_adapter, tmp_path):
    fast, eager = tiny_adapter(family), tiny_adapter(family, "eager")
    runner = _runner(fast, tmp_path, n, family)
    rows = [0, 3]                                   # different caption lengths -> left padding in the batch
    got = runner.score_batch(rows)
    inputs = runner.encode_rows(rows)
    assert (inputs["attention_mask"][:, 0] == 0).any(), "the batch should be left padded"
    ref_logits, ref_mass = _eager_reference(eager, inputs, n)
    digit_ids = [fast.tokenizer.convert_tokens_to_ids(str(i)) for i in range(1, n + 1)]
    np.testing.assert_allclose(got["attn"], ref_mass, atol=1e-5, rtol=0)
    np.testing.assert_allclose(got["scores"], ref_logits[:, digit_ids], atol=1e-4, rtol=0)
    # the mass over images + other tokens is the whole (padding gets none)
    np.testing.assert_allclose(got["attn"].sum(-1) + got["attn_text"], 1.0, atol=1e-5)
    assert got["attn"].shape == (2, fast.n_layers, n) and got["attn_text"].shape == (2, fast.n_layers)


@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_batch_equals_batch_size_one(family, n, tiny_adapter, tmp_path):
    runner = _runner(tiny_adapter(family), tmp_path, n, family, store_head_attention=True)
    batch = runner.score_batch([0, 3, 4])
    singles = [runner.score_batch([r]) for r in (0, 3, 4)]
    for key, tol in (("scores", 1e-4), ("attn", 1e-5), ("attn_text", 1e-5), ("attn_heads", 2e-3)):
        np.testing.assert_allclose(batch[key], np.concatenate([s[key] for s in singles]), atol=tol, rtol=0,
                                   err_msg=key)


def test_sofa_bias_by_hand():
    mask = torch.tensor([[0, 1, 1, 1, 1]])                  # one left pad
    image = torch.tensor([[0, 1, 1, 0, 1]]).bool()           # image tokens at 1, 2, 4
    bias = sofa_attention_bias(mask, image, 0.5, torch.float32)[0, 0]
    neg, half = torch.finfo(torch.float32).min, float(np.log(0.5))
    expected = torch.tensor([
        [neg, neg, neg, neg, neg],            # padding query: sees nothing real
        [neg, 0, half, neg, half],            # image token 1 sees later image tokens 2 and 4 (log sigma)
        [neg, 0, 0, neg, half],
        [neg, 0, 0, 0, neg],                  # text token: plain causal
        [neg, 0, 0, 0, 0]])
    assert torch.equal(bias, expected)
    assert sofa_layers(7, 2) == [0, 2, 4, 6] and sofa_layers(3, 1) == [0, 1, 2]


@pytest.mark.parametrize("family", FAMILIES)
def test_sofa_sigma_zero_is_vanilla_and_sigma_positive_changes_scores(family, tiny_adapter, tmp_path):
    adapter = tiny_adapter(family)
    vanilla = _runner(adapter, tmp_path, 4, family).score_batch([0, 3])
    off = _runner(adapter, tmp_path, 4, family, prompt="sofa", options=SofaSettings(sigma=0.0)).score_batch([0, 3])
    on = _runner(adapter, tmp_path, 4, family, prompt="sofa", options=SofaSettings(sigma=1.0, every=1)).score_batch([0, 3])
    np.testing.assert_allclose(off["scores"], vanilla["scores"], atol=1e-4)
    np.testing.assert_allclose(off["attn"], vanilla["attn"], atol=1e-5)
    assert np.abs(on["scores"] - vanilla["scores"]).max() > 1e-3


@pytest.mark.current_lane("position biases and sinks reach the kernel in transformers 5.x")
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias and sinks", "sinks alone"])
def test_attention_sinks_and_position_bias_by_hand(with_bias):
    """A call with a position bias and per-query sinks (Inkling 2), or sinks alone (gpt-oss): the
    kernel's output is softmax([q.k * scale + bias + mask, sink])[..., :-1] @ V, written out here,
    and the captured last row is that softmax's last row without the sink: its mass is 1 less the
    sink's share."""
    from ladbench.models.attention import LastRowCapture, capture_attention_forward
    g = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, length, dim = 3, 4, 2, 5, 8
    query = torch.randn(batch, heads, length, dim, generator=g)
    key, value = (torch.randn(batch, kv_heads, length, dim, generator=g) for _ in range(2))
    bias = torch.randn(batch, heads, length, length, generator=g) * with_bias
    sinks = torch.randn(batch, heads, length, 1, generator=g) + 2.0        # a sizeable share
    padding = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)
    mask = torch.ones(length, length, dtype=torch.bool).tril()[None, None] & padding[:, None, None, :]
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = heads // kv_heads, True
    segments = torch.tensor([[2, 0, 0, 1, 1], [0, 0, 1, 1, 1], [2, 2, 0, 1, 1]])   # 2 = padding
    with LastRowCapture([module], segments, 3) as capture:
        output, _ = capture_attention_forward(module, query, key, value, mask, scaling=0.3, sinks=sinks,
                                              **({"position_bias": bias} if with_bias else {}))
    k, v = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (key, value))
    logits = (query @ k.transpose(-1, -2)) * 0.3 + bias
    logits = logits.masked_fill(~mask, float("-inf"))
    weights = torch.cat([logits, sinks], -1).softmax(-1)[..., :-1]
    expected = (weights @ v).transpose(1, 2)
    real = padding[:, None, :, None].transpose(1, 2).expand_as(expected)   # padded queries see nothing real
    torch.testing.assert_close(output[real], expected[real], atol=1e-5, rtol=0)
    masses = capture.masses()[:, 0]                                          # [B, H, 3]
    torch.testing.assert_close(masses.sum(-1), weights[:, :, -1].sum(-1), atol=1e-6, rtol=0)
    assert (masses.sum(-1) < 0.99).all()                                     # the sink took its share
    torch.testing.assert_close(masses[..., :2], torch.stack(
        [(weights[:, :, -1] * (segments == s)[:, None]).sum(-1) for s in (0, 1)], -1), atol=1e-6, rtol=0)


@pytest.mark.current_lane("position biases and sinks reach the kernel in transformers 5.x")
@pytest.mark.parametrize("causal_call", [None, True, False])
@pytest.mark.parametrize("causal_module", [True, False, None])
@pytest.mark.parametrize("n_queries", [1, 2, 5])
def test_a_position_bias_without_a_mask_is_folded_as_sdpa_folds_it(n_queries, causal_module, causal_call):
    """Without an attention mask SDPA makes the bias causal where the call says so (else the module,
    causal when it does not say) and there is more than one query (a decode step's one query sees
    every key): the capture's folded mask must give the output transformers' own SDPA path gives
    for the same call (None: the module has no ``is_causal``, the call passes none)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from ladbench.models.attention import capture_attention_forward
    g = torch.Generator().manual_seed(1)
    query = torch.randn(1, 4, n_queries, 8, generator=g)
    key, value = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(2))
    bias = torch.randn(1, 4, n_queries, 5, generator=g)
    module = torch.nn.Module()
    module.num_key_value_groups = 2
    if causal_module is not None:
        module.is_causal = causal_module
    call = {} if causal_call is None else {"is_causal": causal_call}
    output, _ = capture_attention_forward(module, query, key, value, None, scaling=0.3, position_bias=bias, **call)
    expected, _ = sdpa_attention_forward(module, query, key, value, None, scaling=0.3, position_bias=bias, **call)
    torch.testing.assert_close(output, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mask_kind", ["none", "shared bool", "per head float", "longer than the keys"])
@pytest.mark.parametrize("groups", [2, 8])
def test_one_query_on_the_kv_heads_equals_sdpa_with_repeated_kv(groups, mask_kind):
    """A decode step's attention on a GPU (:func:`one_query_attention`: each group's query heads as
    rows of their KV head, no copy of the cache) against transformers' SDPA path (``repeat_kv``,
    every KV head copied once per query head of its group): the same numbers in float32, in the
    same head order, for a padding mask shared by the heads, a per-head additive one, or none, and
    a mask longer than the keys (a static cache's: cut as SDPA's path cuts it)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from ladbench.models.attention import one_query_attention
    gen = torch.Generator().manual_seed(groups)
    batch, kv_heads, keys, dim = 3, 2, 37, 16
    heads = kv_heads * groups
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = groups, True
    query = torch.randn(batch, heads, 1, dim, generator=gen)
    key, value = (torch.randn(batch, kv_heads, keys, dim, generator=gen) for _ in range(2))
    mask = {"none": None, "shared bool": torch.rand(batch, 1, 1, keys, generator=gen) > 0.3,
            "per head float": torch.randn(batch, heads, 1, keys, generator=gen),
            "longer than the keys": torch.rand(batch, 1, 1, keys + 5, generator=gen) > 0.3}[mask_kind]
    cut = None if mask is None else mask[..., :keys]          # 4.53's path cuts a longer mask, 5.x's expects none
    expected, _ = sdpa_attention_forward(module, query, key, value, cut, scaling=0.3)
    packed, _ = one_query_attention(query, key, value, mask, 0.3)
    assert packed.shape == expected.shape == (batch, 1, heads, dim) and packed.is_contiguous()
    torch.testing.assert_close(packed, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "per head float", "2-D padding"])
def test_the_captured_row_on_the_kv_heads_equals_it_with_repeated_keys(mask_kind, monkeypatch):
    """The capture's last row on a GPU (``packs_on``: each group's query heads as rows of their KV
    head, no key copied per head) against the CPU's (the keys repeated per query head, transformers'
    head order): the same attention in float32, for every kind of mask the kernel may get."""
    from ladbench.models import attention
    gen = torch.Generator().manual_seed(1)
    batch, kv_heads, groups, queries, keys, dim = 3, 2, 4, 5, 37, 16
    query = torch.randn(batch, kv_heads * groups, queries, dim, generator=gen)
    key = torch.randn(batch, kv_heads, keys, dim, generator=gen)
    mask = {"none": None, "bool": torch.rand(batch, 1, queries, keys, generator=gen) > 0.3,
            "per head float": torch.randn(batch, kv_heads * groups, queries, keys, generator=gen),
            "2-D padding": (torch.rand(batch, keys, generator=gen) > 0.3).long()}[mask_kind]
    repeated = attention.last_row_attention(query, key, mask, 0.3)
    if mask_kind == "2-D padding":   # a flash kernel's padding mask: 1 = a real key, as the 4-D bool mask says it
        real = mask.bool()
        as_bool = real[:, None, None, :].expand(batch, 1, queries, keys)
        torch.testing.assert_close(repeated, attention.last_row_attention(query, key, as_bool, 0.3), rtol=0, atol=0)
        assert (repeated[~real[:, None, :].expand_as(repeated)] == 0).all()
    monkeypatch.setattr(attention, "packs_on", lambda device: True)
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", None)             # no key copied per head
    packed = attention.last_row_attention(query, key, mask, 0.3)
    assert packed.shape == repeated.shape == (batch, kv_heads * groups, keys)
    torch.testing.assert_close(packed, repeated, rtol=0, atol=1e-6)


def test_one_query_attention_is_taken_only_where_it_applies(monkeypatch):
    """One query position, grouped KV heads, a mask the heads can share or pack, on a GPU; the CPU
    keeps transformers' path (its float32 bits are the reference)."""
    from ladbench.models import attention
    module = torch.nn.Module()
    module.num_key_value_groups = 4
    query, key = torch.zeros(2, 8, 1, 4), torch.zeros(2, 2, 5, 4)
    shared, per_head, per_query = torch.ones(2, 1, 1, 5, dtype=torch.bool), torch.zeros(2, 8, 1, 5), torch.zeros(2, 1, 2, 5)
    assert not attention.packs_one_query(module, query, key, shared, {})                      # the CPU
    monkeypatch.setattr(attention, "packs_on", lambda device: True)
    assert attention.packs_one_query(module, query, key, shared, {})
    assert attention.packs_one_query(module, query, key, per_head, {})
    assert attention.packs_one_query(module, query, key, None, {})
    assert not attention.packs_one_query(module, torch.zeros(2, 8, 2, 4), key, per_query, {})   # two queries
    assert not attention.packs_one_query(module, query, key, torch.zeros(2, 2, 1, 5), {})      # per KV head
    assert not attention.packs_one_query(module, query, key, shared, {"dropout": 0.1})
    assert not attention.packs_one_query(module, query, key, shared, {"softcap": 50.0})        # SDPA refuses it
    module.num_key_value_groups = 1
    assert not attention.packs_one_query(module, query, torch.zeros(2, 8, 5, 4), shared, {})   # no groups
    del module.num_key_value_groups
    assert not attention.packs_one_query(module, query, torch.zeros(2, 4, 5, 4), shared, {})   # none stated


class _OwnSdpaAttention(torch.nn.Module):
    """Attention as a decoder shipped with its checkpoint writes it (LLaVA-OV-1.5's hub code): its
    own call of torch's SDPA, grouped KV heads expanded first, ``is_causal`` where it has no mask
    (``pass_causal`` False: a call that leaves ``is_causal`` at SDPA's default, full attention)."""

    def __init__(self, heads: int, kv_heads: int, pass_causal: bool = True) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.pass_causal = heads, kv_heads, pass_causal

    def forward(self, query, key, value, mask=None, expand=True):
        if expand:
            key, value = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (key, value))
        causal = mask is None and query.shape[2] > 1
        kwargs = {} if expand else {"enable_gqa": True}
        if self.pass_causal:
            kwargs["is_causal"] = causal
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, **kwargs)


@pytest.mark.parametrize("case", ["causal", "causal, fewer queries", "float mask", "bool mask", "grouped heads",
                                  "no causal flag"])
def test_a_decoders_own_sdpa_call_is_captured_as_its_kernel_computes_it(case, monkeypatch):
    """route_own_sdpa: the captured last row is the kernel's (a hand-computed softmax), the output is
    the unrouted module's bit for bit, SoFA's bias reaches that kernel, and outside a capture the
    module runs as shipped."""
    from ladbench.models import attention
    from ladbench.models.attention import AttentionProbe, LastRowCapture, SofaMask, route_own_sdpa
    torch.manual_seed(0)
    heads, kv_heads, keys, dim = 4, 2, 7, 8
    queries = 3 if case == "causal, fewer queries" else keys
    query, key, value = torch.randn(2, heads, queries, dim), torch.randn(2, kv_heads, keys, dim), torch.randn(2, kv_heads, keys, dim)
    mask = None
    if case == "float mask":
        mask = torch.zeros(2, 1, queries, keys).masked_fill(torch.rand(2, 1, queries, keys) < 0.3, -1e9)
        mask[..., 0] = 0.0
    elif case == "bool mask":
        mask = torch.rand(2, 1, queries, keys) > 0.3
        mask[..., 0] = True
    module = _OwnSdpaAttention(heads, kv_heads, pass_causal=case != "no causal flag")
    expand = case != "grouped heads"
    shipped = module(query, key, value, mask, expand)
    route_own_sdpa([module])
    route_own_sdpa([module])                                  # idempotent: one wrapper
    assert not hasattr(module.forward.__wrapped__, "__wrapped__")
    # the rows by hand: top-left causal (SDPA's rule) where there is no mask
    scores = query @ key.repeat_interleave(2, dim=1).transpose(-1, -2) / dim ** 0.5
    seen = torch.ones(queries, keys, dtype=torch.bool)
    seen = mask if mask is not None else seen if case == "no causal flag" else seen.tril()
    seen = seen if seen.dtype == torch.bool else seen == 0
    expected = scores.masked_fill(~seen, float("-inf")).softmax(-1)[:, :, -1]
    segments = torch.arange(keys).repeat(2, 1)                # one segment per key: the masses are the row
    with LastRowCapture([module], segments, keys) as capture, AttentionProbe([module]) as probe:
        routed = module(query, key, value, mask, expand)
    assert torch.equal(routed, shipped)
    torch.testing.assert_close(capture.masses()[:, 0], expected, rtol=0, atol=1e-6)
    assert probe.calls[0][1] < 1e-6
    bias = torch.zeros(2, 1, queries, keys)                   # SoFA: a bias that lets every query see every key
    with SofaMask([module], bias) as _, LastRowCapture([module], segments, keys) as capture:
        module(query, key, value, mask, expand)
    torch.testing.assert_close(capture.masses()[:, 0], scores.softmax(-1)[:, :, -1], rtol=0, atol=1e-6)
    calls = []
    original = attention.own_sdpa_forward
    monkeypatch.setattr(attention, "own_sdpa_forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    assert torch.equal(module(query, key, value, mask, expand), shipped) and not calls      # a decode step: as shipped


@pytest.mark.skipif("llava_ov15" not in FAMILIES, reason="the paper lane's family")
def test_the_ov15_stand_in_takes_only_its_own_kernel_table_as_the_hub_code_does(tiny_model):
    """The hub code's decoder layers look their attention class up in a table of their own, so the
    capture's name is a KeyError there; the stand-in does the same, so that the tiny model meets the
    route (own_attention_table) the real one needs."""
    from ladbench.models.attention import CAPTURE_ATTENTION
    from ladbench.models.llava_ov15 import LlavaOV15Adapter
    with pytest.raises(KeyError, match=CAPTURE_ATTENTION):
        LlavaOV15Adapter._load_model(tiny_model("llava_ov15"), text_impl=CAPTURE_ATTENTION, trust_remote_code=True)
