"""The adversarial suite: hostile and broken submissions graded in one batch.

Each case of ``tests/adversarial.py`` must get exactly its expected score and show
its reason to the student (in the feedback: the autograder's notes, a check's
hint, or the output of their own cell). Some cases carry extra evidence that
nothing leaked: the feedback never shows hidden tests or the grader's
environment, nothing reached the network, nothing was written outside the sandbox,
and no process outlived the batch.
"""

from __future__ import annotations

import contextlib
import csv
import html
import io
import os
import re

import nbformat
import pytest

from coursekit import cli
from coursekit.inert import CSP, clean_outputs, inert_markdown
from tests.adversarial import ASSIGNMENT, CASES, INBOX, Context, daemon_seconds, write
from tests.browser import chromium, render, visit
from tests.submissions import ROOT, Listener, course_folder

SECRET = "coursekit-test-secret-4f2a"
# Short enough that the endless-loop cases end quickly, long enough that correct code finishes with
# another grading run on the same two cores (2 s per check failed correct answers there)
pytestmark = pytest.mark.bubblewrap  # the cases prove isolation: no network, no writes outside

LIMITS = ["--cell-timeout", "10", "--check-timeout", "6", "--timeout", "120", "--memory", "1"]


def test_catalogue_covers_every_category():
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)
    counts = {}
    for c in CASES:
        counts[c.category] = counts.get(c.category, 0) + 1
    assert set(counts) == {
        "structure",
        "resources",
        "subversion",
        "confidentiality",
        "integrity",
        "markup",
        "grader",
    }
    assert min(counts.values()) >= 4, counts


@pytest.fixture(scope="module")
def listener():
    """A TCP server on loopback that attacks try to reach, from the sandbox or from a browser."""
    with Listener() as server:
        yield server


@pytest.fixture(scope="module")
def batch(tmp_path_factory, listener):
    root, inbox = course_folder(tmp_path_factory.mktemp("class"))
    # each case's expected total counts its parts all or nothing, as the attack leaves them: this
    # course says so (tests/test_term.py and test_autograde.py grade with the default partial credit)
    with open(root / "nbgrader_config.py", "a") as f:
        f.write("\nc.CourseKit.all_or_nothing = True\n")
    ctx = Context(course=str(root), port=listener.port, secret=SECRET)
    for case in CASES:
        write(case, inbox, ctx)
    os.environ["COURSEKIT_TEST_SECRET"] = SECRET
    try:
        code = cli.main(
            [
                "--course",
                str(root),
                "autograde",
                str(inbox),
                "--assignment",
                ASSIGNMENT,
                "--csv",
                str(root / "grades.csv"),
                "--jobs",
                "2",
                *LIMITS,
            ]
        )
    finally:
        del os.environ["COURSEKIT_TEST_SECRET"]
    connections = list(listener.received)
    assert code == 0
    with open(root / "grades.csv", newline="") as f:
        scores = {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}
    return root, scores, connections


def feedback(root, student) -> str:
    """The text of a student's HTML feedback, without markup, every run of white space one space."""
    page = (root / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    page = re.sub(r"<style.*?</style>|<script.*?</script>", "", page, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.category}-{c.name}")
def test_case_gets_its_score_and_reason(batch, case):
    root, scores, _ = batch
    assert scores[case.name] == case.expected, (
        f"{case.name}: expected {case.expected}, got {scores[case.name]}"
    )
    text = feedback(root, case.name)
    assert case.reason in text, f"{case.name}: the feedback does not say {case.reason!r}"


@pytest.mark.slow
def test_feedback_never_shows_hidden_tests_or_the_graders_environment(batch):
    root, scores, _ = batch
    for student in scores:
        text = feedback(root, student)
        assert "BEGIN HIDDEN TESTS" not in text and ".grade_" not in text, student
        assert SECRET not in text and "NBGRADER" not in text, student
    assert "STOLEN" in feedback(
        root, "pre_run_hook_steals_tests"
    )  # the hook ran, and saw only the student's cells


@pytest.mark.slow
def test_nothing_reached_the_network(batch):
    _, _, connections = batch
    assert connections == []


@pytest.mark.slow
def test_nothing_was_written_outside_the_sandbox(batch):
    root, _, _ = batch
    assert not (root / "pwned.txt").exists()
    assert not (ROOT / ".venv" / "pwned.txt").exists()


@pytest.mark.slow
def test_the_sandbox_has_its_own_processes(batch):
    root, _, _ = batch
    listed = re.search(r"PIDS \[([0-9, ]*)\]", feedback(root, "list_processes")).group(1)
    pids = [int(p) for p in listed.split(",") if p.strip()]
    assert 0 < len(pids) < 10 and os.getpid() not in pids


@pytest.mark.slow
def test_no_process_outlives_the_batch(batch, listener):
    """Only what this run started: our own descendants, and the daemon by its run-unique argument."""
    import psutil

    left = []
    for p in psutil.Process().children(recursive=True):
        try:
            left.append(" ".join(p.cmdline()))
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            pass  # exited (a zombie runs nothing: e.g. the background book build, done, not yet reaped)
    assert not [c for c in left if "coursekit.sandbox.worker" in c or "bwrap" in c], left
    daemon = ["sleep", daemon_seconds(Context("", listener.port, ""))]
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == daemon]


