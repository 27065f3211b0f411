"""Kernel choices made on a GPU only: computations transformers runs one way, run another way
that is equal in exact arithmetic and cheaper there.

On the CPU transformers' own operations run: the paper lane's float32 bits are the reference
(pinned scoring caches, CoT and SC replies equal to earlier runs), and a choice here may
change them in the last place. On a GPU, bfloat16 kernels differ from the reference's eager
path anyway (docs/performance.md, "Fidelity on a GPU"), and these choices are tested for equality in float32.

* :func:`on_gpu_kernels`: the devices they are made on (one rule; each choice has its own
  switch below, which tests set to run the GPU's path on the CPU).
* The one query position on the KV heads (decode steps, the capture's last row):
  ``models/attention.py``, ``packs_on``.
* The patch embedding as a matrix product (:func:`use_linear_patch_embedding`): a ``Conv3d``
  whose stride is its kernel (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V and others cut the images
  into patches on the host and hand the tower one patch per row, [patches, C, T, P, P]) computes
  one dot product per patch and output channel, a matrix product. cuDNN has no good algorithm
  for that shape on some GPU, dtype and version combinations (public reports: about 13x slower
  than the matrix product on an H20, seconds per call for Qwen3-VL in bfloat16 on an H100 with
  some cuDNN releases, far worse on Blackwell), which the tower would pay on every batch.
* Gated MLPs padded to an aligned hidden width (:func:`pad_unaligned_mlps`): a bfloat16 matrix
  product with a width that is not a multiple of 8 elements (16 bytes) falls back to kernels
  that load a few elements at a time. Qwen2.5-VL's vision MLP is 3,420 wide (every size, 32
  blocks): in the H200 trace of a scoring batch (benchmarks/results/h200-2026-11-27, N = 4,
  batch 8: 18,432 patches) its gate and up products ran cutlass's ``align2`` kernels at 0.64 ms
  a call and its down product at 0.77 ms, 252 and 208 TFLOP/s (a quarter of that GPU's dense
  bfloat16 peak): 66 of the batch's 233 ms on the GPU. ``benchmarks/bench_aligned_widths.py`` times
  the MLP as shipped against padded widths. Zero units added to the hidden layer change nothing
  in exact arithmetic: their gate and up outputs are 0 (zero weights and biases), ``act(0) * 0``
  is 0, and the down projection's columns for them are 0.
* RMSNorms normalised by torch's fused kernel (:func:`use_fused_rms_norms`): transformers' RMSNorm
  is six to eight operations, each a pass over the activations (the cast to float32, the square,
  the mean, the epsilon, the reciprocal root, the product, the cast back; then the weight). In the
  H200 trace of a scoring batch (N = 4, batch 8) casts, products, squares and means (the norms',
  and the rotary embedding's products) are 25 of the decoder's 35 ms of elementwise kernels,
  beside its 42 ms of matrix products, and a Qwen2.5-VL-3B forward runs 138 norms (two in each of
  36 decoder layers and 32 vision blocks, the merger's and the final one). ``torch.rms_norm``
  normalises in one kernel, in float32, and rounds once to the input's dtype, as transformers'
  cast back does; the weight is then applied as the module applies it (:class:`RmsNormFormula`:
  after the rounding, or Gemma's ``1 + weight`` in float32 before it), so the result differs from
  the module's only by the order of the float32 sum of squares (on the CPU, in float32 and in
  bfloat16, not at all: tests/test_kernels.py). ``benchmarks/bench_norms.py`` times the two.
"""
from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

#: the device types the choices are made on (CUDA GPUs)
GPU_KERNEL_DEVICES = ("cuda",)


def on_gpu_kernels(device: torch.device) -> bool:
    """Whether ``device`` runs this module's kernel choices (a GPU) rather than transformers' own."""
    return device.type in GPU_KERNEL_DEVICES


def linear_patch_embedding_on(device: torch.device) -> bool:
    """The devices a patch embedding runs as a matrix product on (tests set it for the CPU)."""
    return on_gpu_kernels(device)


def is_patch_embedding(module: torch.nn.Module) -> bool:
    """A ``Conv3d`` that cuts its input into disjoint patches: stride = kernel, no padding, no
    dilation, one group (transformers' ``patch_embeddings`` fusion asks the same)."""
    if not isinstance(module, torch.nn.Conv3d) or isinstance(module.padding, str):
        return False
    return (tuple(module.stride) == tuple(module.kernel_size) and all(p == 0 for p in module.padding)
            and all(d == 1 for d in module.dilation) and module.groups == 1)


