"""Batched generation (CoT, self-consistency): greedy replies at batch B equal batch 1; SC's
samples do not depend on the batch size, the chunks or shards (keyed sampling); each sequence stops
at its own end token; the keyed sampler draws from softmax(top-k(logits) / T); generated
tokens per second are recorded."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from conftest_models import TINY_IMAGE_SIZE, make_demo_benchmark, make_images
from ladbench.inference.cache import read_cache
from ladbench.inference.merge import merge_shards
from ladbench.inference.sampling import KeyedSampler, sequence_keys


def infer(model, bench, images, out, *extra):
    from ladbench.cli import main
    main(["infer", "--benchmark", str(bench), "--images", str(images), "--out", str(out), "--model-name", "tiny",
          "--family", "qwen2_5_vl", "--model-path", model, "--device", "cpu", "--image-size", str(TINY_IMAGE_SIZE),
          "--chunk-size", "4", *map(str, extra)])
    return read_cache(str(out))


@pytest.fixture(scope="module")
def setup(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("generation")
    bench, images = make_demo_benchmark(folder, 4, n_eval=3, n_orderings=2, n_cal=1)   # 10 rows, two caption lengths
    return tiny_model("qwen2_5_vl"), bench, images, folder


@pytest.mark.slow
def test_greedy_cot_at_batch_b_equals_batch_1(setup):
    model, bench, images, folder = setup
    one = infer(model, bench, images, folder / "cot1.h5", "--prompt", "cot", "--cot-max-new-tokens", 12)
    many = infer(model, bench, images, folder / "cot4.h5", "--prompt", "cot", "--cot-max-new-tokens", 12,
                 "--batch-size", 4)
    assert (one["text"] == many["text"]).all() and (one["parsed"] == many["parsed"]).all()
    assert (one["n_generated"] == many["n_generated"]).all() and (one["n_generated"] >= 1).all()
    assert (one["n_generated"] <= 12).all()
    with h5py.File(folder / "cot4.h5", "r", locking=False) as f:     # one reply a row: no samples' answers
        assert {"text", "parsed", "n_generated"} <= set(f) and "sample_parsed" not in f
    attrs = many.attrs
    assert attrs["generated_tokens"] == int(many["n_generated"].sum())
    assert attrs["generated_tokens_per_s"] == pytest.approx(attrs["generated_tokens"] / attrs["timed_s"])


@pytest.mark.slow
def test_self_consistency_samples_do_not_depend_on_batch_size_or_shards(setup):
    model, bench, images, folder = setup
    sc = ("--prompt", "sc", "--sc-samples", 3, "--sc-max-new-tokens", 6, "--seed", 7)
    one = infer(model, bench, images, folder / "sc1.h5", *sc)
    many = infer(model, bench, images, folder / "sc4.h5", *sc, "--batch-size", 4)     # 3 chunks, one decode loop
    whole = infer(model, bench, images, folder / "sc4-whole.h5", *sc, "--batch-size", 4, "--chunk-size", 10)
    assert one["text"].shape == (10, 3)
    for other in (many, whole):
        assert (one["text"] == other["text"]).all() and (one["sample_parsed"] == other["sample_parsed"]).all()
        assert (one["n_generated"] == other["n_generated"]).all()
    # samples of one row differ from each other (they are draws, not copies)
    assert any(len(set(row)) > 1 for row in one["text"])
    shards = [folder / f"sc-shard{i}.h5" for i in range(2)]
    for i, path in enumerate(shards):
        infer(model, bench, images, path, *sc, "--batch-size", 3, "--shard-index", i, "--shard-count", 2)
    merge_shards([str(p) for p in shards], str(folder / "sc-merged.h5"))
    merged = read_cache(str(folder / "sc-merged.h5"))
    assert (merged["text"] == one["text"]).all() and merged.attrs["config_sha256"] == one.attrs["config_sha256"]
    # the merged file is checked as a cache the stage wrote: the digest of every dataset (the replies
    # included, as fixed-length texts), per-chunk checksums
    digests = [json.loads(cache.attrs["content_sha256"])["datasets"] for cache in (merged, one)]
    assert digests[0]["text"] == digests[1]["text"] and digests[0]["sample_parsed"] == digests[1]["sample_parsed"]
    with h5py.File(folder / "sc-merged.h5", "r", locking=False) as f:
        assert all(f[key].fletcher32 for key in ("sample_parsed", "n_generated", "done", "text"))
    other_seed = infer(model, bench, images, folder / "sc-seed8.h5", *sc[:-1], 8)
    assert (other_seed["text"] != one["text"]).any()


def test_each_sequence_stops_at_its_own_end_token(tiny_adapter):
    adapter = tiny_adapter("qwen2_5_vl")
    end = adapter.end_of_turn_id
    texts = [adapter.chat_text("a short one", 2), adapter.chat_text("a longer prompt with more words in it", 2)]
    inputs = adapter.encode(texts, [make_images(2), make_images(2, offset=2)])
    prompt_length = inputs["input_ids"].shape[1]

    def end_first_row_at_step_2(input_ids, scores):       # row 0 ends after 3 tokens, row 1 never
        scores = scores.clone()
        scores[:, end] = float("-inf")
        if input_ids.shape[1] - prompt_length == 2:
            scores[0] = float("-inf")
            scores[0, end] = 0.0
        return scores

    replies, counts = adapter.generate(inputs, max_new_tokens=6, do_sample=False,
                                       logits_processor=[end_first_row_at_step_2])
    assert counts.tolist() == [3, 6]
    assert len(adapter.tokenizer(replies[0], add_special_tokens=False).input_ids) <= 2 < len(
        adapter.tokenizer(replies[1], add_special_tokens=False).input_ids)


def test_keyed_sampler_draws_from_the_tempered_top_k_distribution():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    temperature, top_k, n = 0.7, 4, 20000
    keys = sequence_keys(seed=3, rows=torch.arange(n), n_samples=1)
    sampler = KeyedSampler(keys, prompt_length=0, temperature=temperature, top_k=top_k)
    out = sampler(torch.zeros(n, 5, dtype=torch.long), logits.repeat(n, 1))
    assert (torch.isfinite(out).sum(-1) == 1).all()
    drawn = out.argmax(-1)
    expected = torch.softmax(logits[:top_k] / temperature, 0).numpy()
    frequency = np.bincount(drawn.numpy(), minlength=6) / n
    assert frequency[top_k:].sum() == 0
    np.testing.assert_allclose(frequency[:top_k], expected, atol=4 * np.sqrt(expected * (1 - expected) / n).max())
    # a sequence's draw depends on its key and step only, not on the rest of its batch
    alone = KeyedSampler(keys[5:6], 0, temperature, top_k)(torch.zeros(1, 5, dtype=torch.long), logits[None])
    assert alone.argmax(-1).item() == drawn[5].item()
    later = sampler(torch.zeros(n, 6, dtype=torch.long), logits.repeat(n, 1)).argmax(-1)
    assert (later != drawn).any()                          # another step, other draws


def test_sequence_keys_are_distinct_per_row_and_sample():
    keys = sequence_keys(0, torch.tensor([4, 5, 6]), 3)
    assert len(set(keys.tolist())) == 9
    assert keys[3:6].tolist() == sequence_keys(0, torch.tensor([5]), 3).tolist()


@pytest.mark.slow
def test_a_generative_jobs_progress_lines_say_its_tokens_and_its_kv_stores_memory(setup, capsys):
    """Beside rows done, rows/s and time left, a CoT job's progress line (stderr, a line each:
    not a terminal) gives the tokens generated so far and the memory the decode loop's KV store
    holds, which a long job keeps bounded (docs/method.md)."""
    model, bench, images, folder = setup
    cache = infer(model, bench, images, folder / "cot-progress.h5", "--prompt", "cot", "--cot-max-new-tokens", 6,
                  "--batch-size", 2)
    lines = [line for line in capsys.readouterr().err.split("\n") if line.startswith("infer tiny/cot")]
    last = lines[-1]
    assert "10/10" in last and "row/s" in last, last
    assert f"{int(cache['n_generated'].sum()):,} tokens generated, KV store " in last and "MiB" in last, last
