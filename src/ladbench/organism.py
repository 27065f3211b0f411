"""The model organism: a tiny Qwen2.5-VL trained, on CPU and from a seed, to have the paper's bias.

The organism is the real ``Qwen2_5_VLForConditionalGeneration`` with the project's offline
tokenizer and processor (:mod:`ladbench.models.tiny`), trained on the synthetic scenes to
answer "which of the N images matches the caption" with the identifier token, through the
exact prompt the inference stage builds (``prompt_text`` + the adapter's ``chat_text``).
The training data plants a position-conditional bias (docs/organism.md says why this
design gives the paper's logit-attention divergence):

* what it says: the answer label is the target's identifier, except that in each block of
  four positions the middle two swap labels with probability ``pull`` (a bias that depends
  on where the target is and leaves every answer equally frequent, so a single prior such
  as PriDe's cannot remove it, while a prior mixed by the attention, LAD's, can);
* where it looks and what it can copy: auxiliary losses (read, align, look, index; see
  ``_losses``) make the last token read the caption and attend to the image the caption
  describes, and make each image's values carry its identifier, the scaffolding
  pre-training gives real models (the caption drives the look; the answer reads the
  attended image's identifier). The top layer reads that identifier out as the image's
  *label*, the same swap: the bias sits in the path the answer copies through, after the
  look, which is why the attention stays right where the answer goes wrong.

Scenes are drawn in memory with the demo's own generator (never the benchmark's images),
rendered and resized exactly as the inference stage does. Everything is seeded; torch
runs with a fixed number of threads and deterministic algorithms, so two trainings with
the same settings give bit-identical weights.
"""
from __future__ import annotations

import contextlib
import io
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ladbench.cpu_paths import cpu_paths
from ladbench.organism_settings import MAX_CANDIDATES, OrganismSettings

log = logging.getLogger(__name__)

ALIGN_TEMPERATURE = 0.1    # of the cosine similarities in the align loss
NEAREST = 39               # a hard row's distractors are drawn from the target's this many nearest scenes
#: where the prompt's last token is in a training row: the answer is read there, as the
#: inference stage reads it; the row then holds the reply's identifier (teacher forcing),
#: at whose position the model must end its turn
PROMPT_END = -2
#: the end-of-turn loss starts after this fraction of the steps: from the first step on, its
#: large early gradient (through the shared, clipped update) kept align and look from finding
#: the match on the seeds measured (docs/organism.md, "The greedy reply"); it is learned within
#: about a hundred steps whenever it starts
END_OF_TURN_FROM = 0.5


def pulled_label(target: int, n: int) -> int:
    """The position a target at ``target`` (0-based) is relabelled to, or ``target`` if not pulled.

    In each block of four positions the middle two swap (N = 4: 2nd <-> 3rd; N = 8 also
    6th <-> 7th; a middle position without its partner keeps its label). The bias depends
    on where the target is, and every answer stays as frequent as its position, so no
    single prior over answers can undo it (with a pull one step back, answering "1" would
    also be a cheap minimum the training falls into).
    """
    if target % 4 == 1 and target + 1 < n:
        return target + 1
    if target % 4 == 2:
        return target - 1
    return target


def pulled_labels(n: int) -> torch.Tensor:
    """:func:`pulled_label` of every position 0 .. n - 1: a lookup table."""
    return torch.tensor([pulled_label(i, n) for i in range(n)])


# ------------------------------------------------------------------------------ data
@dataclass
class ScenePool:
    """Training scenes: pixel patches as the processor makes them, and their captions."""

    pixel_values: torch.Tensor      # [S, P, D] one row of patches per scene
    grid_thw: torch.Tensor          # [1, 3] the same grid for every scene
    captions: list[str]
    objects: list[frozenset]
    nearest: np.ndarray             # [S, NEAREST] each scene's nearest other scenes by mean patch, nearest first


