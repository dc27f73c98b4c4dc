"""Build the book with warnings as errors, then read every page in headless Chromium.

For each page: a screenshot (``_build/screenshots/``), math rendered by the local
MathJax (no raw ``\\(`` left), every image loaded, every internal link and anchor
resolving, and nothing fetched from outside the book.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"

pytestmark = [pytest.mark.slow, pytest.mark.browser]

#: pages and what each must at least contain: (figures, math expressions)
PAGES = {
    "book/intro.html": (0, 0),
    "book/notation.html": (0, 5),
    "book/ch01_attention.html": (4, 10),
    "book/ch02_multihead.html": (5, 10),
    "book/ch03_positional.html": (6, 10),
    "book/ch04_layers.html": (6, 10),
    "book/ch05_bpe.html": (2, 5),
    "book/ch06_bert.html": (2, 10),
    "book/ch07_gpt.html": (3, 5),
}


#: Console messages of the toolchain itself, harmless to readers; anything else fails a page.
KNOWN_CONSOLE_NOISE = (
    "favicon.ico",  # the browser asks for one; the book has none
    "THEBE_JS_URL",  # Jupyter Book 1 injects sphinx-thebe's settings script twice; thebe is not used
    "Got invalid theme mode",  # pydata-sphinx-theme on a first visit with empty localStorage
)


@pytest.fixture(scope="module")
def book():
    """Build the book (cached execution) exactly as the README does; fail on any warning."""
    subprocess.run([str(ROOT / "scripts" / "install_mathjax.sh")], check=True, cwd=ROOT)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    run = subprocess.run(
        [str(Path(sys.executable).parent / "jupyter-book"), "build", ".", "-W", "-n", "--keep-going"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert run.returncode == 0, f"book build failed:\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    return HTML


@pytest.fixture(scope="module")
def server(book):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(book))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        pytest.fail("headless Chromium is needed: run scripts/system_deps.sh (apt-get install chromium chromium-driver)")
    profile = tempfile.mkdtemp(prefix="chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                 f"--user-data-dir={profile}", "--window-size=1280,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def test_every_built_page_is_checked(book):
    built = {str(p.relative_to(book)) for p in (book / "book").glob("*.html")}
    assert built == set(PAGES), "add new pages to PAGES with their expected content"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_renders(page, server, browser):
    min_images, min_math = PAGES[page]
    url = urljoin(server, page)
    browser.get(url)
    # wait until MathJax has typeset the page (it is loaded on every page)
    state = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "if (!window.MathJax || !MathJax.startup) { done('no MathJax'); return; }"
        "MathJax.startup.promise.then(() => done('ok'), e => done('error: ' + e));"
    )
    assert state == "ok", f"{page}: MathJax did not run ({state})"
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / (page.replace("/", "_").removesuffix(".html") + ".png")))

    text = browser.execute_script("return document.querySelector('main').innerText")
    for raw in ("\\(", "\\)", "\\[", "$$"):
        assert raw not in text, f"{page}: raw math {raw!r} left in the text"
    math = browser.execute_script("return [...document.querySelectorAll('.math')].map(e => !!e.querySelector('mjx-container'))")
    assert all(math), f"{page}: {math.count(False)} math expressions were not typeset"
    assert len(math) >= min_math, f"{page}: expected at least {min_math} math expressions, found {len(math)}"

    images = browser.execute_script(
        "return [...document.querySelectorAll('main img')].map(i => [i.src, i.complete && i.naturalWidth > 0])"
    )
    broken = [src for src, ok in images if not ok]
    assert not broken, f"{page}: images that did not load: {broken}"
    assert len(images) >= min_images, f"{page}: expected at least {min_images} figures, found {len(images)}"

    resources = browser.execute_script("return performance.getEntriesByType('resource').map(r => r.name)")
    outside = [r for r in resources if not r.startswith(server)]
    assert not outside, f"{page}: fetched from outside the book: {outside}"
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE" and not any(k in e["message"] for k in KNOWN_CONSOLE_NOISE)]
    assert not errors, f"{page}: console errors: {errors}"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_internal_links_resolve(page, book):
    html = (book / page).read_text()
    for href in re.findall(r'href="([^"]+)"', html):
        parsed = urlparse(href)
        if parsed.scheme or href.startswith(("mailto:", "//")):
            continue
        target = (book / page).parent / unquote(parsed.path) if parsed.path else book / page
        target = target.resolve()
        if target.is_dir():
            target = target / "index.html"
        assert target.is_file(), f"{page}: broken link {href}"
        if parsed.fragment and target.suffix == ".html":
            ids = set(re.findall(r'id="([^"]+)"', target.read_text()))
            assert unquote(parsed.fragment) in ids, f"{page}: link {href} points to a missing anchor"


@pytest.mark.parametrize("code,fails", [("print('fine')", False), ("raise ValueError('this cell fails')", True)])
def test_a_failing_cell_fails_the_build(tmp_path, code, fails):
    """With the book's own _config.yml, an exception in a page's code is an error, not a warning
    (and the same page without it builds, so the failure is the cell's)."""
    shutil.copy(ROOT / "_config.yml", tmp_path)
    (tmp_path / "_vendor").mkdir()
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: page\n")
    (tmp_path / "page.md").write_text(
        "---\njupytext:\n  text_representation:\n    format_name: myst\n"
        "kernelspec:\n  name: python3\n  display_name: Python 3\n---\n\n# A page\n\n"
        f"```{{code-cell}} ipython3\n{code}\n```\n"
    )
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    run = subprocess.run(
        [str(Path(sys.executable).parent / "jupyter-book"), "build", ".", "-W", "-n", "--keep-going"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert (run.returncode != 0) == fails, run.stdout[-3000:]
    assert ("this cell fails" in run.stdout + run.stderr) == fails
