"""A headless Chromium for page tests: Debian's chromium and chromium-driver (the CI script
installs them); tests that need it skip with the reason where they are missing."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="Debian's chromium and chromium-driver are not installed (apt-get install chromium "
    "chromium-driver)",
)


@contextmanager
def headless_chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A WebDriver for a fresh headless Chromium that talks to nothing but the pages it is
    sent to (this machine's network is closed: background services would only fail)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert CHROMIUM is not None and CHROMEDRIVER is not None
    profile = tempfile.mkdtemp(prefix="p2ptrain-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def read_page(driver: Any, selector: str, attribute: str | None = None) -> list[Any]:
    """The text (or `attribute`) of every element matching `selector`, read in one script: the
    page replaces its tables once a second, so an element handle held across two calls can be
    gone (stale) before it is read."""
    return list(
        driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]))"
            ".map(e => arguments[1] ? e.getAttribute(arguments[1]) : e.textContent)",
            selector,
            attribute,
        )
    )


def plan_grid(driver: Any) -> list[list[str]]:
    """The plan grid's peers, row by row, read in one script (see read_page)."""
    return list(
        driver.execute_script(
            "return Array.from(document.querySelectorAll('#plan tbody tr'))"
            ".map(r => Array.from(r.querySelectorAll('td')).map(c => c.getAttribute('data-peer')))"
        )
    )
