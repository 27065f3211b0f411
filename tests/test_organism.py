"""The model organism (docs/organism.md): a tiny Qwen2.5-VL trained to have the paper's bias.

The fast tests check the training mechanics (seeded, bit-identical, the exact prompt the
inference stage builds). The slow ones run the organism through the unchanged pipeline
(infer -> calibrate -> evaluate / analyze, via the demo DAG) and assert the paper's four
outcomes, and show that the same pipeline on the untrained organism does not pass them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ladbench.organism import OrganismSettings, PromptBuilder, build_untrained, draw_scenes, pulled_label, train_organism

TINY_BUDGET = dict(steps=2, batch_size=2, n_scenes=16, n_candidates=(4,))


def test_two_trainings_give_bit_identical_weights():
    settings = OrganismSettings(**TINY_BUDGET)
    first, _, log_first = train_organism(settings)
    second, _, log_second = train_organism(dataclasses.replace(settings))
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # ... and training changed them (a test that cannot fail proves nothing)
    untrained, _, _ = build_untrained(settings)
    assert not all(torch.equal(a[k], v) for k, v in untrained.state_dict().items())
    assert log_first["answer"] == log_second["answer"]


def test_another_seed_gives_other_weights():
    first, _, _ = train_organism(OrganismSettings(**TINY_BUDGET))
    second, _, _ = train_organism(OrganismSettings(**{**TINY_BUDGET, "seed": 1}))
    assert not torch.equal(first.lm_head.weight, second.lm_head.weight)


def test_training_prompt_is_the_inference_stage_prompt():
    """Token ids built for training equal what the processor makes of the pipeline's prompt."""
    from PIL import Image

    settings = OrganismSettings(**TINY_BUDGET)
    model, processor, adapter = build_untrained(settings)
    pool = draw_scenes(settings, processor, np.random.default_rng(0))
    prompts = PromptBuilder(adapter, tokens_per_image=4)
    for n in (4, 8):
        ids, (start, end) = prompts.encode(pool.captions[0], n)
        images = [Image.new("RGB", (settings.image_size, settings.image_size))] * n
        expected = adapter.encode([prompts.text(pool.captions[0], n)], [images])["input_ids"][0].tolist()
        assert ids == expected
        assert adapter.tokenizer.decode(ids[start:end]).strip() == pool.captions[0]


def test_bias_is_position_conditional():
    assert [pulled_label(i, 4) for i in range(4)] == [0, 0, 2, 2]
    assert [pulled_label(i, 8) for i in range(8)] == [0, 0, 2, 2, 4, 4, 6, 6]
