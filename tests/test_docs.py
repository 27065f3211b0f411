"""docs/architecture.md says what the code does, where a test can check it: its stage table
names every `ladbench` subcommand and the command module that defines it, and its list of the
schema keys kept by hand is the schema's; docs/method.md's table of choices states the config's
defaults."""

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


def documented_defaults() -> dict[tuple[str, str], str]:
    """docs/method.md's table of choices: (config section, key) -> the default its last column
    opens with, where that is a value (`x`, or a number) and the row is one config key."""
    text = (ROOT / "docs" / "method.md").read_text()
    section = text[text.index("| choice | config key | paper | reference | default |"):]
    defaults = {}
    for line in section.splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        key, default = re.match(r"`(\w+)\.(\w+)`", cells[1]), re.match(r"`([^`]+)`|(\d+)\b", cells[-1])
        if key and default:
            defaults[key.groups()] = default.group(1) or default.group(2)
    return defaults


def test_the_table_of_choices_gives_the_schemas_defaults():
    """Each default docs/method.md's table of choices states is the config's (the settings
    carriers fill the schema's defaults)."""
    from ladbench.config import load_schema
    properties = load_schema()["properties"]
    documented = documented_defaults()
    assert len(documented) >= 18, documented              # the table's rows of one key and a value
    actual = {(section, key): str(properties[section]["properties"][key]["default"]) for section, key in documented}
    assert actual == documented


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation other than
    hyphens dropped, spaces made hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_link_between_the_documents_resolves():
    """README and docs/ link each other (the README's Performance section to the whole record in
    docs/performance.md, and back): each relative link names a file that exists, and its anchor
    a heading of that file."""
    broken = []
    for document in DOCUMENTS:
        for target in re.findall(r"\]\(([^)\s]+)\)", document.read_text()):
            if re.match(r"\w+://", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (document.parent / path).resolve() if path else document
            if not linked.exists() or (anchor and anchor not in heading_anchors(linked.read_text())):
                broken.append(f"{document.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_every_result_file_the_documents_cite_is_in_the_repository():
    """A measurement the README or docs/ cite by its file under benchmarks/results/ can be read
    there (so a table moved between documents, or a file renamed, keeps its source)."""
    cited = {path.rstrip(".,;:)`") for document in DOCUMENTS
             for path in re.findall(r"benchmarks/results/[\w./-]+", document.read_text())}
    assert cited
    missing = sorted(path for path in cited if not (ROOT / path).exists())
    assert not missing, missing
