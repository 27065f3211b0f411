"""CLIP features: the tiny open_clip model, the HDF5 layout, resumption, bad images, the QuickGELU guard."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

from ladbench.atomic import file_digest
from ladbench import features as ft
from ladbench.cli import build_parser
from ladbench.clip import ClipSettings
from ladbench.hdf5 import ResumableFile, attributes, partial_path
from ladbench.data import coco, synthetic


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny CLIP, 10 demo scenes and their image table."""
    base = tmp_path_factory.mktemp("feat")
    manifest = ft.build_tiny_clip(base / "clip", seed=0)
    scenes = synthetic.build_scenes(base / "scenes", n_images=10, seed=1, image_size=48)
    table = coco.build_image_table(scenes / "annotations" / "captions.json", scenes / "annotations" / "instances.json",
                                   scenes / "images", "demo")
    coco.write_image_table(table, base / "images.json")
    return {"base": base, "manifest": manifest, "images": base / "images.json", "table": table}


def clip_of(manifest, **kwargs) -> ClipSettings:
    """The tiny CLIP of ``manifest`` on the CPU, inline, batches of 4 (``kwargs`` change that)."""
    options = dict(model=manifest["model"], pretrained=manifest["pretrained"], model_config=manifest["model_config"],
                   batch_size=4, workers=0, device="cpu")
    return ClipSettings(**{**options, **kwargs})


def run(tiny, out, **kwargs):
    m = tiny["manifest"]
    return ft.compute_features(tiny["images"], out, clip_of(m, **kwargs))


@pytest.fixture(scope="module")
def reference_file(tiny):
    return run(tiny, tiny["base"] / "reference.h5")


def test_demo_clip_round_trips_through_the_real_loading_path(tiny):
    m = tiny["manifest"]
    assert m["weights_sha256"] == file_digest(m["pretrained"])
    model, preprocess, tokenizer, weights = ft.load_clip(m["model"], m["pretrained"], m["model_config"])
    saved = torch.load(m["pretrained"], weights_only=True)
    loaded = model.state_dict()
    assert saved.keys() == loaded.keys()
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    names = {**m, "pretrained": Path(m["pretrained"]).name, "model_config": Path(m["model_config"]).name}
    assert json.loads((tiny["base"] / "clip" / "clip.json").read_text()) == names


def test_demo_clip_is_byte_identical_when_rebuilt_elsewhere(tmp_path, tiny):
    again = ft.build_tiny_clip(tmp_path / "elsewhere", seed=0)
    for name in ("ladbench-tiny-clip.pt", "ladbench-tiny-clip.json", "clip.json"):
        assert (tmp_path / "elsewhere" / name).read_bytes() == (tiny["base"] / "clip" / name).read_bytes(), name
    assert again["weights_sha256"] == tiny["manifest"]["weights_sha256"]


