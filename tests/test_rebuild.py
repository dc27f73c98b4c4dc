"""coursekit.autograde.rebuild: what the rebuilt notebook keeps of a hostile or odd file.

Each test builds a submission of Exercise 1 from the release (as JSON text, so that it can hold
what nbformat would not write), rebuilds it with :func:`normalize` and checks the notebook and
the notes. nbformat itself is the reference for reading an old (format 3) notebook and for
writing the result; nbconvert renders the markdown as nbgrader's pages do.
"""

from __future__ import annotations

import base64
import copy
import json

import nbformat
import pytest
from nbconvert.filters.markdown_mistune import markdown2html_mistune

from coursekit import inert
from coursekit.autograde.rebuild import normalize
from coursekit.inert import MAX_IMAGE_BYTES, MAX_NOTEBOOK_IMAGE_BYTES, heading_ids
from tests.submissions import ROOT, filled, load

A = "ch01_attention"
RELEASE = load(ROOT / "exercises" / A / f"{A}.ipynb")
WRITTEN = "written_scaling"  # the written answer: a markdown answer cell graded by hand


def gid(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def reference() -> dict:
    return json.loads(nbformat.writes(filled(A)))


def answer(data: dict, grade_id: str) -> dict:
    return next(c for c in data["cells"] if gid(c) == grade_id)


def rebuilt(data: dict | str):
    raw = data if isinstance(data, str) else json.dumps(data)  # ensure_ascii: a lone surrogate stays \\ud800
    return normalize(raw.encode(), RELEASE)


def source_of(nb, grade_id: str) -> str:
    return next(c.source for c in nb.cells if gid(c) == grade_id)


# --------------------------------------------------------------------------- lone surrogates


def test_a_lone_surrogate_becomes_the_replacement_character_with_a_note(tmp_path):
    data = reference()
    code = next(
        c for c in data["cells"] if c["cell_type"] == "code" and "def softmax" in "".join(c["source"])
    )
    code["source"] = "".join(code["source"]) + "\n# \ud800 and a pair \U0001f600\n"
    data["cells"].insert(3, {"cell_type": "markdown", "metadata": {}, "source": "note \udfff"})
    raw = json.dumps(data)
    assert "\\ud800" in raw and "\\udfff" in raw  # the file spells them as JSON escapes

    norm = rebuilt(raw)

    text = "".join(c.source for c in norm.notebook.cells)
    assert "\ud800" not in text and "\udfff" not in text
    assert "# \ufffd and a pair \U0001f600" in text and "note \ufffd" in text  # a real pair is kept
    surrogate_notes = [n for n in norm.notes if "lone surrogate" in n]
    assert len(surrogate_notes) == 2 and all("U+FFFD" in n for n in surrogate_notes)
    nbformat.write(norm.notebook, tmp_path / "out.ipynb")  # UTF-8 writes it: before, UnicodeEncodeError
    compile(next(c.source for c in norm.notebook.cells if "def softmax" in c.source), "cell", "exec")


# --------------------------------------------------------------------------- format 3


def v3_text(nb) -> str:
    return nbformat.writes(copy.deepcopy(nb), version=3)  # nbformat's downgrade changes its argument


def test_a_format_3_notebook_is_rebuilt_like_the_same_notebook_in_format_4():
    nb = filled(A)
    v3 = v3_text(nb)
    assert json.loads(v3)["nbformat"] == 3 and "worksheets" in json.loads(v3)

    old, new = normalize(v3.encode(), RELEASE), normalize(nbformat.writes(nb).encode(), RELEASE)

    assert old.readable and old.answered == new.answered and len(new.answered) > 5
    assert [(c.cell_type, c.source, c.metadata) for c in old.notebook.cells] == [
        (c.cell_type, c.source, c.metadata) for c in new.notebook.cells
    ]
    assert old.notes == [
        "your notebook was saved in the old format 3; it was converted to format 4 and graded"
    ]


def test_format_3_cells_are_read_as_nbformat_reads_them():
    """Heading, html and raw cells, and two worksheets, against nbformat's own upgrade."""
    v3 = nbformat.v3
    cells = [
        v3.new_heading_cell("Part 1:  the\nsoftmax", level=3),
        v3.new_code_cell(input="x = 1\nprint(x)", prompt_number=4),
        v3.new_text_cell("markdown", source="some *text*"),
        v3.new_text_cell("raw", source="raw text"),
    ]
    nb = v3.new_notebook(worksheets=[v3.new_worksheet(cells=cells[:2]), v3.new_worksheet(cells=cells[2:])])
    nb.worksheets[1].cells.append(
        nbformat.from_dict({"cell_type": "html", "source": "a cell", "metadata": {}})
    )
    text = v3.writes_json(nb)
    expected = nbformat.reads(text, as_version=4)

    norm = normalize(text.encode(), RELEASE)

    added = [c for c in norm.notebook.cells if c.get("id", "").startswith("added-")]
    assert [(c.cell_type, c.source) for c in added] == [(c.cell_type, c.source) for c in expected.cells]
    assert added[0].source == "### Part 1:  the softmax"


@pytest.mark.parametrize(
    "worksheets, reason",
    [
        ("not a list", "worksheets are malformed"),
        ([{"cells": "x"}], "worksheets are malformed"),
        ([], "every cell was deleted"),
    ],
)
def test_a_malformed_format_3_notebook_is_unreadable_with_a_note(worksheets, reason):
    norm = rebuilt({"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": worksheets})
    assert not norm.readable and reason in norm.notes[0]


def test_a_format_3_heading_with_an_absurd_level_is_ignored_not_repeated():
    cell = {"cell_type": "heading", "level": 10**12, "source": "x", "metadata": {}}  # "#" * level: a terabyte
    ok = {"cell_type": "code", "input": "y = 2", "metadata": {}, "language": "python", "outputs": []}
    norm = rebuilt(
        {"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": [{"cells": [cell, ok]}]}
    )
    assert norm.readable and "cell 1 of your file is malformed and was ignored" in norm.notes
    assert "y = 2" in [c.source for c in norm.notebook.cells]


# --------------------------------------------------------------------------- headings named like graded cells


def test_a_heading_named_like_a_graded_cell_is_shown_as_text():
    data = reference()
    written = answer(data, WRITTEN)
    written["source"] = f"## {WRITTEN}\n\nThe scores grow with the width.\n\n## My reasoning\n"
    data["cells"].insert(2, {"cell_type": "markdown", "metadata": {}, "source": "Causal_Mask\n==="})
    ids = {g.casefold() for g in (gid(c) for c in data["cells"]) if g}
    assert WRITTEN in heading_ids(written["source"]) and "causal_mask" in ids  # they collide before

    norm = rebuilt(data)

    for cell in norm.notebook.cells:
        if cell.cell_type == "markdown" and (gid(cell) == WRITTEN or cell.get("id", "").startswith("added")):
            assert not {i.casefold() for i in heading_ids(cell.source)} & ids, cell.source
    shown = markdown2html_mistune(source_of(norm.notebook, WRITTEN))
    assert f"<p>## {WRITTEN}</p>" in shown and 'id="My-reasoning"' in shown  # the other heading is kept
    assert sum("named like a graded cell" in n for n in norm.notes) == 2


# --------------------------------------------------------------------------- embedded images


def png_url(size: int) -> str:
    """A data: URL of ``size`` base64 characters (not a real PNG: only its size matters here)."""
    return "data:image/png;base64," + base64.b64encode(b"\0" * (size // 4 * 3)).decode()


def test_an_embedded_image_over_the_cap_in_a_written_answer_is_replaced_by_a_note():
    data = reference()
    small = png_url(1000)
    answer(data, WRITTEN)["source"] = f"Look:\n\n![plot]({png_url(21 * 2**20)})\n\nand ![small]({small})\n"
    norm = rebuilt(data)
    text = source_of(norm.notebook, WRITTEN)
    assert len(text) < 10_000 and f"![small]({small})" in text  # the small one is kept
    assert "*[an image of 21.0 MiB was removed: images are shown up to 2.0 MiB each]*" in text
    assert any("21.0 MiB was removed" in n for n in norm.notes)


def test_embedded_images_of_a_notebook_are_capped_in_all(monkeypatch):
    monkeypatch.setattr(inert, "MAX_IMAGE_BYTES", 40_000)  # the caps scaled down 50 times: a quick test
    monkeypatch.setattr(inert, "MAX_NOTEBOOK_IMAGE_BYTES", 160_000)
    assert (MAX_IMAGE_BYTES, MAX_NOTEBOOK_IMAGE_BYTES) == (2 * 2**20, 8 * 2**20)  # what the notes promise
    data = reference()
    before = sum(len(c.source) for c in rebuilt(data).notebook.cells if c.cell_type == "markdown")
    each = 30_000
    for i in range(8):
        data["cells"].append({"cell_type": "markdown", "metadata": {}, "source": f"![{i}]({png_url(each)})"})
    norm = rebuilt(data)
    images = sum(len(c.source) for c in norm.notebook.cells if c.cell_type == "markdown") - before
    assert 150_000 < images < 160_000  # five images kept whole, three replaced
    assert sum("shown up to 0.2 MiB in all" in n for n in norm.notes) == 3
