"""What grading an assignment needs, read once from trusted files: the *plan*.

For each notebook: the students' release, the thin calls of every test cell (from the
instructor's notebook), the points, which test cells are hidden, and which answer cell each
test cell grades. For the assignment: its data files, the course's secret (mixed into every
check's seed) and a fingerprint that changes when anything that decides a verdict changes.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import secrets
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

import coursekit
from coursekit.autograde.credit import Credit
from coursekit.cells import Call, is_test_cell, nbgrader_meta, part_label, thin_calls
from coursekit.cells import heading as cell_heading
from coursekit.grading import harness

__all__ = [
    "NotebookPlan",
    "Plan",
    "plan_notebook",
    "load_plan",
    "staged_plan",
    "course_secret",
    "resolve",
    "preload_modules",
]


@dataclass
class NotebookPlan:
    """What grading one notebook of an assignment needs, all from trusted files."""

    name: str
    release: nbformat.NotebookNode  # the students' version (answers blank, hidden tests removed)
    tests: dict[str, list[Call]]  # test cell grade id -> its thin calls (from the instructor's notebook)
    points: dict[str, float]  # grade id -> points, for every graded cell
    hidden: set[str]  # test cells whose checks students do not see
    parts: list[tuple[str, tuple[str, ...]]] = field(
        default_factory=list
    )  # (answer cell, names it defines), in order
    part_of: dict[str, str] = field(default_factory=dict)  # test cell grade id -> its answer cell
    titles: dict[str, str] = field(
        default_factory=dict
    )  # answer cell -> the heading of its part ("Part 1: ...")
    manual: set[str] = field(default_factory=set)  # answers graded by hand (written answers)
    labels: dict[str, str] = field(
        default_factory=dict
    )  # answer cell -> the part's number in the headings ("5a"): the one numbering shown everywhere

    def part_list(self) -> list[dict]:
        """The parts in order, as the feedback shows them: answer cell, title and test cells."""
        return [
            {
                "answer": gid,
                "number": self.labels.get(gid) or str(i),
                "title": self.titles.get(gid) or (names[0] if names else gid),
                "tests": [gid] if gid in self.manual else [t for t, a in self.part_of.items() if a == gid],
                "manual": gid in self.manual,
            }
            for i, (gid, names) in enumerate(self.parts, start=1)
        ]


@dataclass
class Plan:
    assignment: str
    notebooks: list[NotebookPlan]
    files: dict[str, bytes]  # data files shipped with the assignment
    fingerprint: str  # changes when the assignment or the grading code changes
    secret: bytes = b""  # the course's secret, mixed into the seeds of every check (see course_secret)
    credit: Credit = Credit()  # how a test cell's points follow its clauses (nbgrader_config.py's CourseKit)


def plan_notebook(
    source: nbformat.NotebookNode, release: nbformat.NotebookNode, name: str, grader: str | None = None
) -> NotebookPlan:
    """Read the test cells of the instructor's notebook ``source`` (raises ``ValueError``
    if one is not a thin call into ``coursekit.grading``, or, with ``grader`` (the chapter's grader
    module, :attr:`coursekit.chapters.Chapter.grader`), into another module than that one)."""
    tests, points, hidden, parts, part_of, titles, manual = {}, {}, set(), [], {}, {}, set()
    released = {nbgrader_meta(c).get("grade_id"): c for c in release.cells}
    heading = None
    for cell in source.cells:
        meta = nbgrader_meta(cell)
        gid = meta.get("grade_id")
        if cell.cell_type == "markdown":
            heading = cell_heading(cell.source) or heading
        if meta.get("grade"):
            points[gid] = float(meta.get("points", 0))
        if cell.cell_type == "code" and meta.get("solution"):
            parts.append((gid, harness.defined_names(cell.source)))
            if heading:
                titles[gid] = heading
        elif cell.cell_type == "markdown" and meta.get("solution") and meta.get("grade"):
            parts.append((gid, ()))  # a written answer: its own grade cell, graded by hand
            manual.add(gid)
            if heading:
                titles[gid] = heading
        if is_test_cell(cell):
            if parts:
                part_of[gid] = parts[-1][0]
            tests[gid] = thin_calls(cell.source, f"test cell {gid!r} of {name}")
            for call in tests[gid]:
                resolve(call, grader)  # fail now, not while grading
            if gid in released and "coursekit.grading" not in released[gid].source:
                hidden.add(gid)
    labels = {gid: label for gid, title in titles.items() if (label := part_label(title))}
    return NotebookPlan(name, release, tests, points, hidden, parts, part_of, titles, manual, labels)


def resolve(call: Call, grader: str | None = None):
    """The grading function ``call`` names. ``ValueError`` if its module is not in
    ``coursekit.grading``, or is not ``grader`` where one is given (an assignment's test cells
    call its own chapter's grader only), or has no such function."""
    if not call.module.startswith("coursekit.grading."):
        raise ValueError(f"{call.module} is not a coursekit.grading module")
    if grader is not None and call.module != grader:
        raise ValueError(
            f"{call.module}.{call.function} is another chapter's grader: this assignment's test cells "
            f"call {grader} only"
        )
    module = importlib.import_module(call.module)
    fn = getattr(module, call.function, None)
    if not callable(fn):
        raise ValueError(f"{call.module} has no function {call.function}")
    return fn


def course_secret(root: Path) -> bytes:
    """The course's grading secret, created on first use in ``.coursekit/secret`` (readable by
    its owner only; never inside the sandbox). It is mixed into the seed of every check, so
    re-runs see the same inputs while nobody can compute them from the grading source."""
    path = root / ".coursekit" / "secret"
    path.parent.mkdir(exist_ok=True)
    if not path.exists():
        # Written in full to a private file, then linked into place: two processes starting at
        # once (two test workers, two terminals) never read a half-written secret, and the first
        # link wins for both.
        fd, draft = tempfile.mkstemp(dir=path.parent, prefix=".secret-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(draft, path)
            except FileExistsError:
                pass
        finally:
            os.unlink(draft)
    secret = path.read_text().strip()
    if len(secret) < 32:
        raise RuntimeError(
            f"{path} holds no usable secret; delete it and run again (the hidden inputs will change)"
        )
    return secret.encode()


def staged_plan(root: Path, assignment: str) -> Plan:
    """The plan of ``assignment`` as ``coursekit autograde`` makes it: nbgrader's
    ``generate_assignment`` (which also registers the assignment in the course's gradebook) into a
    throwaway folder, then :func:`load_plan` on that release."""
    from coursekit import course

    with tempfile.TemporaryDirectory() as tmp:
        staging = course.nbgrader_api(root, **{"CourseDirectory.release_directory": tmp})
        course.expect_success(
            staging.generate_assignment(assignment, force=True, create=True), f"registering {assignment}"
        )
        return load_plan(root, assignment, Path(tmp))


def _grader_of(assignment: str) -> str | None:
    """The grader module of a chapter of the course; ``None`` for an assignment the course does
    not list (an instructor's own), whose test cells may call any ``coursekit.grading`` module."""
    from coursekit.chapters import chapter

    try:
        return chapter(assignment).grader
    except ValueError:
        return None


def load_plan(root: Path, assignment: str, release_dir: Path) -> Plan:
    """The plan of ``assignment``, whose release nbgrader's ``generate_assignment`` wrote into
    ``release_dir``; the release is finished as ``coursekit release`` finishes it (links to the
    book, predictions stubbed: :func:`coursekit.course.release_finisher`), so that it is what the
    students were given."""
    from coursekit import course

    source_dir = root / "solutions" / assignment
    notebooks, files = [], {}
    config = course.nbgrader_api(root).config
    finish = course.release_finisher(root, config)
    credit = Credit.from_config(config)
    for path in sorted(source_dir.glob("*.ipynb")):
        source = nbformat.read(path, as_version=4)
        release = nbformat.read(release_dir / assignment / path.name, as_version=4)
        finish(release)
        notebooks.append(plan_notebook(source, release, path.stem, _grader_of(assignment)))
    for path in sorted(source_dir.rglob("*")):
        if path.is_file() and path.suffix != ".ipynb" and ".ipynb_checkpoints" not in path.parts:
            files[str(path.relative_to(source_dir))] = path.read_bytes()
    digest = hashlib.sha256()
    for nb in notebooks:
        digest.update(nbformat.writes(nb.release).encode())
        digest.update(
            json.dumps(
                {k: [asdict(c) for c in v] for k, v in nb.tests.items()}, sort_keys=True, default=str
            ).encode()
        )
    for name, data in files.items():
        digest.update(name.encode() + hashlib.sha256(data).digest())
    digest.update(_code_fingerprint().encode())
    digest.update(json.dumps(asdict(credit)).encode())  # another way of scoring: grade again
    secret = course_secret(root)
    digest.update(hashlib.sha256(secret).digest())
    return Plan(assignment, notebooks, files, digest.hexdigest(), secret, credit)


def _code_fingerprint() -> str:
    """A hash of coursekit's source: verdicts made by other grading code are not reused."""
    digest = hashlib.sha256()
    package = Path(coursekit.__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + path.read_bytes())
    return digest.hexdigest()


def preload_modules(plan: Plan) -> tuple[str, ...]:
    """The coursekit modules the notebooks import, loaded once in each sandbox's template."""
    modules = set()
    for nb in plan.notebooks:
        for cell in nb.release.cells:
            if cell.cell_type == "code":
                for line in cell.source.splitlines():
                    words = line.split()
                    if (
                        len(words) >= 2
                        and words[0] in ("from", "import")
                        and words[1].startswith("coursekit.")
                    ):
                        name = words[1].rstrip(",")
                        if not name.startswith("coursekit.grading"):
                            modules.add(name)
    return tuple(sorted(modules))
