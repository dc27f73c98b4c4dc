"""Build the book with warnings as errors, then read every page in headless Chromium.

For each page: a screenshot (``_build/screenshots/``), math rendered by the local
MathJax (no raw ``\\(`` left), every image loaded, every internal link and anchor
resolving, and nothing fetched from outside the book; at a phone's width (390 px) nothing
makes the page wider than the screen (a second screenshot, ``_build/screenshots/phone/``).
Each chapter offers its exercise notebook for download and each exercise links its page;
every paper in ``references.bib`` is cited; launch buttons appear only with a repository URL.

The README shows ``docs/book.png``, a screenshot this test takes: a screenshot is not
byte-reproducible (fonts, antialiasing), so the test only checks that the committed file is a
PNG of the size it would take now, and rewrites it when ``UPDATE_BOOK_SCREENSHOT=1`` is set.
"""

from __future__ import annotations

import collections
import functools
import http.server
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest

from tests import book_build

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
README_SHOT = ROOT / "docs" / "book.png"
#: the README's screenshot: this page, scrolled to its first figure, at the browser's desktop size
README_PAGE = "book/ch01_attention.html"
PHONE = (390, 844)  # CSS pixels, a common phone
DESKTOP = (1280, 1000)

pytestmark = [pytest.mark.slow, pytest.mark.browser]

#: pages and what each must at least contain: (figures, math expressions)
PAGES = {
    "book/intro.html": (1, 0),
    "book/notation.html": (0, 5),
    "book/ch01_attention.html": (4, 10),
    "book/ch02_multihead.html": (5, 10),
    "book/ch03_positional.html": (6, 10),
    "book/ch04_layers.html": (6, 10),
    "book/ch04_modern_layers.html": (2, 10),
    "book/ch05_bpe.html": (2, 5),
    "book/ch06_bert.html": (2, 10),
    "book/ch07_gpt.html": (3, 5),
    "book/ch08_seq2seq.html": (3, 5),
    "book/ch09_vit.html": (3, 5),
    "book/ch10_long_context.html": (4, 10),
    "book/appendix_arithmetic.html": (2, 10),
    "book/appendix_parallelism.html": (3, 3),
    "book/appendix_performance.html": (3, 2),
    "book/glossary.html": (0, 20),
    "book/bibliography.html": (0, 0),
}


#: Console messages of the toolchain itself, harmless to readers; anything else fails a page.
KNOWN_CONSOLE_NOISE = (
    "favicon.ico",  # the browser asks for one; the book has none
    "THEBE_JS_URL",  # Jupyter Book 1 injects sphinx-thebe's settings script twice; thebe is not used
    "Got invalid theme mode",  # pydata-sphinx-theme on a first visit with empty localStorage
)


def jupyter_book(folder: Path, *options: str, edition: str = "student", timeout: int = 1200):
    """``jupyter-book build . -W -n --keep-going [options]`` in ``folder``, as the README runs it."""
    return subprocess.run(
        book_build.command(*options),
        cwd=folder,
        env=book_build.environment(edition),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def book():
    """The book built exactly as the README does, failing on any warning: the build the session
    started in the background (``tests/book_build.py``), waited for here."""
    code, output = book_build.start().wait()
    assert code == 0, f"book build failed:\n{output}"
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
        pytest.fail(
            "headless Chromium is needed: run scripts/system_deps.sh (apt-get install chromium chromium-driver)"
        )
    profile = tempfile.mkdtemp(prefix="chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
        f"--user-data-dir={profile}",
        "--window-size={},{}".format(*DESKTOP),
    ):
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
    state = load(browser, url)  # waits until MathJax has typeset the page
    assert state == "ok", f"{page}: MathJax did not run ({state})"
    record_sideways(browser, DESKTOP, page)
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / (page.replace("/", "_").removesuffix(".html") + ".png")))

    text = browser.execute_script("return document.querySelector('main').innerText")
    for raw in ("\\(", "\\)", "\\[", "$$"):
        assert raw not in text, f"{page}: raw math {raw!r} left in the text"
    math = browser.execute_script(
        "return [...document.querySelectorAll('.math')].map(e => !!e.querySelector('mjx-container'))"
    )
    assert all(math), f"{page}: {math.count(False)} math expressions were not typeset"
    spoken = browser.execute_script(
        "return [...document.querySelectorAll('.math mjx-container')]"
        ".map(e => !!e.querySelector('mjx-assistive-mml math'))"
    )
    assert all(spoken), f"{page}: {spoken.count(False)} equations have no MathML for screen readers"
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
    errors = [
        e["message"]
        for e in browser.get_log("browser")
        if e["level"] == "SEVERE" and not any(k in e["message"] for k in KNOWN_CONSOLE_NOISE)
    ]
    assert not errors, f"{page}: console errors: {errors}"
    assert not figure_problems(browser, page), f"{page}: {figure_problems(browser, page)}"
    record_axe(browser, page)  # last: what axe adds to the page is read by no check above


