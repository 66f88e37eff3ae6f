"""The documentation site as a reader's browser shows it: the site is built (``mkdocs build --strict``,
the notebook executed), served on 127.0.0.1 and opened in headless Chromium (Debian's ``chromium`` and
``chromium-driver``, which .ci/run installs); the start page, the benchmark page, one API page and the
notebook must show the navigation, a working search box and their content, with no console error.
Screenshots go to ``test-artifacts/browser/`` (not committed). ``make test-browser`` runs this (about
a minute and a half); the default suite leaves it out (marker ``browser``)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "browser"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def _need(what: str, found: object) -> None:
    """Skip without the tool on a developer's machine; in CI (``CI`` set) a missing tool is a failure,
    so a missing install step cannot pass as a skip."""
    if found:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{what} is not installed (.ci/run installs it: apt-get install -y chromium chromium-driver)")
    pytest.skip(f"{what} is not installed (apt-get install chromium chromium-driver)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-4000:]
    warnings = [line for line in built.stderr.splitlines() if line.startswith("WARNING")]
    assert not warnings, warnings
    return out


@pytest.fixture(scope="module")
def server(site: Path) -> Iterator[str]:
    """The built site over HTTP (search loads its index with fetch, which file:// pages may not)."""
    handler = functools.partial(_Quiet, directory=str(site))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _need("chromium", CHROMIUM)
    _need("chromedriver", DRIVER)
    webdriver = pytest.importorskip("selenium.webdriver", reason="the docs extra: pip install -e '.[docs]'")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1000", "--hide-scrollbars"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(DRIVER)))
    driver.set_page_load_timeout(60)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def open_page(driver: Any, url: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(url)
    WebDriverWait(driver, 30).until(ec.presence_of_element_located((By.CSS_SELECTOR, "article.md-content__inner")))
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")


def console_errors(driver: Any) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def check_chrome(driver: Any) -> None:
    """What every page has: the site's navigation with the reader's sections, and the search box."""
    from selenium.webdriver.common.by import By

    nav = driver.find_element(By.CSS_SELECTOR, "nav.md-nav--primary")
    sections = nav.get_attribute("textContent")
    for section in ("Start", "The five papers", "The benchmark", "Privacy", "Beyond one machine",
                    "Writing an algorithm", "Reference"):
        assert section in sections, section
    assert driver.find_elements(By.CSS_SELECTOR, "input.md-search__input"), "no search box"


def test_start_page(browser: Any, server: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(browser, f"{server}/index.html")
    check_chrome(browser)
    text = browser.find_element(By.CSS_SELECTOR, "article").text
    assert "Federated learning when data or rounds are few" in text
    assert "best (the highest mean over seeds)" in text  # README's "what it found", from the store
    browser.save_screenshot(str(ARTIFACTS / "start.png"))
    # Search works: the index loads and a query finds the benchmark page.
    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    box.click()
    box.send_keys("benchmark")
    WebDriverWait(browser, 30).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".md-search-result__item a[href*='benchmark']"))
    browser.save_screenshot(str(ARTIFACTS / "search.png"))
    box.send_keys(Keys.ESCAPE)
    assert console_errors(browser) == []


def test_benchmark_page_shows_the_figure_before_the_table(browser: Any, server: str) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, f"{server}/benchmark.html")
    check_chrome(browser)
    figure = browser.find_element(By.CSS_SELECTOR, "img[src$='studies/benchmark-fewshot-intervals.svg']")
    assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", figure) > 0
    details = figure.find_element(By.XPATH, "following::details[1]")
    assert details.find_elements(By.CSS_SELECTOR, "table"), "the full table is not below the figure"
    assert details.get_attribute("open") is None  # collapsed until the reader opens it
    browser.execute_script("arguments[0].scrollIntoView()", figure)
    browser.save_screenshot(str(ARTIFACTS / "benchmark.png"))
    figure.screenshot(str(ARTIFACTS / "benchmark-figure.png"))
    details.find_element(By.CSS_SELECTOR, "summary").click()
    assert details.get_attribute("open") is not None
    assert console_errors(browser) == []


def test_api_page(browser: Any, server: str) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, f"{server}/reference/api.html")
    check_chrome(browser)
    ids = {e.get_attribute("id") for e in browser.find_elements(By.CSS_SELECTOR, "[id^='fedfew.']")}
    assert {"fedfew.run.runner.run_experiment", "fedfew.interface.algorithm.Algorithm",
            "fedfew.interface.records.ClientResult"} <= ids, sorted(ids)[:10]
    browser.save_screenshot(str(ARTIFACTS / "api.png"))
    assert console_errors(browser) == []


def test_notebook_page_has_its_outputs(browser: Any, server: str) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, f"{server}/notebooks/first-run.html")
    check_chrome(browser)
    text = browser.find_element(By.CSS_SELECTOR, "article").text
    assert "fl-proto: test accuracy" in text and "untrained: test accuracy" in text
    plots = [img for img in browser.find_elements(By.CSS_SELECTOR, "article img")
             if (img.get_attribute("src") or "").startswith("data:image/png")]
    assert plots, "the accuracy curve is not in the page"
    browser.execute_script("arguments[0].scrollIntoView()", plots[0])
    browser.save_screenshot(str(ARTIFACTS / "notebook.png"))
    assert console_errors(browser) == []
