"""Build fake student submissions from the release: filled in, untouched, or mutated."""

from __future__ import annotations

import ast
import copy
import textwrap
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def load(path: Path):
    return nbformat.read(path, as_version=4)


def filled(assignment: str):
    """The release with every solution cell answered by the instructor's solution."""
    nb_name = f"{assignment}.ipynb"
    release = load(ROOT / "exercises" / assignment / nb_name)
    solution = load(ROOT / "solutions" / assignment / nb_name)
    answers = {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in solution.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }
    nb = copy.deepcopy(release)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return nb


def replace_definition(nb, name: str, new_source: str):
    """Return a copy of ``nb`` where the top-level def/class ``name`` is ``new_source``."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in tree.body:
            assigns = isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets
            )  # a prediction: ``predict_x = ...``
            if assigns or (isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name):
                lines = cell.source.splitlines()
                start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
                lines[start : node.end_lineno] = textwrap.dedent(new_source).strip().splitlines()
                cell.source = "\n".join(lines)
                return nb
    raise KeyError(f"no top-level definition of {name!r} in the notebook")


def points(assignment: str) -> tuple[float, float]:
    """``(autograded, manual)``: the points of the assignment's test cells and of its answers graded
    by hand (written answers); the stretch part's cells carry 0."""
    nb = load(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    auto = manual = 0.0
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade"):
            if meta.get("solution"):
                manual += float(meta.get("points", 0))
            else:
                auto += float(meta.get("points", 0))
    return auto, manual


def course_folder(parent: Path, name: str = "course") -> tuple[Path, Path]:
    """A throwaway course: ``parent/name`` with nbgrader_config.py, solutions/ and an empty inbox/."""
    import shutil

    root = parent / name
    root.mkdir(parents=True)
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(ROOT / "solutions", root / "solutions")
    (root / "inbox").mkdir()
    return root, root / "inbox"


class Listener:
    """A TCP server on the host's loopback that records what reaches it (for network attacks)."""

    def __init__(self):
        import socket
        import threading

        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def _listen(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            with conn:
                # a browser opens spare connections that never send: let them go, or the requests
                # queued behind them are never accepted
                conn.settimeout(1.0)
                try:
                    data = conn.recv(100)
                except OSError:
                    continue
                if data:
                    self.received.append(data)

    def start(self) -> Listener:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.server.close()

    def __enter__(self) -> Listener:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def jupyter_env(home: Path) -> dict:
    """The environment with Jupyter's config, data and runtime folders under ``home`` (a test's own)."""
    import os

    return {
        **os.environ,
        **{f"JUPYTER_{k}_DIR": str(home / k.lower()) for k in ("CONFIG", "DATA", "RUNTIME")},
        "JUPYTER_PLATFORM_DIRS": "1",
    }


def running_formgrader(root: Path, home: Path):
    """``coursekit formgrader`` on the course ``root`` (a free port of 127.0.0.1), Jupyter's folders
    under ``home``: a context manager yielding ``(session, api, url)``, a requests session logged in
    with the printed token, the formgrader's API address and the printed address. Stops the server
    (its process group only) when the block ends."""
    import contextlib
    import os
    import signal
    import subprocess
    import time

    import requests

    from coursekit import formgrader

    @contextlib.contextmanager
    def running():
        proc = formgrader.serve(root, env=jupyter_env(home))
        session = requests.Session()
        session.headers["Authorization"] = f"token {proc.url.rsplit('token=', 1)[1]}"
        api = proc.url.split("?")[0] + "/api"
        deadline = time.monotonic() + 90
        try:
            while True:
                try:
                    if session.get(f"{api}/status", timeout=2).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "the formgrader did not start"
                time.sleep(0.3)
            yield session, api, proc.url
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    return running()
