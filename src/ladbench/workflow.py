"""The workflow's logic, in Python that tests and linters read: the Snakefile's rules take
their paths, target lists, flags and the methods of each cache from here."""

from __future__ import annotations

import shlex

__all__ = ["flags"]


def flags(**options) -> str:
    """Command-line flags from keyword options: tau=5 -> --tau 5; True -> bare flag;
    False/None -> omitted; lists -> repeated values."""
    parts = []
    for key, value in options.items():
        flag = f"--{key.replace('_', '-')}"
        if value is None or value is False:
            continue
        if value is True:
            parts.append(flag)
        elif isinstance(value, (list, tuple)):
            parts.append(f"{flag} {' '.join(shlex.quote(str(v)) for v in value)}")
        else:
            parts.append(f"{flag} {shlex.quote(str(value))}")
    return " ".join(parts)
