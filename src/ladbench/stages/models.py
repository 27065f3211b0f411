"""Command `models`: every image-text-to-text architecture of the installed transformers with
what ``family: auto`` does with it (``ladbench.models.catalog``)."""

from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "models", help="list the installed transformers' image-text-to-text architectures: tested, refused (why) or untested")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help='print a JSON list of {"model_type", "status", "reason"}')
    form.add_argument("--markdown", action="store_true", help="print the README's model table")
    parser.add_argument("--proxies", default=None, metavar="JSON",
                        help="with --markdown: benchmarks/bench_inference.py --proxies --json output, for the table's "
                             "host syncs and aten ops per architecture")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from ladbench.families import family_lanes, installed_lane, lane_venv
    lanes = family_lanes("auto")
    if installed_lane() not in lanes:
        raise ValueError(f"family auto runs only on the {' / '.join(lanes)} lane, and this is the {installed_lane()} "
                         f"lane: run `ladbench models` from {lane_venv(lanes)}")
    from ladbench.models import catalog

    rows = catalog.architecture_statuses()
    if args.json:
        print(catalog.as_json(rows))
    elif args.markdown:
        proxies = None
        if args.proxies:
            with open(args.proxies, encoding="utf-8") as f:
                proxies = json.load(f).get("proxies", [])
        print(catalog.as_markdown(rows, proxies))
    else:
        print(catalog.as_text(rows))
