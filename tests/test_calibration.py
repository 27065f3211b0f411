"""Calibration (METHOD.md §4): hand-computed examples and properties."""

import numpy as np
import pytest

from ladbench.calibration import (
    Calibration,
    attention_prior,
    bias_matrix,
    draw_calibration_instances,
    fit_calibration,
    log_softmax,
    pride_prior_original,
    pride_prior_reference,
    score_matrix,
)

# Two calibration instances, N = 2, each under its two cyclic shifts.
# Instance 0: shift 0 has the target at position 0, shift 1 at position 1; instance 1 the reverse.
CAL_SCORES = np.array([[[2.0, 0.0], [1.0, 3.0]], [[0.0, 4.0], [4.0, 2.0]]])
CAL_TARGET = np.array([[0, 1], [1, 0]])


def test_draw_is_sorted_distinct_seeded_and_checked():
    draw = draw_calibration_instances(100, 5, seed=3)
    assert draw.shape == (5,) and np.all(np.diff(draw) > 0) and draw.min() >= 0 and draw.max() < 100
    assert np.array_equal(draw, draw_calibration_instances(100, 5, seed=3))
    assert not np.array_equal(draw, draw_calibration_instances(100, 5, seed=4))
    assert np.array_equal(draw_calibration_instances(7, 7, seed=0), np.arange(7))
    with pytest.raises(ValueError, match="only 4"):
        draw_calibration_instances(4, 5, seed=0)


def test_score_matrix_reference_averages_raw_scores_by_target_position():
    # Rows with the target at 0: [2, 0] and [4, 2]; at 1: [1, 3] and [0, 4].
    L = score_matrix(CAL_SCORES, CAL_TARGET, "reference")
    np.testing.assert_allclose(L, [[3.0, 1.0], [0.5, 3.5]])
    # one row at each position: the rows themselves
    np.testing.assert_allclose(score_matrix(CAL_SCORES[:1], CAL_TARGET[:1], "reference"), [[2.0, 0.0], [1.0, 3.0]])


def test_score_matrix_paper_averages_probabilities_then_logs():
    # softmax([2, 0]) = softmax([4, 2]) = [0.880797, 0.119203]  -> row 0 = log of that.
    # softmax([1, 3]) = [0.119203, 0.880797], softmax([0, 4]) = [0.017986, 0.982014]
    #   mean = [0.068595, 0.931405] -> log = [-2.679542, -0.071061].
    L = score_matrix(CAL_SCORES, CAL_TARGET, "paper")
    np.testing.assert_allclose(L, [[-0.126928, -2.126928], [-2.679542, -0.071061]], atol=1e-6)


def test_score_matrix_rejects_a_position_without_rows_and_bad_names():
    with pytest.raises(ValueError, match=r"position\(s\) \[1\]"):
        score_matrix(CAL_SCORES, np.zeros_like(CAL_TARGET), "reference")
    with pytest.raises(ValueError, match="'reference' or 'paper'"):
        score_matrix(CAL_SCORES, CAL_TARGET, "median")


@pytest.mark.parametrize("scores, target, message", [
    (CAL_SCORES[:, :, :1], CAL_TARGET, r"must be \[C, N\(shift\), N\(position\)\]"),   # [C, N, N'] with N' != N
    (CAL_SCORES[0], CAL_TARGET, r"must be \[C, N\(shift\), N\(position\)\]"),          # not [C, N, N]
    (CAL_SCORES, CAL_TARGET[:1], "does not match"),
    (CAL_SCORES, CAL_TARGET + 1, r"outside 0\.\.1"),                                  # position N
    (CAL_SCORES, CAL_TARGET - 1, r"outside 0\.\.1"),                                  # position -1
])
def test_malformed_calibration_inputs_are_refused(scores, target, message):
    with pytest.raises(ValueError, match=message):
        score_matrix(scores, target, "reference")
    if message.startswith("must"):
        with pytest.raises(ValueError, match=message):
            pride_prior_original(scores)                           # the label-free estimate checks its scores too


@pytest.mark.parametrize("L", [np.zeros((2, 3)), np.zeros(2), np.zeros((1, 1))])
def test_bias_matrix_refuses_what_is_not_a_square_matrix_of_two_positions_or_more(L):
    with pytest.raises(ValueError, match="square"):
        bias_matrix(L)


def test_log_softmax_is_stable_at_large_scores():
    np.testing.assert_allclose(log_softmax(np.array([1000.0, 1000.0 - np.log(3.0)])), np.log([0.75, 0.25]))


