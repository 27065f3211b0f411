"""``ladbench models`` (models/catalog.py): every image-text-to-text architecture of the
installed transformers with what family auto does with it, the loader's refusals in one line,
and the README's model table generated from it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ladbench.cli import main
from ladbench.models import compat

ROOT = Path(__file__).resolve().parents[1]
PROXIES = ROOT / "benchmarks" / "results" / "auto-architectures.json"
pytestmark = pytest.mark.lanes
current_lane = pytest.mark.current_lane("family auto runs on the current lane")


@current_lane
def test_every_architecture_once_with_its_status(capsys):
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    from ladbench.models.auto import architecture_refusal
    from ladbench.models.tiny_archs import BUILDS, FAMILY_BUILDS_AUTO_RUNS, NOT_BUILT
    main(["models", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert [r["model_type"] for r in rows] == sorted(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    assert all(set(r) == {"model_type", "status", "reason"} and r["reason"] for r in rows)
    tested = {r["model_type"] for r in rows if r["status"] == "tested"}
    assert tested == set(BUILDS) | set(FAMILY_BUILDS_AUTO_RUNS) and len(tested) >= 30
    untested = {r["model_type"]: r["reason"] for r in rows if r["status"] == "untested"}
    assert untested == {name: NOT_BUILT[name] for name in untested}           # each says what is missing
    for r in rows:
        if r["status"] == "refused":
            assert r["reason"] == architecture_refusal(r["model_type"])
        else:
            assert r["status"] in ("tested", "untested")
    refused = {r["model_type"]: r["reason"] for r in rows if r["status"] == "refused"}
    assert "encoder-decoder" in refused["florence2"] and "replace_image_token" in refused["idefics2"]


@current_lane
def test_the_loader_refuses_with_the_listed_reason_in_one_line(tiny_arch_model, tmp_path, capsys):
    """A folder of a refused architecture: ``ladbench infer``'s loader says what `models` says."""
    import shutil

    from ladbench.models import load_adapter
    from ladbench.models.auto import architecture_refusal
    folder = tmp_path / "idefics2"
    shutil.copytree(tiny_arch_model("idefics3"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, model_type="idefics2")))
    with pytest.raises(ValueError) as refused:
        load_adapter("auto", str(folder), device="cpu")
    assert str(refused.value) == f"family auto cannot run architecture 'idefics2': {architecture_refusal('idefics2')}"
    assert "\n" not in str(refused.value)


@current_lane
def test_the_probe_refuses_a_capture_that_misses_the_kernels_mask(tiny_arch_model, monkeypatch):
    """The load-time probe compares the captured row, applied to the values, with the kernel's
    output: a capture blind to the mask (here: Gemma 3's sliding windows and left padding) is
    refused in one line, naming the layer."""
    from ladbench.models import attention, load_adapter
    exact = attention.last_row_attention
    monkeypatch.setattr(attention, "last_row_attention", lambda q, k, mask, scaling: exact(q, k, None, scaling))
    with pytest.raises(ValueError, match=r"^family auto cannot run architecture 'gemma3': decoder layer 0: the "
                                         r"captured attention does not reproduce the kernel's output"):
        load_adapter("auto", tiny_arch_model("gemma3"), device="cpu", dtype="float32")


def test_the_probe_names_kernel_arguments_the_capture_does_not_model():
    import torch

    from ladbench.models.attention import AttentionProbe
    module = torch.nn.Linear(1, 1)
    probe = AttentionProbe([module])
    rows = torch.full((1, 2, 3), 1 / 3)                                   # [B, H, Tk]
    value = torch.randn(1, 1, 3, 4)                                       # [B, KV, Tk, d]: GQA 2 heads on 1
    output = (rows.unsqueeze(-2) @ value.expand(1, 2, 3, 4)).transpose(1, 2)   # [B, Tq=1, H, d]
    probe.record(module, rows, value, output, {"softcap": 50.0, "sliding_window": 4})
    probe.record(module, rows, value, output + 1, {})
    assert probe.calls[0][1] < 1e-6 and probe.calls[0][2] == ("softcap",)
    # off by 1 everywhere: the deviation is 1 relative to the values' scale
    assert probe.calls[1][1] == pytest.approx(1 / float(value.abs().max())) and probe.calls[1][2] == ()


@current_lane
def test_readme_model_table_is_generated_from_ladbench_models(capsys):
    main(["models", "--markdown", "--proxies", str(PROXIES)])
    table = capsys.readouterr().out.strip()
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- ladbench models --markdown -->")
    end = readme.index("<!-- end of ladbench models -->")
    assert readme[start:end].split("\n", 1)[1].strip() == table, \
        "README model table is stale: regenerate it with `ladbench models --markdown --proxies " \
        "benchmarks/results/auto-architectures.json`"
    measured = json.loads(PROXIES.read_text())["proxies"]
    assert all(p["n"] == 8 and p["batch"] == 8 for p in measured)
    tested = re.findall(r"^\| (\S+) \| tested \|", table, flags=re.M)
    assert {p["architecture"] for p in measured} == set(tested)          # every tested row has its numbers


@pytest.mark.skipif(compat.on_current_lane(), reason="paper-lane refusal")
def test_models_refuses_the_paper_lane_in_one_line(capsys):
    with pytest.raises(SystemExit):
        main(["models"])
    assert "family auto runs only on the current lane" in capsys.readouterr().err
