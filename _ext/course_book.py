"""Sphinx extension for the course book, loaded by `_config.yml` (`sphinx.local_extensions`).

Seven things Jupyter Book 1 does not do by configuration alone:

1. **Launch buttons only with a real repository.** `launch_buttons` in `_config.yml` names Binder
   and Colab, but a launch link needs the public repository (`repository.url`). Without one,
   Jupyter Book falls back to its own default (github.com/executablebooks/jupyter-book, so the
   buttons would open the wrong repository), and an empty `url: ""` makes sphinx-book-theme
   crash. While `repository.url` is empty (or that default), the launch providers are dropped and
   the build says so; set the URL and the buttons appear.
2. **Colab opens .ipynb files only.** Every page is a MyST Markdown notebook (`.md`), which Colab
   cannot open (jupyter-book/jupyter-book#752); Binder opens it as a notebook through jupytext.
   So the Colab button is kept only on pages whose source is an `.ipynb`.
3. **Author-year citations in round brackets.** `{cite:t}` gives "Vaswani et al. (2017)",
   `{cite:p}` "(Vaswani et al., 2017)" (sphinxcontrib-bibtex's `author_year` uses square ones),
   and the bibliography is labelled and sorted the same way ("Vaswani et al., 2017") rather than
   with alpha codes such as "[VSP+17]" that the text never uses.
4. **The page as a notebook, and a stylesheet.** The download menu of every executed page offers
   its `.md` source and the executed `.ipynb` (sphinx-book-theme adds the latter only when launch
   buttons are on); `static/course.css` keeps pages within a phone's width. The stylesheet lives
   here rather than in a root `_static/`, from which Jupyter Book would load every `.js` file.
5. **Two editions from one source.** The environment variable `COURSEKIT_EDITION` picks the
   edition: `student` (the default, what `make book` builds) or `instructor` (`make
   book-instructor`). In the student edition a `literalinclude` of a graded definition (one whose
   body a student writes in an exercise, recognised by its syntax tree: `coursekit/graded.py`)
   shows its contract, the signature and docstring, with the body replaced by a line naming the
   exercise part; the instructor edition shows the code as it is.
6. **Glue stays backstage.** A page puts a number its code computed into its prose with
   `glue(...)`; the page shows its code cells without those calls (a cell that only glues shows no
   code), while the executed notebook offered for download keeps them.
7. **Named toggles in the sidebar.** The theme's buttons that show or hide a page's sections have
   no name for a screen reader; each gets one (:func:`name_toggles`).
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pybtex.plugin
import sphinxcontrib.bibtex.plugin
from docutils import nodes
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from sphinx.application import Sphinx
from sphinx.directives.code import LiteralInclude
from sphinx.errors import ConfigError
from sphinx.util import logging
from sphinxcontrib.bibtex.style.referencing import BracketStyle
from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle

logger = logging.getLogger(__name__)

#: what Jupyter Book 1 puts in `repository.url` when `_config.yml` does not set it
JUPYTER_BOOK_DEFAULT_URL = "https://github.com/executablebooks/jupyter-book"
#: launch providers that need the repository URL
PROVIDERS = ("binderhub_url", "jupyterhub_url", "colab_url", "deepnote_url", "thebe")
STATIC = Path(__file__).parent / "static"
EDITIONS = ("student", "instructor")


def edition() -> str:
    """The edition being built, from ``COURSEKIT_EDITION`` (default ``student``)."""
    name = os.environ.get("COURSEKIT_EDITION", "student").strip() or "student"
    if name not in EDITIONS:
        raise ConfigError(f"COURSEKIT_EDITION must be one of {', '.join(EDITIONS)}, got {name!r}")
    return name


class ContractInclude(LiteralInclude):
    """``literalinclude`` that, in the student edition, shows a graded definition's contract only."""

    def run(self) -> list[nodes.Node]:
        dotted = self.options.get("pyobject")
        if not dotted or self.config.course_edition != "student":
            return super().run()
        from coursekit import graded

        _, path = self.env.relfn2path(self.arguments[0])
        source = Path(path).read_text(encoding="utf-8")
        where = graded.graded(source, dotted)
        if where is None:
            return super().run()
        self.env.note_dependency(path)
        text = graded.contract(source, dotted, where.where())
        block = nodes.literal_block(text, text, language=self.options.get("language", "python"))
        self.set_source_info(block)
        noted = self.env.temp_data.setdefault("graded_notes", set())  # this page's: one note each
        if where.name in noted:
            return [block]
        noted.add(where.name)
        note = nodes.paragraph(
            "",
            "",
            nodes.emphasis(
                "",
                f"The body of {where.name} is yours to write: {where.where()}. "
                "The instructor edition of the book shows it.",
            ),
        )
        note["classes"].append("graded-contract")
        return [block, note]


