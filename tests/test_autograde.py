"""Exercise 1 through ``coursekit autograde``: collect, sandbox, nbgrader, feedback, export.

One batch holds the reference solution, the instructor's notebook, the untouched
release and every mutant of the catalogue, autograded in a temporary course
folder. Then the integrity of the gradebook: identical re-runs (cached and fresh),
manual grades kept, one run at a time, backups, and resuming an interrupted run.
"""

from __future__ import annotations

import csv
import html
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from coursekit import autograde, cli
from coursekit.autograde.plan import load_plan
from coursekit.grading import harness
from tests.mutants.ch01_attention import MUTANTS
from tests.submissions import (
    ROOT,
    course_folder,
    filled,
    load,
    points,
    replace_definition,
    running_formgrader,
)
from tests.test_integrity import SHARED, renamed

pytestmark = [pytest.mark.slow, pytest.mark.bubblewrap]

#: students for the report's integrity signals: one reaches the reference, two share an answer
#: (everyone else's answers are the reference's, so "reference.ipynb" is the one who pasted it)
INTEGRITY = {
    "importer": (
        "softmax",
        "from coursekit.attention import softmax as reference\n\n\n"
        "def softmax(x, dim=-1):\n    return reference(x, dim)\n",
    ),
    "hider": (  # reaches it through a module name built at run time: only the sandbox sees the call
        "softmax",
        "def softmax(x, dim=-1):\n    import importlib\n\n"
        "    module = importlib.import_module('coursekit.' + 'attention')\n"
        "    return getattr(module, 'soft' + 'max')(x, dim)\n",
    ),
    "sharer_a": ("scaled_dot_product_attention", SHARED),
    "sharer_b": ("scaled_dot_product_attention", renamed(SHARED)),
}

ASSIGNMENT = "ch01_attention"
#: the mutants graded through the sandbox here: the first of each part's catalogue, and those the
#: tests below read (every mutant is graded in-process by ``tests/test_graders.py``; here each part
#: shows that the sandboxed path fails it with its hint, as the in-process one does)
NAMED = ("softmax_no_max_shift", "softmax_nan_on_masked_row", "attention_no_scaling")
BATCH = [m for i, m in enumerate(MUTANTS) if m.name in NAMED or m.part not in {n.part for n in MUTANTS[:i]}]
BATCH_BY_NAME = {m.name: m for m in BATCH}
#: graded part -> the grade id of its hidden test cell
HIDDEN_CELL = {p.name: t.grade_id for p in harness.parts(ASSIGNMENT) for t in p.tests if t.hidden}
AUTO, MANUAL = points(ASSIGNMENT)  # the autograded points, and the written answer's
#: the parts as the feedback lists them (the written answer before the stretch part, last)
PARTS = load_plan(ROOT, ASSIGNMENT, ROOT / "exercises").notebooks[0].part_list()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Autograde one class of fake students; return the course folder and the CSV rows."""
    root, inbox = course_folder(tmp_path_factory.mktemp("class"))
    reference = filled(ASSIGNMENT)
    nbformat.write(reference, inbox / "reference.ipynb")
    shutil.copy(ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", inbox / "solution.ipynb")
    nbformat.write(load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"), inbox / "untouched.ipynb")
    for m in BATCH:
        nbformat.write(replace_definition(reference, m.target, m.source), inbox / f"{m.name}.ipynb")
    for student, (name, source) in INTEGRITY.items():
        nbformat.write(replace_definition(reference, name, source), inbox / f"{student}.ipynb")
    csv_path = root / "grades.csv"
    assert (
        cli.main(
            [
                "--course",
                str(root),
                "autograde",
                str(inbox),
                "--assignment",
                ASSIGNMENT,
                "--csv",
                str(csv_path),
                "--jobs",
                "2",
            ]
        )
        == 0
    )
    with open(csv_path, newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    return root, rows


def score(rows, student):
    return float(rows[student]["score"]), float(rows[student]["max_score"])


@pytest.mark.parametrize("student", ["reference", "solution"])
def test_solution_scores_full_marks(graded, student):
    """The release filled in with the solutions, and the instructor's notebook itself."""
    _, rows = graded
    got, best = score(rows, student)
    assert MANUAL > 0 and (got, best) == (AUTO, AUTO + MANUAL)
    assert rows[student]["needs_manual_grade"] == "yes"  # the written answer waits for the instructor


