"""Make what a student's notebook produced safe to show: no script runs, nothing is fetched.

The autograder runs student code in a sandbox and collects each code cell's outputs as
*untrusted data*: dicts shaped like nbformat v4 outputs, but written by a process the
student controls. nbgrader then renders the notebook to HTML twice, with nbconvert's
``HTMLExporter`` (the ``formgrade`` template inside the instructor's formgrader, the
``feedback`` template for the student's feedback page). Both extend nbconvert's ``classic``
template, which passes ``text/html``, ``application/javascript`` and ``text/markdown`` outputs
and the HTML inside markdown cells through raw, and writes image metadata (``width``,
``height``) into ``<img>`` unquoted. This module closes those doors:

- :func:`clean_outputs` rebuilds one cell's outputs from untrusted data, keeping only
  well-formed outputs and inert mimetypes (``text/html`` sanitised with ``nh3``);
- :func:`inert_markdown` leaves a markdown cell alone when nbconvert renders it to inert
  HTML, and otherwise shows its text in a code block;
- :func:`markdown_text` escapes a string (a file name, a note) to literal markdown;
- :func:`valid_unicode` replaces lone surrogates (which JSON can spell and UTF-8 cannot);
- :func:`cap_markdown_images` and :class:`ImageBudget` cap embedded images
  (:data:`MAX_IMAGE_BYTES` each, :data:`MAX_NOTEBOOK_IMAGE_BYTES` a notebook);
- :func:`distinct_headings` keeps a student's heading from taking the HTML id of a graded cell;
- :func:`with_csp` and :func:`harden_html_file` add a Content-Security-Policy to a page, so
  that whatever slipped through runs no script and fetches nothing.

Example: ``clean_outputs([{"output_type": "display_data", "metadata": {}, "data": {"text/html":
"<b onclick='x()'>hi</b><script>x()</script>"}}])`` -> ``([{"output_type": "display_data",
"data": {"text/html": "<b>hi</b>"}, "metadata": {}}], ["HTML in an output of this cell was
reduced to inert content"])``

Over 500 lines: making student output inert is one policy: the allow-list of output types, the
sanitiser's settings, markdown shown as text and the Content-Security-Policy, kept together so they
are reviewed together.
"""

from __future__ import annotations

import functools
import html
import re
from html.parser import HTMLParser
from pathlib import Path

import nh3

__all__ = [
    "CSP",
    "MAX_IMAGE_BYTES",
    "MAX_NOTEBOOK_IMAGE_BYTES",
    "ImageBudget",
    "cap_markdown_images",
    "clean_outputs",
    "distinct_headings",
    "harden_html_file",
    "inert_markdown",
    "markdown_text",
    "reserved_ids",
    "valid_unicode",
    "with_csp",
]

#: The policy :func:`with_csp` adds. No script, frame, font file, stylesheet file, form
#: target or connection is allowed; images and fonts only as ``data:`` URLs (figures are
#: embedded), styles only inline (nbconvert inlines its CSS). ``frame-ancestors`` and
#: ``sandbox`` would be welcome but browsers ignore both in a ``<meta>`` policy.
CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:; base-uri "
    "'none'; form-action 'none'"
)

# --- outputs ---------------------------------------------------------------------------

#: Mimetypes kept by :func:`clean_outputs` (``text/html`` after sanitising).
KEPT_MIMETYPES = ("text/plain", "text/html", "text/latex", "image/png", "image/jpeg", "image/gif")
_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif")
#: Strict base64 (line breaks allowed, checked after removing them) and the embedded-image URL.
_B64 = r"(?=.)(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"  # not empty, padded
_BASE64 = re.compile(_B64)
_DATA_IMAGE = re.compile(r"data:image/(?:png|jpeg|gif);base64," + _B64)
_LINK = re.compile(r"(?:https?://|mailto:)", re.IGNORECASE)
#: Bytes charged for each kept output on top of its text, so that a million empty outputs
#: also meet the cap.
_OUTPUT_OVERHEAD = 64
_TRUNCATED = "\n[... the autograder cut this output here: the cell's outputs were too long ...]\n"

