"""Stage `train-organism`: train the demo's model organism (a tiny Qwen2.5-VL with a planted,
position-conditional bias; docs/organism.md) and save it as a model folder that loads
through ``from_pretrained`` like every model. The training itself is in
:mod:`ladbench.organism`."""

from __future__ import annotations

import argparse
import dataclasses
import logging

from ladbench.organism import OrganismSettings, save_organism, train_organism


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train-organism", help="train the demo's model organism (tiny Qwen2.5-VL with a planted bias) on CPU",
        description=__doc__,
    )
    parser.add_argument("--out", required=True, help="model folder to write (replaced if it exists)")
    defaults = OrganismSettings()
    for spec in dataclasses.fields(OrganismSettings):
        default = getattr(defaults, spec.name)
        flag = f"--{spec.name.replace('_', '-')}"
        if isinstance(default, tuple):
            parser.add_argument(flag, type=int, nargs="+", default=list(default), help=f"default {list(default)}")
        else:
            parser.add_argument(flag, type=type(default), default=default, help=f"default {default}")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    values = {spec.name: getattr(args, spec.name) for spec in dataclasses.fields(OrganismSettings)}
    values["n_candidates"] = tuple(values["n_candidates"])
    settings = OrganismSettings(**values)
    model, processor, training = train_organism(settings)
    print(f"trained in {training['train_seconds']:.0f} s: {training}")
    print(f"wrote {save_organism(model, processor, settings, training, args.out)}")
