"""Sliding-window attention read honestly (docs/method.md, "Windowed layers"): each layer's
window from config.json (ladbench.windows) and from the capture (the cache's
``attention_windows``), LAD's selection without the windowed layers, and the start-up checks
(ladbench.model_checks) that refuse, before any job runs, a given layer range holding windowed
layers, an architecture family auto refuses, and a folder without a chat template."""
from __future__ import annotations

import copy
import io
import json
import shutil

import numpy as np
import pytest

from conftest_models import TINY_IMAGE_SIZE, make_demo_benchmark
from ladbench.cli import main
from ladbench.config import ConfigError
from ladbench.methods import LadSettings, select_layers, selection_warnings
from ladbench.windows import compact, layer_windows
from test_inputs import refused
from test_user_errors import demo_config

current_lane = pytest.mark.current_lane("family auto runs on the current lane")

#: google/gemma-3-4b-it's text config, as its published config.json states it (docs/method.md)
GEMMA3_4B = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 34,
                                                     "sliding_window": 1024, "sliding_window_pattern": 6}}
LAD = {"top_k": 2, "k_beyond_range": "lower", "windowed_layers": "refuse", "layers_beyond_depth": "clip"}


def test_gemma3_layers_are_five_windowed_to_one_global():
    windows = layer_windows(GEMMA3_4B)
    assert len(windows) == 34 and set(windows) == {0, 1024}
    assert [i for i, w in enumerate(windows) if not w] == [5, 11, 17, 23, 29]


def test_window_per_layer_from_layer_types_and_none_when_switched_off():
    text = {"num_hidden_layers": 3, "sliding_window": 64,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]}
    assert layer_windows({"text_config": text}) == [64, 64, 0]
    assert layer_windows({"num_hidden_layers": 2, "sliding_window": 4096, "use_sliding_window": False}) == [0, 0]
    assert layer_windows({"num_hidden_layers": 2, "sliding_window": None}) == [0, 0]
    assert layer_windows({"num_hidden_layers": 2, "sliding_window": 16}) == [16, 16]     # Mistral: every layer
    # a type transformers does not know: every p-th layer global, as Gemma 3's older files say it
    assert layer_windows({"num_hidden_layers": 12, "sliding_window": 8, "sliding_window_pattern": 6}) == [8] * 5 + [0] + [8] * 5 + [0]
    # what the file omits, its config class fills (Mistral's default window), windows switched on or not said
    for file in ({"num_hidden_layers": 2}, {"num_hidden_layers": 2, "use_sliding_window": True}, {}):
        assert set(layer_windows({"model_type": "mistral", **file})) == {4096}, file
    assert len(layer_windows({"model_type": "mistral"})) == 32                                # the class's depth too
    sliding = {"model_type": "gemma3_text", "num_hidden_layers": 2, "layer_types": ["sliding_attention"] * 2}
    assert layer_windows(sliding) == [4096, 4096]          # windowed layers whose window the file leaves to the class
    assert compact([20, 21, 22, 24, 30, 31]) == "20-22, 24, 30-31"


@pytest.mark.lanes
def test_where_the_file_settles_the_windows_its_config_class_agrees(monkeypatch):
    """Where config.json alone says no layer has a window, the start-up checks read it without
    transformers (whose import brings torch: 5 s at every Snakemake start). For every architecture
    the installed transformers knows, its default config as its file would say it, and that file with
    windows switched off, the window given as none, or every layer's type given as full attention:
    wherever the file settles the windows, its class gives the same. (A window given as none does
    not settle them: transformers 5.23's dots3_note sets its own, 512, in its place.)"""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from ladbench import windows

    def with_the_class(file: dict) -> list[int]:
        monkeypatch.setattr(windows, "_settled_by_the_file", lambda text: False)
        try:
            return layer_windows(file)
        finally:
            monkeypatch.undo()
    settled, differ = 0, []
    for model_type in sorted(CONFIG_MAPPING_NAMES):
        try:
            default = AutoConfig.for_model(model_type).to_dict()
        except Exception:                   # noqa: BLE001 (a type that needs arguments, or remote code)
            continue
        depth = windows.text_config(default).get("num_hidden_layers")
        if not isinstance(depth, int):
            continue
        for change in ({}, {"use_sliding_window": False}, {"sliding_window": None},
                       {"layer_types": ["full_attention"] * depth}):
            file = copy.deepcopy(default)
            windows.text_config(file).update(change)
            if windows._settled_by_the_file(windows.text_config(file)):
                settled += 1
                if layer_windows(file) != with_the_class(file):
                    differ.append((model_type, change))
    assert differ == [] and settled > 100, (differ, settled)


