"""The class report after autograding: scores per part, what the class got wrong, and who.

Written to ``reports/<assignment>/``: ``report.html`` (self-contained, figures embedded, no
script), ``scores.csv`` (one row per student: the total and one column per part, with the
autograder's notes) and the figures as PNG files. Scores come from the gradebook, so manual
grades count; which checks failed, and with which hint, comes from the verdicts.

A failed check is counted among the students who *answered* its part: a part left as
released ("not implemented yet") is counted apart, so one unanswered notebook cannot bury the
one real bug of the class under its rows.
"""

from __future__ import annotations

import base64
import collections
import csv
import html
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

from coursekit.exports import text_cell
from coursekit.inert import with_csp

__all__ = ["write_report", "class_rows"]


@dataclass
class PartResult:
    title: str
    score: float
    points: float
    status: str  # "passed", "failed" or "unanswered"; a written answer: "graded" (by hand) or "pending"
    failed: list[tuple[str, str]] = field(default_factory=list)  # (check, hint)


@dataclass
class StudentRow:
    student: str
    score: float
    max_score: float
    parts: list[PartResult]
    notes: list[str]
    feedback: str | None  # path of the feedback page, relative to the report

    @property
    def pending(self) -> int:
        """Answers of this student that still wait for a hand grade."""
        return sum(p.status == "pending" for p in self.parts)


def class_rows(root: Path, assignment: str) -> tuple[list[StudentRow], list[str]]:
    """Every graded student of ``assignment`` (scores from the gradebook, checks from the
    verdicts) and the part titles, in order."""
    from nbgrader.api import Gradebook, MissingEntry

    from coursekit import course

    verdicts = root / ".coursekit" / "verdicts" / assignment
    rows, titles = [], []
    with Gradebook(course.gradebook_url(root)) as gb:
        for student in sorted(p.name for p in verdicts.iterdir() if p.is_dir()) if verdicts.is_dir() else []:
            try:
                submission = gb.find_submission(assignment, student)
            except MissingEntry:
                continue
            cell_scores = {
                g.name: (float(g.score), float(g.max_score)) for nb in submission.notebooks for g in nb.grades
            }
            by_hand = {  # grade cell -> (needs a manual grade, given by hand)
                g.name: (bool(g.needs_manual_grade), g.manual_score is not None)
                for nb in submission.notebooks
                for g in nb.grades
            }
            notes, parts, feedback = [], [], None
            for path in sorted((verdicts / student).glob("*.json")):
                verdict = json.loads(path.read_text())
                notes += verdict.get("notes", [])
                for part in verdict.get("parts", []):
                    parts.append(_part(part, verdict["tests"], cell_scores, by_hand))
                page = root / "feedback" / student / assignment / f"{path.stem}.html"
                if feedback is None and page.is_file():
                    feedback = f"../../feedback/{student}/{assignment}/{path.stem}.html"
            titles = titles or [p.title for p in parts]
            rows.append(
                StudentRow(
                    student, float(submission.score), float(submission.max_score), parts, notes, feedback
                )
            )
    return rows, titles


def manual_status(needs: list, by_hand: list) -> str:
    """A written answer's status from its grade cells' "needs manual grade" flags and whether a score
    was given by hand: ``pending`` (waiting for the instructor), ``graded`` (by hand), or
    ``unanswered`` (left as released: nbgrader scored it 0 itself, there is nothing to grade)."""
    if any(needs):
        return "pending"
    return "graded" if by_hand and all(by_hand) else "unanswered"


def _part(part: dict, tests: dict, cell_scores: dict, by_hand: dict | None = None) -> PartResult:
    score = sum(cell_scores.get(t, (0.0, 0.0))[0] for t in part["tests"])
    points = sum(cell_scores.get(t, (0.0, tests.get(t, {}).get("points", 0.0)))[1] for t in part["tests"])
    if part.get("manual"):  # a written answer: graded by hand in the formgrader, or not yet
        flags = [(by_hand or {}).get(t, (True, False)) for t in part["tests"]]
        status = manual_status([n for n, _ in flags], [h for _, h in flags])
        return PartResult(part["title"], score, points, status, [])
    failed = [
        (str(name).split(": ", 1)[-1], str(hint))
        for t in part["tests"]
        for name, hint in tests.get(t, {}).get("failed_checks") or []
    ]
    whole = [
        tests[t]["failure"].splitlines()[0]
        for t in part["tests"]
        if t in tests
        and not tests[t]["passed"]
        and not tests[t].get("failed_checks")
        and tests[t].get("failure")
    ]
    unanswered = bool(failed) and all(h.startswith("not implemented yet") for _, h in failed)
    passed = score >= points
    if points == 0:  # the stretch part (a bonus): its checks decide, not its 0 points
        passed = all(tests.get(t, {}).get("passed") for t in part["tests"])
    status = "passed" if passed else "unanswered" if unanswered else "failed"
    return PartResult(
        part["title"], score, points, status, failed + [("(the whole test cell)", w) for w in whole]
    )