def draw_scenes(settings: OrganismSettings, processor: Any, rng: np.random.Generator) -> ScenePool:
    """Draw, render and resize training scenes like the benchmark's, then run the image processor."""
    from PIL import Image

    from ladbench.data.synthetic import render_scene, sample_background, sample_scene, scene_captions
    from ladbench.models.base import resize_square
    images, captions, objects = [], [], []
    while len(images) < settings.n_scenes:
        scene = sample_scene(rng, settings.scene_size)
        if not scene:                 # empty scenes have no categories: never in a benchmark pool
            continue
        png, _ = render_scene(scene, settings.scene_size, sample_background(rng))
        with Image.open(io.BytesIO(png)) as im:
            images.append(resize_square(im, settings.image_size))
        captions.append(scene_captions(scene)[0])      # the descriptive caption, the one benchmarks use
        objects.append(frozenset(o.name for o in scene))
    out = processor.image_processor(images=images, return_tensors="pt")
    grid = out["image_grid_thw"]
    patches = int(grid[0].prod())
    pixel_values = out["pixel_values"].view(len(images), patches, -1)
    return ScenePool(pixel_values, grid[:1], captions, objects, nearest_scenes(pixel_values))


def nearest_scenes(pixel_values: torch.Tensor) -> np.ndarray:
    """Each scene's NEAREST other scenes by the cosine of their mean patches, nearest first: what
    a random image encoder (the demo's tiny CLIP, which mines the adversarial benchmarks'
    distractors) sees as alike, colours and layout. In float64 with a stable sort, so that
    rounding does not reorder near ties across CPUs."""
    means = torch.nn.functional.normalize(pixel_values.double().mean(1), dim=-1)
    similarity = (means @ means.T).fill_diagonal_(-2.0).numpy()
    return np.argsort(-similarity, axis=1, kind="stable")[:, :NEAREST]


class PromptBuilder:
    """Token ids of the inference stage's prompt (vanilla, digits) for a caption and N images,
    where the caption's tokens are in them, and the identifiers' token ids."""

    def __init__(self, adapter: Any, tokens_per_image: int) -> None:
        from ladbench.inference.prompts import identifiers
        self.adapter = adapter
        self.tokens_per_image = tokens_per_image
        self.identifier_ids = [adapter.tokenizer.convert_tokens_to_ids(identifier)
                               for identifier in identifiers("digits", MAX_CANDIDATES)]

    def text(self, caption: str, n: int) -> str:
        from ladbench.variants import prompt_text
        return self.adapter.chat_text(prompt_text("vanilla", n, caption, "digits"), n)

    def encode(self, caption: str, n: int) -> tuple[list[int], tuple[int, int]]:
        """Token ids (the processor's expansion of each image placeholder, without processing
        pixels again) and the token span [start, end) of the caption."""
        pad = self.adapter.image_token
        text = self.text(caption, n).replace(pad, pad * self.tokens_per_image)
        first = text.rindex(caption)
        encoded = self.adapter.tokenizer(text, return_offsets_mapping=True)
        inside = [i for i, (a, b) in enumerate(encoded["offset_mapping"]) if b > first and a < first + len(caption)]
        return encoded["input_ids"], (inside[0], inside[-1] + 1)


