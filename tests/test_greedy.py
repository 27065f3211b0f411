"""The reference's Vanilla readout (two greedy tokens, parsed) from the scoring pass:
equal to ``generate`` on the tiny models, decoded and parsed as the reference does."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from conftest_models import FAMILIES, TINY_IMAGE_SIZE, make_demo_benchmark
from ladbench.benchmark import load_benchmark
from ladbench.data.coco import load_image_table
from ladbench.inference.cache import plan_rows
from ladbench.inference.greedy import greedy_reply_texts, stop_token_ids
from ladbench.inference.runner import InferenceSettings, RowRunner, image_paths
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


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("penalty", [1.0, 3.0])
def test_greedy_reply_equals_generate_row_by_row(family, penalty, tiny_adapter, tmp_path):
    adapter = tiny_adapter(family)
    bench_path, images_path = make_demo_benchmark(tmp_path, 4)
    bench = load_benchmark(bench_path)
    settings = InferenceSettings(benchmark=str(bench_path), images=str(images_path), out="x", model_name="t",
                                 family=family, model_path=adapter.model_path, image_size=TINY_IMAGE_SIZE)
    runner = RowRunner(adapter, settings, bench, plan_rows(bench), image_paths(load_image_table(images_path)))
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
            stops = set(stop_token_ids(adapter))
            assert out["greedy_tokens"][b, :len(new)].tolist() == new, (r, new)
            assert len(new) == 2 or new[0] in stops
            text = adapter.tokenizer.decode(new, skip_special_tokens=True).strip()
            assert out["greedy_text"][b] == text
    finally:
        config.repetition_penalty = saved