def test_the_selection_never_takes_a_windowed_layer():
    """Layer 1 is the strongest, but windowed: the top-2 of 0..3 are then layers 3 and 0."""
    attn = np.array([[0.30, 0.1], [0.5, 0.4], [0.05, 0.05], [0.2, 0.2]])          # [Lyr, N], strengths .4 .9 .1 .4
    assert select_layers(attn, 2, (0, 3)).tolist() == [1, 3]
    assert select_layers(attn, 2, (0, 3), unseen=(1,)).tolist() == [3, 0]
    settings = LadSettings(layer_range=(0, 3), unseen_layers=(1, 2), top_k=3)
    warnings = selection_warnings(attn[None], settings)
    assert "layers 1-2 of the range (0, 3) have a sliding window" in warnings[0]
    assert "K lowered to 2" in warnings[1]
    with pytest.raises(ValueError, match="every layer of the layer range"):
        select_layers(attn, 1, (1, 2), unseen=(1, 2))


def test_method_settings_take_the_unseen_layers_from_the_cache():
    from argparse import Namespace

    from ladbench.stages.options import method_settings
    args = Namespace(layer_range=None, **{k: getattr(LadSettings(), k) for k in
                                          ("top_k", "tau", "layer_mean", "mixture", "layer_ties", "k_beyond_range",
                                           "layers_beyond_depth")}, reply_parse="exact")
    assert method_settings(args, {"family": "auto", "attention_windows": [64, 64, 0]}).lad.unseen_layers == (0, 1)
    assert method_settings(args, {"family": "auto"}).lad.unseen_layers == ()


@current_lane
def test_gemma3_default_range_and_refusal_at_start_up(tmp_path, capsys):
    """The published Gemma 3 4B config: the default range 20..33 is read at its global layers 23
    and 29 (said on the console); a given range over windowed layers is refused in one line,
    unless lad.windowed_layers is unseen."""
    from ladbench.model_checks import check_models
    folder = tmp_path / "gemma3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GEMMA3_4B))
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    config = {"output_dir": str(tmp_path), "lad": dict(LAD),
              "models": {"gemma3_4b": {"family": "auto", "path": str(folder), "tiny": False}}}
    assert check_models(config, "s.yaml") == [
        "models.gemma3_4b: layers 20-22, 24-28, 30-33 of its layer range 21:35/36 have a sliding window: LAD reads "
        "layers 23, 29 only (docs/method.md, 'Windowed layers')"]
    config["models"]["gemma3_4b"]["layer_range"] = [20, 33]
    with pytest.raises(ConfigError, match=r"^s\.yaml: models\.gemma3_4b\.layer_range: layers 20-22, 24-28, 30-33 of "
                                          r"the range have a sliding window of 1024 tokens"):
        check_models(config, "s.yaml")
    config["lad"]["windowed_layers"] = "unseen"
    assert "LAD reads layers 23, 29 only" in check_models(config, "s.yaml")[0]
    path = demo_config(tmp_path, lambda c: c["models"].update(gemma3_4b={"family": "auto", "path": str(folder)}))
    main(["where", "--configfile", path])                     # the console (stderr) says what LAD will read
    assert f"WARNING: {path}: models.gemma3_4b: layers 20-22, 24-28, 30-33 of its layer range 21:35/36 have a " \
           "sliding window: LAD reads layers 23, 29 only" in capsys.readouterr().err
    config["models"]["gemma3_4b"]["layer_range"] = [23, 23]
    config["lad"]["windowed_layers"] = "refuse"
    assert check_models(config, "s.yaml") == ["models.gemma3_4b: lad.top_k = 2 lowered to 1, the layers LAD reads in "
                                              "its range"]


