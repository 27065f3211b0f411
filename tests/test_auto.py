"""``family: auto`` (models/auto.py) on tiny offline builds of many architectures
(models/tiny_archs.py) and of the hand-written families (models/tiny.py), current lane only.

Every architecture passes what every family passes: the capture equals eager
``output_attentions`` (N = 4 and 8), a left-padded batch equals batch size 1, a KV-cache
continuation equals a re-forward, the greedy reply equals ``generate``, and each image's span
holds exactly its image's tokens. On the hand-written families' tiny builds, auto writes what
their adapters write.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest_models import TINY_IMAGE_SIZE, demo_runner, make_demo_benchmark
from ladbench.models import compat

pytestmark = [pytest.mark.slow, pytest.mark.current_lane("family auto runs on the current lane")]

if compat.on_current_lane():
    from ladbench.models.tiny_archs import BUILDS, FAMILY_BUILDS_AUTO_RUNS
    ARCHITECTURES = sorted(BUILDS)
else:
    BUILDS, ARCHITECTURES, FAMILY_BUILDS_AUTO_RUNS = {}, [], ()


@torch.no_grad()
def _eager_reference(eager, prepared, n):
    """Next-token logits [B, V], span masses [B, L, N] and the last row's whole mass [B, L]
    (1, less the share attention sinks absorb) from eager ``output_attentions``, on the very
    inputs (positions included) the fast path got."""
    out = eager.model(**prepared.inputs, output_attentions=True, use_cache=False, return_dict=True)
    attentions = [a for a in out.attentions if a is not None]
    segments = prepared.segments.numpy()
    mass = np.zeros((segments.shape[0], len(attentions), n))
    total = np.zeros((segments.shape[0], len(attentions)))
    for layer, att in enumerate(attentions):
        last_row = att[:, :, -1, :].double().numpy()                         # [B, H, T]
        total[:, layer] = last_row.sum(-1).mean(-1)
        for k in range(n):
            mass[:, layer, k] = (last_row * (segments == k)[:, None]).sum(-1).mean(-1)
    return out.logits[:, -1].float().numpy(), mass, total


def _check_capture_and_batching(adapter, eager, runner, n):
    """One left-padded batch: capture = eager ``output_attentions`` (masses within 1e-5, scores
    1e-4), and the batch = its rows one at a time (scores, masses, per-head masses, greedy replies)."""
    rows = [0, 3]                                      # different caption lengths: left padding
    prepared = runner.prepare(rows)
    assert (prepared.inputs["attention_mask"][:, 0] == 0).any(), "the batch should be left padded"
    batch = runner.score_batch(prepared)
    ref_logits, ref_mass, ref_total = _eager_reference(eager, prepared, n)
    digits = [adapter.tokenizer.convert_tokens_to_ids(str(i)) for i in range(1, n + 1)]
    assert batch["attn"].shape == (len(rows), len(adapter.attention_layers), n) == ref_mass.shape
    np.testing.assert_allclose(batch["attn"], ref_mass, atol=1e-5, rtol=0)
    np.testing.assert_allclose(batch["scores"], ref_logits[:, digits], atol=1e-4, rtol=0)
    # images + text = the whole row: 1, or less by the share attention sinks absorb (Inkling 2)
    assert (ref_total <= 1 + 1e-6).all()
    np.testing.assert_allclose(batch["attn"].sum(-1) + batch["attn_text"], ref_total, atol=1e-5)
    singles = [runner.score_batch([r]) for r in rows]
    for key, tol in (("scores", 1e-4), ("attn", 1e-5), ("attn_text", 1e-5), ("attn_heads", 2e-3)):
        np.testing.assert_allclose(batch[key], np.concatenate([s[key] for s in singles]), atol=tol, rtol=0,
                                   err_msg=key)
    np.testing.assert_array_equal(batch["greedy_tokens"], np.concatenate([s["greedy_tokens"] for s in singles]))
    return rows, batch["greedy_tokens"]


def _extended(adapter, inputs, tokens):
    """The prompt with ``tokens`` appended to every row, as ``generate`` extends it: the
    attention mask and the per-token type ids by the model's own
    ``_update_model_kwargs_for_generation`` (PaliGemma's generated tokens are type 1, its causal
    suffix; Gemma 3 repeats the last, text), positions recomputed by the model's own machinery."""
    from transformers.modeling_outputs import CausalLMOutputWithPast
    add = torch.tensor([list(tokens)] * inputs["input_ids"].shape[0], dtype=torch.long)
    kwargs = {key: value for key, value in inputs.items() if key not in ("input_ids", "position_ids")}
    kwargs = adapter.model._update_model_kwargs_for_generation(CausalLMOutputWithPast(), kwargs,
                                                               num_new_tokens=add.shape[1])
    return {"input_ids": torch.cat([inputs["input_ids"], add], 1),
            **{key: value for key, value in kwargs.items() if key in inputs}}