def test_bias_matrix_hand_examples():
    # L = [[3, 1], [0.5, 3.5]]: gaps 3-1 = 2 and 3.5-0.5 = 3, so k = 3; B = L - 3 I.
    B, k = bias_matrix(np.array([[3.0, 1.0], [0.5, 3.5]]))
    assert k == 3.0
    np.testing.assert_allclose(B, [[0.0, 1.0], [0.5, 0.5]])
    # N = 3: gaps row 0: 4, 3; row 1: 4, 3; row 2: 2, 2 -> k = 4.
    B, k = bias_matrix(np.array([[5.0, 1, 2], [0, 4, 1], [1, 1, 3]]))
    assert k == 4.0
    np.testing.assert_allclose(B, [[1, 1, 2], [0, 0, 1], [1, 1, -1]])


def test_bias_matrix_recovers_a_planted_gain_and_bias():
    # L = bias + gain * I. k = gain + max_{i, j != i} (bias[i, i] - bias[i, j]) = gain exactly
    # when no off-diagonal bias is below its row's diagonal and one equals it (row 2, column 1).
    bias = np.array([[0.0, 1.5, 0.2], [0.3, 0.0, 2.0], [1.0, 0.0, 0.0]])
    B, k = bias_matrix(bias + 2.5 * np.eye(3))
    assert k == pytest.approx(2.5)
    np.testing.assert_allclose(B, bias)


def test_attention_prior_is_the_mean_over_every_calibration_row():
    cal_attn = np.zeros((2, 2, 3, 2))  # [C, shift, Lyr, N]
    cal_attn[0, 0] = 1.0
    cal_attn[1, 1, 2] = [4.0, 8.0]
    prior = attention_prior(cal_attn)
    expected = np.full((3, 2), 0.25)
    expected[2] += [1.0, 2.0]
    np.testing.assert_allclose(prior, expected)


def test_pride_prior_reference_is_the_column_mean_of_B():
    np.testing.assert_allclose(pride_prior_reference(np.array([[0.0, 1.0], [0.5, 0.5]])), [0.25, 0.75])


def test_pride_prior_original_hand_example():
    # Instance 0: probabilities [0.8, 0.2] (shift 0) and [0.6, 0.4] (shift 1):
    #   geometric means sqrt(0.48) = 0.692820, sqrt(0.08) = 0.282843 -> normalised [0.710102, 0.289898].
    # Instance 1: [0.5, 0.5] under both shifts -> [0.5, 0.5]. Average: [0.605051, 0.394949].
    scores = np.log(np.array([[[0.8, 0.2], [0.6, 0.4]], [[0.5, 0.5], [0.5, 0.5]]]))
    scores = scores + np.array([1.0, -2.0, 0.5, 3.0]).reshape(2, 2, 1)  # per-row constants: no effect
    prior = pride_prior_original(scores, CAL_TARGET)
    np.testing.assert_allclose(np.exp(prior), [0.605051, 0.394949], atol=1e-6)
    # label-free: the target positions do not enter
    np.testing.assert_allclose(pride_prior_original(scores, 1 - CAL_TARGET), prior)
    np.testing.assert_allclose(pride_prior_original(scores), prior)


def test_pride_priors_recover_a_static_bias_exactly():
    # Scores = content of the identity shown + b[position]; every identity visits every position.
    rng = np.random.default_rng(0)
    n, c = 4, 3
    b = np.array([1.0, -0.5, 0.0, 2.0])
    content = rng.normal(size=(c, n))
    shifts = (np.arange(n)[None, :] + np.arange(n)[:, None]) % n  # shift s shows identity (p+s)%N at p
    scores = content[:, shifts] + b
    target = (0 - np.arange(n)) % n  # identity 0 is the target
    target = np.tile(target, (c, 1))
    original = pride_prior_original(scores, target)
    np.testing.assert_allclose(original - original.mean(), b - b.mean(), atol=1e-12)