def test_untouched_release_scores_zero_without_stopping_the_batch(graded):
    _, rows = graded
    assert score(rows, "untouched")[0] == 0
    assert len(rows) == len(BATCH) + 3 + len(INTEGRITY)  # everyone after it was graded


def test_the_batch_has_a_mutant_of_every_part():
    assert {m.part for m in BATCH} == {m.part for m in MUTANTS} and set(NAMED) <= {m.name for m in BATCH}


@pytest.mark.parametrize("mutant", BATCH, ids=lambda m: m.name)
def test_mutant_loses_its_part_with_its_hint(graded, mutant):
    root, rows = graded
    cell_id = HIDDEN_CELL[mutant.part]
    with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
        grade = gb.find_grade(cell_id, ASSIGNMENT, ASSIGNMENT, mutant.name)
        bonus = grade.max_score == 0  # the stretch part: failed, but it had no points to lose
        assert bonus or grade.score < grade.max_score, f"{cell_id} kept its points"
        verdict = _verdict(root, mutant.name)["tests"][cell_id]
        assert not verdict["passed"] and grade.score == verdict["score"]  # partial credit, as recorded
    got, _ = score(rows, mutant.name)
    assert got == AUTO if bonus else got < AUTO
    autograded = load(root / "autograded" / mutant.name / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    cell = next(c for c in autograded.cells if c.metadata.get("nbgrader", {}).get("grade_id") == cell_id)
    shown = "\n".join(str(o.get("evalue", "")) + str(o.get("text", "")) for o in cell.outputs)
    assert mutant.hint in shown, f"the student would not see {mutant.hint!r}; the cell shows:\n{shown}"


def _verdict(root, student):
    import json

    return json.loads(
        (root / ".coursekit" / "verdicts" / ASSIGNMENT / student / f"{ASSIGNMENT}.json").read_text()
    )


def test_a_part_with_some_clauses_passed_scores_their_share_through_nbgraders_partial_credit(graded):
    """A mutant that fails some of a part's checks and passes others keeps the passed checks' share
    of the points, rounded down to the course's step (nbgrader_config.py); the gradebook holds it."""
    from coursekit.autograde.credit import Credit

    root, _ = graded
    partial = []
    with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
        for m in BATCH:
            test = _verdict(root, m.name)["tests"][HIDDEN_CELL[m.part]]
            assert not test["passed"]
            expected = Credit(step=0.5).score(test["points"], [tuple(c) for c in test["clauses"]])
            assert test["score"] == expected < test["points"] or test["points"] == 0, (m.name, test["score"])
            grade = gb.find_grade(HIDDEN_CELL[m.part], ASSIGNMENT, ASSIGNMENT, m.name)
            assert grade.score == expected
            if 0 < expected:
                partial.append(m.name)
    assert partial, "no mutant of the batch keeps part of its points: partial credit is not exercised"
    page = (root / "feedback" / partial[0] / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    shares = _verdict(root, partial[0])["tests"][HIDDEN_CELL[BATCH_BY_NAME[partial[0]].part]]["clause_points"]
    assert f'<span class="share">({min(shares.values()):.2g} pt)</span>' in page  # each check's points


def test_feedback_is_written_for_every_student(graded):
    root, rows = graded
    for student in rows:
        html = root / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html"
        assert html.is_file()
    text = (root / "feedback" / "softmax_no_max_shift" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    assert "subtract the maximum" in text


def test_class_report_has_figures_and_the_common_failures(graded):
    root, rows = graded
    folder = root / "reports" / ASSIGNMENT
    page = (folder / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2
    assert any(html.escape(m.hint) in page for m in BATCH)  # the common failures table shows hints
    with open(folder / "scores.csv", newline="") as f:
        scores = {r["student"]: float(r["score"]) for r in csv.DictReader(f)}
    assert scores == {s: float(rows[s]["score"]) for s in rows}


def test_the_class_report_lists_integrity_signals(graded):
    import re

    root, _ = graded
    page = (root / "reports" / ASSIGNMENT / "report.html").read_text()
    rows = set(
        re.findall(
            r"<tr><td>(reference|reference at run time|copy of the reference|near-identical)</td>"
            r"<td>([^<]*)</td><td>([^<]*)</td>",
            page,
        )
    )
    assert ("reference", "importer", "part 1 (softmax)") in rows
    assert ("reference at run time", "importer", "part 1 (softmax)") in rows
    assert ("reference at run time", "hider", "part 1 (softmax)") in rows
    assert ("reference", "hider", "part 1 (softmax)") not in rows  # what the syntax tree does not show
    assert {r[1] for r in rows if r[0] == "reference at run time"} == {"importer", "hider"}
    assert ("copy of the reference", "reference", "part 3 (scaled_dot_product_attention)") in rows
    assert ("near-identical", "sharer_a, sharer_b", "part 3 (scaled_dot_product_attention)") in rows
    assert not any("untouched" in r[1] for r in rows)  # the release as handed out is nobody's answer


def _gradebook_scores(root):
    with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
        return {s.student.id: s.score for s in gb.assignment_submissions(ASSIGNMENT)}


def test_rerun_gives_identical_scores_cached_and_fresh(graded):
    root, rows = graded
    students = ["reference", "attention_no_scaling", "untouched"]
    before = _gradebook_scores(root)
    cached = autograde.autograde(root, ASSIGNMENT, students, feedback=False)
    assert all(r.cached for r in cached)
    fresh = autograde.autograde(root, ASSIGNMENT, students, feedback=False, fresh=True)
    assert not any(r.cached for r in fresh)
    for results in (cached, fresh):
        assert {r.student: r.score for r in results} == {s: float(rows[s]["score"]) for s in students}
    assert _gradebook_scores(root) == before


def test_manual_grades_survive_a_rerun(graded):
    root, _ = graded
    with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
        grade = gb.find_grade("softmax_hidden", ASSIGNMENT, ASSIGNMENT, "softmax_no_max_shift")
        grade.manual_score = 1.5  # the instructor gives partial credit by hand
        gb.db.commit()
    (result,) = autograde.autograde(root, ASSIGNMENT, ["softmax_no_max_shift"], feedback=False, fresh=True)
    with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
        grade = gb.find_grade("softmax_hidden", ASSIGNMENT, ASSIGNMENT, "softmax_no_max_shift")
        auto = _verdict(root, "softmax_no_max_shift")["tests"]["softmax_hidden"][
            "score"
        ]  # its partial credit
        assert grade.manual_score == 1.5 and grade.auto_score == auto < 1.5 and grade.score == 1.5
    assert result.score == float(_gradebook_scores(root)["softmax_no_max_shift"])


def test_a_second_run_waits_for_none_and_says_why(graded):
    root, _ = graded
    with autograde.course_lock(root):
        with pytest.raises(RuntimeError, match="another `coursekit autograde` is running"):
            autograde.autograde(root, ASSIGNMENT, ["reference"], feedback=False)
    assert (
        cli.main(["--course", str(root), "report", "--assignment", ASSIGNMENT]) == 0
    )  # the lock was released


def _tree(folder):
    """Every file under ``folder``: relative path -> bytes (what a run must not change)."""
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def test_a_run_refused_by_the_lock_changes_nothing(graded, tmp_path, capsys):
    """A second run stops before it collects: the first run's submissions and verdicts stay as they were."""
    root, _ = graded
    inbox = tmp_path / "other-inbox"
    inbox.mkdir()
    nbformat.write(load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"), inbox / "reference.ipynb")
    before = _tree(root / "submitted"), _tree(root / ".coursekit" / "verdicts"), _gradebook_scores(root)
    with autograde.course_lock(root):
        code = cli.main(
            ["--course", str(root), "autograde", str(inbox), "--assignment", ASSIGNMENT, "--no-feedback"]
        )
    assert code == 2 and "another `coursekit autograde` is running" in capsys.readouterr().err
    assert (
        _tree(root / "submitted"),
        _tree(root / ".coursekit" / "verdicts"),
        _gradebook_scores(root),
    ) == before


def test_a_submission_changed_behind_the_autograders_back_is_graded_again(graded):
    root, _ = graded
    target = root / "submitted" / "solution" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"  # full marks above
    target.write_bytes((ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_bytes())
    (result,) = autograde.autograde(root, ASSIGNMENT, ["solution"], feedback=False)
    assert not result.cached and result.score == 0


def test_a_damaged_gradebook_stops_the_run_with_one_line(tmp_path, capsys):
    root, inbox = course_folder(tmp_path)
    nbformat.write(filled(ASSIGNMENT), inbox / "alice.ipynb")
    (root / "gradebook.db").write_bytes(b"this is not a database" * 100)
    code = cli.main(
        ["--course", str(root), "autograde", str(inbox), "--assignment", ASSIGNMENT, "--no-feedback"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "is damaged" in err and "backups" in err
    assert not (root / "submitted").exists()  # nothing was collected


def test_each_run_backs_up_the_gradebook(graded):
    root, _ = graded
    before = set((root / ".coursekit" / "backups").glob("gradebook-*.db"))
    autograde.autograde(root, ASSIGNMENT, ["reference"], feedback=False)
    after = set((root / ".coursekit" / "backups").glob("gradebook-*.db"))
    (new,) = after - before
    with Gradebook(f"sqlite:///{new}") as gb:
        assert gb.find_submission(ASSIGNMENT, "reference").score == AUTO


def test_an_interrupted_run_resumes(graded, tmp_path):
    """Kill a run part-way; the next run grades only what is left and agrees with the class's run.
    The course takes the class's secret, so that its hidden inputs are the class's: a wrong answer's
    partial credit may differ between two courses' draws (a clause that some draws do not reach)."""
    class_root, rows = graded
    root, inbox = course_folder(tmp_path)
    (root / ".coursekit").mkdir(exist_ok=True)
    shutil.copy2(class_root / ".coursekit" / "secret", root / ".coursekit" / "secret")
    reference = filled(ASSIGNMENT)
    students = {}  # name -> who in the class handed in the same notebook
    for i in range(5):
        name, twin = f"s{i:02d}", "reference" if i % 2 == 0 else BATCH[i].name
        nb = reference if i % 2 == 0 else replace_definition(reference, BATCH[i].target, BATCH[i].source)
        nbformat.write(nb, inbox / f"{name}.ipynb")
        students[name] = twin
    names = list(students)
    command = [
        sys.executable,
        "-m",
        "coursekit.cli",
        "--course",
        str(root),
        "autograde",
        str(inbox),
        "--assignment",
        ASSIGNMENT,
        "--no-feedback",
    ]
    run = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    verdicts = root / ".coursekit" / "verdicts" / ASSIGNMENT
    deadline = time.monotonic() + 240
    while len(list(verdicts.glob("*/*.json"))) < 2 and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.2)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    done = len(list(verdicts.glob("*/*.json")))
    assert 2 <= done < len(names), "the run should have been stopped part-way"
    results = autograde.autograde(root, ASSIGNMENT, names, feedback=False)
    assert sum(r.cached for r in results) == done  # what was graded before the kill is not graded again
    assert {r.student: r.score for r in results} == {
        s: float(rows[twin]["score"]) for s, twin in students.items()
    }
    assert [r.score for r in results][::2] == [AUTO] * 3 and all(r.score < AUTO for r in results[1::2])


def test_a_part_failing_because_of_an_earlier_part_says_to_fix_that_part_first(graded):
    """A softmax that gives NaN on fully masked rows breaks the student's attention too."""
    root, rows = graded
    nb = load(root / "autograded" / "softmax_nan_on_masked_row" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "attention_hidden")
    shown = "\n".join(
        str(o.get("evalue", "")) + str(o.get("text", "")) for o in cell.outputs
    )  # (partial: text)
    assert "part 1 (softmax) fails its own checks, and your scaled_dot_product_attention calls it" in shown


WIDTHS = {"desktop": 1280, "phone": 390}


@pytest.mark.browser
def test_feedback_and_report_read_well_on_a_desktop_and_a_phone(graded, tmp_path):
    """Each part has a row with its points and result; each check its line and hint; an unanswered part
    one line per test cell; nothing is wider than a phone's screen. Screenshots: _build/screenshots/."""
    from tests.browser import chromium

    root, _ = graded
    shots = ROOT / "_build" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    pages = {
        "feedback-failing": root
        / "feedback"
        / "softmax_nan_on_masked_row"
        / ASSIGNMENT
        / f"{ASSIGNMENT}.html",
        "feedback-unanswered": root / "feedback" / "untouched" / ASSIGNMENT / f"{ASSIGNMENT}.html",
        "report": root / "reports" / ASSIGNMENT / "report.html",
    }
    driver = chromium(tmp_path / "profile")
    try:
        for name, page in pages.items():
            for device, width in WIDTHS.items():
                driver.set_window_size(width, 900)
                driver.get(page.as_uri())
                seen = driver.execute_script(
                    "const q = s => [...document.querySelectorAll(s)];"
                    "return {overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth,"
                    " parts: q('table.parts tr').length - 1, badges: q('.badge').map(b => b.textContent),"
                    " failed: q('ul.checks li.fail').length, hints: q('ul.checks li.fail .hint').length,"
                    " unanswered: q('section.test.todo').length, links: q('table a[href]').map(a => a.href),"
                    " text: document.body.innerText}"
                )
                driver.save_screenshot(str(shots / f"{name}-{device}.png"))
                assert seen["overflow"] <= 1, (
                    f"{name} is wider than the {device} screen by {seen['overflow']} px"
                )
                if name == "feedback-failing":
                    assert seen["parts"] == len(PARTS) and seen["badges"] == [
                        "failed",
                        "passed",
                        "failed",
                        "passed",
                        *(["passed"] * (len(PARTS) - 6)),
                        "waiting for your instructor",
                        "passed",
                    ]
                    assert (
                        seen["failed"] >= 2 and seen["hints"] == seen["failed"]
                    )  # every failed check has its hint
                    assert "fix part 1 first" in seen["text"] and "Traceback" not in seen["text"]
                elif name == "feedback-unanswered":
                    tests = sum(len(p["tests"]) for p in PARTS if not p["manual"])
                    assert (
                        seen["badges"]
                        == ["not answered"] * len(PARTS)  # the written answer too: nothing to grade
                        and seen["unanswered"] == tests
                        and seen["failed"] == 0
                    )
                    assert (
                        seen["text"].count("Not answered yet") == tests
                        and "not implemented yet" not in seen["text"]
                    )
                else:
                    students = [link for link in seen["links"] if "/feedback/" in link]
                    assert len(students) == len(BATCH) + 3 + len(INTEGRITY)
                    assert all(Path(link.removeprefix("file://")).is_file() for link in students)
    finally:
        driver.quit()


def test_scores_csv_has_a_column_per_part(graded):
    root, _ = graded
    assert cli.main(["--course", str(root), "report", "--assignment", ASSIGNMENT]) == 0
    # the gradebook now, not the fixture's first grades.csv: an earlier test may have added a manual grade
    totals = _gradebook_scores(root)
    with open(root / "reports" / ASSIGNMENT / "scores.csv", newline="") as f:
        table = list(csv.DictReader(f))
    parts = [p["title"] for p in PARTS]
    assert parts[:4] == [
        "Part 1: a stable softmax",
        "Part 2: the causal mask",
        "Part 3: scaled dot-product attention",
        "Part 4: a self-attention module",
    ]
    assert [c for c in table[0] if c in parts] == parts  # a column per part, written answer included
    for r in table:
        assert sum(float(r[p]) for p in parts) == float(r["score"]) == float(totals[r["student"]])


@pytest.fixture
def formgrader(graded, tmp_path):
    """``coursekit formgrader`` on this test's course, on a port of its own, with Jupyter's config and
    runtime folders inside the test's temporary folder."""
    root, _ = graded
    if not (root / "_vendor").exists():
        shutil.copytree(ROOT / "_vendor" / "mathjax", root / "_vendor" / "mathjax")
    with running_formgrader(root, tmp_path) as (session, api, _):
        yield session, api


def test_a_grade_entered_in_the_formgrader_reaches_the_exports_and_the_report_and_survives_a_rerun(
    graded, formgrader
):
    """The instructor grades the written answer (1.5 of its points) and awards the stretch part a bonus
    point through the formgrader's HTTP interface, as its page does; both reach ``grades.csv`` and the class
    report, and a fresh re-run of ``coursekit autograde`` keeps them."""
    root, rows = graded
    session, base = formgrader
    written = "written_scaling"  # the written answer of Exercise 1 (a markdown grade cell)
    stretch = HIDDEN_CELL["online_softmax"]
    student = "reference"
    (submission,) = [
        s
        for s in session.get(f"{base}/submitted_notebooks/{ASSIGNMENT}/{ASSIGNMENT}").json()
        if s["student"] == student
    ]
    grades = {
        g["name"]: g for g in session.get(f"{base}/grades", params={"submission_id": submission["id"]}).json()
    }
    assert grades[written]["auto_score"] is None and grades[written]["needs_manual_grade"]
    for name, body in (
        (written, {"manual_score": 1.5}),
        (stretch, {"manual_score": None, "extra_credit": 1}),
    ):
        reply = session.put(f"{base}/grade/{grades[name]['id']}", json=body)
        assert reply.status_code == 200, reply.text
    expected = AUTO + 1.5 + 1

    def check_everywhere(rerun: bool):
        exported = ["export", "--out", str(root / "exported.csv"), "--allow-pending"]  # the class: pending
        assert cli.main(["--course", str(root), *exported]) == 0
        with open(root / "exported.csv", newline="") as f:
            (row,) = [r for r in csv.DictReader(f) if r["student_id"] == student]
        # nbgrader flags a hand-given grade for review once the notebook is autograded again; the
        # autograder keeps the instructor's status where the answer did not change
        assert float(row["score"]) == expected and row["needs_manual_grade"] == "no", row
        assert cli.main(["--course", str(root), "report", "--assignment", ASSIGNMENT]) == 0
        with open(root / "reports" / ASSIGNMENT / "scores.csv", newline="") as f:
            (line,) = [r for r in csv.DictReader(f) if r["student"] == student]
        assert float(line["score"]) == expected
        assert any(float(v) == 1.5 for k, v in line.items() if "in your own words" in k), line
        page = (root / "reports" / ASSIGNMENT / "report.html").read_text()
        assert "graded" in page

    check_everywhere(rerun=False)
    (result,) = autograde.autograde(root, ASSIGNMENT, [student], feedback=True, fresh=True)
    assert result.score == expected
    check_everywhere(rerun=True)
    with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
        kept = gb.find_grade(written, ASSIGNMENT, ASSIGNMENT, student)
        assert (kept.manual_score, kept.auto_score) == (1.5, None)
    feedback = (root / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    assert "graded by hand" in feedback


def test_every_file_the_instructors_commands_write_is_ignored_by_git(graded):
    """Student data is never one ``git add -A`` from the repository: in a graded course folder (after
    autograde, report and every export, and a second inbox), git sees only the course's own files."""
    root, _ = graded
    shutil.copy(ROOT / ".gitignore", root)
    (root / "inbox-late").mkdir(exist_ok=True)
    (root / "inbox-late" / "zoe.ipynb").write_text("{}")
    (root / "times.csv").write_text("student,timestamp\n")
    for fmt in ("canvas", "moodle", "csv"):  # to their default paths, whatever pending grades say
        cli.main(["--course", str(root), "export", "--format", fmt, "--allow-pending"])
    assert {f"grades-{fmt}.csv" for fmt in ("canvas", "moodle", "csv")} <= {p.name for p in root.iterdir()}
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--ignored=no"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    seen = {line[3:].split("/")[0] for line in status}
    # exported.csv: an earlier test's `export --out`, a path the instructor chose
    assert seen - {"exported.csv"} <= {".gitignore", "nbgrader_config.py", "solutions"}, sorted(seen)
