"""Tiny offline builds of the three families load back through the adapters (the same
``from_pretrained(folder)`` path as hub models) with the real classes, template and layout."""
from __future__ import annotations

import filecmp
import json
import os

import pytest

from conftest_models import FAMILIES, make_images
from ladbench.models import ADAPTERS, adapter_class, load_adapter
from ladbench.cli import build_parser
from ladbench.families import LaneError
from ladbench.models import compat, tiny, vision

pytestmark = [pytest.mark.slow, pytest.mark.lanes]


paper_lane_only = pytest.mark.skipif(compat.on_current_lane(), reason="paper-lane family or code path")


def test_registry():
    from ladbench.families import FAMILY_REGISTRY, TINY_FAMILIES
    assert set(FAMILIES) <= set(ADAPTERS) == set(FAMILY_REGISTRY) and {"qwen2_5_vl", "internvl"} <= set(FAMILIES)
    assert all(ADAPTERS[name].family == name for name in ADAPTERS)            # the registry's key is its name
    assert set(TINY_FAMILIES) == set(tiny._BUILDERS) == set(FAMILY_REGISTRY) - {"auto"}    # each family a tiny build
    with pytest.raises(ValueError, match="unknown model family 'llama'"):
        adapter_class("llama")


@pytest.mark.parametrize("family", FAMILIES)
def test_loads_real_classes_with_capture_attention(family, tiny_adapter):
    adapter = tiny_adapter(family)
    # the class the tiny build saved (its config.json's architectures) is the class that loads
    # back: no list of classes per family to keep (a new family's tiny build states its own)
    assert [type(adapter.model).__name__] == adapter.model.config.architectures
    assert type(adapter.model).__name__.endswith("ForConditionalGeneration")
    if family == "llava_ov15":      # came from the folder's own code, through trust_remote_code
        assert type(adapter.model).__module__.startswith("transformers_modules.")
    # a decoder with a kernel table of its own (OV-1.5's hub code) loads with SDPA, its own call of
    # which is routed through the capture; the others take the capture by name
    expected = "sdpa" if adapter.own_attention_table else "ladbench_capture"
    assert adapter.own_attention_table == (family == "llava_ov15")
    assert adapter.text_config._attn_implementation == expected
    assert adapter.n_layers == 3 and adapter.n_heads == 4
    assert adapter.model.dtype.is_floating_point and not adapter.model.training


@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_layout_and_image_spans(family, n, tiny_adapter):
    adapter = tiny_adapter(family)
    text = adapter.chat_text("Caption: x\nAnswer: ", n)
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")
    assert text.index("Caption") > text.rindex(adapter.image_token)            # images first, then the text
    inputs = adapter.encode([text], [make_images(n)])
    ids = inputs["input_ids"][0].tolist()
    spans = adapter.image_spans(ids)
    assert len(spans) == n
    if adapter.image_start_token == adapter.image_token:                       # no markers (LLaVA-OneVision)
        assert all(set(ids[start:end]) == {adapter.image_token_id} for start, end in spans)
        assert sum(end - start for start, end in spans) == ids.count(adapter.image_token_id)
        return
    for start, end in spans:                                                   # markers included, pads inside
        assert ids[start] == adapter.image_start_id and ids[end - 1] == adapter.image_end_id
        assert set(ids[start + 1:end - 1]) == {adapter.image_token_id}
    assert sum(end - start - 2 for start, end in spans) == ids.count(adapter.image_token_id)


def test_llava_onevision_multi_image_prompts_are_not_tiled(tiny_adapter):
    """Several images per prompt: LLaVA-OneVision's multi-image mode (one square view per
    image, its features plus one newline); one image alone is tiled (anyres), as the
    processor does it. Adjacent images' token runs are split by that fixed length."""
    adapter = tiny_adapter("llava_onevision")
    per_image = adapter.tokens_per_image
    assert per_image == adapter.processor.num_image_tokens + 1                # 'full' features + image_newline
    texts = [adapter.chat_text("Caption: a long one\nAnswer: ", 4), adapter.chat_text("Answer: ", 4)]
    inputs = adapter.encode_on_host(texts, [make_images(4), make_images(4, size=90, offset=4)])
    assert inputs["pixel_values"].shape[:2] == (8, 1)                          # one view per image, no tiles
    for row in inputs["input_ids"].tolist():
        assert [end - start for start, end in adapter.image_spans(row)] == [per_image] * 4
    single = adapter.encode_on_host([adapter.chat_text("Answer: ", 1)], [make_images(1, size=90)])
    assert single["pixel_values"].shape[1] > 1                                 # anyres tiles
    (start, end), = adapter.image_spans(single["input_ids"][0].tolist())
    assert end - start > per_image
    image, text = adapter.image_token_id, adapter.end_of_turn_id
    assert adapter.image_spans([text] + [image] * (2 * per_image) + [text, image] + [image] * (per_image - 1)) == [
        (1, 1 + per_image), (1 + per_image, 1 + 2 * per_image), (2 + 2 * per_image, 2 + 3 * per_image)]


