"""The GPU's kernel choices (models/kernels.py): the patch embedding as a matrix product equals
the convolution in float32, a gated MLP padded to an aligned width its output as shipped, and an
RMSNorm normalised by torch's fused kernel transformers' norm; each is taken only where it
applies, and leaves the CPU's bits alone.
And the attention masks the host decides (``ModelAdapter.kernel_mask``): transformers' own, on
every device, without reading the padding mask back."""
from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest_models import FAMILIES
from ladbench.models import kernels
from ladbench.models.attention import sdpa_kernel_mask
from ladbench.models.base import PADDED_KEY
from test_attention_equivalence import _runner


def _conv(out: int, patch: int, bias: bool, **kw) -> torch.nn.Conv3d:
    torch.manual_seed(0)
    kernel = (2, patch, patch)
    return torch.nn.Conv3d(3, out, kernel_size=kernel, stride=kw.pop("stride", kernel), bias=bias, **kw)


@pytest.fixture
def conv_calls(monkeypatch) -> collections.Counter:
    """How often a Conv3d runs its convolution (``_conv_forward``)."""
    calls: collections.Counter = collections.Counter()
    convolve = torch.nn.Conv3d._conv_forward

    def counted(self, *args, **kwargs):
        calls["conv3d"] += 1
        return convolve(self, *args, **kwargs)
    monkeypatch.setattr(torch.nn.Conv3d, "_conv_forward", counted)
    return calls


# Qwen2.5-VL's shape (patch 14, no bias) and Qwen3-VL's (patch 16, a bias), narrow outputs
@pytest.mark.parametrize("patch, bias", [(14, False), (16, True)])
def test_patch_embedding_as_linear_equals_the_convolution(patch, bias):
    conv = _conv(48, patch, bias)
    pixels = torch.randn(37, 3, 2, patch, patch)
    with torch.no_grad():
        want, got = conv(pixels), kernels.patch_embedding_as_linear(conv, pixels)
    assert got.shape == want.shape == (37, 48, 1, 1, 1)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=1e-5)


def test_only_convolutions_into_disjoint_patches_are_patch_embeddings():
    assert kernels.is_patch_embedding(_conv(8, 14, False))
    assert not kernels.is_patch_embedding(_conv(8, 14, False, stride=(1, 14, 14)))       # overlapping in time
    assert not kernels.is_patch_embedding(_conv(8, 14, False, padding=1))
    assert not kernels.is_patch_embedding(_conv(8, 14, False, padding="valid"))
    assert not kernels.is_patch_embedding(_conv(8, 14, False, dilation=(1, 2, 2)))
    assert not kernels.is_patch_embedding(torch.nn.Conv3d(4, 8, kernel_size=2, stride=2, groups=2))
    assert not kernels.is_patch_embedding(torch.nn.Conv2d(3, 8, kernel_size=14, stride=14))   # SigLIP's, InternViT's


def test_the_patch_embedding_is_a_matrix_product_on_a_gpu_only(monkeypatch, conv_calls):
    """On the CPU the convolution runs as before, bit for bit; with the GPU's rule (forced) one
    patch per row is a matrix product and no convolution runs, several patches a row stay one."""
    reference, conv = _conv(16, 14, True), _conv(16, 14, True)
    model = torch.nn.Sequential(conv, torch.nn.Conv3d(3, 4, kernel_size=3, padding=1))
    assert kernels.use_linear_patch_embedding(model) == 1
    one, several = torch.randn(9, 3, 2, 14, 14), torch.randn(2, 3, 4, 28, 28)
    with torch.no_grad():
        want_one, want_several = reference(one), reference(several)
        conv_calls.clear()
        assert torch.equal(conv(one), want_one) and conv_calls["conv3d"] == 1
        monkeypatch.setattr(kernels, "linear_patch_embedding_on", lambda device: True)
        np.testing.assert_allclose(conv(one).numpy(), want_one.numpy(), atol=1e-5, rtol=1e-5)
        assert conv_calls["conv3d"] == 1
        assert torch.equal(conv(several), want_several) and conv_calls["conv3d"] == 2


