"""Instructor workflow around nbgrader: release, collect, autograde, feedback, export.

nbgrader does the real work (its gradebook, its autograder, its feedback); this
module only drives its Python API with the course's ``nbgrader_config.py``:
``solutions/`` is nbgrader's source folder and ``exercises/`` its release folder.
"""

from __future__ import annotations

import filecmp
import functools
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

#: Student ids become folder names and database keys: keep them plain.
STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def repo_root() -> Path:
    """The course root: the nearest folder upward holding ``nbgrader_config.py``."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "nbgrader_config.py").is_file():
            return folder
    raise FileNotFoundError(
        f"no nbgrader_config.py in {here} or any folder above it: run from the course folder"
    )


def assignments(root: Path) -> list[str]:
    """Assignment ids: the folders of ``solutions/`` (``ch01_attention``, ...)."""
    source = root / "solutions"
    if not source.is_dir():
        raise FileNotFoundError(f"{source} does not exist")
    return sorted(p.name for p in source.iterdir() if p.is_dir() and not p.name.startswith("."))


@functools.cache
def alembic_head() -> str:
    """The newest revision of nbgrader's gradebook schema, which nbgrader stamps on every new
    gradebook. nbgrader learns it by running the ``alembic`` executable, a Python start that imports
    nbgrader again (2 s per new gradebook); this reads the same migration scripts in-process."""
    import nbgrader
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(Path(nbgrader.__file__).parent / "alembic")).get_current_head()


def nbgrader_api(root: Path, **overrides):
    """An ``NbGraderAPI`` configured from ``root/nbgrader_config.py`` (plus overrides)."""
    import nbgrader.api
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    nbgrader.api.get_alembic_version = alembic_head

    # nbgrader runs the `alembic` executable from PATH; make sure this environment's is found.
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    config.CourseDirectory.root = str(root)
    # Submissions arrive as files (see `collect`), not through nbgrader's exchange; point the
    # exchange at a private folder so nbgrader does not complain about the system-wide one.
    exchange = Path(tempfile.gettempdir()) / f"coursekit-exchange-{os.getuid()}"
    exchange.mkdir(exist_ok=True)
    config.Exchange.root = str(exchange)
    config.NbGraderAPI.log_level = "WARN"
    for key, value in overrides.items():
        section, name = key.split(".")
        config[section][name] = value
    coursedir = CourseDirectory(config=config)
    return NbGraderAPI(coursedir=coursedir, config=config)


def gradebook_url(root: Path) -> str:
    """The gradebook's database URL as ``root/nbgrader_config.py`` sets it (nbgrader's default:
    ``sqlite:///<root>/gradebook.db``)."""
    return nbgrader_api(root).coursedir.db_url


def expect_success(result: dict, what: str) -> None:
    """Raise ``RuntimeError`` with nbgrader's error or log unless ``result`` (an NbGraderAPI answer) succeeded."""
    if not result.get("success"):
        raise RuntimeError(f"{what} failed:\n{result.get('error') or result.get('log')}")


# --------------------------------------------------------------------------- release


def release(root: Path, names: list[str] | None = None, out: Path | None = None) -> list[Path]:
    """Regenerate the student release of ``names`` (default: all) from ``solutions/``.

    Uses ``nbgrader generate_assignment`` with a throwaway gradebook, so releasing
    never touches the instructor's grades. Writes to ``root/exercises`` unless
    ``out`` is given. Returns the written notebooks.
    """
    names = names or assignments(root)
    unknown = sorted(set(names) - set(assignments(root)))
    if unknown:
        raise ValueError(
            f"no such assignment in solutions/: {', '.join(unknown)} (have: {', '.join(assignments(root))})"
        )
    out = (out or root / "exercises").resolve()
    _validate_test_cells(root, names)
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp) / "release"
        api = nbgrader_api(
            root,
            **{
                "CourseDirectory.release_directory": str(staging),
                "CourseDirectory.db_url": f"sqlite:///{tmp}/gradebook.db",
            },
        )
        import nbformat

        finish = release_finisher(root, api.config)
        for name in names:
            expect_success(api.generate_assignment(name, force=True, create=True), f"releasing {name}")
            target = out / name
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(staging / name, target)
            for path in target.rglob("*.ipynb"):
                nb = nbformat.read(path, as_version=4)
                if finish(nb):
                    nbformat.write(nb, path)
    return sorted(p for name in names for p in (out / name).rglob("*.ipynb"))