def one_patch_per_row(conv: torch.nn.Conv3d, pixels: torch.Tensor) -> bool:
    """Whether ``pixels`` is [rows, C, *kernel]: each row exactly one patch (one output position)."""
    return pixels.dim() == 5 and tuple(pixels.shape[1:]) == (conv.in_channels, *conv.kernel_size)


def patch_embedding_as_linear(conv: torch.nn.Conv3d, pixels: torch.Tensor) -> torch.Tensor:
    """``conv(pixels)`` for one patch per row, as ONE matrix product: [rows, C * T * P * P] by the
    kernel read as [out, C * T * P * P] (a view of the weight, nothing copied); [rows, out, 1, 1, 1]."""
    rows = pixels.shape[0]
    out = F.linear(pixels.reshape(rows, -1), conv.weight.reshape(conv.out_channels, -1), conv.bias)
    return out.reshape(rows, conv.out_channels, 1, 1, 1)


def _patch_embedding_forward(conv: torch.nn.Conv3d, pixels: torch.Tensor) -> torch.Tensor:
    if linear_patch_embedding_on(pixels.device) and one_patch_per_row(conv, pixels):
        return patch_embedding_as_linear(conv, pixels)
    return type(conv).forward(conv, pixels)            # the CPU, and inputs of several patches a row


def replace_forward(module: torch.nn.Module, forward) -> None:
    """Make ``module`` run ``forward(module, ...)``: the instance's ``forward``, or, where accelerate
    has hooked the module (``device_map="auto"`` over several GPUs: its hook moves the inputs to
    the module's device, then calls ``_old_forward``), the forward the hook calls, so that the hook
    stays. The class is left alone."""
    bound = types.MethodType(forward, module)
    if getattr(module, "_hf_hook", None) is not None and hasattr(module, "_old_forward"):
        module._old_forward = bound
    else:
        module.forward = bound


def use_linear_patch_embedding(model: torch.nn.Module) -> int:
    """Make every patch embedding of ``model`` (:func:`is_patch_embedding`) run as a matrix product
    on a GPU whenever it is handed one patch per row; elsewhere it stays the convolution. The
    instances change, not their classes; the weights stay as loaded. Returns how many changed."""
    convs = [m for m in model.modules() if is_patch_embedding(m)]
    for conv in convs:
        replace_forward(conv, _patch_embedding_forward)
    return len(convs)


#: a width of a matrix product runs on the GPU's vectorised kernels when a multiple of this many
#: elements (16 bytes of bfloat16)
ALIGNED_WIDTH = 8
#: an unaligned hidden width is padded up to a multiple of this, which leaves no partial step
#: of the usual 64-deep tensor-core tiles (1% more arithmetic for Qwen2.5-VL's 3,420 -> 3,456;
#: bench_aligned_widths.py times 8 against 64)
PADDED_WIDTH_MULTIPLE = 64
#: the gated MLP's projections, ``down(act(gate(x)) * up(x))`` (LLaMA's and Qwen's names)
GATED_MLP = ("gate_proj", "up_proj", "down_proj")


