"""The coursekit command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from coursekit import cli
from tests.submissions import ROOT


def test_release_rejects_unknown_assignment(capsys):
    assert cli.main(["--course", str(ROOT), "release", "ch99_nothing"]) == 2
    assert "no such assignment in solutions/: ch99_nothing" in capsys.readouterr().err


@pytest.mark.bubblewrap  # without it, autograde stops earlier, on that
def test_autograde_rejects_missing_folder(tmp_path, capsys):
    assert (
        cli.main(
            ["--course", str(ROOT), "autograde", str(tmp_path / "nope"), "--assignment", "ch01_attention"]
        )
        == 2
    )
    assert "does not exist" in capsys.readouterr().err


def test_outside_a_course_folder_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["release", "--check"]) == 2
    assert "no nbgrader_config.py" in capsys.readouterr().err


@pytest.mark.slow
def test_doctor_finds_everything_in_a_set_up_environment():
    subprocess.run([str(ROOT / "scripts" / "install_mathjax.sh")], check=True, cwd=ROOT)
    run = subprocess.run(
        [sys.executable, "-m", "coursekit.cli", "doctor", "all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[ok] python3 kernel" in run.stdout and "FAIL" not in run.stdout
    assert "[ok] gradebook: sqlite:///" in run.stdout  # the course's default gradebook
    assert "ready for: grading, book, training, tests" in run.stdout


@pytest.mark.slow
def test_doctor_fails_only_on_what_the_chosen_job_needs(tmp_path):
    from tests.submissions import course_folder

    root, _ = course_folder(tmp_path)  # a course folder without the book's local MathJax

    def doctor(*jobs):
        return subprocess.run(
            [sys.executable, "-m", "coursekit.cli", "--course", str(root), "doctor", *jobs],
            capture_output=True,
            text=True,
            timeout=120,
        )

    for grading in (doctor("grading"), doctor()):  # plain doctor: what `make setup` prepares, grading
        assert (
            grading.returncode == 0
            and grading.stdout.rstrip().endswith("ready for: grading")
            and "MathJax" not in grading.stdout
        ), grading.stdout + grading.stderr
    book = doctor("grading", "book")
    assert book.returncode == 1 and "[FAIL] local MathJax" in book.stdout
    assert "ready for: grading; NOT ready for: book" in book.stdout
    assert doctor("cooking").returncode == 2


@pytest.mark.slow
def test_check_runs_the_public_checks_of_a_student_notebook(tmp_path, capsys):
    import nbformat

    from tests.submissions import ROOT, filled

    done = tmp_path / "done.ipynb"
    nbformat.write(filled("ch01_attention"), done)
    assert cli.main(["check", str(done)]) == 0
    out = capsys.readouterr().out
    from coursekit.grading import harness

    tests = [t for p in harness.parts("ch01_attention") for t in p.tests]
    public, hidden = (sum(t.points for t in tests if t.hidden is h) for h in (False, True))
    assert (
        f"public checks: {public:g} of {public:g} points; hidden checks worth {hidden:g} more points" in out
    )
    assert "[pass] softmax (public)" in out
    untouched = ROOT / "exercises" / "ch01_attention" / "ch01_attention.ipynb"
    assert cli.main(["check", str(untouched)]) == 1
    assert "not implemented yet" in capsys.readouterr().out
    (tmp_path / "bad.ipynb").write_text("{")
    assert cli.main(["check", str(tmp_path / "bad.ipynb")]) == 2


def test_check_prints_a_multi_line_failure_as_lines(tmp_path, monkeypatch, capsys):
    """A failed part's message holds one line per failed check: `coursekit check` prints them as lines
    (not with a literal \\x0a between them), and still escapes what could steer the terminal."""
    from coursekit import autograde
    from coursekit.autograde.check import CheckReport

    failure = "softmax (public): 2 of 5 checks failed\n  - sums to 1: divide by the sum\r\n  - dtype: keep x's dtype"
    report = CheckReport(["[pass] softmax (public): shape", failure, "note: \x1b[31mred"], 1.0, 3.0, 0.0)
    monkeypatch.setattr(autograde, "check_notebook", lambda *a, **kw: report)
    notebook = tmp_path / "done.ipynb"
    notebook.write_text("{}")
    assert cli.main(["check", str(notebook)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[:5] == [
        "[pass] softmax (public): shape",
        "softmax (public): 2 of 5 checks failed",
        "  - sums to 1: divide by the sum",
        "  - dtype: keep x's dtype",
        "note: \\x1b[31mred",  # an escape sequence is shown, not obeyed
    ]
    assert "\\x0a" not in "\n".join(out) and "\\x0d" not in "\n".join(out)
    assert out[5] == "public checks: 1 of 3 points"
