"""The class report after autograding: scores, a histogram, and the checks most often failed.

Written to ``reports/<assignment>/``: ``report.html`` (self-contained, figures
embedded), ``scores.csv`` (one row per student, with the autograder's notes) and
the figures as PNG files. Scores are read from the gradebook, so manual grades
count; the failed checks and their hints come from the verdicts.
"""

from __future__ import annotations

import base64
import collections
import csv
import html
import io
import json
from pathlib import Path

from coursekit.inert import with_csp

__all__ = ["write_report"]


def write_report(root: Path, assignment: str) -> Path:
    """Write the report for every graded student of ``assignment``; return the HTML path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from nbgrader.api import Gradebook, MissingEntry

    from coursekit import course

    api = course.nbgrader_api(root)
    verdicts = root / ".coursekit" / "verdicts" / assignment
    rows = []
    with Gradebook(api.coursedir.db_url) as gb:
        a = gb.find_assignment(assignment)
        max_score = float(a.max_score)
        for student in sorted(p.name for p in verdicts.iterdir() if p.is_dir()) if verdicts.is_dir() else []:
            try:
                score = float(gb.find_submission(assignment, student).score)
            except MissingEntry:
                continue
            notes, tests = [], {}
            for path in sorted((verdicts / student).glob("*.json")):
                v = json.loads(path.read_text())
                notes += v.get("notes", [])
                tests.update(v.get("tests", {}))
            rows.append({"student": student, "score": score, "notes": notes, "tests": tests})
    if not rows:
        raise ValueError(f"no graded submissions of {assignment} yet: run `coursekit autograde` first")

    out = root / "reports" / assignment
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scores.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "score", "max_score", "autograder_notes"])
        for r in rows:
            w.writerow([r["student"], f"{r['score']:g}", f"{max_score:g}", " | ".join(r["notes"])])

    # figure 1: total scores
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.hist([r["score"] for r in rows], bins=[x - 0.5 for x in range(int(max_score) + 2)], color="#4c72b0", edgecolor="white")
    ax.set_xlabel(f"score (out of {max_score:g})")
    ax.set_ylabel("students")
    ax.set_title(f"{assignment}: {len(rows)} submissions")
    fig.tight_layout()
    histogram = _save(fig, out / "scores.png")
    plt.close(fig)

    # figure 2: pass rate of each test cell
    cells = sorted({gid for r in rows for gid in r["tests"]}, key=lambda g: list(rows[0]["tests"]).index(g) if g in rows[0]["tests"] else 99)
    rates = [sum(bool(r["tests"].get(g, {}).get("passed")) for r in rows) / len(rows) for g in cells]
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(cells) + 1.2))
    ax.barh(cells[::-1], [100 * x for x in rates[::-1]], color="#55a868")
    ax.set_xlim(0, 100)
    ax.set_xlabel("students passing (%)")
    ax.set_ylabel("test cell")
    fig.tight_layout()
    passrate = _save(fig, out / "pass_rate.png")
    plt.close(fig)

    # the most common failed checks, with the hint students saw
    failed = collections.Counter()
    for r in rows:
        for test in r["tests"].values():
            checks = test.get("failed_checks")
            if checks:
                failed.update((str(check), str(hint)) for check, hint in checks)
            elif test.get("failure"):
                failed[("(whole test cell)", test["failure"].splitlines()[0])] += 1
    common = failed.most_common(15)

    e = html.escape
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(assignment)}: class report</title>",
        "<style>body{font-family:sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}"
        "img{max-width:100%}</style></head><body>",
        f"<h1>{e(assignment)}: class report</h1>",
        f"<p>{len(rows)} submissions; mean score {sum(r['score'] for r in rows) / len(rows):.2f} of {max_score:g}.</p>",
        f"<figure><img alt='histogram of scores' src='data:image/png;base64,{histogram}'><figcaption>Scores.</figcaption></figure>",
        f"<figure><img alt='pass rate per test cell' src='data:image/png;base64,{passrate}'><figcaption>Share of students passing each test cell.</figcaption></figure>",
        "<h2>Most common failed checks</h2><table><tr><th>students</th><th>check</th><th>hint shown</th></tr>",
        *(f"<tr><td>{n}</td><td>{e(check)}</td><td>{e(hint)}</td></tr>" for (check, hint), n in common),
        "</table><h2>Students</h2><table><tr><th>student</th><th>score</th><th>autograder notes</th></tr>",
        *(f"<tr><td>{e(r['student'])}</td><td>{r['score']:g}</td><td>{'<br>'.join(e(n) for n in r['notes'])}</td></tr>" for r in rows),
        "</table></body></html>",
    ]
    path = out / "report.html"
    path.write_text(with_csp("\n".join(parts)))  # student text is escaped above; no script may run either way
    return path


def _save(fig, path: Path) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    path.write_bytes(buf.getvalue())
    return base64.b64encode(buf.getvalue()).decode()