@current_lane
def test_a_tiny_gemma3_records_its_windows_and_the_default_range_reads_every_image(tiny_arch_model, tmp_path,
                                                                                   capsys):
    """Tiny Gemma 3 (layers 0, 1 windowed to 64 tokens, layer 2 global) at N = 8: the prompt is
    longer than the window, so the first image lies outside it at layers 0 and 1 (mass exactly 0
    there, by construction); the cache records the windows, the default range holds the global
    layer only, and a given range over layers 0..2 is refused at start-up (``ladbench where``).
    The job's progress goes to stderr as lines (rows done, rows/s, time left)."""
    from ladbench.inference.cache import read_cache
    from ladbench.inference.runner import InferenceSettings, run_inference
    from ladbench.model_checks import check_models
    folder = tiny_arch_model("gemma3")
    bench, images = make_demo_benchmark(tmp_path, 8, n_eval=1, n_orderings=1, n_cal=1)
    out = str(tmp_path / "gemma3.h5")
    run_inference(InferenceSettings(benchmark=str(bench), images=str(images), out=out, model_name="tiny",
                                    family="auto", model_path=folder, device="cpu", dtype="float32",
                                    image_size=TINY_IMAGE_SIZE, batch_size=3, greedy_reply=False))
    ours = [line for line in capsys.readouterr().err.split("\n") if "infer tiny/vanilla" in line]
    assert ours and all(line.startswith("infer tiny/vanilla") and "\r" not in line for line in ours)   # lines, no redraws
    last = ours[-1]
    assert "9/9" in last and "row/s" in last and "<" in last, last          # rows done, rate, elapsed<left
    cache = read_cache(out)
    assert cache.attrs["attention_windows"] == [64, 64, 0]
    assert (cache["attn"][:, :2, 0] == 0).all() and (cache["attn"][:, 2, 0] > 0).all()
    config = {"output_dir": str(tmp_path), "lad": dict(LAD), "models": {"g": {"family": "auto", "path": folder,
                                                                              "tiny": False}}}
    assert check_models(config, "s.yaml") == [                # 21:35/36 of 3 layers: layer 2, global
        "models.g: lad.top_k = 2 lowered to 1, the layers LAD reads in its range"]
    path = demo_config(tmp_path, lambda c: c["models"].update(
        gemma3_tiny={"family": "auto", "path": folder, "layer_range": [0, 2]}))
    refused(capsys, lambda: main(["where", "--configfile", path]), "models.gemma3_tiny.layer_range: layers 0-1 of the "
            "range have a sliding window of 64 tokens")
    import yaml

    from ladbench.config import REPO_ROOT
    from ladbench.workflow import start
    with pytest.raises(ConfigError, match=r"models\.gemma3_tiny\.layer_range: layers 0-1 of the range"):
        start(yaml.safe_load(open(path)), [path], str(REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"))


@current_lane
def test_a_mistral_text_model_windowed_on_every_layer(tmp_path):
    """LLaVA-NeXT on a Mistral text config with a 16-token window (shorter than any N = 8 prompt):
    the capture records the window of every layer; with every layer windowed, no layer range
    can be read, and the start-up checks say so for the default range."""
    from ladbench.model_checks import check_models
    from ladbench.models import load_adapter
    from ladbench.models.tiny_archs import build_tiny_architecture
    folder = build_tiny_architecture("llava_next", str(tmp_path / "llava_next"))
    config_file = tmp_path / "llava_next" / "config.json"
    model_config = json.loads(config_file.read_text())
    model_config["text_config"]["sliding_window"] = 16
    config_file.write_text(json.dumps(model_config))
    assert layer_windows(model_config) == [16, 16, 16]
    adapter = load_adapter("auto", folder, device="cpu", dtype="float32")
    assert adapter.attention_windows() == [16, 16, 16]
    config = {"output_dir": str(tmp_path), "lad": dict(LAD), "models": {"llava_next_7b": {
        "family": "auto", "path": folder, "tiny": False}}}
    with pytest.raises(ConfigError, match=r"^s\.yaml: models\.llava_next_7b: every layer of its layer range "
                                          r"21:35/36 has a sliding window"):
        check_models(config, "s.yaml")


# --------------------------------------------------------------------------- refusal reasons


def local_auto_model(tmp_path, key: str, model_config: dict):
    """The validated study config (its parts the start-up checks read) of one ``family: auto``
    model ``key`` whose local folder holds ``model_config`` only, and that folder."""
    folder = tmp_path / key
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(model_config))
    return {"output_dir": str(tmp_path), "lad": dict(LAD), "models": {key: {
        "family": "auto", "path": str(folder), "tiny": False}}}, folder


@current_lane
def test_refused_for_cross_attention_images_before_any_job(tmp_path):
    """Mllama's images enter through cross-attention layers: ``ladbench models`` lists it as
    refused with that cause, and the start-up checks refuse a configured mllama model."""
    from ladbench.model_checks import check_models
    from ladbench.models.auto import architecture_refusal
    assert "cross-attention layers" in architecture_refusal("mllama")
    config, folder = local_auto_model(tmp_path, "llama_vision", {"model_type": "mllama"})
    with pytest.raises(ConfigError, match=r"^s\.yaml: models\.llama_vision: family auto cannot run architecture "
                                          r"'mllama': images enter the decoder through cross-attention layers"):
        check_models(config, "s.yaml")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"^s\.yaml: models\.llama_vision: its config\.json cannot be read"):
        check_models(config, "s.yaml")


