"""A real single-node SLURM for the tests: Debian's slurmctld, slurmd and munge, started
in a scratch folder without systemd or cgroups, with an optional fake GPU.

Used by tests/test_slurm.py, and by hand:

    python tests/slurm/cluster.py up --dir /tmp/ladbench-slurm   # prints `export SLURM_CONF=...`
    python tests/slurm/cluster.py down --dir /tmp/ladbench-slurm

Needs root (the daemons run as root and munge, and the job-step plugin only finds the
configuration at /etc/slurm/slurm.conf). Every daemon runs in the foreground as a child of
the starter, its PID recorded in ``<dir>/cluster.json``; stopping signals exactly those
PIDs, and removes the /etc/slurm/slurm.conf link only if this module created it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
# slurm-jobstep strips SLURM_* variables (SLURM_CONF included) before `srun` runs inside a
# job, so the configuration must be reachable at the compiled-in default path.
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
MUNGE_KEY = Path("/etc/munge/munge.key")
# First line of every configuration written here: tells a leftover link of a killed run
# (safe to replace) from a configuration somebody else installed (never touched).
MARKER = "# ladbench single-node test cluster"
STATE_FILE = "cluster.json"
DAEMONS = ("munged", "slurmctld", "slurmd")


class ClusterUnavailable(RuntimeError):
    """This machine cannot host the test cluster (not root, no Debian packages, or the
    system configuration path is taken): a reason to skip, not a failure."""


class ClusterFailed(RuntimeError):
    """The cluster was set up but did not come up; the message carries the daemons' logs."""


@dataclass(frozen=True)
class Node:
    """What the single node advertises to SLURM."""

    name: str
    cpus: int
    real_memory_mb: int
    gpus: int = 1


