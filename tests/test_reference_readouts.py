"""The reference's last readout rules, as options (`reproduce: reference` sets them): its reply
parse, K beyond the model's depth, its argsort tie rule, undefined statistics and a
calibration position without rows. Written from its documented behaviour (docs/method.md)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from ladbench import calibration, methods, metrics
from ladbench.calibration import EPS, Calibration
from ladbench.evaluation import evaluation_warnings
from ladbench.metrics import Bootstrap

# --- the reply parse --------------------------------------------------------------------

# reply, N, position by "exact" (identifiers), position by "int" (the reference's int() per digit run)
PARSE_TABLE = [
    ("2", 4, 1, 1),
    ("Image 3.", 4, 2, 2),
    ("1 or 2", 4, 1, 1),                  # the last valid one
    ("03", 4, -1, 2),                     # a leading zero
    ("005", 8, -1, 4),
    ("３", 4, -1, 2),                      # fullwidth digit three
    ("٣", 4, -1, 2),                      # Arabic-Indic digit three
    ("०४", 4, -1, 3),                     # Devanagari zero four
    ("２3", 8, -1, -1),                    # one run, int() = 23: out of range for both
    ("10", 8, -1, -1),                    # out of range
    ("10", 16, 9, 9),
    ("0", 4, -1, -1),
    ("2 then 07", 8, 1, 6),               # exact skips "07" and keeps the 2
    ("", 4, -1, -1),
    ("none", 4, -1, -1),
]


@pytest.mark.parametrize("reply, n, exact, as_int", PARSE_TABLE)
def test_the_parse_table(reply, n, exact, as_int):
    assert methods.parse_reference_replies(np.array([reply], dtype=object), n, "exact").tolist() == [exact]
    assert methods.parse_reference_replies(np.array([reply], dtype=object), n, "int").tolist() == [as_int]


def test_vanilla_generate_reads_by_the_setting_and_the_differences_are_warned():
    texts = np.array([["03", "2"], ["３", "x"], ["1", "4"]], dtype=object)
    arrays = SimpleNamespace(scores=np.zeros((3, 2, 4)), greedy_text=texts)
    vanilla_generate = methods.METHODS["vanilla_generate"]
    assert vanilla_generate(arrays, None, methods.MethodSettings()).tolist() == [[-1, 1], [-1, -1], [0, 3]]   # exact
    settings = methods.MethodSettings(readout=methods.ReadoutSettings(reply_parse="int"))
    assert vanilla_generate(arrays, None, settings).tolist() == [[2, 1], [2, -1], [0, 3]]
    assert methods.reply_parse_warnings(arrays, "int") == [                # "03" and "３": the others read alike
        "2 of 6 greedy replies name another position when each run of digits is read by int() (leading zeros, "
        "non-ASCII decimal digits; reply_parse = int, the reference's)"]
    assert methods.reply_parse_warnings(arrays, "exact") == []


# --- K beyond the model's depth ----------------------------------------------------------

def reference_log_pi(attn_row: np.ndarray, prior: np.ndarray, first: int, last: int, k: int) -> np.ndarray:
    """One row as the reference computes it: the layers first..last hooked, a layer the model
    lacks left at attention 0 (and prior 0); the last K of an ascending sort of the layers'
    mean; log(mean of the selected + eps) - mean of log(prior + eps)."""
    layers = range(first, last + 1)
    scores = np.array([attn_row[layer] if layer < len(attn_row) else np.zeros(attn_row.shape[1]) for layer in layers])
    bias = np.array([prior[layer] if layer < len(prior) else np.zeros(prior.shape[1]) for layer in layers])
    top = np.argsort(scores.mean(axis=1), kind="stable")[-min(k, len(scores)):]
    return np.log(scores[top].mean(axis=0) + EPS) - np.log(bias[top] + EPS).mean(axis=0)


def test_k_beyond_a_28_layer_model_averages_the_absent_layers_in():
    rng = np.random.default_rng(0)
    attn = rng.uniform(0.01, 0.2, size=(30, 28, 4))           # 30 rows of a 28-layer model, N = 4
    prior = rng.uniform(0.01, 0.2, size=(28, 4))
    settings = dict(top_k=8, layer_range=(21, 35), layer_ties="highest")
    absent = methods.purified_attention(attn, prior, methods.LadSettings(layers_beyond_depth="absent", layer_ties="highest",
                                                                         top_k=8, layer_range=(21, 35)))
    expected = np.array([reference_log_pi(row, prior, 21, 35, 8) for row in attn])
    np.testing.assert_allclose(absent, expected, rtol=0, atol=1e-9)
    # clipped, K is lowered to the 7 layers 21..27 and the prior weighs 1/7 instead of 1/8
    clipped = methods.purified_attention(attn, prior, methods.LadSettings(layer_ties="highest", top_k=8, layer_range=(21, 35)))
    expected_clipped = np.array([reference_log_pi(row, prior, 21, 27, 7) for row in attn])
    np.testing.assert_allclose(clipped, expected_clipped, rtol=0, atol=1e-9)
    assert not np.allclose(absent - absent.mean(-1, keepdims=True), clipped - clipped.mean(-1, keepdims=True))
    warnings = methods.selection_warnings(attn, methods.LadSettings(**settings, layers_beyond_depth="absent"))
    assert ("30 of 30 rows average in layers 28..35, which the model does not have (attention 0, prior log 1e-20; "
            "layers_beyond_depth = absent, the reference's arithmetic)") in warnings
    assert not any("average in layers" in w for w in methods.selection_warnings(attn, methods.LadSettings(**settings)))


def test_within_the_layers_that_exist_the_absent_ones_change_nothing():
    rng = np.random.default_rng(1)
    attn, prior = rng.uniform(0.01, 0.2, size=(20, 28, 4)), rng.uniform(0.01, 0.2, size=(28, 4))
    for k in (1, 2, 7):
        clipped = methods.LadSettings(top_k=k, layer_range=(21, 35))
        absent = replace(clipped, layers_beyond_depth="absent")
        np.testing.assert_array_equal(methods.purified_attention(attn, prior, absent),
                                      methods.purified_attention(attn, prior, clipped))
        np.testing.assert_array_equal(methods.raw_attention(attn, absent), methods.raw_attention(attn, clipped))


# --- the reference's tie rule -------------------------------------------------------------

def test_argsort_ties_select_what_numpys_argsort_of_the_layer_means_puts_last():
    attn = np.zeros((50, 6, 3))
    rng = np.random.default_rng(2)
    attn[:] = rng.integers(1, 4, size=(50, 6, 1)) / 10.0      # many layers of exactly equal strength
    selected = methods.select_layers(attn, 2, (1, 5), ties="argsort")
    for row, chosen in zip(attn, selected):
        expected = 1 + np.argsort(row[1:6].mean(axis=1))[-2:]   # the reference's call, this numpy's build
        assert sorted(chosen.tolist()) == sorted(expected.tolist())
    warnings = methods.selection_warnings(attn, methods.LadSettings(top_k=2, layer_range=(1, 5), layer_ties="argsort"))
    assert warnings and "numpy's argsort put last was kept (its order among equal values depends on numpy's build)" \
        in warnings[0]


# --- undefined statistics ---------------------------------------------------------------

def test_t_equal_one_and_unseen_positions():
    # 4 instances, N = 4, one ordering; the targets sit at positions 0, 0, 2, 3 (1 never)
    target = np.array([[0], [0], [2], [3]])
    pred = np.array([[0], [1], [2], [1]])
    order = np.tile(np.arange(4), (4, 1, 1))
    undefined = metrics.summarize(pred, target, order, 4, n_boot=50)
    assert undefined["acc_std"] is None and undefined["rstd"] is None
    reference = metrics.summarize(pred, target, order, 4, n_boot=50, edge_statistics="reference")
    # recall per position seen: 50 %, 100 %, 0 % -> sample std 50
    assert reference["acc_std"] == 0.0 and reference["rstd"] == pytest.approx(50.0)
    assert reference["acc_mean"] == undefined["acc_mean"] == 50.0
    assert reference["rstd_ci_low"] is not None and reference["acc_std_ci_high"] == 0.0
    warnings = metrics.edge_statistics_warnings(target, 4, "reference")
    assert warnings == [
        "T = 1 ordering: Acc's std is 0.0 (edge_statistics = reference, the reference's; undefined: null)",
        "position(s) [1] never hold the ground truth: RStd is over the 3 other positions (edge_statistics = "
        "reference, the reference's; undefined: null)"]
    assert metrics.edge_statistics_warnings(target, 4, "undefined") == []
    # T = 2 orderings, the same positions held: only the RStd warning
    assert metrics.edge_statistics_warnings(np.hstack([target, target[::-1]]), 4, "reference") == warnings[1:]
    # one position seen: a std of one value is 0.0
    alone = metrics.summarize(pred[:2], target[:2], order[:2], 4, n_boot=0, edge_statistics="reference")
    assert alone["rstd"] == 0.0


def test_defined_statistics_are_the_same_under_both_rules():
    rng = np.random.default_rng(3)
    for orderings in (2, 5):                                    # T = 2: the fewest with a std of Acc
        target, pred = rng.integers(0, 4, size=(200, orderings)), rng.integers(0, 4, size=(200, orderings))
        order = np.tile(np.arange(4), (200, orderings, 1))
        a = metrics.summarize(pred, target, order, 4, n_boot=200)
        b = metrics.summarize(pred, target, order, 4, n_boot=200, edge_statistics="reference")
        assert a == b and a["acc_std"] > 0


# --- a calibration position without rows ----------------------------------------------------

def test_a_calibration_position_without_rows_is_zero_with_a_warning(tmp_path):
    rng = np.random.default_rng(4)
    scores = rng.normal(size=(3, 3, 3))
    target = np.array([[0, 2, 0], [2, 0, 2], [0, 0, 2]])             # position 1 never
    attn = rng.uniform(size=(3, 3, 2, 3))
    with pytest.raises(ValueError, match=r"position\(s\) \[1\] \(calibration.empty_positions: zero"):
        calibration.fit_calibration(scores, attn, target, n_cal=3, seed=0)
    fitted = calibration.fit_calibration(scores, attn, target, n_cal=3, seed=0, empty_positions="zero")
    assert fitted.L[1].tolist() == [0.0, 0.0, 0.0]
    rows = scores.reshape(-1, 3)[target.ravel() == 0]
    np.testing.assert_allclose(fitted.L[0], rows.mean(axis=0))
    warning = ("no calibration row has its ground truth at position(s) [1]: their row of L is 0 "
               "(calibration.empty_positions = zero, the reference's)")
    assert fitted.warnings == (warning,)
    path = tmp_path / "cal.npz"
    fitted.to_npz(path)
    back = Calibration.from_npz(path)
    assert back.warnings == (warning,) and back.settings["empty_positions"] == "zero"
    arrays = SimpleNamespace(attn=np.zeros((2, 1, 2, 3)), target_pos=np.zeros((2, 1), int),
                             order=np.zeros((2, 1, 3), int), scores=np.zeros((2, 1, 3)))
    recorded = evaluation_warnings(["pride"], arrays, methods.MethodSettings(), Bootstrap(), [back, back])
    assert recorded == [warning]