_HTML_TAGS = {
    "a", "abbr", "b", "blockquote", "br", "caption", "cite", "code", "col", "colgroup", "dd", "del",
    "div", "dl", "dt", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "ins", "kbd", "li",
    "mark", "ol", "p", "pre", "q", "s", "samp", "small", "span", "strong", "sub", "sup", "table",
    "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul", "var",
}  # fmt: skip
#: Removed together with their content (their text is code, CSS or a hidden document).
_HTML_DROP_CONTENT = {
    "script", "style", "template", "iframe", "object", "embed", "noscript", "noembed", "noframes",
    "textarea", "title", "svg", "math", "xmp", "select",
}  # fmt: skip
_HTML_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title", "width", "height"},
    "table": {"border"},
    "td": {"colspan", "rowspan", "align"},
    "th": {"colspan", "rowspan", "align", "scope"},
    "ol": {"start"},
    "abbr": {"title"},
}
_DIMENSION = re.compile(r"\d{1,5}%?")


def _html_attribute(tag: str, name: str, value: str) -> str | None:
    """nh3's last word on an attribute: links only to the web or mail, images only embedded."""
    if name == "href":
        return value if _LINK.match(value) else None
    if name == "src":
        return value if tag == "img" and _DATA_IMAGE.fullmatch(value) else None
    if name in ("width", "height", "colspan", "rowspan", "start", "border"):
        return value if _DIMENSION.fullmatch(value) else None
    return value


_CLEANER = nh3.Cleaner(
    tags=_HTML_TAGS,
    clean_content_tags=_HTML_DROP_CONTENT,
    attributes=_HTML_ATTRIBUTES,
    attribute_filter=_html_attribute,
    strip_comments=True,
    link_rel=None,
    url_schemes={"http", "https", "mailto", "data"},
    url_relative="deny",
    allowed_classes={"table": {"dataframe"}},
)


def _text(value: str) -> str:
    """``value`` as a string that can be written as UTF-8: lone surrogates become ``?``."""
    return value.encode("utf-8", errors="replace").decode("utf-8")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_unicode(text: str) -> tuple[str, int]:
    """``text`` with every lone surrogate replaced by U+FFFD, and how many there were.

    JSON can spell a lone surrogate (``"\\ud800"``) that no UTF-8 file, SQLite text, Python
    compiler or HTML page accepts; a notebook's text is made writable here, once, before
    anything else reads it. A surrogate *pair* in the JSON is one character and is kept.

    Example: ``"a\\ud800b"`` -> ``("a\\ufffdb", 1)``; ``"caf\\u00e9"`` -> ``("caf\\u00e9", 0)``
    """
    return _LONE_SURROGATE.subn("\ufffd", text)


# --- embedded images ---------------------------------------------------------------------

#: The most bytes (of base64 text, as the page holds them) one embedded image may take in a
#: notebook's markdown or outputs; a larger one is replaced by a line saying so.
MAX_IMAGE_BYTES = 2 * 2**20
#: The most bytes all embedded images of a notebook's markdown may take, and as much again for
#: the images of its outputs: the feedback page stays a few megabytes however many there are.
MAX_NOTEBOOK_IMAGE_BYTES = 8 * 2**20


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class ImageBudget:
    """The bytes of embedded images a notebook may still show: :data:`MAX_NOTEBOOK_IMAGE_BYTES` in
    all and :data:`MAX_IMAGE_BYTES` each, unless given."""

    def __init__(self, total: int | None = None, each: int | None = None):
        self.total = MAX_NOTEBOOK_IMAGE_BYTES if total is None else total
        self.each = MAX_IMAGE_BYTES if each is None else each
        self.left = self.total

    def why_not(self, size: int) -> str | None:
        """Charge an image of ``size`` bytes; ``None`` if it may be shown, else the reason it may not."""
        if size > self.each:
            return f"an image of {_mib(size)} was removed: images are shown up to {_mib(self.each)} each"
        if size > self.left:
            return (
                f"an image of {_mib(size)} was removed: the images of a notebook are shown up to "
                f"{_mib(self.total)} in all"
            )
        self.left -= size
        return None