def memory_total_mb(meminfo: str) -> int:
    """MemTotal of a /proc/meminfo text, in MiB."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise ValueError("/proc/meminfo has no MemTotal line")


def this_machine(gpus: int = 1, memory_fraction: float = 0.9) -> Node:
    """The node as this machine: its short host name, every CPU, and a fraction of its
    memory (slurmd refuses a node that claims more RealMemory than it has)."""
    total = memory_total_mb(Path("/proc/meminfo").read_text())
    return Node(
        name=socket.gethostname().split(".")[0],
        cpus=os.cpu_count() or 1,
        real_memory_mb=int(total * memory_fraction),
        gpus=gpus,
    )


@dataclass(frozen=True)
class Layout:
    """Every path of one cluster, below its scratch folder."""

    base: Path

    @property
    def etc(self) -> Path:
        return self.base / "etc"

    @property
    def conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        # slurmd reads gres.conf from the folder of the slurm.conf it was given.
        return self.etc / "gres.conf"

    @property
    def munge(self) -> Path:
        return self.base / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge / "munge.socket.2"

    @property
    def logs(self) -> Path:
        return self.base / "log"

    @property
    def jobcomp(self) -> Path:
        """One line per finished job (jobcomp/filetxt): the evidence that works without slurmdbd."""
        return self.logs / "jobcomp.txt"

    @property
    def state(self) -> Path:
        return self.base / STATE_FILE


def render_slurm_conf(layout: Layout, node: Node, ctld_port: int, slurmd_port: int, partition: str) -> str:
    """slurm.conf of a single node that is both controller and compute node."""
    gres = f"Gres=gpu:{node.gpus} " if node.gpus else ""
    lines = [
        MARKER,
        f"# state: {layout.state}",
        "ClusterName=ladbench-ci",
        f"SlurmctldHost={node.name}(127.0.0.1)",
        # Ports of our own, so a leftover or foreign slurmctld on the defaults cannot clash.
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={layout.munge_socket}",
        "MpiDefault=none",
        # No cgroups (containers, CI runners): track processes by /proc, no task binding.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        # No slurmdbd: `sacct` cannot answer, so the profile must use `squeue` for status.
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={layout.jobcomp}",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        *(["GresTypes=gpu"] if node.gpus else []),
        # Finished jobs stay listed (squeue, scontrol) for an hour: the executor's squeue
        # status checks need >= 3x its slurm-init-seconds-before-status-checks, and the
        # test reads every job's record after the run.
        "MinJobAge=3600",
        "ReturnToService=2",
        f"SlurmctldPidFile={layout.base / 'slurmctld.pid'}",
        f"SlurmdPidFile={layout.base / 'slurmd.pid'}",
        f"SlurmctldLogFile={layout.logs / 'slurmctld.log'}",
        f"SlurmdLogFile={layout.logs / 'slurmd.log'}",
        f"StateSaveLocation={layout.base / 'state'}",
        f"SlurmdSpoolDir={layout.base / 'spool'}",
        f"NodeName={node.name} NodeAddr=127.0.0.1 {gres}CPUs={node.cpus} "
        f"RealMemory={node.real_memory_mb} State=UNKNOWN",
        f"PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def render_gres_conf(node: Node) -> str:
    """gres.conf with fake GPUs: /dev/null stands in for the device files, so jobs that
    ask for GPUs are scheduled and accounted like on a GPU node."""
    if not node.gpus:
        return ""
    return f"NodeName={node.name} Name=gpu Count={node.gpus} File=/dev/null\n"


# ---- machine checks and packages ------------------------------------------------------
def missing_packages(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """The packages of ``packages`` that dpkg does not report as installed."""
    missing = []
    for package in packages:
        result = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True,
        )
        if result.returncode != 0 or "install ok installed" not in result.stdout:
            missing.append(package)
    return missing


def _apt(*args: str, timeout: int) -> None:
    command = ["apt-get", *args]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=timeout,
        )
    except subprocess.TimeoutExpired as error:
        raise ClusterUnavailable(f"`{' '.join(command)}` did not finish within {timeout} s") from error
    if result.returncode != 0:
        raise ClusterUnavailable(
            f"`{' '.join(command)}` failed ({result.returncode}):\n{(result.stdout + result.stderr)[-2000:]}"
        )


def ensure_packages(packages: tuple[str, ...] = PACKAGES, timeout: int = 600) -> list[str]:
    """Install the missing Debian packages with apt-get; returns what was installed.
    Raises ClusterUnavailable when this is not a root Debian machine or apt fails."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("needs root: the SLURM daemons run as root and munge")
    if shutil.which("dpkg-query") is None or shutil.which("apt-get") is None:
        raise ClusterUnavailable("needs a Debian-like system with apt-get and dpkg")
    missing = missing_packages(packages)
    if missing:
        _apt("update", "-qq", timeout=timeout)
        # Wait for another apt (a parallel job) instead of failing on its lock.
        _apt("install", "-y", "-qq", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=300",
             *missing, timeout=timeout)
        still_missing = missing_packages(packages)
        if still_missing:
            raise ClusterUnavailable(f"apt-get did not install {still_missing}")
    return missing


def ensure_munge_key(key: Path = MUNGE_KEY) -> None:
    """The munge package normally creates the key; make one if it is missing."""
    if key.exists() and key.stat().st_size > 0:
        return
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, user="munge", group="munge")


