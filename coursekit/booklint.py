"""Checks on the book's pages that keep prose and figures honest.

Two questions are asked of every page:

* **Does every number in the prose come from somewhere?** A number the page's code computes is
  glued from the run (``{glue:text}`key``), so the prose cannot drift from the output. A number
  taken from a paper sits in a sentence that cites it. Everything else needs an entry with its
  reason in ``book/numbers/<page>.toml``. Not counted: 0 and 1, numbers inside math, inline code, links
  and glue, references such as "Chapter 3" or "Table 1", and numbers that are part of a name
  (GPT-2, float32, H100).
* **Can every figure be read?** Every figure is SVG with its text kept as text, carries a caption
  (``mystnb: figure: caption``) and alt text (``mystnb: image: alt``), and its smallest label is at
  least :data:`MIN_TEXT_PX` CSS pixels when the figure is shrunk to a phone's text column.

Two more keep the notation and the build honest: a page writes no form the notation page retires,
and labels sizes in bytes with the prefix of its divisor (GB for powers of ten, GiB for powers of
two, :func:`unit_problems`); and a built page holds no MyST left unparsed (:func:`raw_markup`).

Over 500 lines: the checks share one reading of a MyST page (its prose blocks, captions and code
cells), which splitting them into modules would have to export.

``python -m coursekit.booklint book/ch01_attention.md`` lists a page's unaccounted numbers;
``--execute`` also runs the page (as the book build does, from ``book/``) and checks its figures
and that every glued key exists. The book's browser test measures the same text sizes on the
rendered pages.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MIN_TEXT_PX",
    "PHONE_COLUMN_PX",
    "Number",
    "allowlist",
    "figure_problems",
    "math_spans",
    "notation_problems",
    "number_problems",
    "prose_numbers",
    "raw_markup",
    "retired_forms",
    "svg_text_sizes",
    "unit_problems",
]

#: the smallest text a figure may show, in CSS pixels as rendered
MIN_TEXT_PX = 9.0
#: width of the text column on a 390 px phone (measured in headless Chromium, sphinx-book-theme)
PHONE_COLUMN_PX = 327.0

_NUMBER = re.compile(
    r"(?<![\w.,\-−+])"  # not the tail of a name (GPT-2, float32) or of a decimal
    r"[-−]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:e[-+]?\d+)?(?:[x×]\d+)?"
    r"(?!(?![x×])\w)"  # not the head of a name (3rd, 2D, 7B) ... but 2x2 and 16x are numbers
)
_REFERENCE = re.compile(
    r"\b(?:Chapters?|chapters?|[Ss]ections?|Tables?|Figures?|Eq\.|[Ee]quations?|Appendix|appendix|"
    r"Part|part|Question|question|[Ss]tep|[Ll]ine|[Ll]ines|[Cc]ell|version|v)\s+\d+(?:\.\d+)*(?:\s*(?:-|–|and|to)\s*\d+)?"
)
_ROLE = re.compile(r"\{([\w:-]+)\}`[^`]*`")
_CODE = re.compile(r"``?[^`]+``?")
_LINK_TARGET = re.compile(r"\]\([^)]*\)|<https?://[^>]*>|https?://\S+")
_MATH = re.compile(r"\$\$.*?\$\$|\$[^$]+\$")
_LIST_MARKER = re.compile(r"^\d+[.)]\s+")  # "2. " opening an item of a numbered list
_SENTENCE_END = re.compile(r"(?<=[.!?:;])\s+(?=[A-Z(*\"'\x00])")


@dataclass(frozen=True)
class Number:
    """A number in a page's prose: where it is, the text around it, and why it may stand."""

    page: str
    line: int
    text: str
    sentence: str
    why: str | None  # "cited", "allowlisted: <reason>", or None when nothing accounts for it

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text!r} in: {self.sentence[:160]}"


