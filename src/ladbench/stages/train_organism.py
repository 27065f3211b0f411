"""Stage `train-organism`: train the demo's model organism (a tiny Qwen2.5-VL with a planted,
position-conditional bias; docs/organism.md) and save it as a model folder that loads
through ``from_pretrained`` like every model. The training itself is in
:mod:`ladbench.organism`; its flags are the fields of :class:`~ladbench.organism.OrganismSettings`."""

from __future__ import annotations

import argparse
import logging

from ladbench.organism import OrganismSettings, save_organism, train_organism
from ladbench.stages.options import add_arguments, from_args


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train-organism", help="train the demo's model organism (tiny Qwen2.5-VL with a planted bias) on CPU",
        description=__doc__,
    )
    parser.add_argument("--out", required=True, help="model folder to write (replaced if it exists)")
    add_arguments(parser, OrganismSettings)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings = from_args(OrganismSettings, args)
    model, processor, training = train_organism(settings)
    print(f"trained in {training['train_seconds']:.0f} s: {training}")
    print(f"wrote {save_organism(model, processor, settings, training, args.out)}")