def _check_kv_continuation(adapter, runner):
    """KV-cache continuations (one and two tokens, several from one prefill) = full re-forwards."""
    inputs = runner.prepare([0, 3]).inputs                                      # left padded batch
    _, state = adapter.prefill(inputs, use_cache=True)
    tok = adapter.tokenizer.convert_tokens_to_ids
    for prefix in ([tok("1")], [tok("1"), tok("2")], [tok("3")]):           # one- and two-token continuations
        cont = adapter.continue_logits(state, prefix)
        extended = _extended(adapter, inputs, prefix)
        full, _ = adapter.prefill(adapter.to_device({**extended, **adapter.prefill_extras(extended)}), use_cache=False)
        assert torch.allclose(cont, full, atol=1e-4, rtol=0), (prefix, (cont - full).abs().max())
    assert state.past_key_values.get_seq_length() == inputs["input_ids"].shape[1]    # cache cropped back


def _check_greedy_reply(adapter, runner, rows, greedy_tokens):
    """The greedy reply of a batch's scoring pass = ``generate`` on each row alone (the
    repetition penalty's handling is the families' own: tests/test_greedy.py)."""
    for b, r in enumerate(rows):                                         # the reference: one row, generate()
        inputs = runner.encode_rows([r])
        generated = adapter.model.generate(**inputs, max_new_tokens=2, do_sample=False, num_beams=1,
                                           eos_token_id=adapter.end_token_ids())
        new = generated[0, inputs["input_ids"].shape[1]:].tolist()
        assert greedy_tokens[b, :len(new)].tolist() == new, (r, new)


def _decoder_inputs(adapter, inputs):
    """What the text decoder gets as its input embeddings [B, T, D] (image features scattered in)."""
    seen = {}
    decoder = adapter.model.get_decoder()
    def keep(_module, _args, kwargs):
        seen.setdefault("x", kwargs["inputs_embeds"])
    hook = decoder.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.no_grad():
            adapter.model(**inputs, use_cache=False)
    finally:
        hook.remove()
    return seen["x"]


def _check_spans(adapter, span_ends):
    """Spans of images of three sizes start and end with the tokens the layout puts there
    (``span_ends``), are disjoint and in order, and hold every feature token; changing one
    image changes the decoder's input only inside that image's span."""
    from PIL import Image
    rng = np.random.default_rng(0)
    noise = lambda w, h: Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))   # noqa: E731
    first, last = (adapter.tokenizer.convert_tokens_to_ids(t) for t in span_ends)
    text = adapter.chat_text("Which image? Answer: ", 3)
    inputs, (spans,) = adapter.encode_with_spans([text], [[noise(64, 48), noise(96, 96), noise(40, 80)]])
    ids = inputs["input_ids"][0].numpy()
    assert len(spans) == 3 and all(a < b <= c for (a, b), (c, _) in zip(spans, spans[1:] + [(len(ids), 0)]))
    assert [(ids[s], ids[e - 1]) for s, e in spans] == [(first, last)] * 3
    features = ids == adapter.image_token_id
    in_spans = np.zeros_like(features)
    for s, e in spans:
        in_spans[s:e] = True
        assert features[s:e].any()
    assert not (features & ~in_spans).any()
    images = [noise(64, 64) for _ in range(4)]
    base = _decoder_inputs(adapter, adapter.encode([text], [images[:3]]))
    for i in range(3):
        swapped = images[:3]
        swapped[i] = images[3]
        inputs, (spans,) = adapter.encode_with_spans([text], [swapped])
        changed = np.flatnonzero((_decoder_inputs(adapter, adapter.to_device(inputs)) - base).abs().amax(-1)[0] > 0)
        start, end = spans[i]
        assert len(changed) and changed.min() >= start and changed.max() < end, (i, spans, changed)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_architecture_passes_what_every_family_passes(arch, auto_adapter, tmp_path):
    """Capture = eager and batch = batch size 1 at N = 4 and 8, KV continuation = re-forward,
    greedy reply = generate, spans (one test per architecture: the model loads once)."""
    adapter, eager = auto_adapter(arch), auto_adapter(arch, "eager")
    runners = {n: demo_runner(adapter, tmp_path / f"N{n}", n, store_head_attention=True) for n in (4, 8)}
    greedy = {n: _check_capture_and_batching(adapter, eager, runner, n) for n, runner in runners.items()}
    _check_kv_continuation(adapter, runners[4])
    _check_greedy_reply(adapter, runners[4], *greedy[4])
    _check_spans(adapter, BUILDS[arch].span_ends)


#: norms of one weight and an epsilon that are not RMSNorms of the whole width: Cohere's centred
#: LayerNorm, Qwen3.5's gated norms (they need the gate) and a norm over groups of the width (Qwen4's
#: hyper-connection norm, ``group_size``); the probe leaves them as they are
NOT_RMS_NORMS = {"Cohere2LayerNorm", "Qwen3_5RMSNormGated", "Qwen3_5MoeRMSNormGated", "Qwen4ExpTextRMSNormGated"}


