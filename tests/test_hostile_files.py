"""Files as a hostile user or a full disk leaves them (issue #35): locks and temporary files
never follow a symbolic link, killed runs' temporaries are removed, a config is data (no
YTE templating), a full disk or a file-size limit and Ctrl-C are one line with the work kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ladbench import atomic
from ladbench.atomic import LockedError, atomic_write_text, hold_lock, lock_output_dir
from ladbench.hdf5 import writing


# ------------------------------------------------------------------------ locks and symlinks
@pytest.mark.parametrize("lock", ["output", "workflow"])
def test_a_lock_path_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path, lock):
    """The issue's attack: `ln -s ~/victim out.h5.lock; ladbench infer --out out.h5` wrote the
    holder's line into the victim; a link at {output_dir}/.workflow.lock did the same."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    link = out / ("out.h5.lock" if lock == "output" else ".workflow.lock")
    link.symlink_to(victim)
    with pytest.raises(LockedError) as error:
        if lock == "output":
            with writing(out / "out.h5", "inference cache"):
                pass
        else:
            lock_output_dir(out)
    assert str(error.value).startswith(f"{link}: a symbolic link where a lock file goes; refused")
    assert "\n" not in str(error.value)
    assert victim.read_text() == "precious\n" and link.is_symlink()


def test_a_lock_on_a_plain_file_still_works(tmp_path):
    lock = hold_lock(tmp_path / "x.lock", "x")
    assert "pid" in (tmp_path / "x.lock").read_text()
    lock.release()
    assert not (tmp_path / "x.lock").exists()