def _prose_blocks(lines: list[str]):
    """Paragraphs of prose as (first line number, [lines]); code cells, fenced code, display
    math, directive options and labels are skipped. Table rows are blocks of their own."""
    start = 0
    if lines and lines[0].strip() == "---":
        start = lines.index("---", 1) + 1 if "---" in lines[1:] else 0
    fence = None
    front: list[tuple[int, str]] | None = None
    cell_start = -1
    in_math = False
    prose_fences: list[str] = []  # the fences of the open directives whose body is prose
    block: list[tuple[int, str]] = []

    def flush():
        nonlocal block
        if block:
            yield block
        block = []

    for i in range(start, len(lines)):
        line, s = lines[i], lines[i].strip()
        if fence:
            if s.startswith(fence) and not s.strip(fence[0]):
                fence = None
            elif front is not None:  # a code cell's options: its figure caption and alt text are prose
                if s == "---" and front:
                    yield from _front_matter_prose(front)
                    front = None
                else:
                    front.append((i + 1, line))
            elif s == "---" and cell_start == i:
                front = []
            continue
        opened = re.match(r"^(`{3,}|~{3,}|:{3,})(.*)$", s)
        if opened:
            yield from flush()
            info = opened.group(2).strip()
            prose_directive = re.match(
                r"^\{(note|tip|warning|important|admonition|caution|attention|hint|seealso|dropdown|"
                r"exercise|solution|div|grid|grid-item|grid-item-card|card|tab-set|tab-item|margin|sidebar|"
                r"epigraph|topic|table|list-table|figure)\}(.*)$",
                info,
            )
            if prose_directive:  # its body is prose (a figure's body is its caption)
                title = prose_directive.group(2).strip()
                if title and prose_directive.group(1) in ("table", "list-table"):
                    yield [(i + 1, title)]  # a table's caption
                prose_fences.append(opened.group(1))
                continue
            if info == "" and (opened.group(1) in prose_fences or opened.group(1)[0] == ":"):
                if opened.group(1) in prose_fences:  # closing a directive whose body is prose
                    del prose_fences[len(prose_fences) - 1 - prose_fences[::-1].index(opened.group(1))]
                continue
            fence = opened.group(1)
            front, cell_start = None, (i + 1 if info.startswith("{code-cell") else -1)
            continue
        if s.startswith("$$"):
            yield from flush()
            if s.count("$$") == 1:
                in_math = not in_math
            continue
        if in_math:
            continue
        if not s or re.match(r"^:[\w-]+:", s) or re.match(r"^\(.*\)=$", s) or s.startswith("<!--"):
            yield from flush()
            continue
        if s.startswith("|"):
            yield from flush()
            if not re.match(r"^\|[\s|:-]+\|$", s):
                yield [(i + 1, line)]
            continue
        if s.startswith("#") or re.match(r"^(\d+\.|[-*+])\s", s):
            yield from flush()
        block.append((i + 1, line))
    yield from flush()


def _front_matter_prose(front: list[tuple[int, str]]):
    """The caption and alt text in a code cell's YAML options, each as one block."""
    for key in ("caption", "alt"):
        for k, (number, line) in enumerate(front):
            m = re.match(r"^(\s*)" + key + r":\s*(.*)$", line)
            if not m:
                continue
            indent, first = len(m.group(1)), m.group(2).strip()
            body = [] if first in ("|", ">", "|-", ">-", "") else [(number, first.strip("'\""))]
            for number2, line2 in front[k + 1 :]:
                if line2.strip() and len(line2) - len(line2.lstrip()) <= indent:
                    break
                if line2.strip():
                    body.append((number2, line2))
            if body:
                yield body


def _mask(text: str) -> str:
    """Blank out what is not counted (math, code, roles, links, references), keeping offsets."""

    def blank(m: re.Match) -> str:
        return " " * len(m.group())

    text = _MATH.sub(blank, text)
    text = _ROLE.sub(lambda m: "\x00" * len(m.group()) if m.group(1).startswith("cite") else blank(m), text)
    text = _CODE.sub(blank, text)
    text = _LINK_TARGET.sub(blank, text)
    text = _REFERENCE.sub(blank, text)
    return text


def allowlist(folder: Path) -> dict[str, dict[str, str]]:
    """``book/numbers/<page>.toml``: for each page, a phrase holding the number -> the reason."""
    data = {}
    for path in sorted(folder.glob("*.toml")) if folder.is_dir() else []:
        entries = tomllib.loads(path.read_text(encoding="utf-8"))
        bad = [k for k, v in entries.items() if not (isinstance(v, str) and v.strip())]
        if bad:
            raise ValueError(f"{path}: {bad[0]!r} must map to a reason (a non-empty string)")
        data[path.stem] = entries
    return data


