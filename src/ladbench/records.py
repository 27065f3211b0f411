"""The readers of the evaluation and analysis records (docs/formats.md §6, §8): each JSON checked
against its content digest and its ``.npz`` against the pair's. Below every reader of them (the
report, the explorer, the organism's outcomes)."""
from __future__ import annotations

from pathlib import Path

from ladbench.atomic import read_arrays_beside, read_signed_json

_REBUILD_EVALUATION = "rebuild it with `ladbench evaluate` (or delete it and rerun the workflow)"
_REBUILD_ANALYSIS = "rebuild it with `ladbench analyze` (or delete it and rerun the workflow)"


def read_evaluation(path: str | Path) -> dict:
    """An evaluation file (docs/formats.md §6), checked against its content digest (required)."""
    return read_signed_json(path, "evaluation file", _REBUILD_EVALUATION, required=True)


def read_analysis(path: str | Path) -> dict:
    """An analysis file (docs/formats.md §8), checked against its content digest (required)."""
    return read_signed_json(path, "analysis file", _REBUILD_ANALYSIS, required=True)


def evaluation_predictions(path: str | Path, evaluation: dict | None = None) -> dict:
    """The predictions ``.npz`` written with the evaluation ``path`` (read with
    :func:`read_evaluation` unless given), checked: its digest, and that it is the pair's."""
    doc = read_evaluation(path) if evaluation is None else evaluation
    return read_arrays_beside(path, doc, "evaluation file", _REBUILD_EVALUATION)


def analysis_arrays(path: str | Path, analysis: dict | None = None) -> dict:
    """The per-row ``.npz`` written with the analysis ``path``, checked as :func:`evaluation_predictions`."""
    doc = read_analysis(path) if analysis is None else analysis
    return read_arrays_beside(path, doc, "analysis file", _REBUILD_ANALYSIS)
