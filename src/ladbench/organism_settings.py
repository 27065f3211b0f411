"""The model organism's training settings (:mod:`ladbench.organism` trains it), apart from the
training so that what only reads them imports no torch: the config's schema fills its
``models.<name>.organism`` block from these fields, and every Snakemake start (a dry run, each
job of a SLURM run) loads that schema."""
from __future__ import annotations

from dataclasses import dataclass

from ladbench.settings import Settings, setting

MAX_CANDIDATES = 9         # identifiers "1" ... "9" are single tokens


@dataclass(frozen=True)
class OrganismSettings(Settings):
    """Everything a training depends on (all of it is recorded in the saved folder); config
    ``models.<name>.organism`` (what the config does not set is the default here: the train-organism
    rule hands over only the keys the config gives, ``Study.organism_flags``), flags of
    ``ladbench train-organism``. N, the image size and the scene size are the study's
    (``config=False``: the rule derives them from the benchmarks, inference and dataset)."""

    section = "organism"

    seed: int = setting(0, "training seed", minimum=0)
    # x batch_size: 12,000 rows, as many as 800 x 16 took, in more, smaller steps
    steps: int = setting(1000, "optimiser steps", minimum=1)
    # (more updates per row: the slow seeds learned the look and the index in time)
    batch_size: int = setting(12, "rows per step", minimum=1)
    lr: float = setting(3e-3, "learning rate", above=0)
    n_candidates: tuple[int, ...] = setting((4, 8), "numbers of images per row (single-token digits)", minimum=2,
                                            maximum=MAX_CANDIDATES, config=False)
    image_size: int = setting(56, "the inference stage's --image-size (images are resized to it)", minimum=1,
                              config=False)
    scene_size: int = setting(96, "the synthetic scenes' side before resizing (demo-scenes --image-size)", minimum=1,
                              config=False)
    n_scenes: int = setting(1500, "training scenes drawn (in memory) from the demo's generator", minimum=16)
    pull: float = setting(1.0, "probability that a target at a swapped position gets its neighbour's label",
                          minimum=0, maximum=1)
    attention_weight: float = setting(1.0, "weight of the look and read losses (last token's attention)", minimum=0)
    index_weight: float = setting(1.0, "weight of the index losses (each image token carries its identifier, read "
                                  "out as its label)", minimum=0)
    index_warmup: float = setting(0.15, "fraction of the steps before the index losses start (align and look first)",
                                  minimum=0, below=1)
    align_weight: float = setting(1.0, "weight of the align loss (caption read by the last token ~ target image)",
                                  minimum=0)
    hard_negatives: float = setting(0.75, "fraction of rows whose distractors are the target's nearest scenes "
                                    "(pixels)", minimum=0, maximum=1)
    # fixed: results must not depend on the machine's cores
    threads: int = setting(1, "torch threads", minimum=1)
    hidden: int = setting(64, "hidden size of the tiny model", minimum=8)
    layers: int = setting(3, "decoder layers", minimum=1)
    heads: int = setting(4, "attention heads", minimum=1)

    def validate(self) -> None:
        """The fields' bounds, checked at construction (kept for the callers that re-check)."""
        Settings.__post_init__(self)
