"""Command `plan`: a study's inference jobs with their estimated GPU hours and wall time
(``ladbench.plan``), before running it."""

from __future__ import annotations

import argparse

from ladbench.config import load_config
from ladbench.plan import bench_rates, plan_jobs, report


def register(subparsers) -> None:
    parser = subparsers.add_parser("plan", help="list a study's inference jobs with estimated GPU hours and wall time")
    parser.add_argument("--configfile", default="config.yaml", help="study config (YAML)")
    parser.add_argument("--gpus", type=int, default=1,
                        help="GPUs the study runs on at once (snakemake --resources gpu=G)")
    parser.add_argument("--rates", action="append", default=[], metavar="MODEL=FILE[#ARCH]",
                        help="the rates benchmarks/bench_inference.py --device cuda --json FILE measured on MODEL's "
                             "architecture (full size, random weights), for its jobs no cache has measured; repeatable (a model's "
                             "files merged: scoring from one, generation from another)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    if args.gpus < 1:
        raise ValueError(f"--gpus must be >= 1; got {args.gpus}")
    bench = bench_rates(args.rates)
    print(report(plan_jobs(load_config(args.configfile), bench), args.gpus, bench))
