"""The progress bar of the long jobs (features, infer): tqdm on stderr, rows done, rate and
time left. On a terminal it redraws in place; when stderr is not a terminal (a Snakemake job's
log, a SLURM output file) it writes lines instead: one after a batch ends, at most every
:data:`LOG_INTERVAL_S` seconds, and one every :data:`LOG_INTERVAL_S` seconds while no batch
ends (a slow batch: the elapsed time and the time left move on), so that a log says how the
job is doing at least that often without growing by a line per batch."""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable, TextIO

from tqdm import tqdm

#: seconds between two lines of progress in a log (stderr not a terminal)
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


class _LoggedBar(tqdm):
    """tqdm writing lines, with a heartbeat thread for the minutes no batch ends; ``note()``, if
    given, is read afresh for each heartbeat's line (a generative job's tokens move on between
    the chunks that end)."""

    def __init__(self, *args: Any, note: Callable[[], str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.note = note
        self._stopped = threading.Event()
        threading.Thread(target=self._heartbeat, name="progress", daemon=True).start()

    def _heartbeat(self) -> None:
        while not self._stopped.wait(LOG_INTERVAL_S):
            self.beat()

    def beat(self) -> None:
        """A line now if none was written for :data:`LOG_INTERVAL_S` seconds."""
        if not self.disable and self._time() - self.last_print_t >= LOG_INTERVAL_S:
            if self.note is not None:
                self.set_postfix_str(self.note(), refresh=False)
            self.refresh()

    def close(self) -> None:
        self._stopped.set()
        super().close()


def progress_bar(total: int, *, desc: str, unit: str, initial: int = 0, stream: TextIO | None = None,
                 note: Callable[[], str] | None = None) -> tqdm:
    """A bar of ``total`` rows (``initial`` done before) on ``stream`` (default stderr). ``note()``:
    what the job adds after its rate; read at every :meth:`advance` and, in a log, every heartbeat."""
    stream = stream or sys.stderr
    if hasattr(stream, "isatty") and stream.isatty():
        bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=stream)
        bar.note = note
        return bar
    return _LoggedBar(total=total, initial=initial, desc=desc, unit=unit, file=_Lines(stream), note=note,
                      mininterval=LOG_INTERVAL_S, maxinterval=LOG_INTERVAL_S, ascii=True)


def advance(bar: tqdm, rows: int) -> None:
    """``rows`` more done, the bar's note read afresh (:func:`progress_bar`)."""
    if getattr(bar, "note", None) is not None:
        bar.set_postfix_str(bar.note(), refresh=False)
    bar.update(rows)
