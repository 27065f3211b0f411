"""One GPU per job: concurrent jobs claim distinct devices, a released or killed job's
device is claimed again, and devices already chosen for a job (SLURM, the user) are kept.
Simulated devices on the CPU: locks are files in a test folder, the device list is given."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from ladbench.inference.devices import VISIBLE, NoFreeGpu, claim_gpus

DEVICES = ["0", "1", "2", "3"]
# A job: claims, prints what CUDA would see, holds the claim until its stdin closes.
JOB = textwrap.dedent("""
    import sys
    from ladbench.inference.devices import claim_gpus
    environ = {}   # the claim must stay referenced: its open lock files are the locks
    try:
        claim = claim_gpus(int(sys.argv[1]), devices=sys.argv[2].split(","), folder=sys.argv[3], environ=environ)
    except Exception as error:
        print(f"failed: {error}", flush=True)
        sys.exit(3)
    print(environ["CUDA_VISIBLE_DEVICES"], flush=True)
    sys.stdin.read()
""")


class Job:
    def __init__(self, count: int, folder, devices=DEVICES):
        self.process = subprocess.Popen([sys.executable, "-c", JOB, str(count), ",".join(devices), str(folder)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.line = self.process.stdout.readline().strip()

    @property
    def devices(self) -> list[str]:
        assert not self.line.startswith("failed"), self.line
        return self.line.split(",")

    def end(self, kill: bool = False) -> None:
        if kill:
            self.process.send_signal(signal.SIGKILL)
        else:
            self.process.stdin.close()
        self.process.wait(timeout=30)


def test_concurrent_jobs_get_distinct_devices_and_a_killed_jobs_device_is_reused(tmp_path):
    jobs = [Job(1, tmp_path) for _ in range(3)]
    big = Job(2, tmp_path)                      # gpus_per_job: 2, but only one device is left
    try:
        held = [job.devices[0] for job in jobs]
        assert len(set(held)) == 3 and set(held) <= set(DEVICES)
        assert big.line.startswith("failed") and "only 1 of the GPUs" in big.line
        big.process.wait(timeout=30)
        last = Job(1, tmp_path)
        assert last.devices[0] not in held       # the fourth device
        jobs.append(last)
        assert Job(1, tmp_path).line.startswith("failed")    # all four busy
        jobs[1].end(kill=True)                  # SIGKILL: the kernel drops its lock
        again = Job(1, tmp_path)
        assert again.devices == [held[1]]
        jobs[1] = again
        jobs[0].end()                            # a normal end releases too
        pair = Job(2, tmp_path, devices=DEVICES)  # only held[0] is free now: one is not enough
        assert pair.line.startswith("failed")
        pair.process.wait(timeout=30)
        jobs[2].end()
        pair = Job(2, tmp_path)
        assert sorted(pair.devices) == sorted([held[0], held[2]])
        jobs[0] = pair
    finally:
        for job in jobs:
            if job.process.poll() is None:
                job.end()


def test_devices_chosen_for_the_job_are_kept(tmp_path):
    environ = {VISIBLE: "2"}                    # as SLURM sets it for a job with --gpus=1
    assert claim_gpus(1, folder=str(tmp_path / "locks"), environ=environ).devices == ["2"]
    assert environ[VISIBLE] == "2" and not (tmp_path / "locks").exists()
    environ = {VISIBLE: "5,7,9"}                # a user's pool, larger than the job: claim within it
    claim = claim_gpus(2, folder=str(tmp_path), environ=environ)
    assert claim.devices == ["5", "7"] and environ[VISIBLE] == "5,7"
    claim.release()
    with pytest.raises(NoFreeGpu, match="CUDA_VISIBLE_DEVICES=3 shows 1"):
        claim_gpus(2, folder=str(tmp_path), environ={VISIBLE: "3"})


def test_a_machine_without_enough_gpus_is_a_clear_error(tmp_path):
    with pytest.raises(NoFreeGpu, match="needs 2 GPU"):
        claim_gpus(2, devices=["0"], folder=str(tmp_path), environ={})


def test_what_infer_claims_for_its_device(monkeypatch):
    from ladbench.inference import devices
    monkeypatch.delenv(VISIBLE, raising=False)
    monkeypatch.setattr(devices, "machine_gpus", lambda: [])
    assert devices.claim_for_device(1, "cpu") is None and devices.claim_for_device(0, "cuda") is None
    assert devices.claim_for_device(1, "auto") is None          # no GPU here: auto runs on the CPU
    with pytest.raises(NoFreeGpu, match="the machine shows 0"):
        devices.claim_for_device(1, "cuda")
    monkeypatch.setenv(VISIBLE, "3")                             # chosen for the job (SLURM)
    assert devices.claim_for_device(1, "auto").devices == ["3"]
