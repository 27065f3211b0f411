"""Stage `merge-shards`: join the shard caches of one inference job into the cache an
unsharded job writes (same rows, order, datasets and attributes; see
ladbench.inference.merge). CPU only; no torch."""

from __future__ import annotations

import argparse

from ladbench.inference.merge import merge_shards


def register(subparsers) -> None:
    parser = subparsers.add_parser("merge-shards", help="join the shard caches of one inference job into one cache")
    parser.add_argument("shards", nargs="+", help="every shard cache of the job (HDF5, any order)")
    parser.add_argument("--out", required=True, help="the merged cache (HDF5) to write")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    attrs = merge_shards(args.shards, args.out)
    print(f"merged {attrs['n_shards']} shards into {args.out}: {attrs['timed_rows']} rows, "
          f"{attrs['rows_per_s']:.3g} rows/s per GPU, slowest shard {attrs.get('last_run_s', float('nan')):.0f} s")
