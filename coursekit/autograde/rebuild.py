"""Step 1, *rebuild*: read a student's notebook as data and rebuild it on the release's structure.

A submission is never trusted to be a well-formed notebook. :func:`normalize` parses the raw
bytes and returns a notebook with exactly the release's cells, in the release's order: answer
cells hold the student's text (the first copy, if a cell was duplicated), locked and test cells
are restored from the release, cells the student added are kept where they stood (without any
grading metadata), a markdown cell the student wrote that holds HTML is shown as text, and every
repair is listed as a plain note for the student. nbgrader only ever sees this rebuilt notebook,
so one broken file cannot stop a batch.

What the rebuilt notebook holds of the student's is text only, made safe to write and to show:
lone surrogates (JSON can spell them, UTF-8 cannot) become U+FFFD, embedded images in their
markdown are capped (:data:`coursekit.inert.MAX_IMAGE_BYTES` each), and a heading of theirs that
would take the HTML id of a graded cell is shown as text. A notebook in the old format 3
(``worksheets``, ``input``, heading cells) is read as nbformat reads it into format 4.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field

import nbformat

from coursekit.cells import Call, is_test_cell, nbgrader_meta, thin_calls
from coursekit.inert import (
    ImageBudget,
    cap_markdown_images,
    distinct_headings,
    inert_markdown,
    reserved_ids,
    valid_unicode,
)

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
    if isinstance(data, dict) and "cells" not in data and data.get("nbformat") == 3:
        upgraded = _from_v3(data)
        if upgraded is None:
            return _unreadable(
                release,
                "your file is not a valid notebook: it is in the old format 3, but its worksheets are malformed",
            )
        data = {"cells": upgraded}
        notes.append("your notebook was saved in the old format 3; it was converted to format 4 and graded")
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
        text, bad = valid_unicode(text)
        if bad:
            notes.append(
                f"cell {i} of your file held text that is not valid Unicode ({bad} lone surrogate"
                f"{'s' if bad > 1 else ''}, written \\ud800 to \\udfff in the file); "
                "it was replaced with U+FFFD, the replacement character"
            )
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
    images = ImageBudget()  # the embedded images of the student's markdown, over the whole notebook
    reserved = reserved_ids(g for g in known if isinstance(g, str))

    def inert(text: str, cell_type: str, what: str) -> str:
        """A markdown cell the student wrote, made safe to render for the instructor and the student."""
        if cell_type != "markdown":
            return text
        text, removed = cap_markdown_images(text, images)
        for why in dict.fromkeys(removed):
            notes.append(f"in {what}: {why}")
        safe, changed = inert_markdown(text)
        if changed:
            notes.append(f"{what} held HTML or a remote image; it is shown as text")
            return safe
        safe, taken = distinct_headings(safe, reserved)
        if taken:
            notes.append(
                f"{what} has a heading named like a graded cell ({', '.join(taken[:3])}); "
                "it is shown as plain text, so that the grader's page keeps one element of that name"
            )
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


def _from_v3(data: dict) -> list[dict] | None:
    """The cells of an nbformat 3 notebook, as nbformat's ``v4.upgrade`` turns them into format 4
    (``input`` -> ``source``, a heading cell -> a markdown ``#`` line, an ``html`` cell ->
    markdown; worksheets flattened), reading only what :func:`normalize` reads of a format 4
    cell: its type, source and metadata. ``None`` if the worksheets are malformed.

    nbformat's own upgrade is not called on the untrusted data: it validates, converts outputs
    (which are never kept) and repeats a heading's ``#`` ``level`` times, whatever the level."""
    worksheets = data.get("worksheets")
    if not isinstance(worksheets, list) or not all(
        isinstance(ws, dict) and isinstance(ws.get("cells"), list) for ws in worksheets
    ):
        return None
    cells: list = []
    for ws in worksheets:
        for cell in ws["cells"]:
            if not isinstance(cell, dict):
                cells.append(cell)  # noted as malformed, in its place
                continue
            kind, metadata = cell.get("cell_type"), cell.get("metadata", {})
            if kind == "code":
                cells.append({"cell_type": "code", "source": cell.get("input", ""), "metadata": metadata})
            elif kind == "heading":
                level, text = cell.get("level", 1), _text(cell.get("source", ""))
                if type(level) is not int or not 1 <= level <= 6 or text is None:
                    cells.append({"cell_type": "heading"})  # malformed
                else:
                    line = " ".join(text.splitlines())
                    cells.append(
                        {"cell_type": "markdown", "source": f"{'#' * level} {line}", "metadata": metadata}
                    )
            elif kind in ("markdown", "raw", "html"):
                kind = "markdown" if kind == "html" else kind
                cells.append({"cell_type": kind, "source": cell.get("source", ""), "metadata": metadata})
            else:
                cells.append(cell)
    return cells


def _unreadable(release, reason: str) -> Normalized:
    out = copy.deepcopy(release)
    for cell in out.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return Normalized(out, [reason], False, set())