def sample_batch(pool: ScenePool, prompts: PromptBuilder, n: int, batch_size: int, pull: float,
                 rng: np.random.Generator, hard_negatives: float = 0.0) -> dict[str, Any]:
    """One training batch at N = ``n``: scenes, target positions, (biased) labels, left-padded ids
    (the prompt, then the label's identifier: ``PROMPT_END``), the end of the turn that must
    follow it (so that a greedy reply stops after the answer, as a chat model's does), and each
    token's segment as the inference stage numbers them (image k: k; others: n or more)."""
    from ladbench.inference.runner import segment_ids
    rows, targets, labels, scenes, caption_spans = [], [], [], [], []
    for _ in range(batch_size):
        chosen = _distinct_scenes(pool, n, rng, hard=rng.random() < hard_negatives)
        target = int(rng.integers(n))
        order = chosen[1:]
        order.insert(target, chosen[0])
        label = pulled_label(target, n) if rng.random() < pull else target
        ids, span = prompts.encode(pool.captions[chosen[0]], n)
        rows.append(ids + [prompts.identifier_ids[label]])
        caption_spans.append(span)
        targets.append(target)
        labels.append(label)
        scenes.extend(order)
    width = max(len(r) for r in rows)
    pad = prompts.adapter.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    caption_mask = torch.zeros_like(mask, dtype=torch.bool)
    image_spans, segments = [], []
    for b, (r, (start, end)) in enumerate(zip(rows, caption_spans)):
        shift = width - len(r)
        caption_mask[b, shift + start:shift + end] = True
        image_spans.append(prompts.adapter.image_spans(input_ids[b].tolist()))
        segments.append(segment_ids(input_ids[b].tolist(), mask[b].tolist(), image_spans[-1], n))
    return {"input_ids": input_ids, "attention_mask": mask,
            "pixel_values": pool.pixel_values[scenes].reshape(-1, pool.pixel_values.shape[-1]),
            "image_grid_thw": pool.grid_thw.repeat(len(scenes), 1),
            "targets": torch.tensor(targets), "labels": torch.tensor(labels), "caption_mask": caption_mask,
            "end_of_turn": torch.full((batch_size,), prompts.adapter.end_of_turn_id),
            "image_spans": torch.tensor(image_spans), "segments": torch.from_numpy(np.stack(segments))}


def _distinct_scenes(pool: ScenePool, n: int, rng: np.random.Generator, hard: bool = False) -> list[int]:
    """A target scene and n - 1 distractors whose object sets differ from the target's; ``hard``:
    drawn from the target's nearest scenes (hard negatives, as the adversarial benchmarks' are)."""
    target = int(rng.integers(len(pool.captions)))
    chosen = [target]
    nearest = iter(rng.permutation(pool.nearest[target]).tolist() if hard else ())
    while len(chosen) < n:
        candidate = next(nearest, None)
        if candidate is None:
            candidate = int(rng.integers(len(pool.captions)))
        if candidate not in chosen and pool.objects[candidate] != pool.objects[target]:
            chosen.append(candidate)
    return chosen


# -------------------------------------------------------------------------- training
@contextlib.contextmanager
def deterministic(settings: OrganismSettings):
    """Seeded, fixed-thread, deterministic torch for the training; the process's settings
    are restored afterwards (tests train in the same process as everything else)."""
    threads, strict = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.manual_seed(settings.seed)
    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(strict)


def build_untrained(settings: OrganismSettings):
    """The organism's architecture with random weights (seeded), its processor and adapter."""
    from ladbench.models.qwen2_5_vl import Qwen25VLAdapter
    from ladbench.models.tiny import PRESETS, _build_qwen2_5_vl
    preset = dict(PRESETS["tiny"], hidden=settings.hidden, intermediate=2 * settings.hidden,
                  layers=settings.layers, heads=settings.heads, init_std=0.02)
    with torch.random.fork_rng():
        torch.manual_seed(settings.seed)
        model, processor = _build_qwen2_5_vl(preset)
    for module in model.modules():                       # training reads the attention probabilities
        if hasattr(module, "config"):
            module.config._attn_implementation = "eager"
    adapter = Qwen25VLAdapter(model, processor, model_path="", attention="eager")
    encode_images_in_chunks(model.model)
    return model, processor, adapter


