"""One line, never a traceback: every failure a user's file, config, plugin or environment
causes is one line naming the file or the key (and how to fix it). This walks the cases:
a damaged HDF5 file, a plugin that raises at import, a setting or an input that would run
out of memory, undecodable bytes, values validation must refuse, and lane refusals."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest_models import make_demo_benchmark
from ladbench.atomic import signed
from ladbench.cli import main
from ladbench.config import REPO_ROOT
from ladbench.families import FAMILIES, family_lanes, installed_lane
from test_inputs import calibrate, refused, write_cache

DEMO = REPO_ROOT / "workflow" / "demo" / "config.yaml"


def demo_config(tmp_path, edit=None, text=None):
    """The demo config, edited (a function of the loaded mapping) or replaced by ``text``."""
    path = tmp_path / "study.yaml"
    if text is not None:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return str(path)
    config = yaml.safe_load(DEMO.read_text())
    config["output_dir"] = str(tmp_path / "out")
    if edit:
        edit(config)
    path.write_text(yaml.safe_dump(config))
    return str(path)


ALIAS_BOMB = "lad:\n  top_k: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"  x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))


def _set(section, key, value):
    return lambda c: c.setdefault(section, {}).update({key: value})


@pytest.mark.parametrize("edit, text, expected", [
    (_set("lad", "tau", float("inf")), None, "lad.tau: inf is not a finite number"),
    (_set("evaluation", "bootstrap", 10_000_000), None, "evaluation.bootstrap: bootstrap must be <= 100,000, got 10000000"),
    (_set("benchmarks", "seed", -1), None, "benchmarks.seed: seed must be >= 0, got -1"),
    (_set("calibration", "seeds", [0, -3]), None, "calibration.seeds[1]: -3 is less than the minimum"),
    (_set("lad", "top_k", list(range(5000))), None, "lad.top_k: [0, 1, 2, 3, ...] is not of type 'integer'"),
    (None, ALIAS_BOMB, "more than 100,000 values once its YAML aliases (*name) are expanded"),
    (None, b"output_dir: r\xe9sultats\n", "not UTF-8 text"),
])
def test_a_config_that_cannot_work_is_one_line_naming_the_key(tmp_path, capsys, edit, text, expected):
    path = demo_config(tmp_path, edit, text)
    line = refused(capsys, lambda: main(["where", "--configfile", path]), path, expected)
    assert len(line) < 400                      # never a whole value


def test_a_plugin_that_raises_at_import_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "raising_plugin.py").write_text("import json\njson.loads('{')\n")   # any exception, not ImportError
    monkeypatch.syspath_prepend(str(tmp_path))
    path = demo_config(tmp_path, lambda c: c.update(plugins=["raising_plugin"]))
    refused(capsys, lambda: main(["where", "--configfile", path]), "plugins: plugin module 'raising_plugin' failed while "
            "being imported (JSONDecodeError", "raising_plugin.py:2")
    monkeypatch.setenv("LADBENCH_PLUGINS", "raising_plugin")
    with pytest.raises(SystemExit):
        main(["where", "--configfile", path])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "plugin module 'raising_plugin' (named by $LADBENCH_PLUGINS) failed" in err


def test_an_installed_plugin_that_raises_at_import_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "raising_entry.py").write_text("raise RuntimeError('broken on purpose')\n")
    dist = tmp_path / "raising-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: raising\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[ladbench.plugins]\nbroken = raising_entry\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("ladbench.plugins._LOADED", [])
    with pytest.raises(SystemExit):
        main(["where", "--configfile", demo_config(tmp_path, lambda c: None)])
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "plugin 'raising_entry' (entry point 'broken' of ladbench.plugins) failed while being imported " \
           "(RuntimeError: broken on purpose, at " in err and "raising_entry.py:1" in err


def test_damaged_files_are_one_line(tmp_path, capsys):
    cache = write_cache(tmp_path / "a.h5")
    data = (tmp_path / "a.h5").read_bytes()
    at = data.index(b"sha-of-scenes_random")                             # inside an attribute's value
    (tmp_path / "a.h5").write_bytes(data[:at] + b"SHA" + data[at + 3:])
    refused(capsys, lambda: calibrate(cache, tmp_path / "c.npz"), cache, "rerun the workflow (or `ladbench infer`)")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=1, n_orderings=1, n_cal=1)
    bench.write_bytes(bench.read_bytes().replace(b"square", b"squ\xe9re", 1))           # undecodable
    infer = ["infer", "--benchmark", str(bench), "--images", str(images), "--out", str(tmp_path / "c.h5"),
             "--model-name", "m", "--family", "qwen2_5_vl", "--model-path", str(tmp_path), "--device", "cpu"]
    refused(capsys, lambda: main(infer), str(bench), "not UTF-8 text")


def test_a_setting_or_an_input_that_would_exhaust_the_memory_is_one_line(tmp_path, capsys, monkeypatch):
    cache = write_cache(tmp_path / "a.h5")
    cal = calibrate(cache, tmp_path / "cal.npz")
    evaluate = ["evaluate", "--cache", cache, "--calibration", cal, "--layer-range", "all", "--out",
                str(tmp_path / "e.json")]
    refused(capsys, lambda: main([*evaluate, "--bootstrap", "10000000"]), "bootstrap must be <= 100,000, got 10000000")
    refused(capsys, lambda: main([*evaluate, "--tau", "inf"]), "tau must be finite, got inf")
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=1, n_orderings=1, n_cal=1)
    doc = json.loads(bench.read_text())
    doc["eval"][0]["caption"] = "a red square " * 200_000                      # 2.6 MB
    bench.write_text(json.dumps(signed(doc)))
    infer = ["infer", "--benchmark", str(bench), "--images", str(images), "--out", str(tmp_path / "c.h5"),
             "--model-name", "m", "--family", "qwen2_5_vl", "--model-path", str(tmp_path), "--device", "cpu"]
    refused(capsys, lambda: main(infer), str(bench), f"eval instance 0 (image {doc['eval'][0]['target']})",
            "2,600,000 characters, more than 1,000")

    def exhausted(*args, **kwargs):
        raise MemoryError()
    monkeypatch.setattr("ladbench.evaluation.fit_calibration", exhausted)
    refused(capsys, lambda: calibrate(cache, tmp_path / "c2.npz"), "out of memory")


@pytest.mark.parametrize("entry, problem", [
    ({"id": 4713.7, "file_name": "a.png"}, "image id 4713.7 is not an integer"),
    ({"id": 1, "file_name": "../../etc/passwd"}, "points outside the image root"),
    ({"id": 1, "file_name": "/etc/passwd"}, "points outside the image root"),
])
def test_annotation_files_are_checked_not_coerced(tmp_path, capsys, entry, problem):
    captions = tmp_path / "captions.json"
    captions.write_text(json.dumps({"images": [entry], "annotations": [{"image_id": entry["id"], "caption": "c"}]}))
    args = ["captions", "--captions-json", str(captions), "--image-root", str(tmp_path), "--dataset", "d",
            "--no-check-files", "--out", str(tmp_path / "t.json")]
    refused(capsys, lambda: main(args), str(captions), problem)


@pytest.mark.parametrize("caption, problem", [("", "is empty"), ("   ", "is empty"), ({"text": "a"}, "is a dict"),
                                              ("x" * 1001, "has 1,001 characters")])
def test_captions_are_non_empty_strings_of_bounded_length_naming_the_image(tmp_path, capsys, caption, problem):
    captions = tmp_path / "captions.json"
    captions.write_text(json.dumps({"images": [{"id": 7, "file_name": "a.png"}],
                                    "annotations": [{"image_id": 7, "caption": caption}]}))
    args = ["captions", "--captions-json", str(captions), "--image-root", str(tmp_path), "--dataset", "d",
            "--no-check-files", "--out", str(tmp_path / "t.json")]
    refused(capsys, lambda: main(args), str(captions), f"the caption of image 7 {problem}")


def test_files_outside_the_root_only_when_the_config_says_so(tmp_path):
    captions = tmp_path / "captions.json"
    captions.write_text(json.dumps({"images": [{"id": 1, "file_name": "../a.png"}],
                                    "annotations": [{"image_id": 1, "caption": "c"}]}))
    out = tmp_path / "t.json"
    main(["captions", "--captions-json", str(captions), "--image-root", str(tmp_path), "--dataset", "d",
          "--no-check-files", "--files-outside-root", "--out", str(out)])
    from ladbench.data.coco import load_image_table
    assert load_image_table(out)["files_outside_root"] is True


OTHER_LANE = [f for f in FAMILIES if installed_lane() not in family_lanes(f)]


@pytest.mark.skipif(not OTHER_LANE, reason="every family runs on this lane")
def test_a_family_of_the_other_lane_is_one_line_in_every_command(tmp_path, capsys):
    family = OTHER_LANE[0]
    bench, images = make_demo_benchmark(tmp_path, 4, n_eval=1, n_orderings=1, n_cal=1)
    infer = ["infer", "--benchmark", str(bench), "--images", str(images), "--out", str(tmp_path / "c.h5"),
             "--model-name", "m", "--family", family, "--model-path", str(tmp_path), "--device", "cpu"]
    refused(capsys, lambda: main(infer), f"model family {family!r} runs only on the")
    refused(capsys, lambda: main(["demo-model", "--family", family, "--out", str(tmp_path / "m")]),
            f"model family {family!r} runs only on the")
    path = demo_config(tmp_path, lambda c: c["models"]["tiny_qwen2_5_vl"].update(family=family))
    refused(capsys, lambda: main(["where", "--configfile", path]), f"family {family!r} runs only on the")


def test_the_unedited_config_passes(tmp_path):
    """The control: the demo config as it is passes every check the cases above fail."""
    main(["where", "--configfile", demo_config(tmp_path)])