#: axe-core's serious and critical violations on each page, page -> lines: test_page_renders runs axe
#: on the page it loaded, so that test_page_has_no_serious_accessibility_violation loads a page again
#: only where that test did not get that far (run alone, or after a failure); a load typesets every
#: equation: Chromium took 55 CPU-seconds to load the 18 pages at 1280 px, and axe 77 to check them
_AXE_SEEN: dict[str, list[str]] = {}


def record_axe(browser, page: str) -> None:
    """Run axe-core (WCAG 2.1 A and AA) on ``page``, loaded and typeset, once its fonts are in."""
    from tests.browser import axe_violations

    browser.execute_script("return document.fonts.ready")
    _AXE_SEEN[page] = axe_violations(browser)
    # axe reads the page's stylesheets again, resolving an @import against the page rather than its
    # stylesheet (a 404 for /basic.css): its console messages are its own, not the next page's
    browser.get_log("browser")


def test_the_sidebars_toggles_get_a_name_and_headings_keep_theirs(monkeypatch):
    """What the theme writes for a page with sections (a link, then a summary holding only a chevron)
    gets a label naming the page; a section heading's summary, which holds its text, is left alone."""
    monkeypatch.syspath_prepend(str(ROOT / "_ext"))
    from course_book import name_toggles

    chevron = (
        '<span class="toctree-toggle" role="presentation"><i class="fa-solid fa-chevron-down"></i></span>'
    )
    html = (
        '<ul><li class="toctree-l1 has-children"><a class="reference internal" href="ch04.html">4. Layers</a>'
        f"<details><summary>{chevron}</summary><ul><li>4.1</li></ul></details></li>"
        f'<li class="has-children"><details><summary><p class="caption">Part I</p>{chevron}</summary>'
        "</details></li></ul>"
    )
    out = name_toggles(html)
    assert out.count("aria-label") == 1
    assert 'aria-label="Show or hide the sections of 4. Layers"' in out
    assert name_toggles(out) == out
    from bs4 import BeautifulSoup  # what the theme hands its template: labelled in place

    soup = BeautifulSoup(html, "html.parser")
    assert name_toggles(soup) is soup and str(soup) == out


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_has_no_serious_accessibility_violation(page, server, browser):
    """No serious or critical violation of axe-core's WCAG 2.1 A and AA rules, at the desktop's size
    with every equation typeset (as readers and their screen readers get it). The checker is first
    shown to find the faults it must on a page made to have them: tests/test_accessibility.py."""
    if page not in _AXE_SEEN:
        assert load(browser, urljoin(server, page)) == "ok", page
        record_axe(browser, page)
    assert _AXE_SEEN[page] == [], f"{page}: " + "\n".join(_AXE_SEEN[page])


#: each image in the page: its address, alt text, figure caption (None outside a figure), shown width
FIGURES = """
return [...document.querySelectorAll('main img')].map(i => {
  const f = i.closest('figure'), c = f && f.querySelector('figcaption');
  return [i.getAttribute('src'), i.alt || '', c ? c.innerText.trim() : null, i.getBoundingClientRect().width];
});
"""


