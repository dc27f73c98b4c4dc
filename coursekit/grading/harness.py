"""An exercise notebook as the graders see it: its parts, and grading them in this process.

A *part* is one answer cell of the instructor's notebook (``solutions/<a>/<a>.ipynb``) with the
test cells that follow it: a public one (``check_<part>``) and a hidden one (``grade_<part>``),
each a thin call into ``coursekit.grading``. :func:`parts` reads them; :func:`namespace` builds
what a student's kernel would hold after running the notebook (its imports and its answers);
:func:`run_tests` runs a part's test cells here, as the autograder runs them against the
sandbox. The one parametrised grader test, the mutation reports and the autograder's
"fix part N first" hints are built on these three.

Example::

    >>> [p.name for p in parts("ch01_attention")]
    ['softmax', 'causal_mask', 'scaled_dot_product_attention', 'SelfAttention']
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path

import nbformat

from coursekit.cells import Call, heading, is_test_cell, nbgrader_meta, part_label, thin_calls
from coursekit.chapters import chapter, course_root
from coursekit.grading import core
from coursekit.grading.core import GradingFailure

__all__ = [
    "Part",
    "Test",
    "Outcome",
    "parts",
    "namespace",
    "run_tests",
    "defined_names",
    "used_names",
    "fix_first",
]


@dataclass(frozen=True)
class Test:
    """A test cell: its grade id, points, whether students see it, and its thin calls."""

    grade_id: str
    points: float
    hidden: bool
    calls: tuple[Call, ...]


@dataclass(frozen=True)
class Part:
    """An answer cell and its test cells.

    Attributes:
        number: the part's number as the notebook's heading gives it (``"1"``, ``"5a"`` for "Question
            5a"; :func:`coursekit.cells.part_label`), else its place among the answer cells.
        grade_id: the answer cell's grade id.
        names: the top-level names the answer cell defines, the graded object first.
        source: the instructor's answer (solution markers included).
        tests: the test cells that follow it.
    """

    number: str
    grade_id: str
    names: tuple[str, ...]
    source: str
    tests: tuple[Test, ...]

    @property
    def name(self) -> str:
        """The graded object: the first name that a test cell passes to the grader."""
        passed = [a for t in self.tests for c in t.calls for a in c.args]
        return next((n for n in passed if n in self.names), self.names[0])

    @property
    def points(self) -> float:
        return sum(t.points for t in self.tests)


@dataclass(frozen=True)
class Outcome:
    """What one test cell gave: ``failure`` is ``None`` when it passed, else the message."""

    test: Test
    failure: str | None
    hints: tuple[tuple[str, str], ...] = ()  # (check, hint) of each failed check
    lines: tuple[str, ...] = ()  # what the graders reported, a line per check
    clauses: tuple[tuple[str, float, bool], ...] = ()  # (check, weight, passed): for partial credit


def _notebook(assignment: str, folder: str, root: Path | None):
    path = (root or course_root()) / folder / assignment / chapter(assignment).notebook
    return nbformat.read(path, as_version=4)


def defined_names(source: str) -> tuple[str, ...]:
    """The top-level functions, classes and plain variables (``predict_x = 3``) ``source`` defines,
    in order (none if it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    names: list[str] = []
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            names += [t.id for t in targets if isinstance(t, ast.Name) and t.id not in names]
    return tuple(names)


def used_names(source: str) -> set[str]:
    """Every plain name ``source`` reads (``softmax`` in ``softmax(x)``); empty if it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def parts(assignment: str, root: Path | None = None) -> list[Part]:
    """The graded parts of ``assignment``, in notebook order, read from the instructor's notebook."""
    nb = _notebook(assignment, "solutions", root)
    found: list[tuple[str, str, list[Test], str | None]] = []
    title = None
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        if cell.cell_type == "markdown":
            title = heading(cell.source) or title
        if cell.cell_type == "code" and meta.get("solution"):
            found.append((meta["grade_id"], cell.source, [], part_label(title)))
        elif is_test_cell(cell):
            if not found:
                raise ValueError(
                    f"{assignment}: test cell {meta.get('grade_id')!r} comes before any answer cell"
                )
            gid = meta["grade_id"]
            calls = tuple(thin_calls(cell.source, f"{assignment}: test cell {gid!r}"))
            found[-1][2].append(
                Test(gid, float(meta.get("points", 0)), "BEGIN HIDDEN TESTS" in cell.source, calls)
            )
    return [
        Part(label or str(i), gid, defined_names(src), src, tuple(tests))
        for i, (gid, src, tests, label) in enumerate(found, start=1)
    ]


def namespace(
    assignment: str, answers: dict[str, str] | None = None, *, release: bool = False, root: Path | None = None
) -> dict:
    """What a student's kernel holds after running the notebook top to bottom (test cells aside).

    Args:
        assignment: the assignment.
        answers: answer cell grade id -> source to run instead of the instructor's answer.
        release: start from the students' release (unanswered parts raise NotImplementedError).
        root: the course folder (default: the repository this package belongs to).

    Returns:
        The globals after every code cell ran, in order, but the test cells and the tables of the
        student's measurements (read-only cells whose grade id ends in ``_table``).
    """
    nb = _notebook(assignment, "exercises" if release else "solutions", root)
    ns: dict = {"__name__": "__main__"}
    for cell in nb.cells:
        if cell.cell_type != "code" or is_test_cell(cell):
            continue
        meta = nbgrader_meta(cell)
        gid = meta.get("grade_id")
        if str(gid).endswith("_table") and not meta.get("solution"):
            continue  # a read-only cell that prints the student's measurements: for their eyes only
        source = (answers or {}).get(gid, cell.source)
        code = compile(source, f"<{assignment}: cell {gid}>", "exec")
        if meta.get("solution") or not (release or answers):
            exec(code, ns)  # noqa: S102 (our own notebook)
            continue
        try:  # a read-only cell that runs the student's answers (an experiment's table): as in a kernel,
            exec(code, ns)  # noqa: S102  # its error does not stop the notebook
        except Exception:  # noqa: BLE001, S110
            pass
    return ns


def run_tests(part: Part, ns: dict, *, hidden: bool | None = None) -> list[Outcome]:
    """Run ``part``'s test cells (only the hidden or only the public ones, if ``hidden`` says so)
    in this process against the objects in ``ns``; a grader's failure is an outcome, not an error."""
    outcomes = []
    for test in part.tests:
        if hidden is not None and test.hidden != hidden:
            continue
        failure, hints, lines, clauses = None, (), [], []
        token, clause_token = core.REPORT.set(lines), core.CLAUSES.set(clauses)
        try:
            for call in test.calls:
                fn = getattr(importlib.import_module(call.module), call.function)
                fn(*(ns[a] for a in call.args), **dict(call.kwargs))
        except GradingFailure as e:
            failure, hints = str(e), tuple(e.failures)
        except Exception as e:  # noqa: BLE001 (a crash in a grader is a failed test here too)
            failure = f"{type(e).__name__}: {e}"
        finally:
            core.REPORT.reset(token)
            core.CLAUSES.reset(clause_token)
        outcomes.append(Outcome(test, failure, hints, tuple(lines), tuple(clauses)))
    return outcomes


def fix_first(
    order: list[tuple[str, tuple[str, ...]]],
    answers: dict[str, str],
    failed: set[str],
    labels: dict[str, str] | None = None,
) -> dict[str, str]:
    """Which failing parts call an earlier part that fails its own checks, and what to tell them.

    Args:
        order: the parts in notebook order, as (answer grade id, names the instructor's answer defines).
        answers: answer grade id -> the student's answer (its source).
        failed: answer grade ids of the parts with a failed test cell.
        labels: answer grade id -> the part's number in the notebook's headings (default: its place
            in ``order``, from 1).

    Returns:
        answer grade id -> a sentence such as "part 1 (softmax) fails its own checks, and your
        scaled_dot_product_attention calls it: fix part 1 first", for each failed part whose
        student answer reads a name an earlier failed part defines.

    Example: with softmax failing and an attention answer that calls ``softmax``,
    ``{"scaled_dot_product_attention": "part 1 (softmax) fails its own checks, ..."}``.
    """
    out = {}
    for i, (gid, names) in enumerate(order):
        if gid not in failed:
            continue
        used = used_names(answers.get(gid, ""))
        culprits = [
            ((labels or {}).get(earlier) or j + 1, earlier)
            for j, (earlier, defined) in enumerate(order[:i])
            if earlier in failed and used & set(defined)
        ]
        if culprits:
            number, earlier = culprits[0]
            first = dict(order)[earlier][0]
            mine = names[0] if names else gid
            out[gid] = (
                f"part {number} ({first}) fails its own checks, and your {mine} calls it: "
                f"fix part {number} first"
            )
    return out
