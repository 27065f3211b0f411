#!/usr/bin/env python
"""Size and load time of an instance explorer page at paper size.

Builds a synthetic study (tests/explorer_study.py) of ``--instances`` x ``--orderings``
evaluation rows at N = ``--n`` with ``--layers`` layers, every candidate a distinct
photo-like JPEG (``--image-size``; 1,000 x 8 = 8,000 images), calibrates and evaluates it
with the `ladbench` commands, then times ``ladbench explore`` and opens the page
``--loads`` times in headless Chromium (tests/browser.py), reading the time from navigation
start to the page's first render (its script's ready mark, after the first page of cards
is laid out) and to the load event. Prints one JSON line; the
targets are under 2 s and under 40 MB.

    python benchmarks/bench_explorer.py                      # 1,000 x 5, N = 8, 36 layers
    python benchmarks/bench_explorer.py --instances 100      # a quick look
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the study builder and browser live with the tests

from browser import console_errors, headless_chromium, missing_reason, open_page  # noqa: E402
from explorer_study import build_study  # noqa: E402

from ladbench.cli import main as ladbench  # noqa: E402

# The navigation's load event: every inline image of the first page decoded too.
LOAD_EVENT_END = "const n = performance.getEntriesByType('navigation')[0]; return n ? n.loadEventEnd : 0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--orderings", type=int, default=5)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--layers", type=int, default=36, help="decoder layers (Qwen2.5-VL-3B has 36)")
    parser.add_argument("--pool", type=int, default=100, help="calibration pool")
    parser.add_argument("--image-size", type=int, nargs=2, default=[320, 240], help="source images, px")
    parser.add_argument("--loads", type=int, default=3, help="page loads timed")
    parser.add_argument("--folder", default=None, help="work folder (default: a temporary one)")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, folder: Path) -> dict:
    from selenium.webdriver.support.ui import WebDriverWait

    started = time.perf_counter()
    files = build_study(folder, instances=args.instances, orderings=args.orderings, n=args.n, layers=args.layers,
                        pool=args.pool, image_size=tuple(args.image_size))
    built = time.perf_counter()
    page = folder / "explorer.html"
    ladbench(["explore", "--cache", files["cache"], "--calibration", files["calibration"], "--evaluation",
              files["evaluation"], "--images", files["images"], "--out", str(page)])
    explored = time.perf_counter()
    result = {"instances": args.instances, "orderings": args.orderings, "n": args.n, "layers": args.layers,
              "images": args.instances * args.n, "study_s": round(built - started, 1),
              "explore_s": round(explored - built, 2), "page_mb": round(page.stat().st_size / 2**20, 2),
              "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}"}
    reason = missing_reason()
    if reason:
        result["load_s"] = f"not measured: {reason}"
        return result
    loads, load_events = [], []
    with headless_chromium() as driver:
        for _ in range(args.loads):
            loads.append(open_page(driver, page, timeout=120))
            WebDriverWait(driver, 120).until(lambda d: d.execute_script(LOAD_EVENT_END) > 0)
            load_events.append(driver.execute_script(LOAD_EVENT_END) / 1000.0)
            driver.get("about:blank")
        result["console_errors"] = len(console_errors(driver))
        result["chromium"] = driver.capabilities.get("browserVersion")
    result["load_s"] = [round(x, 2) for x in loads]
    result["load_s_median"] = round(statistics.median(loads), 2)
    result["load_event_s"] = [round(x, 2) for x in load_events]
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.folder:
        result = run(args, Path(args.folder))
    else:
        with tempfile.TemporaryDirectory(prefix="ladbench-bench-explorer-") as folder:
            result = run(args, Path(folder))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
