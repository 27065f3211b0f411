"""Plugins: code of the user's that registers prompt variants
(:func:`ladbench.variants.register_variant`) and methods (:func:`ladbench.methods.register_method`)
when imported. A plugin is code the user trusts: importing it runs it, with the user's rights.

Two ways in, both imported by every ``ladbench`` command and before a config is validated:

- an installed distribution's entry point in the ``ladbench.plugins`` group, naming a module
  (in its ``pyproject.toml``: ``[project.entry-points."ladbench.plugins"] my_name = "my_pkg.variants"``);
  installing the distribution is enough;
- a module on ``PYTHONPATH`` named in the config's ``plugins`` list; the workflow hands the
  list to its jobs in the environment variable ``LADBENCH_PLUGINS`` (comma-separated), which
  ``ladbench`` reads at start-up (set it yourself to run a stage by hand).
"""

from __future__ import annotations

import importlib
import os
import traceback
from importlib.metadata import entry_points
from typing import Callable, Iterable

__all__ = ["ENTRY_POINT_GROUP", "PLUGINS_ENV", "load_plugins"]

#: the entry-point group of installed plugins
ENTRY_POINT_GROUP = "ladbench.plugins"
#: environment variable naming plugin modules (comma-separated): the workflow's hand-over of the config's list
PLUGINS_ENV = "LADBENCH_PLUGINS"

_LOADED: list[str] = []


def load_plugins(modules: Iterable[str] | None = None) -> list[str]:
    """Import the installed plugins (entry points of ``ladbench.plugins``), then the modules
    ``modules`` (default: those named in ``$LADBENCH_PLUGINS``); each registers its variants
    and methods when imported. Returns every plugin imported so far; a plugin that cannot be
    imported or raises is a ValueError of one line naming it."""
    for point in entry_points(group=ENTRY_POINT_GROUP):
        what = f"plugin {point.value!r} (entry point {point.name!r} of {ENTRY_POINT_GROUP})"
        _load(point.value, what, point.load)
    named_by = ""
    if modules is None:
        modules = [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
        named_by = f" (named by ${PLUGINS_ENV})"
    for name in modules:
        _load(name, f"plugin module {name!r}{named_by}", lambda name=name: importlib.import_module(name),
              remedy="; put its folder on PYTHONPATH")
    return list(_LOADED)


def _load(name: str, what: str, load: Callable[[], object], remedy: str = "") -> None:
    if name in _LOADED:
        return
    module = name.partition(":")[0]
    try:
        load()
    except ImportError as exc:
        raise ValueError(f"{what} cannot be imported ({exc}){remedy}") from None
    except Exception as exc:          # noqa: BLE001 (whatever a plugin raises is the plugin's fault: one line)
        where = next((f"{frame.filename}:{frame.lineno}" for frame in reversed(traceback.extract_tb(exc.__traceback__))
                      if module.replace(".", "/") in frame.filename), module)
        raise ValueError(f"{what} failed while being imported ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:300]}, at {where}); fix the plugin or remove it") from None
    _LOADED.append(name)
