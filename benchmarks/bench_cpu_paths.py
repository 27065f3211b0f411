#!/usr/bin/env python
"""What the pinned CPU paths (ladbench.cpu_paths) cost the organism's training.

Trains the demo's organism (its settings, ``--steps`` steps) in fresh processes, in turn
with the switches set (what ``ladbench train-organism`` runs) and without them (each
library picks the best code this CPU has), ``--pairs`` times, and prints each run's
training seconds and the pinned / unpinned ratio pair by pair (pairs keep the ratio
meaningful on a machine whose speed drifts). One torch thread, as the training runs.

    python benchmarks/bench_cpu_paths.py                 # 40 steps, 3 pairs
    python benchmarks/bench_cpu_paths.py --steps 800 --pairs 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIG = ROOT / "workflow" / "demo" / "config.yaml"

# A child process: trains and prints the training's seconds (the settings as JSON in argv[1]).
_CHILD = """
import json, sys
from ladbench.organism import OrganismSettings, train_organism
settings = OrganismSettings(**json.loads(sys.argv[1]))
print(json.dumps(train_organism(settings)[2]["train_seconds"]))
"""


def run(settings: dict, pinned: bool) -> float:
    from ladbench.cpu_paths import PORTABLE_CPU_ENV
    env = {k: v for k, v in os.environ.items() if k not in PORTABLE_CPU_ENV}
    if pinned:
        env.update(PORTABLE_CPU_ENV)
    result = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(settings)], env=env, check=True,
                            capture_output=True, text=True)
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    config = yaml.safe_load(DEMO_CONFIG.read_text())
    settings = {**config["models"]["organism_qwen2_5_vl"]["organism"], "steps": args.steps,
                "n_candidates": config["benchmarks"]["n_candidates"], "image_size": config["inference"]["image_size"],
                "scene_size": config["datasets"]["scenes"]["image_size"]}
    ratios = []
    print("| pair | pinned (s) | unpinned (s) | pinned / unpinned |")
    print("|---|---|---|---|")
    for pair in range(args.pairs):
        pinned, unpinned = run(settings, True), run(settings, False)
        ratios.append(pinned / unpinned)
        print(f"| {pair + 1} | {pinned:.1f} | {unpinned:.1f} | {ratios[-1]:.2f} |", flush=True)
    print(f"median ratio over {args.pairs} pairs ({args.steps} steps each): {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
