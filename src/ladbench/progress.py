"""The progress bar of the long jobs (features, infer): tqdm on stderr, rows done, rate and
time left. On a terminal it redraws in place; when stderr is not a terminal (a Snakemake job's
log, a SLURM output file) it writes one line at a time, at most every :data:`LOG_INTERVAL_S`
seconds while rows are done, so that a log says how the job is doing without growing by a
line per batch."""
from __future__ import annotations

import sys
from typing import Any, TextIO

#: seconds between two lines of progress in a log (stderr not a terminal); the bar is updated
#: after every batch, so a line follows within this time of each batch that ends
LOG_INTERVAL_S = 10.0


class _Lines:
    """A stream for tqdm that turns its in-place redraws (``\\r`` + status) into lines."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(total: int, *, desc: str, unit: str, initial: int = 0, stream: TextIO | None = None) -> Any:
    """A tqdm bar of ``total`` rows (``initial`` done before) on ``stream`` (default stderr)."""
    from tqdm import tqdm

    stream = stream or sys.stderr
    if hasattr(stream, "isatty") and stream.isatty():
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=stream)
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=_Lines(stream), mininterval=LOG_INTERVAL_S,
                maxinterval=LOG_INTERVAL_S, ascii=True)