def round_up(width: int, multiple: int) -> int:
    """The least multiple of ``multiple`` not below ``width``."""
    return -(-width // multiple) * multiple


def mlp_padding_on(device: torch.device) -> bool:
    """The devices an MLP's hidden width is padded on (tests set it for the CPU)."""
    return on_gpu_kernels(device)


def gated_mlp(module: torch.nn.Module) -> tuple[torch.nn.Linear, ...] | None:
    """(gate, up, down) when ``module`` is a gated MLP and nothing else: those three plain
    ``nn.Linear`` children of one hidden width, and no parameter besides theirs (a mixture of
    experts with a router or shared experts is not one); else None."""
    projections = tuple(getattr(module, name, None) for name in GATED_MLP)
    if not all(type(p) is torch.nn.Linear for p in projections):
        return None
    gate, up, down = projections
    own = {f"{name}.{param}" for name in GATED_MLP for param in ("weight", "bias")}
    if not gate.out_features == up.out_features == down.in_features or any(
            name not in own for name, _ in module.named_parameters()):
        return None
    return projections


def _padded(weight: torch.Tensor | None, rows: int, columns: int) -> torch.nn.Parameter | None:
    """``weight`` ([r, c] or a bias [r]) with zeros appended up to [rows, columns] ([rows])."""
    if weight is None:
        return None
    shape = (rows,) if weight.dim() == 1 else (rows, columns)
    padded = weight.new_zeros(shape)
    padded[tuple(slice(0, n) for n in weight.shape)] = weight
    return torch.nn.Parameter(padded, requires_grad=weight.requires_grad)


@torch.no_grad()
def pad_gated_mlp(gate: torch.nn.Linear, up: torch.nn.Linear, down: torch.nn.Linear, width: int) -> None:
    """Widen the hidden layer to ``width`` units with zero weights and biases in place; the MLP's
    output stays the same in exact arithmetic (module docstring)."""
    for linear in (gate, up):
        linear.weight = _padded(linear.weight, width, linear.in_features)
        linear.bias = _padded(linear.bias, width, 0)
        linear.out_features = width
    down.weight = _padded(down.weight, down.out_features, width)
    down.in_features = width


def pad_unaligned_mlps(model: torch.nn.Module, aligned: int = ALIGNED_WIDTH,
                       multiple: int = PADDED_WIDTH_MULTIPLE) -> int:
    """Pad every gated MLP of ``model`` (:func:`gated_mlp`) whose hidden width is not a multiple
    of ``aligned`` up to a multiple of ``multiple``, where its weights lie on a device that pads
    (:func:`mlp_padding_on`: a GPU; the CPU's bits stay the reference's). The weights change,
    not the config: a padded model is for running, not for saving. Returns how many changed."""
    padded = 0
    for module in model.modules():
        projections = gated_mlp(module)
        if projections is None:
            continue
        width = projections[0].out_features
        if width % aligned and mlp_padding_on(projections[0].weight.device):
            pad_gated_mlp(*projections, round_up(width, multiple))
            padded += 1
    return padded


#: the attributes an RMSNorm keeps its epsilon in (transformers' names, and hub code's)
RMS_NORM_EPSILON_ATTRS = ("variance_epsilon", "eps")
#: the magnitudes of the probe's rows: where the epsilon dominates the mean square, where it is
#: small against it, and where it is negligible (a wrong epsilon fails the first)
_PROBE_SCALES = (1e-3, 1.0, 1e2)


@dataclass(frozen=True)
class RmsNormFormula:
    """How an RMSNorm applies its weight to the states it normalised in float32. ``offset`` None:
    ``weight * normed.to(dtype)``, the weight after the rounding (Llama's, Qwen's, most
    transformers classes'); a number: ``(normed * (offset + weight)).to(dtype)``, the weight in
    float32 and one rounding after it (Gemma's, PaliGemma's and Qwen3.5's 1; Gemma 4's 0)."""

    offset: float | None

    def scale(self, weight: torch.Tensor) -> torch.Tensor:
        """What multiplies the normalised states: the weight itself, or ``offset + weight`` in float32."""
        return weight if self.offset is None else self.offset + weight.float()

    def __call__(self, hidden: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
        """The norm of ``hidden`` with the normalisation one fused kernel (``torch.rms_norm``, in float32)."""
        width = (hidden.shape[-1],)
        if self.offset is None:
            return scale * torch.rms_norm(hidden, width, None, eps)
        return torch.rms_norm(hidden.float(), width, scale, eps).to(hidden.dtype)


#: the formulas a module is probed for; where two fit (in float32 Gemma 4's is Llama's), the one
#: that gives most of the module's own bits
RMS_NORM_FORMULAS = (RmsNormFormula(None), RmsNormFormula(0.0), RmsNormFormula(1.0))


def fused_rms_norm_on(device: torch.device) -> bool:
    """The devices an RMSNorm is normalised by torch's fused kernel on (tests set it for the CPU)."""
    return on_gpu_kernels(device)


def rms_norm_epsilon(module: torch.nn.Module) -> float | None:
    """The epsilon of a module shaped like an RMSNorm (one 1-D ``weight``, no other parameter, no
    buffer, a float epsilon under :data:`RMS_NORM_EPSILON_ATTRS`), else None. The shape alone
    decides nothing: :func:`rms_norm_formula` checks what the module computes."""
    params = dict(module.named_parameters())
    if list(params) != ["weight"] or params["weight"].dim() != 1 or any(True for _ in module.buffers()):
        return None
    eps = next((getattr(module, a) for a in RMS_NORM_EPSILON_ATTRS if hasattr(module, a)), None)
    return float(eps) if isinstance(eps, float) else None


def fused_rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' usual RMSNorm (normalised in float32, rounded to the input's dtype, then scaled
    by ``weight``) with the normalisation as one fused kernel."""
    return RMS_NORM_FORMULAS[0](hidden, weight, eps)


def rms_norm_formula(module: torch.nn.Module) -> RmsNormFormula | None:
    """The formula of :data:`RMS_NORM_FORMULAS` that ``module`` computes with its own weight and
    epsilon, probed on rows of several magnitudes in its own dtype and on its own device; None
    where none does (a centred LayerNorm, another epsilon than the attribute says, a norm that
    needs more than the hidden states or returns more than a tensor)."""
    eps = rms_norm_epsilon(module)
    return None if eps is None else _probed_formula(module, eps)


@torch.no_grad()
def _probed_formula(module: torch.nn.Module, eps: float) -> RmsNormFormula | None:
    """:func:`rms_norm_formula` of a module shaped like an RMSNorm, its epsilon read."""
    weight = module.weight
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(len(_PROBE_SCALES), weight.shape[0], generator=generator, dtype=torch.float64)
    probe = (rows * torch.tensor(_PROBE_SCALES, dtype=torch.float64)[:, None]).to(weight.device, weight.dtype)
    try:
        own = module(probe)
    except Exception:                                            # noqa: BLE001 - not a plain norm, whatever it is
        return None
    if not isinstance(own, torch.Tensor) or own.shape != probe.shape or own.dtype != probe.dtype:
        return None
    tolerance = 1e-5 if weight.dtype in (torch.float32, torch.float64) else 2e-2
    fits = []
    for formula in RMS_NORM_FORMULAS:
        want = formula(probe, formula.scale(weight), eps)
        if torch.allclose(own.double(), want.double(), rtol=tolerance, atol=tolerance * want.abs().max().item()):
            fits.append((int((own == want).sum()), formula))
    return max(fits, key=lambda fit: fit[0])[1] if fits else None   # max keeps the first of equals


def _fused_rms_norm_forward(norm: torch.nn.Module, hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    if args or kwargs:                                           # a call the probe did not see
        return type(norm).forward(norm, hidden, *args, **kwargs)
    formula, scale, eps = norm.__dict__["_ladbench_norm"]
    return formula(hidden, scale, eps)


def use_fused_rms_norms(model: torch.nn.Module) -> int:
    """Make every RMSNorm of ``model`` (:func:`rms_norm_formula`) whose weight lies on a device that
    fuses (:func:`fused_rms_norm_on`: a GPU; the CPU's bits stay the reference's) normalise with
    torch's fused kernel, in its own formula. The instances change, not their classes; a formula
    with an offset keeps ``offset + weight`` in float32, made once. Returns how many changed."""
    changed = 0
    for module in model.modules():
        eps = rms_norm_epsilon(module)
        if eps is None or not fused_rms_norm_on(module.weight.device):
            continue
        formula = _probed_formula(module, eps)
        if formula is None:
            continue
        module.__dict__["_ladbench_norm"] = (formula, formula.scale(module.weight), eps)
        replace_forward(module, _fused_rms_norm_forward)
        changed += 1
    return changed


#: SDPA's backends but cuDNN's attention (``inference.cudnn_attention: false``)
SDPA_BUT_CUDNN = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def attention_backends(cudnn: bool) -> contextlib.AbstractContextManager:
    """SDPA's choice of kernel for a block: torch's own (``cudnn``), or every backend but cuDNN's
    attention, which builds a graph per new shape of its inputs (public reports: up to hundreds
    of ms each), where a decode loop meets a new KV length at every step and a scoring pass a new
    padded length at every batch. Not a kernel choice of the GPU's (no GPU has yet shown which
    pays): the setting ``inference.cudnn_attention`` asks for it. The CPU has no cuDNN attention:
    nothing changes there."""
    return contextlib.nullcontext() if cudnn else sdpa_kernel(list(SDPA_BUT_CUDNN))

