"""The smaller hostile inputs and the reference edges of issue #35 (item 7): each is one line
naming the file or setting, or refused at start-up; the reference's edges are options or rules
that ``reproduce: reference`` sets. (The reference pickles' cases are in test_reference_tables.py.)"""
from __future__ import annotations

import io
import json
import zipfile
from dataclasses import replace
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import yaml

from conftest_models import make_demo_benchmark
from ladbench import benchmark as bm
from ladbench.atomic import signed
from ladbench.cli import build_parser, main
from ladbench.config import ConfigError, load_config
from ladbench.data import download as dl
from ladbench.features import FeatureError, load_features
from ladbench.hdf5 import sign
from ladbench.methods import LadSettings
from ladbench.methods.kernels import lad, selection_warnings
from ladbench.stages.options import from_args

from test_analyze import planted_cache  # noqa: F401, F811 (a fixture)
from test_reference_draw import tied_dataset

DEMO = "workflow/demo/config.yaml"


def _config(tmp_path, edit) -> str:
    config = yaml.safe_load(open(DEMO))
    edit(config)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


# --- analysis.dcal_sizes ---------------------------------------------------------------------

def test_dcal_sizes_beyond_the_pool_are_refused_at_start_up(tmp_path):
    path = _config(tmp_path, lambda c: c.setdefault("analysis", {}).update(dcal_sizes=[1, 1000000000]))
    with pytest.raises(ConfigError, match=r"study.yaml: analysis.dcal_sizes: \[1000000000\] above "
                                          r"benchmarks.n_calibration_pool \(6\)"):
        load_config(path)
    # the defaults (up to the paper's 100) are clipped to the demo's pool of 6 as documented
    assert load_config(DEMO)["analysis"]["dcal_sizes"] == [1, 5, 10, 20, 50, 100]


def test_dcal_sizes_beyond_the_pool_of_a_cache_are_warned_by_hand(planted_cache, capsys):  # noqa: F811
    from ladbench.analysis import SweepSettings, analyze
    from ladbench.methods import MethodSettings
    from ladbench.metrics import Bootstrap

    document, _ = analyze(str(planted_cache), MethodSettings(LadSettings()), n_cal=5, seeds=[0],
                          sweeps=SweepSettings(dcal_sizes=(1, 1000000000), dcal_draws=1, taus=(5.0,)),
                          boot=Bootstrap(50, 0.95, 0))
    pool = document["n_calibration_pool"]
    assert document["settings"]["dcal_sizes"] == [1, pool]
    assert (f"analysis.dcal_sizes (--dcal-sizes) [1000000000] above the calibration pool of {pool} instances of "
            f"{planted_cache}: swept at {pool}") in capsys.readouterr().err


# --- a config that is not UTF-8 ----------------------------------------------------------------

def test_a_non_utf8_config_is_one_line_naming_the_file(tmp_path, capsys):
    path = tmp_path / "study.yaml"
    path.write_bytes(open(DEMO, "rb").read() + b"# caf\xe9\n")
    with pytest.raises(SystemExit):
        main(["where", "--configfile", str(path)])
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"ladbench where: error: {path}: not UTF-8 text (byte ") and "\n" not in err


# --- a re-signed benchmark -------------------------------------------------------------------

def _instance(doc, split="eval"):
    return doc[split][0]


@pytest.mark.parametrize("edit, problem", [
    (lambda d: _instance(d).update(id=4713.7), "eval[0].id must be a non-negative integer, got 4713.7"),
    (lambda d: _instance(d).update(orderings=[]), "eval[0].orderings must be a non-empty list of orderings"),
    (lambda d: _instance(d).update(orderings=[[0, 0, 1, 2]]), "eval[0].orderings[0] must be a permutation of 0..3"),
    (lambda d: _instance(d).update(orderings=[[0, 1, 2, 4]]), "eval[0].orderings[0] must be a permutation of 0..3"),
    (lambda d: _instance(d).update(orderings=[[0, 1, 2, 3.0]]), "eval[0].orderings[0] must be a permutation"),
    (lambda d: _instance(d, "calibration").update(target=True), "calibration[0].target must be a non-negative"),
    (lambda d: _instance(d).update(candidates=[1, 1, 2, 3]), "eval[0].candidates must be 4 distinct image ids"),
    (lambda d: _instance(d).update(target=999), "eval[0].target 999 is not one of its candidates"),
    (lambda d: d.update(n_candidates="4"), "n_candidates must be an integer >= 2"),
])
def test_a_resigned_benchmark_with_impossible_content_names_the_file(tmp_path, edit, problem):
    path, _ = make_demo_benchmark(tmp_path, 4)
    doc = bm.load_benchmark(path)
    edit(doc)
    path.write_text(json.dumps(signed(doc)))                       # a valid digest over impossible content
    with pytest.raises(bm.BenchmarkError) as caught:
        bm.load_benchmark(path)
    assert str(caught.value).startswith(f"{path}: {problem}")


