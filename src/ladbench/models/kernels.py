"""Kernel choices made on a GPU only: computations transformers runs one way, run another way
that is equal in exact arithmetic and cheaper there.

On the CPU transformers' own operations run: the paper lane's float32 bits are the reference
(pinned scoring caches, CoT and SC replies equal to earlier runs), and every choice here
changes them in the last place. On a GPU, bfloat16 kernels differ from the reference's eager
path anyway (README, "Fidelity on a GPU"), and these choices are tested for equality in float32.

* :func:`on_gpu_kernels`: the devices they are made on (one rule; each choice has its own
  switch below, which tests set to run the GPU's path on the CPU).
* The one query position on the KV heads (decode steps): ``models/attention.py``,
  ``packs_on``.
* The patch embedding as a matrix product (:func:`use_linear_patch_embedding`): a ``Conv3d``
  whose stride is its kernel (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V and others cut the images
  into patches on the host and hand the tower one patch per row, [patches, C, T, P, P]) computes
  one dot product per patch and output channel, a matrix product. cuDNN has no good algorithm
  for that shape on some GPU, dtype and version combinations (public reports: about 13x slower
  than the matrix product on an H20, seconds per call for Qwen3-VL in bfloat16 on an H100 with
  some cuDNN releases, far worse on Blackwell), which the tower would pay on every batch.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F

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


def use_linear_patch_embedding(model: torch.nn.Module) -> int:
    """Make every patch embedding of ``model`` (:func:`is_patch_embedding`) run as a matrix product
    on a GPU whenever it is handed one patch per row; elsewhere it stays the convolution. The
    instances change, not their classes; the weights stay as loaded. Returns how many changed."""
    convs = [m for m in model.modules() if is_patch_embedding(m)]
    for conv in convs:
        conv.forward = types.MethodType(_patch_embedding_forward, conv)
    return len(convs)
