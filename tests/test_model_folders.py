"""Hostile or damaged model folders (issue #35 item 4): every case is one line naming the file,
refused before the model is allocated (folders) or within the rendering bounds (chat templates).

The folders are copies of the tiny builds (models/tiny.py) in the pytest temporary folder, each
with one file damaged. The folder checks run in ``ModelAdapter.load`` before anything loads, so
every family of the installed lane is tried (family auto too on the current lane).
"""
from __future__ import annotations

import json
import shutil
import struct

import pytest

from conftest_models import FAMILIES
from ladbench.models import compat, load_adapter
from ladbench.models import templates
from ladbench.models.templates import BoundedEnvironment, bounded_template

pytestmark = [pytest.mark.lanes]

#: every family of this lane that loads a tiny build: the hand-written ones, and auto on the current lane
LOADABLE = FAMILIES + (("auto",) if compat.on_current_lane() else ())


def _folder(tiny_model, tmp_path, family: str):
    """A private copy of ``family``'s tiny build (auto runs on the first hand-written family's)."""
    source = tiny_model(FAMILIES[0] if family == "auto" else family)
    # a unique base name: transformers caches a folder's remote code under it
    return shutil.copytree(source, tmp_path / f"{family}_{tmp_path.name}")


def _refusal(family: str, folder, **kwargs) -> str:
    with pytest.raises(ValueError) as caught:
        load_adapter(family, str(folder), device="cpu", **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def _edit_config(folder, **text_sizes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    text = next((config[k] for k in ("text_config", "llm_config") if isinstance(config.get(k), dict)), config)
    text.update(text_sizes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("family", LOADABLE)
def test_truncated_weights_name_the_file(family, tiny_model, tmp_path):
    folder = _folder(tiny_model, tmp_path, family)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 1000])
    message = _refusal(family, folder)
    assert f"{weights}: damaged weights file" in message and "truncated" in message


def test_a_weights_header_that_lies_about_its_length_names_the_file(tiny_model, tmp_path):
    folder = _folder(tiny_model, tmp_path, FAMILIES[0])
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(struct.pack("<Q", 1 << 40) + data[8:])
    assert f"{weights}: damaged weights file: its header length" in _refusal(FAMILIES[0], folder)


@pytest.mark.parametrize("family", LOADABLE)
def test_a_config_nested_100000_deep_names_the_file(family, tiny_model, tmp_path):
    folder = _folder(tiny_model, tmp_path, family)
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    assert f"{folder / 'config.json'}: JSON nested too deeply" in _refusal(family, folder)


@pytest.mark.parametrize("sizes, expected", [
    ({"vocab_size": 2 ** 33}, "vocab_size = 8589934592 is outside 1..4194304"),
    ({"hidden_size": 2 ** 20}, "hidden_size = 1048576 is outside 1..65536"),
    ({"num_hidden_layers": 0}, "num_hidden_layers = 0 is outside 1..1024"),
    ({"num_hidden_layers": 4000}, "num_hidden_layers = 4000 is outside 1..1024"),
    ({"num_hidden_layers": 7}, "num_hidden_layers = 7 but the weights hold"),
    ({"vocab_size": 1000}, "vocab_size x hidden_size = 1000 x"),
])
def test_absurd_or_mismatched_sizes_are_refused_before_allocating(sizes, expected, tiny_model, tmp_path):
    folder = _folder(tiny_model, tmp_path, FAMILIES[0])
    _edit_config(folder, **sizes)
    message = _refusal(FAMILIES[0], folder)
    assert message.startswith(f"{folder / 'config.json'}: ") and expected in message


@pytest.mark.parametrize("content", [b'{"hello": 1}', b"\xff\xfe garbage", b'{"model": {"type": "BPE", "vocab": 3}}'])
def test_a_garbage_tokenizer_names_the_file(content, tiny_model, tmp_path):
    folder = _folder(tiny_model, tmp_path, FAMILIES[0])
    (folder / "tokenizer.json").write_bytes(content)
    assert _refusal(FAMILIES[0], folder).startswith(f"{folder / 'tokenizer.json'}: ")


@pytest.mark.parametrize("family", LOADABLE)
def test_a_chat_template_that_raises_names_the_file(family, tiny_model, tmp_path):
    folder = _folder(tiny_model, tmp_path, family)
    (folder / "chat_template.jinja").write_text("{{ raise_exception('this template refuses every prompt') }}")
    with pytest.raises(ValueError) as caught:
        # family auto renders the template while loading; llava_ov15 runs the folder's (tiny build's) code
        adapter = load_adapter(family, str(folder), device="cpu", trust_remote_code=family == "llava_ov15")
        adapter.chat_text("Which image?", 2)
    assert str(caught.value).startswith(f"{folder / 'chat_template.jinja'}: the model's chat template failed "
                                        "(this template refuses every prompt)")


@pytest.fixture(scope="module")
def loaded(tiny_model, tmp_path_factory):
    """One loaded adapter whose chat template the template cases replace."""
    folder = shutil.copytree(tiny_model(FAMILIES[0]), tmp_path_factory.mktemp("templates") / "model")
    return load_adapter(FAMILIES[0], str(folder), device="cpu"), folder


HOSTILE_TEMPLATES = {
    "sandbox escape": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    "nested loops of 100,000": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                                "rendering took longer than 1 s"),
    "loops that neither call nor write": ("{% set s = 'ab' * 50000 %}{% for i in s %}{% for j in s %}{% endfor %}"
                                          "{% endfor %}", "rendering took longer than 1 s"),
    "a huge repetition": ("{{ 'x' * 10000000000 }}", "it would write 10000000000 characters"),
    "a huge padding": ("{{ 'x' | center(10000000000) }}", "it would write 10000000000 characters"),
    "a huge method call": ("{{ 'x'.ljust(10000000000) }}", "it would write 10000000000 characters"),
    "output growing in a loop": ("{% for i in range(100000) %}{% for j in range(100000) %}{{ 'x' * 1000 }}"
                                 "{% endfor %}{% endfor %}", "it would write"),
    "recursion": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursion"),
}