def test_a_benchmark_of_two_candidates_is_the_smallest_that_loads(tmp_path):
    path, _ = make_demo_benchmark(tmp_path, 2, n_orderings=2)
    assert bm.load_benchmark(path)["n_candidates"] == 2


# --- re-signed features ----------------------------------------------------------------------

@pytest.mark.parametrize("value, problem", [(np.inf, "an infinite value"), (0.0, "only zeros")])
def test_resigned_features_with_inf_or_zero_rows_name_the_file(tmp_path, value, problem):
    path = tmp_path / "features.h5"
    emb = np.ones((3, 4), dtype=np.float16)
    emb[1] = value
    with h5py.File(path, "w") as h5:
        h5["image_id"] = np.array([5, 6, 7])
        h5["image_emb"], h5["text_emb"] = emb, np.ones((3, 4), dtype=np.float16)
        h5.attrs["complete"] = True
        sign(h5)
    with pytest.raises(FeatureError) as caught:
        load_features(path)
    assert str(caught.value).startswith(f"{path}: image_emb row 1 (image 6) holds {problem}")
    emb[1] = np.nan                                # an unreadable image left out by --skip-bad-images: read
    with h5py.File(path, "w") as h5:
        h5["image_id"], h5["image_emb"], h5["text_emb"] = np.array([5, 6, 7]), emb, np.ones((3, 4), np.float16)
        h5.attrs["complete"] = True
        sign(h5)
    assert np.isnan(load_features(path)["image_emb"][1]).all()


# --- --seed ----------------------------------------------------------------------------------

@pytest.mark.parametrize("command, required", [
    ("demo-scenes", ["--out", "x"]), ("demo-model", ["--family", "qwen2_5_vl", "--out", "x"]),
    ("demo-clip", ["--out", "x"]), ("calibrate", ["--cache", "c.h5", "--out", "c.npz"]),
])
def test_a_negative_seed_names_the_flag(command, required, capsys):
    with pytest.raises(SystemExit):
        build_parser(command).parse_args([command, *required, "--seed", "-1"])
    assert "argument --seed: a seed is a non-negative integer, got -1" in capsys.readouterr().err


def test_a_settings_flag_out_of_bounds_names_the_flag():
    parser = build_parser("benchmark")
    args = parser.parse_args(["benchmark", "--images", "i.json", "--features", "f.h5", "--setting", "random",
                              "--n-candidates", "4", "--out", "b.json", "--seed", "-1"])
    with pytest.raises(ValueError, match=r"^--seed: seed must be >= 0, got -1$"):
        from_args(bm.BenchmarkSettings, args)


# --- download --no-checksum and a zip bomb -----------------------------------------------------

def _bomb(path, size=50 << 20) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("val2014/zeros.jpg", b"\0" * size)
    path.write_bytes(buffer.getvalue())


def test_a_zip_bomb_is_not_extracted(tmp_path):
    archive = tmp_path / "val2014.zip"
    _bomb(archive)
    with pytest.raises(dl.DownloadError, match=r"val2014.zip: member val2014/zeros.jpg would expand from \d+ to "
                                               r"52428800 bytes .*not extracted"):
        dl.extract(archive, tmp_path / "out", ("val2014",))
    assert not (tmp_path / "out" / "val2014").exists()
    with pytest.raises(dl.DownloadError, match="a zip bomb"):
        dl.verify_file(archive, is_zip=True)          # what a download checks, with or without --no-checksum


