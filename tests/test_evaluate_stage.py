"""Stage `evaluate` end to end on a small cache written with the project's cache writer."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ladbench.cli import main
from ladbench.inference.cache import CacheLayout, CacheWriter, plan_rows

N, LAYERS = 4, 2


def write_cache(path, bench: dict) -> None:
    plan = plan_rows(bench)
    rows = len(plan)
    writer = CacheWriter.open(str(path), plan, CacheLayout(N, LAYERS, n_heads=2),
                              {"config_sha256": "t", "model": "toy", "variant": "vanilla", "n_candidates": N,
                               "n_layers": LAYERS})
    scores = np.tile(np.arange(N, dtype=np.float32)[::-1], (rows, 1))  # always picks position 0
    writer.write(np.arange(rows), {"scores": scores, "attn": np.full((rows, LAYERS, N), 0.2, np.float32),
                                   "attn_text": np.full((rows, LAYERS), 0.2, np.float32)})
    writer.finish({"rows_per_s": 1.0})


def target_at_position_zero_cache(tmp_path):
    """A cache of 3 instances under one ordering, the target always at position 0."""
    bench = {"n_candidates": N, "n_orderings": 1, "calibration": [],
             "eval": [{"id": i, "caption": "c", "target": 10 * i, "candidates": [10 * i + k for k in range(N)],
                       "orderings": [list(range(N))]} for i in range(3)]}
    cache = tmp_path / "vanilla.h5"
    write_cache(cache, bench)
    return cache


def test_undefined_metrics_are_written_as_null_and_printed_as_a_dash(tmp_path, capsys):
    # The target always sits at position 0 under the single ordering: the recall of positions
    # 1-3 is undefined, so RStd is too. The stage must still finish and say so.
    cache = target_at_position_zero_cache(tmp_path)
    out = tmp_path / "eval.json"
    main(["evaluate", "--cache", str(cache), "--methods", "vanilla", "--bootstrap", "20", "--out", str(out)])
    record = json.loads(out.read_text())
    result = record["methods"]["vanilla"]
    assert result["acc_mean"] == pytest.approx(100.0) and result["rstd"] is None
    assert "RStd –" in capsys.readouterr().out
    assert (record["n_instances"], record["n_orderings"], record["n_candidates"]) == (3, 1, N)   # what it was computed over
    with np.load(out.with_suffix(".npz")) as predictions:
        assert predictions["pred_vanilla"].tolist() == [[0], [0], [0]]


def test_the_reference_edge_statistics_are_numbers_recorded_with_warnings(tmp_path):
    # The same set read as the reference reads it: std 0.0 at T = 1, RStd over the one position seen.
    cache = target_at_position_zero_cache(tmp_path)
    out = tmp_path / "eval.json"
    main(["evaluate", "--cache", str(cache), "--methods", "vanilla", "--bootstrap", "20", "--edge-statistics",
          "reference", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["methods"]["vanilla"]["acc_std"] == 0.0 and result["methods"]["vanilla"]["rstd"] == 0.0
    assert result["settings"]["edge_statistics"] == "reference"
    assert [w.split(":")[0] for w in result["warnings"]] == ["T = 1 ordering", "position(s) [1, 2, 3] never hold the ground truth"]


def test_the_printed_summary_line_shows_undefined_metrics_as_a_dash():
    from ladbench.evaluation import metrics_line
    line = metrics_line("lad", {"acc_mean": 51.7, "acc_std": 1.38, "rstd": None, "cons": 6.61, "extra": 1})
    assert line == "                 lad: Acc 51.70 ± 1.38  RStd –  Cons 6.61"


def test_configured_methods_apply_to_the_vanilla_prompt_only():
    """evaluation.methods chooses among the readouts of the one scoring pass (the vanilla prompt's
    cache); a cache of another prompt variant keeps its variant's own methods."""
    from ladbench.evaluation import default_methods
    from ladbench.variants import variant
    assert default_methods("vanilla", ["lad", "vanilla"]) == ["lad", "vanilla"]
    assert default_methods("vanilla") == list(variant("vanilla").methods) == ["vanilla", "pride", "lad"]
    assert default_methods("cot", ["lad", "vanilla"]) == list(variant("cot").methods) == ["generated"]


def test_a_cache_of_cyclic_shifts_is_read_by_the_shift_readers_only_and_scored_at_shift_0():
    from ladbench.arrays import EvalArrays
    from ladbench.evaluation import check_shifts, unshifted
    check_shifts("p.h5", ["permutation_average"], shifted=True)
    check_shifts("p.h5", ["vanilla", "lad"], shifted=False)
    with pytest.raises(ValueError, match=r"p\.h5: .*\['permutation_average'\] only, not \['vanilla'\]"):
        check_shifts("p.h5", ["permutation_average", "vanilla"], shifted=True)
    shifts = np.arange(2 * 1 * N * N).reshape(2, 1, N, N)                      # [I, T, N(shift), N]
    arrays = unshifted(EvalArrays(scores=shifts, attn=None, target_pos=shifts[..., 0], order=shifts))
    assert arrays.scores.tolist() == shifts[:, :, 0].tolist() and arrays.attn is None
    assert arrays.target_pos.tolist() == shifts[:, :, 0, 0].tolist()


def test_methods_that_need_a_calibration_are_refused_without_one():
    from ladbench.evaluation import predict_all
    from ladbench.methods import MethodSettings
    with pytest.raises(ValueError, match=r"methods \['lad', 'pride'\] need --calibration"):
        predict_all(["vanilla", "pride", "lad"], None, None, MethodSettings())