def prose_numbers(page: Path, allowed: dict[str, str] | None = None) -> tuple[list[Number], set[str]]:
    """Every counted number in the page's prose, and the allowlist phrases that were used."""
    allowed = allowed or {}
    used: set[str] = set()
    found: list[Number] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    for block in _prose_blocks(lines):
        text = " ".join(_LIST_MARKER.sub("", line.strip()) for _, line in block)
        starts, offset = [], 0
        for number, line in block:
            starts.append((offset, number))
            offset += len(_LIST_MARKER.sub("", line.strip())) + 1
        masked = _mask(text)
        sentences, pos = [], 0
        for m in _SENTENCE_END.finditer(masked):
            sentences.append((pos, m.start()))
            pos = m.end()
        sentences.append((pos, len(masked)))
        for a, b in sentences:
            piece = masked[a:b]
            cited = "\x00" in piece
            for m in _NUMBER.finditer(piece):
                value = m.group().lstrip("-−")
                if value in {"0", "1"}:
                    continue
                at = a + m.start()
                line = max(n for o, n in starts if o <= at)
                sentence = text[a:b].strip()
                why = "cited" if cited else None
                if why is None:
                    for phrase, reason in allowed.items():
                        if phrase in sentence and _contains_number(phrase, value):
                            why, _ = f"allowlisted: {reason}", used.add(phrase)
                            break
                found.append(Number(page.stem, line, m.group(), sentence, why))
    return found, used


def _contains_number(phrase: str, value: str) -> bool:
    return any(m.group().lstrip("-−") == value for m in _NUMBER.finditer(phrase))


def number_problems(pages: list[Path], folder: Path) -> list[str]:
    """One line per number nothing accounts for, and per allowlist entry that matches nothing."""
    allowed = allowlist(folder)
    problems = []
    stems = {p.stem for p in pages}
    for page in pages:
        entries = allowed.get(page.stem, {})
        found, used = prose_numbers(page, entries)
        problems += [
            f"{n}  (glue it from the run, cite its source, or list it in {folder}/{page.stem}.toml)"
            for n in found
            if n.why is None
        ]
        problems += [
            f"{folder}/{page.stem}.toml: {phrase!r} matches no number on the page"
            for phrase in entries
            if phrase not in used
        ]
    problems += [
        f"{folder}/{stem}.toml: there is no page {stem}.md"
        for stem in allowed
        if stem not in stems and not (folder.parent / f"{stem}.md").exists()
    ]
    return problems


def retired_forms(notation: Path) -> dict[str, str]:
    """The notation page's table of forms the book does not write: form -> what is written instead."""
    text = notation.read_text(encoding="utf-8")
    section = text.split("(notation-retired)=", 1)
    if len(section) != 2:
        raise ValueError(f"{notation} has no (notation-retired)= section")
    # a pipe inside a table's cell is written \| (else it would end the cell)
    row = re.compile(r"^\|\s*`((?:\\\||[^`])+)`\s*\|\s*((?:\\\||[^|])+?)\s*\|", flags=re.M)
    rows = [(form.replace("\\|", "|"), instead) for form, instead in row.findall(section[1])]
    if not rows:
        raise ValueError(f"{notation}: the retired-forms table is empty")
    return dict(rows)


_UNIT = re.compile(r"(?<![\w-])(?:[kKMGT]B|[KMGT]iB)(?![\w-])")  # of bytes
#: a formatted value followed by its unit, as in f"{x / 2**30:.1f} GiB"
_FORMATTED = re.compile(r"\{([^{}]*)\}\s*([kKMGT]B|[KMGT]iB)(?![\w-])")
#: a line that draws: its strings are a figure's labels
_FIGURE_CALL = re.compile(r"\b(?:ax|axes|plt|fig)\.\w+\(|\b(?:x|y)?label\s*=|\btitle\s*=")
_BINARY_SCALE = re.compile(
    r"/\s*\(?\s*(?:2\s*\*\*\s*[1-4]0|1\s*<<\s*[1-4]0|1024(?:\s*\*\*\s*[2-4])?|(?:[A-Z]+_)?[KMGT]IB\b)"
)
_DECIMAL_SCALE = re.compile(r"/\s*\(?\s*(?:1e(?:3|6|9|12)\b|10\s*\*\*\s*(?:3|6|9|12)\b|1_?000(?:_?000)*\b)")
#: a line's string literals
_LABELS = re.compile(r"\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'")


def _code_cells(text: str):
    """The code cells of a MyST page as (number of their first line, their lines)."""
    for m in re.finditer(r"^(`{3,}|~{3,})\{code-cell\}[^\n]*\n(.*?)^\1\s*$", text, flags=re.M | re.S):
        yield text.count("\n", 0, m.start(2)) + 1, m.group(2).splitlines()


