"""The same bits on every x86-64 CPU: the library switches that pin torch's CPU kernels to one path.

torch's CPU libraries choose their code by the CPU they run on: ATen's vectorised kernels by
instruction set (AVX-512, AVX2 or none), oneDNN's convolutions by instruction set, MKL's matrix
products by instruction set and vendor. Each choice changes the last bits of a result, and a
training amplifies them: the same seed trains another organism on another CPU, and the same
seed draws other random weights (``normal_`` has an AVX2 kernel of its own). The switches below
pin each library to the path every x86-64 CPU that runs this software stack has (numpy 2.4, in
the lock file, needs x86-64-v2: SSE4.2). docs/organism.md ("The same weights on every machine")
says what was measured, what each costs, and what is not covered.

Each library reads its switch once, when torch first uses it, so they must be in the
environment before torch is imported: ``ladbench`` sets them itself for the stages whose
outputs must be the same bits everywhere (``cli.PORTABLE_STAGES``), whoever runs them.
This module must not import torch.
"""
from __future__ import annotations

import os
import sys

#: switch -> value; each is read at start-up by the library it names
PORTABLE_CPU_ENV = {
    "ATEN_CPU_CAPABILITY": "default",   # ATen: the kernels built for baseline x86-64, not its AVX2/AVX-512 ones
    "ONEDNN_MAX_CPU_ISA": "SSE41",      # oneDNN (the vision tower's patch convolution): its lowest JIT level
    "MKL_CBWR": "COMPATIBLE",           # MKL: conditional numerical reproducibility, the code every x86 CPU runs
}


def pin_cpu_paths() -> bool:
    """Put :data:`PORTABLE_CPU_ENV` into this process's environment (and so its children's);
    False, changing nothing, when torch is already loaded with other settings (a stage called
    in-process by a program that imported torch first): its libraries read the switches once,
    so the caller's process runs unpinned, which it must say (the model's metadata records the
    paths it ran: :func:`cpu_paths`)."""
    if "torch" in sys.modules and not cpu_paths_pinned():
        return False
    os.environ.update(PORTABLE_CPU_ENV)
    return True


def cpu_paths_pinned() -> bool:
    return all(os.environ.get(name) == value for name, value in PORTABLE_CPU_ENV.items())


def cpu_paths() -> dict[str, str | None]:
    """What this process's torch runs: ATen's capability in use, and the other switches' values
    (recorded beside a model built from a seed, so a reader sees which path made it)."""
    import torch
    return {"aten": torch.backends.cpu.get_cpu_capability(),
            **{name: os.environ.get(name) for name in PORTABLE_CPU_ENV if name != "ATEN_CPU_CAPABILITY"}}