@current_lane
def test_refused_without_a_chat_template_before_any_job_and_at_load(tiny_arch_model, tmp_path):
    from ladbench.model_checks import check_models, has_chat_template
    from ladbench.models import load_adapter
    folder = tmp_path / "gemma3"
    shutil.copytree(tiny_arch_model("gemma3"), folder)
    assert has_chat_template(str(folder))
    for name in ("chat_template.jinja", "chat_template.json"):
        (folder / name).unlink(missing_ok=True)
    for name in ("processor_config.json", "tokenizer_config.json"):
        if (folder / name).exists():
            data = json.loads((folder / name).read_text())
            data.pop("chat_template", None)
            (folder / name).write_text(json.dumps(data))
    assert not has_chat_template(str(folder))
    config = {"output_dir": str(tmp_path), "lad": dict(LAD), "models": {"g": {"family": "auto", "path": str(folder),
                                                                              "tiny": False}}}
    with pytest.raises(ConfigError, match=r"^s\.yaml: models\.g: family auto cannot run architecture 'gemma3': no "
                                          r"chat template"):
        check_models(config, "s.yaml")
    with pytest.raises(ValueError, match="has no chat template"):
        load_adapter("auto", str(folder), device="cpu", dtype="float32")


@current_lane
def test_a_chat_template_given_in_the_config_serves_a_checkpoint_released_without_one(tiny_arch_model, tmp_path):
    """PaliGemma's checkpoints have no chat template: refused at start-up and at load unless the
    config gives one (models.<name>.chat_template), which the load then lays the prompt out with."""
    from ladbench.config import _check_cross_references
    from ladbench.model_checks import check_models, has_chat_template
    from ladbench.models import load_adapter
    from ladbench.models.tiny_archs import BUILDS, given_chat_template
    folder = tiny_arch_model("paligemma")
    template = given_chat_template(folder)
    assert not has_chat_template(folder) and template
    model = {"family": "auto", "path": folder, "tiny": False}
    config = {"output_dir": str(tmp_path), "lad": dict(LAD), "models": {"p": model}}
    with pytest.raises(ConfigError, match=r"^s\.yaml: models\.p: family auto cannot run architecture 'paligemma': no "
                                          r"chat template .* models\.<name>\.chat_template"):
        check_models(config, "s.yaml")
    with pytest.raises(ValueError, match="has no chat template"):
        load_adapter("auto", folder, device="cpu", dtype="float32")
    model["chat_template"] = template
    assert not any("chat template" in warning for warning in check_models(config, "s.yaml"))   # not refused
    adapter = load_adapter("auto", folder, device="cpu", dtype="float32", chat_template=template)
    assert adapter.processor.chat_template == BUILDS["paligemma"].given_chat_template
    assert adapter.chat_text("Which?", 2).count("<image>") == 2
    model["chat_template"] = str(tmp_path / "missing.jinja")
    with pytest.raises(ConfigError, match=r"^s\.yaml: models\.p\.chat_template: no file .*missing\.jinja$"):
        _check_cross_references({"datasets": {}, "models": {"p": {**model, "trust_remote_code": False}},
                                 "evaluation": {"transfer": []}}, "s.yaml")