def _an_rms_norm(module) -> bool:
    return type(module).__name__ not in NOT_RMS_NORMS and getattr(module, "group_size", None) is None


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_architecture_scores_the_same_with_the_gpus_norms_and_last_row(arch, auto_adapter, tiny_arch_model, tmp_path,
                                                                       monkeypatch):
    """Two of a GPU's kernel choices forced on the CPU (models/kernels.py), on every architecture:
    every RMSNorm fused in its own formula (Gemma's and Qwen3.5's ``1 + weight`` included; a centred
    LayerNorm, a gated norm and a grouped one left as they are) and the captured last row with the query packed on the KV heads; the scores within
    1e-5 and the attention masses within 1e-6 of the same model's without them."""
    from ladbench.models import attention, kernels, load_adapter
    from ladbench.models.tiny_archs import given_chat_template
    before = demo_runner(auto_adapter(arch), tmp_path / "shipped", 4).score_batch([0, 3])
    monkeypatch.setattr(kernels, "fused_rms_norm_on", lambda device: True)
    monkeypatch.setattr(attention, "packs_on", lambda device: True)
    folder = tiny_arch_model(arch)
    adapter = load_adapter("auto", folder, device="cpu", dtype="float32", chat_template=given_chat_template(folder))
    norms = [m for m in adapter.model.modules() if kernels.rms_norm_epsilon(m) is not None]
    assert adapter.fused_norms == sum(map(_an_rms_norm, norms)) and norms
    after = demo_runner(adapter, tmp_path / "gpu", 4).score_batch([0, 3])
    np.testing.assert_allclose(after["scores"], before["scores"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(after["attn"], before["attn"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", FAMILY_BUILDS_AUTO_RUNS)
def test_auto_writes_the_family_adapters_cache(family, tiny_adapter, auto_adapter, tmp_path):
    """On a hand-written family's tiny build, ``family: auto`` writes the family adapter's
    cache: the same spans, scores and attention masses within 1e-5 (float32), greedy replies."""
    from ladbench.inference.cache import read_cache
    from ladbench.inference.runner import InferenceSettings, run_inference
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=2, n_orderings=2, n_cal=1)
    caches = {}
    for name, adapter in (("family", tiny_adapter(family)), ("auto", auto_adapter(family))):
        runner = demo_runner(adapter, tmp_path / name, 4)
        caches[name] = runner.prepare([0, 3, 4]).segments.numpy()
        out = str(tmp_path / f"{name}.h5")
        run_inference(InferenceSettings(benchmark=str(bench), images=str(images), out=out, model_name="tiny",
                                        family=adapter.family, model_path=adapter.model_path, device="cpu",
                                        dtype="float32", image_size=TINY_IMAGE_SIZE, batch_size=3))
        caches[name, "cache"] = read_cache(out)
    np.testing.assert_array_equal(caches["auto"], caches["family"])                  # the same spans
    auto, hand = caches["auto", "cache"], caches["family", "cache"]
    for key in ("scores", "attn", "attn_text"):
        np.testing.assert_allclose(auto.arrays[key], hand.arrays[key], atol=1e-5, rtol=0, err_msg=key)
    np.testing.assert_array_equal(auto.arrays["greedy_tokens"], hand.arrays["greedy_tokens"])


def test_hybrid_decoder_cache_records_its_attention_layers(tiny_arch_model, tmp_path):
    """LFM2-VL (convolution blocks with attention in some layers): the cache holds the attention
    layers only and says which decoder layers they are."""
    from ladbench.inference.cache import read_cache
    from ladbench.inference.runner import InferenceSettings, run_inference
    bench, images = make_demo_benchmark(tmp_path, 4)
    out = str(tmp_path / "hybrid.h5")
    run_inference(InferenceSettings(benchmark=str(bench), images=str(images), out=out, model_name="tiny", family="auto",
                                    model_path=tiny_arch_model("lfm2_vl"), device="cpu", dtype="float32",
                                    image_size=TINY_IMAGE_SIZE, batch_size=4))
    cache = read_cache(out)
    assert cache.attrs["attention_layers"] == [1] and cache.attrs["n_layers"] == 1
    assert cache.arrays["attn"].shape[1:] == (1, 4)


@pytest.mark.parametrize("arch, end_of_turn", [("gemma3", "<end_of_turn>"), ("aya_vision", "<|END_OF_TURN_TOKEN|>"),
                                               ("glm4v", "<|user|>"), ("llava", "<|im_end|>")])
def test_end_of_turn_from_the_template_else_the_generation_config(arch, end_of_turn, auto_adapter):
    """The token the chat template writes after an assistant message (Gemma 3, Aya); GLM's and
    LLaVA-1.5's templates write none: the generation config's first end-of-sequence token."""
    adapter = auto_adapter(arch)
    assert adapter.tokenizer.convert_ids_to_tokens(adapter.end_of_turn_id) == end_of_turn
    assert adapter.end_of_turn_id in adapter.end_token_ids()
