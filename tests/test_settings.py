"""Settings carriers (ladbench.settings): one dataclass field states a setting; its flag, its
schema entry, its validation and the workflow's hand-over derive from it. The last test adds a
toy setting to LadSettings in a copy of the source and finds it everywhere, nothing else edited."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import pytest
import yaml

from ladbench.settings import Settings, check_section, command_options, option_name, schema_properties, setting
from ladbench.stages.options import add_arguments, from_args

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Knobs(Settings):
    section = "knobs"

    count: int = setting(3, "how many", minimum=1)
    rate: float = setting(0.5, "a rate", above=0, below=1)
    mode: str = setting("fast", "how", choices=("fast", "slow"))
    sizes: tuple[int, ...] = setting((1, 2), "sizes", minimum=1)
    steps: tuple[float, ...] = setting((1, 2), "steps", kind=float)
    verbose: bool = setting(False, "say more")
    checked: bool = setting(True, "check things")
    renamed: int = setting(7, "a field whose key differs", key="other_name")
    hidden: int = setting(0, "code only", config=False, flag=False)
    given: str = setting("x", "a flag, not a config key", config=False)


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser, Knobs)
    return parser.parse_args(list(argv))


def test_flags_carry_the_fields_defaults_types_and_choices():
    assert from_args(Knobs, parse()) == Knobs()
    knobs = from_args(Knobs, parse("--count", "5", "--rate", "0.25", "--mode", "slow", "--sizes", "4", "8",
                                   "--steps", "1.5", "--verbose", "--no-checked", "--other-name", "9", "--given", "y"))
    assert knobs == Knobs(count=5, rate=0.25, mode="slow", sizes=(4, 8), steps=(1.5,), verbose=True, checked=False,
                          renamed=9, given="y")
    with pytest.raises(SystemExit):
        parse("--mode", "medium")
    with pytest.raises(SystemExit):
        parse("--hidden", "1")                  # flag=False: no flag


def test_the_dataclass_is_the_one_validator():
    for bad, message in (({"count": 0}, "count must be >= 1, got 0"), ({"rate": 1.0}, "rate must be < 1, got 1.0"),
                         ({"mode": "x"}, "mode must be one of"), ({"sizes": (1, 0)}, "sizes must be >= 1, got 0")):
        with pytest.raises(ValueError, match=message):
            Knobs(**bad)
    check_section(Knobs, {"count": 2, "mode": "fast", "other_name": 7, "sizes": [1, 3]}, "knobs")
    with pytest.raises(ValueError, match=r"^knobs.sizes: sizes must be >= 1, got -1$"):
        check_section(Knobs, {"count": 2, "sizes": [1, -1]}, "knobs")


def test_the_schema_block_and_the_hand_over_come_from_the_fields():
    properties = schema_properties(Knobs)
    assert list(properties) == ["count", "rate", "mode", "sizes", "steps", "verbose", "checked", "other_name"]
    assert properties["mode"] == {"type": "string", "enum": ["fast", "slow"], "default": "fast", "description": "how"}
    assert properties["sizes"] == {"type": "array", "items": {"type": "integer"}, "minItems": 1, "default": [1, 2],
                                   "description": "sizes"}
    assert properties["steps"]["items"] == {"type": "number"} and properties["verbose"]["type"] == "boolean"
    values = {"count": 4, "rate": 0.5, "mode": "fast", "sizes": [1], "steps": [2], "verbose": True, "checked": False,
              "other_name": 3}
    assert command_options(Knobs, values) == {"count": 4, "rate": 0.5, "mode": "fast", "sizes": [1], "steps": [2],
                                              "verbose": True, "no_checked": True, "other_name": 3}


def test_every_section_carrier_reads_the_configs_values_back_unchanged():
    """The hand-over of each carrier, parsed by the stage's flags, gives the carrier of the config."""
    from ladbench.config import load_config, load_schema, settings_carriers
    from ladbench.workflow import flags

    config = load_config(ROOT / "workflow" / "demo" / "config.yaml")
    for section, block in load_schema()["properties"].items():
        for carrier in settings_carriers(block):
            parser = argparse.ArgumentParser()
            add_arguments(parser, carrier)
            args = parser.parse_args(shlex.split(flags(**command_options(carrier, config[section]))))
            expected = {f: tuple(v) if isinstance(v, list) else v for f, v in config[section].items()}
            inputs = {f.name: "x" for f in fields(carrier) if f.default is MISSING}   # InferenceSettings' paths
            got = from_args(carrier, args, **inputs)
            for key, value in command_options(carrier, expected).items():
                name = next(f for f in carrier.__dataclass_fields__.values() if option_name(f) == key)
                assert getattr(got, name.name) == value, (section, key)


