# What Snakemake itself needs: the study of the validated config, whose methods (the
# package's ladbench.workflow, unit-tested) give every rule its paths, target lists, flags
# and the methods of each cache; the start-up checks; one workflow per output folder.
import sys

from ladbench.atomic import LockedError, lock_output_dir
from ladbench.config import ConfigError
from ladbench.workflow import flags, name_pattern, output_folder, start, start_run

# A cluster job's Snakemake (two per SLURM job) skips the model checks its run made at its start.
_in_job = workflow.remote_exec or workflow.subprocess_exec
try:
    study, _warnings = start(
        config, workflow.overwrite_configfiles, workflow.source_path("../schemas/config.schema.yaml"), report, _in_job
    )
except ConfigError as error:
    raise WorkflowError(f"invalid configuration: {error}")
for _warning in _warnings:
    print(f"WARNING: {_warning}", file=sys.stderr)
study.prepare_jobs()

# One workflow per output folder: when there is work to do (not on a dry run, nor in a
# cluster job), the workflow takes {OUT}/.workflow.lock; a second one, started from any
# folder, stops here naming the first. Released at the end (or when the process dies).
_OUTPUT_LOCK = []


onstart:
    # The hub models not on this machine yet: their config.json fetched and checked (a run only).
    try:
        for _warning in start_run(config, workflow.overwrite_configfiles):
            print(f"WARNING: {_warning}", file=sys.stderr)
    except ConfigError as error:
        raise WorkflowError(f"invalid configuration: {error}") from None
    try:
        _OUTPUT_LOCK.append(lock_output_dir(study.out))
    except LockedError as error:
        raise WorkflowError(str(error)) from None


onsuccess:
    for _lock in _OUTPUT_LOCK:
        _lock.release()


onerror:
    for _lock in _OUTPUT_LOCK:
        _lock.release()
