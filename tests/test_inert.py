"""Tests for coursekit.inert: student outputs and markdown made inert before nbgrader renders them.

Unit tests check each function against hostile and malformed input and against clean content
that must pass unchanged; an independent HTML reader (``_Tags`` below, not the module's own)
checks what the sanitised HTML may contain. The browser test renders a notebook full of
attacks with nbconvert and nbgrader's templates and loads it in headless Chromium: the
unsanitised control must show attacks working (so the test can fail), the sanitised pages and
the page under the Content-Security-Policy must not.
"""

from __future__ import annotations

import base64
import html
import io
import json
import random
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from nbconvert.filters.markdown_mistune import markdown2html_mistune

from coursekit.inert import (
    CSP,
    GRADE_ID_SUFFIXES,
    ImageBudget,
    cap_markdown_images,
    clean_outputs,
    distinct_headings,
    harden_html_file,
    heading_ids,
    inert_markdown,
    markdown_text,
    reserved_ids,
    with_csp,
)
from tests.browser import chromium, render, visit
from tests.submissions import Listener

# --- helpers ---------------------------------------------------------------------------


class _Tags(HTMLParser):
    """Every tag, attribute, comment and stray ``<`` in an HTML fragment."""

    def __init__(self, fragment: str):
        super().__init__(convert_charrefs=False)
        self.tags: list[tuple[str, dict]] = []
        self.comments: list[str] = []
        self.stray_lt = False
        self.feed(fragment)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_comment(self, data):
        self.comments.append(data)

    def handle_data(self, data):
        self.stray_lt |= "<" in data


def assert_inert_html(fragment: str) -> None:
    """No script, frame, style, form or handler; links only to the web; images only embedded."""
    seen = _Tags(fragment)
    assert not seen.comments and not seen.stray_lt, fragment
    for tag, attrs in seen.tags:
        assert tag not in {"script", "style", "iframe", "object", "embed", "form", "svg", "math", "link",
                           "meta", "base", "input", "button", "textarea", "frame", "frameset", "video",
                           "audio", "source", "template", "noscript"}, fragment  # fmt: skip
        for name, value in attrs.items():
            assert not name.startswith("on") and name not in {
                "style",
                "srcdoc",
                "formaction",
                "srcset",
                "background",
            }, fragment
            if name == "href":
                assert re.match(r"(https?://|mailto:)", value, re.I), fragment
            if name == "src":
                assert tag == "img" and re.fullmatch(
                    r"data:image/(png|jpeg|gif);base64,[A-Za-z0-9+/=\s]+", value
                ), fragment


def render_text(markdown: str) -> str:
    """The text a browser shows for one paragraph of rendered markdown."""
    rendered = markdown2html_mistune(markdown)
    match = re.fullmatch(r"<p>(.*)</p>\n", rendered, re.DOTALL)
    assert match, f"{markdown!r} did not render to one paragraph: {rendered!r}"
    assert "<" not in match[1], f"{markdown!r} rendered markup: {rendered!r}"
    return html.unescape(match[1])


def notebook_with(outputs: list[dict]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("x", outputs=[nbformat.from_dict(o) for o in outputs]))
    return nb