def timed(case: str) -> bool:
    """A case the render's time bound stops: its SIGALRM timer arms only when no one else holds
    the signal, so pytest-timeout (which holds it by default) guards these by its thread instead."""
    return "took longer" in HOSTILE_TEMPLATES[case][1]


@pytest.mark.parametrize("case", [pytest.param(case, marks=pytest.mark.timeout(120, method="thread")) if timed(case)
                                  else case for case in sorted(HOSTILE_TEMPLATES)])
def test_hostile_chat_templates_are_one_line_within_bounds(case, loaded, monkeypatch):
    adapter, folder = loaded
    source, expected = HOSTILE_TEMPLATES[case]
    if timed(case):                     # the time bound, shortened; the other cases keep the real one, so that
        monkeypatch.setattr(templates, "MAX_SECONDS", 1.0)   # a loaded machine still reaches their own limit first
    monkeypatch.setattr(adapter.processor, "chat_template", source)
    with pytest.raises(ValueError) as caught:
        adapter.chat_text("Which image?", 2)
    message = str(caught.value)
    assert message.startswith(f"{folder / 'chat_template.jinja'}: the model's chat template failed (")
    assert expected in message and "\n" not in message


def test_the_bounds_leave_real_templates_unchanged(loaded):
    """Every tiny build's template (and a loop of legitimate size) renders the same text bounded."""
    from transformers.utils import chat_template_utils

    adapter, _ = loaded
    compat.bound_chat_templates(bounded_template)
    original = chat_template_utils._compile_jinja_template.original
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "a cat"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Image 2"}]}]
    sources = [adapter.processor.chat_template, "{% for m in messages %}{{ m.role * 3 }}{{ loop.index }}{% endfor %}"]
    for source in sources:
        bounded = bounded_template(original(""), source)
        assert isinstance(bounded.environment, BoundedEnvironment)
        kwargs = dict(messages=messages, add_generation_prompt=True)
        assert bounded.render(**kwargs) == original(source).render(**kwargs)
