"""Every exercise's graders, tested like code through one harness.

For every part of every assignment of :data:`coursekit.chapters.CHAPTERS`, in this process (the
autograder does the same against the sandbox: ``test_autograde*.py``):

* the instructor's answers pass every test cell, public and hidden;
* a part left as released (``raise NotImplementedError()``) fails its test cells with "not
  implemented yet", and the untouched release fails everywhere without crashing a grader;
* every wrong implementation of the assignment's catalogue (``tests/mutants/<assignment>.py``)
  loses its part's hidden points and shows its hint (the quick loop grades the first of each part).
  The part stops at the check that shows the hint (``core.STOP_WHEN``): any failed check costs a
  part points under either kind of credit, so the checks after it could change nothing asserted;
* when an earlier part the answer calls is wrong, the hint says to fix that part first.

What the automatically generated mutants do is checked by ``tests/test_mutation.py``; tests
particular to one grader stay in ``tests/test_grading_<assignment>.py``.
"""

from __future__ import annotations

import importlib

import nbformat
import pytest

from coursekit.autograde.credit import Credit
from coursekit.cells import nbgrader_meta
from coursekit.chapters import CHAPTERS
from coursekit.grading import core, harness
from tests.submissions import ROOT, load

ASSIGNMENTS = [c.assignment for c in CHAPTERS]
PARTS = [(a, p) for a in ASSIGNMENTS for p in harness.parts(a)]


def catalogue(assignment: str) -> list:
    return importlib.import_module(f"tests.mutants.{assignment}").MUTANTS


def _mutant_params() -> list:
    """Every catalogued mistake; the quick loop (``-m "not slow"``) takes the first of each part."""
    params, seen = [], set()
    for a in ASSIGNMENTS:
        for m in catalogue(a):
            first = (a, m.part) not in seen
            seen.add((a, m.part))
            params.append(pytest.param(a, m, marks=() if first else pytest.mark.slow))
    return params


MUTANTS = _mutant_params()


def released_answers(assignment: str) -> dict[str, str]:
    """Answer cell grade id -> the source students get (the stub)."""
    nb = nbformat.read(ROOT / "exercises" / assignment / f"{assignment}.ipynb", as_version=4)
    return {nbgrader_meta(c)["grade_id"]: c.source for c in nb.cells if nbgrader_meta(c).get("solution")}


PARTIAL, ALL_OR_NOTHING = Credit(step=0.5), Credit(all_or_nothing=True)


def part_named(assignment: str, name: str) -> harness.Part:
    return next(p for p in harness.parts(assignment) if name in (p.name, p.grade_id))


@pytest.mark.parametrize("assignment, part", PARTS, ids=lambda x: getattr(x, "name", x))
def test_the_instructors_answer_passes_every_test_cell(assignment, part):
    outcomes = harness.run_tests(part, harness.namespace(assignment))
    assert [t.grade_id for t in part.tests] == [o.test.grade_id for o in outcomes] and len(outcomes) >= 2
    for o in outcomes:
        assert o.failure is None, f"{assignment} {o.test.grade_id}:\n{o.failure}"
        assert o.lines and o.lines[-1].endswith("checks passed"), o.lines
        assert o.clauses and all(ok for _, _, ok in o.clauses)  # full marks under either kind of credit


@pytest.mark.parametrize("assignment, part", PARTS, ids=lambda x: getattr(x, "name", x))
def test_an_unanswered_part_fails_plainly(assignment, part):
    ns = harness.namespace(assignment, {part.grade_id: released_answers(assignment)[part.grade_id]})
    for o in harness.run_tests(part, ns):
        assert o.failure is not None and "not implemented yet" in o.failure, f"{o.test.grade_id}: {o.failure}"
        assert PARTIAL.score(o.test.points, list(o.clauses)) == 0, o.clauses  # no credit for a stub


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_untouched_release_fails_everywhere_without_crashing_a_grader(assignment):
    ns = harness.namespace(assignment, release=True)
    for part in harness.parts(assignment):
        for o in harness.run_tests(part, ns):
            assert o.failure is not None and o.hints, (
                f"{o.test.grade_id} did not fail as a grader: {o.failure}"
            )
            assert PARTIAL.score(o.test.points, list(o.clauses)) == 0, (o.test.grade_id, o.clauses)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_catalogue_covers_every_part(assignment):
    mutants = catalogue(assignment)
    assert len({m.name for m in mutants}) == len(mutants)
    named = {p.name for p in harness.parts(assignment)}
    assert named <= {m.part for m in mutants} <= named, (
        "every part needs wrong implementations, and only parts"
    )