@pytest.mark.current_lane("current-lane start-up check")
def test_ov15_refuses_the_current_lane_in_one_line(tmp_path):
    with pytest.raises(LaneError, match=r"^model family 'llava_ov15' runs only on the paper lane[^\n]*\.venv \(make install\)$"):
        load_adapter("llava_ov15", str(tmp_path / "never-read"), device="cpu", trust_remote_code=True)


@paper_lane_only
def test_auto_refuses_the_paper_lane_in_one_line(tmp_path):
    with pytest.raises(LaneError, match=r"^model family 'auto' runs only on the current lane[^\n]*\.venv-current"):
        load_adapter("auto", str(tmp_path / "never-read"), device="cpu")


@paper_lane_only
def test_ov15_needs_trust_remote_code(tiny_model):
    with pytest.raises(PermissionError, match="trust_remote_code"):
        load_adapter("llava_ov15", tiny_model("llava_ov15"), device="cpu")


def test_demo_model_cli_is_deterministic_and_offline(hf_offline, tmp_path):
    parser = build_parser(only="demo-model")
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        args = parser.parse_args(["demo-model", "--family", "qwen2_5_vl", "--out", str(tmp_path / name),
                                  "--seed", str(seed)])
        args.func(args)
    weights = "model.safetensors"
    assert filecmp.cmp(tmp_path / "a" / weights, tmp_path / "b" / weights, shallow=False)
    assert not filecmp.cmp(tmp_path / "a" / weights, tmp_path / "c" / weights, shallow=False)
    meta = json.loads((tmp_path / "a" / "ladbench_tiny.json").read_text())
    assert meta == {**meta, "family": "qwen2_5_vl", "seed": 0, "preset": "tiny"}
    assert not os.path.exists(str(tmp_path / "a") + ".tmp")
    for f in ("config.json", "chat_template.jinja", "tokenizer.json"):
        assert (tmp_path / "a" / f).exists(), f
    # the image processor's settings: their own file (4.53) or inside processor_config.json (5.x)
    assert any((tmp_path / "a" / f).exists() for f in ("preprocessor_config.json", "processor_config.json"))


def unequal_images(adapter) -> tuple:
    """Pixels and grids of five images of unequal sizes, larger than the tiny preset's, so that
    each spans several 8 x 8-patch windows, some partly."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    sizes = [(200, 150), (90, 260), (170, 130), (260, 200), (120, 120)]
    images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for w, h in sizes]
    inputs = adapter.processor.image_processor(images, max_pixels=300 * 300, return_tensors="pt")
    return inputs["pixel_values"], inputs["image_grid_thw"]


@paper_lane_only
@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_ov15"])
def test_batched_vision_tower_equals_the_native_joint_encoding(family, tiny_adapter):
    """All images of a batch through the tower together, one attention call per layer (padded
    and masked where windows or images differ in length): the features must equal the native
    joint encoding in float32, on unequal grids with partial edge windows."""
    import torch

    visual = tiny_adapter(family, "sdpa").model.model.visual
    assert "forward" in vars(visual)                                     # the adapter's batched tower
    assert "forward" not in vars(tiny_adapter(family, "eager").model.model.visual)    # reference path: native
    pixels, grid = unequal_images(tiny_adapter(family, "sdpa"))
    window = visual.window_size // visual.patch_size                    # window side in patches (8)
    assert len(set(map(tuple, grid.tolist()))) == len(grid)              # unequal grids
    assert bool((grid[:, 1:] % window != 0).any()) and int((grid[:, 1:].amax(-1) > window).sum()) >= 4   # partial edge windows
    with torch.no_grad():
        batched = visual(pixels, grid_thw=grid)
        native = type(visual).forward(visual, pixels, grid_thw=grid)
        again = visual(pixels, grid_thw=grid)                            # from the cached plan
        single = visual(pixels[: int(grid[0].prod())], grid_thw=grid[:1])
    assert batched.shape == native.shape
    torch.testing.assert_close(batched, native, atol=1e-5, rtol=0)
    torch.testing.assert_close(again, batched, atol=0, rtol=0)
    torch.testing.assert_close(single, native[: single.shape[0]], atol=1e-5, rtol=0)


@paper_lane_only
def test_compiled_vision_tower_equals_the_batched_one_and_stops_compiling(tiny_model, tiny_adapter):
    """``vision_tower: compiled``: each block's step under torch.compile (inductor, here its CPU
    code) gives the batched tower's features up to rounding, on unequal grids (masked windows)
    and on equal ones, over batches of four sizes; after the second size the patch count is
    dynamic, so further sizes do not compile again."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    adapter = load_adapter("qwen2_5_vl", tiny_model("qwen2_5_vl"), device="cpu", dtype="float32", vision="compiled")
    visual, batched = adapter.model.model.visual, tiny_adapter("qwen2_5_vl", "sdpa").model.model.visual
    assert adapter.vision == "compiled" and adapter.host_input_keys == ("image_grid_thw",)
    pixels, grid = unequal_images(adapter)
    square = grid[4:5].expand(4, 3)                                      # the study's case: one grid
    square_pixels = pixels[-int(grid[4].prod()):].repeat(4, 1)
    graphs = []
    with torch.no_grad():
        for images, pixel_rows in ((grid, pixels), (square[:2], square_pixels[: 2 * int(grid[4].prod())]),
                                   (square[:3], square_pixels[: 3 * int(grid[4].prod())]), (square, square_pixels)):
            torch.testing.assert_close(visual(pixel_rows, grid_thw=images), batched(pixel_rows, grid_thw=images),
                                       atol=1e-5, rtol=0)
            graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[-1] == graphs[-2] > graphs[0] > 0                      # the fourth size compiled nothing
    assert vision.compiled_towers(adapter.model) == 1 and vision.compiled_towers(batched) == 0


