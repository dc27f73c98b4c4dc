"""Run the adversarial suite through plain ``nbgrader autograde`` and write what it gets wrong.

    .venv/bin/python scripts/compare_nbgrader.py            # writes docs/autograder-vs-nbgrader.md

Each case of ``tests/adversarial.py`` is autograded by stock nbgrader (its own
kernel, the course's ``nbgrader_config.py``, a 10 s cell timeout instead of 120 s
to keep the run short) in a throwaway course folder, one student per
``nbgrader autograde --student`` call. The nbgrader process runs with a 6 GiB
address-space limit and a 256 MiB file-size limit so that the memory and disk bombs
cannot take this machine down; the fork bomb is not run at all (as root, nothing
would stop it). The expected scores are the ones ``coursekit autograde`` must give
(``tests/test_adversarial.py`` checks them); this script only documents the
difference, it is not a test.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.adversarial import ASSIGNMENT, CASES, Context, daemon_seconds, write  # noqa: E402
from tests.submissions import Listener, course_folder  # noqa: E402

SKIP = {
    "fork_bomb": "not run: without a sandbox nothing stops a fork bomb (as root, RLIMIT_NPROC does not apply)",
    "sigstop_the_sandbox": "not run: it stops nbgrader's own process (the kernel's parent), which then waits forever",
    "reply_channel_compressed": "not applicable: it attacks the wire between coursekit's sandbox and its grader",
}
SECRET = "plain-nbgrader-secret-1b7c"
OUT = ROOT / "docs" / "autograder-vs-nbgrader.md"


def limits():
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 20, 256 << 20))


def main() -> None:
    from nbgrader.api import Gradebook, MissingEntry

    from coursekit import course
    from coursekit import inbox as inbox_module

    tmp = Path(tempfile.mkdtemp(prefix="plain-nbgrader-"))
    root, inbox = course_folder(tmp)
    listener = Listener().start()
    reached = listener.received
    ctx = Context(course=str(root), port=listener.port, secret=SECRET)
    cases = [c for c in CASES if c.name not in SKIP]
    for case in cases:
        write(case, inbox, ctx)
    inbox_module.collect(root, ASSIGNMENT, inbox, [f"{ASSIGNMENT}.ipynb"])
    api = course.nbgrader_api(root, **{"CourseDirectory.release_directory": str(tmp / "release")})
    course.expect_success(
        api.generate_assignment(ASSIGNMENT, force=True, create=True), "registering the assignment"
    )
    env = dict(
        os.environ, COURSEKIT_TEST_SECRET=SECRET, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    )
    rows = []
    for case in CASES:
        if case.name in SKIP:
            rows.append((case, None, SKIP[case.name], "", 0.0))
            continue
        before = len(reached)
        started = time.monotonic()
        try:
            run = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "nbgrader",
                    "autograde",
                    ASSIGNMENT,
                    "--student",
                    case.name,
                    "--force",
                    "--ExecutePreprocessor.timeout=10",
                    f"--CourseDirectory.root={root}",
                    "--Exchange.root=" + str(tmp / "exchange"),
                ],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                preexec_fn=limits,
            )
            failed = run.returncode != 0
            log = run.stdout + run.stderr
        except subprocess.TimeoutExpired:
            failed, log = True, "nbgrader did not finish within 300 s"
        seconds = time.monotonic() - started
        with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
            try:
                score = float(gb.find_submission(ASSIGNMENT, case.name).score)
            except MissingEntry:
                score = None
        note = ""
        if failed:
            lines = [
                line
                for line in log.splitlines()
                if "rror" in line and "Please see" not in line and "Traceback" not in line
            ]
            lines = lines or log.splitlines()[-1:]
            note = "nbgrader failed: " + (
                lines[-1].replace("[AutogradeApp | ERROR]", "").strip()[:160] if lines else "no output"
            )
            if score is not None:
                note += f" (the gradebook holds {score:g})"
            score = None
        leak = leak_evidence(case.name, root, reached[before:])
        rows.append((case, score, note, leak, seconds))
        print(
            (
                f"{case.name:32s} expected {case.expected:>4g}  nbgrader "
                f"{score if score is not None else '-':>4}  {note[:60]} {leak}"
            ),
            flush=True,
        )
    listener.close()
    cleanup(root, ctx)
    write_report(rows)
    shutil.rmtree(tmp, ignore_errors=True)


def leak_evidence(name: str, root: Path, reached: list[bytes]) -> str:
    """What a confidentiality case managed to do under plain nbgrader."""
    text = ""
    path = root / "autograded" / name / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    if path.is_file():
        nb = json.loads(path.read_text())
        text = json.dumps([c.get("outputs", []) for c in nb["cells"]])
    found = []
    if name == "network" and reached:
        found.append("the notebook reached the grader's network")
    if name == "environment" and SECRET in text:
        found.append("the grader's environment (a secret) is in the student's outputs")
    if name == "read_solutions" and "SOLUTIONS READ: True" in text:
        found.append("the instructor's solutions were read")
    if name == "read_gradebook" and "SQLite" in text:
        found.append("the gradebook was read")
    if name == "write_outside" and (
        (root / "pwned.txt").exists()
        or (Path(sys.prefix) / "pwned.txt").exists()
        or Path("/usr/pwned.txt").exists()
    ):
        found.append("files were written outside the submission")
    if name == "list_processes" and '"PIDS' in text:
        found.append("the grader's processes are visible")
    if name == "pre_run_hook_steals_tests" and "grade_softmax" in text:
        found.append("the hidden tests were copied into the student's outputs")
    if path.is_file() and _active(nbformat.read(path, as_version=4)):
        found.append("the student's HTML or JavaScript is live in the notebook formgrader renders")
    return "; ".join(found)


def _active(nb) -> bool:
    """Does the notebook hold content that would run or fetch in a browser (by coursekit.inert's
    rules; the release's own markdown, with its links to the book, does not count)?"""
    from coursekit.inert import clean_outputs, inert_markdown

    release = nbformat.read(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    ours = {c.source for c in release.cells}
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source not in ours and inert_markdown(cell.source)[1]:
            return True
        for output in cell.get("outputs", []):
            if "data" not in output:
                continue
            kept = clean_outputs([dict(output, metadata={})])[0]
            if not kept or kept[0]["data"] != output["data"]:  # sanitised HTML, dropped JavaScript or SVG
                return True
            sizes = [
                v
                for m in output.get("metadata", {}).values()
                if isinstance(m, dict)
                for k, v in m.items()
                if k in ("width", "height")
            ]
            if any(not isinstance(v, int) for v in sizes):  # written unquoted into <img>
                return True
    return False


def cleanup(root: Path, ctx: Context) -> None:
    for path in (root / "pwned.txt", Path(sys.prefix) / "pwned.txt", Path("/usr/pwned.txt")):
        try:
            path.unlink()
        except OSError:
            pass
    # the daemon case's process, by its run-unique argument (never another run's)
    subprocess.run(["pkill", "-f", f"^sleep {daemon_seconds(ctx)}$"], check=False)


def write_report(rows) -> None:
    def is_wrong(case, score, leak):
        return case.name not in SKIP and (score != case.expected or bool(leak))

    wrong = [r for r in rows if is_wrong(r[0], r[1], r[3])]
    lines = [
        "# What plain nbgrader gets wrong on the adversarial suite",
        "",
        "Generated by `.venv/bin/python scripts/compare_nbgrader.py` (nbgrader "
        f"{_version('nbgrader')}, one `nbgrader autograde --student` call per case, 10 s cell timeout, "
        "the nbgrader process limited to 6 GiB of address space and 256 MiB files). "
        "`expected` is the score `coursekit autograde` gives, checked by `tests/test_adversarial.py`; "
        "the cases are in `tests/adversarial.py`.",
        "",
        f"Plain nbgrader gets **{len(wrong)} of {len(rows)}** cases wrong (a wrong score, no score at all, or a leak).",
        "",
        "| case | category | expected | plain nbgrader | what happened |",
        "|---|---|---:|---:|---|",
    ]
    for case, score, note, leak, seconds in rows:
        got = "not run" if case.name in SKIP else ("no score" if score is None else f"{score:g}")
        mark = " **wrong**" if is_wrong(case, score, leak) else ""
        what = "; ".join(filter(None, [note, leak])).replace("|", "/")
        timing = f" ({seconds:.0f} s)" if case.name not in SKIP else ""
        lines.append(
            f"| `{case.name}` | {case.category} | {case.expected:g} | {got}{mark} | {what}{timing} |"
        )
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


def _version(dist: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(dist)


if __name__ == "__main__":
    main()