@pytest.fixture(scope="module")
def png() -> str:
    """A small figure from matplotlib, as base64 (what IPython puts in ``image/png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1), dpi=20)
    ax.plot([0, 1], [1, 0])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


PANDAS_TABLE = (
    '<table border="1" class="dataframe">\n  <thead>\n    <tr>\n      <th></th>\n      <th>loss</th>\n'
    "      <th>acc</th>\n    </tr>\n  </thead>\n  <tbody>\n    <tr>\n      <th>0</th>\n      <td>0.693</td>\n"
    "      <td>0.50</td>\n    </tr>\n    <tr>\n      <th>1</th>\n      <td>0.125</td>\n      <td>0.97</td>\n"
    "    </tr>\n  </tbody>\n</table>"
)
MALFORMED = "an output of this cell was malformed and was not kept"

# --- clean_outputs ---------------------------------------------------------------------


def test_clean_content_is_kept_exactly(png):
    lines = base64.encodebytes(base64.b64decode(png)).decode("ascii")  # 76 characters a line
    outputs = [
        {"output_type": "stream", "name": "stdout", "text": "epoch 1 <script>alert(1)</script> & done\n"},
        {"output_type": "stream", "name": "stderr", "text": "warning\n"},
        {"output_type": "execute_result", "execution_count": 3, "metadata": {},
         "data": {"text/plain": "   loss   acc\n0  0.693  0.50", "text/html": PANDAS_TABLE}},
        {"output_type": "display_data", "metadata": {}, "data": {"image/png": png, "text/plain": "<Figure size 20x20>"}},  # noqa: E501
        {"output_type": "display_data", "metadata": {}, "data": {"image/png": lines}},
        {"output_type": "display_data", "metadata": {}, "data": {"text/latex": (r"$\frac{a}{b} < 1$"), "text/plain": "a/b"}},  # noqa: E501
        {"output_type": "execute_result", "execution_count": None, "metadata": {}, "data": {"text/plain": "None"}},
        {"output_type": "error", "ename": "ValueError", "evalue": "q and k <differ>",
         "traceback": ["\x1b[0;31mValueError\x1b[0m: q and k <differ>", "line 2"]},
    ]  # fmt: skip
    kept, notes = clean_outputs(outputs)
    assert kept == outputs
    assert notes == []
    nbformat.validate(notebook_with(kept))


def test_multiline_strings_are_joined():
    kept, notes = clean_outputs([
        {"output_type": "stream", "name": "stdout", "text": ["a\n", "b\n"]},
        {"output_type": "display_data", "metadata": {}, "data": {"text/plain": ["x\n", "y"]}},
    ])  # fmt: skip
    assert kept[0]["text"] == "a\nb\n" and kept[1]["data"] == {"text/plain": "x\ny"}
    assert notes == []


@pytest.mark.parametrize(
    "hostile",
    [
        "<script>window.pwn = 1</script><b>kept</b>",
        "<img src=x onerror=window.pwn=1>",
        '<img src="data:image/png;base64,AAAA" onload="window.pwn=1">',
        '<img src="http://127.0.0.1:9/beacon.png">',
        '<img srcset="http://127.0.0.1:9/a.png 1x" src="data:image/png;base64,AAAA">',
        '<img src="data:image/svg+xml;base64,PHN2Zz48L3N2Zz4=">',
        '<a href="javascript:window.pwn=1">click</a>',
        '<a href="JaVaScRiPt&colon;window.pwn=1">click</a>',
        '<a href=" javascript:window.pwn=1">click</a>',
        '<a href="data:text/html,<script>alert(1)</script>">click</a>',
        '<a href="/formgrader/api/submission/1" target="_blank">relative</a>',
        '<iframe srcdoc="<script>parent.pwn=1</script>"></iframe>',
        '<iframe src="http://127.0.0.1:9/"></iframe>',
        "<svg onload=window.pwn=1><circle r=4 /></svg>",
        "<math><mtext><table><mglyph><style><img src=x onerror=window.pwn=1>",
        "<style>body{background:url(http://127.0.0.1:9/)}</style>",
        '<div style="background:url(http://127.0.0.1:9/)">styled</div>',
        '<link rel="stylesheet" href="http://127.0.0.1:9/x.css">',
        '<meta http-equiv="refresh" content="0;url=http://127.0.0.1:9/">',
        '<base href="http://127.0.0.1:9/">',
        '<form action="http://127.0.0.1:9/"><button formaction="javascript:window.pwn=1">go</button></form>',
        '<object data="http://127.0.0.1:9/"></object><embed src="http://127.0.0.1:9/">',
        "<details open ontoggle=window.pwn=1>x</details>",
        '<video poster="http://127.0.0.1:9/p.png"><source src="http://127.0.0.1:9/v.mp4"></video>',
        '<table background="http://127.0.0.1:9/t.png"><tr><td>x</td></tr></table>',
        '<a data-toggle="popover" data-html="true" data-content="<img src=x onerror=window.pwn=1>">hover</a>',
        "<!--> <img src=x onerror=window.pwn=1> -->",
        '<noscript><p title="</noscript><img src=x onerror=window.pwn=1>">',
        "<textarea><img src=x onerror=window.pwn=1></textarea>",
        '<p class="navbar-fixed-top modal" id="submission_id">overlay</p>',
    ],
)
def test_hostile_html_is_made_inert(hostile):
    kept, notes = clean_outputs(
        [{"output_type": "display_data", "metadata": {}, "data": {"text/html": hostile}}]
    )
    assert len(kept) == 1
    cleaned = kept[0]["data"]["text/html"]
    assert_inert_html(cleaned)
    for word in ("pwn", "127.0.0.1", "navbar", "submission_id"):
        assert word not in cleaned.replace("&lt;", "<")
    assert notes == ["HTML in an output of this cell was reduced to inert content"]


def test_html_keeps_formatting_links_and_embedded_images(png):
    fragment = (
        f'<p><b>bold</b> <i>it</i> <code>x</code> <a href="https://example.org/a?b=1">web</a> '
        f'<a href="mailto:t@example.org">mail</a></p><img src="data:image/png;base64,{png}" alt="fig" width="40">'
    )
    kept, notes = clean_outputs(
        [{"output_type": "display_data", "metadata": {}, "data": {"text/html": fragment}}]
    )
    assert kept[0]["data"]["text/html"] == fragment
    assert notes == []


def test_image_metadata_is_dropped(png):
    metadata = {
        "image/png": {"width": "1 onerror=window.pwn=1", "height": 3},
        "filenames": {"image/png": "/etc/passwd"},
    }
    kept, notes = clean_outputs(
        [{"output_type": "display_data", "metadata": metadata, "data": {"image/png": png}}]
    )
    assert kept == [{"output_type": "display_data", "data": {"image/png": png}, "metadata": {}}]
    assert notes == []


@pytest.mark.parametrize(
    ("data", "kept_data", "dropped"),
    [
        ({"application/javascript": "window.pwn=1", "text/plain": "<IPython.core.display.Javascript object>"},
         {"text/plain": "<IPython.core.display.Javascript object>"}, "application/javascript"),
        ({"application/javascript": "window.pwn=1"},
         {"text/plain": "[an application/javascript output was not shown: the autograder shows only inert content]"},
         "application/javascript"),
        ({"image/svg+xml": "<svg onload=window.pwn=1></svg>", "text/plain": "<Figure>"}, {"text/plain": "<Figure>"}, "image/svg+xml"),  # noqa: E501
        ({"application/vnd.jupyter.widget-view+json": {"model_id": "1"}, "text/plain": "IntSlider()"},
         {"text/plain": "IntSlider()"}, "application/vnd.jupyter.widget-view+json"),
        ({"text/vnd.mermaid": "graph TD; A-->B"},
         {"text/plain": "[a text/vnd.mermaid output was not shown: the autograder shows only inert content]"}, "text/vnd.mermaid"),  # noqa: E501
        ({"application/json": {"a": 1}, "text/plain": "{'a': 1}"}, {"text/plain": "{'a': 1}"}, "application/json"),
    ],
)  # fmt: skip
def test_active_mimetypes_are_dropped(data, kept_data, dropped):
    kept, notes = clean_outputs([{"output_type": "display_data", "metadata": {}, "data": data}])
    assert kept == [{"output_type": "display_data", "data": kept_data, "metadata": {}}]
    assert notes == [
        (
            f"{'an' if dropped[0] in 'ai' else 'a'} {dropped} output of this cell was not shown: the "
            "autograder shows only inert content"
        )
    ]


def test_markdown_output_becomes_text():
    md = "**bold** <img src=x onerror=window.pwn=1>"
    kept, notes = clean_outputs(
        [{"output_type": "display_data", "metadata": {}, "data": {"text/markdown": md}}]
    )
    assert kept[0]["data"] == {"text/plain": md} and notes == []
    kept, notes = clean_outputs(
        [
            {
                "output_type": "display_data",
                "metadata": {},
                "data": {"text/markdown": md, "text/plain": "<Markdown>"},
            }
        ]
    )
    assert kept[0]["data"] == {"text/plain": "<Markdown>"} and notes == []


@pytest.mark.parametrize(
    "output",
    [
        3,
        None,
        "stream",
        ["output_type", "stream"],
        {},
        {"output_type": "bogus", "text": "x"},
        {"output_type": "stream", "name": "stdin", "text": "x"},
        {"output_type": "stream", "name": "stdout", "text": 3},
        {"output_type": "stream", "name": "stdout", "text": ["a", 3]},
        {"output_type": "stream", "name": "stdout"},
        {"output_type": "display_data", "metadata": {}, "data": ["text/plain", "x"]},
        {"output_type": "display_data", "metadata": {}},
        {"output_type": "display_data", "metadata": {}, "data": {3: "x"}},
        {"output_type": "execute_result", "metadata": {}, "data": {"text/plain": "x"}},
        {
            "output_type": "execute_result",
            "execution_count": "3",
            "metadata": {},
            "data": {"text/plain": "x"},
        },
        {
            "output_type": "execute_result",
            "execution_count": True,
            "metadata": {},
            "data": {"text/plain": "x"},
        },
        {"output_type": "execute_result", "execution_count": -1, "metadata": {}, "data": {"text/plain": "x"}},
        {
            "output_type": "execute_result",
            "execution_count": 1.0,
            "metadata": {},
            "data": {"text/plain": "x"},
        },
        {"output_type": "error", "ename": "E", "evalue": "v", "traceback": "not a list"},
        {"output_type": "error", "ename": "E", "evalue": "v", "traceback": ["ok", 3]},
        {"output_type": "error", "ename": None, "evalue": "v", "traceback": []},
        {"output_type": "error", "ename": "E", "traceback": []},
    ],
)
def test_malformed_outputs_are_dropped(output):
    good = {"output_type": "stream", "name": "stdout", "text": "kept\n"}
    kept, notes = clean_outputs([output, good])
    assert kept == [good]
    assert len(notes) == 1 and ("malformed" in notes[0])


@pytest.mark.parametrize("outputs", [None, "outputs", {"output_type": "stream"}, 3])
def test_outputs_that_are_not_a_list_are_dropped(outputs):
    assert clean_outputs(outputs) == ([], ["the outputs of this cell were malformed and were not kept"])


def test_bad_values_drop_only_their_mimetype():
    data = {"text/plain": 3, "text/html": "<b>x</b>", "image/png": {"not": "base64"}}
    kept, notes = clean_outputs([{"output_type": "display_data", "metadata": {}, "data": data}])
    assert kept[0]["data"] == {"text/html": "<b>x</b>"}
    assert sorted(notes) == ["a text/plain output of this cell was malformed and was not kept",
                             "an image/png output of this cell was malformed and was not kept"]  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    ['AAAA" onerror="window.pwn=1', "AAA", "AAAA=AAA", "data:image/png;base64,AAAA", "", "AA AA", "AA\tAA"],
)
def test_images_must_be_strict_base64(bad):
    kept, notes = clean_outputs(
        [
            {
                "output_type": "display_data",
                "metadata": {},
                "data": {"image/png": bad, "text/plain": "<Figure>"},
            }
        ]
    )
    assert kept[0]["data"] == {"text/plain": "<Figure>"}
    assert notes == ["an image/png output of this cell was not valid base64 and was not kept"]


def test_text_is_capped_and_cut_with_a_note():
    huge = "x" * 10_000
    outputs = [{"output_type": "stream", "name": "stdout", "text": huge} for _ in range(3)]
    kept, notes = clean_outputs(outputs, max_bytes=5_000)
    assert len(kept) == 1
    assert kept[0]["text"].startswith("x" * 4_900) and "cut this output" in kept[0]["text"]
    assert len(kept[0]["text"].encode()) < 5_000 + 200
    assert notes == ["the outputs of this cell were longer than 5000 bytes and were cut short"]
    nbformat.validate(notebook_with(kept))


def test_cap_counts_utf8_bytes_and_cuts_on_a_character():
    kept, _ = clean_outputs([{"output_type": "stream", "name": "stdout", "text": "é" * 1000}], max_bytes=501)
    text = kept[0]["text"]
    assert (
        text.startswith("é" * 218) and "\ufffd" not in text
    )  # 501 - 64 overhead = 437 bytes: 218 whole characters


def test_many_small_outputs_meet_the_cap():
    kept, notes = clean_outputs(
        [{"output_type": "stream", "name": "stdout", "text": ""}] * 100_000, max_bytes=64_000
    )
    assert len(kept) == 1_000
    assert notes == ["the outputs of this cell were longer than 64000 bytes and were cut short"]


def test_images_are_kept_whole_or_dropped(png):
    outputs = [{"output_type": "display_data", "metadata": {}, "data": {"image/png": png}}]
    kept, notes = clean_outputs(outputs, max_bytes=len(png) // 2)
    assert kept == [] and notes == [
        f"the outputs of this cell were longer than {len(png) // 2} bytes and were cut short"
    ]


def test_an_image_over_the_cap_is_replaced_by_a_line_saying_so():
    big = base64.b64encode(b"\0" * (3 * 2**20)).decode()  # 4 MiB of base64: within the cell's text cap
    outputs = [{"output_type": "display_data", "metadata": {}, "data": {"image/png": big}}]
    kept, notes = clean_outputs(outputs, max_bytes=8 << 20)
    why = "an image of 4.0 MiB was removed: images are shown up to 2.0 MiB each"
    assert kept == [{"output_type": "display_data", "data": {"text/plain": f"[{why}]"}, "metadata": {}}]
    assert notes == [why]


def test_images_of_a_notebook_share_one_budget_across_its_cells(png):
    budget = ImageBudget(total=len(png) * 2, each=len(png))
    outputs = [
        {"output_type": "display_data", "metadata": {}, "data": {"image/png": png, "text/plain": "fig"}}
    ]
    shown = [clean_outputs(outputs, images=budget) for _ in range(3)]  # three cells, one notebook
    assert [k[0]["data"].get("image/png") for k, _ in shown] == [png, png, None]
    assert shown[2][0][0]["data"]["text/plain"] == "fig"  # the text of the bundle stays
    assert "shown up to" in shown[2][1][0] and "in all" in shown[2][1][0]


def test_markdown_images_are_capped_in_place_and_charged_once():
    url = "data:image/png;base64," + "A" * 100
    text = f'a ![x]({url} "title") b\n\n[ref]: {url}\n\n![small](data:image/gif;base64,R0lG)'
    capped, notes = cap_markdown_images(text, ImageBudget(total=10_000, each=50))
    assert capped == (
        "a *[an image of 0.0 MiB was removed: images are shown up to 0.0 MiB each]* b\n\n"
        "[ref]: [an image of 0.0 MiB was removed: images are shown up to 0.0 MiB each]\n\n"
        "![small](data:image/gif;base64,R0lG)"
    )
    assert len(notes) == 2
    assert cap_markdown_images(text, ImageBudget()) == (text, [])  # within the caps: unchanged


def test_huge_html_stays_inert_when_cut():
    fragment = "<table>" + "<tr><td>cell</td></tr>" * 1000 + "</table>"
    kept, _ = clean_outputs(
        [{"output_type": "display_data", "metadata": {}, "data": {"text/html": fragment}}], max_bytes=1_000
    )
    assert_inert_html(kept[0]["data"]["text/html"])
    assert kept[0]["data"]["text/html"].endswith("</table>")


def test_errors_are_capped():
    kept, _ = clean_outputs(
        [{"output_type": "error", "ename": "E", "evalue": "v", "traceback": ["line"] * 10_000}],
        max_bytes=1_000,
    )
    assert 100 < len(kept[0]["traceback"]) < 240
    nbformat.validate(notebook_with(kept))


def test_lone_surrogates_are_replaced():
    kept, _ = clean_outputs([
        {"output_type": "stream", "name": "stdout", "text": "a\ud800b"},
        {"output_type": "display_data", "metadata": {}, "data": {"text/plain": "\udfff"}},
        {"output_type": "error", "ename": "\ud800", "evalue": "", "traceback": ["\ud800"]},
    ])  # fmt: skip
    assert kept[0]["text"] == "a?b" and kept[1]["data"]["text/plain"] == "?" and kept[2]["ename"] == "?"
    nbformat.writes(notebook_with(kept)).encode("utf-8")  # raises on a lone surrogate


def test_notes_are_given_once():
    js = {
        "output_type": "display_data",
        "metadata": {},
        "data": {"application/javascript": "x", "text/plain": "y"},
    }
    _, notes = clean_outputs([js, js, 3, 4])
    assert notes == [
        "an application/javascript output of this cell was not shown: the autograder shows only inert content",
        MALFORMED,
    ]


def test_notes_quote_student_mimetypes_short_and_printable():
    _, notes = clean_outputs(
        [{"output_type": "display_data", "metadata": {}, "data": {"x/" + "y\n" * 100: "z"}}]
    )
    assert len(notes[0]) < 160 and "\n" not in notes[0]


def test_everything_cleaned_passes_nbformat_validation(png):
    hostile = [
        {"output_type": "display_data", "metadata": {"isolated": True}, "data": {"text/html": "<script>x</script>"}, "transient": {"display_id": "x"}},  # noqa: E501
        {"output_type": "execute_result", "execution_count": 7, "metadata": {"image/png": {"width": "1 onload=x"}}, "data": {"image/png": png}, "extra": 1},  # noqa: E501
        {"output_type": "display_data", "metadata": {}, "data": {"application/javascript": "x"}},
        {"output_type": "display_data", "metadata": {}, "data": {}},
        {"output_type": "stream", "name": "stderr", "text": "\x00\x1b[31mred\x1b[0m"},
        {"output_type": "error", "ename": "E", "evalue": "v", "traceback": []},
        {"output_type": "update_display_data", "metadata": {}, "data": {"text/plain": "x"}},
        3,
    ]  # fmt: skip
    kept, notes = clean_outputs(hostile)
    assert [o["output_type"] for o in kept] == [
        "display_data",
        "execute_result",
        "display_data",
        "display_data",
        "stream",
        "error",
    ]
    assert all(o.get("metadata", {}) == {} for o in kept)
    nb = notebook_with(kept)
    nbformat.validate(nb)
    json.loads(nbformat.writes(nb))
    assert notes


@pytest.mark.parametrize("max_bytes", [-1, 1.5, "4", True])
def test_max_bytes_must_be_a_non_negative_int(max_bytes):
    with pytest.raises(ValueError, match="max_bytes must be a non-negative int"):
        clean_outputs([], max_bytes=max_bytes)


# --- inert_markdown --------------------------------------------------------------------

ORDINARY_MARKDOWN = [
    "# Attention\n\nThe weights are $\\mathrm{softmax}(QK^\\top/\\sqrt{D})$, with $a<b$ and $b > c$.",
    "## Results\n\n1. first\n2. second\n\n- a\n  - nested\n- [ ] todo\n- [x] done",
    "| model | loss |\n|:--|--:|\n| GPT | 2.3 |\n| BERT | 1.9 |",
    "| a | b |\n|---|---|\n| 1 | 2 |",
    "Inline `<script>alert(1)</script>` and `x < y` are code.",
    "```python\nprint('<script>')\nif a < b: pass\n```",
    "```\n<img src=x onerror=alert(1)>\n```",
    "$$\n\\sum_{i<j} x_i > 0\n$$\n\n\\begin{align}a &< b\\\\ c &> d\\end{align}",
    "> a quote\n\n---\n\n**bold**, *italic*, ~~struck~~, a<sup>2</sup>, H<sub>2</sub>O, line<br>break",
    "See [the paper](https://arxiv.org/abs/1706.03762), [mail](mailto:ta@example.org) and [above](#Attention).",
    "Plain link <https://example.org> and text with 3 < 4 & 5 > 2.",
    "![a figure](data:image/png;base64,iVBORw0KGgo=)",
    "term\n: its definition",
    "Dollars: it costs $5 and $6.",
    "a <b> c </b> <3 <-- arrow",  # <b> is a tag; "<3" and "<--" are text, escaped
    "",
]


@pytest.mark.parametrize("text", ORDINARY_MARKDOWN)
def test_ordinary_markdown_is_unchanged(text):
    assert inert_markdown(text) == (text, False)


@pytest.mark.parametrize(
    "text",
    [
        "<img src=x onerror=window.pwn=1>",  # CommonMark: an unquoted value holds no "=", so this is text
        '<img src=x onerror="window.pwn=1"',  # never closed
        '<img/src="x"/onerror="window.pwn=1">',  # CommonMark wants a space before an attribute
    ],
)
def test_markup_that_nbconvert_escapes_is_unchanged(text):
    assert "<img" not in markdown2html_mistune(text)
    assert inert_markdown(text) == (text, False)


def test_nbconvert_escapes_math_and_code():
    rendered = markdown2html_mistune("$a<b$ and `<script>` and $$x<y$$")
    assert (
        "<script>" not in rendered
        and "a&lt;b" in rendered
        and "&lt;script&gt;" in rendered
        and "x&lt;y" in rendered
    )


HOSTILE_MARKDOWN = [
    "<script>window.pwn = 1</script>",
    'Hello <img src=x onerror="window.pwn=1">',
    '<iframe srcdoc="<script>parent.pwn=1</script>"></iframe>',
    '<svg onload="window.pwn=1"></svg>',
    "[x](javascript:alert(1))",
    "[x](JAVASCRIPT:alert(1))",
    "[x](<javascript:alert(1)>)",
    "![x](http://127.0.0.1:9/beacon.png)",
    "![x](//127.0.0.1:9/beacon.png)",
    "![x](beacon.png)",
    "![x](data:image/svg+xml;base64,PHN2Zz48L3N2Zz4=)",
    "![x](attachment:image.png)",
    "<style>body{background:url(http://127.0.0.1:9/)}</style>",
    '<a href="javascript:window.pwn=1">click</a>',
    '<a href="java&#x09;script:window.pwn=1">click</a>',
    '<meta http-equiv="refresh" content="0;url=http://127.0.0.1:9/">',
    "<!-- hidden from the grader -->visible",
    '<!--> <img src=x onerror="window.pwn=1"> -->',
    '<p style="position:fixed;top:0">overlay</p>',
    '<div class="navbar-fixed-top">overlay</div>',
    '<a href="#" data-toggle="collapse" data-target="<img src=x onerror=window.pwn=1>">x</a>',
    '<form action="http://127.0.0.1:9/"><button>go</button></form>',
    '<button formaction="javascript:window.pwn=1">go</button>',
    '<details open ontoggle="window.pwn=1">x</details>',
    "<object data=http://127.0.0.1:9/></object>",
    "<base href=http://127.0.0.1:9/>",
    '```mermaid\n<img src=x onerror="window.pwn=1">\n```',
    "```mermaid\ngraph TD; A-->B\n```",
    '<textarea><img src=x onerror="window.pwn=1"></textarea>',
    "<![CDATA[ x ]]>",
    "<?php echo 1 ?>",
    '<a href=https://example.org onmouseover="window.pwn=1">hover</a>',
    '<img src=x\nonerror="window.pwn=1">',
    '# Title\n\nAll fine until <IMG SRC=x OnError="window.pwn=1">',
    "`` ` `` ```` <script>x</script>",
    "<scr<script>ipt>window.pwn=1</script>",
]


@pytest.mark.parametrize("text", HOSTILE_MARKDOWN)
def test_hostile_markdown_is_shown_as_text(text):
    shown, changed = inert_markdown(text)
    assert changed
    assert shown.startswith("*This cell held HTML that the autograder shows as text:*\n\n")
    assert text in shown
    assert inert_markdown(shown) == (shown, False)  # the result is inert by the same rule
    rendered = markdown2html_mistune(shown)
    assert [t for t, _ in _Tags(rendered).tags] == ["p", "em", "pre", "code"]
    code = re.search(r"<pre><code>(.*)</code></pre>", rendered, re.DOTALL)[1]
    assert html.unescape(code) == text + ("" if text.endswith("\n") else "\n")


def test_fence_is_longer_than_any_backtick_run():
    text = "<b onclick=x>``````</b>\n```\n````"
    shown, changed = inert_markdown(text)
    assert changed and "\n```````\n" in shown and shown.endswith("```````\n")


def test_inert_markdown_replaces_lone_surrogates_and_rejects_non_str():
    assert inert_markdown("a\ud800") == ("a?", False)
    with pytest.raises(ValueError, match="text must be a str, got bytes"):
        inert_markdown(b"# x")


# --- markdown_text ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "solution_v2 (final).ipynb",
        "<img src=x onerror=alert(1)>",
        "*bold* _it_ `code` [link](https://example.org) ![img](http://127.0.0.1:9/x.png)",
        "# not a heading",
        "1. not a list",
        "- not a list either",
        "> not a quote",
        "---",
        "    four spaces are not code",
        "&amp; &lt; &#60; &",
        "a\\b\\\\c\\",
        "line one\nline two\r\nline three\u2028four",
        "https://example.org/a_b and www.example.org and t@example.org",
        "| a | b |",
        "term : def",
        "[ ] [x] ~~no~~ <https://x.org>",
        "<!-- x -->",
    ],
)
def test_markdown_text_renders_as_itself(text):
    escaped = markdown_text(text)
    expected = re.sub(r"\r\n|[\r\n\u2028]", " ", text).strip(" ")
    assert render_text(escaped) == expected
    assert inert_markdown(escaped) == (escaped, False)


def test_markdown_text_renders_any_printable_ascii_as_itself():
    rng = random.Random(0)
    alphabet = [chr(c) for c in range(32, 127)] * 2 + list("\n\t")
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        expected = re.sub(r"[\n\t]", " ", text).strip(" ")
        if not expected:
            continue
        assert render_text(markdown_text(text)) == expected, text


def test_markdown_text_example_and_errors():
    assert markdown_text("a_b <i>*c*</i>") == "a\\_b &lt;i\\>\\*c\\*&lt;\\/i\\>"
    assert markdown_text("x\ud800") == "x\\?"
    with pytest.raises(ValueError, match="text must be a str, got int"):
        markdown_text(3)


# --- with_csp --------------------------------------------------------------------------

META = f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'


def test_csp_goes_first_in_head():
    page = (
        "<!DOCTYPE html>\n<html>\n<HEAD lang='en'>\n<script "
        "src='https://cdn.example/x.js'></script><title>t</title></HEAD><body>x</body></html>"
    )
    out = with_csp(page)
    assert out == page.replace("<HEAD lang='en'>", "<HEAD lang='en'>" + META)
    assert out.index(META) < out.index("<script")


def test_csp_ignores_header_and_needs_a_head():
    assert with_csp("<header>h</header><head></head>") == "<header>h</header><head>" + META + "</head>"
    with pytest.raises(ValueError, match="no <head>"):
        with_csp("<html><header>x</header><body></body></html>")


def test_csp_allows_no_script_frame_or_remote_load():
    directives = dict(d.strip().split(" ", 1) for d in CSP.split(";"))
    assert directives["default-src"] == "'none'"
    assert (
        "script-src" not in directives and "connect-src" not in directives and "frame-src" not in directives
    )
    assert directives["img-src"] == "data:" and directives["font-src"] == "data:"
    assert directives["base-uri"] == "'none'" and directives["form-action"] == "'none'"


def test_csp_on_an_nbconvert_page_comes_before_every_script():
    from nbconvert import HTMLExporter

    page, _ = HTMLExporter(template_name="classic").from_notebook_node(notebook_with([]))
    out = with_csp(page)
    head = out[out.index("<head") : out.index("</head>")]
    assert head.index(META) < head.index("<script") < head.index("</script>")
    assert len(re.findall("Content-Security-Policy", out)) == 1


def test_harden_html_file(tmp_path):
    path = tmp_path / "feedback.html"
    path.write_text("<html><head><title>é</title></head><body></body></html>", encoding="utf-8")
    harden_html_file(path)
    assert (
        path.read_text(encoding="utf-8") == f"<html><head>{META}<title>é</title></head><body></body></html>"
    )
    (tmp_path / "bare.html").write_text("<p>no head</p>")
    with pytest.raises(ValueError):
        harden_html_file(tmp_path / "bare.html")


# --- heading anchors -------------------------------------------------------------------


def _template_ids() -> set[str]:
    """Every ``id="..."`` written by the templates of the pages that show a rebuilt notebook."""
    import jupyter_core.paths
    import nbgrader.server_extensions.formgrader as formgrader

    from coursekit.autograde.feedback import TEMPLATES

    nbgrader_pages = Path(formgrader.__file__).parent / "templates"  # the pages that show a notebook
    folders = [nbgrader_pages / "formgrade", nbgrader_pages / "feedback", TEMPLATES / "feedback"]
    for base in jupyter_core.paths.jupyter_path("nbconvert", "templates"):
        folders += [Path(base) / "classic", Path(base) / "base"]
    found = set()
    for folder in folders:
        for path in folder.rglob("*"):
            if path.suffix in (".j2", ".tpl"):
                found |= set(re.findall(r'\bid="([^"]*)"', path.read_text()))
    return found


def test_reserved_ids_cover_every_id_the_grader_pages_give_their_elements():
    """If nbgrader, nbconvert or our feedback template gains an id, this fails until it is covered."""
    grade_id_forms = {"{{ cell.metadata.nbgrader.grade_id }}", "{{ grade.get('grade_id', '') | e }}"}
    ids = _template_ids()
    assert "notebook-container" in ids and "{{ cell.metadata.nbgrader.grade_id }}-comment" in ids
    reserved = reserved_ids(["g"])
    for found in ids:
        form = next((f for f in grade_id_forms if found.startswith(f)), None)
        if form is not None:
            assert found[len(form) :] in GRADE_ID_SUFFIXES, found
            assert "g" + found[len(form) :] in reserved
        elif "cell-id=" in found or "div_id" in found:  # a cell's own id (the student's are "added-N"); JS
            continue  # outputs, which are never kept
        else:
            assert "{" not in found and found.casefold() in reserved, found


@pytest.mark.parametrize(
    "text, left",
    [
        ("## written_scaling\nMy answer", "\\## written_scaling\nMy answer"),
        ("# Fine\n\n> - ## Written_Scaling", "# Fine\n\n> - \\## Written_Scaling"),
        ("written_scaling-comment\n---\n", "written_scaling-comment\n\\---\n"),
        ("## notebook-container", "\\## notebook-container"),
        ("## cell-id=added-1", "\\## cell-id=added-1"),
        ("## written scaling\n\n## softmax notes", None),  # ids "written-scaling", "softmax-notes": free
    ],
)
def test_headings_named_like_a_graded_cell_lose_their_marks_and_others_stay(text, left):
    reserved = reserved_ids(["written_scaling", "softmax"])
    out, taken = distinct_headings(text, reserved)
    assert out == (text if left is None else left)
    assert bool(taken) == (left is not None)
    assert not [i for i in heading_ids(out) if i.casefold() in reserved or i.startswith("cell-id=")]


def test_a_heading_that_cannot_be_unmarked_shows_the_cell_as_text(monkeypatch):
    from coursekit import inert

    monkeypatch.setattr(inert, "_ATX", re.compile(r"(?!)"))  # as if a heading form were missed
    out, taken = distinct_headings("## softmax", reserved_ids(["softmax"]))
    assert taken == ["softmax"] and out.startswith("*This cell is shown as text") and heading_ids(out) == []


# --- in a browser ----------------------------------------------------------------------


def hostile_notebook(port: int, png: str, navigate: bool) -> tuple[nbformat.NotebookNode, set[int]]:
    """A notebook where each attack N sets ``window.pwnN``, changes the title or requests ``/N``.

    Returns the notebook and the numbers of the attacks meant to reach the listener.
    ``navigate`` adds a meta refresh: a Content-Security-Policy cannot stop it, and a page that
    navigates away cannot report the other attacks, so only the sanitised pages get it.
    """
    url = f"http://127.0.0.1:{port}"
    markdown = {
        1: "<script>window.pwn1 = 1</script>",
        2: 'An image: <img src=x onerror="window.pwn2 = 1">',
        3: '<iframe srcdoc="<script>parent.pwn3 = 1</script>"></iframe>',
        4: '<svg onload="window.pwn4 = 1"></svg>',
        5: "[a link](javascript:window.pwn5=1)",
        6: f"![beacon]({url}/6.png)",
        7: f"<style>body {{ background: url({url}/7) }}</style>",
        8: '<a href="javascript:window.pwn8=1">click</a>',
        10: '<!--> <img src=x onerror="window.pwn10 = 1"> -->',
        11: "<img src=x onerror=\"document.title = 'pwned 11'\">",
        12: '```mermaid\n<img src=x onerror="window.pwn12 = 1">\n```',
        13: '<details open ontoggle="window.pwn13 = 1">x</details>',
        14: f'<object data="{url}/14"></object>',
    }
    if navigate:
        markdown[9] = f'<meta http-equiv="refresh" content="0; url={url}/9">'
    outputs = {
        20: {"data": {"text/html": "<script>window.pwn20 = 1</script>"}},
        21: {"data": {"text/html": '<img src=x onerror="window.pwn21 = 1">'}},
        22: {"data": {"application/javascript": "window.pwn22 = 1;"}},
        23: {"data": {"image/png": png}, "metadata": {"image/png": {"width": "1 onload=window.pwn23=1"}}},
        24: {"data": {"text/markdown": '<img src=x onerror="window.pwn24 = 1">'}},
        25: {"data": {"text/html": f'<iframe src="{url}/25"></iframe>'}},
        26: {"data": {"text/html": f'<link rel="stylesheet" href="{url}/26">'}},
        27: {
            "data": {
                "image/svg+xml": (
                    '<svg xmlns="http://www.w3.org/2000/svg" onload="window.pwn27=1"><image '
                    f'href="{url}/27"/></svg>'
                )
            }
        },
        28: {"data": {"text/html": f'<img src="{url}/28">'}},
        29: {"data": {"image/png": 'x" onerror="window.pwn29 = 1'}},
        30: {"data": {"text/html": f"<style>@import url({url}/30);</style>"}},
        31: {"data": {"text/html": f'<base href="{url}/31/"><img src="x.png">'}},
        32: {"data": {"text/html": '<a href="javascript:window.pwn32=1">click</a>'}},
    }
    network = {6, 7, 9, 14, 25, 26, 27, 28, 30, 31}
    nb = nbformat.v4.new_notebook()
    for n, text in markdown.items():
        cell = nbformat.v4.new_markdown_cell(text)
        if n % 2:  # nbgrader's templates render answer cells in their own branch
            cell.metadata["nbgrader"] = {"grade_id": f"answer{n}", "solution": True, "grade": n == 1, "points": 1,
                                         "score": 0, "locked": False, "schema_version": 3}  # fmt: skip
        nb.cells.append(cell)
    code = nbformat.v4.new_code_cell("print('hello')", execution_count=1)
    code.outputs = [
        nbformat.from_dict(
            {"output_type": "display_data", "metadata": o.get("metadata", {}), "data": o["data"]}
        )
        for o in outputs.values()
    ] + [
        nbformat.v4.new_output("stream", name="stdout", text="<script>window.pwn40 = 1</script>\n"),
        nbformat.v4.new_output(
            "error",
            ename="E",
            evalue="<img src=x onerror=window.pwn41=1>",
            traceback=["<script>window.pwn42=1</script>"],
        ),
    ]
    nb.cells.append(code)
    return nb, network


def cleaned(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """What the autograder stores: outputs rebuilt, markdown made inert."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        if cell.cell_type == "code":
            outputs, _ = clean_outputs(json.loads(json.dumps(cell.outputs)))
            cell.outputs = [nbformat.from_dict(o) for o in outputs]
        elif cell.cell_type == "markdown":
            cell.source, _ = inert_markdown(cell.source)
    nbformat.validate(nb)
    return nb


