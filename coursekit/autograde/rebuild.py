"""Step 1, *rebuild*: read a student's notebook as data and rebuild it on the release's structure.

A submission is never trusted to be a well-formed notebook. :func:`normalize` parses the raw
bytes and returns a notebook with exactly the release's cells, in the release's order: answer
cells hold the student's text (the first copy, if a cell was duplicated), locked and test cells
are restored from the release, cells the student added are kept where they stood (without any
grading metadata), a markdown cell the student wrote that holds HTML is shown as text, and every
repair is listed as a plain note for the student. nbgrader only ever sees this rebuilt notebook,
so one broken file cannot stop a batch.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field

import nbformat

from coursekit.cells import Call, is_test_cell, nbgrader_meta, thin_calls
from coursekit.inert import inert_markdown

__all__ = ["Normalized", "normalize", "Call", "thin_calls", "is_test_cell", "nbgrader_meta"]


@dataclass
class Normalized:
    notebook: nbformat.NotebookNode
    notes: list[str] = field(default_factory=list)
    readable: bool = True  # False: the file was not a notebook at all; every answer counts as missing
    answered: set[str] = field(default_factory=set)  # grade ids of answer cells the student filled in


def _text(source) -> str | None:
    if isinstance(source, str):
        return source
    if isinstance(source, list) and all(isinstance(s, str) for s in source):
        return "".join(source)
    return None


def normalize(raw: bytes, release: nbformat.NotebookNode) -> Normalized:
    """Rebuild the student's notebook ``raw`` on the structure of ``release``."""
    notes: list[str] = []
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        return _unreadable(release, "your file is not a notebook: it is not UTF-8 text")
    except json.JSONDecodeError as e:
        return _unreadable(
            release,
            f"your file is not a valid notebook: broken JSON at line {e.lineno}, column {e.colno} ({e.msg})",
        )
    except RecursionError:
        return _unreadable(release, "your file is not a valid notebook: its JSON is nested too deeply")
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        return _unreadable(release, "your file is not a Jupyter notebook: it has no list of cells")

    # the student's cells, as (cell_type, text, grade_id or None)
    cells = []
    for i, cell in enumerate(data["cells"], start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            notes.append(f"cell {i} of your file is malformed and was ignored")
            continue
        text = _text(cell.get("source", ""))
        if text is None:
            notes.append(f"cell {i} of your file has a malformed source and was ignored")
            continue
        gid = nbgrader_meta(cell).get("grade_id")
        cells.append(
            (cell["cell_type"], text, gid if isinstance(gid, str) else None, bool(nbgrader_meta(cell)))
        )
    if not cells:
        return _unreadable(release, "your notebook has no cells: every cell was deleted")

    known = {nbgrader_meta(c).get("grade_id"): c for c in release.cells if nbgrader_meta(c).get("grade_id")}
    first: dict[str, tuple[str, str]] = {}
    extras: dict[str | None, list[tuple[str, str]]] = {}  # anchor grade id (None: the top) -> added cells
    anchor = None
    for cell_type, text, gid, had_meta in cells:
        if gid in known and gid not in first:
            first[gid] = (cell_type, text)
            anchor = gid
            continue
        if gid in known:
            notes.append(
                f"the cell {gid!r} appears more than once; the first copy was graded and the others ran as "
                "ordinary cells"
            )
        elif had_meta:
            notes.append("grading metadata on a cell you added was ignored")
        extras.setdefault(anchor, []).append((cell_type, text))

    out = copy.deepcopy(release)
    rebuilt = []
    answered = set()
    counter = 0

    def inert(text: str, cell_type: str, what: str) -> str:
        """A markdown cell the student wrote, made safe to render for the instructor and the student."""
        if cell_type != "markdown":
            return text
        safe, changed = inert_markdown(text)
        if changed:
            notes.append(f"{what} held HTML or a remote image; it is shown as text")
        return safe

    def add_extras(key):
        nonlocal counter
        for cell_type, text in extras.get(key, []):
            text = inert(text, cell_type, "a markdown cell you added")
            counter += 1
            maker = {
                "code": nbformat.v4.new_code_cell,
                "markdown": nbformat.v4.new_markdown_cell,
                "raw": nbformat.v4.new_raw_cell,
            }[cell_type]
            new = maker(text)
            new.id = f"added-{counter}"
            rebuilt.append(new)

    add_extras(None)
    for cell in out.cells:
        meta = nbgrader_meta(cell)
        gid = meta.get("grade_id")
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        if gid is None:
            rebuilt.append(cell)
            continue
        theirs = first.get(gid)
        if meta.get("solution"):
            if theirs is None:
                notes.append(f"your answer cell {gid!r} was deleted; it was graded as unanswered")
            else:
                if theirs[0] != cell.cell_type:
                    notes.append(
                        f"your answer cell {gid!r} was changed from {cell.cell_type} to {theirs[0]}; it was graded "
                        f"as {cell.cell_type}"
                    )
                if theirs[1] != cell.source:
                    answered.add(gid)
                    cell.source = inert(theirs[1], cell.cell_type, f"your answer cell {gid!r}")
        elif theirs is None:
            if is_test_cell(cell):
                notes.append(f"the test cell {gid!r} was deleted; it was restored and run")
            else:
                notes.append(f"the cell {gid!r} was deleted; it was restored")
        elif theirs != (cell.cell_type, cell.source):
            notes.append(f"the read-only cell {gid!r} was changed; the original was restored")
        rebuilt.append(cell)
        add_extras(gid)
    out.cells = rebuilt
    return Normalized(out, notes, True, answered)


def _unreadable(release, reason: str) -> Normalized:
    out = copy.deepcopy(release)
    for cell in out.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return Normalized(out, [reason], False, set())
