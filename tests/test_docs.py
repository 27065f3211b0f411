"""docs/architecture.md says what the code does, where a test can check it: its stage table
names every `ladbench` subcommand and the command module that defines it, and its list of the
schema keys kept by hand is the schema's."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def stage_table() -> dict[str, list[str]]:
    """subcommand -> the command modules its row names (``stages/x.py`` or ``cli.py``)."""
    text = ARCHITECTURE.read_text()
    section = text[text.index("| stage (`ladbench …`)"):]
    rows = {}
    for line in section.splitlines()[2:]:
        if not line.startswith("|"):
            break
        stages, _, command = [cell.strip() for cell in line.strip("|").split("|")][:3]
        modules = re.findall(r"`((?:stages/\w+|cli)\.py)`", command)
        for name in re.findall(r"`([\w-]+)`", stages):
            rows[name] = modules
    return rows


def test_the_stage_table_names_every_subcommand_and_its_module():
    from ladbench.cli import SUBCOMMANDS, build_parser

    (subcommands,) = [a for a in build_parser()._actions if getattr(a, "choices", None)]
    table = stage_table()
    assert set(table) == set(subcommands.choices)
    modules = {name: f"{module.removeprefix('ladbench.').replace('.', '/')}.py" for name, module in SUBCOMMANDS.items()}
    for name, module in modules.items():
        assert module in table[name], (name, module, table[name])
    assert table["where"] == ["cli.py"]


def hand_kept_keys(schema: dict) -> set[str]:
    """The schema file's keys that no settings carrier fills: its top-level keys without
    ``x-settings`` and the keys the file writes into a block that has them."""
    keys = set()
    for name, block in schema["properties"].items():
        if "x-settings" not in block:
            keys.add(name)
        else:
            keys.update(f"{name}.{key}" for key in block.get("properties", {}))
    return keys


def test_the_hand_kept_schema_keys_are_the_schemas():
    text = ARCHITECTURE.read_text()
    line = next(line for line in text.splitlines() if line.startswith("Hand-kept schema keys"))
    listed = re.findall(r"`([\w.]+)`", line.split("):", 1)[1])
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert sorted(listed) == sorted(hand_kept_keys(schema))
