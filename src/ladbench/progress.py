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


class NotedBar(tqdm):
    """tqdm with a ``note()`` (if given) after the rate, read afresh whenever a line is written
    through :meth:`advance` (a generative job's tokens and KV memory)."""

    def __init__(self, *args: Any, note: Callable[[], str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.note = note

    def advance(self, rows: int) -> None:
        """``rows`` more done, the note read afresh."""
        self._read_note()
        self.update(rows)

    def _read_note(self) -> None:
        if self.note is not None:
            self.set_postfix_str(self.note(), refresh=False)


class _LoggedBar(NotedBar):
    """:class:`NotedBar` writing lines, with a heartbeat thread for the minutes no batch ends
    (its line reads the note afresh too: a generative job's tokens move on between the chunks
    that end)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stopped = threading.Event()
        threading.Thread(target=self._heartbeat, name="progress", daemon=True).start()

    def _heartbeat(self) -> None:
        while not self._stopped.wait(LOG_INTERVAL_S):
            self.beat()

    def beat(self) -> None:
        """A line now if none was written for :data:`LOG_INTERVAL_S` seconds."""
        if not self.disable and self._time() - self.last_print_t >= LOG_INTERVAL_S:
            self._read_note()
            self.refresh()

    def close(self) -> None:
        self._stopped.set()
        super().close()


def progress_bar(total: int, *, desc: str, unit: str, initial: int = 0, stream: TextIO | None = None,
                 note: Callable[[], str] | None = None) -> NotedBar:
    """A bar of ``total`` rows (``initial`` done before) on ``stream`` (default stderr). ``note()``:
    what the job adds after its rate; read at every ``advance`` and, in a log, every heartbeat."""
    stream = stream or sys.stderr
    if hasattr(stream, "isatty") and stream.isatty():
        return NotedBar(total=total, initial=initial, desc=desc, unit=unit, file=stream, note=note)
    return _LoggedBar(total=total, initial=initial, desc=desc, unit=unit, file=_Lines(stream), note=note,
                      mininterval=LOG_INTERVAL_S, maxinterval=LOG_INTERVAL_S, ascii=True)

