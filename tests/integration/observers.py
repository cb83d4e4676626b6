"""The real observers of the HTTP surface: a headless Chromium driven by Selenium, and a Prometheus
server scraping ``/metrics``. Both are Debian's packages (``scripts/setup.sh`` installs them as
root); each helper says why it cannot run instead of pretending, and in CI (``CI=true``) a missing
tool fails the run (``missing_tool``): a green CI never hides an untested dashboard or scrape."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, NoReturn

import pytest

from safepoint.devtools.broker import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
PROMETHEUS = shutil.which("prometheus")


def missing_tool(why: str) -> NoReturn:
    """Skip for a developer without the tool; fail in CI (``CI`` set to true or 1)."""
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"{why}: CI must run this test (scripts/setup.sh installs it as root)")
    pytest.skip(why)


def browser_missing() -> str | None:
    if CHROMIUM is None or CHROMEDRIVER is None:
        return "Debian's chromium and chromium-driver are not installed (scripts/setup.sh installs them as root)"
    return None


def prometheus_missing() -> str | None:
    return None if PROMETHEUS else "Debian's prometheus is not installed (scripts/setup.sh installs it as root)"


_READ_FIGURES = """
// as WebDriver's element text: table cells apart by a space, not a tab
const text = (el) => (el.innerText || el.textContent || "").replace(/\t/g, " ");
const out = {page: text(document.body)};
for (const el of document.querySelectorAll("[data-field]")) out[el.getAttribute("data-field")] = text(el);
for (const section of document.querySelectorAll("section[data-cluster]")) {
  const name = section.getAttribute("data-cluster");
  out[name + ":"] = text(section);
  for (const el of section.querySelectorAll("[data-field], [data-axis]")) {
    out[name + ":" + (el.getAttribute("data-field") || el.getAttribute("data-axis"))] = text(el);
  }
}
return out;
"""
"""The dashboard's figures as a person sees them, read in one go (see ``dashboard_text``)."""


def dashboard_text(url: str, wait_for: list[str], screenshot: Path, timeout_s: float = 60) -> dict[str, str]:
    """Open the dashboard headless, wait until every string of ``wait_for`` is on the page, save a
    screenshot; the page's text and its ``data-field`` figures as a person sees them (also as
    ``cluster:field`` per cluster section, and ``cluster:`` for a section's whole text)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1100"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    try:
        driver.get(url)
        shown = "const el = document.getElementById('clusters'); return el ? el.innerText : '';"
        WebDriverWait(driver, timeout_s).until(lambda d: all(s in d.execute_script(shown) for s in wait_for))
        driver.save_screenshot(str(screenshot))
        # One script reads every figure: the page re-renders on each refresh, so elements found by
        # one WebDriver call may be gone (stale) by the next; a script runs between two renders.
        figures: dict[str, str] = driver.execute_script(_READ_FIGURES)
        return figures
    finally:
        driver.quit()


class Prometheus:
    """A Prometheus server on 127.0.0.1 with the scrape configuration ``config_text``."""

    def __init__(self, config_text: str, tmp: Path) -> None:
        self.port = free_port()
        config = tmp / "prometheus.yml"
        config.write_text(config_text)
        self.log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop
        self.proc = subprocess.Popen([str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
            data = json.loads(resp.read())
        assert data["status"] == "success", data
        result: list[dict[str, Any]] = data["data"]["result"]
        return result

    def value_of(self, expr: str, timeout_s: float = 60) -> float:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result = self.query(expr)
                if result:
                    return float(result[0]["value"][1])
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"Prometheus gave no sample of {expr} in {timeout_s:.0f} s: "
                                     + Path(self.log.name).read_text(errors="replace")[-2000:])
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class ExampleRun:
    """An example script run as its docs say (``command``: ``.venv/bin/python examples/X/run.py``) with
    ``--keep-running``: ``story()`` reads its output up to the dashboard's line, the page stays up
    meanwhile, and leaving the block stops it (SIGTERM, as a Ctrl-C would) and records its exit code."""

    def __init__(self, root: Path, command: list[str], port: int, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, str(root / command[1]), "--http-port", str(port),
                                      "--keep-running"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, cwd=cwd)
        self.lines: list[str] = []
        self.returncode: int | None = None

    def story(self, timeout_s: float = 420) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip())
            if line.startswith("dashboard:"):
                break
        return "\n".join(self.lines)

    def __enter__(self) -> ExampleRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.returncode = self.proc.returncode
