"""What the caches' per-chunk Fletcher-32 checksums cost when a stage reads a cache.

A paper-size cache (1,000 instances x 5 orderings + 100 x N calibration rows, 36 layers) is
written with and without checksums, in the project's chunking and file format, and read
whole (as ``read_cache`` does) in interleaved repetitions; the minimum per variant is
printed. Usage: python benchmarks/bench_checksums.py [--n 8] [--reps 7]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from ladbench.hdf5 import CHECKSUMS, open_h5


def write(path: Path, arrays: dict[str, np.ndarray], checksums: bool) -> None:
    with open_h5(path, "w") as handle:
        for name, data in arrays.items():
            handle.create_dataset(name, data=data, chunks=(256,) + data.shape[1:], **(CHECKSUMS if checksums else {}))


def read_seconds(path: Path) -> float:
    start = time.perf_counter()
    with open_h5(path, "r") as handle:
        for name in handle:
            handle[name][()]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8, help="candidates N")
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    rows = 1000 * 5 + 100 * args.n
    rng = np.random.default_rng(0)
    arrays = {"scores": rng.normal(size=(rows, args.n)).astype(np.float32),
              "attn": rng.random((rows, args.layers, args.n), dtype=np.float32),
              "attn_text": rng.random((rows, args.layers), dtype=np.float32)}
    megabytes = sum(a.nbytes for a in arrays.values()) / 2 ** 20
    with tempfile.TemporaryDirectory() as folder:
        paths = {flag: Path(folder) / f"checksums_{flag}.h5" for flag in (False, True)}
        for flag, path in paths.items():
            write(path, arrays, flag)
        times = {flag: [] for flag in paths}
        for _ in range(args.reps):
            for flag, path in paths.items():
                times[flag].append(read_seconds(path))
    plain, checked = min(times[False]), min(times[True])
    print(f"cache of {rows} rows, {megabytes:.1f} MB: read {plain * 1e3:.1f} ms without checksums, "
          f"{checked * 1e3:.1f} ms with Fletcher-32 ({checked / plain:.2f}x, +{(checked - plain) * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
