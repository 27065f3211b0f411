"""One GPU per job on one machine: a job claims distinct devices before CUDA starts.

Snakemake's ``--resources gpu=G`` lets at most G GPU jobs run at once but hands out no
device ids, and a CUDA program sees every GPU unless told otherwise. So each ``infer``
job claims its own: one lock file per device in a per-user runtime folder, locked with a
non-blocking ``fcntl.lockf``; the first free devices are taken and ``CUDA_VISIBLE_DEVICES``
is set to them, which CUDA reads once, when it initialises (so :func:`claim_gpus` must run
before anything asks torch about CUDA). The kernel drops a lock when its process ends,
however it ends: a killed job never blocks a device.

Devices already chosen for the job are respected: where ``CUDA_VISIBLE_DEVICES`` lists
no more devices than the job needs (SLURM's ``--gpus``, or a user's choice) they are used
as they are, without locks (SLURM renumbers each job's devices from 0, so ids are not
unique across jobs there); where it lists more, the job claims among those; fewer is an
error (a model configured with ``gpus_per_job: 2`` would not fit).
"""
from __future__ import annotations

import fcntl
import glob
import logging
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import IO, Sequence

log = logging.getLogger(__name__)

VISIBLE = "CUDA_VISIBLE_DEVICES"


class NoFreeGpu(ValueError):
    """Fewer devices are free than the job needs (a ValueError: the CLI prints it as one line)."""


def lock_folder() -> str:
    """Per user and per machine: ``$XDG_RUNTIME_DIR/ladbench-gpus``, else ``/tmp/ladbench-gpus-<uid>``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "ladbench-gpus")
    return os.path.join(tempfile.gettempdir(), f"ladbench-gpus-{os.getuid()}")


def machine_gpus() -> list[str]:
    """Ids of the machine's NVIDIA GPUs, found without initialising CUDA (the driver's
    /proc entries, else ``nvidia-smi -L``); [] where there is none."""
    entries = glob.glob("/proc/driver/nvidia/gpus/*")
    if entries:
        return [str(i) for i in range(len(entries))]
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(line for line in listing.splitlines() if line.startswith("GPU "))]


@dataclass
class GpuClaim:
    """Devices held by this process; the locks last until :meth:`release` or the process ends."""

    devices: list[str]
    _locks: list[IO] = field(default_factory=list, repr=False)

    def release(self) -> None:
        for handle in self._locks:
            handle.close()                     # closing the file drops its lock
        self._locks.clear()


def _try_lock(folder: str, device: str) -> IO | None:
    handle = open(os.path.join(folder, f"gpu-{device}.lock"), "a+")
    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")           # for people looking: who holds it
    handle.flush()
    return handle


def claim_gpus(count: int, *, devices: Sequence[str] | None = None, folder: str | None = None,
               environ: dict | None = None) -> GpuClaim:
    """Claim ``count`` distinct devices and make them the only ones CUDA shows this process.

    ``devices`` are the candidates (default: ``CUDA_VISIBLE_DEVICES`` if set, else the
    machine's GPUs); ``environ`` is where ``CUDA_VISIBLE_DEVICES`` is read and set
    (default ``os.environ``); ``folder`` holds the lock files (default :func:`lock_folder`).
    """
    environ = os.environ if environ is None else environ
    preset = environ.get(VISIBLE)
    if devices is None:
        devices = [d.strip() for d in preset.split(",") if d.strip()] if preset is not None else machine_gpus()
        if preset is not None and len(devices) == count:
            return GpuClaim(list(devices))     # chosen for this job already (SLURM, the user)
    if len(devices) < count:
        shown = f"{VISIBLE}={preset}" if preset is not None else "the machine"
        raise NoFreeGpu(f"the job needs {count} GPU(s) (gpus_per_job) but {shown} shows {len(devices)}")
    folder = folder or lock_folder()
    os.makedirs(folder, mode=0o700, exist_ok=True)
    claim = GpuClaim([])
    for device in devices:
        handle = _try_lock(folder, device)
        if handle is not None:
            claim.devices.append(device)
            claim._locks.append(handle)
            if len(claim.devices) == count:
                environ[VISIBLE] = ",".join(claim.devices)
                log.info("claimed GPU(s) %s (locks in %s)", environ[VISIBLE], folder)
                return claim
    claim.release()
    raise NoFreeGpu(f"only {len(claim.devices)} of the GPUs {','.join(devices)} are free, the job needs {count}: "
                    f"run snakemake with --resources gpu=<number of GPUs> (locks held in {folder})")


def claim_for_device(count: int, device: str) -> GpuClaim | None:
    """:func:`claim_gpus` for ``ladbench infer --gpus count --device device``: nothing for
    ``cpu`` or ``count == 0``, nor for ``auto`` on a machine without GPUs (it runs on the CPU)."""
    if count == 0 or device == "cpu":
        return None
    if device == "auto" and VISIBLE not in os.environ and not machine_gpus():
        log.info("no GPU on this machine: --device auto runs on the CPU")
        return None
    return claim_gpus(count)