def unit_problems(pages: list[Path], notation: Path) -> list[str]:
    """Sizes in bytes written with the wrong prefix, as the notation page defines them (a GB is
    10^9 bytes, a GiB 2^30). In a page's code, a value divided by a power of two is printed with a
    binary unit (MiB, GiB) and one divided by a power of ten with a decimal one (MB, GB): in an
    f-string (``{x / 2**30:.1f} GiB``) and in a line's comment (``x = n / 1e9  # GB``). A figure's
    labels (axis, legend, title, text) name one kind of unit, unless one label names both."""
    problems = []
    defined = notation.read_text(encoding="utf-8") if notation.exists() else ""
    for unit in ("GB", "GiB"):
        if f"**{unit}**" not in defined:
            problems.append(f"{notation.name}: the notation page does not define **{unit}** (in bytes)")

    def kind(text: str) -> str | None:
        two, ten = _BINARY_SCALE.search(text), _DECIMAL_SCALE.search(text)
        return "binary" if two and not ten else "decimal" if ten and not two else None

    for page in pages:
        for first, lines in _code_cells(page.read_text(encoding="utf-8")):
            figure: dict[str, int] = {}  # "decimal"/"binary" -> the first figure label naming such a unit
            for k, line in enumerate(lines):
                where = f"{page.stem}:{first + k}"
                checked = [(m.group(1), m.group(2)) for m in _FORMATTED.finditer(line)]
                code, _, comment = line.partition("  #")
                if comment:
                    checked += [(code, m.group()) for m in _UNIT.finditer(comment)]
                for value, unit in checked:
                    expected = kind(value)
                    if expected and expected != ("binary" if "i" in unit else "decimal"):
                        problems.append(
                            f"{where}: a value divided by a power of {'two' if expected == 'binary' else 'ten'} "
                            f"is labelled {unit}: {line.strip()[:80]}"
                        )
                if _FIGURE_CALL.search(code):
                    for m in _LABELS.finditer(code):
                        units = {
                            "binary" if "i" in u.group() else "decimal" for u in _UNIT.finditer(m.group())
                        }
                        if len(units) == 1:
                            figure.setdefault(units.pop(), first + k)
            if len(figure) == 2:
                problems.append(
                    f"{page.stem}:{min(figure.values())}: one figure labels sizes in GB or MB (line "
                    f"{figure['decimal']}) and in GiB or MiB (line {figure['binary']}): use one unit"
                )
    return problems


def math_spans(text: str) -> list[tuple[int, str]]:
    """Every piece of math in a MyST page (``$...$``, ``$$...$$``, ``{math}`` blocks), with its line."""
    spans = []
    code = re.compile(r"^(`{3,}|~{3,})\{code-cell\}.*?^\1\s*$", re.M | re.S)
    text = code.sub(lambda m: "\n" * m.group().count("\n"), text)
    text = re.sub(r"``?[^`\n]+``?", lambda m: " " * len(m.group()), text)
    for m in re.finditer(r"\$\$(.+?)\$\$|\$([^$\n]+)\$|```\{math\}(.+?)```", text, flags=re.S):
        spans.append((text.count("\n", 0, m.start()) + 1, next(g for g in m.groups() if g is not None)))
    return spans


def notation_problems(pages: list[Path], notation: Path) -> list[str]:
    """Math on a page that writes a form the notation page retires."""
    forms = retired_forms(notation)
    squash = lambda t: re.sub(r"\s+", " ", t.replace("\\,", " ").replace("\\;", " ")).strip()  # noqa: E731
    problems = []
    for page in pages:
        if page.resolve() == notation.resolve():
            continue
        for line, math in math_spans(page.read_text(encoding="utf-8")):
            for form, instead in forms.items():
                if squash(form) in squash(math) and not (
                    form == "VC" and re.search(r"[A-Za-z\\]VC", squash(math))
                ):
                    problems.append(
                        f"{page.stem}:{line}: ${math.strip()[:60]}$ writes {form!r}; "
                        f"the notation page writes {instead}"
                    )
    return problems


