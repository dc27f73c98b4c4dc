"""coursekit.inbox: collecting an untrusted folder of submissions into nbgrader's layout.

Every test builds a throwaway course (tests.submissions.course_folder) and an inbox in it,
collects, and checks what reached ``submitted/``, what was refused and what the students are
told. Notebooks here are small JSON files with a marker, so a test can tell whose bytes were
copied where; nbgrader's own ``parse_utc`` is the reference for the timestamps we write.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

import pytest
from nbgrader.utils import parse_utc

from coursekit import inbox
from coursekit.inbox import Collected, collect, collect_notes, printable, read_times
from tests.submissions import course_folder

A = "ch01_attention"
NB = "ch01_attention.ipynb"
UTC = dt.UTC
T0 = dt.datetime(2024, 3, 1, 16, 59, 30, 250000, tzinfo=UTC)  # a time no test machine's clock shows
T0_NS = (T0 - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1) * 1000  # exact, no float


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def course(tmp_path):
    return course_folder(tmp_path)


def nb(marker: str) -> bytes:
    return json.dumps({"cells": [{"cell_type": "code", "source": marker}], "nbformat": 4}).encode()


def put(path: Path, data: bytes | str = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def run(root: Path, box: Path, notebooks=(NB,), times=None, assignment=A) -> Collected:
    return collect(root, assignment, box, list(notebooks), times)


def sub(root: Path, student: str, assignment: str = A) -> Path:
    return root / "submitted" / student / assignment


def files(folder: Path) -> dict[str, bytes]:
    """Regular files under ``folder`` (relative path -> bytes); fails on any link."""
    out = {}
    for top, dirs, names in os.walk(folder):
        for name in dirs + names:
            assert not os.path.islink(os.path.join(top, name)), f"a link reached submitted/: {top}/{name}"
        for name in names:
            path = Path(top, name)
            out[str(path.relative_to(folder))] = path.read_bytes()
    return out


def refusal(collected: Collected, entry: str) -> str:
    reasons = [r.reason for r in collected.refused if r.entry == entry]
    assert len(reasons) == 1, f"expected one refusal of {entry!r}, got {collected.refused}"
    return reasons[0]


def stored(root: Path, student: str, assignment: str = A) -> dict:
    return json.loads((root / ".coursekit" / "collect" / assignment / f"{student}.json").read_text())


def all_submitted_bytes(root: Path) -> list[bytes]:
    return list(files(root / "submitted").values()) if (root / "submitted").exists() else []


def two_notebook_assignment(root: Path) -> list[str]:
    names = ["part_a.ipynb", "part_b.ipynb"]
    for name in names:
        put(root / "solutions" / "twonb" / name, nb(f"solution {name}"))
    return names


# --------------------------------------------------------------------------- links and special files


def test_symlinked_notebook_and_folder_are_refused_and_not_read(course):
    root, box = course
    solution = root / "solutions" / A / NB
    secret = solution.read_bytes()
    put(box / "alice.ipynb", nb("alice"))
    os.symlink(solution, box / "mallory.ipynb")  # a link to the solution as a lone notebook
    os.symlink(root / "solutions" / A, box / "eve")  # a linked student folder
    put(box / "alice2" / NB, nb("alice2"))
    os.symlink(box / "alice2", box / "oscar")  # a link to a classmate's folder
    put(box / "trudy" / "notes.md", "mine")
    os.symlink(solution, box / "trudy" / NB)  # a link inside a folder
    os.symlink(root / "solutions", box / "trudy" / "sub")  # a linked folder inside a folder

    c = run(root, box)

    assert c.students == ["alice", "alice2", "trudy"]
    for entry in ("mallory.ipynb", "eve", "oscar"):
        assert "link" in refusal(c, entry)
    for student in ("mallory", "eve", "oscar"):
        assert not (root / "submitted" / student).exists()
    assert files(sub(root, "trudy")).keys() == {"notes.md", "timestamp.txt"}
    assert any("skipped ch01_attention.ipynb" in n and "link" in n for n in c.notes["trudy"])
    assert any("skipped sub" in n and "link" in n for n in c.notes["trudy"])
    assert any("no notebook" in n for n in c.notes["trudy"])
    assert secret not in all_submitted_bytes(root)
    assert files(sub(root, "alice"))[NB] == nb("alice")


@pytest.mark.timeout(20)
def test_fifo_is_skipped_in_a_folder_and_refused_at_the_top(course):
    root, box = course
    put(box / "alice" / NB, nb("alice"))
    os.mkfifo(box / "alice" / "pipe")
    os.mkfifo(box / "alice" / "other.ipynb")  # a FIFO that looks like a notebook is no candidate
    os.mkfifo(box / "bob.ipynb")
    os.mkfifo(box / "carol")

    c = run(root, box)

    assert c.students == ["alice"]
    assert files(sub(root, "alice")).keys() == {NB, "timestamp.txt"}
    assert any("skipped pipe: not a regular file" in n for n in c.notes["alice"])
    assert any("skipped other.ipynb: not a regular file" in n for n in c.notes["alice"])
    assert "not a regular file" in refusal(c, "bob.ipynb")
    assert "not a regular file" in refusal(c, "carol")


# --------------------------------------------------------------------------- system clutter


def test_system_and_hidden_entries_are_ignored_at_every_depth(course):
    root, box = course
    put(box / ".ipynb_checkpoints" / "alice-checkpoint.ipynb", nb("checkpoint"))
    put(box / "__MACOSX" / "alice" / NB, nb("resource fork"))
    put(box / "._alice.ipynb", b"\x00\x05\x16\x07")
    put(box / ".DS_Store", b"\x00")
    put(box / "alice" / NB, nb("alice"))
    put(box / "alice" / ".ipynb_checkpoints" / "ch01_attention-checkpoint.ipynb", nb("checkpoint"))
    put(box / "alice" / "__MACOSX" / NB, nb("fork"))
    put(box / "alice" / f"._{NB}", b"\x00\x05\x16\x07")
    put(box / "alice" / "data" / ".hidden.csv", "x")

    c = run(root, box)

    assert c.students == ["alice"]
    assert c.refused == []
    assert c.ignored == [".DS_Store", "._alice.ipynb", ".ipynb_checkpoints", "__MACOSX"]
    assert files(sub(root, "alice")).keys() == {NB, "timestamp.txt"}
    assert files(sub(root, "alice"))[NB] == nb("alice")
    assert c.notes["alice"] == []  # nothing above was a second candidate


def test_renamed_notebook_next_to_a_checkpoint_and_an_appledouble_file_is_graded(course):
    root, box = course
    put(box / "alice" / "draft.ipynb", nb("alice's draft"))
    put(box / "alice" / ".ipynb_checkpoints" / "draft-checkpoint.ipynb", nb("older"))
    put(box / "alice" / "._draft.ipynb", b"\x00\x05\x16\x07")

    c = run(root, box)

    assert c.students == ["alice"]
    assert files(sub(root, "alice"))[NB] == nb("alice's draft")
    assert f"your notebook draft.ipynb was graded as {NB}" in c.notes["alice"]
    assert stored(root, "alice")["source"] == {NB: "alice/draft.ipynb"}


# --------------------------------------------------------------------------- choosing the notebook


def test_top_level_notebook_wins_over_a_nested_copy(course):
    root, box = course
    put(box / "alice" / NB, nb("new"))
    put(box / "alice" / "old" / NB, nb("old"))

    c = run(root, box)

    got = files(sub(root, "alice"))
    assert got[NB] == nb("new")
    assert nb("old") not in got.values()
    assert f"also in your folder, not graded: old/{NB}" in c.notes["alice"]


def test_one_nested_exact_match_is_used_and_the_note_says_where(course):
    root, box = course
    put(box / "bob" / "week1" / NB, nb("bob"))
    put(box / "bob" / "README.md", "hello")

    c = run(root, box)

    got = files(sub(root, "bob"))
    assert got[NB] == nb("bob")
    assert got["README.md"] == b"hello"
    assert any(f"week1/{NB}" in n and "top of your folder" in n for n in c.notes["bob"])


def test_several_candidates_and_none_at_the_top_refuse_the_student_only(course):
    root, box = course
    put(box / "carol" / "a" / NB, nb("a"))
    put(box / "carol" / "b" / NB, nb("b"))
    put(box / "dave" / "try1.ipynb", nb("1"))
    put(box / "dave" / "try2.ipynb", nb("2"))
    put(box / "erin.ipynb", nb("erin"))

    c = run(root, box)

    assert c.students == ["erin"]
    reason = refusal(c, "carol")
    assert f"a/{NB}" in reason and f"b/{NB}" in reason and "keep one" in reason
    reason = refusal(c, "dave")
    assert "try1.ipynb" in reason and "try2.ipynb" in reason and "keep one" in reason
    assert not (root / "submitted" / "carol").exists() and not (root / "submitted" / "dave").exists()


def test_a_folder_without_a_notebook_is_collected_as_not_submitted(course):
    root, box = course
    put(box / "frank" / "notes.txt", "I ran out of time")

    c = run(root, box)

    assert c.students == ["frank"]
    assert files(sub(root, "frank")).keys() == {"notes.txt", "timestamp.txt"}
    assert any("no notebook" in n and "not submitted" in n for n in c.notes["frank"])


def test_two_notebook_assignment(course):
    root, box = course
    names = two_notebook_assignment(root)
    put(box / "alice.ipynb", nb("alice"))  # a lone notebook cannot be two parts
    for name in names:
        put(box / "bob" / name, nb(f"bob {name}"))
    put(box / "carol" / "part_a.ipynb", nb("carol a"))  # part b not done
    put(box / "dave" / "part_a.ipynb", nb("dave a"))
    put(box / "dave" / "part_b (1).ipynb", nb("dave b?"))  # renamed by a browser: ambiguous

    c = run(root, box, names, assignment="twonb")

    assert c.students == ["bob", "carol"]
    assert "folder" in refusal(c, "alice.ipynb") and "2 notebooks" in refusal(c, "alice.ipynb")
    assert "part_b (1).ipynb" in refusal(c, "dave")
    bob = files(sub(root, "bob", "twonb"))
    assert bob.keys() == {*names, "timestamp.txt"}
    assert all(bob[n] == nb(f"bob {n}") for n in names)
    assert files(sub(root, "carol", "twonb")).keys() == {"part_a.ipynb", "timestamp.txt"}
    assert any("part_b.ipynb was not found" in n for n in c.notes["carol"])


# --------------------------------------------------------------------------- one student, one entry; odd names


def test_notebook_and_folder_for_one_student_refuse_that_student_only(course):
    root, box = course
    put(box / "alice.ipynb", nb("alice file"))
    put(box / "alice" / NB, nb("alice folder"))
    put(box / "bob.ipynb", nb("bob"))

    c = run(root, box)

    assert c.students == ["bob"]
    reason = refusal(c, "alice")
    assert "alice.ipynb" in reason and "keep one" in reason
    assert not (root / "submitted" / "alice").exists()


def test_ids_that_differ_only_by_case_refuse_both_and_name_each_other(course):
    root, box = course
    put(box / "alice.ipynb", nb("alice"))
    put(box / "Alice" / NB, nb("Alice"))
    put(box / "ALICE.ipynb", nb("ALICE"))
    put(box / "bob.ipynb", nb("bob"))

    c = run(root, box)

    assert c.students == ["bob"]
    assert {r.entry for r in c.refused} == {"alice.ipynb", "Alice", "ALICE.ipynb"}
    for entry, others in (("alice.ipynb", "ALICE, Alice"), ("Alice", "ALICE, alice")):
        reason = refusal(c, entry)
        assert others in reason and "differ only by case" in reason and "rename" in reason
    assert sorted(p.name for p in (root / "submitted").iterdir()) == ["bob"]


def test_an_id_that_differs_only_by_case_from_an_earlier_student_is_refused_and_keeps_the_earlier(course):
    root, box = course
    put(box / "alice.ipynb", nb("first"))
    assert run(root, box).students == ["alice"]
    (box / "alice.ipynb").unlink()
    put(box / "Alice.ipynb", nb("second"))
    put(box / "bob.ipynb", nb("bob"))

    c = run(root, box)

    assert c.students == ["bob"]
    reason = refusal(c, "Alice.ipynb")
    assert (
        "differs only by case from alice, already in submitted/" in reason
        and "rename the entry to alice" in reason
    )
    assert sorted(p.name for p in (root / "submitted").iterdir()) == ["alice", "bob"]
    assert files(sub(root, "alice"))[NB] == nb("first")


def test_other_top_level_files_are_refused_with_the_reason(course):
    root, box = course
    put(box / "alice.zip", b"PK\x03\x04")
    put(box / "notes.txt", "grading notes")
    put(box / "bob.ipynb", nb("bob"))

    c = run(root, box)

    assert c.students == ["bob"]
    for entry in ("alice.zip", "notes.txt"):
        assert "not a notebook or a folder: unzip archives first" in refusal(c, entry)


ODD = ["al ice", "jos\u00e9", "a" * 120, "\x1b[31mred", "\u202eevil", "tab\there", "-dash"]


@pytest.mark.parametrize("as_folder", [False, True], ids=["notebook", "folder"])
def test_odd_names_are_refused_printably_and_the_rest_is_collected(course, as_folder):
    root, box = course
    for name in ODD:
        put(box / name / NB if as_folder else box / f"{name}.ipynb", nb(name))
    put(box / "good" / NB, nb("good"))

    c = run(root, box)

    assert c.students == ["good"]
    assert len(c.refused) == len(ODD)
    for name in ODD:
        entry = name if as_folder else f"{name}.ipynb"
        reason = refusal(c, printable(entry))
        assert "not a valid student id" in reason and "letters" in reason
        assert printable(name) in reason
    for r in c.refused:
        for text in (r.entry, r.reason):
            assert "\x1b" not in text and "\u202e" not in text and "\t" not in text
    assert "jos\u00e9" in refusal(c, "jos\u00e9" if as_folder else "jos\u00e9.ipynb")  # letters stay readable
    assert sorted(p.name for p in (root / "submitted").iterdir()) == ["good"]


def test_a_trailing_newline_does_not_pass_the_id_check(course):
    root, box = course  # re's "$" matches before a final newline; ids are checked with fullmatch
    put(box / "alice\n.ipynb", nb("x"))
    put(box / "bob.ipynb", nb("bob"))

    c = run(root, box)

    assert c.students == ["bob"]
    assert "not a valid student id" in refusal(c, "alice\\x0a.ipynb")


# --------------------------------------------------------------------------- submission times


def test_a_students_timestamp_txt_is_ignored_and_the_notebook_mtime_is_used(course):
    root, box = course
    put(box / "alice" / NB, nb("alice"))
    put(box / "alice" / "timestamp.txt", "2000-01-01 00:00:00.000000 UTC")  # well before any deadline
    put(box / "alice" / "sub" / "timestamp.txt", "not a time")
    os.utime(box / "alice" / NB, ns=(0, T0_NS))
    put(box / "bob.ipynb", nb("bob"))
    os.utime(box / "bob.ipynb", ns=(0, T0_NS))

    c = run(root, box)

    for student in ("alice", "bob"):
        written = files(sub(root, student))["timestamp.txt"].decode()
        assert written.strip() == "2024-03-01 16:59:30.250000 UTC"
        assert parse_utc(written.strip()) == T0.replace(tzinfo=None)  # as nbgrader reads it
        assert dt.datetime.fromisoformat(stored(root, student)["timestamp"]) == T0
    assert "sub/timestamp.txt" not in files(sub(root, "alice"))
    assert any("ignored timestamp.txt" in n and "instructor's records" in n for n in c.notes["alice"])
    assert any("ignored sub/timestamp.txt" in n for n in c.notes["alice"])


def test_the_folder_mtime_is_used_when_there_is_no_notebook(course):
    root, box = course
    put(box / "frank" / "notes.txt", "none")
    os.utime(box / "frank", ns=(0, T0_NS))

    run(root, box)

    assert parse_utc(files(sub(root, "frank"))["timestamp.txt"].decode().strip()) == T0.replace(tzinfo=None)


def test_times_from_the_instructor_are_used_and_a_missing_student_gets_none(course):
    root, box = course
    put(box / "alice" / NB, nb("alice"))
    put(box / "alice" / "timestamp.txt", "2000-01-01 00:00:00.000000 UTC")
    put(box / "bob.ipynb", nb("bob"))
    when = dt.datetime(2024, 3, 1, 17, 59, tzinfo=dt.timezone(dt.timedelta(hours=1)))

    c = run(root, box, times={"alice": when})

    written = files(sub(root, "alice"))["timestamp.txt"].decode().strip()
    assert parse_utc(written) == dt.datetime(2024, 3, 1, 16, 59)
    assert "timestamp.txt" not in files(sub(root, "bob"))
    assert any("no submission time" in n for n in c.notes["bob"])
    assert stored(root, "bob")["timestamp"] is None


def test_read_times(tmp_path, monkeypatch):
    path = put(
        tmp_path / "times.csv",
        "\ufeffstudent,timestamp\n"
        "alice,2024-03-01T16:59:00Z\n"
        "\n"
        "bob, 2024-03-01 18:00:00+01:00\n"
        "carol,2024-03-01T19:00:00\n",
    )
    with monkeypatch.context() as m:
        m.setenv("TZ", "XYZ-2")  # POSIX: local time is UTC+2, no tz database needed
        time.tzset()
        times = read_times(path)
    time.tzset()
    assert times == {
        "alice": dt.datetime(2024, 3, 1, 16, 59, tzinfo=UTC),
        "bob": dt.datetime(2024, 3, 1, 17, 0, tzinfo=UTC),
        "carol": dt.datetime(2024, 3, 1, 17, 0, tzinfo=UTC),
    }
    assert all(t.tzinfo is UTC for t in times.values())


@pytest.mark.parametrize(
    "text, line, problem",
    [
        ("name,time\nalice,2024-03-01T16:59:00Z\n", 1, "header"),
        ("", 1, "header"),
        ("student,timestamp\nalice,2024-03-01T16:59:00Z,late\n", 2, "2 fields"),
        ("student,timestamp\nalice\n", 2, "2 fields"),
        ("student,timestamp\nal ice,2024-03-01T16:59:00Z\n", 2, "not a valid student id"),
        ("student,timestamp\n\x1b[2Jx,2024-03-01T16:59:00Z\n", 2, "\\x1b[2Jx"),
        ("student,timestamp\nalice,2024-03-01T16:59:00Z\nbob,yesterday\n", 3, "not an ISO 8601 time"),
        ("student,timestamp\nalice,2024-02-30T10:00:00\n", 2, "not an ISO 8601 time"),
        ("student,timestamp\nalice,2024-03-01T16:59:00Z\n\nalice,2024-03-02T16:59:00Z\n", 4, "listed twice"),
        # the year 0001 is ISO 8601 but no submission time; converting it to UTC overflowed
        ("student,timestamp\nalice,0001-01-01T00:00:00\n", 2, "out of range"),
        ("student,timestamp\nalice,0001-01-01T00:00:00+01:00\n", 2, "out of range"),
        ("student,timestamp\nalice,9999-12-31T23:00:00-05:00\n", 2, "out of range"),
        ("student,timestamp\nalice,1969-12-31T23:59:59Z\n", 2, "between the years 1970 and 9998"),
        ("student,timestamp\nalice,2024-03-01T16:59:00Z\nAlice,2024-03-02T16:59:00Z\n", 3, "as alice"),
    ],
)
def test_read_times_names_the_file_line_and_problem(tmp_path, text, line, problem):
    path = put(tmp_path / "times.csv", text)
    with pytest.raises(ValueError) as err:
        read_times(path)
    message = str(err.value)
    assert str(path) in message and f"line {line}:" in message and problem in message
    assert "\x1b" not in message


@pytest.mark.parametrize(
    "stamp", ["0001-01-01T00:00:00", "0001-01-01T00:00:00+01:00", "9999-12-31T23:00:00-05:00", "1900-01-01"]
)
def test_a_times_file_out_of_range_stops_the_run_with_one_line_and_grades_nothing(course, capsys, stamp):
    from coursekit import cli

    root, box = course
    put(box / "alice.ipynb", nb("alice"))
    path = put(root / "times.csv", f"student,timestamp\nalice,{stamp}\n")

    code = cli.main(["--course", str(root), "autograde", str(box), "--assignment", A, "--times", str(path)])

    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{path}, line 2: '{stamp}' is out of range" in err
    assert not (root / "submitted").exists() and not (root / "gradebook.db").exists()  # nothing graded


def test_a_times_path_that_is_a_folder_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="cannot be read"):
        read_times(tmp_path)


def test_read_times_rejects_a_file_that_is_not_utf8(tmp_path):
    path = put(tmp_path / "times.csv", b"student,timestamp\n\xff\xfe,2024\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_times(path)


# --------------------------------------------------------------------------- other files and sizes


def test_other_files_are_kept_up_to_200(course):
    root, box = course
    put(box / "alice" / NB, nb("alice"))
    for i in range(205):
        put(box / "alice" / "data" / f"f{i:03d}.txt", str(i))

    c = run(root, box)

    kept = files(sub(root, "alice"))
    assert sum(k.startswith("data/") for k in kept) == 200
    assert kept["data/f000.txt"] == b"0" and "data/f204.txt" not in kept
    assert any("not kept" in n and "data/f204.txt" in n and "200 files" in n for n in c.notes["alice"])


def test_other_files_are_kept_up_to_the_byte_cap(course, monkeypatch):
    root, box = course
    monkeypatch.setattr(inbox, "MAX_EXTRA_BYTES", 1000)  # the rule, at a size a test can afford
    put(box / "alice" / NB, nb("alice"))
    put(box / "alice" / "a.bin", b"a" * 600)
    put(box / "alice" / "b.bin", b"b" * 600)
    put(box / "alice" / "c.bin", b"c" * 300)

    c = run(root, box)

    kept = files(sub(root, "alice"))
    assert kept.keys() == {NB, "a.bin", "c.bin", "timestamp.txt"}
    assert any("not kept" in n and "b.bin" in n for n in c.notes["alice"])


def test_a_notebook_over_100_mib_refuses_its_student(course):
    root, box = course
    with open(box / "huge.ipynb", "wb") as f:
        f.truncate(101 * 2**20)  # sparse: costs no disk and is never read
    put(box / "bob.ipynb", nb("bob"))

    c = run(root, box)

    assert c.students == ["bob"]
    assert "100 MiB" in refusal(c, "huge.ipynb")
    assert not (root / "submitted" / "huge").exists()


# --------------------------------------------------------------------------- replacing submitted/


def test_a_collected_student_is_replaced_whole_and_a_refused_one_is_kept(course, tmp_path):
    root, box = course
    put(box / "alice" / NB, nb("alice v1"))
    put(box / "alice" / "old.txt", "from v1")
    put(box / "bob.ipynb", nb("bob v1"))
    first = run(root, box)
    assert first.students == ["alice", "bob"]
    bob_before = files(sub(root, "bob"))
    bob_notes = stored(root, "bob")

    box2 = tmp_path / "inbox2"
    put(box2 / "alice" / NB, nb("alice v2"))
    put(box2 / "bob.ipynb", nb("bob v2"))
    put(box2 / "bob" / NB, nb("bob v2 folder"))  # ambiguous: bob is refused this time
    second = run(root, box2)

    assert second.students == ["alice"]
    assert files(sub(root, "alice")).keys() == {NB, "timestamp.txt"}  # old.txt is gone
    assert files(sub(root, "alice"))[NB] == nb("alice v2")
    assert files(sub(root, "bob")) == bob_before
    assert stored(root, "bob") == bob_notes
    assert sorted(p.name for p in (root / "submitted").iterdir()) == ["alice", "bob"]  # no staging left


def test_a_failure_while_copying_leaves_the_earlier_copy_whole(course, tmp_path, monkeypatch):
    root, box = course
    put(box / "alice" / NB, nb("alice v1"))
    run(root, box)
    before = files(sub(root, "alice"))

    box2 = tmp_path / "inbox2"
    put(box2 / "alice" / NB, nb("alice v2"))
    put(box2 / "alice" / "extra.txt", "x")
    real_copy = inbox._copy
    calls = []

    def failing_copy(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:  # the notebook was staged, the disk fills on the next file
            raise OSError(28, "No space left on device")
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(inbox, "_copy", failing_copy)
    with pytest.raises(OSError, match="No space"):
        run(root, box2)

    assert files(sub(root, "alice")) == before
    assert sorted(p.name for p in (root / "submitted").iterdir()) == ["alice"]


def test_a_failure_while_swapping_in_restores_the_earlier_copy(course, tmp_path, monkeypatch):
    root, box = course
    put(box / "alice" / NB, nb("alice v1"))
    put(box / "alice" / "extra.txt", "v1")
    run(root, box)
    before = files(sub(root, "alice"))

    box2 = tmp_path / "inbox2"
    put(box2 / "alice" / NB, nb("alice v2"))
    real_rename = os.rename

    def failing_rename(src, dst, *args, **kwargs):
        if Path(src).name.startswith(".coursekit-collect-"):  # staging -> submitted/alice/A
            raise OSError(5, "Input/output error")
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(OSError, match="Input/output"):
        run(root, box2)
    monkeypatch.undo()

    assert files(sub(root, "alice")) == before
    assert sorted(p.name for p in (root / "submitted").iterdir()) == ["alice"]


# --------------------------------------------------------------------------- the inbox is read only


def snapshot(folder: Path) -> dict:
    out = {}
    for top, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = os.path.join(top, name)
            st = os.lstat(path)
            content = (
                os.readlink(path)
                if os.path.islink(path)
                else Path(path).read_bytes()
                if os.path.isfile(path)
                else None
            )
            out[os.path.relpath(path, folder)] = (st.st_mode, st.st_size, st.st_mtime_ns, content)
    return out


@pytest.mark.timeout(20)
def test_the_inbox_is_not_modified(course):
    root, box = course
    put(box / "alice" / NB, nb("alice"))
    put(box / "alice" / "old" / NB, nb("old"))
    put(box / "alice" / "timestamp.txt", "2000-01-01 00:00:00.000000 UTC")
    put(box / "bob" / "draft.ipynb", nb("bob"))
    put(box / "bob" / ".ipynb_checkpoints" / "draft-checkpoint.ipynb", nb("ck"))
    put(box / "carol.ipynb", nb("carol"))
    put(box / "carol" / NB, nb("carol"))
    put(box / "__MACOSX" / "._carol.ipynb", b"\x00")
    put(box / "al ice.ipynb", nb("x"))
    put(box / "archive.zip", b"PK")
    os.symlink(root / "solutions" / A / NB, box / "eve.ipynb")
    os.mkfifo(box / "bob" / "pipe")
    before = snapshot(box)

    c = run(root, box)

    assert c.students == ["alice", "bob"]
    assert snapshot(box) == before


# --------------------------------------------------------------------------- notes, errors


def test_notes_are_stored_for_the_autograder(course):
    root, box = course
    put(box / "alice" / "draft.ipynb", nb("alice"))
    put(box / "bob.ipynb", nb("bob"))

    c = run(root, box)

    assert collect_notes(root, A, "alice") == c.notes["alice"] != []
    assert collect_notes(root, A, "bob") == c.notes["bob"] == []
    assert collect_notes(root, A, "nobody") == []
    assert stored(root, "bob")["source"] == {NB: "bob.ipynb"}
    with pytest.raises(ValueError, match="not a student id"):
        collect_notes(root, A, "../alice")


def test_notes_name_odd_files_printably(course):
    root, box = course
    put(box / "alice" / "dr\x1b]0;pwned\x07aft.ipynb", nb("alice"))
    put(box / "alice" / "x\u202etxt.exe", "x")

    c = run(root, box)

    text = json.dumps(c.notes["alice"], ensure_ascii=False)
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert any("dr\\x1b]0;pwned\\x07aft.ipynb was graded as" in n for n in c.notes["alice"])
    assert files(sub(root, "alice")).keys() == {NB, "timestamp.txt"}  # the odd extra name is not copied


def test_an_inbox_that_is_not_a_folder_or_holds_no_submission_raises(course, tmp_path):
    root, box = course
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run(root, tmp_path / "missing")
    with pytest.raises(ValueError, match="no submissions in"):
        run(root, box)
    put(box / "__MACOSX" / "x", "x")
    put(box / ".ipynb_checkpoints" / "x", "x")
    with pytest.raises(ValueError, match="no submissions in"):
        run(root, box)
    with pytest.raises(ValueError, match="submitted/"):
        run(root, root)  # the course folder itself is not an inbox
    with pytest.raises(ValueError, match="no such assignment"):
        run(root, box, assignment="ch99_nothing")
    with pytest.raises(ValueError, match="plain file names"):
        run(root, box, notebooks=["../x.ipynb"])


def test_a_batch_of_refusals_only_does_not_raise(course):
    root, box = course
    put(box / "alice.zip", b"PK")

    c = run(root, box)

    assert c.students == [] and [r.entry for r in c.refused] == ["alice.zip"]


# --------------------------------------------------------------------------- printable


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("plain name.ipynb", "plain name.ipynb"),
        *[
            (letters, letters)
            for letters in [
                "caf\u00e9 \u00fcber",
                "\u65e5\u672c",
                "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
            ]
        ],
        ("\x00\x07\t\n\r\x1b[31m", "\\x00\\x07\\x09\\x0a\\x0d\\x1b[31m"),
        ("a\x7fb", "a\\x7fb"),
        ("\x85\x9b31m", "\\x85\\x9b31m"),  # C1: NEL and the 8-bit CSI
        ("evil\u202egnp.exe", "evil\\u202egnp.exe"),
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),
        ("\u200b\u200c\u200d\u200e\u200f\ufeff", "\\u200b\\u200c\\u200d\\u200e\\u200f\\ufeff"),
        ("a\u2028b", "a\\u2028b"),
        ("\udcff", "\\udcff"),  # an undecodable byte in a file name
        ("\U000e0041", "\\U000e0041"),  # a tag character (format control outside the BMP)
        ("back\\slash", "back\\slash"),
    ],
)
def test_printable(raw, shown):
    assert printable(raw) == shown
    assert printable(shown) == shown  # applying it again changes nothing
    assert shown.isprintable()