@current_lane
def test_refused_for_one_image_per_prompt(auto_adapter):
    """A processor that expands one image placeholder of a prompt of several is refused, naming that."""
    adapter = auto_adapter("gemma3")
    text = adapter.chat_text("x", 2)
    from conftest_models import make_images
    inputs = adapter.processor(text=[text], images=[make_images(2)], return_tensors="pt",
                               return_text_replacement_offsets=True, return_offsets_mapping=True)
    replaced = [r for r in inputs["text_replacement_offsets"][0] if r["type"] == "image"][:1]
    with pytest.raises(ValueError, match=r"^family auto cannot run architecture 'gemma3': its processor takes one "
                                         r"image per prompt"):
        adapter._row_spans(inputs["input_ids"][0].numpy(), inputs["offset_mapping"][0].numpy(), replaced, 2)


@current_lane
def test_a_known_one_image_processor_is_refused_by_name_before_any_job(tmp_path):
    """ShieldGemma 2's processor classifies one image per sample: ``ladbench models`` lists it as
    refused with that cause (not untested), and the start-up checks refuse a configured one."""
    from ladbench.model_checks import check_models
    from ladbench.models.auto import ONE_IMAGE_PROCESSORS, architecture_refusal
    from ladbench.models.catalog import architecture_statuses
    from ladbench.models.tiny_archs import NOT_BUILT
    statuses = {row.model_type: row for row in architecture_statuses()}
    for model_type in ONE_IMAGE_PROCESSORS:
        assert statuses[model_type].status == "refused" and model_type not in NOT_BUILT
        assert statuses[model_type].reason.startswith("its processor takes one image per prompt (")
    assert "ShieldGemma2Processor" in architecture_refusal("shieldgemma2")
    config, _ = local_auto_model(tmp_path, "shield", {"model_type": "shieldgemma2"})
    with pytest.raises(ConfigError, match=r"^s\.yaml: models\.shield: family auto cannot run architecture "
                                          r"'shieldgemma2': its processor takes one image per prompt"):
        check_models(config, "s.yaml")


@current_lane
def test_refused_when_attention_does_not_go_through_the_capture(tiny_arch_model, monkeypatch):
    from ladbench.models import attention, load_adapter
    monkeypatch.setattr(attention.AttentionProbe, "record", lambda self, *args: None)     # no call reaches it
    with pytest.raises(ValueError, match=r"^family auto cannot run architecture 'gemma3': its decoder's attention "
                                         r"does not dispatch through transformers' AttentionInterface"):
        load_adapter("auto", tiny_arch_model("gemma3"), device="cpu", dtype="float32")


# --------------------------------------------------------------------------- progress


def test_progress_in_a_log_is_a_line_every_interval():
    """Not a terminal: lines (no in-place redraws), after batches at most every interval, and a
    heartbeat line when a batch outlasts the interval."""
    from ladbench.progress import LOG_INTERVAL_S, progress_bar
    log = io.StringIO()                                   # not a terminal, like a Snakemake or SLURM log
    with progress_bar(10, desc="infer m/vanilla", unit="row", stream=log) as bar:
        assert bar.mininterval == bar.maxinterval == LOG_INTERVAL_S <= 30
        bar.update(4)
        written = log.getvalue()
        bar.beat()                                        # no line: one was written less than an interval ago
        assert log.getvalue() == written
        bar.last_print_t -= LOG_INTERVAL_S                # a batch that takes longer than the interval
        bar.beat()
        assert log.getvalue().count("\n") == written.count("\n") + 1
        bar.update(6)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and all(line.startswith("infer m/vanilla") for line in lines)
    assert "10/10" in lines[-1] and "row/s" in lines[-1] and "<" in lines[-1]