def test_fit_calibration_uses_only_the_drawn_instances_and_round_trips(tmp_path):
    rng = np.random.default_rng(1)
    c, n, lyr = 12, 4, 3
    scores = rng.normal(size=(c, n, n))
    attn = rng.random(size=(c, n, lyr, n))
    target = np.tile((2 - np.arange(n)) % n, (c, 1))
    cal = fit_calibration(scores, attn, target, n_cal=5, seed=7)
    assert np.array_equal(cal.instances, draw_calibration_instances(c, 5, 7))
    np.testing.assert_allclose(cal.L, score_matrix(scores[cal.instances], target[cal.instances]))
    np.testing.assert_allclose(cal.attn_prior, attn[cal.instances].mean(axis=(0, 1)))
    np.testing.assert_allclose(cal.pride_prior, cal.B.mean(axis=0))
    # Instances outside the draw do not matter.
    others = np.setdiff1d(np.arange(c), cal.instances)
    scores2, attn2 = scores.copy(), attn.copy()
    scores2[others] += 100.0
    attn2[others] *= 5.0
    cal2 = fit_calibration(scores2, attn2, target, n_cal=5, seed=7)
    np.testing.assert_allclose(cal2.B, cal.B)
    np.testing.assert_allclose(cal2.attn_prior, cal.attn_prior)

    path = tmp_path / "cal" / "dcal5_seed7.npz"
    cal.to_npz(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["dcal5_seed7.npz"]  # no temporary left
    with np.load(path) as data:
        for name in ("instances", "L", "B", "k", "attn_prior", "pride_prior", "pride_original_prior"):
            assert name in data.files
    back = Calibration.from_npz(path)
    for name in ("instances", "L", "B", "attn_prior", "pride_prior", "pride_original_prior"):
        np.testing.assert_array_equal(getattr(back, name), getattr(cal, name))
    assert back.k == cal.k and back.settings == cal.settings
    assert back.settings == {"n_cal": 5, "seed": 7, "average": "reference", "n_pool": 12, "source": "pool",
                            "pride_original_logs": "floor", "empty_positions": "error"}


def test_from_npz_names_the_missing_array(tmp_path):
    from ladbench.atomic import write_signed_npz
    path = tmp_path / "bad.npz"
    write_signed_npz(path, {"L": np.eye(2)})
    with pytest.raises(ValueError, match="bad.npz.*'B'"):
        Calibration.from_npz(path)


def _calibration(tmp_path):
    rng = np.random.default_rng(0)
    scores, attn = rng.normal(size=(12, 4, 4)), rng.random((12, 4, 3, 4))
    path = tmp_path / "c.npz"
    fit_calibration(scores, attn, np.tile((2 - np.arange(4)) % 4, (12, 1)), n_cal=5, seed=7).to_npz(path)
    return path


@pytest.mark.parametrize("edit", ["zero B", "strip the digest"])
def test_an_edited_calibration_is_refused_in_one_line(tmp_path, edit):
    """The issue's attack: loaded with numpy, B set to 0, saved with np.savez (its CRC-32s
    recomputed): PriDe moved silently. Stripping the digest member does not pass either."""
    path = _calibration(tmp_path)
    Calibration.from_npz(path)
    with np.load(path) as data:
        arrays = dict(data)
    if edit == "zero B":
        arrays["B"] = np.zeros_like(arrays["B"])
    else:
        del arrays["content_sha256"]
    np.savez(path, **arrays)
    with pytest.raises(ValueError) as error:
        Calibration.from_npz(path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}: calibration file: ")
    assert ("changed since it was written" if edit == "zero B" else "has no content_sha256") in message
    assert "`ladbench calibrate`" in message


def test_fit_calibration_checks_shapes():
    with pytest.raises(ValueError, match="cal_attn shape"):
        fit_calibration(np.zeros((3, 2, 2)), np.zeros((3, 2, 4, 3)), np.tile([0, 1], (3, 1)), 2, 0)


def test_evaluation_head_takes_the_first_instances_whatever_the_seed():
    assert draw_calibration_instances(12, 5, 0, "evaluation_head").tolist() == [0, 1, 2, 3, 4]
    assert draw_calibration_instances(12, 5, 9, "evaluation_head").tolist() == [0, 1, 2, 3, 4]
    assert draw_calibration_instances(12, 5, 0).tolist() != [0, 1, 2, 3, 4] or \
        draw_calibration_instances(12, 5, 1).tolist() != [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="'pool' or 'evaluation_head'"):
        draw_calibration_instances(12, 5, 0, "test_set")


def test_pride_original_log_floor_by_hand():
    # One calibration instance, N = 2, both shifts put probability 1e-14 on position 1.
    p_small = 1e-14
    scores = np.log(np.array([[[1 - p_small, p_small], [1 - p_small, p_small]]]))
    # exact: prior = softmax(mean_s log p) = [1 - 1e-14, 1e-14] -> log 1e-14 = -32.236
    exact = pride_prior_original(scores, logs="exact")
    np.testing.assert_allclose(exact, [np.log1p(-p_small), np.log(p_small)], atol=1e-12)
    # floor: log(1e-14 + 1e-10) = log(1.0001e-10); the prior's second entry is ~1.0001e-10 and
    # log(prior + 1e-10) = log(2.0001e-10) = -22.333
    floor = pride_prior_original(scores)
    np.testing.assert_allclose(floor[1], np.log(1.0001e-10 / (1 + 1.0001e-10) + 1e-10), rtol=1e-9)
    assert floor[1] == pytest.approx(-22.3327, abs=1e-4)
    # A test row with p = 1e-12 on position 1: exact logs move the answer there
    # (-27.63 + 32.24 > 0), the floor keeps position 0 (log(1.01e-10) + 22.33 = -0.68 < 0).
    from types import SimpleNamespace
    from ladbench.methods import METHODS
    test = SimpleNamespace(scores=np.log(np.array([[[1 - 1e-12, 1e-12]]])))
    for logs, expected in (("exact", 1), ("floor", 0)):
        cal = SimpleNamespace(B=np.zeros((2, 2)), pride_original_prior=pride_prior_original(scores, logs=logs),
                              settings={"pride_original_logs": logs})
        assert METHODS["pride_original"](test, cal).tolist() == [[expected]]
