"""solutions/ and exercises/ stay in step with coursekit, and the solutions run."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from coursekit import course
from coursekit.chapters import CHAPTERS
from tests.submissions import ROOT, load

#: assignment -> the coursekit modules its solution cells must reproduce (each definition is
#: looked up in the first module that has it)
MODULES = {c.assignment: c.modules for c in CHAPTERS}


def definitions(source: str) -> dict[str, str]:
    """Top-level def/class name -> AST dump (comments, and so solution markers, vanish)."""
    tree = ast.parse(source)
    return {n.name: ast.dump(n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.parametrize("assignment", sorted(MODULES))
def test_solution_cells_are_the_coursekit_code(assignment):
    nb = load(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    modules = [importlib.import_module(f"coursekit.{name}") for name in MODULES[assignment]]
    solved = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            solved.update(definitions(cell.source))  # (a written answer is a markdown answer cell)
    assert solved, "no solution cells found"
    for name, dump in solved.items():
        module = next((m for m in modules if hasattr(m, name)), modules[0])
        reference = definitions(textwrap.dedent(inspect.getsource(getattr(module, name))))[name]
        assert dump == reference, (
            f"{assignment}: the solution of {name} differs from coursekit.{module.__name__.split('.')[-1]}.{name}"
        )


def test_every_assignment_has_a_module_and_a_release():
    assert sorted(MODULES) == course.assignments(ROOT)
    for name in MODULES:
        assert (ROOT / "exercises" / name / f"{name}.ipynb").is_file()


def test_release_hides_solutions_and_hidden_tests():
    for name in MODULES:
        text = (ROOT / "exercises" / name / f"{name}.ipynb").read_text()
        assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text and ".grade_" not in text
        assert "raise NotImplementedError()" in text


def test_committed_notebooks_have_no_outputs():
    for folder in ("solutions", "exercises"):
        for path in (ROOT / folder).rglob("*.ipynb"):
            nb = load(path)
            assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path} has outputs"


@pytest.mark.slow
def test_the_instructors_table_is_current():
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "instructor_table.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.slow  # not in the quick loop: regenerates the whole release with nbgrader
def test_exercises_are_current():
    problems = course.stale_releases(ROOT)
    assert not problems, "exercises/ is stale, run `coursekit release`:\n" + "\n".join(problems)


@pytest.fixture(scope="module")
def nbval_runs(request, tmp_path_factory):
    """The solution notebooks of the session's nbval tests, run by ``pytest --nbval-lax`` in one
    process (a process each cost about 2 CPU-seconds more a notebook: pytest's start and this
    suite's conftest). Returns that run and, per assignment, its cells as nbval reported them:
    ``(name, None)`` for a cell that passed, ``(name, what failed)`` for one that did not."""
    import xml.etree.ElementTree as ET

    chosen = sorted(
        {
            item.callspec.params["assignment"]
            for item in request.session.items
            if item.originalname == "test_solution_notebook_passes_nbval"
        }
    )
    report = tmp_path_factory.mktemp("nbval") / "nbval.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:cacheprovider", "-n", "0"]
        + ["--junitxml", str(report)]
        + [str(ROOT / "solutions" / a / f"{a}.ipynb") for a in chosen],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    cells: dict[str, list] = {a: [] for a in chosen}
    for case in ET.parse(report).iter("testcase") if report.is_file() else ():
        problem = next((e for e in case if e.tag in ("failure", "error")), None)
        why = None if problem is None else f"{problem.get('message', '')}\n{(problem.text or '')[-2000:]}"
        why = why and re.sub(r"#x1B\[[0-9;]*m", "", why)  # nbval's colours, as the report escapes them
        for a in chosen:
            if case.get("classname") == f"solutions.{a}.{a}.ipynb":
                cells[a].append((case.get("name"), why))
    return run, cells


@pytest.mark.slow
@pytest.mark.parametrize("assignment", sorted(MODULES))
def test_solution_notebook_passes_nbval(assignment, nbval_runs):
    run, cells = nbval_runs
    assert cells[assignment], f"nbval ran no cell of {assignment}:\n{run.stdout[-3000:]}{run.stderr[-2000:]}"
    failed = [f"{name}: {why}" for name, why in cells[assignment] if why is not None]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("assignment", sorted(MODULES))
def test_a_filled_release_uses_no_undefined_name(assignment, tmp_path):
    """The student's notebook with every answer filled in, read top to bottom (code cells, then the
    Python examples of the markdown cells where they stand), names nothing it never defined or
    imported (ruff's F821), the outro's "put it together" snippets included."""
    from tests.submissions import filled

    pieces = []
    for cell in filled(assignment).cells:
        if cell.cell_type == "code":
            pieces.append(
                "\n".join(
                    line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!"))
                )
            )
        elif cell.cell_type == "markdown":
            pieces += re.findall(r"```python\n(.*?)```", cell.source, re.S)
    script = tmp_path / f"{assignment}.py"
    script.write_text("\n\n".join(pieces) + "\n")
    ruff = [
        sys.executable,
        "-m",
        "ruff",
        "check",
        "--isolated",
        "--no-cache",
        "--select",
        "F821",
        str(script),
    ]
    run = subprocess.run(ruff, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:]


@pytest.mark.slow
def test_hidden_clutter_is_neither_released_nor_reported_stale(tmp_path):
    """A ``.hypothesis`` database beside a solution (left by running it) stays out of the release,
    and ``.ipynb_checkpoints`` in exercises/ (left by opening a notebook) is not "extra"."""
    root = tmp_path / "course"
    root.mkdir()
    for name in ("nbgrader_config.py", "_config.yml"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "solutions" / "ch02_multihead", root / "solutions" / "ch02_multihead")
    (root / "solutions" / "ch02_multihead" / ".hypothesis" / "examples").mkdir(parents=True)
    (root / "solutions" / "ch02_multihead" / ".hypothesis" / "examples" / "a").write_text("x")
    course.release(root)
    released = [p.relative_to(root / "exercises") for p in (root / "exercises").rglob("*")]
    assert released and not any(part.startswith(".") for p in released for part in p.parts), released
    (root / "exercises" / "ch02_multihead" / ".ipynb_checkpoints").mkdir()
    (
        root / "exercises" / "ch02_multihead" / ".ipynb_checkpoints" / "ch02_multihead-checkpoint.ipynb"
    ).write_text("{}")
    assert course.stale_releases(root) == []


@pytest.mark.slow
def test_predictions_are_stubbed_whatever_code_stub_the_course_sets(tmp_path):
    """A course that sets its own ``ClearSolutions.code_stub`` still gets its "predict, then check"
    cells released as ``predict_... = None``, not as its stub."""
    root = tmp_path / "course"
    root.mkdir()
    shutil.copy(ROOT / "_config.yml", root / "_config.yml")
    stub = "# WRITE YOURS\\nraise NotImplementedError('write this')"
    config = (ROOT / "nbgrader_config.py").read_text()
    (root / "nbgrader_config.py").write_text(
        config + f'\nc.ClearSolutions.code_stub = {{"python": "{stub}"}}\n'
    )
    shutil.copytree(ROOT / "solutions" / "ch02_multihead", root / "solutions" / "ch02_multihead")
    (path,) = course.release(root)
    cells = [c for c in load(path).cells if c.metadata.get("nbgrader", {}).get("solution")]
    predictions = [c for c in cells if c.metadata["nbgrader"]["grade_id"].startswith("predict_")]
    assert predictions and all(
        c.source.endswith(f"{c.metadata['nbgrader']['grade_id']} = None  # YOUR ANSWER HERE")
        for c in predictions
    ), [c.source for c in predictions]
    assert any(
        "raise NotImplementedError('write this')" in c.source for c in cells
    )  # the course's stub is used


@pytest.mark.parametrize("assignment", ["ch01_attention", "ch07_gpt"])  # every one: test_autograde_chapters
def test_the_release_handed_in_as_is_gets_no_note_from_the_autograder_or_check(assignment, tmp_path):
    """The autograder rebuilds a submission on the release the students were given (links to the
    rendered book and stubbed predictions included, which nbgrader's own release lacks), so the
    untouched release gets no note; ``coursekit check`` finds the same release. A changed read-only
    cell still gets its note."""
    import nbformat

    from coursekit.autograde.check import find_release
    from coursekit.autograde.plan import staged_plan
    from coursekit.autograde.rebuild import normalize
    from tests.submissions import course_folder

    root, _ = course_folder(tmp_path)
    shutil.copy(ROOT / "_config.yml", root)  # the book's address (html.baseurl) is the release's
    given = ROOT / "exercises" / assignment / f"{assignment}.ipynb"
    (plan,) = staged_plan(root, assignment).notebooks
    assert normalize(given.read_bytes(), plan.release).notes == []
    assert find_release(load(given)) == load(given)
    tampered = load(given)
    tampered.cells[0].source += "\nI was here."
    notes = normalize(nbformat.writes(tampered).encode(), plan.release).notes
    gid = tampered.cells[0].metadata["nbgrader"]["grade_id"]
    assert notes == [f"the read-only cell {gid!r} was changed; the original was restored"]