@pytest.mark.slow
@pytest.mark.lanes
@pytest.mark.parametrize("family", [f for f in ("qwen2_5_vl", "llava_ov15", "qwen3_vl") if f in FAMILIES])
def test_a_qwen_tower_scores_the_same_with_its_patch_embedding_as_a_matrix_product(
        family, tiny_adapter, tmp_path, monkeypatch, conv_calls):
    """Through a whole scoring batch (either tower: ours on the paper lane, transformers' on the
    current one): scores and attention masses equal within float32 noise, no convolution run;
    the eager reference path keeps its convolution."""
    adapter = tiny_adapter(family)
    assert adapter.linear_patch_embeddings == 1 and tiny_adapter(family, "eager").linear_patch_embeddings == 0
    runner = _runner(adapter, tmp_path, 4, family)
    before = runner.score_batch([0, 3])
    assert conv_calls["conv3d"] == 1
    monkeypatch.setattr(kernels, "linear_patch_embedding_on", lambda device: True)
    after = runner.score_batch([0, 3])
    assert conv_calls["conv3d"] == 1
    np.testing.assert_allclose(after["scores"], before["scores"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(after["attn"], before["attn"], atol=1e-5, rtol=0)


class _GatedMLP(torch.nn.Module):
    """``down(act(gate(x)) * up(x))``, transformers' gated MLP."""

    def __init__(self, hidden: int, width: int, bias: bool, act=torch.nn.functional.silu) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = (torch.nn.Linear(hidden, width, bias=bias) for _ in range(2))
        self.down_proj = torch.nn.Linear(width, hidden, bias=bias)
        self.act = act

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


@pytest.fixture
def padding_on_the_cpu(monkeypatch):
    monkeypatch.setattr(kernels, "mlp_padding_on", lambda device: True)


# Qwen2.5-VL's vision MLP is 3,420 wide (biases, SiLU); 37 units here, with and without biases,
# and an activation that is not 0 at 0 (the down projection's zero columns still cancel it)
@pytest.mark.parametrize("bias, act", [(True, torch.nn.functional.silu), (False, torch.nn.functional.gelu),
                                       (True, torch.cos)])
def test_a_gated_mlp_padded_with_zero_units_gives_the_same_output(bias, act, padding_on_the_cpu):
    torch.manual_seed(0)
    mlp = _GatedMLP(16, 37, bias, act).double()
    x = torch.randn(23, 16, dtype=torch.float64)
    with torch.no_grad():
        want = mlp(x)
        assert kernels.pad_unaligned_mlps(mlp) == 1
        got = mlp(x)
    assert (mlp.gate_proj.weight.shape, mlp.up_proj.out_features, mlp.down_proj.weight.shape) == ((64, 16), 64, (16, 64))
    assert mlp.gate_proj.bias is None or mlp.gate_proj.bias.shape == (64,)
    torch.testing.assert_close(got, want, atol=1e-13, rtol=0)
    assert kernels.pad_unaligned_mlps(mlp) == 0                       # aligned now: nothing more to do


def test_only_unaligned_plain_gated_mlps_are_padded_and_only_on_a_gpu(monkeypatch):
    """An aligned width stays; so does a mixture of experts (a router beside the projections),
    a projection that is not a plain Linear, and, on the CPU, everything (its bits are the
    reference's)."""
    unaligned, aligned = _GatedMLP(8, 36, True), _GatedMLP(8, 40, True)
    routed = _GatedMLP(8, 36, False)
    routed.router = torch.nn.Linear(8, 4)
    subclassed = _GatedMLP(8, 36, False)
    subclassed.up_proj = type("QuantLinear", (torch.nn.Linear,), {})(8, 36)
    model = torch.nn.ModuleList([unaligned, aligned, routed, subclassed])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert kernels.pad_unaligned_mlps(model) == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    monkeypatch.setattr(kernels, "mlp_padding_on", lambda device: True)
    assert kernels.pad_unaligned_mlps(model) == 1 and unaligned.down_proj.in_features == 64
    assert [m.gate_proj.out_features for m in model] == [64, 40, 36, 36]


@pytest.mark.slow
@pytest.mark.lanes
@pytest.mark.parametrize("family", [f for f in ("qwen2_5_vl", "internvl") if f in FAMILIES])
def test_a_model_scores_the_same_with_its_mlps_padded(family, tiny_adapter, tiny_model, tmp_path, padding_on_the_cpu):
    """Through a whole scoring batch: every gated MLP of a tiny model (its tower's and its
    decoder's) padded to other widths, as a GPU pads an unaligned one; scores and attention masses
    equal within float32 noise. A model loaded with the GPU's rule pads nothing it need not."""
    from ladbench.models import load_adapter

    before = _runner(tiny_adapter(family), tmp_path, 4, family).score_batch([0, 3])
    adapter = load_adapter(family, tiny_model(family), device="cpu", dtype="float32")
    assert adapter.padded_mlps == 0                                   # the tiny widths are aligned
    widths = {m.gate_proj.out_features for m in adapter.model.modules() if kernels.gated_mlp(m)}
    padded = kernels.pad_unaligned_mlps(adapter.model, aligned=1024, multiple=96)
    assert padded >= 3 and {m.gate_proj.out_features for m in adapter.model.modules() if kernels.gated_mlp(m)} == {
        kernels.round_up(w, 96) for w in widths} and not widths & {96, 192}
    after = _runner(adapter, tmp_path, 4, family).score_batch([0, 3])
    np.testing.assert_allclose(after["scores"], before["scores"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(after["attn"], before["attn"], atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_ov15"])
def test_a_model_scores_the_same_with_its_vision_blocks_compiled(family, tiny_adapter, tiny_model, tmp_path):
    """``vision_tower: compiled`` through a whole scoring batch with the capture (and, for
    LLaVA-OV-1.5's hub decoder, the capture's routing of its own SDPA calls): scores and attention
    masses within float32 noise of the batched tower's. Paper lane: the current one runs
    transformers' tower, compiled or not."""
    from ladbench.models import compat, load_adapter
    if not compat.batched_vision_supported():
        pytest.skip("the current lane runs transformers' own vision tower")
    before = _runner(tiny_adapter(family), tmp_path, 4, family).score_batch([0, 3])
    adapter = load_adapter(family, tiny_model(family), device="cpu", dtype="float32", vision="compiled",
                           trust_remote_code=family == "llava_ov15")
    after = _runner(adapter, tmp_path, 4, family).score_batch([0, 3])
    np.testing.assert_allclose(after["scores"], before["scores"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(after["attn"], before["attn"], atol=1e-5, rtol=0)
    assert after["greedy_tokens"].tolist() == before["greedy_tokens"].tolist()


def _qwen_rms_norm(width: int, dtype: torch.dtype = torch.float32, eps: float = 1e-6) -> torch.nn.Module:
    """transformers' RMSNorm (Qwen2's: float32, rounded back, then the weight), random weight."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    norm = Qwen2RMSNorm(width, eps=eps).to(dtype)
    with torch.no_grad():
        norm.weight.normal_()
    return norm


def _gemma_rms_norm(width: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """transformers' Gemma 3 RMSNorm (``1 + weight`` in float32, then one rounding), random weight."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    norm = Gemma3RMSNorm(width).to(dtype)
    with torch.no_grad():
        norm.weight.normal_()
    return norm


class _ScaledInFloat32(torch.nn.Module):
    """Gemma 4's RMSNorm (transformers 5.x only): the weight applied in float32, then one rounding."""

    def __init__(self, width: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width).to(dtype))
        self.eps = 1e-6

    def forward(self, x):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).type_as(x)


#: a norm of each formula (``kernels.RMS_NORM_FORMULAS``) and the offset the probe must find
NORMS_BY_FORMULA = {"qwen": (_qwen_rms_norm, None), "gemma": (_gemma_rms_norm, 1.0),
                    "weight in float32": (_ScaledInFloat32, 0.0)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", NORMS_BY_FORMULA)
def test_each_norm_is_fused_in_its_own_formula_with_its_bits_on_the_cpu(kind, dtype, monkeypatch):
    """Normalised in one kernel, in float32, then the weight as the module applies it (after the
    rounding, or in float32 before it, Gemma's ``1 + weight`` included): on the CPU the very bits
    of the module's own forward, rows of magnitudes 1e-3 to 1e2 (where the epsilon dominates and
    where it does not). In bfloat16 the probe tells the two roundings apart (in float32 they are
    one: the first formula). On a GPU only the order of the sum of squares may differ."""
    torch.manual_seed(0)
    build, offset = NORMS_BY_FORMULA[kind]
    norm = build(96, dtype)
    x = (torch.randn(5, 7, 96) * torch.logspace(-3, 2, 7)[:, None]).to(dtype)
    with torch.no_grad():
        want = norm(x)
        found = kernels.rms_norm_formula(norm)
        assert found.offset == (None if dtype == torch.float32 and offset == 0.0 else offset)
        monkeypatch.setattr(kernels, "fused_rms_norm_on", lambda device: True)
        assert kernels.use_fused_rms_norms(norm) == 1
        assert torch.equal(norm(x), want)


class _OtherEpsilon(torch.nn.Module):
    """An RMSNorm whose attribute says one epsilon and whose forward uses another."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


class _NormWithResidual(torch.nn.Module):
    """A fused add-and-norm: takes a residual and returns the norm and the sum."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width))
        self.eps = 1e-6

    def forward(self, x, residual=None):
        x = x if residual is None else x + residual
        return kernels.fused_rms_norm(x, self.weight, self.eps), x


def test_only_rms_norms_are_fused_and_only_on_a_gpu(monkeypatch):
    """The probe, not the name or the shape, decides: a centred LayerNorm of one weight and an
    epsilon, an epsilon other than the attribute's and an add-and-norm that returns two tensors all
    look like RMSNorms and stay as they are; so does everything on the CPU."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"qwen": _qwen_rms_norm(16), "gemma": _gemma_rms_norm(16),
                                 "centred": torch.nn.LayerNorm(16, bias=False),
                                 "other_epsilon": _OtherEpsilon(16), "with_residual": _NormWithResidual(16)})
    assert all(kernels.rms_norm_epsilon(model[name]) is not None for name in model)
    x = torch.randn(4, 16) * 1e-3
    with torch.no_grad():
        before = {name: module(x) for name, module in model.items()}
        assert kernels.use_fused_rms_norms(model) == 0
        monkeypatch.setattr(kernels, "fused_rms_norm_on", lambda device: True)
        assert kernels.use_fused_rms_norms(model) == 2
        assert [name for name, m in model.items() if "forward" in m.__dict__] == ["qwen", "gemma"]
        for name, module in model.items():
            torch.testing.assert_close(module(x), before[name], atol=1e-6, rtol=1e-6)


def test_a_norm_accelerate_hooked_keeps_its_hook_when_fused(monkeypatch):
    """A model spread over several GPUs (``device_map="auto"``) has accelerate's hooks on some
    modules, which move the inputs to the module's device before its forward: the fused norm runs
    under the hook, not instead of it (likewise the patch embedding: ``replace_forward``)."""
    from accelerate.hooks import ModelHook, add_hook_to_module

    class Counting(ModelHook):
        calls = 0

        def pre_forward(self, module, *args, **kwargs):
            Counting.calls += 1
            return args, kwargs
    torch.manual_seed(0)
    norm = _qwen_rms_norm(16)
    add_hook_to_module(norm, Counting())
    monkeypatch.setattr(kernels, "fused_rms_norm_on", lambda device: True)
    assert kernels.use_fused_rms_norms(norm) == 1
    Counting.calls = 0
    with torch.no_grad():
        norm(torch.randn(3, 16))
    assert Counting.calls == 1 and norm._old_forward.__func__ is kernels._fused_rms_norm_forward


@pytest.mark.slow
@pytest.mark.lanes
@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_scores_the_same_with_its_rms_norms_fused_and_its_last_row_on_the_kv_heads(
        family, tiny_model, tmp_path, monkeypatch):
    """Through a whole scoring batch with the capture, two of a GPU's kernel choices forced on the
    CPU: every RMSNorm of a tiny model (its tower's, its decoder's, Qwen3's per-head ones) fused,
    and the captured last row (and the one-token continuations) with the query packed on the KV
    heads. Scores and attention masses equal within float32 noise, the same greedy tokens."""
    from ladbench.models import attention, load_adapter

    def loaded():
        return load_adapter(family, tiny_model(family), device="cpu", dtype="float32",
                            trust_remote_code=family == "llava_ov15")
    shipped = loaded()
    assert shipped.fused_norms == 0
    before = _runner(shipped, tmp_path, 4, family).score_batch([0, 3])
    monkeypatch.setattr(kernels, "fused_rms_norm_on", lambda device: True)
    monkeypatch.setattr(attention, "packs_on", lambda device: True)
    adapter = loaded()
    norms = [m for m in adapter.model.modules() if kernels.rms_norm_epsilon(m) is not None]
    assert adapter.fused_norms == len(norms) >= 3
    after = _runner(adapter, tmp_path, 4, family).score_batch([0, 3])
    np.testing.assert_allclose(after["scores"], before["scores"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(after["attn"], before["attn"], atol=1e-6, rtol=0)
    assert after["greedy_tokens"].tolist() == before["greedy_tokens"].tolist()


def test_sdpa_without_cudnn_is_every_backend_but_cudnns_for_the_block():
    """``attention_backends(cudnn=False)``: cuDNN's attention off inside the block, the others as
    they were, and everything as before after it; ``cudnn=True`` touches nothing."""
    cuda = torch.backends.cuda
    flags = (cuda.cudnn_sdp_enabled, cuda.flash_sdp_enabled, cuda.mem_efficient_sdp_enabled, cuda.math_sdp_enabled)
    before = [flag() for flag in flags]
    assert before[0]                                            # torch's default: cuDNN in the choice
    with kernels.attention_backends(cudnn=True):
        assert [flag() for flag in flags] == before
    with kernels.attention_backends(cudnn=False):
        assert [flag() for flag in flags] == [False, *before[1:]]
    assert [flag() for flag in flags] == before


@pytest.mark.parametrize("prompt", ["vanilla", "cot"])
def test_the_runner_leaves_cudnn_out_of_the_models_work_when_asked(prompt, tiny_adapter, tmp_path):
    """``inference.cudnn_attention: false``: every decoder forward of a scoring batch (prefill and
    continuations) and of the decode loop runs with cuDNN's attention out of SDPA's choice, and only
    those; on the CPU (no cuDNN attention) the results are the same."""
    import dataclasses

    from conftest_models import demo_runner
    from ladbench.variants import variant
    adapter = tiny_adapter("qwen2_5_vl")
    options = dataclasses.replace(variant(prompt).options(), max_new_tokens=6) if prompt == "cot" else None
    seen: dict[bool, set[bool]] = {True: set(), False: set()}
    results = {}
    for cudnn in (True, False):
        hook = adapter.decoder_layers()[0].register_forward_pre_hook(
            lambda module, args, cudnn=cudnn: seen[cudnn].add(torch.backends.cuda.cudnn_sdp_enabled()))
        try:
            runner = demo_runner(adapter, tmp_path / str(cudnn), 4, prompt=prompt, options=options,
                                 cudnn_attention=cudnn)
            prepared = runner.prepare([0, 3])
            results[cudnn] = runner.score_batch(prepared) if prompt == "vanilla" else runner.generate_batch(prepared)
        finally:
            hook.remove()
    assert seen == {True: {True}, False: {False}} and torch.backends.cuda.cudnn_sdp_enabled()
    for key, value in results[True].items():
        np.testing.assert_array_equal(results[False][key], value, err_msg=key)


class _Dispatched(TorchDispatchMode):
    """Counts the aten operations dispatched, by name (``aten.cat``); ``host_reads``: reads of a
    tensor's value by the host (``.item()``, ``bool()``: aten's local scalar)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def host_reads(self) -> int:
        return self.ops["aten._local_scalar_dense"]


@pytest.mark.slow
@pytest.mark.lanes
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("rows", [[0, 3], [0]], ids=["left-padded", "one-row"])
def test_the_host_decides_the_kernel_mask_as_transformers_would(family, rows, tiny_adapter, tmp_path):
    """A prefill and its continuations (one token: the greedy reply's second; two: a two-token
    identifier), with and without the host's word on the padding: the masks the decoder's
    attention gets are equal (None where transformers drops it), so are the logits, bit for bit;
    with it, transformers reads nothing back to decide (fewer reads in the prefill, none in a
    continuation, where the one-token one read once before)."""
    adapter = tiny_adapter(family)
    assert adapter.takes_kernel_mask and not tiny_adapter(family, "eager").takes_kernel_mask
    host = _runner(adapter, tmp_path, 4, family).prepare(rows).inputs
    assert host[PADDED_KEY] is (len(rows) > 1) is bool((host["attention_mask"] == 0).any())
    with torch.no_grad():                       # Qwen2.5-VL's tower builds its plan for these grids (host reads)
        adapter.prefill(adapter.to_device(host, for_prefill=True), use_cache=False)
    runs = {}
    for decided in (False, True):
        inputs = adapter.to_device({k: v for k, v in host.items() if decided or k != PADDED_KEY}, for_prefill=True)
        masks: list = []
        hook = adapter.attention_modules()[0].register_forward_pre_hook(
            lambda module, args, kwargs, masks=masks: masks.append(kwargs.get("attention_mask")), with_kwargs=True)
        try:
            with torch.no_grad(), _Dispatched() as reads:
                logits, state = adapter.prefill(inputs, use_cache=True)
                in_prefill = reads.host_reads
                one = adapter.continue_logits(state, torch.tensor([[17]] * len(rows)))
                two = adapter.continue_logits(state, torch.tensor([[17, 23]] * len(rows)))
        finally:
            hook.remove()
        runs[decided] = (logits, one, two), masks, in_prefill, reads.host_reads - in_prefill
    (want, want_masks, prefill_reads, continuation_reads), (got, got_masks, prefill_reads_now, continuation_reads_now) = (
        runs[False], runs[True])
    assert all(torch.equal(w, g) for w, g in zip(want, got))
    assert len(want_masks) == len(got_masks) == 3
    for w, g in zip(want_masks, got_masks):
        assert (w is None and g is None) or (w is not None and g is not None and torch.equal(w, g)), (w, g)
    assert (want_masks[0] is None) is (len(rows) == 1)                  # no padding: the kernel's causal rule
    assert prefill_reads_now < prefill_reads              # (4.53 reads the mask once, 5.x twice when padded)
    assert continuation_reads == 1 and continuation_reads_now == 0


def test_the_kernel_mask_sees_real_keys_up_to_each_query():
    """Hand-computed: two queries at positions 3 and 4 of five keys, the first key padding."""
    mask = sdpa_kernel_mask(torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]), 2, padded=True)
    assert mask.shape == (2, 1, 2, 5) and mask.dtype == torch.bool
    assert mask[0, 0].int().tolist() == [[0, 1, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert mask[1, 0].int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    full = torch.ones(1, 5, dtype=torch.long)
    assert sdpa_kernel_mask(full, 1, padded=False) is None and sdpa_kernel_mask(full, 5, padded=False) is None
    assert sdpa_kernel_mask(full, 2, padded=False)[0, 0].int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_a_decoder_shipped_with_a_checkpoint_keeps_the_2d_mask(tiny_adapter, monkeypatch):
    """Hub code may build its masks its own way (an older one adds a 4-D mask as numbers): its
    prefill and continuations get the 2-D padding mask, and transformers' or the hub code's own
    decision, whatever the host knows."""
    adapter = tiny_adapter("qwen2_5_vl")
    shipped = type("ShippedAttention", (torch.nn.Module,), {"__module__": "transformers_modules.ckpt.modeling"})
    monkeypatch.setattr(adapter, "attention_modules", lambda: [shipped()])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert not adapter.takes_kernel_mask
    assert adapter.kernel_mask(mask, 3, padded=True) is mask and adapter.kernel_mask(mask, 1, padded=False) is mask


def _rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]), dim=-1)


def _transformers_rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """transformers' ``apply_rotary_pos_emb`` (a partial rotary width rotates the first channels)."""
    cos, sin, width = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim), cos.shape[-1]
    return tuple(torch.cat([x[..., :width] * cos + _rotate_half(x[..., :width]) * sin, x[..., width:]], dim=-1)
                 for x in (q, k))


def test_the_roll_rotation_keeps_transformers_bits_and_leaves_other_layouts_to_it():
    """The roll with the signed sine is transformers' rotation bit for bit in every dtype; the
    wrapped function rotates so only on the rewritten embedding's layout (cos [B, 1, T, d]) and
    hands every other call (3-D tables, a partial rotary width, other arguments) to the model's
    own function; a function that rotates another way (GPT-J's interleaved pairs) is not rewritten."""
    from ladbench.models import rotary
    generator = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        states = torch.randn(3, 7, 4, 16, generator=generator).to(dtype)
        cos, sin = (torch.randn(3, 7, 16, generator=generator).to(dtype) for _ in range(2))
        # a prefill's transposed states (concatenated halves) and contiguous ones (torch.roll)
        for q in (states.transpose(1, 2), states.transpose(1, 2).contiguous()):
            assert torch.equal(rotary.rotate(q, cos[:, None], rotary.signed_sin(sin)[:, None]),
                               q * cos[:, None] + _rotate_half(q) * sin[:, None])
    assert rotary.rotates_as_roll(_transformers_rope)
    # the batched vision tower's rotation (models/vision.py): transformers' vision function's bits
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision
    for dtype in (torch.float32, torch.bfloat16):
        qkv = torch.randn(11, 3, 2, 16, generator=generator).to(dtype)     # [patches, q/k/v, heads, head dim]
        q, k, _ = qkv.unbind(1)
        cos, sin = (torch.randn(11, 16, generator=generator) for _ in range(2))
        tables = (cos[:, None], rotary.signed_sin(sin)[:, None])
        ours = [rotary.rotate(x.float(), *tables).to(x.dtype) for x in (q, k)]
        assert all(torch.equal(a, b) for a, b in zip(ours, apply_rotary_pos_emb_vision(q, k, cos, sin)))

    def interleaved(q, k, cos, sin, unsqueeze_dim=1):
        def pairs(x):
            return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + pairs(q) * sin, k * cos + pairs(k) * sin
    assert not rotary.rotates_as_roll(interleaved)
    assert not rotary.rotates_as_roll(lambda q, k, cos, sin, section: (q, k))      # another signature

    rolled = rotary._rolling(_transformers_rope)
    q, k = (torch.randn(2, 3, 5, 12, generator=generator) for _ in range(2))
    cos, sin = (torch.randn(2, 5, 12, generator=generator) for _ in range(2))
    laid_out = (cos[:, None], rotary.signed_sin(sin)[:, None])
    expected = _transformers_rope(q, k, cos, sin)
    for got in (rolled(q, k, cos, sin), rolled(q, k, *laid_out), rolled(q, k, *laid_out, None),
                rolled(q, k, *laid_out, unsqueeze_dim=1)):
        assert all(torch.equal(g, e) for g, e in zip(got, expected))
    partial = (cos[..., :8], sin[..., :8])                         # rotary on 8 of 12 channels
    got = rolled(q, k, partial[0][:, None], rotary.signed_sin(partial[1])[:, None])
    assert all(torch.equal(g, e) for g, e in zip(got, _transformers_rope(q, k, *partial)))
    heads_last = (q.transpose(1, 2), k.transpose(1, 2))            # [B, T, H, d], unsqueezed at 2
    got = rolled(*heads_last, *laid_out, unsqueeze_dim=2)
    assert all(torch.equal(g, e) for g, e in zip(got, _transformers_rope(*heads_last, cos, sin, unsqueeze_dim=2)))


class _RotatingAttention(torch.nn.Module):
    def forward(self, q, k, cos, sin):
        return _transformers_rope(q, k, cos, sin)


def test_a_rotary_function_is_wrapped_only_where_the_layers_call_it_by_that_name():
    """A rewrite wraps a modeling module's global function: only where a module of the decoder
    looks that name up in its forward (another transformers release may rotate elsewhere)."""
    from ladbench.models.rotary import calls_by_name
    decoder = torch.nn.Sequential(torch.nn.Linear(2, 2), _RotatingAttention())
    assert calls_by_name(decoder, "_transformers_rope")
    assert not calls_by_name(decoder, "apply_rotary_pos_emb") and not calls_by_name(decoder[0], "_transformers_rope")


def _rotation_ops_fewer(family: str, layers: int, positions: int) -> dict[str, int]:
    """How many operations of one decoder forward over ``positions`` the rotary rewrites save,
    counted by hand."""
    from ladbench.models import compat
    # every family: rotate_half's negation for q and for k in every layer, against the embedding's
    # signed sine (a negation and a concatenation) once; the halves swapped by one concatenation
    # where the states are a prefill's (transposed), by torch.roll where a single position's are
    # contiguous (rotate_half's concatenation goes)
    one = positions == 1
    fewer = {"aten.cat": (2 * layers if one else 0) - 1, "aten.neg": 2 * layers - 1,
             "aten.roll": -2 * layers if one else 0, "aten.split_with_sizes": 0}
    if family == "qwen2_5_vl" and not compat.on_current_lane():
        # and 4.53's M-RoPE layout of cos and of sin (a split and a concatenation) in every layer,
        # against the embedding's once (5.x lays them out once itself)
        fewer["aten.split_with_sizes"] += 2 * layers - 2
        fewer["aten.cat"] += 2 * layers - 2
    return fewer


@pytest.mark.slow
@pytest.mark.lanes
@pytest.mark.parametrize("family", FAMILIES)
def test_the_rotary_rewrites_give_the_very_same_bits_in_fewer_operations(family, tiny_adapter, tiny_model, tmp_path,
                                                                         monkeypatch):
    """Every family's decoder rotates q and k with the halves swapped in one kernel and the sine
    signed once per forward (models/rotary.py), and transformers 4.53's Qwen2.5-VL has its M-RoPE
    tables laid out once per forward instead of in every layer. A prefill's and a decode step's
    decoder forward, their operations counted by hand; their hidden states, and a whole scoring
    batch's scores, attention masses and greedy replies, the same bits as the model's own code
    gives (the rewrites off: the shipped adapter)."""
    from ladbench.models import load_adapter
    rewritten = tiny_adapter(family)
    assert rewritten.exact_rewrites_made == 1
    monkeypatch.setattr(type(rewritten), "exact_rewrites", lambda self: 0)
    shipped = load_adapter(family, tiny_model(family), device="cpu", dtype="float32",
                           trust_remote_code=family == "llava_ov15")
    torch.manual_seed(0)
    for length in (9, 1):                          # a prefill's positions, and a decode step's one
        embeds = torch.randn(2, length, rewritten.text_config.hidden_size)
        positions = torch.arange(length).expand(2, length)
        if family in ("qwen2_5_vl", "qwen3_vl"):
            positions = positions.expand(3, 2, length) + torch.tensor([0, 1, 2])[:, None, None]     # axes apart
        hidden, counts = {}, {}
        for name, adapter in (("rewritten", rewritten), ("shipped", shipped)):
            with torch.no_grad(), _Dispatched() as counted:
                hidden[name] = adapter.model.model.language_model(inputs_embeds=embeds, position_ids=positions,
                                                                  use_cache=False).last_hidden_state
            counts[name] = counted.ops
        assert torch.equal(hidden["rewritten"], hidden["shipped"])
        for op, fewer in _rotation_ops_fewer(family, rewritten.text_config.num_hidden_layers, length).items():
            assert counts["shipped"][op] - counts["rewritten"][op] == fewer, (length, op)
    before = _runner(shipped, tmp_path / "shipped", 4, family).score_batch([0, 3])
    after = _runner(rewritten, tmp_path / "rewritten", 4, family).score_batch([0, 3])
    for key in ("scores", "attn", "greedy_tokens"):
        assert np.array_equal(after[key], before[key]), key
