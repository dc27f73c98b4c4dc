"""The end of step 4, *record*: each student's feedback page, made by nbgrader's feedback step.

The page shows each part's points and status (:class:`SummarizeParts`), each test cell's named
checks with their hints and never a hidden test's source (:class:`HideHiddenTests`), the
instructor's hand grades and comments, and no script (:func:`write_feedback` hardens it). After
grading by hand, :func:`regenerate_feedback` writes the pages again from the gradebook.
"""

from __future__ import annotations

from pathlib import Path

from nbgrader.preprocessors import NbGraderPreprocessor

from coursekit import course, inert
from coursekit.autograde.rebuild import nbgrader_meta
from coursekit.report import manual_status

__all__ = [
    "HIDDEN_PLACEHOLDER",
    "TEMPLATES",
    "HideHiddenTests",
    "SummarizeParts",
    "feedback_settings",
    "regenerate_feedback",
    "write_feedback",
]

HIDDEN_PLACEHOLDER = "# Hidden checks ran here when your notebook was graded; their results are below."


class SummarizeParts(NbGraderPreprocessor):
    """For the feedback page: each part's points (manual grades included, from nbgrader's
    ``GetGrades``) and whether it passed, failed or is not answered yet."""

    def preprocess(self, nb, resources):
        ours = nb.metadata.get("coursekit") or {}
        cells = {nbgrader_meta(c).get("grade_id"): c for c in nb.cells}
        summary = []
        for number, part in enumerate(ours.get("parts", []), start=1):
            tests = [cells[t] for t in part["tests"] if t in cells]
            score = sum(float(nbgrader_meta(c).get("score") or 0) for c in tests)
            points = sum(float(nbgrader_meta(c).get("points") or 0) for c in tests)
            results = [c.metadata.get("coursekit") or {} for c in tests]
            if part.get("manual"):  # a written answer: graded by hand in the formgrader, or not yet
                status = manual_status(
                    [nbgrader_meta(c).get("needs_manual_grade") for c in tests],
                    [nbgrader_meta(c).get("graded_by_hand") for c in tests],
                )
            elif points == 0:  # the stretch part (a bonus): its checks decide, not its 0 points
                status = (
                    "passed"
                    if results and all(r.get("passed") for r in results)
                    else "unanswered"
                    if results and all(r.get("unanswered") for r in results if not r.get("passed"))
                    else "failed"
                )
            else:
                status = (
                    "passed"
                    if score >= points
                    else "unanswered"
                    if results and all(r.get("unanswered") for r in results if not r.get("passed"))
                    else "failed"
                )
            summary.append(
                {
                    "number": part.get("number", number),  # the notebook's headings' numbering
                    "title": part["title"],
                    "anchor": part["tests"][0] if part["tests"] else "",
                    "score": score,
                    "points": points,
                    "status": status,
                }
            )
        resources.setdefault("coursekit", {}).update(
            parts=summary, notes=ours.get("notes", []), chapter=ours.get("chapter")
        )
        return nb, resources