def figure_problems(browser, page: str) -> list[str]:
    """A figure without a caption or alt text, not SVG, or with text under 9 CSS px as shown now."""
    from coursekit.booklint import MIN_TEXT_PX, svg_text_sizes

    problems = []
    for src, alt, caption, shown in browser.execute_script(FIGURES):
        name = src.rsplit("/", 1)[-1]
        if caption is None or len(caption.split()) < 6:
            problems.append(f"{name}: no caption saying what to see")
        if len(alt.split()) < 6 or name in alt:
            problems.append(f"{name}: no alt text describing it (alt={alt[:40]!r})")
        if not name.endswith(".svg"):
            problems.append(f"{name}: not SVG, so its text size cannot be checked")
            continue
        width, sizes = svg_text_sizes((HTML / Path(page).parent / unquote(src)).resolve().read_text())
        small = sorted(
            (size * shown / width, words) for size, words in sizes if size * shown / width < MIN_TEXT_PX
        )
        if small:
            problems.append(
                f"{name}: {len(small)} labels under {MIN_TEXT_PX:g} px at {shown:.0f} px wide, "
                f"the smallest {small[0][0]:.1f} px ({small[0][1][:30]!r})"
            )
    return problems


def test_figure_checks_catch_a_small_label_a_missing_caption_and_a_raster_image(server, browser, tmp_path):
    """The figure checks on a page made for the purpose: each fault is reported, a good figure is not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from coursekit import viz

    folder = HTML / "_figure_check"
    folder.mkdir(exist_ok=True)
    try:
        with plt.style.context(viz.BOOK_STYLE):
            for name, width in (("good", 5.5), ("wide", 12)):
                fig, ax = plt.subplots(figsize=(width, 3))
                ax.plot([3, 2, 1])
                ax.set_xlabel("step")
                fig.savefig(folder / f"{name}.svg")
                plt.close(fig)
        (folder / "dot.png").write_bytes((ROOT / "docs" / "book.png").read_bytes())
        words = "a line that falls and then flattens out"
        (folder / "page.html").write_text(
            "<html><body><main>"
            # both shown at a phone's column width: 11.5 pt on 5.5 in stays legible there, on 12 in it does not
            f"<figure><img style='width:327px' src='good.svg' alt='{words}'><figcaption>{words}</figcaption></figure>"
            f"<figure><img style='width:327px' src='wide.svg' alt='{words}'><figcaption>{words}</figcaption></figure>"
            f"<img src='dot.png' alt='dot.png'>"
            "</main></body></html>"
        )
        browser.get(urljoin(server, "_figure_check/page.html"))
        problems = figure_problems(browser, "_figure_check/page.html")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert not [p for p in problems if p.startswith("good.svg")]
    assert any(p.startswith("wide.svg") and "under 9 px" in p for p in problems)
    assert {p.split(":")[1].strip().split(",")[0] for p in problems if p.startswith("dot.png")} == {
        "no caption saying what to see",
        "no alt text describing it (alt='dot.png')",
        "not SVG",
    }


@pytest.mark.parametrize("page", sorted(p for p in PAGES if p.startswith("book/ch") or "appendix" in p))
def test_executed_pages_figures_are_legible_and_captioned(page, book):
    """The same checks on the executed notebooks of the build, at a phone's column width."""
    import nbformat

    from coursekit.booklint import figure_problems as notebook_figure_problems

    executed = ROOT / "_build" / "jupyter_execute" / page.replace(".html", ".ipynb")
    problems = notebook_figure_problems(nbformat.read(executed, as_version=4), Path(page).stem)
    assert not problems, "\n".join(problems)


def load(browser, url):
    """Open a page and wait until MathJax has typeset it; return MathJax's state. Sphinx loads
    MathJax on every page with math (and on the root page); a page without any may lack it."""
    browser.get(url)
    return browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "if (!window.MathJax || !MathJax.startup) {"
        " done(document.querySelector('.math') ? 'no MathJax' : 'ok'); return; }"
        "MathJax.startup.promise.then(() => done('ok'), e => done('error: ' + e));"
    )