def write_report(root: Path, assignment: str) -> Path:
    """Write the report for every graded student of ``assignment``; return the HTML path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows, titles = class_rows(root, assignment)
    if not rows:
        raise ValueError(f"no graded submissions of {assignment} yet: run `coursekit autograde` first")
    max_score = rows[0].max_score
    out = root / "reports" / assignment
    out.mkdir(parents=True, exist_ok=True)

    with open(out / "scores.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "student",
                "score",
                "max_score",
                *map(text_cell, titles),
                "pending_hand_grades",
                "autograder_notes",
            ]
        )
        for r in rows:
            w.writerow(
                [
                    text_cell(r.student),
                    f"{r.score:g}",
                    f"{r.max_score:g}",
                    *(f"{p.score:g}" for p in r.parts),
                    str(r.pending),
                    text_cell(" | ".join(r.notes)),  # notes quote what students named: never a formula
                ]
            )

    # figure 1: total scores, one bar per possible score, students counted in whole numbers
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.hist(
        [r.score for r in rows],
        bins=[x - 0.5 for x in range(int(max_score) + 2)],
        color="#4c72b0",
        edgecolor="white",
    )
    ax.set_xlabel(f"score (out of {max_score:g})")
    ax.set_ylabel("students")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"{assignment}: {len(rows)} submissions")
    fig.tight_layout()
    histogram = _save(fig, out / "scores.png")
    plt.close(fig)

    # figure 2: each part, the share of students who passed it, failed it, or left it unanswered
    shares = {
        s: [sum(r.parts[i].status == s for r in rows) / len(rows) * 100 for i in range(len(titles))]
        for s in ("passed", "failed", "unanswered", "graded", "pending")
    }
    fig, ax = plt.subplots(figsize=(6.5, 0.55 * len(titles) + 1.4))
    left = [0.0] * len(titles)
    labels = [t if len(t) <= 40 else t[:39] + "…" for t in titles]
    for status, color in (
        ("passed", "#55a868"),
        ("failed", "#c44e52"),
        ("unanswered", "#dd8452"),
        ("graded", "#4c72b0"),  # written answers graded by hand
        ("pending", "#b0b0b0"),  # written answers waiting for the instructor
    ):
        if status in ("graded", "pending") and not any(shares[status]):
            continue  # an assignment without written answers
        ax.barh(labels[::-1], shares[status][::-1], left=left[::-1], color=color, label=status)
        left = [a + b for a, b in zip(left, shares[status])]
    ax.set_xlim(0, 100)
    ax.set_xlabel("students (%)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)
    fig.tight_layout()
    per_part = _save(fig, out / "parts.png")
    plt.close(fig)

    # the failed checks, ranked by how many of the students who answered the part failed them
    failed: collections.Counter = collections.Counter()
    answered, unanswered = collections.Counter(), collections.Counter()
    for r in rows:
        for i, p in enumerate(r.parts):
            if p.status == "unanswered":
                unanswered[i] += 1
                continue
            answered[i] += 1
            failed.update({(i, check, hint) for check, hint in p.failed})
    common = failed.most_common(20)
    flagged = integrity_signals(root, assignment)
    unisolated = unisolated_students(root, assignment)
    waiting = {r.student: r.pending for r in rows if r.pending}

    e = html.escape
    mean = sum(r.score for r in rows) / len(rows)
    part_cells = "".join(f"<th>{e(t)}</th>" for t in titles)
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{e(assignment)}: class report</title>",
        "<style>body{font:15px/1.5 system-ui,sans-serif;max-width:70rem;margin:1.5rem auto;padding:0 1rem;"
        "color:#1f2328}table{border-collapse:collapse;margin:.5rem 0}"
        "td,th{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;"
        "vertical-align:top}td.num{text-align:right}.wide{overflow-x:auto}img{max-width:100%;height:auto}"
        ".passed{background:#dafbe1}.failed{background:#fee4e2}.unanswered{background:#fff4ce}.pending{background:#eee}</style></head><body>",
        f"<h1>{e(assignment)}: class report</h1>",
        f"<p>{len(rows)} graded submissions; mean score {mean:.2f} of {max_score:g}.</p>",
        *(
            [
                f"<p class='pending'><strong>{sum(waiting.values())} answers wait for a hand grade</strong> "
                f"({e(', '.join(f'{s}: {n}' for s, n in waiting.items()))}): their totals lack those points "
                "until you grade them (<code>coursekit formgrader</code>).</p>"
            ]
            if waiting
            else []
        ),
        *(
            [
                f"<p><strong>Graded without isolation</strong> (<code>--sandbox rlimit</code>): "
                f"{e(', '.join(unisolated))}. Their code could read files of the grading machine outside its "
                "folder; it could not write the course folder, the gradebook or the Python environment.</p>"
            ]
            if unisolated
            else []
        ),
        f"<figure><img alt='Histogram of total scores: how many students got each score out of {max_score:g}' "
        f"src='data:image/png;base64,{histogram}'>"
        "<figcaption>Total scores (manual grades included).</figcaption></figure>",
        f"<figure><img alt='For each part, the share of students who passed it, failed it or left it unanswered' "
        f"src='data:image/png;base64,{per_part}'><figcaption>Each part: passed (full points), failed, or not "
        "answered (still as released).</figcaption></figure>",
        "<h2>Most common failed checks</h2><p>Counted among the students who answered the part; the last column says "
        "how many left it unanswered.</p>"
        "<div class='wide' tabindex='0' role='region' aria-label='Most common failed checks'>"
        "<table><tr><th>part</th><th>check</th><th>hint shown</th>"
        "<th>failed / answered</th><th>unanswered</th></tr>",
        *(
            f"<tr><td>{e(titles[i])}</td><td>{e(check)}</td><td>{e(hint)}</td><td class='num'>{n} / {answered[i]}</td>"
            f"<td class='num'>{unanswered[i]}</td></tr>"
            for (i, check, hint), n in common
        ),
        "</table></div>",
        "<h2>Integrity signals</h2><p>For you to look at: nothing was deducted. <em>reference</em>: the code "
        "reaches the course's reference implementation of a part; <em>copy of the reference</em>: an answer whose "
        "syntax tree is the reference's; <em>ruled-out call</em>: an answer calls a library function the exercise "
        "rules out; <em>near-identical</em>: two students' answers with the same tokens once "
        "comments, layout and local names are set aside.</p>",
        (
            "<div class='wide' tabindex='0' role='region' aria-label='Integrity signals'>"
            "<table><tr><th>signal</th><th>students</th><th>part</th><th>seen</th></tr>"
            + "".join(
                f"<tr><td>{e(f.kind)}</td><td>{e(', '.join(f.students))}</td><td>{e(f.part)}</td>"
                f"<td>{e(f.detail)}</td></tr>"
                for f in flagged
            )
            + "</table></div>"
            if flagged
            else "<p>None.</p>"
        ),
        (
            "<h2>Students</h2><div class='wide' tabindex='0' role='region' aria-label='Students' "
            f"><table><tr><th>student</th><th>score</th>{part_cells}<th>waiting for a hand "
            "grade</th><th>autograder notes</th></tr>"
        ),
        *(
            f"<tr><td>{_link(r)}</td><td class='num'>{r.score:g}</td>"
            + "".join(f"<td class='num {p.status}'>{p.score:g} / {p.points:g}</td>" for p in r.parts)
            + f"<td class='num{' pending' if r.pending else ''}'>{r.pending}</td>"
            + f"<td>{'<br>'.join(e(n) for n in r.notes)}</td></tr>"
            for r in rows
        ),
        "</table></div></body></html>",
    ]
    path = out / "report.html"
    path.write_text(with_csp("\n".join(parts)))  # student text is escaped above; no script may run either way
    return path


def unisolated_students(root: Path, assignment: str) -> list[str]:
    """The students whose verdict says their notebook ran with ``--sandbox rlimit`` (no bubblewrap)."""
    verdicts = root / ".coursekit" / "verdicts" / assignment
    found = set()
    for path in sorted(verdicts.glob("*/*.json")) if verdicts.is_dir() else []:
        if json.loads(path.read_text()).get("sandbox") == "rlimit":
            found.add(path.parent.name)
    return sorted(found)


def integrity_signals(root: Path, assignment: str) -> list:
    """The :mod:`coursekit.integrity` signals of the notebooks graded for ``assignment``."""
    import nbformat

    from coursekit.integrity import signals

    verdicts = root / ".coursekit" / "verdicts" / assignment
    notebooks, runtime, changed = {}, {}, {}
    for path in sorted(verdicts.glob(f"*/{assignment}.json")) if verdicts.is_dir() else []:
        verdict = json.loads(path.read_text())
        normalized = verdict.get("normalized")
        if normalized:  # through reads, which joins each cell's lines into one string
            notebooks[path.parent.name] = nbformat.reads(json.dumps(normalized), as_version=4)
        if verdict.get("reference_calls"):
            runtime[path.parent.name] = [str(c) for c in verdict["reference_calls"]]
        if verdict.get("prediction_changes"):
            changed[path.parent.name] = [tuple(map(str, c)) for c in verdict["prediction_changes"]]
    released = root / "exercises" / assignment / f"{assignment}.ipynb"
    release = nbformat.read(released, as_version=4) if released.is_file() else nbformat.v4.new_notebook()
    return signals(assignment, notebooks, release, runtime, changed)


def _link(row: StudentRow) -> str:
    name = html.escape(row.student)
    return f"<a href='{html.escape(row.feedback)}'>{name}</a>" if row.feedback else name


def _save(fig, path: Path) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    path.write_bytes(buf.getvalue())
    return base64.b64encode(buf.getvalue()).decode()