TOY = '    toy_knob: int = setting(3, "a toy setting of tests/test_settings.py", minimum=0)\n'


@pytest.mark.slow
def test_a_new_lad_setting_is_one_field(tmp_path):
    """Add a field to LadSettings (a copy of the source): it is a flag of evaluate and analyze,
    a key of the schema's lad block (validated by the dataclass) and in the command lines the
    workflow writes, with nothing else edited; the copy's config and hand-over tests pass."""
    copy = tmp_path / "repo"
    for part in ("src", "workflow", "tests"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("Snakefile", "pyproject.toml", "config.yaml", "config.current.yaml"):
        shutil.copy(ROOT / name, copy / name)
    settings = copy / "src" / "ladbench" / "methods" / "settings.py"
    text = settings.read_text()
    anchor = "    layer_mean: Choice = setting("
    assert text.count(anchor) == 1
    settings.write_text(text.replace(anchor, TOY + anchor))
    sys.path.insert(0, str(ROOT / "tests"))
    from workflow_runner import DEMO_CONFIG, environment

    env = environment({"PYTHONPATH": str(copy / "src")})
    probe = subprocess.run([sys.executable, "-c", """if True:
        import json, ladbench
        from ladbench.cli import build_parser
        from ladbench.config import ConfigError, load_schema, validate_config
        assert ladbench.__file__.startswith(%r), ladbench.__file__
        def command_help(name):
            (commands,) = [a for a in build_parser(name)._actions if hasattr(a, "choices") and name in (a.choices or {})]
            return commands.choices[name].format_help()
        flags = {name: command_help(name) for name in ("evaluate", "analyze")}
        try:
            validate_config({"datasets": {"d": {"source": "synthetic"}}, "models": {"m": {"tiny": True, "family": "qwen2_5_vl"}},
                             "lad": {"toy_knob": -1}})
            error = None
        except ConfigError as e:
            error = str(e)
        print(json.dumps({"help": {k: "--toy-knob" in v for k, v in flags.items()},
                          "schema": load_schema()["properties"]["lad"]["properties"]["toy_knob"], "error": error}))
        """ % str(copy)], capture_output=True, text=True, env=env, timeout=120)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert found["help"] == {"evaluate": True, "analyze": True}
    assert found["schema"] == {"type": "integer", "default": 3, "description": "a toy setting of tests/test_settings.py"}
    assert found["error"] == "config: lad.toy_knob: toy_knob must be >= 0, got -1"

    config = yaml.safe_load(DEMO_CONFIG.read_text())
    config.setdefault("lad", {})["toy_knob"] = 7
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(config))
    run = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "--snakefile", str(copy / "Snakefile"),
                          "--directory", str(tmp_path / "work"), "--configfile", str(path), "--dry-run",
                          "--printshellcmds", "--cores", "1"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    commands = [line for line in (run.stdout + run.stderr).splitlines()
                if line.startswith(("Shell command: ladbench evaluate", "Shell command: ladbench analyze"))]
    assert commands and all("--toy-knob 7" in line for line in commands)

    # the tests that check flags, schema and hand-over loop over the carriers: no list to edit
    tests = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
                            "-m", "not slow", "tests/test_config.py", "tests/test_workflow_logic.py"],
                           cwd=copy, capture_output=True, text=True, env=env, timeout=900)
    assert tests.returncode == 0, tests.stdout[-3000:]