def test_a_temporary_never_writes_through_a_planted_link(tmp_path, monkeypatch):
    """A link planted at this process's temporary name is removed, not followed; one planted
    after that (a race) is refused by O_EXCL | O_NOFOLLOW, never written through."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    target = tmp_path / "out.json"
    (tmp_path / f"out.json.{os.getpid()}.tmp").symlink_to(victim)
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n" and victim.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "victim"]

    monkeypatch.setattr(atomic, "_remove", lambda path: None)       # the link arrives after the clean-up
    (tmp_path / f"out.json.{os.getpid()}.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        atomic_write_text(target, "newer\n")
    assert target.read_text() == "new\n" and victim.read_text() == "precious\n"


def test_a_killed_runs_temporaries_are_removed_by_the_next_write(tmp_path):
    """`<out>.<pid>.tmp` of a dead pid (a killed run's full-size cache copy) is removed; one of
    a live process (another writer) is kept."""
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
    dead, alive = int(finished.stdout), os.getppid()
    target = tmp_path / "c.h5"
    (tmp_path / f"c.h5.{dead}.tmp").write_bytes(b"\0" * 1000)
    (tmp_path / f"c.h5.{alive}.tmp").write_bytes(b"in flight")
    (tmp_path / "other.h5.1.tmp").write_bytes(b"another output's")
    atomic_write_text(target, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.h5", f"c.h5.{alive}.tmp", "other.h5.1.tmp"]


# ------------------------------------------------------------------------ a config is data
def _yte_config(folder: Path, name: str = "config.yaml") -> Path:
    """The demo config with YTE turned on and an expression that would leave a file behind."""
    from workflow_runner import DEMO_CONFIG
    path = folder / name
    path.write_text(f"__use_yte__: true\nmarker: ?__import__('pathlib').Path({str(folder / 'PWNED')!r}).touch()\n"
                    + DEMO_CONFIG.read_text())
    return path


def test_the_yte_switch_is_refused_wherever_it_is(tmp_path):
    from ladbench.config import ConfigError, read_yaml
    path = tmp_path / "c.yaml"
    for text, line in [("__use_yte__: true\nx: 1\n", 1), ("a:\n  b:\n    __use_yte__: false\n", 3)]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=rf"^{path}: line {line}: __use_yte__ turns on Snakemake's YTE "
                                              r"templating.*a config is data"):
            read_yaml(path)
    path.write_text("x: '?not an expression, just text'\n")
    assert read_yaml(path) == {"x": "?not an expression, just text"}


@pytest.mark.parametrize("args", [["--list-rules"], ["-n"]])
def test_a_yte_config_in_the_working_folder_is_refused_before_it_runs(tmp_path, args):
    """The issue's case: as ./config.yaml even `--list-rules` ran the config's Python. The
    Snakefile reads the raw file before its `configfile:` directive and stops there."""
    from workflow_runner import ROOT, environment
    _yte_config(tmp_path)
    result = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "--snakefile", str(ROOT / "Snakefile"),
                             "--directory", str(tmp_path), "--cores", "1", *args],
                            capture_output=True, text=True, env=environment(None), timeout=300)
    assert result.returncode != 0
    assert "config.yaml: line 1: __use_yte__ turns on Snakemake's YTE templating" in result.stderr + result.stdout
    assert not (tmp_path / "PWNED").exists()


def test_command_line_configfiles_are_found_as_snakemake_reads_them():
    from ladbench.config import command_line_configfiles
    argv = ["-n", "--configfile", "a.yaml", "b.yaml", "--cores", "2", "target", "--configfiles=c.yaml",
            "--configfile", "d.yaml", "-p", "e.yaml", "--", "--configfile", "f.yaml"]
    assert command_line_configfiles(argv) == ["a.yaml", "b.yaml", "c.yaml", "d.yaml"]
    assert command_line_configfiles(["--config", "x=1", "--configfile"]) == []


#: Every profile the workflow ships, and the way each is chosen: none named (Snakemake finds
#: ``profiles/default`` beside the Snakefile), or named as the README names them.
PROFILES = [[], ["--workflow-profile", "workflow/profiles/default"], ["--workflow-profile", "workflow/profiles/slurm"]]


def test_every_profile_the_workflow_ships_is_tested():
    from workflow_runner import ROOT
    shipped = {path.parent.relative_to(ROOT).as_posix() for path in ROOT.glob("workflow/profiles/*/config.yaml")}
    assert shipped == {args[1] for args in PROFILES if args}
    assert (ROOT / "profiles" / "default" / "config.yaml").is_file()


@pytest.mark.parametrize("profile", PROFILES, ids=["found", "default", "slurm"])
@pytest.mark.parametrize("spelling", ["--configfile", "--configfile="])
def test_a_yte_configfile_is_refused_before_snakemake_reads_it(tmp_path, profile, spelling):
    """Snakemake (9.x) evaluates a --configfile's YTE while it parses its command line, before
    any workflow code; the profiles, read earlier, refuse the file in one line and its Python
    never runs. `ladbench where` checks a config without evaluating anything."""
    from workflow_runner import ROOT, environment
    config = _yte_config(tmp_path, "evil.yaml")
    configfile = [f"--configfile={config}"] if spelling.endswith("=") else ["--configfile", str(config)]
    result = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "-n", "--cores", "1", *profile,
                             *configfile, "--directory", str(tmp_path)],
                            capture_output=True, text=True, cwd=ROOT, env=environment(None), timeout=300)
    assert result.returncode == 1 and not (tmp_path / "PWNED").exists()
    assert result.stderr.strip().splitlines()[-1] == (
        f"invalid configuration: {config}: line 1: __use_yte__ turns on Snakemake's YTE templating, which runs "
        "the Python in the config's ?-expressions; a config is data: remove it")
    assert "Traceback" not in result.stderr + result.stdout
    where = subprocess.run([str(Path(sys.executable).parent / "ladbench"), "where", "--configfile", str(config)],
                           capture_output=True, text=True, cwd=tmp_path, env=environment(None), timeout=300)
    assert where.returncode != 0 and not (tmp_path / "PWNED").exists()
    assert where.stderr.strip().splitlines()[-1].startswith("ladbench where: error: ")
    assert "__use_yte__" in where.stderr


def test_a_configfile_that_is_not_utf8_is_one_line(tmp_path):
    """Snakemake decodes a --configfile while it parses its command line (a traceback before);
    the profile reads it first."""
    from workflow_runner import ROOT, environment
    config = tmp_path / "latin.yaml"
    config.write_bytes(b"output_dir: r\xe9sultats\n")
    result = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "-n", "--cores", "1",
                             "--configfile", str(config), "--directory", str(tmp_path)],
                            capture_output=True, text=True, cwd=ROOT, env=environment(None), timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr + result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        f"invalid configuration: {config}: not UTF-8 text (byte 13: invalid continuation byte); save it as UTF-8")


# ------------------------------------------------------------------------ full disks, Ctrl-C
_LIMITED = """
import resource, signal, sys
sys.path.insert(0, {tests!r})
from test_integrity import _writer, _scores
from pathlib import Path
from ladbench.cli import one_line
writer, n = _writer(Path({folder!r}))
if {phase!r} == "assembly":
    writer.write(list(range(n)), _scores(range(n)))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)          # as a shell's `ulimit -f`: EFBIG, not a kill
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
try:
    if {phase!r} == "chunks":
        writer.write(list(range(n)), _scores(range(n)))
    writer.finish({{}})
except OSError as error:
    print(one_line(error), file=sys.stderr)
    sys.exit(2)