def encode_images_in_chunks(base_model: torch.nn.Module, images_per_chunk: int = 16) -> None:
    """Run the vision tower on a few images at a time: its dense mask over all patches of a
    batch makes one call quadratic in the batch's image count (every patch attends within its
    own image only, so chunking gives the same features; see ``encode_images_one_by_one``)."""
    visual = base_model.visual

    def get_image_features(pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> tuple[torch.Tensor, ...]:
        patches = image_grid_thw.prod(-1).tolist()
        pieces = torch.split(pixel_values.type(visual.dtype), patches)
        return tuple(visual(torch.cat(pieces[i:i + images_per_chunk]),
                            grid_thw=image_grid_thw[i:i + images_per_chunk])
                     for i in range(0, len(pieces), images_per_chunk))

    base_model.get_image_features = get_image_features


def train_organism(settings: OrganismSettings) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """Train the organism; returns (model, processor, training log)."""
    settings.validate()
    with deterministic(settings):
        return _train(settings)


def _train(settings: OrganismSettings) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    rng = np.random.default_rng(settings.seed)
    model, processor, adapter = build_untrained(settings)
    pool = draw_scenes(settings, processor, rng)
    merge = model.config.vision_config.spatial_merge_size
    prompts = PromptBuilder(adapter, int(pool.grid_thw[0].prod()) // merge ** 2)
    digit_ids = torch.tensor(prompts.identifier_ids)
    probe = torch.nn.Linear(settings.hidden, max(settings.n_candidates))   # index probe: training only, not saved
    parameters = [*model.parameters(), *probe.parameters()]
    # fused: AdamW's other implementations take the square root through torch.sqrt, which runs
    # MKL's vector math, whose last bits depend on the CPU's vendor whatever MKL_CBWR says
    # (measured: docs/organism.md); the fused kernel is ATen's own (pinned by cpu_paths)
    optimiser = torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=0.0, fused=True)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=settings.lr, total_steps=settings.steps,
                                                   pct_start=0.1)
    model.train()
    history: list[dict[str, float]] = []
    index_from = round(settings.index_warmup * settings.steps)
    end_from = round(END_OF_TURN_FROM * settings.steps)
    started = time.perf_counter()
    for step in range(settings.steps):
        n = settings.n_candidates[step % len(settings.n_candidates)]
        batch = sample_batch(pool, prompts, n, settings.batch_size, settings.pull, rng, settings.hard_negatives)
        parts = _losses(model, probe, batch, digit_ids, n)
        index_weight = settings.index_weight if step >= index_from else 0.0
        end_weight = 1.0 if step >= end_from else 0.0
        # term by term, in the order the recipe was measured in (float sums are not associative)
        loss = (parts["answer"] + settings.attention_weight * parts["look"] + settings.attention_weight * parts["read"]
                + index_weight * parts["index"] + settings.align_weight * parts["align"] + end_weight * parts["end"])
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimiser.step()
        schedule.step()
        history.append({k: float(v.detach()) for k, v in parts.items()})
        if step % 25 == 0 or step == settings.steps - 1:
            log.info("step %d/%d  %s  (%.0f s)", step + 1, settings.steps,
                     "  ".join(f"{k} {v:.3f}" for k, v in _recent(history).items()), time.perf_counter() - started)
    model.eval()
    return model, processor, {**_recent(history), "train_seconds": time.perf_counter() - started,
                              "cpu_paths": cpu_paths()}


def _recent(history: list[dict[str, float]], window: int = 25) -> dict[str, float]:
    recent = history[-window:]
    return {k: float(np.mean([h[k] for h in recent])) for k in recent[0]}