@pytest.mark.parametrize("assignment, mutant", MUTANTS, ids=lambda x: getattr(x, "name", x))
def test_a_catalogued_mistake_loses_its_points_with_its_hint(assignment, mutant):
    ns = harness.namespace(assignment)
    exec(
        compile(mutant.source, f"<mutant {mutant.name}>", "exec"), ns
    )  # replaces one definition, as a student would
    part = part_named(assignment, mutant.part)
    # the part stops at the first check that fails with the hint: the checks after it would only
    # draw their inputs and pass; without the hint, every check runs and the failure shows them all
    token = core.STOP_WHEN.set(lambda hint: mutant.hint in hint)
    try:
        (hidden,) = harness.run_tests(part, ns, hidden=True)
    finally:
        core.STOP_WHEN.reset(token)
    assert hidden.failure is not None, f"{mutant.name} kept the hidden points of {part.name}"
    assert mutant.hint in hidden.failure, f"expected hint {mutant.hint!r}, got:\n{hidden.failure}"
    for credit in (PARTIAL, ALL_OR_NOTHING):  # loses points under either kind of credit
        kept = credit.score(hidden.test.points, list(hidden.clauses))
        assert kept < hidden.test.points or hidden.test.points == 0, (credit, kept, hidden.clauses)


@pytest.mark.parametrize("assignment", [c.assignment for c in CHAPTERS])
def test_parts_are_numbered_as_the_notebooks_headings_number_them(assignment):
    """One numbering everywhere: the grading harness (integrity table, book, instructor table), the
    autograder's plan (feedback, hints) and the headings the student reads ("Part 6", "Question 5a")."""
    from coursekit.autograde.plan import plan_notebook
    from coursekit.cells import heading, part_label

    nb = load(ROOT / "exercises" / assignment / f"{assignment}.ipynb")
    shown, title = {}, None
    for cell in nb.cells:
        title = (heading(cell.source) if cell.cell_type == "markdown" else None) or title
        if nbgrader_meta(cell).get("solution"):
            shown[nbgrader_meta(cell)["grade_id"]] = part_label(title)
    assert None not in shown.values(), shown
    assert {p.grade_id: p.number for p in harness.parts(assignment)} == {
        gid: n for gid, n in shown.items() if gid in {p.grade_id for p in harness.parts(assignment)}
    }
    plan = plan_notebook(load(ROOT / "solutions" / assignment / f"{assignment}.ipynb"), nb, assignment)
    assert {p["answer"]: p["number"] for p in plan.part_list()} == shown


def test_part_labels_come_from_part_and_question_headings():
    from coursekit.cells import part_label

    assert part_label("Part 6: the experiment") == "6"
    assert part_label("Question 5a") == "5a"
    assert part_label("Part 8 (stretch, optional): convert") == "8"
    assert part_label("Done") is None and part_label(None) is None
    assert part_label("Partition 3") is None


def test_fix_first_names_the_earlier_part_by_its_heading_number():
    order = [("a", ("f",)), ("p", ("predict_x",)), ("b", ("g",))]
    answers = {"b": "def g():\n    return f()\n"}
    assert harness.fix_first(order, answers, {"a", "b"}, {"a": "5a", "b": "6"}) == {
        "b": "part 5a (f) fails its own checks, and your g calls it: fix part 5a first"
    }


def test_a_part_that_calls_a_failing_earlier_part_is_told_to_fix_that_part_first():
    """Exercise 1: attention calls the student's softmax; with a wrong softmax, attention fails too."""
    order = [(p.grade_id, p.names) for p in harness.parts("ch01_attention")]
    answers = {p.grade_id: p.source for p in harness.parts("ch01_attention")}
    told = harness.fix_first(order, answers, {"softmax", "scaled_dot_product_attention", "causal_mask"})
    assert told == {
        "scaled_dot_product_attention": "part 1 (softmax) fails its own checks, and your "
        "scaled_dot_product_attention calls it: fix part 1 first"
    }
    answers["scaled_dot_product_attention"] = answers["scaled_dot_product_attention"].replace(
        "softmax(", "torch.softmax("
    )
    assert (
        harness.fix_first(order, answers, {"softmax", "scaled_dot_product_attention"}) == {}
    )  # it does not call it


def test_a_test_cell_calling_another_chapters_grader_is_refused():
    """The plan refuses a test cell of ch01 that calls ch02's grader (a thin call into
    ``coursekit.grading`` is not enough: it must be the assignment's own grader), names both, and
    accepts the same cell for an assignment the course does not list."""
    from coursekit.autograde.plan import _grader_of, plan_notebook

    nb = load(ROOT / "solutions" / "ch01_attention" / "ch01_attention.ipynb")
    test = next(c for c in nb.cells if nbgrader_meta(c).get("grade") and "import ch01_attention" in c.source)
    test.source = (
        test.source.replace("import ch01_attention", "import ch02_multihead")
        .replace(".check_softmax(", ".check_split_heads(")
        .replace(".grade_softmax(", ".grade_split_heads(")
    )
    with pytest.raises(
        ValueError,
        match="ch02_multihead.* is another chapter's grader: .* call coursekit.grading.ch01_attention only",
    ):
        plan_notebook(nb, nb, "ch01_attention", _grader_of("ch01_attention"))
    assert _grader_of("my_own_assignment") is None
    plan_notebook(nb, nb, "my_own_assignment", _grader_of("my_own_assignment"))