def test_demo_clip_is_seeded(tmp_path, tiny):
    again = ft.build_tiny_clip(tmp_path / "again", seed=0)
    other = ft.build_tiny_clip(tmp_path / "other", seed=1)
    a = torch.load(tiny["manifest"]["pretrained"], weights_only=True)
    b = torch.load(again["pretrained"], weights_only=True)
    c = torch.load(other["pretrained"], weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_file_layout_and_values(tiny, reference_file):
    m = tiny["manifest"]
    table = tiny["table"]
    with h5py.File(reference_file, "r") as h5:
        assert h5["image_id"].dtype == np.int64 and h5["image_emb"].dtype == np.float16
        assert h5["text_emb"].dtype == np.float16 and h5["done"].dtype == bool
        assert h5["image_id"][()].tolist() == [row["image_id"] for row in table["images"]]
        attrs = attributes(h5)                   # (texts are stored fixed-length: h5py reads them as bytes)
        assert h5["done"][()].all() and bool(attrs["complete"])
        assert attrs["model"] == m["model"] and attrs["pretrained"] == Path(m["pretrained"]).name
        assert attrs["weights_sha256"] == m["weights_sha256"]
        assert attrs["open_clip_version"]
        image, text = h5["image_emb"][()].astype(np.float32), h5["text_emb"][()].astype(np.float32)
    assert image.shape == text.shape == (10, 32)
    np.testing.assert_allclose(np.linalg.norm(image, axis=1), 1, atol=2e-3)
    np.testing.assert_allclose(np.linalg.norm(text, axis=1), 1, atol=2e-3)
    # Independent computation of one row, one image at a time, straight through open_clip.
    model, preprocess, tokenizer, _ = ft.load_clip(m["model"], m["pretrained"], m["model_config"])
    row = table["images"][3]
    with torch.no_grad():
        pixels = preprocess(Image.open(os.path.join(table["image_root"], row["file_name"])).convert("RGB"))[None]
        img = model.encode_image(pixels)[0].numpy()
        txt = model.encode_text(tokenizer([row["caption"]]))[0].numpy()
    np.testing.assert_allclose(image[3], img / np.linalg.norm(img), atol=2e-3)
    np.testing.assert_allclose(text[3], txt / np.linalg.norm(txt), atol=2e-3)


def read_all(path):
    with h5py.File(path, "r") as h5:
        return {name: h5[name][()] for name in ("image_id", "image_emb", "text_emb", "done")}


def test_resumes_after_an_interrupted_run(tiny, reference_file, tmp_path, monkeypatch):
    out = tmp_path / "features.h5"
    real = ft.encode_image_batch
    calls = {"n": 0}

    def dies_on_third_batch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(ft, "encode_image_batch", dies_on_third_batch)
    with pytest.raises(KeyboardInterrupt):
        run(tiny, out)
    assert not out.exists()  # only the work file: a workflow manager may delete `out` itself
    work = partial_path(out)
    partial, attrs = ResumableFile(out).read()
    assert partial["done"].tolist() == [True] * 8 + [False] * 2  # two batches of 4 were written
    assert not attrs["complete"]

    seen_rows = []

    def records_rows(model, pixels, device):
        seen_rows.append(len(pixels))
        return real(model, pixels, device)

    monkeypatch.setattr(ft, "encode_image_batch", records_rows)
    run(tiny, out)
    assert seen_rows == [2]  # only the two rows not flagged done were computed
    assert out.exists() and not work.exists()
    run(tiny, out)
    assert seen_rows == [2]  # a finished file from the same inputs is kept as it is
    resumed, reference = read_all(out), read_all(reference_file)
    for name in reference:
        np.testing.assert_array_equal(resumed[name], reference[name])


def test_file_of_other_weights_is_started_over(tiny, reference_file, tmp_path, capsys):
    out = tmp_path / "features.h5"
    work = partial_path(out)
    for stale, message in ((work / "inputs.h5", "starting over"), (out, "rebuilding")):
        stale.parent.mkdir(exist_ok=True)
        stale.write_bytes(reference_file.read_bytes())
        with h5py.File(stale, "r+") as h5:
            h5.attrs["weights_sha256"] = "0" * 64
            h5["done"][:] = False
            h5["image_emb"][:] = 0
        run(tiny, out)
        assert message in capsys.readouterr().err
        np.testing.assert_array_equal(read_all(out)["image_emb"], read_all(reference_file)["image_emb"])


def test_dataloader_workers_give_the_same_embeddings(tiny, reference_file, tmp_path):
    out = run(tiny, tmp_path / "w.h5", workers=2)   # same batch size: a GEMM of another shape may round differently
    np.testing.assert_array_equal(read_all(out)["image_emb"], read_all(reference_file)["image_emb"])


def test_corrupt_image_is_named_or_skipped(tiny, tmp_path):
    table = json.loads(tiny["images"].read_text())
    victim = table["images"][4]["file_name"]
    root = tmp_path / "images"
    root.mkdir()
    for row in table["images"]:
        (root / row["file_name"]).write_bytes((tiny["base"] / "scenes" / "images" / row["file_name"]).read_bytes())
    (root / victim).write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    table["image_root"] = str(root)
    images = tmp_path / "images.json"
    coco.write_image_table(table, images)
    m = tiny["manifest"]
    with pytest.raises(ft.FeatureError, match=f"cannot read image .*{victim}"):
        ft.compute_features(images, tmp_path / "f.h5", clip_of(m))
    out = ft.compute_features(images, tmp_path / "f.h5", clip_of(m), skip_bad_images=True)
    data = ft.load_features(out)
    assert np.isnan(data["image_emb"][4].astype(np.float32)).all()
    assert np.isfinite(np.delete(data["image_emb"], 4, axis=0).astype(np.float32)).all()
    assert np.isfinite(data["text_emb"].astype(np.float32)).all()
    assert int(data["attrs"]["n_bad_images"]) == 1 and victim in data["attrs"]["bad_images"]


def test_quick_gelu_guard():
    with pytest.raises(ft.FeatureError, match="ViT-L-14-quickgelu"):
        ft.check_quick_gelu("ViT-L-14", "openai")
    ft.check_quick_gelu("ViT-L-14-quickgelu", "openai")  # the paper's combination passes
    with pytest.raises(ft.FeatureError, match="silently"):
        ft.check_quick_gelu("ViT-B-32", "openai")


def test_offline_without_cached_weights_says_what_to_do(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ft.FeatureError, match="pass --pretrained /path/to/checkpoint"):
        ft.resolve_weights("ViT-B-32-quickgelu", "openai", cache_dir=str(tmp_path))


def test_bad_arguments(tiny, tmp_path):
    m = tiny["manifest"]
    with pytest.raises(ft.FeatureError, match="file stem"):
        ft.register_model_config(m["model_config"], "another-name")
    with pytest.raises(ft.FeatureError, match="neither a file nor a tag"):
        ft.resolve_weights("ViT-B-32", "no-such-tag")
    with pytest.raises(ft.FeatureError, match="incomplete"):
        path = tmp_path / "x.h5"
        with h5py.File(path, "w") as h5:
            h5.attrs["complete"] = False
        ft.load_features(path)


def test_cli(tiny, tmp_path, reference_file):
    parser = build_parser(only="features")
    m = tiny["manifest"]
    args = parser.parse_args(["features", "--images", str(tiny["images"]), "--out", str(tmp_path / "f.h5"),
                              "--model", m["model"], "--pretrained", m["pretrained"], "--model-config",
                              m["model_config"], "--batch-size", "5", "--workers", "0", "--device", "cpu"])
    args.func(args)
    np.testing.assert_array_equal(read_all(tmp_path / "f.h5")["text_emb"], read_all(reference_file)["text_emb"])
    args = build_parser(only="demo-clip").parse_args(["demo-clip", "--out", str(tmp_path / "clip"), "--seed", "0"])
    args.func(args)
    assert (tmp_path / "clip" / "ladbench-tiny-clip.pt").is_file()


def test_unreadable_leftover_file_is_started_over(tiny, reference_file, tmp_path, capsys):
    out = tmp_path / "features.h5"
    out.write_bytes(b"\x89HDF\r\n\x1a\n half-written by a killed job")
    run(tiny, out)
    assert "unreadable" in capsys.readouterr().err
    np.testing.assert_array_equal(read_all(out)["text_emb"], read_all(reference_file)["text_emb"])


def test_device_choice():
    assert ft.pick_device("cpu").type == "cpu"
    assert ft.pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ft.FeatureError, match="no CUDA"):
            ft.pick_device("cuda")