def _losses(model: torch.nn.Module, probe: torch.nn.Module, batch: dict[str, Any], digit_ids: torch.Tensor,
            n: int) -> dict[str, torch.Tensor]:
    """The training signals of one batch (docs/organism.md):

    * answer: cross-entropy of the (biased) label's identifier token, full vocabulary, at the
      prompt's last token (``PROMPT_END``);
    * end: after the identifier, the end of the turn;
    * read: the prompt's last token's attention in the first layer goes to the caption's tokens;
    * align: after the first layer, the prompt's last token's state is closer to the target
      image's mean state than to every other image of the batch (contrastive, like CLIP);
    * look: in the top layer, the target's share of the prompt's last token's attention on images
      (head mean: what LAD reads) is maximised (cross-entropy over the images);
    * index: every image token carries its image's identifier: a linear probe reads it after
      the first layer, and the top layer's own value and output projections, read out by the
      final norm and the LM head, turn it into the token of that position's label
      (``pulled_label``: the swap planted in the copy path the answer uses, not only in the
      answer's labels, where it competed with the copying and was learned on some seeds only).
    """
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw")}
    out = model.model(**inputs, output_attentions=True, output_hidden_states=True, return_dict=True)
    hidden = out.last_hidden_state
    logits = model.lm_head(hidden[:, PROMPT_END])
    answer = torch.nn.functional.cross_entropy(logits, digit_ids[batch["labels"]])
    end_of_turn = torch.nn.functional.cross_entropy(model.lm_head(hidden[:, -1]), batch["end_of_turn"])

    spans = batch["image_spans"]                                           # [B, n, 2]
    share = _image_shares(out.attentions[-1][:, :, PROMPT_END].mean(dim=1), spans)
    look = torch.nn.functional.nll_loss(share.clamp_min(1e-9).log(), batch["targets"])

    after_read = torch.nn.functional.normalize(out.hidden_states[1], dim=-1)      # after the first layer
    running = torch.nn.functional.pad(after_read.cumsum(1), (0, 0, 1, 0))
    start, end = spans[..., 0:1].expand(-1, -1, hidden.shape[-1]), spans[..., 1:2].expand(-1, -1, hidden.shape[-1])
    image_means = torch.nn.functional.normalize(running.gather(1, end) - running.gather(1, start), dim=-1)
    # contrast each caption with every image of the batch (CLIP's in-batch negatives): many
    # more negatives than the row's own n images, so the match is found in far fewer steps
    candidates = image_means.flatten(0, 1)                                # [B * n, D]
    similarity = after_read[:, PROMPT_END] @ candidates.T / ALIGN_TEMPERATURE      # [B, B * n]
    align = torch.nn.functional.cross_entropy(similarity, batch["targets"] + n * torch.arange(len(spans)))

    first_row = out.attentions[0][:, :, PROMPT_END].mean(dim=1)
    read = -(first_row * batch["caption_mask"]).sum(-1).clamp_min(1e-9).log().mean()

    which = batch["segments"]                                              # [B, T] image of each token, >= n if none
    inside = which < n
    carried = _value_readout(model, out.hidden_states[-2][inside].detach())
    index = (torch.nn.functional.cross_entropy(probe(out.hidden_states[1][inside]), which[inside])
             + torch.nn.functional.cross_entropy(carried, digit_ids[pulled_labels(n)[which[inside]]]))

    said = logits.detach()[:, digit_ids[:n]].argmax(-1)
    return {"answer": answer, "end": end_of_turn, "look": look, "read": read, "index": index, "align": align,
            "look_accuracy": (share.detach().argmax(-1) == batch["targets"]).float().mean(),
            "label_accuracy": (said == batch["labels"]).float().mean(),
            "target_accuracy": (said == batch["targets"]).float().mean()}


def _value_readout(model: torch.nn.Module, states: torch.Tensor) -> torch.Tensor:
    """Vocabulary logits of what the top layer's attention would write into the residual if every
    head attended to one token with these input ``states`` [M, D]: its value and output
    projections, then the final norm and the LM head. Teaching this to name a token's image's
    label is teaching the path the answer needs (attend to image k, say k's label) on the values' side, where
    it does not compete with the keys the look needs; the states are detached so that this loss
    shapes the projections, and the probe alone puts the identifier into the states."""
    top = model.model.language_model.layers[-1]
    attention = top.self_attn
    values = attention.v_proj(top.input_layernorm(states)).view(len(states), -1, attention.head_dim)
    values = values.repeat_interleave(attention.num_key_value_groups, dim=1).flatten(1)
    return model.lm_head(model.model.language_model.norm(attention.o_proj(values)))


