"""The package's modules import each other without cycles, counting the imports inside
functions too (a lazy import hides a cycle until the day it is hoisted); the command layer
is on top: no domain module imports it, and none builds a command line (the ``ladbench``
subcommands live in ``ladbench.stages`` and ``ladbench.cli``); and no import runs back up the
package's floors (:data:`FLOORS`: the ground, the domain's leaves and the config, what the
stages are made of, the stages' work, the report, the workflow, the commands)."""
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


def write_package(root: Path, modules: dict[str, str]) -> None:
    """A ``ladbench`` package under ``root`` holding ``modules`` (path in the package -> source),
    with an ``__init__.py`` in each of its folders."""
    for path, source in {"__init__.py": "", **modules}.items():
        module = root / "ladbench" / path
        module.parent.mkdir(parents=True, exist_ok=True)
        (module.parent / "__init__.py").touch()
        module.write_text(source)


def test_the_direction_check_finds_an_upward_import(tmp_path):
    write_package(tmp_path, {"stages/options.py": "from ladbench.analysis import analyze\n",
                             "analysis.py": "def analyze():\n    from ladbench.stages.options import X\n",
                             "cli.py": "import ladbench.stages.options\n"})
    assert upward_imports(import_graph(module_files(tmp_path))) == [("ladbench.analysis", "ladbench.stages.options")]


# The package's floors, stated once: a module imports only from its own floor or below (a
# module's floor is that of its longest prefix here; ``ladbench`` itself, the floor of what is
# not listed, is the ground). Within a floor, the cycle test above keeps the imports one-way.
FLOORS = {
    # 0, the ground: storage, the settings carriers and registries' machinery, what each family is, names
    **dict.fromkeys(("ladbench", "ladbench.atomic", "ladbench.settings", "ladbench.registry", "ladbench.cpu_paths",
                     "ladbench.plugins", "ladbench.families", "ladbench.names", "ladbench.provenance", "ladbench.hdf5",
                     "ladbench.data.checks"), 0),
    # 1, the leaves of the domain, and the config (it names the modules that fill its schema,
    # importing them only when the schema loads)
    **dict.fromkeys(("ladbench.config", "ladbench.calibration", "ladbench.metrics", "ladbench.clip",
                     "ladbench.methods.settings", "ladbench.data", "ladbench.inference.prompts",
                     "ladbench.inference.sampling", "ladbench.inference.scoring", "ladbench.inference.greedy", "ladbench.inference.graphs",
                     "ladbench.inference.devices", "ladbench.inference.cache", "ladbench.inference.merge",
                     "ladbench.models.attention", "ladbench.models.compat", "ladbench.models.kernels",
                     "ladbench.models.rotary", "ladbench.models.vision", "ladbench.models.tiny_ov15",
                     "ladbench.report.render", "ladbench.study_paths", "ladbench.records", "ladbench.organism_settings"), 1),
    # 2, what the stages are made of: models (adapters, tiny builds), methods, prompt variants,
    # benchmarks, features, the arrays of a cache and the checks of inputs
    **dict.fromkeys(("ladbench.models", "ladbench.methods", "ladbench.variants", "ladbench.benchmark",
                     "ladbench.features", "ladbench.arrays", "ladbench.inputs", "ladbench.divergence",
                     "ladbench.inference.decode"), 2),
    # 3, the stages' work: inference, evaluation, analysis, the organism's training, the plan
    **dict.fromkeys(("ladbench.inference.runner", "ladbench.evaluation", "ladbench.analysis", "ladbench.organism",
                     "ladbench.plan", "ladbench.model_checks"), 3),
    "ladbench.report": 4,                         # the report, over every output
    "ladbench.workflow": 5,                       # the Snakefile's logic
    **dict.fromkeys(COMMAND_LAYER, 6),            # the commands, on top
}


def floor(name: str, floors: dict[str, int] = FLOORS) -> int:
    """The floor of module ``name``: that of its longest prefix in ``floors``."""
    parts = name.split(".")
    return next(floors[".".join(parts[:i])] for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in floors)


def imports_up(graph: dict[str, set[str]], floors: dict[str, int] = FLOORS) -> list[str]:
    """Every import of a module from a higher floor than its own."""
    return sorted(f"{name} (floor {floor(name, floors)}) imports {target} (floor {floor(target, floors)})"
                  for name, targets in graph.items() for target in targets
                  if floor(target, floors) > floor(name, floors))


def test_no_import_runs_back_up():
    assert imports_up(import_graph(module_files())) == []


def test_the_floor_check_finds_an_import_from_above(tmp_path):
    write_package(tmp_path, {"inputs.py": "def what():\n    from ladbench.config import X\n",
                             "config.py": "from ladbench.inference.cache import Y\n",
                             "inference/cache.py": "Y = 1\n"})
    floors = {"ladbench": 0, "ladbench.inference.cache": 1, "ladbench.config": 2, "ladbench.inputs": 1}
    assert imports_up(import_graph(module_files(tmp_path)), floors) == [
        "ladbench.inputs (floor 1) imports ladbench.config (floor 2)"]