@pytest.fixture
def browser(tmp_path):
    driver = chromium(tmp_path / "chromium-profile")
    yield driver
    driver.quit()


@pytest.mark.slow
@pytest.mark.browser
def test_browser_runs_no_attack_after_cleaning_or_under_csp(tmp_path, browser, png):
    with Listener() as listener:
        control_nb, network = hostile_notebook(listener.port, png, navigate=False)
        full_nb, _ = hostile_notebook(listener.port, png, navigate=True)
        markdown_cells = [c for c in full_nb.cells if c.cell_type == "markdown"]
        pages = {
            "control-classic": render(control_nb, "classic"),
            "control-formgrade": render(control_nb, "formgrade"),
            "clean-formgrade": render(cleaned(full_nb), "formgrade"),
            "clean-feedback": render(cleaned(full_nb), "feedback"),
            "csp-classic": with_csp(render(control_nb, "classic")),
            "csp-feedback": with_csp(render(control_nb, "feedback")),
            "clean-csp-feedback": with_csp(render(cleaned(full_nb), "feedback")),  # what students get
        }
        seen = {}
        for name, page in pages.items():
            path = tmp_path / f"{name}.html"
            path.write_text(page, encoding="utf-8")
            seen[name] = visit(browser, listener, path)

    for name, s in seen.items():
        if name.startswith("control"):  # the attacks work without this module: the test can fail
            # raw HTML in markdown and in text/html and text/markdown outputs, image metadata, and
            # the comment that Python's HTMLParser reads differently from a browser
            assert {"pwn1", "pwn2", "pwn10", "pwn20", "pwn21", "pwn23", "pwn24"} <= set(s["pwned"]), (name, s)
            assert "pwned" in s["title"] and s["risky_links"], (name, s)
            assert {6, 28} <= set(s["requested"]) <= network, (name, s)
        else:
            assert s["pwned"] == [], (name, s)
            assert s["title"] == s["title_before"] == ("Notebook" if "classic" in name else "ps1"), (name, s)
            assert s["requested"] == [] and s["stray"] == [], (name, s)
            assert s["url"] == (tmp_path / f"{name}.html").as_uri(), (name, s)  # nothing navigated away
        if name.startswith("clean"):  # inert, and still there for the grader to read
            assert s["risky_links"] == 0, (name, s)
            assert "<script>window.pwn40 = 1</script>" in s["text"], name  # stream text, escaped by nbconvert
            assert s["text"].count("This cell held HTML that the autograder shows as text:") == len(
                markdown_cells
            ), name
            assert '<img src=x onerror="window.pwn2 = 1">' in s["text"], name
            assert "[an application/javascript output was not shown" in s["text"], name