def test_a_progress_note_is_read_afresh_for_each_line():
    """A job's note (a generative job's tokens and KV memory) follows the rate, read again at each
    batch that ends and at each heartbeat line in between (its tokens move on between chunks)."""
    from ladbench.progress import LOG_INTERVAL_S, progress_bar
    log, notes = io.StringIO(), iter(["1 tokens", "2 tokens", "3 tokens"])
    with progress_bar(10, desc="infer m/cot", unit="row", stream=log, note=lambda: next(notes)) as bar:
        bar.advance(4)
        bar.last_print_t -= LOG_INTERVAL_S
        bar.beat()
        bar.advance(6)
    lines = log.getvalue().splitlines()
    # the first line is the bar's start; the first batch writes none (within the interval); the
    # heartbeat's line reads the note again, as does the last batch's; the close repeats it
    assert [line.rsplit(", ", 1)[-1] for line in lines[1:]] == ["2 tokens]", "3 tokens]", "3 tokens]"], lines


def test_run_batches_reports_every_batch():
    """The bar moves after every batch, not only after every written chunk."""
    from ladbench.inference.runner import PreparedBatch, launched_stream, run_batches
    done, written = [], []
    stream = launched_stream(lambda b: len(b.rows), lambda rows: {"x": np.zeros(rows)})
    run_batches(stream, lambda rows: PreparedBatch(list(rows), {}), list(range(7)),
                batch_size=2, chunk_size=5, workers=0, pin_memory=False,
                write=lambda rows, results: written.append(rows), batch_done=done.append)
    assert done == [2, 2, 1, 2] and [len(rows) for rows in written] == [5, 2]


def test_run_batches_writes_each_chunk_whole_as_soon_as_its_rows_are_done_in_any_order():
    """Generation streams chunks through one decode loop, which may finish a later chunk first."""
    from ladbench.inference.runner import PreparedBatch, run_batches

    def last_first(batches):
        read = list(batches)
        for batch in reversed(read):
            yield batch, {"x": np.asarray(batch.rows, dtype=float)}
    written = []
    run_batches(last_first, lambda rows, group_size=None: PreparedBatch(list(rows), {}), list(range(7)),
                batch_size=2, chunk_size=3, workers=0, pin_memory=False, grouped=True,
                write=lambda rows, results: written.append((rows, results["x"].tolist(), len(results["seconds"]))))
    assert written == [([6], [6.0], 1), ([3, 4, 5], [3.0, 4.0, 5.0], 3), ([0, 1, 2], [0.0, 1.0, 2.0], 3)]


def test_a_given_chat_template_is_part_of_the_cache_identity_by_content(tmp_path):
    """The chat template a config gives enters the cache's digest by its content, not its path;
    without one the digest is what it was before the setting existed (no key added)."""
    from conftest_models import make_demo_benchmark
    from ladbench.data.coco import load_image_table
    from ladbench.inference.runner import InferenceSettings, config_sha256
    bench, images = make_demo_benchmark(tmp_path, 4)
    table = load_image_table(str(images))
    base = dict(benchmark=str(bench), images=str(images), out=str(tmp_path / "c.h5"), model_name="m", family="auto",
                model_path="org/model")
    digest = lambda **kw: config_sha256(InferenceSettings(**base, **kw), str(bench), table)   # noqa: E731
    first, copy, other = tmp_path / "a.jinja", tmp_path / "b.jinja", tmp_path / "c.jinja"
    first.write_text("{{ messages }}")
    copy.write_text("{{ messages }}")
    other.write_text("{{ messages }}!")
    assert "chat_template" not in InferenceSettings(**base).hashed_fields()
    assert digest(chat_template=str(first)) == digest(chat_template=str(copy)) != digest()
    assert digest(chat_template=str(other)) != digest(chat_template=str(first))