#: A markdown image whose address is a ``data:`` URL: ``![alt](data:image/png;base64,... "title")``.
_MD_DATA_IMAGE = re.compile(
    r"!\[(?:[^\]\\]|\\.)*\]\(\s*<?data:[^\s)>]*>?(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
_DATA_URL = re.compile(r"data:[^\s)>\]\"'<]*", re.IGNORECASE)


def cap_markdown_images(text: str, budget: ImageBudget) -> tuple[str, list[str]]:
    """``text`` with every embedded (``data:``) image over :class:`ImageBudget`'s caps replaced
    by an italic line saying so; the notes (one per image removed) for the student.

    Images are charged in the order they appear; one within the caps is kept unchanged. A
    ``data:`` URL outside image syntax (a reference definition, bare text) is charged too.

    Example: a cell holding ``![plot](data:image/png;base64,<3 MiB>)`` ->
    ``("*[an image of 3.0 MiB was removed: images are shown up to 2.0 MiB each]*", [...])``
    """
    notes: list[str] = []

    def image(match: re.Match) -> str:
        url = _DATA_URL.search(match[0])
        why = budget.why_not(len(url[0]) if url else 0)
        if why is None:
            return match[0]
        notes.append(why)
        return f"*[{why}]*"

    def bare(match: re.Match) -> str:
        why = budget.why_not(len(match[0]))
        if why is None:
            return match[0]
        notes.append(why)
        return f"[{why}]"

    # images first, then what is left (a data: URL already replaced is gone, not charged twice)
    parts = []
    last = 0
    for match in _MD_DATA_IMAGE.finditer(text):
        parts.append(_DATA_URL.sub(bare, text[last : match.start()]))
        parts.append(image(match))
        last = match.end()
    parts.append(_DATA_URL.sub(bare, text[last:]))
    return "".join(parts), notes


def _multiline(value: object) -> str | None:
    """An nbformat multiline string (a str, or a list of str to join) as one str; else None."""
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return _text("".join(value))
    return None


def _shown(name: object) -> str:
    """A mimetype or output type the student chose, short and printable, for a note."""
    text = _text(name) if isinstance(name, str) else type(name).__name__
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= 60 else text[:57] + "..."


def _a(mimetype: str) -> str:
    """``mimetype`` with its indefinite article: "a text/plain", "an image/png"."""
    return ("an " if mimetype[:1].lower() in "aeiou" else "a ") + mimetype


class _Budget:
    """The bytes of text still allowed in a cell's outputs."""

    def __init__(self, max_bytes: int):
        self.left = max_bytes
        self.cut = False

    def charge(self, n: int) -> bool:
        """Spend ``n`` bytes if they are left; say whether they were."""
        if n > self.left:
            self.cut = True
            return False
        self.left -= n
        return True

    def take(self, text: str) -> str:
        """``text``, cut (with a marker) where the budget runs out."""
        size = len(text.encode("utf-8"))
        if size <= self.left:
            self.left -= size
            return text
        self.cut = True
        kept = text.encode("utf-8")[: self.left].decode("utf-8", errors="ignore")
        self.left = 0
        return kept + _TRUNCATED


def _clean_bundle(
    data: dict, budget: _Budget, notes: list[str], images: ImageBudget
) -> dict[str, str] | None:
    """The inert part of a mime bundle, cut to the budget; None if the bundle is malformed."""
    if not all(isinstance(k, str) for k in data):
        return None
    values = {}
    for mimetype in KEPT_MIMETYPES:
        if mimetype in data:
            value = _multiline(data[mimetype])
            if value is None:
                notes.append(f"{_a(mimetype)} output of this cell was malformed and was not kept")
            else:
                values[mimetype] = value
    markdown = _multiline(data.get("text/markdown"))
    if "text/plain" not in values and markdown is not None:
        values["text/plain"] = markdown  # shown as text: markdown may hold HTML
    for mimetype in data:
        if mimetype not in KEPT_MIMETYPES and not (mimetype == "text/markdown" and markdown is not None):
            notes.append(
                f"{_a(_shown(mimetype))} output of this cell was not shown: the autograder shows only inert content"
            )
    for mimetype in _IMAGE_TYPES:
        if mimetype in values and not _BASE64.fullmatch(values[mimetype].replace("\n", "")):
            notes.append(f"{_a(mimetype)} output of this cell was not valid base64 and was not kept")
            del values[mimetype]
    if "text/html" in values:
        cleaned = _CLEANER.clean(values["text/html"])
        if cleaned != values["text/html"]:
            notes.append("HTML in an output of this cell was reduced to inert content")
        values["text/html"] = cleaned

    kept = {}
    removed = None  # why an image was not kept for its size
    for mimetype, value in values.items():  # text first, images last: cut an image rather than text
        if mimetype in _IMAGE_TYPES:
            why = images.why_not(len(value))
            if why is not None:
                notes.append(why)
                removed = why
            elif budget.charge(len(value)):  # an image cut short is no image: keep it whole or not at all
                kept[mimetype] = value
        elif budget.left > 0:
            cut = budget.take(value)
            kept[mimetype] = _CLEANER.clean(cut) if mimetype == "text/html" and cut != value else cut
        elif value:
            budget.cut = True
    if removed is not None and "text/plain" not in kept:
        kept["text/plain"] = budget.take(f"[{removed}]")
    if not kept and data and not budget.cut:
        gone = ", ".join(_shown(k) for k in list(data)[:3])
        kept["text/plain"] = budget.take(
            f"[{_a(gone)} output was not shown: the autograder shows only inert content]"
        )
    return kept


def _clean_output(out: object, budget: _Budget, notes: list[str], images: ImageBudget) -> dict | None:
    """One output rebuilt from untrusted data, or None (with a note) to drop it."""
    malformed = "an output of this cell was malformed and was not kept"
    if not isinstance(out, dict):
        notes.append(malformed)
        return None
    kind = out.get("output_type")
    if kind == "stream":
        name, text = out.get("name"), _multiline(out.get("text"))
        if name not in ("stdout", "stderr") or text is None:
            notes.append(malformed)
            return None
        if not budget.charge(_OUTPUT_OVERHEAD):
            return None
        return {"output_type": "stream", "name": name, "text": budget.take(text)}
    if kind in ("display_data", "execute_result"):
        data, count = out.get("data"), out.get("execution_count")
        count_ok = count is None or (type(count) is int and count >= 0)
        if not isinstance(data, dict) or (
            kind == "execute_result" and ("execution_count" not in out or not count_ok)
        ):
            notes.append(malformed)
            return None
        if not budget.charge(_OUTPUT_OVERHEAD):
            return None
        bundle = _clean_bundle(data, budget, notes, images)
        if bundle is None:
            notes.append(malformed)
            return None
        if not bundle and data:  # everything it held was cut for length
            return None
        rebuilt = {"output_type": kind, "data": bundle, "metadata": {}}
        if kind == "execute_result":
            rebuilt["execution_count"] = count
        return rebuilt
    if kind == "error":
        ename, evalue, traceback = out.get("ename"), out.get("evalue"), out.get("traceback")
        if not (
            isinstance(ename, str)
            and isinstance(evalue, str)
            and isinstance(traceback, list)
            and all(isinstance(line, str) for line in traceback)
        ):
            notes.append(malformed)
            return None
        if not budget.charge(_OUTPUT_OVERHEAD):
            return None
        lines = []
        ename, evalue = budget.take(_text(ename)), budget.take(_text(evalue))
        for line in traceback:
            if budget.left <= 0:
                budget.cut = True
                break
            lines.append(budget.take(_text(line)))
        return {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": lines}
    notes.append(f"an output of type {_shown(kind)} in this cell was malformed or unknown and was not kept")
    return None


def clean_outputs(
    outputs: object, *, max_bytes: int = 4 << 20, images: ImageBudget | None = None
) -> tuple[list[dict], list[str]]:
    """Rebuild one code cell's outputs from untrusted data into inert, valid nbformat outputs.

    Kept: ``stream`` (``stdout``/``stderr``), ``display_data`` and ``execute_result`` (a mime
    bundle of strings; an integer or null ``execution_count``), ``error`` (``ename``,
    ``evalue``, a list of ``traceback`` lines). Text may be a string or a list of strings
    (nbformat's multiline form; joined). Every ``metadata`` becomes ``{}``: nbconvert writes
    image metadata into ``<img>`` unquoted. Of a mime bundle only these survive:
    ``text/plain``; ``text/html`` sanitised with nh3 (formatting and table tags; links to
    http/https/mailto; images only as embedded PNG/JPEG/GIF; no script, style, frame, form,
    SVG or event handler); ``text/latex``; ``image/png``, ``image/jpeg`` and ``image/gif`` given
    as strict base64. ``text/markdown`` becomes ``text/plain`` where there is none; the rest
    (``application/javascript``, ``image/svg+xml``, widgets, ...) is dropped, and a bundle left
    empty shows a ``text/plain`` placeholder. Malformed outputs are dropped. Lone surrogates
    become ``?``. An image over :data:`MAX_IMAGE_BYTES`, or over what is left of ``images``,
    is replaced by a ``text/plain`` line saying so (where the bundle has no text of its own).

    Args:
        outputs: the cell's outputs as the sandbox reported them: a list of dicts, or anything.
        max_bytes: the most UTF-8 bytes of text kept over all outputs (plus 64 per output);
            text is cut there with a marker, later outputs are dropped, and images are kept
            whole or not at all.
        images: the notebook's budget of embedded images, shared by the calls for its cells
            (:class:`ImageBudget`); ``None``: a fresh one for this cell alone.

    Returns:
        ``(kept, notes)``: the rebuilt outputs as plain dicts (valid in an nbformat 4.5 code
        cell), and short notes, each given once, on what was dropped or changed (they quote
        mimetypes the student chose: escape them with :func:`markdown_text` before showing
        them as markdown).

    Example: ``[{"output_type": "stream", "name": "stdout", "text": "hi"}, 3]``
    -> ``([{"output_type": "stream", "name": "stdout", "text": "hi"}],
    ["an output of this cell was malformed and was not kept"])``
    """
    if type(max_bytes) is not int or max_bytes < 0:
        raise ValueError(f"max_bytes must be a non-negative int, got {max_bytes!r}")
    if not isinstance(outputs, list):
        return [], ["the outputs of this cell were malformed and were not kept"]
    budget = _Budget(max_bytes)
    images = ImageBudget() if images is None else images
    notes: list[str] = []
    kept = []
    for out in outputs:
        if budget.cut and budget.left <= 0:
            break
        rebuilt = _clean_output(out, budget, notes, images)
        if rebuilt is not None:
            kept.append(rebuilt)
    if budget.cut:
        notes.append(f"the outputs of this cell were longer than {max_bytes} bytes and were cut short")
    return kept, list(dict.fromkeys(notes))


# --- markdown --------------------------------------------------------------------------


@functools.cache
def _pygments_classes() -> frozenset[str]:
    """The CSS classes pygments puts on highlighted code (``k``, ``nf``, ``s1``, ...)."""
    from pygments.token import STANDARD_TYPES

    return frozenset(c for c in STANDARD_TYPES.values() if c)


#: Tags nbconvert's markdown may produce and the attributes each may carry.
_MD_TAGS: dict[str, set[str]] = {
    **{t: set() for t in ("p", "em", "strong", "b", "i", "blockquote", "br", "hr", "table", "thead",
                          "tbody", "tr", "sup", "sub", "del", "ul", "dl", "dt", "dd")},
    **{f"h{n}": {"id"} for n in range(1, 7)},
    "code": {"class"}, "pre": {"class"}, "span": {"class"}, "div": {"class"}, "li": {"class"},
    "ol": {"start"}, "th": {"style"}, "td": {"style"},
    "a": {"href", "title", "class"},
    "img": {"src", "alt", "title"},
    "input": {"class", "type", "disabled", "checked"},  # task lists: "- [x] done"
}  # fmt: skip
_MD_CLASSES = {"anchor-link", "highlight", "task-list-item", "task-list-item-checkbox"}
_LANGUAGE_CLASS = re.compile(r"language-[\w+#.-]+")
_ALIGN = re.compile(r"text-align:(?:left|center|right)")
_MD_LINK = re.compile(r"(?:https?://|mailto:|#)", re.IGNORECASE)


class _Inspector(HTMLParser):
    """Reads rendered markdown and decides whether every tag and attribute is inert."""

    def __init__(self):
        super().__init__(convert_charrefs=False)
        self.safe = True

    def _attribute_ok(self, tag: str, name: str, value: str | None) -> bool:
        if name not in _MD_TAGS[tag]:
            return False
        value = value or ""
        if name == "href":
            return bool(_MD_LINK.match(value))
        if name == "src":
            return bool(_DATA_IMAGE.fullmatch(value))
        if name == "class":
            return all(
                c in _MD_CLASSES or c in _pygments_classes() or _LANGUAGE_CLASS.fullmatch(c)
                for c in value.split()
            )
        if name == "style":
            return bool(_ALIGN.fullmatch(value))
        if name == "type":
            return value == "checkbox"
        if name == "start":
            return value.isdigit()
        return True

    def handle_starttag(self, tag, attrs):
        if tag not in _MD_TAGS or not all(self._attribute_ok(tag, k, v) for k, v in attrs):
            self.safe = False

    def handle_endtag(self, tag):
        if tag not in _MD_TAGS:
            self.safe = False

    def handle_data(self, data):
        if "<" in data:  # markup this parser did not read as a tag; a browser may
            self.safe = False

    # Comments (a browser ends "<!-->" at once; this parser may not), declarations, processing
    # instructions and CDATA never come from plain markdown.
    def handle_comment(self, data):
        self.safe = False

    def handle_decl(self, decl):
        self.safe = False

    def handle_pi(self, data):
        self.safe = False

    def unknown_decl(self, data):
        self.safe = False


def _renders_inert(text: str) -> bool:
    """Whether nbconvert renders the markdown ``text`` to HTML made only of inert tags."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune
    from nbconvert.filters.strings import strip_files_prefix

    try:
        rendered = strip_files_prefix(markdown2html_mistune(text))
    except Exception:  # an "attachment:" image: the filter looks for the attachment and finds none
        return False
    inspector = _Inspector()
    inspector.feed(rendered)
    inspector.close()
    return inspector.safe


def inert_markdown(text: str) -> tuple[str, bool]:
    """A markdown cell's source, made safe to render with nbconvert's markdown filter.

    The text is rendered as nbgrader's templates render it
    (``nbconvert.filters.markdown_mistune.markdown2html_mistune``) and the HTML read back: if
    every tag and attribute is in an allowlist of what plain markdown produces (paragraphs,
    emphasis, code, lists, headings, quotes, rules, tables, links to http/https/mailto or
    ``#``, images only as embedded PNG/JPEG/GIF; no event handler, ``style`` beyond a table
    column's alignment, comment or raw ``<``), the text comes back unchanged. Otherwise it
    comes back as a literal code block under one line saying so. nbconvert escapes math and
    code, so ``$a<b$`` and a code span holding ``<script>`` stay as they are. Mermaid blocks
    (nbconvert passes their text through unescaped, for mermaid.js to draw) and
    ``attachment:`` images (their data is the cell's, not checked here) are shown as text.

    Args:
        text: the cell's markdown source.

    Returns:
        ``(source, shown_as_text)``: the source to store (``text`` itself when it was inert;
        lone surrogates become ``?`` either way) and whether it was turned into a code block.

    Example: ``"# Hi $a<b$"`` -> ``("# Hi $a<b$", False)``;
    ``"<img src=x onerror=alert(1)>"`` -> ``("*This cell held HTML ...*\\n\\n```\\n<img ...>\\n```\\n", True)``
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    text = _text(text)
    if _renders_inert(text):
        return text, False
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    body = text if text.endswith("\n") else text + "\n"
    return f"*This cell held HTML that the autograder shows as text:*\n\n{fence}\n{body}{fence}\n", True


# --- heading anchors -------------------------------------------------------------------

#: The ``id``\ s that the pages showing a notebook give their own elements: nbgrader's formgrader
#: (``formgrade/index.html.j2``, whose script finds a cell's score box by its grade id), nbgrader's
#: own feedback template, nbconvert's ``classic`` template, and our feedback page
#: (``coursekit/templates/feedback``, whose part links go to the test cells' grade ids).
#: ``tests/test_inert.py`` reads the templates and fails if one of them gains an id not covered here.
PAGE_IDS = frozenset({"notebook", "notebook-container", "statusmessage", "toc"})
#: What the formgrader appends to a grade id for the other fields of a cell.
GRADE_ID_SUFFIXES = ("", "-comment", "_extra_credit")
#: nbconvert's ``cell_id_anchor``: ``id="cell-id=<the cell's id>"``.
_CELL_ID_PREFIX = "cell-id="


def reserved_ids(grade_ids) -> frozenset[str]:
    """The element ids (casefolded) that a heading written by a student must not take: those of
    :data:`PAGE_IDS` and, for each grade id, the formgrader's ids of that cell's fields."""
    ids = {i.casefold() for i in PAGE_IDS}
    ids |= {f"{g}{suffix}".casefold() for g in grade_ids for suffix in GRADE_ID_SUFFIXES}
    return frozenset(ids)


class _HeadingIds(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
            self.ids += [v or "" for k, v in attrs if k == "id"]


def heading_ids(text: str) -> list[str]:
    """The ``id`` of every heading nbconvert renders from the markdown ``text`` (it makes them
    from the heading's text: ``"## Written answer"`` -> ``["Written-answer"]``)."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    try:
        rendered = markdown2html_mistune(text)
    except Exception:  # an "attachment:" image the filter cannot find: no page shows this text as markdown
        return []
    parser = _HeadingIds()
    parser.feed(rendered)
    parser.close()
    return parser.ids


def _taken(ids: list[str], reserved: frozenset[str]) -> list[str]:
    return [i for i in ids if i.casefold() in reserved or i.casefold().startswith(_CELL_ID_PREFIX)]


#: An ATX heading's marks, after any blockquote and list markers: ``> - ## title``.
_ATX = re.compile(r"^((?:[ ]{0,3}(?:>|[-*+]|\d{1,9}[.)])[ \t]*)*[ ]{0,3})(#{1,6})(?=[ \t\r]|$)")
#: A setext heading's underline (``===`` or ``---``), after any blockquote markers.
_SETEXT = re.compile(r"^((?:[ ]{0,3}>[ \t]*)*[ ]{0,3})(=+|-+)[ \t\r]*$")
_SETEXT_ANYWHERE = re.compile(r"^[ \t>]*(?:=+|-+)[ \t\r]*$", re.MULTILINE)


def distinct_headings(text: str, reserved: frozenset[str]) -> tuple[str, list[str]]:
    """``text`` with every heading whose HTML id would be one of the grader's (``reserved``, see
    :func:`reserved_ids`) shown as plain text, and the ids that were taken.

    nbconvert gives each markdown heading an ``id`` made from its text, so a student's
    ``## written_scaling`` would carry the same id as the formgrader's score box of the cell
    ``written_scaling``, and the grade typed there would be saved nowhere. Such a heading keeps
    its text but loses its heading marks (``\\## written_scaling`` renders as
    ``## written_scaling``); other headings are left alone. Should a heading still take a
    reserved id after that, the whole text is shown as a code block.

    Example: ``"## written_scaling\\nMy answer"`` with ``reserved_ids(["written_scaling"])``
    -> ``("\\## written_scaling\\nMy answer", ["written_scaling"])``
    """
    if "#" not in text and not _SETEXT_ANYWHERE.search(text):  # no heading: nothing to render
        return text, []
    taken = _taken(heading_ids(text), reserved)
    if not taken:
        return text, []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = _ATX.match(line)
        if m and _taken(heading_ids(line[m.end(1) :]), reserved):
            lines[i] = f"{m[1]}\\{line[m.end(1) :]}"
    fixed = "\n".join(lines)
    if _taken(heading_ids(fixed), reserved):  # a setext heading: "title" over "===" or "---"
        for i, line in enumerate(lines):
            m = _SETEXT.match(line)
            if m and i > 0 and lines[i - 1].strip():
                lines[i] = f"{m[1]}\\{line[m.end(1) :]}"
        fixed = "\n".join(lines)
    if _taken(heading_ids(fixed), reserved):
        fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
        body = text if text.endswith("\n") else text + "\n"
        why = "*This cell is shown as text: a heading in it had the name of a graded cell.*"
        fixed = f"{why}\n\n{fence}\n{body}{fence}\n"
    return fixed, taken


#: ASCII punctuation, every character of which markdown lets a backslash escape.
_MARKDOWN_PUNCTUATION = re.compile(r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]")
_ENTITIES = {"&": "&amp;", "<": "&lt;"}
_LINE_BREAKS = re.compile(r"\r\n|[\r\n\t\v\f\x1c-\x1e\x85\u2028\u2029]")


def markdown_text(text: str) -> str:
    """``text`` escaped to render as itself, on one line, inside a markdown cell.

    Markdown punctuation gets a backslash, ``&`` and ``<`` become ``&amp;`` and ``&lt;``, line
    breaks and tabs become spaces and the ends are stripped (four leading spaces would make a
    code block). Lone surrogates become ``?``. Math delimiters are escaped for the markdown
    parser, but MathJax (loaded by nbconvert's pages, with its Safe extension) may still
    typeset ``$...$`` in the rendered text.

    Args:
        text: any string, e.g. a file name the student chose or a note that quotes one.

    Returns:
        Markdown source that renders as ``text`` (with line breaks as spaces).

    Example: ``"a_b <i>*c*</i>"`` -> ``"a\\_b &lt;i\\>\\*c\\*&lt;\\/i\\>"``
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    text = _LINE_BREAKS.sub(" ", _text(text)).strip(" ")
    return _MARKDOWN_PUNCTUATION.sub(lambda m: _ENTITIES.get(m[0], "\\" + m[0]), text)


# --- pages -----------------------------------------------------------------------------

_HEAD = re.compile(r"<head(?=[\s/>])[^>]*>", re.IGNORECASE)


def with_csp(page: str) -> str:
    """``page`` with :data:`CSP` as the first element of its (first) ``<head>``.

    The policy applies to what follows it, so it goes before any script, style or link.
    With it, the page runs no script (nbconvert's MathJax and require.js included: the page
    must make sense without them) and fetches nothing; images must be embedded. A policy
    cannot stop navigation: a ``<meta http-equiv="refresh">`` in the content still works,
    which is why the content is made inert as well.

    Args:
        page: a whole HTML document with a ``<head>`` element.

    Returns:
        The document with ``<meta http-equiv="Content-Security-Policy" content="...">`` added.

    Raises:
        ValueError: if the page has no ``<head>`` start tag.
    """
    match = _HEAD.search(page)
    if match is None:
        raise ValueError(f"the page has no <head> to put the policy in; it starts {page[:80]!r}")
    meta = f'<meta http-equiv="Content-Security-Policy" content="{html.escape(CSP, quote=False)}">'
    return page[: match.end()] + meta + page[match.end() :]


def harden_html_file(path: str | Path) -> None:
    """Add :data:`CSP` to the HTML file at ``path``, in place (see :func:`with_csp`).

    Args:
        path: an HTML file, read and written as UTF-8.

    Raises:
        ValueError: if the page has no ``<head>``.
    """
    path = Path(path)
    path.write_text(with_csp(path.read_text(encoding="utf-8")), encoding="utf-8")