#: elements that stick out to the right of the viewport without a scrolling box of their own
OVERFLOWING = """
const W = document.documentElement.clientWidth, out = [];
for (const e of document.querySelectorAll('main *')) {
  const r = e.getBoundingClientRect();
  if (r.width === 0 || r.right <= W + 0.5) continue;
  let p = e.parentElement, contained = false;
  for (; p; p = p.parentElement) {
    const o = getComputedStyle(p).overflowX;
    if (o !== 'visible' && p.getBoundingClientRect().right <= W + 0.5) { contained = true; break; }
  }
  if (!contained) {
    const classes = e.className && e.className.baseVal === undefined
      ? '.' + e.className.trim().split(/\\s+/).join('.') : '';
    out.push(e.tagName.toLowerCase() + classes + ': ' + (e.textContent || '').trim().slice(0, 60));
  }
}
return out.slice(0, 10);
"""


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_fits_a_phone(page, server, browser):
    """At 390 px, no page is wider than the screen: wide tables, code, math and figures scroll
    inside their own boxes (see _ext/static/course.css)."""
    browser.set_window_size(*PHONE)
    try:
        state = load(browser, urljoin(server, page))
        assert state == "ok", f"{page}: MathJax did not run ({state})"
        record_sideways(browser, PHONE, page)
        (SHOTS / "phone").mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(
            str(SHOTS / "phone" / (page.replace("/", "_").removesuffix(".html") + ".png"))
        )
        inner, client, scroll = browser.execute_script(
            "return [window.innerWidth, document.documentElement.clientWidth, document.documentElement.scrollWidth]"
        )
        assert inner <= PHONE[0], f"the window did not shrink to a phone's width ({inner} px)"
        assert scroll <= client, (
            f"{page}: {scroll} px wide on a {client} px screen; sticking out: "
            f"{browser.execute_script(OVERFLOWING)}"
        )
        assert not figure_problems(browser, page), f"{page} on a phone: {figure_problems(browser, page)}"
    finally:
        browser.set_window_size(*DESKTOP)


#: per kind of block, those that only fit by scrolling sideways in their own box (or any box
#: around them): [kind, the text it starts with, its width, the width it is shown in]
SIDEWAYS = """
const kinds = {
  equation: 'main mjx-container[display="true"]',
  table: 'main table',
  output: 'main .cell_output pre, main div.output pre',
};
const out = [];
for (const [kind, selector] of Object.entries(kinds)) {
  for (const e of document.querySelectorAll(selector)) {
    for (let p = e; p && p.tagName !== 'MAIN'; p = p.parentElement) {
      if (p.scrollWidth > p.clientWidth + 1 && getComputedStyle(p).overflowX !== 'visible') {
        out.push([kind, (e.textContent || '').trim().slice(0, 50), p.scrollWidth, p.clientWidth]);
        break;
      }
    }
  }
}
return out;
"""


#: what :data:`SIDEWAYS` found on a page at a window size, (size, page) -> its rows: the tests that
#: load every page at the desktop's and the phone's size record it, so that the checks over all
#: pages below load a page again only where no test has (run alone, or after a failed load)
_SIDEWAYS_SEEN: dict[tuple[tuple[int, int], str], list] = {}


def record_sideways(browser, size: tuple[int, int], page: str) -> None:
    """Run :data:`SIDEWAYS` on ``page``, loaded and typeset at window ``size``, and keep its rows."""
    _SIDEWAYS_SEEN[size, page] = browser.execute_script(SIDEWAYS)


def sideways(server, browser, size, kinds) -> dict[str, list[str]]:
    """Over every page at window ``size``: for each of ``kinds``, the blocks that scroll sideways."""
    found: dict[str, list[str]] = {kind: [] for kind in kinds}
    browser.set_window_size(*size)
    try:
        for page in sorted(PAGES):
            if (size, page) not in _SIDEWAYS_SEEN:
                assert load(browser, urljoin(server, page)) == "ok", page
                record_sideways(browser, size, page)
            for kind, text, wide, shown in _SIDEWAYS_SEEN[size, page]:
                if kind in found:
                    found[kind].append(f"{page}: {wide} px in {shown}: {text!r}")
    finally:
        browser.set_window_size(*DESKTOP)
    return found


def test_the_sideways_check_finds_a_wide_output_and_a_wide_table_and_passes_a_narrow_one(server, browser):
    """:data:`SIDEWAYS` on a page made for the purpose: the blocks that only fit by scrolling in
    their box are reported with their kind, a block that fits is not."""
    folder = HTML / "_sideways_check"
    folder.mkdir(exist_ok=True)
    try:
        (folder / "page.html").write_text(
            "<html><body><main>"
            f"<div class='cell_output'><pre style='overflow-x:auto'>wide {'x' * 400}</pre></div>"
            "<div style='overflow-x:auto'><table><tr>"
            f"<td style='white-space:nowrap'>long {'column ' * 300}</td></tr></table></div>"
            "<div class='cell_output'><pre style='overflow-x:auto'>short</pre></div>"
            "</main></body></html>"
        )
        browser.get(urljoin(server, "_sideways_check/page.html"))
        rows = browser.execute_script(SIDEWAYS)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert sorted((kind, text.split()[0]) for kind, text, _, _ in rows) == [
        ("output", "wide"),
        ("table", "long"),
    ]
    assert all(wide > shown for _, _, wide, shown in rows)


