"""``coursekit formgrader``: nbgrader's formgrader for the course, on this machine only.

The formgrader is where written answers get their hand grades and comments (nbgrader's Jupyter
server extension). This starts it for the course folder on ``127.0.0.1`` with a fresh token,
prints the address to open, and serves MathJax from the course's own copy (``make mathjax``)
instead of nbgrader's CDN, whose absence stops the grading page of an offline machine.

The round trip (README, "Grading by hand"): ``coursekit autograde`` -> ``coursekit formgrader``
(grade and comment) -> ``coursekit autograde`` again (cached: writes the feedback with the hand
grades and comments) -> ``coursekit export``.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

__all__ = ["HOOK", "command", "grading_page", "serve", "url"]

#: where the course's MathJax lives (scripts/install_mathjax.sh), relative to the course folder
MATHJAX = Path("_vendor") / "mathjax" / "tex-chtml.js"
#: the environment variable through which the course's ``nbgrader_config.py`` puts our grading page
#: before nbgrader's (the formgrader extension reads its exporter's settings from that file only)
HOOK = "COURSEKIT_FORMGRADER_TEMPLATES"
#: nbgrader's grading page loads MathJax 2 from a CDN (``{{ mathjax() }}``) and its script calls
#: MathJax 2's ``MathJax.Hub``: offline, that call throws and the page never finishes setting up. In
#: its place: the course's MathJax 3, and the three calls of MathJax 2's API that the page makes.
LOCAL_MATHJAX = """<script>
(function () {
  var listeners = [], done = false;
  var hub = {
    Config: function () {},
    Queue: function () { if (done && window.MathJax.typesetPromise) { window.MathJax.typesetPromise(); } },
    Typeset: function () { if (done && window.MathJax.typesetPromise) { window.MathJax.typesetPromise(); } },
    Startup: {signal: {Interest: function (f) { if (done) { f("End"); } else { listeners.push(f); } }}}
  };
  window.MathJax = {
    tex: {inlineMath: [["$", "$"], ["\\\\(", "\\\\)"]], processEscapes: true},
    startup: {
      ready: function () {
        window.MathJax.startup.defaultReady();
        window.MathJax.Hub = hub;
        window.MathJax.startup.promise.then(function () {
          done = true;
          listeners.forEach(function (f) { f("End"); });
        });
      }
    },
    Hub: hub
  };
})();
</script>
<script async src="{{ resources.base_url }}/files/_vendor/mathjax/tex-chtml.js"></script>"""


def grading_page(folder: Path) -> Path:
    """nbgrader's grading page template (``formgrade``) with :data:`LOCAL_MATHJAX` for its MathJax,
    written into ``folder`` (made anew); returns ``folder``, a template base folder to put before
    nbgrader's. Raises ``RuntimeError`` if nbgrader's page no longer loads MathJax as expected."""
    import shutil

    import nbgrader.server_extensions.formgrader as formgrader

    source = Path(formgrader.__file__).resolve().parent / "templates" / "formgrade"
    target = Path(folder) / "formgrade"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
    page = target / "index.html.j2"
    text = page.read_text()
    if text.count("{{ mathjax() }}") != 1:
        raise RuntimeError(f"{source / 'index.html.j2'} no longer loads MathJax with {{{{ mathjax() }}}}")
    page.write_text(text.replace("{{ mathjax() }}", LOCAL_MATHJAX))
    return Path(folder)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(root: Path, port: int, token: str) -> list[str]:
    """The ``jupyter server`` command line of the course's formgrader."""
    args = [
        sys.executable,
        "-m",
        "jupyter_server",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.open_browser=False",
        f"--ServerApp.root_dir={root}",
        f"--IdentityProvider.token={token}",
        '--ServerApp.jpserver_extensions={"nbgrader.server_extensions.formgrader": True}',
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--ServerApp.allow_root=True")  # a grading machine's root; jupyter refuses it otherwise
    return args


def url(port: int, token: str) -> str:
    return f"http://127.0.0.1:{port}/formgrader?token={token}"


def serve(root: Path, port: int | None = None, *, env: dict | None = None) -> subprocess.Popen:
    """Start the formgrader of the course at ``root`` (a free port unless ``port``); return the
    server process, whose address :func:`url` gives (``proc.url``)."""
    root = Path(root).resolve()
    if not (root / "nbgrader_config.py").is_file():
        raise FileNotFoundError(f"{root} is not a course folder (no nbgrader_config.py)")
    if not (root / MATHJAX).is_file():
        raise FileNotFoundError(
            f"no local MathJax in {root / MATHJAX.parent}: run `make mathjax` (the grading page needs it offline)"
        )
    port = port or free_port()
    token = secrets.token_hex(16)
    if HOOK not in (root / "nbgrader_config.py").read_text():
        raise ValueError(
            f"{root / 'nbgrader_config.py'} does not read {HOOK}, so the formgrader would load MathJax from a "
            "CDN and its grading page would stop offline: copy the last lines of this course's "
            "nbgrader_config.py (the ones naming it) into yours"
        )
    import nbgrader.server_extensions.formgrader as formgrader

    nbgrader_templates = Path(formgrader.__file__).resolve().parent / "templates"
    ours = grading_page(root / ".coursekit" / "formgrader-templates")
    env = dict(os.environ if env is None else env)
    env[HOOK] = os.pathsep.join(
        [str(ours), str(nbgrader_templates)]
    )  # read by the course's nbgrader_config.py
    proc = subprocess.Popen(command(root, port, token), cwd=root, env=env, start_new_session=True)
    proc.url = url(port, token)  # type: ignore[attr-defined]
    return proc
