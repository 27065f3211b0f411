"""The package's modules import each other without cycles, counting the imports inside
functions too (a lazy import hides a cycle until the day it is hoisted); the command layer
is on top: no domain module imports it, and none builds a command line (the ``ladbench``
subcommands live in ``ladbench.stages`` and ``ladbench.cli``)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def module_files(root: Path = SRC) -> dict[str, Path]:
    files = {}
    for path in (root / "ladbench").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package modules it imports (``from package import submodule`` counts as
    the submodule, not as the package's ``__init__``)."""
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join((package[: len(package) - node.level + 1] if node.level else [])
                                + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:      # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph(module_files())) == []


def test_the_cycle_finder_finds_a_lazy_cycle(tmp_path):
    package = tmp_path / "ladbench"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models" / "__init__.py").write_text("")
    (package / "models" / "base.py").write_text("def load():\n    from ladbench.attention import NAME\n")
    (package / "attention.py").write_text("from .models.base import load\nNAME = 'x'\n")
    (package / "other.py").write_text("from ladbench.models import base\n")
    assert cycles(import_graph(module_files(tmp_path))) == [["ladbench.attention", "ladbench.models.base"]]


@pytest.mark.parametrize("name", sorted(module_files()))
def test_only_command_modules_parse_arguments(name):
    """argparse belongs to the subcommands (ladbench.stages) and to cli.py."""
    if name.startswith("ladbench.stages.") or name == "ladbench.cli":
        return
    assert "argparse" not in module_files()[name].read_text(), f"{name} builds a command line"


COMMAND_LAYER = ("ladbench.stages", "ladbench.cli", "ladbench.__main__")


def in_command_layer(name: str) -> bool:
    return any(name == top or name.startswith(f"{top}.") for top in COMMAND_LAYER)


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(domain module, command module) for every import of the command layer from below it."""
    return sorted((name, target) for name, targets in graph.items() if not in_command_layer(name)
                  for target in targets if in_command_layer(target))


def test_no_domain_module_imports_the_command_layer():
    """``stages/`` and ``cli.py`` stand on top: they parse, call one domain function and write."""
    assert upward_imports(import_graph(module_files())) == []


def test_the_direction_check_finds_an_upward_import(tmp_path):
    package = tmp_path / "ladbench"
    (package / "stages").mkdir(parents=True)
    for init in (package / "__init__.py", package / "stages" / "__init__.py"):
        init.write_text("")
    (package / "stages" / "options.py").write_text("from ladbench.analysis import analyze\n")
    (package / "analysis.py").write_text("def analyze():\n    from ladbench.stages.options import X\n")
    (package / "cli.py").write_text("import ladbench.stages.options\n")
    assert upward_imports(import_graph(module_files(tmp_path))) == [("ladbench.analysis", "ladbench.stages.options")]
