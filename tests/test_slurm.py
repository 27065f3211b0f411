"""The SLURM profile, proven on a real single-node SLURM (Debian's slurmctld, slurmd and
munge, started by tests/slurm/cluster.py, with one fake GPU): the whole demo DAG runs
through workflow/profiles/slurm, every rule instance as a SLURM job.

The fast tests check the profile and the helpers without SLURM. The cluster test changes
the machine (installs SLURM and munge with apt, writes /etc/munge and /etc/slurm), so it
runs only when LADBENCH_SYSTEM_TESTS=1 (`.ci/run` sets it); it also needs root and apt, and
skips with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from slurm import cluster as slurm_cluster
from slurm.cluster import ClusterUnavailable, Layout, Node, parse_records
from slurm.profiles import ci_overlay, ci_profile, fit_to_node, load_profile, merged, write_profile
from workflow_runner import demo_config_with, environment, planned_jobs, snakemake, snakemake_command

GPU_RULES = {"infer", "features"}
PARTITION = "debug"
# Seconds the demo may take through SLURM before snakemake gets SIGINT (it then cancels
# its jobs); it took about 2.5 minutes on 2 busy cores before the inference was sharded
# (8 more SLURM jobs: 4 shards, 4 merges; a few seconds of fixed cost each). Each job's
# snakemake also reads the Snakefile, which imports ladbench.workflow (about 1 s, scipy
# included, since #23), and on 2026-11-26 the run passed 480 s on a clean clone while a
# `make demo` shared the 2 cores: the limit guards against a hang, not a slow machine.
RUN_LIMIT = 900
# The demo runs with its inference split into this many shards (merged by merge_shards).
SHARDS = 2
# The environment variable that allows a test to change the machine outside the repository.
SYSTEM_TESTS = "LADBENCH_SYSTEM_TESTS"


# ---- the profile, without SLURM -------------------------------------------------------
@pytest.fixture(scope="module")
def profile() -> dict:
    return load_profile()


def workflow_rules(workdir: Path) -> set[str]:
    result = subprocess.run(
        snakemake_command(workdir, "--list-rules"),
        capture_output=True, text=True, env=environment(), timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return {line.split()[0] for line in result.stdout.splitlines() if line.strip()}


def test_profile_runs_on_the_slurm_executor_with_squeue_status(profile):
    assert profile["executor"] == "slurm"
    # sacct needs slurmdbd; without it the executor loses track of jobs and hangs.
    assert profile["slurm-status-command"] == "squeue"
    assert isinstance(profile["slurm-init-seconds-before-status-checks"], int)


def test_gpu_rules_ask_for_a_gpu_memory_and_runtime(profile):
    for rule in GPU_RULES:
        resources = profile["set-resources"][rule]
        assert resources["gpu"] == 1, rule
        assert resources["mem_mb"] >= 16000, rule
        assert resources["runtime"] >= 60, rule
        assert profile["set-threads"][rule] >= 4, rule


def test_cpu_rules_stay_small(profile):
    defaults = profile["default-resources"]
    assert "gpu" not in defaults and defaults["mem_mb"] <= 4000 and defaults["runtime"] <= 60
    for rule, resources in profile["set-resources"].items():
        if rule not in GPU_RULES:
            assert "gpu" not in resources and "gres" not in resources, rule
            assert resources.get("mem_mb", 0) <= 16000, rule
    assert all(threads <= 2 for rule, threads in profile["set-threads"].items() if rule not in GPU_RULES)


def test_profile_names_only_rules_of_the_workflow(profile, tmp_path):
    rules = workflow_rules(tmp_path)
    assert GPU_RULES <= rules
    assert set(profile["set-resources"]) <= rules
    assert set(profile["set-threads"]) <= rules


def test_resource_names_are_those_the_executor_turns_into_sbatch_flags(profile):
    # snakemake-executor-plugin-slurm 2.x; anything else would be silently ignored.
    known = {"runtime", "mem_mb", "mem_mb_per_cpu", "cpus_per_task", "cpus_per_gpu", "gpu", "gpu_model",
             "gres", "slurm_partition", "slurm_account", "constraint", "qos", "slurm_extra", "nodes",
             "tasks", "tasks_per_gpu", "tmpdir", "disk_mb"}
    used = set(profile["default-resources"]).union(*profile["set-resources"].values())
    assert used <= known, used - known


def test_merged_lays_nested_mappings_over_each_other_without_changing_them():
    base = {"a": 1, "r": {"x": {"gpu": 1, "mem_mb": 10}, "y": {"mem_mb": 5}}, "l": [1, 2]}
    overlay = {"r": {"x": {"mem_mb": 3}}, "l": [3], "b": True}
    assert merged(base, overlay) == {
        "a": 1, "r": {"x": {"gpu": 1, "mem_mb": 3}, "y": {"mem_mb": 5}}, "l": [3], "b": True,
    }
    assert base["r"]["x"]["mem_mb"] == 10 and overlay == {"r": {"x": {"mem_mb": 3}}, "l": [3], "b": True}


def test_fit_to_node_caps_memory_cpus_and_threads_only():
    profile = {
        "default-resources": {"mem_mb": 4000, "runtime": 30},
        "set-resources": {"infer": {"gpu": 1, "mem_mb": 32000, "runtime": 720, "cpus_per_task": 8},
                          "small": {"mem_mb": 500}},
        "set-threads": {"infer": 8, "one": 1},
    }
    fitted = fit_to_node(profile, cpus=2, memory_mb=6000)
    assert fitted["default-resources"] == {"mem_mb": 3000, "runtime": 30}   # 6000 MiB / 2 CPUs
    assert fitted["set-resources"] == {"infer": {"gpu": 1, "mem_mb": 3000, "runtime": 720, "cpus_per_task": 2},
                                       "small": {"mem_mb": 500}}
    assert fitted["set-threads"] == {"infer": 2, "one": 1} and fitted["max-threads"] == 2
    assert profile["set-resources"]["infer"]["mem_mb"] == 32000             # input unchanged


def test_ci_profile_changes_only_test_settings(profile, tmp_path):
    ci = ci_profile(cpus=2, memory_mb=8000, partition=PARTITION, slurm_logdir=tmp_path / "logs")
    changed = {key for key in set(ci) | set(profile) if ci.get(key) != profile.get(key)}
    assert changed <= set(ci_overlay(PARTITION, tmp_path)) | {"set-resources", "set-threads", "max-threads"}
    for rule in GPU_RULES:     # the GPU requests and runtimes are the real profile's
        for key in ("gpu", "runtime"):
            assert ci["set-resources"][rule][key] == profile["set-resources"][rule][key]
    assert all(resources.get("mem_mb", 0) <= 4000 for resources in ci["set-resources"].values())
    written = load_profile(write_profile(ci, tmp_path / "profile") / "config.yaml")
    assert written == ci


def test_slurm_conf_describes_one_node_with_a_fake_gpu(profile, tmp_path):
    layout = Layout(tmp_path)
    node = Node(name="n1", cpus=3, real_memory_mb=7000, gpus=1)
    conf = slurm_cluster.render_slurm_conf(layout, node, ctld_port=7001, slurmd_port=7002, partition="p")
    lines = conf.splitlines()
    assert lines[0] == slurm_cluster.MARKER and lines[1] == f"# state: {layout.state}"
    settings = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith(("#", "NodeName", "PartitionName")))
    assert settings["SlurmctldPort"] == "7001" and settings["SlurmdPort"] == "7002"
    assert settings["GresTypes"] == "gpu" and settings["ProctrackType"] == "proctrack/linuxproc"
    assert settings["JobCompLoc"] == str(layout.jobcomp)
    # squeue keeps listing finished jobs long enough for the executor's status checks
    assert int(settings["MinJobAge"]) >= 3 * profile["slurm-init-seconds-before-status-checks"]
    assert "NodeName=n1 NodeAddr=127.0.0.1 Gres=gpu:1 CPUs=3 RealMemory=7000 State=UNKNOWN" in lines
    assert "PartitionName=p Nodes=ALL Default=YES MaxTime=INFINITE State=UP" in lines
    assert slurm_cluster.render_gres_conf(node) == "NodeName=n1 Name=gpu Count=1 File=/dev/null\n"
    no_gpu = Node(name="n1", cpus=3, real_memory_mb=7000, gpus=0)
    assert "Gres" not in slurm_cluster.render_slurm_conf(layout, no_gpu, 1, 2, "p")
    assert slurm_cluster.render_gres_conf(no_gpu) == ""


def test_memory_total_is_read_in_mib():
    assert slurm_cluster.memory_total_mb("MemFree: 5 kB\nMemTotal:       24684084 kB\n") == 24105


def test_parse_records_reads_jobcomp_and_scontrol_lines():
    text = (
        "JobId=7 UserId=root(0) Name=abc JobState=COMPLETED Partition=debug ReservationName= "
        "Tres=cpu=1,mem=1000M,node=1 ExitCode=0:0 \n\n"
        "JobId=8 JobState=COMPLETED Comment=rule_infer_wildcards_model=m TresPerJob=gres:gpu:1\n"
        "No jobs in the system\n"
    )
    first, second = parse_records(text)
    assert first["JobId"] == "7" and first["JobState"] == "COMPLETED" and first["ReservationName"] == ""
    assert first["Tres"] == "cpu=1,mem=1000M,node=1"
    assert second["Comment"] == "rule_infer_wildcards_model=m" and second["TresPerJob"] == "gres:gpu:1"


def test_system_conf_owner_tells_stale_links_from_foreign_configs(tmp_path):
    link = tmp_path / "slurm.conf"
    assert slurm_cluster.system_conf_owner(link) == "free"
    link.symlink_to(tmp_path / "gone.conf")
    assert slurm_cluster.system_conf_owner(link) == "stale"           # left by a killed run
    link.unlink()
    foreign = tmp_path / "site.conf"
    foreign.write_text("ClusterName=site\n")
    link.symlink_to(foreign)
    assert slurm_cluster.system_conf_owner(link) == "busy"            # somebody's real SLURM
    ours = Layout(tmp_path / "old")
    ours.etc.mkdir(parents=True)
    ours.conf.write_text(slurm_cluster.render_slurm_conf(ours, Node("n", 1, 100), 1, 2, "p"))
    ours.state.write_text(json.dumps({"pids": {"slurmctld": 2 ** 22 + 1}}))  # no such process
    link.unlink()
    link.symlink_to(ours.conf)
    assert slurm_cluster.system_conf_owner(link) == "stale"
    # A running daemon of that cluster: hands off (this test process stands in for it).
    me = os.path.basename(Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode())
    ours.state.write_text(json.dumps({"pids": {me: os.getpid()}}))
    assert slurm_cluster.system_conf_owner(link) == "busy"


def test_no_root_or_no_apt_is_a_reason_to_skip(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterUnavailable, match="needs root"):
        slurm_cluster.ensure_packages()
    with pytest.raises(ClusterUnavailable, match="needs root"):
        slurm_cluster.start(tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ClusterUnavailable, match="apt-get"):
        slurm_cluster.ensure_packages()


def test_stop_ends_only_the_recorded_daemons_and_only_our_link(tmp_path):
    layout = Layout(tmp_path / "cluster")
    layout.etc.mkdir(parents=True)
    link = tmp_path / "slurm.conf"
    link.symlink_to(layout.conf)
    bystander = subprocess.Popen(["sleep", "60"])
    daemon = subprocess.Popen(["sleep", "60"])
    try:
        # A recorded PID that now runs something else (PID reuse) is left alone.
        layout.state.write_text(json.dumps({"pids": {"slurmd": bystander.pid}, "linked_system_conf": str(link)}))
        assert slurm_cluster.stop(layout) == []
        assert bystander.poll() is None
        assert not link.exists() and not link.is_symlink()          # it pointed at our conf
        assert slurm_cluster.stop_process(daemon.pid, "sleep") and daemon.wait(timeout=5) is not None
        link.symlink_to(tmp_path / "someone-else.conf")
        slurm_cluster.stop(layout)
        assert link.is_symlink()                                      # not ours: kept
    finally:
        for process in (bystander, daemon):
            process.kill()
            process.wait()


def test_a_process_is_known_by_its_program_from_the_moment_popen_returns():
    # The command line is still empty for a moment after exec begins (seen on a loaded CI
    # machine); the identity check must not read that window as "not running".
    for _ in range(50):
        process = subprocess.Popen(["sleep", "60"])
        try:
            assert slurm_cluster.process_is(process.pid, "sleep")
            assert not slurm_cluster.process_is(process.pid, "slurmd")
        finally:
            process.kill()
            process.wait()
        assert not slurm_cluster.process_is(process.pid, "sleep")


def test_memory_sizes_convert_to_mib():
    assert mebibytes("1000M") == 1000 and mebibytes("2G") == 2048 and mebibytes("1T") == 1024 ** 2


# ---- the real cluster -----------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    """A single-node SLURM with one fake GPU, for this module; the finalizer stops exactly
    the daemons it started and removes the /etc/slurm/slurm.conf link only if it made it."""
    if os.environ.get(SYSTEM_TESTS) != "1":
        pytest.skip(f"would install SLURM and munge with apt and write /etc/munge and /etc/slurm; "
                    f"set {SYSTEM_TESTS}=1 to allow that (.ci/run does)")
    try:
        slurm_cluster.ensure_packages()
    except ClusterUnavailable as reason:
        pytest.skip(f"cannot run a single-node SLURM here: {reason}")
    # Not under pytest's tmp_path: its parents are mode 0700, and munged (user munge)
    # must reach its socket folder.
    base = Path(tempfile.mkdtemp(prefix="ladbench-slurm-"))
    try:
        running = slurm_cluster.start(base, slurm_cluster.this_machine(gpus=1), partition=PARTITION)
    except ClusterUnavailable as reason:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"cannot run a single-node SLURM here: {reason}")
    yield running
    running.stop()
    shutil.rmtree(base, ignore_errors=True)


def tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def diagnostics(cluster, slurm_logdir: Path, snakemake_output: str) -> str:
    """Everything needed to see why a run failed: snakemake's output, the daemons' logs,
    the SLURM log of every job that did not complete, and the queue."""
    parts = [f"---- snakemake (last 120 lines)\n{tail(snakemake_output, 120)}",
             f"---- SLURM daemons\n{cluster.logs()}"]
    try:
        records = cluster.job_records()
    except slurm_cluster.ClusterFailed as error:
        records, parts = [], parts + [f"---- scontrol failed: {error}"]
    for record in records:
        if record.get("JobState") != "COMPLETED":
            job_logs = list(slurm_logdir.rglob(f"{record.get('JobId')}.log"))
            text = "\n".join(tail(path.read_text(errors="replace"), 40) for path in job_logs)
            parts.append(f"---- job {record.get('JobId')} {record.get('JobState')} {record.get('Comment', '')}\n{text}")
    return "\n".join(parts)


def run_through_slurm(workdir: Path, profile_dir: Path, cluster, slurm_logdir: Path, limit: int,
                      configfile: Path) -> str:
    """Run the demo DAG with the profile in ``profile_dir``; snakemake gets SIGINT after
    ``limit`` seconds (so it cancels its SLURM jobs), SIGKILL 30 s later."""
    command = ["timeout", "-s", "INT", "-k", "30", str(limit),
               *snakemake_command(workdir, "--workflow-profile", str(profile_dir), configfile=configfile)]
    result = subprocess.run(command, capture_output=True, text=True, env=cluster.env(environment()),
                            stdin=subprocess.DEVNULL, timeout=limit + 60)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        why = f"timed out after {limit} s" if result.returncode == 124 else f"exit {result.returncode}"
        pytest.fail(f"snakemake through SLURM failed ({why})\n{diagnostics(cluster, slurm_logdir, output)}",
                    pytrace=False)
    return output


def output_summary(workdir: Path, configfile: Path) -> list[dict[str, str]]:
    """Every output file of the demo DAG with its rule and status (`snakemake --summary`)."""
    rows = []
    for line in snakemake(workdir, "--summary", configfile=configfile).splitlines():
        fields = line.split("\t")
        if len(fields) == 6 and fields[0] != "output_file":
            rows.append(dict(zip(("file", "date", "rule", "log", "status", "plan"), fields)))
    assert rows, f"snakemake --summary listed no outputs in {workdir}"
    return rows


FILE_SIGNATURES = {".png": b"\x89PNG", ".pdf": b"%PDF", ".h5": b"\x89HDF"}


def mebibytes(size: str) -> int:
    """A SLURM memory size (``1000M``, ``10G``) in MiB."""
    units = {"M": 1, "G": 1024, "T": 1024 ** 2}
    return int(float(size[:-1]) * units[size[-1]]) if size[-1] in units else int(size)


def rule_of(comment: str) -> str:
    """The rule of a job from the executor's --comment: rule_<name>[_wildcards_<values>]."""
    assert comment.startswith("rule_"), comment
    return comment.removeprefix("rule_").split("_wildcards_")[0]


