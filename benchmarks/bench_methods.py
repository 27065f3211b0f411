#!/usr/bin/env python
"""Time every method, variant and ablation on a cache-sized simulated array set.

Builds, per N, a simulated cache of ``--instances`` x ``--orderings`` evaluation rows
and a calibration pool of ``--pool`` instances x N cyclic shifts with ``--layers``
layers (tests/simulate.py), then times: fitting the calibration (several draws, both
score averages), predicting with every registered method, the Table 4 ablation grid,
the tau sweep, the four paper/reference LAD variants, and summarising every prediction
set with ``--bootstrap`` resamples (plus a paired bootstrap and the divergence
statistics). Prints one table in seconds. Not a test: rerun it after changing the math.

    python benchmarks/bench_methods.py                # the issue's setting
    python benchmarks/bench_methods.py --n 4 --bootstrap 1000
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the simulator lives with the tests

from simulate import conditional_bias, simulate_cache  # noqa: E402

from ladbench.calibration import fit_calibration  # noqa: E402
from ladbench.divergence import divergence_summary  # noqa: E402
from ladbench.methods import (  # noqa: E402
    METHODS,
    LadSettings,
    MethodRow,
    MethodSettings,
    ablation_grid,
    evaluate_rows,
    paper_vs_reference_grid,
    tau_sweep,
    top_k_sweep,
)
from ladbench.metrics import acc_mean_std, paired_bootstrap, spread_over_draws, summarize  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=1000, help="evaluation instances")
    parser.add_argument("--orderings", type=int, default=5, help="orderings T per instance")
    parser.add_argument("--n", type=int, nargs="+", default=[4, 8], help="candidate counts N to run")
    parser.add_argument("--layers", type=int, default=36, help="decoder layers (Qwen2.5-VL-3B has 36)")
    parser.add_argument("--pool", type=int, default=100, help="calibration pool size")
    parser.add_argument("--n-cal", type=int, default=5, help="|D_cal| per draw")
    parser.add_argument("--draws", type=int, default=3, help="calibration draws (seeds)")
    parser.add_argument("--bootstrap", type=int, default=10000, help="bootstrap resamples per summary")
    parser.add_argument("--layer-range", type=int, nargs=2, default=[21, 35], metavar=("FIRST", "LAST"),
                        help="LAD's layer search range (0-based, inclusive)")
    parser.add_argument("--seed", type=int, default=0, help="simulation seed")
    return parser.parse_args(argv)


class Timer:
    """Collects (N, step, items, seconds) rows."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, int, float]] = []

    @contextmanager
    def step(self, n: int, name: str, items: int):
        start = time.perf_counter()
        yield
        self.rows.append((n, name, items, time.perf_counter() - start))

    def print_table(self) -> None:
        print("\n| N | step | items | seconds |\n|---|---|---|---|")
        for n, name, items, seconds in self.rows:
            print(f"| {n} | {name} | {items} | {seconds:.3f} |")
        for n in sorted({row[0] for row in self.rows}):
            total = sum(row[3] for row in self.rows if row[0] == n and row[1] != "simulate cache")
            print(f"| {n} | **total (without simulation)** | | **{total:.3f}** |")


def all_rows(base: LadSettings) -> list[MethodRow]:
    """Every method and grid row the report can ask for, each labelled once."""
    plain = [MethodRow(name, name, base) for name in
             ("vanilla", "pride", "pride_original", "lad", "raw_attention", "purified_attention", "permutation_average")]
    return plain + ablation_grid(base) + tau_sweep(base) + top_k_sweep(base, (1, 3, 4, 8)) + paper_vs_reference_grid(base)


def run(args: argparse.Namespace) -> Timer:
    timer = Timer()
    base = LadSettings(layer_range=tuple(args.layer_range))
    first, last = args.layer_range[0], min(args.layer_range[1], args.layers - 1)
    informative = tuple(sorted({min(first + 4, last), min(first + 7, last)}))   # inside the LAD layer range
    for n in args.n:
        with timer.step(n, "simulate cache", args.instances * args.orderings + args.pool * n):
            sim = simulate_cache(
                n_eval=args.instances, n_orderings=args.orderings, n_cal_pool=args.pool, n=n,
                n_layers=args.layers, informative_layers=informative, bias=conditional_bias(n, 4.0), seed=args.seed,
            )
        with timer.step(n, "fit calibrations (draws x 2 score averages)", 2 * args.draws):
            calibrations = [fit_calibration(sim.cal_scores, sim.cal_attn, sim.cal_target_pos, args.n_cal, seed)
                            for seed in range(args.draws)]
            paper_calibrations = [fit_calibration(sim.cal_scores, sim.cal_attn, sim.cal_target_pos, args.n_cal,
                                                  seed, average="paper") for seed in range(args.draws)]
        rows = all_rows(base)
        with timer.step(n, "predict every row, first draw", len(rows)):
            predictions = evaluate_rows(sim, calibrations[0], rows)
            predictions["lad_calibration_paper_average"] = METHODS["lad"](sim, paper_calibrations[0], MethodSettings(base))
        with timer.step(n, "predict LAD + PriDe for the other draws", 2 * (args.draws - 1)):
            draws = [{name: METHODS[name](sim, cal, MethodSettings(base)) for name in ("lad", "pride")} for cal in calibrations[1:]]
        with timer.step(n, f"summarize every row ({args.bootstrap} resamples)", len(predictions)):
            summaries = {label: summarize(pred, sim.target_pos, sim.order, n, n_boot=args.bootstrap, seed=0)
                         for label, pred in predictions.items()}
        with timer.step(n, "spread over calibration draws", 2):
            for name in ("lad", "pride"):
                per_draw = [summaries[name]] + [summarize(d[name], sim.target_pos, sim.order, n, n_boot=0) for d in draws]
                spread_over_draws(per_draw)
        with timer.step(n, f"paired bootstrap LAD vs PriDe ({args.bootstrap})", 1):
            paired = paired_bootstrap(predictions["lad"], predictions["pride"], sim.target_pos, sim.order,
                                      "acc_mean", n_boot=args.bootstrap)
        with timer.step(n, f"divergence statistics ({args.bootstrap})", 1):
            divergence = divergence_summary(sim.scores, sim.order, attn=sim.attn, attn_prior=calibrations[0].attn_prior,
                                            settings=LadSettings(top_k=2, layer_range=base.layer_range), n_boot=args.bootstrap)
        print(f"N = {n}: Acc vanilla {summaries['vanilla']['acc_mean']:.1f}, PriDe {summaries['pride']['acc_mean']:.1f}, "
              f"LAD {summaries['lad']['acc_mean']:.1f} [{summaries['lad']['acc_mean_ci_low']:.1f}, "
              f"{summaries['lad']['acc_mean_ci_high']:.1f}], ideal attention "
              f"{acc_mean_std(sim.attention_pred, sim.target_pos)[0]:.1f}; LAD - PriDe = "
              f"{paired['difference']:.1f} (p = {paired['p_value']:.4f}); Spearman purified attention "
              f"{divergence['attention']['mean']:.2f} vs logits {divergence['logits']['mean']:.2f}")
    return timer


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"{args.instances} instances x {args.orderings} orderings, {args.layers} layers, pool {args.pool}, "
          f"|D_cal| = {args.n_cal}, {args.draws} draws, {args.bootstrap} bootstrap resamples")
    run(args).print_table()


if __name__ == "__main__":
    main()