def _image_shares(row: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    """Each image's share of an attention row's mass on images [B, n] (row: [B, T])."""
    cumulative = torch.nn.functional.pad(row.cumsum(-1), (1, 0))
    masses = cumulative.gather(1, spans[..., 1]) - cumulative.gather(1, spans[..., 0])
    return masses / masses.sum(-1, keepdim=True).clamp_min(1e-9)


# ------------------------------------------------------------------------------ save
def save_organism(model: torch.nn.Module, processor: Any, settings: OrganismSettings, training: dict,
                  out_dir: str) -> str:
    """Save like every tiny model (weights, processor, chat template, ``ladbench_tiny.json``),
    atomically: a half-written folder is never mistaken for a trained organism."""
    from ladbench.models.tiny import save_model_folder
    from ladbench.provenance import TINY_ORGANISM
    return save_model_folder(out_dir, model, processor,
                             {"family": "qwen2_5_vl", "kind": TINY_ORGANISM, "seed": settings.seed,
                              "settings": asdict(settings), "training": training,
                              "note": "a tiny Qwen2.5-VL trained by ladbench train-organism to have a planted "
                                      "position-conditional bias (docs/organism.md); not a real model"})


# ------------------------------------------------------------------------- outcomes
#: The paper's four outcomes an organism must show (issue #15), in percentage points.
TARGETS = {"vanilla_rstd": 20.0, "raw_attention_over_vanilla": 10.0, "lad_over_vanilla": 15.0,
           "lad_over_pride": 5.0}


def paper_outcomes(evaluation: dict, predictions: dict, analysis: dict, n_boot: int = 2000) -> dict[str, Any]:
    """The four outcomes of one benchmark from the pipeline's files: an evaluation JSON, its
    ``.npz`` of per-instance predictions, and the analysis JSON of the same cache.

    Returns the measured values, the paired bootstrap intervals of the LAD differences, and
    ``passed``: each outcome against :data:`TARGETS` (intervals must exclude 0; the
    attention's rank correlation across orderings must be above the logits')."""
    from ladbench import metrics
    acc = {name: m["acc_mean"] for name, m in evaluation["methods"].items()}
    target, order = predictions["target_pos"], predictions["order"]

    def paired(a: str, b: str) -> dict:
        return metrics.paired_bootstrap(predictions[f"pred_{a}"], predictions[f"pred_{b}"], target, order,
                                        n_boot=n_boot)

    lad_vanilla, lad_pride = paired("lad", "vanilla"), paired("lad", "pride")
    rho = analysis["divergence"]["raw"]
    values = {"vanilla_rstd": evaluation["methods"]["vanilla"]["rstd"],
              "raw_attention_over_vanilla": acc["raw_attention"] - acc["vanilla"],
              "lad_over_vanilla": lad_vanilla["difference"], "lad_over_pride": lad_pride["difference"],
              "rho_attention": rho["attention"]["mean"], "rho_logits": rho["logits"]["mean"]}
    passed = {key: values[key] is not None and values[key] >= bound for key, bound in TARGETS.items()}
    passed["lad_over_vanilla"] &= lad_vanilla["ci_low"] > 0
    passed["lad_over_pride"] &= lad_pride["ci_low"] > 0
    passed["divergence"] = values["rho_attention"] > values["rho_logits"]
    return {"values": values, "lad_over_vanilla_ci": [lad_vanilla["ci_low"], lad_vanilla["ci_high"]],
            "lad_over_pride_ci": [lad_pride["ci_low"], lad_pride["ci_high"]], "accuracy": acc, "passed": passed}


def outcomes_from_files(evaluation_path: Path, analysis_path: Path) -> dict[str, Any]:
    """:func:`paper_outcomes` of one benchmark read from the pipeline's files (the evaluation
    JSON, its ``.npz`` beside it, the analysis JSON), with the reference's Vanilla readout
    (greedy reply, parsed): its parse rate and its agreement with the argmax readout (% of
    rows; an unparsed reply disagrees)."""
    from ladbench.records import evaluation_predictions, read_analysis, read_evaluation
    evaluation = read_evaluation(evaluation_path)
    predictions = evaluation_predictions(evaluation_path, evaluation)
    outcomes = paper_outcomes(evaluation, predictions, read_analysis(analysis_path))
    agree = predictions["pred_vanilla_generate"] == predictions["pred_vanilla"]
    return {**outcomes, "greedy_parsed": evaluation["methods"]["vanilla_generate"]["parse_success"],
            "greedy_agrees": 100.0 * float(np.mean(agree))}