@pytest.mark.parametrize("family, attention", [("internvl", "sdpa"), ("qwen2_5_vl", "eager")])
def test_a_compiled_tower_asked_for_where_there_is_none_says_so_in_one_line(family, attention, tiny_model, caplog):
    """InternVL's tower is not a Qwen2.5-VL-style one; the eager reference runs transformers' tower
    (and so does the current lane): asked to compile, the adapter says it compiles nothing, why,
    in one line, and runs as it would without."""
    from ladbench.models import load_adapter
    with caplog.at_level("WARNING", logger="ladbench.models.base"):
        adapter = load_adapter(family, tiny_model(family), device="cpu", dtype="float32", vision="compiled",
                               attention=attention)
    (record,) = [r for r in caplog.records if "compiled" in r.getMessage()]
    why = "the eager reference" if attention == "eager" else "current lane" if not compat.batched_vision_supported() \
        else "only Qwen2.5-VL-style towers"
    assert "\n" not in record.getMessage() and why in record.getMessage() and f"this {family} model" in record.getMessage()
    assert vision.compiled_towers(adapter.model) == 0


@pytest.mark.current_lane("current-lane fallback")
def test_current_lane_runs_the_native_vision_tower(tiny_adapter):
    adapter = tiny_adapter("qwen2_5_vl")
    assert adapter.vision == "native" and "forward" not in vars(adapter.model.model.visual)


@paper_lane_only
def test_native_vision_tower_stays_selectable(tiny_model):
    from ladbench.models import load_adapter
    adapter = load_adapter("qwen2_5_vl", tiny_model("qwen2_5_vl"), device="cpu", vision="native")
    assert "forward" not in vars(adapter.model.model.visual) and adapter.host_input_keys == ()
    with pytest.raises(ValueError, match="vision tower must be one of"):
        load_adapter("qwen2_5_vl", tiny_model("qwen2_5_vl"), device="cpu", vision="fast")


@pytest.mark.current_lane("family auto runs on the current lane")
def test_demo_model_builds_an_architecture_that_infer_runs_offline(hf_offline, tmp_path, capsys):
    """The README's "run your own model": ``demo-model --architecture`` builds a tested
    architecture's tiny model, and ``ladbench infer`` runs it through family auto into a cache."""
    from conftest_models import TINY_IMAGE_SIZE, make_demo_benchmark
    from ladbench.cli import main
    import numpy as np
    from ladbench.benchmark import load_benchmark
    from ladbench.inference.cache import plan_rows, read_cache
    folder = tmp_path / "model"
    main(["demo-model", "--architecture", "llava", "--out", str(folder)])
    assert capsys.readouterr().out.strip() == str(folder)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llava"
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=1, n_orderings=2, n_cal=1)
    out = tmp_path / "cache.h5"
    main(["infer", "--benchmark", str(bench), "--images", str(images), "--out", str(out), "--model-name", "mine",
          "--family", "auto", "--model-path", str(folder), "--device", "cpu", "--dtype", "float32",
          "--image-size", str(TINY_IMAGE_SIZE)])
    scores = read_cache(str(out)).arrays["scores"]
    assert scores.shape == (len(plan_rows(load_benchmark(bench))), 4) and np.isfinite(scores).all()


def test_demo_model_refuses_an_architecture_without_a_tiny_build():
    parser = build_parser(only="demo-model")
    with pytest.raises(SystemExit):
        parser.parse_args(["demo-model", "--architecture", "mllama", "--out", "x"])