def svg_text_sizes(svg: str) -> tuple[float, list[tuple[float, str]]]:
    """The SVG's width in its own units, and each label's font size with its text.

    The book's style writes text as outlines (``svg.fonttype: path``: it looks the same in every
    browser, math included). Matplotlib then draws each label as a group ``text_N`` holding a
    comment with the label and a glyph group scaled by ``size / 100``. Text kept as text
    (``svg.fonttype: none``) is read from each ``<text>`` element's ``font-size``; for mathtext
    the label's size is the largest of its pieces (an exponent is meant to be smaller).
    """
    root = ET.fromstring(svg, parser=ET.XMLParser(target=ET.TreeBuilder(insert_comments=True)))
    view = root.get("viewBox")
    width = float(view.split()[2]) if view else float(re.sub(r"[a-z]+$", "", root.get("width", "0")))
    sizes = []
    for group in root.iter("{http://www.w3.org/2000/svg}g"):
        if not re.fullmatch(r"text_\d+", group.get("id", "")):
            continue
        words = next((c.text.strip() for c in group if c.tag is ET.Comment and c.text), "")
        scale = next(
            (
                re.search(r"scale\(([\d.]+)[ ,]+-", g.get("transform", ""))
                for g in group.iter()
                if re.search(r"scale\(([\d.]+)[ ,]+-", g.get("transform", ""))
            ),
            None,
        )
        if words and scale:
            sizes.append((float(scale.group(1)) * 100, words))
    for element in root.iter("{http://www.w3.org/2000/svg}text"):
        found = [
            float(m) for e in element.iter() for m in re.findall(r"font-size:\s*([\d.]+)", e.get("style", ""))
        ]
        found += [
            float(re.sub(r"[a-z]+$", "", e.get("font-size"))) for e in element.iter() if e.get("font-size")
        ]
        words = "".join(t.strip() for t in element.itertext())
        if found and words:
            sizes.append((max(found), words))
    return width, sizes


def figure_problems(notebook, page: str, column_px: float = PHONE_COLUMN_PX) -> list[str]:
    """Problems with the figures of an executed notebook (``nbformat`` node)."""
    problems = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        images = [
            o
            for o in cell.get("outputs", [])
            if o.get("output_type") in ("display_data", "execute_result")
            and any(k.startswith("image/") for k in o.get("data", {}))
        ]
        if not images:
            continue
        where = f"{page}: cell {index} ({cell.source.strip().splitlines()[0][:60] if cell.source.strip() else ''})"
        options = cell.metadata.get("mystnb", {})
        caption = str(options.get("figure", {}).get("caption", "")).strip()
        alt = str(options.get("image", {}).get("alt", "")).strip()
        if len(caption.split()) < 6:
            problems.append(f"{where}: no caption saying what to see (mystnb: figure: caption)")
        if len(alt.split()) < 6 or re.search(r"\.(png|svg|jpe?g)\b", alt):
            problems.append(f"{where}: no alt text describing the figure (mystnb: image: alt)")
        for output in images:
            svg = output["data"].get("image/svg+xml")
            if svg is None:
                problems.append(f"{where}: a raster figure; call coursekit.viz.use_book_style() for SVG")
                continue
            width, sizes = svg_text_sizes(svg if isinstance(svg, str) else "".join(svg))
            shown = min(column_px, width * 96 / 72)  # SVG units are points; CSS has 96 px per inch
            small = [
                (size * shown / width, words) for size, words in sizes if size * shown / width < MIN_TEXT_PX
            ]
            if small:
                px, words = min(small)
                problems.append(
                    f"{where}: {len(small)} labels under {MIN_TEXT_PX:g} px at a {column_px:g} px column, "
                    f"the smallest {px:.1f} px ({words[:30]!r}); make the figure narrower or its text larger"
                )
    return problems


#: MyST that the build left as text: a fence, a directive or role name, a label (``(name)=``)
_RAW_MYST = re.compile(
    r"(?:`{3,}|~{3,}|:{3,})\s*\{[\w:-]+\}"
    r"|\{(?:glue|glue:text|glue:figure|glue:any|glue:math|numref|ref|doc|cite|cite:p|cite:t|eq|math|term|"
    r"download|abbr|sub|sup|code-cell|table|list-table|figure|admonition|note|tip|warning|important|dropdown|"
    r"margin|sidebar|toggle|bibliography|tableofcontents|index|prf:\w+)\}"
    r"|^\([\w-]+\)=$",
    flags=re.M,
)
_BUILT_MATH = re.compile(r"\\\(.*?\\\)|\\\[.*?\\\]", flags=re.S)  # MathJax's delimiters in the built HTML


