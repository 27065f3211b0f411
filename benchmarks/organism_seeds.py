#!/usr/bin/env python
"""The model organism over seeds: the paper's four outcomes on the demo's four benchmarks.

Trains one organism per seed (the demo's recipe, ``models.organism_qwen2_5_vl`` of
workflow/demo/config.yaml, only the seed changed) and runs each through the unchanged
pipeline on the demo's benchmarks (random and adversarial, N = 4 and 8: infer, calibrate,
evaluate, analyze), all in one Snakemake run, so the benchmarks are built once. Prints, per
seed and benchmark, the four outcomes (docs/organism.md): Vanilla RStd >= 20, raw attention
>= Vanilla + 10, LAD >= Vanilla + 15 and >= PriDe + 5 with the 95 % paired intervals above
0, attention's rank correlation across orderings above the logits'; and the reference's
Vanilla readout (greedy reply, parsed): its parse rate and agreement with the argmax. Then
the mean and spread over the seeds, and how many seeds pass everything.

    python benchmarks/organism_seeds.py                      # seeds 0-4, 2 cores (~30 min)
    python benchmarks/organism_seeds.py --seeds 2 --out /tmp/s2
    python benchmarks/organism_seeds.py --set steps=1200 index_weight=2   # a variant of the recipe

Reruns reuse what the folder already holds (Snakemake). ``--json`` writes every number.
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
DEMO_ORGANISM = "organism_qwen2_5_vl"


def sweep_config(out: Path, seeds: list[int], changes: dict | None = None) -> tuple[Path, dict[int, str]]:
    """The demo config with one organism per seed (the demo's spec, its seed replaced and
    ``changes`` to its settings applied), the vanilla variant only, no transfer; its path and
    seed -> model name."""
    config = yaml.safe_load(DEMO_CONFIG.read_text())
    spec = config["models"][DEMO_ORGANISM]
    names = {seed: f"organism_seed{seed}" for seed in seeds}
    organism = {**spec["organism"], **(changes or {})}
    config["models"] = {name: {**spec, "organism": {**organism, "seed": seed}} for seed, name in names.items()}
    config["inference"]["variants"] = {"vanilla": config["inference"]["variants"]["vanilla"]}
    config["evaluation"]["transfer"] = []
    config["output_dir"] = "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "organism-seeds.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, names


def run_sweep(out: Path, seeds: list[int], cores: int, changes: dict | None = None) -> dict[int, dict[str, dict]]:
    from ladbench.config import load_config, study_benchmarks
    from ladbench.organism import outcomes_from_files

    config_path, names = sweep_config(out, seeds, changes)
    benchmarks = study_benchmarks(load_config(config_path))
    files = {(seed, b): (out / "results" / "eval" / name / b / "vanilla" / f"cal-{b}.json",
                         out / "results" / "analysis" / name / b / "vanilla.json")
             for seed, name in names.items() for b in benchmarks}
    targets = [str(path.relative_to(out)) for pair in files.values() for path in pair]
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run([str(bin_dir / "snakemake"), "--snakefile", str(ROOT / "Snakefile"), "--directory", str(out),
                    "--configfile", str(config_path), "--cores", str(cores), "--rerun-incomplete", *targets],
                   check=True, env=env)
    return {seed: {b: outcomes_from_files(*files[seed, b]) for b in benchmarks} for seed in seeds}


def setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` -> (key, value parsed as YAML: 900 -> int, 0.75 -> float)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set takes KEY=VALUE; got {text!r}")
    return key, yaml.safe_load(value)


def spread(xs: list[float]) -> str:
    """mean ± sample standard deviation"""
    return f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else f"{xs[0]:.1f}"


def print_table(results: dict[int, dict[str, dict]], demo_seed: int) -> None:
    print("| seed | benchmark | Vanilla RStd | attn - Vanilla | LAD - Vanilla [95% CI] | LAD - PriDe [95% CI] "
          "| rho attn / logits | greedy parsed / agrees | fails |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed, per_benchmark in results.items():
        for benchmark, r in per_benchmark.items():
            v = r["values"]
            lv, lp = r["lad_over_vanilla_ci"], r["lad_over_pride_ci"]
            fails = ", ".join(k for k, ok in r["passed"].items() if not ok) or "-"
            print(f"| {seed}{' (demo)' if seed == demo_seed else ''} | {benchmark} | {v['vanilla_rstd']:.1f} "
                  f"| {v['raw_attention_over_vanilla']:.1f} | {v['lad_over_vanilla']:.1f} [{lv[0]:.1f}, {lv[1]:.1f}] "
                  f"| {v['lad_over_pride']:.1f} [{lp[0]:.1f}, {lp[1]:.1f}] "
                  f"| {v['rho_attention']:.2f} / {v['rho_logits']:.2f} "
                  f"| {r['greedy_parsed']:.1f} / {r['greedy_agrees']:.1f} | {fails} |")
    print()
    benchmarks = list(next(iter(results.values())))
    print("| benchmark | Vanilla Acc | PriDe | raw attention | LAD | Vanilla RStd | greedy parsed | "
          f"seed {demo_seed} (demo): Vanilla / PriDe / attn / LAD (RStd) |")
    print("|---|---|---|---|---|---|---|---|")
    for b in benchmarks:
        runs = [per[b] for per in results.values()]
        accuracy = {m: spread([r["accuracy"][m] for r in runs]) for m in ("vanilla", "pride", "raw_attention", "lad")}
        demo = results.get(demo_seed, {}).get(b)
        demo_cell = (" / ".join(f"{demo['accuracy'][m]:.1f}" for m in ("vanilla", "pride", "raw_attention", "lad"))
                     + f" ({demo['values']['vanilla_rstd']:.1f})") if demo else "-"
        print(f"| {b} | {accuracy['vanilla']} | {accuracy['pride']} | {accuracy['raw_attention']} | {accuracy['lad']} "
              f"| {spread([r['values']['vanilla_rstd'] for r in runs])} | {spread([r['greedy_parsed'] for r in runs])} "
              f"| {demo_cell} |")
    print()
    passing = [s for s, per in results.items() if all(all(r["passed"].values()) for r in per.values())]
    print(f"seeds passing all four outcomes on all {len(benchmarks)} benchmarks: {len(passing)} of {len(results)} "
          f"({', '.join(map(str, passing)) or 'none'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "organism-seeds",
                        help="working folder (default: results/organism-seeds)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write every number here")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", type=setting,
                        help="change the recipe: OrganismSettings fields (ladbench train-organism --help), "
                             "e.g. steps=1200; checked by the config's schema")
    args = parser.parse_args()
    results = run_sweep(args.out.resolve(), args.seeds, args.cores, dict(args.set))
    demo_seed = yaml.safe_load(DEMO_CONFIG.read_text())["models"][DEMO_ORGANISM]["organism"]["seed"]
    print_table(results, demo_seed)
    if args.json:
        args.json.write_text(json.dumps({str(s): per for s, per in results.items()}, indent=1))


if __name__ == "__main__":
    main()
