"""Odd but possible submissions through ``coursekit autograde``, in one batch with a correct one.

Each was a failure of a hostile examination (issue 29, item 7): a lone surrogate in one code cell
(``"\\ud800"`` in the JSON) stopped the whole batch and every later run and report; a valid
format 3 notebook scored 0; a student's heading named like a graded cell took that cell's HTML id
in the formgrader, where the hand grade was then saved nowhere; a 21 MB image in a written answer
made 20 MB pages. Here each student must be graded like the reference, with a note, and the pages
must say what was changed.
"""

from __future__ import annotations

import base64
import copy
import csv
import json
import re

import nbformat
import pytest

from coursekit import cli
from tests.submissions import course_folder, filled, points

pytestmark = pytest.mark.slow

A = "ch01_attention"
AUTO, MANUAL = points(A)
WRITTEN = "written_scaling"  # the written answer's grade id, graded by hand in the formgrader


def _cell(data: dict, grade_id: str) -> dict:
    return next(
        c for c in data["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id
    )


def _submissions() -> dict[str, bytes]:
    reference = filled(A)
    data = json.loads(nbformat.writes(reference))
    out = {"alice": json.dumps(data).encode()}

    surrogate = copy.deepcopy(data)  # the examination's case: an added code cell with "\ud800" in its JSON
    surrogate["cells"].insert(3, nbformat.v4.new_code_cell('s = "\ud800"\nprint(len(s))'))
    surrogate["cells"][3].pop("id")
    out["bob"] = json.dumps(surrogate).encode()
    assert b"\\ud800" in out["bob"]

    out["carol"] = nbformat.writes(copy.deepcopy(reference), version=3).encode()

    heading = copy.deepcopy(data)
    written = _cell(heading, WRITTEN)
    written["source"] = f"## {WRITTEN}\n\n{''.join(written['source'])}"
    heading["cells"].append({"cell_type": "markdown", "metadata": {}, "source": f"# {WRITTEN}\nmy notes"})
    out["dave"] = json.dumps(heading).encode()

    image = copy.deepcopy(data)
    png = base64.b64encode(b"\x89PNG" + b"\0" * (16 * 2**20)).decode()  # 21 MiB of base64
    _cell(image, WRITTEN)["source"] = f"As the plot shows:\n\n![plot](data:image/png;base64,{png})\n"
    out["erin"] = json.dumps(image).encode()
    return out


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    root, inbox = course_folder(tmp_path_factory.mktemp("odd"))
    for student, raw in _submissions().items():
        (inbox / f"{student}.ipynb").write_bytes(raw)
    # --jobs 1: the pool is tested by test_autograde; here it would add two processes and a sandbox
    args = ["--course", str(root), "autograde", str(inbox), "--assignment", A, "--jobs", "1"]
    first = cli.main(args)
    with open(root / "grades.csv", newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f) if r["assignment"] == A}
    again = cli.main(args)
    report = cli.main(["--course", str(root), "report", "--assignment", A])
    return root, rows, (first, again, report)


def feedback(root, student: str) -> str:
    return (root / "feedback" / student / A / f"{A}.html").read_text(encoding="utf-8")


def test_every_student_is_graded_like_the_reference_and_later_runs_and_the_report_work(batch):
    root, rows, codes = batch
    assert codes == (0, 0, 0)
    assert {s: float(r["score"]) for s, r in rows.items()} == dict.fromkeys(
        ["alice", "bob", "carol", "dave", "erin"], AUTO
    )
    assert (root / "reports" / A / "report.html").is_file()


def test_a_lone_surrogate_is_replaced_with_a_note(batch):
    root, _, _ = batch
    page = feedback(root, "bob")
    assert "lone surrogate" in page and "U+FFFD" in page and "\ufffd" in page


def test_a_format_3_notebook_says_it_was_converted(batch):
    root, _, _ = batch
    assert "old format 3" in feedback(root, "carol")


def _ids(page: str) -> list[str]:
    return re.findall(r'\bid="([^"]*)"', page)


def test_a_heading_named_like_a_graded_cell_takes_no_id_of_the_graders_pages(batch):
    """On the student's feedback page and on the formgrader's page, as nbgrader renders it."""
    from nbconvert.exporters import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers

    root, _, _ = batch
    page = feedback(root, "dave")
    assert _ids(page).count(WRITTEN) <= 1 and f"## {WRITTEN}" in page and "named like a graded cell" in page

    exporter = HTMLExporter(template_name="formgrade", extra_template_basedirs=[handlers.template_path])
    resources = {
        "assignment_id": A,
        "notebook_id": A,
        "submission_id": "x",
        "index": 0,
        "total": 1,
        "base_url": "",
        "student": "dave",
        "last_name": None,
        "first_name": None,
        "notebook_path": "",
    }
    twice = {}
    for student in ("dave", "alice"):
        html, _ = exporter.from_filename(
            str(root / "autograded" / student / A / f"{A}.ipynb"), resources=resources
        )
        ids = _ids(html)
        assert ids.count(WRITTEN) == 1, student  # the score box the formgrader's script saves from
        assert ids.count(f"{WRITTEN}-comment") == 1, student
        twice[student] = {i for i in ids if ids.count(i) > 1}
    assert twice["dave"] == twice["alice"] == {"notebook", "notebook-container"}  # the template's own


def test_a_huge_image_in_a_written_answer_is_replaced_by_a_note(batch):
    root, _, _ = batch
    page = feedback(root, "erin")
    assert len(page.encode()) < 3 * 2**20, len(page)
    assert "an image of 21.3 MiB was removed: images are shown up to 2.0 MiB each" in page
    notebook = (root / "autograded" / "erin" / A / f"{A}.ipynb").stat().st_size
    assert notebook < 3 * 2**20
