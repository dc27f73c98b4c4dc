"""Pages in headless Chromium, for tests of what a person's browser would run or fetch.

:func:`render` writes a notebook as nbgrader's formgrader and feedback pages do; :func:`visit`
loads a page, clicks its ``javascript:`` links and reports what attacks did (``window.pwnN``
set, the title changed, requests to a :class:`tests.submissions.Listener`).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest

from tests.submissions import Listener


def chromium(profile: Path):
    """A headless Chromium driver with its own profile folder (skips the test without Chromium).
    Host names do not resolve (CDN scripts fail at once); loopback addresses still work."""
    path, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (path and driver_path):
        pytest.skip(
            "headless Chromium is needed: run scripts/system_deps.sh (apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = path
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(60)
    return driver


def render(nb: nbformat.NotebookNode, template: str) -> str:
    """The page nbconvert writes, configured as nbgrader's formgrader and feedback do."""
    from nbconvert import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers
    from traitlets.config import Config

    c = Config()
    c.HTMLExporter.template_name = template
    resources = {}
    if template in ("formgrade", "feedback"):
        c.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    if (
        template == "formgrade"
    ):  # as nbgrader's SubmissionHandler; base_url serves the formgrader's own scripts
        base = Path(handlers.static_path).parent.parent.as_uri()
        resources = {"assignment_id": "ps1", "notebook_id": "ps1", "submission_id": "abc", "index": 0, "total": 1,
                     "base_url": base, "student": "s1", "last_name": "L", "first_name": "F", "notebook_path": "ps1.ipynb"}  # fmt: skip  # noqa: E501
    if template == "feedback":  # as nbgrader's GenerateFeedback
        c.HTMLExporter.extra_template_paths = [
            str(Path(handlers.static_path) / "node_modules" / "bootstrap" / "dist" / "css")
        ]
        resources = {"nbgrader": {"notebook": "ps1", "score": 1.0, "max_score": 2.0, "late_penalty": 0.0}}
    page, _ = HTMLExporter(config=c).from_notebook_node(nb, resources=resources)
    return page


def visit(driver, listener: Listener, path: Path, settle: float = 1.5) -> dict:
    """Load ``path``, click every javascript: link, wait, and report what the attacks did."""
    before = len(listener.received)
    driver.get(path.as_uri())
    title = driver.title
    links = driver.execute_script(
        "const l = [...document.querySelectorAll('a[href]')].filter(a => /^(javascript|data|vbscript):/i.test(a.href));"
        "l.forEach(a => a.click()); return l.length;"
    )
    time.sleep(settle)
    state = driver.execute_script(
        "return {pwned: Object.keys(window).filter(k => /^pwn\\d+$/.test(k)).sort(), title: document.title,"
        " url: location.href, text: document.body ? document.body.innerText : ''}"
    )
    requested = sorted(
        {int(m[1]) for r in listener.received[before:] for m in [re.match(rb"GET /(\d+)", r)] if m}
    )
    stray = [r for r in listener.received[before:] if not re.match(rb"GET /\d+", r)]
    return {**state, "title_before": title, "requested": requested, "stray": stray, "risky_links": links}


AXE = Path(__file__).resolve().parents[1] / ".cache" / "axe" / "axe.min.js"
#: the rules run: WCAG 2.0 and 2.1, levels A and AA (what the ADA Title II rule asks of course material)
WCAG_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]


def axe_violations(driver, impacts=("serious", "critical")) -> list[str]:
    """Run axe-core (``scripts/install_axe.sh``) on the page the driver shows, with the WCAG 2.1 A
    and AA rules; one line per violation of those ``impacts``: rule, impact, what it asks, how many
    elements, and the first of them."""
    if not AXE.is_file():
        pytest.fail("axe-core is needed: run scripts/install_axe.sh (make axe)")
    driver.execute_script(AXE.read_text(encoding="utf-8"))
    driver.set_script_timeout(120)
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {runOnly: {type: 'tag', values: arguments[0]}, resultTypes: ['violations']})"
        ".then(r => done(r.violations.map(v => [v.id, v.impact, v.help, v.nodes.length,"
        " v.nodes.length ? v.nodes[0].target.join(' ') + ' ' + (v.nodes[0].failureSummary || '').slice(0, 200) : ''])))"
        ".catch(e => done([['axe failed', 'critical', String(e), 0, '']]));",
        WCAG_AA,
    )
    return [
        f"{rule} ({impact}): {what}; {count} elements, e.g. {first}"
        for rule, impact, what, count, first in result
        if impact in impacts
    ]