def raw_markup(html: str) -> list[str]:
    """MyST left unparsed in a built page: its text holding a fence with a directive, a role or
    directive name in braces, or a target label. Code and outputs (``<pre>``, ``<code>``, where a
    page may show MyST on purpose), scripts, styles and math (between ``\\(`` and ``\\)`` or
    ``\\[`` and ``\\]``, where ``\\pi_{\\text{ref}}`` is LaTeX) are not read. Each finding is
    returned with the text around it."""
    from html.parser import HTMLParser

    class Text(HTMLParser):
        skip = ("pre", "code", "script", "style", "textarea")  # code: syntax shown on purpose

        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.depth, self.parts = 0, []

        def handle_starttag(self, tag, attrs):
            if tag in self.skip:
                self.depth += 1
            elif tag in ("p", "div", "li", "td", "th", "br", "h1", "h2", "h3", "h4", "figcaption", "caption"):
                self.parts.append("\n")

        def handle_endtag(self, tag):
            if tag in self.skip:
                self.depth = max(0, self.depth - 1)

        def handle_data(self, data):
            if not self.depth:
                self.parts.append(data)

    parser = Text()
    parser.feed(html)
    text = _BUILT_MATH.sub(" ", "".join(parser.parts))
    found = []
    for m in _RAW_MYST.finditer(text):
        around = " ".join(text[max(0, m.start() - 40) : m.end() + 60].split())
        found.append(f"{m.group().strip()!r} in: {around}")
    return found


def execute(page: Path, timeout: int = 600):
    """Run a MyST page as the book build does (kernel started in the page's folder)."""
    import nbclient
    from myst_nb.core.read import read_myst_markdown_notebook

    notebook = read_myst_markdown_notebook(page.read_text(encoding="utf-8"))
    client = nbclient.NotebookClient(
        notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(page.parent)}}
    )
    client.execute()
    return notebook


def glue_problems(notebook, page: Path) -> list[str]:
    """Glue keys the prose uses that the executed page never glued, and glued numpy scalars.

    myst-nb formats ``{glue:text}`key:.2f``` from the value's ``text/plain``: numpy 2 writes a
    scalar as ``np.float64(0.5)``, which it cannot read as a number (a warning, so ``-W`` fails
    the build). Glue ``float(x)`` or ``int(x)`` instead."""
    glued: dict[str, str] = {}
    for c in notebook.cells:
        for o in c.get("outputs", []):
            name = o.get("metadata", {}).get("scrapbook", {}).get("name")
            if name is not None:
                glued[name] = str(o.get("data", {}).get("text/plain", ""))
    text = page.read_text(encoding="utf-8")
    used = {m.group(1) for m in re.finditer(r"\{glue(?::\w+)?\}`([^`:]+)", text)}
    used |= {m.group(1) for m in re.finditer(r"```\{glue(?::\w+)?\}\s+(\S+)", text)}
    problems = [f"{page.stem}: glue key {key!r} is used but never glued" for key in sorted(used - set(glued))]
    problems += [
        f"{page.stem}: glue key {key!r} holds a numpy scalar ({glued[key][:40]}): glue float(...) or int(...)"
        for key in sorted(used & set(glued))
        if re.match(r"np\.\w+\(", glued[key])
    ]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m coursekit.booklint", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("pages", nargs="+", type=Path, help="MyST pages, e.g. book/ch01_attention.md")
    parser.add_argument("--numbers", type=Path, default=Path("book/numbers"), help="the allowlist's folder")
    parser.add_argument("--execute", action="store_true", help="run each page and check its figures and glue")
    parser.add_argument("--all", action="store_true", help="also list the numbers that are accounted for")
    args = parser.parse_args(argv)
    problems = number_problems(args.pages, args.numbers)
    notation = args.pages[0].parent / "notation.md"
    if notation.exists():
        problems += notation_problems(args.pages, notation) + unit_problems(args.pages, notation)
    if args.all:
        allowed = allowlist(args.numbers)
        for page in args.pages:
            for n in prose_numbers(page, allowed.get(page.stem, {}))[0]:
                print(f"{n}  [{n.why or 'UNACCOUNTED'}]")
    if args.execute:
        for page in args.pages:
            notebook = execute(page)
            problems += figure_problems(notebook, page.stem) + glue_problems(notebook, page)
    print("\n".join(problems) if problems else "no problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