def release_finisher(root: Path, config=None):
    """What ``coursekit release`` does to a notebook after nbgrader's ``generate_assignment``, as
    one function ``finish(nb) -> changed`` (in place): links to the rendered book
    (:func:`link_the_rendered_book`) and predictions stubbed (:func:`stub_predictions`).

    The autograder applies the same function to the release it compares submissions with, so that
    a notebook handed in as it was released matches it cell for cell (no note about a changed cell).
    ``config``: the course's nbgrader config (read from ``root`` when not given)."""
    from nbgrader.preprocessors import ClearSolutions

    config = config if config is not None else nbgrader_api(root).config
    code_stub = ClearSolutions(config=config).code_stub["python"]  # the course's, or nbgrader's
    base = book_url(root)

    def finish(nb) -> bool:
        linked = link_the_rendered_book(nb, base)
        return stub_predictions(nb, code_stub) or linked

    return finish


#: a link from a notebook in solutions/NAME/ to a page's MyST source
_SOURCE_LINK = re.compile(r"\]\(\.\./\.\./book/([\w-]+)\.md(#[^)\s]*)?\)")


def book_url(root: Path) -> str:
    """Where the rendered book is published: ``html.baseurl`` of ``_config.yml``, an http(s) address
    without its trailing slash; ``""`` when it is unset, not a web address, or unreadable."""
    try:
        import yaml

        data = yaml.safe_load((root / "_config.yml").read_text()) or {}
    except (OSError, ValueError, ImportError):
        return ""
    base = (data.get("html") or {}).get("baseurl") if isinstance(data, dict) else None
    return base.rstrip("/") if isinstance(base, str) and base.startswith(("https://", "http://")) else ""


def link_the_rendered_book(nb, base: str) -> bool:
    """Point the notebook's links to a chapter at the rendered page, not its MyST source: at
    ``{base}/book/NAME.html`` when the book's address is known, else at ``../../book/NAME.html``,
    which is the page from the copy the book's Exercise box offers (``_downloads/<hash>/``).
    Changes ``nb`` in place; returns whether anything changed."""
    prefix = f"{base}/book" if base else "../../book"
    changed = False
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            new = _SOURCE_LINK.sub(lambda m: f"]({prefix}/{m[1]}.html{m[2] or ''})", cell.source)
            changed |= new != cell.source
            cell.source = new
    return changed


def stub_predictions(nb, code_stub: str) -> bool:
    """A "predict, then check" answer cell (grade id ``predict_...``, the variable the student sets)
    is released as ``predict_... = None  # YOUR ANSWER HERE``, not as nbgrader's ``raise
    NotImplementedError()``: the name exists from the start, and its check says "not implemented
    yet" until the student writes a prediction. ``code_stub``: what nbgrader left in the cell, the
    course's ``ClearSolutions.code_stub``. Changes ``nb`` in place; returns whether anything changed."""
    from coursekit.cells import nbgrader_meta

    changed = False
    for cell in nb.cells:
        gid = nbgrader_meta(cell).get("grade_id") or ""
        if cell.cell_type == "code" and nbgrader_meta(cell).get("solution") and gid.startswith("predict_"):
            if code_stub in cell.source:
                cell.source = cell.source.replace(code_stub, f"{gid} = None  # YOUR ANSWER HERE")
                changed = True
    return changed


def _validate_test_cells(root: Path, names: list[str]) -> None:
    """Every test cell must be a thin call into coursekit.grading: the autograder runs
    that call on the trusted side (see coursekit.autograde)."""
    import nbformat

    from coursekit.cells import is_test_cell, nbgrader_meta, thin_calls

    for name in names:
        for path in sorted((root / "solutions" / name).glob("*.ipynb")):
            for cell in nbformat.read(path, as_version=4).cells:
                if is_test_cell(cell):
                    gid = nbgrader_meta(cell).get("grade_id")
                    thin_calls(cell.source, f"{path.relative_to(root)}: test cell {gid!r}")


def stale_releases(root: Path) -> list[str]:
    """Names of files in ``exercises/`` that differ from a fresh release (empty if current); hidden
    entries, which running or opening a notebook leaves and a release never contains, are not compared."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "exercises"
        release(root, out=fresh)
        committed = root / "exercises"
        problems = []
        for path in sorted(fresh.rglob("*")):
            rel = path.relative_to(fresh)
            if path.is_file() and not (committed / rel).is_file():
                problems.append(f"missing: exercises/{rel}")
            elif path.is_file() and not filecmp.cmp(path, committed / rel, shallow=False):
                problems.append(f"differs: exercises/{rel}")
        for path in sorted(committed.rglob("*")) if committed.is_dir() else []:
            rel = path.relative_to(committed)
            if any(part.startswith(".") for part in rel.parts):
                continue  # .ipynb_checkpoints, .hypothesis, ...: left by opening or running a notebook, not released
            if path.is_file() and not (fresh / rel).exists():
                problems.append(f"extra: exercises/{path.relative_to(committed)}")
        return problems


# --------------------------------------------------------------------------- autograde helpers


def last_line(text: str) -> str:
    """The last non-blank line of ``text`` (of a log, say), or ``text`` itself if it has none."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text
