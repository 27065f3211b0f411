"""What integrity checking costs when a stage reads a cache: HDF5's per-chunk Fletcher-32
checksums, and the content digest (``content_sha256``: sha256 of every dataset, text and
attribute) that every reader checks on top.

A paper-size cache (1,000 instances x 5 orderings + 100 x N calibration rows, 36 layers, with
the greedy reply's tokens and texts) is written three ways in the project's chunking and file
format (no checksums; Fletcher-32, as before the digest; Fletcher-32 and the digest, as the
writer does now) and read whole in interleaved repetitions, the last way as ``read_cache``
reads it (the arrays, then the digest checked). The minimum per way is printed, and the
ratios. Usage: python benchmarks/bench_checksums.py [--n 8] [--reps 7]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from ladbench.hdf5 import CHECKSUMS, attributes, check_digest, open_h5, sign, stored_text, write_attrs

WAYS = ("no checksums", "Fletcher-32", "Fletcher-32 + content digest")


def write(path: Path, arrays: dict[str, np.ndarray], way: str) -> None:
    with open_h5(path, "w") as handle:
        for name, data in arrays.items():
            data = stored_text(data) if data.dtype == object else data
            handle.create_dataset(name, data=data, chunks=(256,) + data.shape[1:],
                                  **(CHECKSUMS if way != WAYS[0] else {}))
        write_attrs(handle, {"model": "qwen2_5_vl_3b", "config_sha256": "0" * 64, "settings": {"tau": 5.0}})
        if way == WAYS[2]:
            sign(handle)


def read_seconds(path: Path, way: str) -> float:
    start = time.perf_counter()
    with open_h5(path, "r") as handle:
        arrays = {name: ds.asstr()[()] if h5py.check_string_dtype(ds.dtype) else ds[()] for name, ds in handle.items()}
        attrs = attributes(handle)
    if way == WAYS[2]:
        check_digest(path, attrs, arrays, "inference cache", "rebuild it")
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
              "attn_text": rng.random((rows, args.layers), dtype=np.float32),
              "order": np.tile(np.arange(args.n, dtype=np.int16), (rows, 1)),
              "greedy_tokens": rng.integers(0, 150_000, (rows, 2), dtype=np.int32),
              "greedy_text": np.array([str(r % args.n + 1) for r in range(rows)], dtype=object)}
    megabytes = sum(a.nbytes for a in arrays.values() if a.dtype != object) / 2 ** 20
    with tempfile.TemporaryDirectory() as folder:
        paths = {way: Path(folder) / f"cache_{i}.h5" for i, way in enumerate(WAYS)}
        for way, path in paths.items():
            write(path, arrays, way)
        times = {way: [] for way in WAYS}
        for _ in range(args.reps):
            for way, path in paths.items():
                times[way].append(read_seconds(path, way))
    best = {way: min(seconds) for way, seconds in times.items()}
    print(f"cache of {rows} rows, {megabytes:.1f} MB, read whole (min of {args.reps}):")
    for way in WAYS:
        print(f"  {way:30s} {best[way] * 1e3:7.1f} ms  ({best[way] / best[WAYS[0]]:.2f}x no checksums, "
              f"{best[way] / best[WAYS[1]]:.2f}x Fletcher-32)")


if __name__ == "__main__":
    main()