def test_no_equation_or_table_scrolls_sideways_on_a_desktop(server, browser):
    """A block that only fits by scrolling sideways reads as cut off (no scroll bar shows until
    one scrolls): at 1280 px, no display equation or table of any page does (break a long
    equation into lines with ``gathered`` or ``aligned``; shorten a table's columns)."""
    found = sideways(server, browser, DESKTOP, ("equation", "table"))
    assert found == {"equation": [], "table": []}, found


def test_printed_outputs_and_equations_fit_without_scrolling(server, browser):
    """At 1280 px at most 5 printed outputs scroll sideways (a printed line holds about 76
    characters there: narrow tables, wrap lists), and at 390 px at most 5 display equations
    (MathJax 4 breaks a long one into lines; `_config.yml` asks it to)."""
    outputs = sideways(server, browser, DESKTOP, ("output",))["output"]
    equations = sideways(server, browser, PHONE, ("equation",))["equation"]
    print(f"{len(outputs)} outputs scroll at {DESKTOP[0]} px, {len(equations)} equations at {PHONE[0]} px")
    assert len(outputs) <= 5, "\n".join(outputs)
    assert len(equations) <= 5, "\n".join(equations)


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG file (ValueError if it is not one)."""
    head = path.read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG file")
    return struct.unpack(">II", head[16:24])


def test_readme_screenshot(server, browser):
    """docs/book.png, shown by the README, is a screenshot of the built book at the browser's
    desktop size; `UPDATE_BOOK_SCREENSHOT=1 pytest tests/test_book.py -k readme` retakes it."""
    state = load(browser, urljoin(server, README_PAGE))
    assert state == "ok", f"{README_PAGE}: MathJax did not run ({state})"
    browser.execute_script(
        "const f = document.querySelector('main img'); if (f) f.scrollIntoView({block: 'center'});"
    )
    shot = browser.get_screenshot_as_png()
    if os.environ.get("UPDATE_BOOK_SCREENSHOT"):
        README_SHOT.parent.mkdir(exist_ok=True)
        README_SHOT.write_bytes(shot)
    assert README_SHOT.is_file(), "docs/book.png is missing: run with UPDATE_BOOK_SCREENSHOT=1"
    size = png_size(README_SHOT)
    assert size == struct.unpack(">II", shot[16:24]), (
        f"docs/book.png is {size[0]}x{size[1]}, a screenshot now is another size: retake it with "
        "UPDATE_BOOK_SCREENSHOT=1"
    )
    assert f"({README_SHOT.relative_to(ROOT)})" in (ROOT / "README.md").read_text(), (
        "the README does not show docs/book.png"
    )


#: chapter pages and their exercises: every exercises/NAME/NAME.ipynb goes with book/NAME.md
EXERCISES = sorted(p.name for p in (ROOT / "exercises").iterdir() if (p / f"{p.name}.ipynb").is_file())


def graded_bodies_shown(folder: Path) -> dict[str, list[str]]:
    """Every graded body (``coursekit.graded``) that a page or download under ``folder`` shows:
    file -> the graded definitions found, compared as normalised syntax trees. Code is read from
    HTML ``<pre>`` blocks, notebook code cells and outputs, and the code fences of Markdown."""
    import html as html_module
    import json

    from coursekit.graded import bodies_in

    def blocks(path: Path) -> list[str]:
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".html":
            pres = re.findall(r"<pre[^>]*>(.*?)</pre>", text, re.S)
            return [html_module.unescape(re.sub(r"<[^>]+>", "", b)) for b in pres]
        if path.suffix == ".ipynb":
            cells = json.loads(text).get("cells", [])
            out = ["".join(c.get("source", "")) for c in cells]
            for c in cells:
                for o in c.get("outputs", []):
                    out.append("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")))
            return out
        if path.suffix in (".md", ".txt", ".py"):
            return [text, *re.findall(r"```[^\n]*\n(.*?)```", text, re.S)]
        return []

    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            names = sorted({g.name for b in blocks(path) for g in bodies_in(b).values()})
            if names:
                found[str(path.relative_to(folder))] = names
    return found


def test_the_body_check_finds_a_body_printed_in_a_page_or_download(tmp_path):
    """The student-edition check below fails when it should: a graded body, syntax-highlighted in a
    page, pasted into a downloaded notebook or a Markdown fence, reformatted, is found."""
    import ast
    import html as html_module
    import inspect

    import nbformat

    from coursekit import attention, multihead

    body = inspect.getsource(attention.softmax)
    spans = "".join(f'<span class="n">{html_module.escape(line)}</span>\n' for line in body.splitlines())
    (tmp_path / "page.html").write_text(f'<div class="highlight"><pre><span></span>{spans}</pre></div>')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(inspect.getsource(multihead.split_heads))])
    nbformat.write(nb, tmp_path / "page.ipynb")
    # as ast.unparse writes it (other quotes, other line breaks), with comments and blank lines
    unparsed = ast.unparse(ast.parse(inspect.getsource(attention.causal_mask))).splitlines()
    reformatted = "".join(
        f"{line}  # note\n\n" if line.rstrip().endswith(":") else f"{line}\n" for line in unparsed
    )
    (tmp_path / "notes.md").write_text(f"Some text.\n\n```python\n{reformatted}```\n")
    (tmp_path / "clean.html").write_text("<pre>def softmax(x, dim=-1):\n    ...</pre>")
    assert graded_bodies_shown(tmp_path) == {
        "notes.md": ["causal_mask"],
        "page.html": ["softmax"],
        "page.ipynb": ["split_heads"],
    }


def test_the_student_edition_shows_no_graded_body(book):
    """No page or download of the student edition (what ``make book`` builds) shows the body of a
    function or method that an exercise grades; each is shown as its contract instead."""
    assert graded_bodies_shown(book) == {}
    contracts = sum(p.read_text().count('class="graded-contract"') for p in (book / "book").glob("*.html"))
    assert contracts >= 40, contracts  # the pages do show the graded definitions, as contracts


def test_the_instructor_edition_builds_and_shows_the_code(book):
    """``make book-instructor``: the same source with COURSEKIT_EDITION=instructor builds with
    warnings as errors (reusing the student edition's executed notebooks) and shows the bodies."""
    out = ROOT / "_build" / "instructor"
    run = jupyter_book(ROOT, "--path-output", str(out), edition="instructor")
    assert run.returncode == 0, f"instructor edition failed:\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    shown = graded_bodies_shown(out / "_build" / "html" / "book")
    withheld = {
        p.name: p.read_text().count('class="graded-contract"') for p in (book / "book").glob("*.html")
    }
    for page, count in withheld.items():
        if count:
            assert page in shown, f"{page}: the instructor edition does not show the graded code"
    assert "graded-contract" not in "".join(
        p.read_text() for p in (out / "_build" / "html" / "book").glob("*.html")
    )


@pytest.mark.parametrize("name", EXERCISES)
def test_chapter_offers_its_exercise(name, book):
    """The page ends with an Exercise box whose link downloads the student notebook itself, and
    its download menu offers the page as .md and as the executed .ipynb."""
    page = book / "book" / f"{name}.html"
    html = page.read_text()
    boxes = re.findall(
        r'<div class="(?=[^"]*\badmonition\b)(?=[^"]*\bexercise\b)[^"]*">(.*?)</div>', html, re.S
    )
    assert boxes, f"{name}: no Exercise box (:::{{admonition}} Exercise / :class: tip exercise)"
    links = re.findall(r'href="(\.\./_downloads/[0-9a-f]+/' + name + r'\.ipynb)"', boxes[-1])
    assert links, f"{name}: the Exercise box does not offer {name}.ipynb for download"
    downloaded = (page.parent / links[0]).resolve()
    assert downloaded.read_bytes() == (ROOT / "exercises" / name / f"{name}.ipynb").read_bytes(), (
        f"{name}: the downloaded notebook is not the student release"
    )
    assert (downloaded.parent / f"../../book/{name}.html").resolve() == page.resolve(), (
        f"{name}: from the downloaded notebook, ../../book/{name}.html is not the chapter"
    )
    for source in (f"../_sources/book/{name}.md", f"../_sources/book/{name}.ipynb"):
        assert f'href="{source}"' in html, f"{name}: the download menu does not offer {source}"
        assert (page.parent / source).resolve().is_file()


@pytest.mark.parametrize("name", EXERCISES)
def test_exercise_links_its_page(name):
    """The student notebook's first cell links the rendered page it goes with: relative to where
    the book's Exercise box puts it (``_downloads/<hash>/``) while ``html.baseurl`` is unset."""
    import nbformat

    from coursekit.course import book_url

    intro = nbformat.read(ROOT / "exercises" / name / f"{name}.ipynb", as_version=4).cells[0]
    base = book_url(ROOT)
    target = f"{base}/book/{name}.html" if base else f"../../book/{name}.html"
    assert f"]({target})" in intro.source, f"{name}: the intro cell does not link {target}"
    assert ".md)" not in intro.source, f"{name}: the intro cell links a MyST source"
    assert (ROOT / "book" / f"{name}.md").is_file()


def test_release_links_the_published_book_when_its_address_is_set(tmp_path):
    import nbformat

    from coursekit.course import link_the_rendered_book

    for base, link in (("https://example.org/course", "https://example.org/course/book"), ("", "../../book")):
        nb = nbformat.v4.new_notebook(
            cells=[nbformat.v4.new_markdown_cell("See [Chapter 1](../../book/ch01_attention.md#the-code).")]
        )
        assert link_the_rendered_book(nb, base)
        assert nb.cells[0].source == f"See [Chapter 1]({link}/ch01_attention.html#the-code)."
        assert not link_the_rendered_book(nb, base)  # a second pass changes nothing


def test_every_reference_is_cited():
    """references.bib holds the papers the pages cite, no more and no fewer (a key missing from it
    fails the build)."""
    keys = set(re.findall(r"^@\w+\{([^,\s]+),", (ROOT / "references.bib").read_text(), re.M))
    cited = set()
    for page in (ROOT / "book").glob("*.md"):
        for roles in re.findall(r"\{cite:[a-z]+\}`([^`]+)`", page.read_text()):
            cited |= {re.sub(r"\{[^}]*\}", "", key).strip() for key in roles.split(",")}
    assert not cited - keys, f"cited but not in references.bib: {sorted(cited - keys)}"
    assert not keys - cited, f"in references.bib but cited by no page: {sorted(keys - cited)}"


def test_no_two_references_read_alike_in_the_text(monkeypatch):
    """The text cites by author and year, so two papers by the same authors in one year carry
    "2023a" and "2023b" in their year fields; the bibliography's labels alone would not tell the
    reader which one a sentence means."""
    monkeypatch.syspath_prepend(str(ROOT / "_ext"))
    from course_book import AuthorYearLabels
    from pybtex.database import parse_file

    entries = parse_file(str(ROOT / "references.bib")).entries
    by_label = collections.defaultdict(list)
    for key, entry in entries.items():
        by_label[AuthorYearLabels.format_label(entry)].append(key)
    alike = {label: keys for label, keys in by_label.items() if len(keys) > 1}
    assert not alike, f"cited alike in the text: {alike}"


def test_launch_buttons_follow_the_repository_url(book):
    """Without repository.url no page has a launch button (Jupyter Book would link its own
    repository); with it, Binder opens the page from that repository."""
    import yaml

    url = (yaml.safe_load((ROOT / "_config.yml").read_text()).get("repository") or {}).get("url") or ""
    pages = {page: (book / page).read_text() for page in PAGES}
    assert not any("executablebooks/jupyter-book" in html for html in pages.values())
    launch = {
        page: re.findall(
            r'href="(https://mybinder\.org/v2/[^"]+|https://colab\.research\.google\.com/[^"]+)"', html
        )
        for page, html in pages.items()
    }
    if not url:
        assert not any(launch.values()), f"launch buttons without a repository URL: {launch}"
    else:
        org_repo = "/".join(url.rstrip("/").split("/")[-2:])
        assert any(f"/v2/gh/{org_repo}/" in link for links in launch.values() for link in links), launch


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


@pytest.mark.parametrize("page", sorted(PAGES))
def test_no_myst_is_left_unparsed(page, book):
    """A fence, role or label the build did not parse prints as text and passes ``-W`` (a table
    whose caption held a role did, and the cell after it never ran): the built page holds none."""
    from coursekit.booklint import raw_markup

    assert raw_markup((book / page).read_text()) == []


def one_page_book(folder: Path, body: str):
    """Build, with the book's own configuration and extension, a book of one page whose MyST
    source after its heading is ``body``."""
    shutil.copy(ROOT / "_config.yml", folder)
    shutil.copy(ROOT / "references.bib", folder)
    shutil.copytree(ROOT / "_ext", folder / "_ext", ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "_vendor").mkdir()
    (folder / "_toc.yml").write_text("format: jb-book\nroot: page\n")
    (folder / "page.md").write_text(
        "---\njupytext:\n  text_representation:\n    format_name: myst\n"
        "kernelspec:\n  name: python3\n  display_name: Python 3\n---\n\n# A page\n\n" + body
    )
    return jupyter_book(folder, timeout=600)


def test_pages_show_their_code_without_glue_calls(tmp_path):
    """``glue(...)`` is the page's bookkeeping: a code cell is shown without it (and without the
    import of ``glue``), a cell that only glues (a loop of glue calls included) shows no code, and
    the glued numbers are in the prose."""
    run = one_page_book(
        tmp_path,
        "```{code-cell} ipython3\nfrom myst_nb import glue\n\nanswer = 6 * 7\n"
        'glue("answer", answer,\n     display=False)\nprint("the answer is", answer)\n```\n\n'
        '```{code-cell} ipython3\nglue("half", answer / 2, display=False)\n'
        'for k in (2, 3):\n    glue(f"times{k}", k * answer, display=False)\n```\n\n'
        "The answer is {glue:text}`answer` and half of it {glue:text}`half:.1f`; thrice, "
        "{glue:text}`times3`.\n",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    html = (tmp_path / "_build" / "html" / "page.html").read_text()
    inputs = re.findall(r'<div class="cell_input[^"]*"[^>]*>(.*?)</div>\s*</div>', html, re.S)
    shown = re.sub(r"<[^>]+>", "", "".join(inputs))
    assert "answer" in shown and "print" in shown, shown
    assert "glue" not in shown, shown
    assert len(inputs) == 1  # the cell that only glued shows no code
    assert "The answer is 42 and half of it 21.0; thrice, 126." in re.sub(r"<[^>]+>", "", html)


def test_glue_calls_are_hidden_at_any_depth(monkeypatch):
    """A glue call inside a loop that also computes and prints goes alone; a loop that only glues,
    with the key it names for the glue, goes whole; a value the rest of the cell reads stays."""
    monkeypatch.syspath_prepend(str(ROOT / "_ext"))
    from course_book import without_glue

    printing = (
        "for name, x in (('a', 1), ('b', 2)):\n"
        "    y = 2 * x\n"
        "    glue(f'k_{name}', y, display=False)\n"
        "    print(name, y)\n"
    )
    assert without_glue(printing) == "for name, x in (('a', 1), ('b', 2)):\n    y = 2 * x\n    print(name, y)"
    only_glue = (
        "runs = {0.1: 2}\n"
        "print(runs)\n"
        "for alpha, load in runs.items():\n"
        "    tag = f'{alpha:g}'.replace('.', '')\n"
        "    glue(f'busiest_{tag}', load, display=False)\n"
        "    for k in (1, 2):\n"
        "        glue(f'k{k}_{tag}', k * load, display=False)\n"
    )
    assert without_glue(only_glue) == "runs = {0.1: 2}\nprint(runs)"
    read_later = "for k in range(3):\n    last = 2 * k\n    glue(f't{k}', last)\nprint(last)\n"
    assert without_glue(read_later) == "for k in range(3):\n    last = 2 * k\nprint(last)"
    lone = "if True:\n    glue('x', 1)\n"
    assert without_glue(lone) == lone  # never an empty block


@pytest.mark.parametrize(
    "code,fails", [("print('fine')", False), ("raise ValueError('this cell fails')", True)]
)
def test_a_failing_cell_fails_the_build(tmp_path, code, fails):
    """With the book's own _config.yml, an exception in a page's code is an error, not a warning
    (and the same page without it builds, so the failure is the cell's)."""
    run = one_page_book(tmp_path, f"```{{code-cell}} ipython3\n{code}\n```\n")
    assert (run.returncode != 0) == fails, run.stdout[-3000:]
    assert ("this cell fails" in run.stdout + run.stderr) == fails