def test_the_nbgrader_comparison_covers_the_current_catalogue():
    """docs/autograder-vs-nbgrader.md is generated by scripts/compare_nbgrader.py from this catalogue."""
    page = (ROOT / "docs" / "autograder-vs-nbgrader.md").read_text()
    listed = re.findall(r"^\| `([a-z0-9_]+)` \| (\w+) \| ([0-9.]+) \|", page, flags=re.M)
    assert sorted((n, c, float(e)) for n, c, e in listed) == sorted(
        (c.name, c.category, c.expected) for c in CASES
    ), "the comparison is stale: run .venv/bin/python scripts/compare_nbgrader.py"


SHOWN = [c for c in CASES if c.category in ("markup", "grader")]


def _autograded(root, student):
    return nbformat.read(root / "autograded" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)


@pytest.mark.slow
def test_feedback_and_the_formgraders_notebook_hold_only_inert_content(batch):
    """What the instructor's formgrader renders (the autograded notebook) and what the student
    opens (the feedback page, with a policy that forbids scripts and remote loads)."""
    root, _, _ = batch
    for case in SHOWN:
        page = (root / "feedback" / case.name / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
        head = page[page.index("<head>") + len("<head>") :].lstrip()
        assert head.startswith(f'<meta http-equiv="Content-Security-Policy" content="{CSP}"'), case.name
        nb = _autograded(root, case.name)
        nbformat.validate(nb)
        released = {  # ours: the release, and the read-only cells nbgrader restores from solutions/
            c.source
            for folder in ("exercises", "solutions")
            for c in nbformat.read(ROOT / folder / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4).cells
        }
        for cell in nb.cells:
            if (
                cell.cell_type == "markdown" and cell.source not in released
            ):  # the student's cells and our notes
                assert inert_markdown(cell.source) == (cell.source, False), (case.name, cell.source[:200])
            for output in cell.get("outputs", []):
                assert set(output.get("data", {})) <= {
                    "text/plain",
                    "text/html",
                    "text/latex",
                    "image/png",
                }, case.name
                assert output.get("metadata", {}) == {}, case.name
                assert clean_outputs([output])[0] == [output], (
                    case.name,
                    output,
                )  # already as clean as it gets


@pytest.mark.slow
@pytest.mark.browser
def test_no_student_script_runs_and_nothing_is_fetched_in_a_browser(batch, listener, tmp_path):
    root, _, _ = batch
    driver = chromium(tmp_path / "profile")
    try:
        seen = {}
        for case in SHOWN:
            feedback_page = root / "feedback" / case.name / ASSIGNMENT / f"{ASSIGNMENT}.html"
            formgrader_page = tmp_path / f"{case.name}-formgrade.html"
            formgrader_page.write_text(render(_autograded(root, case.name), "formgrade"), encoding="utf-8")
            for page in (feedback_page, formgrader_page):
                seen[str(page)] = visit(driver, listener, page)
    finally:
        driver.quit()
    for page, s in seen.items():
        assert s["pwned"] == [] and "pwned" not in s["title"], (page, s)
        assert s["requested"] == [] and s["stray"] == [] and s["risky_links"] == 0, (page, s)
    assert listener.received == []


@pytest.fixture(scope="module")
def inbox_batch(tmp_path_factory):
    """One CLI run over an inbox of every entry of ``INBOX``: what it printed and the grades."""
    root, inbox = course_folder(tmp_path_factory.mktemp("inbox-class"))
    for case in INBOX:
        case.make(inbox, root)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = cli.main(
            [
                "--course",
                str(root),
                "autograde",
                str(inbox),
                "--assignment",
                ASSIGNMENT,
                "--csv",
                str(root / "grades.csv"),
                "--jobs",
                "1",  # the pool is the first batch's (and test_autograde's); these few add no attack on it
                *LIMITS,
            ]
        )
    with open(root / "grades.csv", newline="") as f:
        scores = {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}
    return root, code, printed.getvalue(), scores


@pytest.mark.slow
@pytest.mark.parametrize("case", INBOX, ids=lambda c: c.name)
def test_inbox_entry_gets_its_score_or_its_refusal(inbox_batch, case):
    root, code, printed, scores = inbox_batch
    refusals = [line for line in printed.splitlines() if line.startswith("NOT COLLECTED")]
    if case.expected is None:
        assert any(case.reason in line and (case.student or "") in line for line in refusals), (
            case.name,
            refusals,
        )
        assert case.student not in scores or not case.student
        if case.student:
            assert not (root / "feedback" / case.student).exists()
    else:
        assert scores[case.student] == case.expected, (case.name, scores.get(case.student))
        assert case.reason in feedback(root, case.student), case.name


@pytest.mark.slow
def test_the_rest_of_an_odd_inbox_is_graded_and_nothing_raw_reaches_the_terminal(inbox_batch):
    root, code, printed, scores = inbox_batch
    assert code == 1  # entries were refused: the instructor must look
    assert "\x1b" not in printed and "NOT COLLECTED" in printed
    assert set(scores) == {c.student for c in INBOX if c.expected is not None}
    solution = (root / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text()
    # only the instructor's notebook holds it (students' answers hold the solutions' code)
    marker = "BEGIN HIDDEN TESTS"
    assert marker in solution
    for student in scores:  # the instructor's solution file reached nobody's feedback
        assert marker not in (root / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