"""


@pytest.mark.parametrize("phase", ["chunks", "assembly"])
def test_a_file_size_limit_is_one_line_and_the_work_kept(tmp_path, phase):
    """The issue's case: `ulimit -f` during the cache's final assembly ended in a segmentation
    fault after thousands of lines of h5py tracebacks; during chunk writes a 33-line traceback.
    Each limit (from the first bytes on) is now one line naming the file, the rows finished
    before are kept, and the rerun's cache equals an uninterrupted one."""
    from test_integrity import _writer, _scores
    from ladbench.inference.cache import read_cache
    sys.path.insert(0, str(Path(__file__).parent))
    tests = str(Path(__file__).parent)
    for limit in (200, 1000, 1500, 2000, 5000):
        folder = tmp_path / f"{phase}{limit}"
        folder.mkdir()
        script = _LIMITED.format(tests=tests, folder=str(folder), phase=phase, limit=limit)
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert result.returncode == 2, (limit, result.returncode, result.stderr[-2000:])   # not -11 (SIGSEGV)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and str(folder / "c.h5") in lines[0], (limit, result.stderr[-3000:])
        assert "disk is full" in lines[0] and "kept" in lines[0]
        assert (folder / "c.h5.partial").is_dir() and not (folder / "c.h5").exists()
        assert not list(folder.glob("*.tmp")) and not list((folder / "c.h5.partial").glob("*.tmp"))
        writer, n = _writer(folder)
        writer.write(writer.pending_rows(), _scores(writer.pending_rows()))
        writer.finish({})
        assert read_cache(str(folder / "c.h5"))["scores"][:, 0].tolist() == list(range(n))


def test_a_full_disk_under_the_report_names_the_folder(tmp_path, monkeypatch):
    """A report on a full disk said `No space left on device` without a path."""
    import errno
    from ladbench.atomic import replacing_together
    real_open = open

    def full(path, *args, **kwargs):
        handle = real_open(path, *args, **kwargs)
        if str(path).endswith(".tmp"):
            handle.write = lambda data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device"))
        return handle
    with pytest.raises(OSError) as error:
        with replacing_together([tmp_path / "report" / "table1.md", tmp_path / "report" / "table1.csv"]) as files:
            monkeypatch.setattr("builtins.open", full)
            with open(files[0], "w") as handle:
                handle.write("| a |")
    monkeypatch.undo()
    assert str(error.value).startswith(f"[Errno 28] {tmp_path / 'report'}: cannot write (No space left on device")
    assert not list((tmp_path / "report").iterdir())


def test_ctrl_c_is_one_line_and_the_work_kept(tmp_path):
    """Ctrl-C (SIGINT) printed a 25-line traceback."""
    # Python's own SIGINT handler, as in a terminal: a process started in the background inherits
    # SIGINT ignored (a non-interactive shell's `&`), and Python then installs none
    script = ("import os, signal, sys\n"
              "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from ladbench import cli\n"
              "from ladbench.stages import calibrate\n"
              "def interrupted(args):\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "calibrate.run = interrupted\n"
              "cli.main(['calibrate', '--cache', 'x.h5', '--n-cal', '2', '--seed', '0', '--out', 'c.npz'])\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 130
    assert result.stderr.strip().splitlines() == [
        "ladbench calibrate: interrupted (Ctrl-C); the work finished so far is kept, and a rerun goes on from it"]


# ------------------------------------------------------------------------ the workflow
@pytest.mark.slow
def test_an_edited_evaluation_stops_the_workflow_before_any_table(demo_run, tmp_path):
    """The issue's case: an evaluation edited in a workflow's output folder (its digest
    stripped, Table 1's number changed) reached Table 1 with a warning only in the job's log.
    Now the jobs that read it fail, naming the file; Table 1 never shows the edited number."""
    import json
    import shutil
    from workflow_runner import environment, snakemake_command
    workdir = tmp_path / "copy"
    shutil.copytree(demo_run, workdir, symlinks=True)
    evaluation = workdir / "results/demo/eval/tiny_qwen2_5_vl/scenes_random_N4/vanilla/cal-scenes_random_N4.json"
    doc = json.loads(evaluation.read_text())
    del doc["content_sha256"]
    doc["methods"]["vanilla"]["acc_mean"] = 95.9
    evaluation.write_text(json.dumps(doc))
    result = subprocess.run(snakemake_command(workdir, "--cores", "1"), capture_output=True, text=True,
                            env=environment(None), timeout=1200)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    # each job that read it (its log: Snakemake names it) stopped with one line naming the file
    logs = [path for path in (workdir / "results/demo/logs/report").rglob("*.log") if path.stat().st_mtime >=
            evaluation.stat().st_mtime]
    lines = [path.read_text().strip().splitlines()[-1] for path in logs]
    expected = "results/demo/eval/tiny_qwen2_5_vl/scenes_random_N4/vanilla/cal-scenes_random_N4.json: evaluation file: " \
               "has no content_sha256"
    assert lines and all(line.startswith("ladbench ") and expected in line for line in lines), (lines, output[-3000:])
    # Table 1 never shows the edited number: kept as it was where its job never ran (another job
    # failed first), or removed by Snakemake with the rest of a failed job's outputs where it ran
    table = workdir / "results/demo/report/table1.md"
    assert not table.exists() or "95.9" not in table.read_text()
