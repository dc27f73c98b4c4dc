"""``coursekit formgrader``: nbgrader's formgrader for the course, on this machine only.

The formgrader is where written answers get their hand grades and comments (nbgrader's Jupyter
server extension). This starts it for the course folder on ``127.0.0.1`` with a fresh token,
prints the address to open, and serves MathJax from the course's own copy (``make mathjax``)
instead of nbgrader's CDN, whose absence stops the grading page of an offline machine.

The round trip (README, "Grading by hand"): ``coursekit autograde`` -> ``coursekit formgrader``
(grade and comment; its "generate feedback" buttons write the course's feedback pages) ->
``coursekit export``. ``coursekit autograde`` again (cached) writes the same pages too.

The formgrader's buttons that would run nbgrader's own steps on the course go through coursekit
instead (this module is also a Jupyter Server extension, loaded before nbgrader's, so its routes
win): "generate feedback" writes *our* feedback page (hidden tests hidden, a
Content-Security-Policy, the comments as text; nbgrader's page would show the hidden tests'
source to students); "autograde" is refused, since nbgrader's autograder would run the students'
code outside the sandbox, on this machine, and overwrite the sandboxed results; "generate" is
refused, since ``coursekit release`` makes the release.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

__all__ = ["FEEDBACK", "HOOK", "REFUSED", "command", "feedback", "grading_page", "serve", "stop", "url"]

#: where the course's MathJax lives (scripts/install_mathjax.sh), relative to the course folder
MATHJAX = Path("_vendor") / "mathjax" / "tex-chtml.js"
#: the environment variable through which the course's ``nbgrader_config.py`` puts our grading page
#: before nbgrader's (the formgrader extension reads its exporter's settings from that file only)
HOOK = "COURSEKIT_FORMGRADER_TEMPLATES"
#: nbgrader's grading page loads MathJax 2 from a CDN (``{{ mathjax() }}``) and its script calls
#: MathJax 2's ``MathJax.Hub``: offline, that call throws and the page never finishes setting up. In
#: its place: the course's MathJax (4, with its font from the same copy), and the three calls of
#: MathJax 2's API that the page makes.
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
    loader: {paths: {fonts: "[mathjax]/fonts"}},
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
        # ours first (extensions load in name order; the first route that matches wins), then nbgrader's
        '--ServerApp.jpserver_extensions={"coursekit.formgrader": True, '
        '"nbgrader.server_extensions.formgrader": True}',
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


def stop(proc: subprocess.Popen, grace: float = 10.0) -> int:
    """Stop the server ``proc`` started by :func:`serve` and every process of its session: SIGTERM,
    then SIGKILL if it has not exited after ``grace`` seconds (a Jupyter server shutting down
    can wait on its kernels and open connections; Ctrl-C must not hang). Returns its exit code."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


# --------------------------------------------------------------------------- the server extension

#: formgrader routes (nbgrader's API) that would run nbgrader's own steps on the course -> why not
REFUSED = {
    r"/formgrader/api/submission/([^/]+)/([^/]+)/autograde": (
        "coursekit does not autograde from the formgrader: nbgrader's autograder would run this "
        "student's code outside the sandbox, on this machine, and replace the sandboxed results. Run "
        "`coursekit autograde INBOX --assignment {0}` (hand grades and comments are kept)."
    ),
    r"/formgrader/api/assignment/([^/]+)/assign": (
        "coursekit makes the release itself: run `coursekit release {0}` (nbgrader's generate step "
        "would write exercises/ without the course's finishing touches)."
    ),
}
#: formgrader routes answered with the course's own feedback pages
FEEDBACK = (
    r"/formgrader/api/assignment/([^/]+)/generate_feedback",
    r"/formgrader/api/assignment/([^/]+)/([^/]+)/generate_feedback",
)


def _jupyter_server_extension_points():
    return [{"module": "coursekit.formgrader"}]


def _load_jupyter_server_extension(serverapp) -> None:
    """Put the routes of :data:`REFUSED` and :data:`FEEDBACK` before nbgrader's formgrader's."""
    import json

    from jupyter_server.utils import url_path_join
    from nbgrader.server_extensions.formgrader.base import BaseApiHandler, check_xsrf
    from tornado import web

    root = Path(serverapp.root_dir).resolve()

    class Refused(BaseApiHandler):
        def initialize(self, why: str):
            self.why = why

        @web.authenticated
        @check_xsrf
        def post(self, assignment, *_):
            self.write(json.dumps({"success": False, "error": self.why.format(assignment), "log": ""}))

    class Feedback(BaseApiHandler):
        @web.authenticated
        @check_xsrf
        def post(self, assignment, student=None):
            self.write(json.dumps(feedback(root, assignment, student)))

    base = serverapp.web_app.settings["base_url"]
    serverapp.web_app.add_handlers(
        ".*$",
        [(url_path_join(base, route), Refused, {"why": why}) for route, why in REFUSED.items()]
        + [(url_path_join(base, route), Feedback) for route in FEEDBACK],
    )


def feedback(root: Path, assignment: str, student: str | None = None) -> dict:
    """The formgrader's "generate feedback": the course's feedback pages of ``assignment`` (one
    student's, or everyone's), from the gradebook as it is now, under the course's lock. Returns what
    nbgrader's API returns: ``success``, and ``error`` (why not) and ``log``."""
    import re

    from coursekit.autograde.feedback import regenerate_feedback
    from coursekit.autograde.gradebook import course_lock

    for name in (assignment, student):  # from the address: a name of a folder, never a path
        if name is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):
            return {"success": False, "error": f"not an assignment or student id: {name!r}", "log": ""}
    try:
        with course_lock(Path(root)):
            written = regenerate_feedback(Path(root), assignment, student)
    except (RuntimeError, ValueError) as e:  # a run holds the lock; nothing autograded yet
        return {"success": False, "error": str(e), "log": ""}
    failed = {s: why for s, why in written.items() if why}
    if not written:
        return {
            "success": False,
            "error": f"no autograded {assignment} yet: run coursekit autograde",
            "log": "",
        }
    return {
        "success": not failed,
        "error": "; ".join(f"{s}: {why}" for s, why in failed.items()),
        "log": f"wrote the feedback of {len(written) - len(failed)} students to {Path(root) / 'feedback'}",
    }