class HideHiddenTests(NbGraderPreprocessor):
    """For the students' feedback: a test cell holding hidden tests shows a placeholder
    instead of its source (its results stay). The instructor's autograded copy is untouched."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and "BEGIN HIDDEN TESTS" in cell.source:
            cell.source = HIDDEN_PLACEHOLDER
        return cell, resources


def _feedback_preprocessors() -> list:
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import GetGrades

    class GetGradesAndWhoGaveThem(GetGrades):
        """nbgrader's ``GetGrades``, noting also whether a cell's grade was entered by hand (a written
        answer waits for one; nbgrader's score of a cell nobody graded yet is 0)."""

        def _get_score(self, cell, resources) -> None:
            super()._get_score(cell, resources)
            grade = self.gradebook.find_grade(
                cell.metadata["nbgrader"]["grade_id"], self.notebook_id, self.assignment_id, self.student_id
            )
            cell.metadata.nbgrader["graded_by_hand"] = grade.manual_score is not None
            cell.metadata.nbgrader["needs_manual_grade"] = bool(grade.needs_manual_grade)

    return [HideHiddenTests, GetGradesAndWhoGaveThem, SummarizeParts, CSSHTMLHeaderPreprocessor]


#: Our feedback page, made by nbgrader's feedback step: nbgrader asks for the template "feedback",
#: and ``coursekit/templates/feedback`` is the one found (we replace nbgrader's template folders).
TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


#: Jinja's compiled feedback templates, kept for the life of the process (see :func:`_feedback_exporter`)
_COMPILED_TEMPLATES: dict[str, bytes] = {}


def _feedback_exporter() -> type:
    """nbconvert's HTML exporter, with a Jinja environment that keeps its compiled templates for the
    life of the process: nbgrader makes a new exporter, and so a new environment, for every feedback
    page, which compiled its nine templates again (0.2 s of a page's 0.9). Jinja keys each one by its
    name and file and checks its source, so an edited template is compiled afresh."""
    import jinja2
    from nbconvert.exporters import HTMLExporter

    class CompiledTemplates(jinja2.BytecodeCache):
        def load_bytecode(self, bucket) -> None:
            if bucket.key in _COMPILED_TEMPLATES:
                bucket.bytecode_from_string(_COMPILED_TEMPLATES[bucket.key])

        def dump_bytecode(self, bucket) -> None:
            _COMPILED_TEMPLATES[bucket.key] = bucket.bytecode_to_string()

    class FeedbackExporter(HTMLExporter):
        def _create_environment(self):
            environment = super()._create_environment()
            environment.bytecode_cache = CompiledTemplates()
            return environment

    return FeedbackExporter


def feedback_settings() -> dict:
    """The nbgrader settings (``course.nbgrader_api`` overrides) under which nbgrader's feedback step
    writes *our* feedback page: hidden tests hidden, each part's result, the instructor's comments."""
    return {
        "GenerateFeedback.preprocessors": _feedback_preprocessors(),
        "GenerateFeedback.exporter_class": _feedback_exporter(),
        "HTMLExporter.extra_template_basedirs": [str(TEMPLATES)],
    }


def write_feedback(root: Path, api, assignment: str, student: str) -> str | None:
    """Write the feedback page(s) of ``student`` on ``assignment`` from the autograded notebook and
    the gradebook (hand grades and comments included), with their Content-Security-Policy, through
    ``api`` (made with :func:`feedback_settings`); return ``None``, or the line saying why not."""
    fb = api.generate_feedback(assignment, student, force=True)
    for page in (Path(root) / "feedback" / student / assignment).glob("*.html"):
        inert.harden_html_file(page)  # no script runs and nothing is fetched where the feedback is opened
    if fb.get("success"):
        return None
    return course.last_line(fb.get("error") or fb.get("log") or "unknown error")


def regenerate_feedback(root: Path, assignment: str, student: str | None = None) -> dict[str, str | None]:
    """Write the feedback of ``student`` (default: every student with an autograded ``assignment``)
    again from the gradebook as it is now: after grading by hand in the formgrader, the pages show the
    hand grades and comments without grading anything again. Returns student -> ``None`` or why not.

    Raises:
        ValueError: ``student`` has no autograded ``assignment`` (``coursekit autograde`` first).
    """
    root = Path(root)
    graded = root / "autograded"
    students = (
        [student]
        if student is not None
        else sorted(p.parent.name for p in graded.glob(f"*/{assignment}") if p.is_dir())
    )
    if student is not None and not (graded / student / assignment).is_dir():
        raise ValueError(f"{student} has no autograded {assignment}: run coursekit autograde first")
    api = course.nbgrader_api(root, **feedback_settings(), **{"NbGraderAPI.log_level": "ERROR"})
    return {s: write_feedback(root, api, assignment, s) for s in students}
