"""The reference's Vanilla readout (two greedy tokens, parsed) from the scoring pass:
equal to ``generate`` on the tiny models, decoded and parsed as the reference does."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from conftest_models import FAMILIES, TINY_IMAGE_SIZE, demo_runner, make_demo_benchmark
from ladbench.inference.greedy import _penalised, greedy_reply_texts, repetition_penalty
from ladbench.methods import METHODS, parse_reference_replies


def test_parse_reference_replies_by_hand():
    # the last integer in 1..N of the stripped reply; "10" at N = 4 is out of range -> unparsable
    texts = np.array([["2", "10", "3\n", ""], ["Image 4", "12", "1 or 3", "x"]], dtype=object)
    np.testing.assert_array_equal(parse_reference_replies(texts, 4), [[1, -1, 2, -1], [3, -1, 2, -1]])
    np.testing.assert_array_equal(parse_reference_replies(np.array(["10", "12"], dtype=object), 12), [9, 11])


def test_vanilla_generate_method_counts_unparsable_as_wrong():
    arrays = SimpleNamespace(scores=np.zeros((1, 3, 4)), greedy_text=np.array([["1", "x", "44"]], dtype=object))
    assert METHODS["vanilla_generate"](arrays, None).tolist() == [[0, -1, -1]]
    with pytest.raises(ValueError, match="greedy_text"):
        METHODS["vanilla_generate"](SimpleNamespace(scores=np.zeros((1, 1, 4))), None)


def test_reply_text_stops_at_the_first_stop_token():
    class Tok:  # decodes ids as letters, drops "special" id 0
        def decode(self, ids, skip_special_tokens):
            return "".join(" ab"[i] if i < 3 else "?" for i in ids if not (skip_special_tokens and i == 0))
    assert greedy_reply_texts(Tok(), np.array([[1, 2], [0, 1], [2, 0], [1, 9]]), [0]) == ["ab", "", "b", "a?"]


def test_repetition_penalty_is_transformers_on_logits_of_both_signs():
    """Seen tokens' logits shrink towards 0 whatever their sign: divided where positive, multiplied
    where negative (a seen token twice in a row is penalised once), as transformers' processor does."""
    import torch
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0)) * 4
    seen = torch.tensor([[1, 2, 2, 30], [0, 5, 6, 7], [39, 39, 39, 39]])
    assert (logits.gather(1, seen) < 0).any() and (logits.gather(1, seen) > 0).any()
    for penalty in (1.0, 1.3, 3.0):
        torch.testing.assert_close(_penalised(logits, seen, penalty),
                                   RepetitionPenaltyLogitsProcessor(penalty)(seen, logits.clone()), rtol=0, atol=0)


def test_repetition_penalty_defaults_to_none_where_the_model_states_none():
    assert repetition_penalty(SimpleNamespace(model=SimpleNamespace())) == 1.0
    for stated in (None, 0, 1.0):
        config = SimpleNamespace(repetition_penalty=stated)
        assert repetition_penalty(SimpleNamespace(model=SimpleNamespace(generation_config=config))) == 1.0
    config = SimpleNamespace(repetition_penalty=1.2)
    assert repetition_penalty(SimpleNamespace(model=SimpleNamespace(generation_config=config))) == 1.2


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("penalty", [1.0, 3.0])
def test_greedy_reply_equals_generate_row_by_row(family, penalty, tiny_adapter, tmp_path):
    adapter = tiny_adapter(family)
    runner = demo_runner(adapter, tmp_path, 4)
    config = adapter.model.generation_config
    saved = config.repetition_penalty
    config.repetition_penalty = penalty
    try:
        rows = [0, 3, 5]                                             # left-padded batch (captions differ)
        out = runner.score_batch(rows)
        for b, r in enumerate(rows):                                 # the reference: one row, generate()
            inputs = runner.encode_rows([r])
            generated = adapter.model.generate(**inputs, max_new_tokens=2, do_sample=False, num_beams=1)
            new = generated[0, inputs["input_ids"].shape[1]:].tolist()
            stops = set(adapter.end_token_ids())
            assert out["greedy_tokens"][b, :len(new)].tolist() == new, (r, new)
            assert len(new) == 2 or new[0] in stops
            text = adapter.tokenizer.decode(new, skip_special_tokens=True).strip()
            assert out["greedy_text"][b] == text
    finally:
        config.repetition_penalty = saved


@pytest.mark.slow
def test_reference_protocol_end_to_end_on_the_tiny_model(tiny_model, tmp_path):
    """evaluation_head calibration flows from the benchmark through the cache to the
    calibration and the evaluation output; vanilla_generate is evaluated from the cache."""
    import json

    from ladbench.atomic import signed
    from ladbench.calibration import Calibration
    from ladbench.cli import main
    from ladbench.inference.cache import read_cache

    bench_path, images = make_demo_benchmark(tmp_path, 4, n_eval=3, n_orderings=2, n_cal=2)
    bench = json.loads(bench_path.read_text())
    bench["calibration"] = [{k: v for k, v in inst.items() if k != "orderings"} for inst in bench["eval"][:2]]
    bench["calibration_source"] = "evaluation_head"
    bench_path.write_text(json.dumps(signed(bench)))            # edited: signed again
    cache, cal, out = tmp_path / "c.h5", tmp_path / "cal.npz", tmp_path / "eval.json"
    main(["infer", "--benchmark", str(bench_path), "--images", str(images), "--out", str(cache), "--model-name",
          "tiny", "--family", "qwen2_5_vl", "--model-path", tiny_model("qwen2_5_vl"), "--device", "cpu",
          "--image-size", str(TINY_IMAGE_SIZE)])
    assert read_cache(str(cache)).attrs["calibration_source"] == "evaluation_head"
    main(["calibrate", "--cache", str(cache), "--n-cal", "1", "--seed", "5", "--out", str(cal)])
    fitted = Calibration.from_npz(cal)
    assert fitted.instances.tolist() == [0] and fitted.settings["source"] == "evaluation_head"
    main(["evaluate", "--cache", str(cache), "--calibration", str(cal), "--layer-range", "all",
          "--methods", "vanilla", "vanilla_generate", "lad", "--bootstrap", "50", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["calibration_source"] == "evaluation_head" and result["settings"]["acc_ddof"] == 1
    generated = result["methods"]["vanilla_generate"]
    texts = read_cache(str(cache))["greedy_text"][:6]
    parsed = parse_reference_replies(np.array(texts, dtype=object), 4)
    assert generated["parse_success"] == pytest.approx(100.0 * (parsed >= 0).mean())
    assert isinstance(result["warnings"], list)