def test_an_ordinary_archive_is_extracted(tmp_path):
    archive = tmp_path / "val2014.zip"
    _bomb(archive, size=1 << 20)                      # 1 MiB of zeros: small members are not held to the ratio
    dl.verify_file(archive, is_zip=True)
    dl.extract(archive, tmp_path / "out", ("val2014",))
    assert (tmp_path / "out" / "val2014" / "zeros.jpg").stat().st_size == 1 << 20


# --- the orderings' own seed -------------------------------------------------------------------

def test_the_orderings_seed_is_apart_from_the_draws():
    table, features = tied_dataset()
    kwargs = dict(n_eval=6, n_calibration=2, n_orderings=3, pool_size=60)
    default = bm.build_benchmark(table, features, "random", 4, seed=7, **kwargs)
    assert "ordering_seed" not in default                       # unset: the seed, and the file as before
    assert default == bm.build_benchmark(table, features, "random", 4, seed=7, ordering_seed=7, **kwargs)
    apart = bm.build_benchmark(table, features, "random", 4, seed=7, ordering_seed=42, **kwargs)
    assert apart["orderings"] == bm.shared_orderings(4, 3, 42) != default["orderings"]
    assert apart["ordering_seed"] == 42
    assert [i["candidates"] for i in apart["eval"]] == [i["candidates"] for i in default["eval"]]


def test_per_instance_orderings_with_their_own_seed_do_not_follow_the_draws_seed():
    table, features = tied_dataset()
    kwargs = dict(n_eval=6, n_calibration=2, n_orderings=3, pool_size=60, orderings="per_instance")

    def orderings(**seeds):
        return [i["orderings"] for i in bm.build_benchmark(table, features, "random", 4, **seeds, **kwargs)["eval"]]
    assert orderings(seed=7, ordering_seed=42) == orderings(seed=8, ordering_seed=42) != orderings(seed=7)
    assert orderings(seed=7) != orderings(seed=8)     # unset: the draw's own stream


def test_reproduce_reference_fixes_the_orderings_seed_and_leaves_the_draws(tmp_path):
    def edit(config):
        config.update(reproduce="reference")
        del config["inference"]["image_size"]
        config["benchmarks"]["seed"] = 7                  # the reference's build_eval_dataset.py --seed 7
    loaded = load_config(_config(tmp_path, edit))
    assert loaded["benchmarks"]["seed"] == 7 and loaded["benchmarks"]["ordering_seed"] == 42


# --- lad.top_k: 0 and the tie warning with absent layers --------------------------------------------

def test_top_k_zero_is_a_uniform_posterior():
    rng = np.random.default_rng(0)
    scores, attn = rng.normal(size=(5, 3)), rng.uniform(0.01, 0.2, size=(5, 6, 3))
    calibration = SimpleNamespace(B=rng.normal(size=(3, 3)), attn_prior=rng.uniform(0.01, 0.2, size=(6, 3)))
    for mean in ("reference", "paper"):
        corrected = lad(scores, attn, calibration, LadSettings(top_k=0, layer_mean=mean))
        np.testing.assert_allclose(corrected, scores - calibration.B.mean(axis=0))     # pi = 1/N: B's column mean
    assert "uniform" in selection_warnings(attn, LadSettings(top_k=0))[0]


def test_the_tie_warning_counts_only_ties_that_change_the_selection():
    attn = np.random.default_rng(1).uniform(0.01, 0.2, size=(4, 6, 3))    # 6 layers, none tied
    base = LadSettings(layer_range=(2, 9), layers_beyond_depth="absent", layer_ties="highest")
    # K = 6 of the range 2..9: the 4 real layers and 2 of the 4 absent ones, all zeros: nothing to warn of
    warnings = selection_warnings(attn, replace(base, top_k=6))
    assert not any("tie" in w for w in warnings) and any("which the model does not have" in w for w in warnings)
    # a real layer of zero attention ties with the absent ones: which is kept changes the result
    attn[:2, 3] = 0.0
    warnings = selection_warnings(attn, replace(base, top_k=4))
    assert any(w.startswith("2 of 4 rows have a tie at the K-th strongest layer") for w in warnings)
