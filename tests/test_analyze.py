"""Stage `analyze`: ablations, sweeps, divergence and profiles from one cache, checked on a
planted cache (position-biased logits, content-following attention) written with the
project's own cache writer."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ladbench import methods, metrics
from ladbench.calibration import fit_calibration
from ladbench.cli import main
from ladbench.inference.cache import CacheLayout, CacheWriter, plan_rows, read_cache
from ladbench.analysis import (
    Bootstrap,
    SweepSettings,
    analyze,
    dcal_sizes_for_pool,
    position_profiles,
    row_result,
)
from ladbench.arrays import EvalArrays, calibration_arrays, eval_arrays

N, LAYERS, N_EVAL, N_POOL, T = 4, 3, 40, 12, 5


def planted_benchmark(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def instance(i, with_orderings):
        candidates = [int(c) for c in rng.permutation(1000)[:N]]
        out = {"id": i, "caption": "c", "target": candidates[int(rng.integers(N))], "candidates": candidates}
        if with_orderings:
            out["orderings"] = [list(range(N))] + [[int(p) for p in rng.permutation(N)] for _ in range(T - 1)]
        return out

    return {"dataset": "toy", "setting": "random", "n_candidates": N, "seed": seed, "n_orderings": T,
            "eval": [instance(i, True) for i in range(N_EVAL)],
            "calibration": [instance(i, False) for i in range(N_POOL)]}


def planted_results(plan, seed: int = 1) -> dict[str, np.ndarray]:
    """Logits: a strong bias toward position 0 plus a weak content signal (wrong most of the
    time). Attention: a positional prior times a clear peak on the target image (the last
    layer carries most of the evidence), so purified attention and LAD recover the target."""
    rng = np.random.default_rng(seed)
    rows = len(plan)
    is_target = np.arange(N)[None, :] == plan.target_pos[:, None]
    scores = np.where(np.arange(N) == 0, 3.0, 0.0)[None, :] + 1.0 * is_target + rng.normal(0, 0.3, (rows, N))
    prior = np.array([0.5, 0.2, 0.15, 0.15])
    strength = np.array([0.2, 0.5, 1.0])[:, None]  # per layer
    evidence = prior[None, None, :] * (1.0 + 2.0 * is_target[:, None, :]) * np.exp(rng.normal(0, 0.1, (rows, LAYERS, N)))
    attn = strength[None] * evidence / evidence.sum(-1, keepdims=True)
    return {"scores": scores.astype(np.float32), "attn": attn.astype(np.float32),
            "attn_text": np.full((rows, LAYERS), 0.1, np.float32)}


@pytest.fixture(scope="module")
def planted_cache(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cache") / "vanilla.h5"
    plan = plan_rows(planted_benchmark())
    writer = CacheWriter.open(str(path), plan, CacheLayout(N, LAYERS, n_heads=2),
                              {"config_sha256": "planted", "model": "toy", "model_path": "toy/path", "variant": "vanilla",
                               "n_candidates": N, "n_layers": LAYERS})
    writer.write(np.arange(len(plan)), planted_results(plan))
    writer.finish({"rows_per_s": 10.0, "peak_rss_mb": 100.0, "peak_cuda_mb": float("nan"), "device": "cpu"})
    return path


@pytest.fixture(scope="module")
def analysis(planted_cache):
    return analyze(str(planted_cache), methods.MethodSettings(methods.LadSettings(top_k=2, tau=5.0)), n_cal=5,
                   seeds=[0, 1], sweeps=SweepSettings(dcal_sizes=(1, 5, 10, 20, 50, 100), dcal_draws=3, taus=(1, 5, 9)),
                   boot=Bootstrap(200, 0.95, 0))


def by_label(rows):
    return {row["label"]: row for row in rows}


def test_dcal_sizes_are_clipped_to_the_pool_and_deduplicated():
    assert dcal_sizes_for_pool([1, 5, 10, 20, 50, 100], 12) == [1, 5, 10, 12]
    assert dcal_sizes_for_pool([100, 50], 20) == [20]
    with pytest.raises(ValueError, match=">= 1"):
        dcal_sizes_for_pool([0, 5], 12)


def test_planted_bias_lad_beats_vanilla_and_attention_is_order_robust(analysis):
    document, _ = analysis
    readouts = by_label(document["readouts"])
    assert readouts["vanilla"]["metrics"]["acc_mean"] < 40
    assert readouts["lad"]["metrics"]["acc_mean"] > readouts["vanilla"]["metrics"]["acc_mean"] + 30
    assert readouts["purified_attention"]["metrics"]["acc_mean"] > 80
    # Purifying removes the positional pattern the raw attention shares with the logits:
    # the image ranking becomes more stable across orderings, step by step.
    raw, purified = document["divergence"]["raw"], document["divergence"]["purified"]
    assert purified["attention"]["mean"] > raw["attention"]["mean"] > raw["logits"]["mean"]
    assert purified["attention_minus_logits"]["ci_low"] > 0


def test_readouts_equal_the_methods_registry_on_the_same_calibration(planted_cache, analysis):
    """The analysis must not reimplement anything: its LAD row is exactly the registry's
    LAD on the calibration drawn with the first seed."""
    document, _ = analysis
    cache = read_cache(str(planted_cache))
    arrays, cal = eval_arrays(cache), calibration_arrays(cache)
    calibration = fit_calibration(cal.scores, cal.attn, cal.target_pos, n_cal=5, seed=0)
    pred = methods.METHODS["lad"](arrays, calibration, methods.MethodSettings(methods.LadSettings(top_k=2, tau=5.0)))
    expected = metrics.summarize(pred, arrays.target_pos, arrays.order, N, n_boot=200, seed=0)
    row = by_label(document["readouts"])["lad"]
    assert row["metrics"]["acc_mean"] == pytest.approx(expected["acc_mean"])
    assert row["metrics"]["acc_mean_ci_low"] == pytest.approx(expected["acc_mean_ci_low"])
    assert row["calibration_draws"]["n_draws"] == 2


def test_ablation_grid_has_table4_rows_and_marks_impossible_k(analysis):
    document, _ = analysis
    rows = document["ablation"]
    # LAD's own grid, then a row per method that declared one (Method.ablation: its label)
    declared = [methods.METHODS[name] for name in methods.ablation_methods()]
    assert [(r["strategy"], r["prior"], r["top_k"]) for r in rows] == [
        ("Attn readout", False, 2), ("Attn readout", True, 2), ("All layers", True, None), ("Dynamic", False, 2),
        ("Dynamic", True, 1), ("Dynamic", True, 2), ("Dynamic", True, 4), ("Dynamic", True, 8),
    ] + [(m.label, m.needs_calibration, 2 if m.selects_layers else None) for m in declared]
    beyond = [r for r in rows if r["top_k"] in (4, 8)]  # the range holds 3 layers: K lowered to 3 (the reference)
    assert all(any("K lowered to 3" in w for w in r["warnings"]) for r in beyond)
    assert beyond[0]["metrics"] == beyond[1]["metrics"]
    # Dynamic, prior, K = 2 is LAD at the base settings.
    assert by_label(rows)["dynamic_prior_K2"]["metrics"] == by_label(document["readouts"])["lad"]["metrics"]


def test_sweeps_cover_the_requested_values(analysis):
    document, _ = analysis
    assert [row["tau"] for row in document["tau_sweep"]] == [1.0, 5.0, 9.0]
    sweep = document["dcal_sweep"]
    assert [row["n_cal"] for row in sweep] == [1, 5, 10, 12]
    assert sweep[0]["seeds"] == [0, 1, 2] and sweep[-1]["seeds"] == [0]  # the whole pool is one draw
    lad_at_pool = sweep[-1]["methods"]["lad"]["acc_mean"]
    assert lad_at_pool["std"] == 0.0 and len(lad_at_pool["values"]) == 1


def test_paper_vs_reference_covers_every_combination(analysis):
    document, _ = analysis
    combos = {(r["score_average"], r["layer_mean"], r["mixture"], r["method"]) for r in document["paper_vs_reference"]}
    for average in ("reference", "paper"):
        for mean in ("reference", "paper"):
            for mixture in ("reference", "paper"):
                assert (average, mean, mixture, "lad") in combos
        assert (average, None, None, "pride_original") in combos


def test_profiles_are_distributions_grouped_by_ground_truth(analysis):
    document, arrays = analysis
    for name in ("probability", "attention_share", "purified_share"):
        assert arrays[name].shape == (N_EVAL, T, N)
        np.testing.assert_allclose(arrays[name].sum(-1), 1.0, atol=1e-9)
        profile = document["profiles"][name]
        assert sum(profile["count"]) == N_EVAL * T
    # The planted attention peaks on the target: the purified share is largest on the diagonal.
    mean = np.array(document["profiles"]["purified_share"]["mean"])
    assert np.all(np.argmax(mean, axis=1) == np.arange(N))


def test_profile_rows_by_hand():
    """Figures 2-3's rows: softmax of the scores, the raw attention's shares (a row of zero
    attention: uniform, not 0/0) and softmax(log pi~) at tau = 1, per ordering."""
    scores = np.log([[[1.0, 3.0, 4.0], [4.0, 1.0, 3.0]]])                               # [I = 1, T = 2, N = 3]
    attn = np.array([[[[0.2, 0.6, 0.2]], [[0.0, 0.0, 0.0]]]])                          # [1, 2, Lyr = 1, 3]
    arrays = EvalArrays(scores=scores, attn=attn, target_pos=np.array([[1, 0]]), order=np.array([[[0, 1, 2], [1, 2, 0]]]))
    prior = np.array([[0.5, 0.25, 0.25]])
    base = methods.LadSettings(top_k=1)
    _, rows = position_profiles(arrays, SimpleNamespace(attn_prior=prior), base)
    np.testing.assert_allclose(rows["probability"], [[[1 / 8, 3 / 8, 4 / 8], [4 / 8, 1 / 8, 3 / 8]]])
    np.testing.assert_allclose(rows["attention_share"], [[[0.2, 0.6, 0.2], [1 / 3, 1 / 3, 1 / 3]]])
    log_pi = methods.purified_attention(attn, prior, base)
    expected = np.exp(log_pi) / np.exp(log_pi).sum(-1, keepdims=True)
    np.testing.assert_allclose(rows["purified_share"], expected)
    # attention over prior 0.2 / 0.5, 0.6 / 0.25, 0.2 / 0.25, normalised
    np.testing.assert_allclose(rows["purified_share"][0, 0], [0.4 / 3.6, 2.4 / 3.6, 0.8 / 3.6])


def test_variant_that_cannot_run_is_reported_not_raised(planted_cache):
    cache = read_cache(str(planted_cache))
    arrays, cal = eval_arrays(cache), calibration_arrays(cache)
    calibration = fit_calibration(cal.scores, cal.attn, cal.target_pos, n_cal=5, seed=0)
    variant = methods.MethodRow("too_many", "lad", methods.LadSettings(top_k=9, k_beyond_range="error"))
    row = row_result(variant, arrays, [calibration], Bootstrap(0))
    assert "top_k" in row["unavailable"] and "metrics" not in row


def test_cli_writes_strict_json_and_arrays(planted_cache, tmp_path):
    out = tmp_path / "analysis" / "toy" / "toy_random_N4" / "vanilla.json"
    main(["analyze", "--cache", str(planted_cache), "--layer-range", "all", "--n-cal", "5", "--seeds", "0", "--dcal-sizes", "1", "5",
          "--dcal-draws", "2", "--taus", "2", "5", "--bootstrap", "50", "--out", str(out)])
    document = json.loads(out.read_text(), parse_constant=lambda name: pytest.fail(f"non-strict JSON: {name}"))
    assert document["settings"]["dcal_sizes"] == [1, 5] and document["n_calibration_pool"] == N_POOL
    sizes = [document[key] for key in ("n_instances", "n_orderings", "n_candidates", "n_layers")]
    assert sizes == [N_EVAL, T, N, LAYERS]
    with np.load(out.with_suffix(".npz")) as data:
        assert {"rho_logits", "rho_attention_raw", "rho_attention_purified", "probability", "target_pos"} <= set(data.files)


def test_analyze_refuses_too_large_dcal(planted_cache, capsys):
    with pytest.raises(ValueError, match="calibration pool has 12"):
        analyze(str(planted_cache), methods.MethodSettings(), n_cal=50, seeds=[0])
    # the whole pool is a |D_cal| it can draw; a swept size above the pool is swept at it, and said
    quick = dict(n_cal=N_POOL, seeds=[0], boot=Bootstrap(10, 0.95, 0))
    for sizes, warned in (((5, N_POOL), ""), ((5, N_POOL + 1), f"[{N_POOL + 1}] above the calibration pool of 12")):
        document, _ = analyze(str(planted_cache), methods.MethodSettings(), **quick,
                              sweeps=SweepSettings(dcal_sizes=sizes, dcal_draws=1, taus=(1,)))
        assert [row["n_cal"] for row in document["dcal_sweep"]] == [5, N_POOL]
        err = capsys.readouterr().err
        assert warned in err if warned else "warning" not in err


def test_a_registered_method_joins_the_readouts_the_ablation_table_and_the_figures(planted_cache, monkeypatch):
    """A method is its kernel and one registration: declared a readout, an ablation row and a
    colour, it is in the analysis file's readouts and ablation rows, in Table 4 and Table 7 and
    in the figures' colours, with no list elsewhere edited."""
    from ladbench.report.figures import OKABE_ITO, method_colors, method_markers
    from ladbench.report.tables import table4, table7

    last_argmax = methods.Method(methods.METHODS["vanilla"].predict, "Last-layer toy", readout=5, ablation=True,
                                 color="purple", marker="x")
    monkeypatch.setitem(methods.METHODS, "last_argmax", last_argmax)
    document, _ = analyze(str(planted_cache), methods.MethodSettings(methods.LadSettings(top_k=2, tau=5.0)), n_cal=5,
                          seeds=[0], sweeps=SweepSettings(dcal_sizes=(5,), dcal_draws=1, taus=(5,)),
                          boot=Bootstrap(50, 0.95, 0))
    assert [row["label"] for row in document["readouts"]][-1] == "last_argmax"
    (row,) = [row for row in document["ablation"] if row["label"] == "last_argmax"]
    assert row["strategy"] == "Last-layer toy" and row["prior"] is False and row["top_k"] is None
    # its readout is the vanilla kernel's: the same accuracy as the vanilla readout
    readouts = by_label(document["readouts"])
    assert readouts["last_argmax"]["metrics"]["acc_mean"] == readouts["vanilla"]["metrics"]["acc_mean"]
    study = SimpleNamespace(models=["m"], benchmarks=["toy_random_N4"], analysis=lambda model, benchmark: document,
                            setting_label=lambda benchmark: "Random",
                            method_metrics=lambda *args: None)
    assert table4(study).blocks[0].rows[-1][0] == "Last-layer toy"
    assert table7(study).header[-1] == "Last-layer toy"
    assert method_colors()["last_argmax"] == OKABE_ITO["purple"] and method_markers()["last_argmax"] == "x"