def free_port() -> int:
    """A TCP port nobody listens on now (the kernel's choice)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---- processes ------------------------------------------------------------------------
def process_is(pid: int, daemon: str) -> bool:
    """Whether ``pid`` runs ``daemon`` now (guards against a PID reused after a crash).

    The executable link is read first: it is set as soon as exec starts, while the command
    line stays empty (and ``comm`` keeps the parent's name) until the kernel has laid out
    the new program's arguments, a window a loaded machine makes visible right after
    ``Popen`` returns."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
        if os.path.basename(exe) == daemon:
            return True
    except OSError:
        pass  # gone, a zombie, or not ours to read
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return os.path.basename(cmdline[0].decode(errors="replace")) == daemon


def _reap(pid: int) -> None:
    """Collect a child that has exited, so it does not linger as a zombie that looks alive."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child (started by an earlier `up`): init reaps it


def stop_process(pid: int, daemon: str, grace: float = 10.0) -> bool:
    """SIGTERM ``pid`` if it still runs ``daemon``, SIGKILL after ``grace`` seconds.
    Returns whether it was running."""
    if not process_is(pid, daemon):
        _reap(pid)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pid)
        if not process_is(pid, daemon):
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    _reap(pid)
    return True


def _state(layout: Layout) -> dict:
    try:
        return json.loads(layout.state.read_text())
    except (OSError, ValueError):
        return {}


def _write_state(layout: Layout, state: dict) -> None:
    tmp = layout.state.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, layout.state)


def _running_daemons(state: dict) -> list[str]:
    return [name for name, pid in state.get("pids", {}).items() if process_is(pid, name)]


# ---- the /etc/slurm/slurm.conf link ---------------------------------------------------
def system_conf_owner(link: Path = SYSTEM_CONF) -> str:
    """Who holds ``link``: 'free' (nothing there), 'stale' (our link, left by a run whose
    daemons are gone: safe to replace) or 'busy' (a running test cluster, or a real SLURM
    configuration: never touched)."""
    if not link.is_symlink():
        return "busy" if link.exists() else "free"
    target = link.resolve()
    if not target.exists():
        return "stale"
    first_lines = target.read_text(errors="replace").splitlines()[:2]
    if not first_lines or first_lines[0] != MARKER:
        return "busy"
    state_path = Path(first_lines[1].removeprefix("# state: ")) if len(first_lines) > 1 else None
    if state_path is None or not state_path.exists():
        return "stale"
    return "busy" if _running_daemons(json.loads(state_path.read_text() or "{}")) else "stale"


def _link_system_conf(conf: Path, link: Path = SYSTEM_CONF) -> None:
    owner = system_conf_owner(link)
    if owner == "busy":
        raise ClusterUnavailable(
            f"{link} belongs to another SLURM (a real installation or a test cluster that is "
            f"still running: {os.path.realpath(link)}); not replacing it"
        )
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(conf)
    os.replace(tmp, link)  # atomic, also over a stale link


def _unlink_system_conf(conf: Path, link: Path = SYSTEM_CONF) -> bool:
    """Remove ``link`` only if it still points at our ``conf``."""
    if link.is_symlink() and os.readlink(link) == str(conf):
        link.unlink()
        return True
    return False


# ---- the cluster ----------------------------------------------------------------------
@dataclass
class Cluster:
    """A running single-node cluster; ``stop()`` ends exactly the daemons ``start`` began."""

    layout: Layout
    node: Node
    partition: str
    pids: dict[str, int] = field(default_factory=dict)

    def env(self, base: dict | None = None) -> dict:
        """An environment whose SLURM clients (sbatch, squeue, sinfo) talk to this cluster."""
        return dict(os.environ if base is None else base, SLURM_CONF=str(self.layout.conf))

    def client(self, *command: str, timeout: int = 30) -> str:
        """Run a SLURM client command against this cluster; returns its stdout."""
        result = subprocess.run(
            list(command), capture_output=True, text=True, env=self.env(), timeout=timeout,
        )
        if result.returncode != 0:
            raise ClusterFailed(f"`{' '.join(command)}` failed: {result.stderr.strip()}")
        return result.stdout

    def job_records(self) -> list[dict[str, str]]:
        """Every job the controller still lists (all of them, for MinJobAge), as
        `scontrol show job` records: JobId, JobName, JobState, Comment, TresPerJob, ..."""
        return parse_records(self.client("scontrol", "show", "job", "--oneliner"))

    def completed_jobs(self) -> list[dict[str, str]]:
        """The jobcomp records: one per job that ended, written by slurmctld itself."""
        if not self.layout.jobcomp.exists():
            return []
        return parse_records(self.layout.jobcomp.read_text())

    def logs(self, tail_lines: int = 40) -> str:
        """The tail of every daemon log, for a failure message."""
        return daemon_logs(self.layout, tail_lines)

    def stop(self) -> list[str]:
        """Cancel what is still queued, stop our daemons by PID (slurmd, slurmctld, munged),
        and remove the system configuration link if we made it. Returns what was stopped."""
        return stop(self.layout)


def daemon_logs(layout: Layout, tail_lines: int = 40) -> str:
    parts = []
    for path in sorted(layout.logs.glob("*")) + sorted(layout.munge.glob("*.log")):
        if path.is_file():
            lines = path.read_text(errors="replace").splitlines()[-tail_lines:]
            parts.append(f"==== {path} (last {len(lines)} lines)\n" + "\n".join(lines))
    return "\n".join(parts) or f"(no logs under {layout.base})"


def _prepare_folders(layout: Layout) -> None:
    for folder in (layout.etc, layout.logs, layout.base / "state", layout.base / "spool"):
        folder.mkdir(parents=True, exist_ok=True)
    # munged (as user munge) must reach its socket folder, and refuses one that others
    # may write to.
    layout.base.chmod(0o755)
    layout.munge.mkdir(exist_ok=True)
    shutil.chown(layout.munge, "munge", "munge")
    layout.munge.chmod(0o755)


def _spawn(layout: Layout, name: str, command: list[str], **options) -> subprocess.Popen:
    # A session of its own: a Ctrl-C in the test's terminal must not kill the daemons
    # before the finalizer has cancelled the jobs and stopped them in order.
    with open(layout.logs / f"{name}.stdout", "ab") as out:
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            **options,
        )


def _wait_for(condition, what: str, layout: Layout, pids: dict[str, int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        dead = [name for name, pid in pids.items() if not process_is(pid, name)]
        if dead:
            raise ClusterFailed(f"{', '.join(dead)} exited while waiting for {what}:\n{daemon_logs(layout)}")
        time.sleep(0.2)
    raise ClusterFailed(f"timed out after {timeout:.0f} s waiting for {what}:\n{daemon_logs(layout)}")


def _node_state(layout: Layout, node: Node) -> str:
    result = subprocess.run(
        ["sinfo", "--noheader", "--Node", "--nodes", node.name, "--format=%t"],
        capture_output=True, text=True, env=dict(os.environ, SLURM_CONF=str(layout.conf)), timeout=10,
    )
    return result.stdout.strip()


def start(base: Path, node: Node | None = None, partition: str = "debug", timeout: float = 60.0) -> Cluster:
    """Start munged, slurmctld and slurmd for one node under ``base`` and wait until the
    node is idle. Packages must be installed (see ensure_packages). Raises
    ClusterUnavailable when /etc/slurm/slurm.conf belongs to someone else, ClusterFailed
    (with the logs) when a daemon does not come up; in that case whatever was started
    is stopped again."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("needs root: the SLURM daemons run as root and munge")
    node = node or this_machine()
    layout = Layout(Path(base).resolve())
    _prepare_folders(layout)
    ensure_munge_key()
    layout.conf.write_text(render_slurm_conf(layout, node, free_port(), free_port(), partition))
    layout.gres_conf.write_text(render_gres_conf(node))
    _link_system_conf(layout.conf)
    cluster = Cluster(layout, node, partition)
    # Written before each daemon starts, so that `stop` finds every PID even after a crash.
    state = {"node": asdict(node), "partition": partition, "pids": cluster.pids,
             "linked_system_conf": str(SYSTEM_CONF)}
    _write_state(layout, state)
    try:
        munged = _spawn(layout, "munged", [
            "munged", "--foreground", f"--socket={layout.munge_socket}", f"--key-file={MUNGE_KEY}",
            f"--pid-file={layout.munge / 'munged.pid'}", f"--log-file={layout.munge / 'munged.log'}",
            f"--seed-file={layout.munge / 'munged.seed'}",
        ], user="munge", group="munge", extra_groups=[])
        cluster.pids["munged"] = munged.pid
        _write_state(layout, state)
        _wait_for(layout.munge_socket.exists, "munged's socket", layout, cluster.pids, timeout)
        env = dict(os.environ, SLURM_CONF=str(layout.conf))
        for name, command in (
            ("slurmctld", ["slurmctld", "-D", "-f", str(layout.conf)]),
            ("slurmd", ["slurmd", "-D", "-f", str(layout.conf), "-N", node.name]),
        ):
            cluster.pids[name] = _spawn(layout, name, command, env=env).pid
            _write_state(layout, state)
        _wait_for(lambda: _node_state(layout, node) == "idle", f"node {node.name} to be idle",
                  layout, cluster.pids, timeout)
    except BaseException:
        stop(layout)
        raise
    return cluster


def cancel_all_jobs(layout: Layout) -> None:
    """Cancel every job still known to this cluster (it is ours alone), so no job step
    outlives the daemons."""
    env = dict(os.environ, SLURM_CONF=str(layout.conf))
    try:
        listed = subprocess.run(["squeue", "--noheader", "--format=%i"], capture_output=True, text=True,
                                env=env, timeout=10)
        ids = listed.stdout.split()
        if listed.returncode == 0 and ids:
            subprocess.run(["scancel", *ids], env=env, timeout=10, capture_output=True)
            time.sleep(2)  # let slurmd end the job steps before it is stopped
    except (OSError, subprocess.TimeoutExpired):
        pass  # the controller is gone already; nothing to cancel


def stop(base_or_layout: Path | Layout) -> list[str]:
    """Stop the daemons recorded in ``<base>/cluster.json`` (only if their PID still runs
    that daemon) and remove the /etc/slurm/slurm.conf link if it still points at this
    cluster. Returns the names of the daemons stopped."""
    layout = base_or_layout if isinstance(base_or_layout, Layout) else Layout(Path(base_or_layout).resolve())
    state = _state(layout)
    pids = state.get("pids", {})
    if process_is(pids.get("slurmctld", -1), "slurmctld"):
        cancel_all_jobs(layout)
    stopped = [name for name in reversed(DAEMONS) if name in pids and stop_process(pids[name], name)]
    if state.get("linked_system_conf"):
        _unlink_system_conf(layout.conf, Path(state["linked_system_conf"]))
    return stopped


# ---- evidence -------------------------------------------------------------------------
def parse_records(text: str) -> list[dict[str, str]]:
    """One record per line of ``Key=Value Key=Value ...`` text, the format of both a
    jobcomp/filetxt file and `scontrol show job --oneliner` (a value is split at its first
    '=' only, so ``Comment=rule_x_wildcards_a=b`` keeps its wildcards)."""
    records = []
    for line in text.splitlines():
        if "=" not in line:
            continue  # blank, or "No jobs in the system"
        record = {}
        for item in line.split():
            key, sep, value = item.partition("=")
            if sep:
                record[key] = value
        records.append(record)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="install the packages if missing and start the cluster")
    up.add_argument("--dir", type=Path, required=True, help="scratch folder (created) for config, state and logs")
    up.add_argument("--gpus", type=int, default=1, help="fake GPUs to advertise (0: none)")
    up.add_argument("--partition", default="debug", help="name of the single partition")
    down = sub.add_parser("down", help="stop the daemons that `up` started in --dir")
    down.add_argument("--dir", type=Path, required=True, help="the folder given to `up`")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            installed = ensure_packages()
            if installed:
                print(f"installed {' '.join(installed)}", file=sys.stderr)
            cluster = start(args.dir, this_machine(gpus=args.gpus), args.partition)
            print(cluster.client("sinfo"), file=sys.stderr, end="")
            print(f"export SLURM_CONF={cluster.layout.conf}")
        else:
            stopped = stop(args.dir)
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}", file=sys.stderr)
    except (ClusterUnavailable, ClusterFailed) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
