"""A real headless browser for the explorer's tests, its benchmark and its README screenshot:
Debian's ``chromium`` driven by Selenium through Debian's ``chromium-driver`` (`.ci/run`
installs both). Nothing is downloaded: the binaries are found on PATH, and the browser's
profile lives in a temporary folder (the machine outside it is never written).

    python tests/browser.py PAGE.html OUT.png [--select ID=VALUE ...]   a screenshot
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

BROWSERS = ("chromium", "chromium-browser")
DRIVERS = ("chromedriver", "chromium-driver")


def _first_on_path(names) -> str | None:
    return next((path for path in map(shutil.which, names) if path), None)


def missing_reason() -> str | None:
    """Why no browser test can run here (None when one can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if not _first_on_path(BROWSERS):
        return "Debian's chromium is not installed (apt-get install chromium chromium-driver; .ci/run does)"
    if not _first_on_path(DRIVERS):
        return "Debian's chromium-driver is not installed (apt-get install chromium-driver; .ci/run does)"
    return None


@contextlib.contextmanager
def headless_chromium(width: int = 1400, height: int = 1000) -> Iterator:
    """A Selenium driver of headless Chromium with the console log kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="ladbench-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = _first_on_path(BROWSERS)
        for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                         "--disable-crash-reporter", "--disable-breakpad", "--disable-extensions", f"--user-data-dir={profile}",
                         f"--window-size={width},{height}"):
            options.add_argument(argument)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        # Chromium keeps crash reports and settings under HOME whatever its profile: give it the temporary folder
        home = {"HOME": profile, "XDG_CONFIG_HOME": f"{profile}/config", "XDG_CACHE_HOME": f"{profile}/cache"}
        service = Service(executable_path=_first_on_path(DRIVERS), env={**os.environ, **home})
        driver = webdriver.Chrome(options=options, service=service)
        try:
            yield driver
        finally:
            driver.quit()


def open_page(driver, path: str | Path, timeout: float = 60) -> float:
    """Open a page from disk, wait until its script says it is ready; returns the seconds from
    navigation start to ready, as the page measured them."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(Path(path).resolve().as_uri())
    WebDriverWait(driver, timeout).until(lambda d: d.execute_script("return document.body && document.body.dataset.ready"))
    return driver.execute_script("return window.explorerReadyAt || performance.now()") / 1000.0


def console_errors(driver) -> list[dict]:
    """The console's errors since the last call (SEVERE entries: script errors, refused loads)."""
    return [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]


def select(driver, element_id: str, value: str) -> None:
    """Choose ``value`` in the <select> with ``element_id`` (fires its change event)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, element_id)).select_by_value(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="screenshot of an explorer page (the README's)")
    parser.add_argument("page")
    parser.add_argument("out")
    parser.add_argument("--select", nargs="*", default=[], help="ID=VALUE choices applied in order")
    parser.add_argument("--size", nargs=2, type=int, default=[1300, 900])
    args = parser.parse_args(argv)
    with headless_chromium(*args.size) as driver:
        open_page(driver, args.page)
        for item in args.select:
            element_id, _, value = item.partition("=")
            select(driver, element_id, value)
        driver.execute_script("document.getElementById('controls').scrollIntoView()")
        driver.save_screenshot(args.out)
        errors = console_errors(driver)
    if errors:
        raise SystemExit(f"console errors: {errors}")


if __name__ == "__main__":
    main()