def repository_url(theme_options: dict) -> str:
    """The repository URL the book is published from, or "" if there is none yet."""
    url = (theme_options.get("repository_url") or "").strip()
    return "" if url.rstrip("/") == JUPYTER_BOOK_DEFAULT_URL else url


def launch_providers_without_repository(app: Sphinx, config) -> None:
    """Drop the launch providers (and Jupyter Book's default URL) while no repository is set."""
    options = config.html_theme_options
    options["use_download_button"] = True
    if repository_url(options):
        return
    launch = dict(options.get("launch_buttons") or {})
    dropped = [key for key in PROVIDERS if launch.pop(key, None)]
    options["launch_buttons"] = launch
    options["repository_url"] = ""
    if dropped:
        logger.info(
            "[course_book] no launch buttons (%s): set repository.url in _config.yml to the "
            "public repository to show them",
            ", ".join(dropped),
        )


def executed_notebook_download(app: Sphinx, pagename, templatename, context, doctree) -> None:
    """Offer the executed notebook of every notebook page in the download menu."""
    if "kernelspec" not in app.env.metadata.get(pagename, {}) or context.get("ipynb_source"):
        return
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not executed.is_file():
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(executed, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


def no_colab_for_markdown(app: Sphinx, pagename, templatename, context, doctree) -> None:
    """Remove the Colab launch link from pages whose source Colab cannot open."""
    if context.get("page_source_suffix") == ".ipynb":
        return
    for group in context.get("header_buttons", []):
        if group.get("label") == "launch-buttons":
            group["buttons"] = [b for b in group["buttons"] if b.get("text") != "Colab"]
    context["header_buttons"] = [
        g for g in context.get("header_buttons", []) if g.get("label") != "launch-buttons" or g["buttons"]
    ]


def _round() -> BracketStyle:
    return BracketStyle(left="(", right=")")


@dataclass
class RoundAuthorYear(AuthorYearReferenceStyle):
    """`bibtex_reference_style = "author_year_round"`: author-year citations in round brackets."""

    bracket_textual: BracketStyle = field(default_factory=_round)
    bracket_parenthetical: BracketStyle = field(default_factory=_round)
    bracket_author: BracketStyle = field(default_factory=_round)
    bracket_label: BracketStyle = field(default_factory=_round)
    bracket_year: BracketStyle = field(default_factory=_round)


class AuthorYearLabels(BaseLabelStyle):
    """Bibliography labels as the text cites: "Gage, 1994", "Press and Wolf, 2017", "Vaswani et al., 2017"."""

    def format_labels(self, sorted_entries):
        labels = [self.format_label(entry) for entry in sorted_entries]
        seen, counts = Counter(), Counter(labels)
        for label in labels:  # two papers with the same label get "2018a", "2018b"
            seen[label] += 1
            yield label + "abcdefghij"[seen[label] - 1] if counts[label] > 1 else label

    @staticmethod
    def format_label(entry) -> str:
        persons = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [Text.from_latex(" ".join(p.prelast_names + p.last_names)).render_as("text") for p in persons]
        year = entry.fields.get("year", "n.d.")
        if len(names) > 2 or (len(names) == 2 and names[1] == "others"):
            return f"{names[0]} et al., {year}"
        return f"{' and '.join(names) or entry.key}, {year}"


class AuthorYearStyle(UnsrtStyle):
    """`bibtex_default_style = "course"`: unsrt entries, labelled and sorted by author and year."""

    default_label_style = "course-author-year"
    default_sorting_style = "author_year_title"


def without_glue(source: str) -> str | None:
    """A code cell's source as the page shows it: without its ``glue(...)`` calls, at any depth,
    the loops that only glue (with the names they compute for the glue calls alone), and the
    import of ``glue``: the page's bookkeeping, which puts computed numbers into the prose.
    ``None`` if the source cannot be parsed (then it is shown as it is); ``""`` if nothing is left."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None

    def glue_call(stmt) -> bool:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "glue"

    glue_calls = [node for node in ast.walk(tree) if isinstance(node, ast.stmt) and glue_call(node)]
    inside_glue = {id(n) for call in glue_calls for n in ast.walk(call)}
    # names read somewhere other than inside a glue(...) call: computing them is not bookkeeping
    read_elsewhere = {
        n.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in inside_glue
    }

    def bookkeeping(stmt) -> bool:
        """A ``glue(...)`` call, or a loop whose body only glues and names values for the glue."""
        if glue_call(stmt):
            return True
        if isinstance(stmt, ast.Assign):
            targets = [t for target in stmt.targets for t in ast.walk(target) if isinstance(t, ast.Name)]
            return bool(targets) and not {t.id for t in targets} & read_elsewhere
        return (
            isinstance(stmt, ast.For)
            and not stmt.orelse
            and any(glue_call(s) or isinstance(s, ast.For) for s in stmt.body)
            and all(bookkeeping(s) for s in stmt.body)
        )

    drop: set[int] = set()

    def prune(body) -> None:
        """Drop the bookkeeping of one block and of the blocks inside it, never emptying a block."""
        kept = [
            stmt
            for stmt in body
            if not (glue_call(stmt) or (isinstance(stmt, ast.For) and bookkeeping(stmt)))
        ]
        if body is not tree.body and not kept:
            return
        for stmt in body:
            if stmt not in kept:
                drop.update(range(stmt.lineno, stmt.end_lineno + 1))
        for stmt in kept:
            for attr in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, attr, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    prune(inner)
            for handler in getattr(stmt, "handlers", []):
                prune(handler.body)

    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and [a.name for a in stmt.names] == ["glue"]:
            drop.update(range(stmt.lineno, stmt.end_lineno + 1))
    prune(tree.body)
    if not drop:
        return source
    lines = [line for n, line in enumerate(source.splitlines(), start=1) if n not in drop]
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def hide_glue(app: Sphinx, doctree: nodes.document) -> None:
    """Show code cells without their ``glue(...)`` calls; a cell that only glues shows no code
    (its outputs, if any, stay). The executed notebook offered for download keeps them."""
    for block in list(doctree.findall(nodes.literal_block)):
        cell_input = block.parent
        if not (isinstance(cell_input, nodes.container) and "cell_input" in cell_input.get("classes", [])):
            continue
        shown = without_glue(block.astext())
        if shown is None or shown == block.astext():
            continue
        if shown:
            block.children = [nodes.Text(shown)]
            block.rawsource = shown
        else:
            cell_input.parent.remove(cell_input)


def accessible_citation(self, node) -> None:
    """docutils writes each bibliography entry as ``role="doc-biblioentry"`` in a ``role="list"``
    box; ARIA 1.3 retires that role, so axe-core sees a list whose children are not list items
    (a critical violation of WCAG 1.3.1). The entry is written as a ``listitem`` instead."""
    if not isinstance(node.previous_sibling(), type(node)):
        self.body.append('<div role="list" class="citation-list">\n')
    self.body.append(self.starttag(node, "div", classes=[node.tagname], role="listitem"))


def use_accessible_citations(app: Sphinx) -> None:
    translator = app.builder.get_translator_class() if hasattr(app, "builder") else None
    if translator is not None:
        translator.visit_citation = accessible_citation


def name_toggles(toctree):
    """The sidebar's contents with a name for each button that shows or hides a page's sections.

    pydata-sphinx-theme writes such a button as a ``<summary>`` holding only a decorative chevron, so
    a screen reader announces a button without a name (axe-core's ``summary-name``, serious). Each
    gets an ``aria-label`` naming the page whose sections it shows. ``toctree``: HTML text, or the
    theme's BeautifulSoup (labelled in place: the theme caches it, and labelling twice changes nothing)."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(toctree, "html.parser") if isinstance(toctree, str) else toctree
    for summary in soup.select("li.has-children > details > summary"):
        if summary.get_text(strip=True) or summary.get("aria-label"):
            continue  # a section heading's summary holds its text
        link = summary.parent.parent.find("a", recursive=False)
        title = link.get_text(" ", strip=True) if link else ""
        summary["aria-label"] = (
            f"Show or hide the sections of {title}" if title else "Show or hide the sections"
        )
    return str(soup) if isinstance(toctree, str) else soup


def named_toggles(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Wrap the theme's ``generate_toctree_html`` (set on the page's context at the default priority)
    so that the sidebar it writes names its toggles (:func:`name_toggles`)."""
    generate = context.get("generate_toctree_html")
    if generate is None or getattr(generate, "names_toggles", False):
        return

    def generate_named(*args, **kwargs):
        return name_toggles(generate(*args, **kwargs))

    generate_named.names_toggles = True
    context["generate_toctree_html"] = generate_named


def add_static_path(app: Sphinx) -> None:
    app.config.html_static_path.append(str(STATIC))


def setup(app: Sphinx) -> dict:
    app.add_config_value("course_edition", edition(), "env")
    app.add_directive("literalinclude", ContractInclude, override=True)
    sphinxcontrib.bibtex.plugin.register_plugin(
        "sphinxcontrib.bibtex.style.referencing", "author_year_round", RoundAuthorYear
    )
    pybtex.plugin.register_plugin("pybtex.style.labels", "course-author-year", AuthorYearLabels)
    pybtex.plugin.register_plugin("pybtex.style.formatting", "course", AuthorYearStyle)
    app.connect("config-inited", launch_providers_without_repository)
    app.connect("builder-inited", add_static_path)
    app.connect("builder-inited", use_accessible_citations)
    app.connect("doctree-read", hide_glue)
    app.add_css_file("course.css")
    # sphinx-book-theme builds its header buttons at priority 501: copy the notebook before,
    # prune the launch menu after
    app.connect("html-page-context", executed_notebook_download, priority=500)
    app.connect("html-page-context", no_colab_for_markdown, priority=502)
    app.connect("html-page-context", named_toggles, priority=510)  # after the theme sets the function
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