@pytest.mark.slow
@pytest.mark.slurm
def test_demo_dag_runs_through_the_slurm_profile(cluster, tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    slurm_logdir = tmp_path / "slurm_logs"
    config = demo_config_with(tmp_path, shards=SHARDS)
    planned = planned_jobs(workdir, configfile=config)
    # `all` only gathers inputs: snakemake finishes it itself, no SLURM job.
    expected_jobs = {rule: count for rule, count in planned.items() if rule != "all"}
    assert GPU_RULES <= set(expected_jobs)
    assert expected_jobs["infer"] == SHARDS * expected_jobs["merge_shards"]     # every cache from 2 shard jobs
    node = cluster.node
    profile_dir = write_profile(
        ci_profile(node.cpus, node.real_memory_mb, cluster.partition, slurm_logdir), tmp_path / "profile",
    )

    output = run_through_slurm(workdir, profile_dir, cluster, slurm_logdir, RUN_LIMIT, config)

    # Every rule instance ran as a SLURM job of this one run, and completed.
    records = cluster.job_records()
    explain = f"\n{diagnostics(cluster, slurm_logdir, output)}"
    assert Counter(rule_of(r["Comment"]) for r in records) == Counter(expected_jobs), explain
    assert len({r["JobName"] for r in records}) == 1, "jobs of more than one run"
    assert all(r["JobState"] == "COMPLETED" and r["ExitCode"] == "0:0" for r in records), explain
    # ... and slurmctld itself recorded each one as completed (jobcomp/filetxt).
    completed = {r["JobId"] for r in cluster.completed_jobs() if r["JobState"] == "COMPLETED"}
    assert {r["JobId"] for r in records} <= completed, explain
    assert output.count("has been submitted with SLURM jobid") == len(records)

    # The profile's requests reached sbatch: a GPU for the GPU rules only (and SLURM
    # granted the node's single fake GPU), memory fitted to the node, runtimes as set.
    profile = load_profile(profile_dir / "config.yaml")
    for record in records:
        rule = rule_of(record["Comment"])
        fitted = profile["set-resources"].get(rule, {})
        if rule in GPU_RULES:
            assert record.get("TresPerJob") == "gres:gpu:1", record
        else:
            assert "gpu" not in record.get("TresPerJob", ""), record
        assert mebibytes(record["MinMemoryNode"]) <= node.real_memory_mb, record
        if "mem_mb" in fitted:   # (other rules: their own `resources:` or the default)
            assert mebibytes(record["MinMemoryNode"]) == fitted["mem_mb"], record
        assert record["Partition"] == cluster.partition
    infer_limits = {r["TimeLimit"] for r in records if rule_of(r["Comment"]) == "infer"}
    assert infer_limits == {"12:00:00"}, infer_limits            # runtime: 720 minutes

    # Every output of the demo is there, up to date, and of the right kind.
    assert planned_jobs(workdir, configfile=config) == {}
    outputs = output_summary(workdir, config)
    assert Counter(row["rule"] for row in outputs).keys() >= set(expected_jobs), outputs
    for row in outputs:
        path = workdir / row["file"]
        assert row["status"] == "ok" and path.exists(), row
        if path.is_file():
            assert path.stat().st_size > 0, row
            signature = FILE_SIGNATURES.get(path.suffix)
            if signature:
                assert path.read_bytes()[: len(signature)] == signature, row
    by_suffix = Counter(Path(row["file"]).suffix for row in outputs)
    assert by_suffix[".png"] > 0 and by_suffix[".png"] == by_suffix[".pdf"], by_suffix   # figures
    shards = [row for row in outputs if row["rule"] == "infer" and row["file"].endswith(".h5")]
    assert len(shards) == expected_jobs["infer"], shards
    caches = [row for row in outputs if row["rule"] == "merge_shards" and row["file"].endswith(".h5")]
    assert len(caches) == expected_jobs["merge_shards"], caches
    tables = [workdir / row["file"] for row in outputs if row["file"].endswith(".md")]
    assert any("LAD" in table.read_text() for table in tables), tables
