"""The book's prose and figure checks (coursekit.booklint), and the book held to them.

The checks are tested on small pages made here, each with the one thing that must be caught;
then every page of the book must pass the prose checks. The figure checks run on the executed
notebooks of the book build in tests/test_book.py.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import nbformat
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from coursekit import booklint, viz  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
PAGES = sorted(BOOK.glob("*.md"))

PAGE = """---
jupytext:
  text_representation: {extension: .md}
---
# A page

The loss is {glue:text}`loss:.2f` after 300 steps, which is below $T = 64$ and `n = 12`.
Chapter 3 and GPT-2 in float32 on an H100 say nothing; a 2x2 patch does.
{cite:t}`vaswani2017attention` use 8 heads. The 80/20 split is one run.

1. A numbered list's markers
2. are not numbers.

| column | 17 |
|---|---|

```{code-cell} ipython3
---
mystnb:
  figure:
    caption: |
      The curve falls to 0.37 in the end.
  image:
    alt: A falling curve.
---
x = 99
```

$$
y = 42 x
$$

```{note}
A note's body is prose: 23 counts.
```

:::{table} A table's caption is prose too: 31 counts.
:name: tab-one

| a | b |
|---|---|
:::

```{figure} figures/curve.svg
:alt: A curve.

A figure's caption: 47 counts.
```

The text after the directives is still read: 53 counts.
"""


def numbers(tmp_path, text=PAGE, allowed=None):
    page = tmp_path / "page.md"
    page.write_text(text)
    folder = tmp_path / "numbers"
    folder.mkdir(exist_ok=True)
    if allowed is not None:
        (folder / "page.toml").write_text(allowed)
    return booklint.number_problems([page], folder)


def flagged(problems):
    return sorted(p.split("'")[1] for p in problems if "' in:" in p)


def test_numbers_in_prose_must_be_glued_cited_or_allowed(tmp_path):
    # glued, math, inline code, "Chapter 3", names (GPT-2, float32, H100), the cited sentence's 8 and
    # the code cell's 99 and the display math's 42 pass; the rest are reported, captions included
    # (a code cell's, a table's and a figure's), and the prose after a closed directive
    assert flagged(numbers(tmp_path)) == ["0.37", "17", "20", "23", "2x2", "300", "31", "47", "53", "80"]


def test_an_allowlist_entry_accounts_for_its_number_and_a_stale_one_is_reported(tmp_path):
    problems = numbers(
        tmp_path,
        allowed='"after 300 steps" = "the run length, set by hand"\n"999 bottles" = "gone from the page"\n',
    )
    assert "300" not in flagged(problems)
    assert any("'999 bottles' matches no number" in p for p in problems)


def test_an_allowlist_entry_needs_a_reason(tmp_path):
    with pytest.raises(ValueError, match="reason"):
        numbers(tmp_path, allowed='"after 300 steps" = ""\n')


def test_glue_keys_must_be_glued_and_hold_plain_numbers(tmp_path):
    """A key the prose uses and the run never glued, and a numpy scalar myst-nb cannot format."""

    def glued(name, plain):
        return nbformat.v4.new_output(
            "display_data", data={"text/plain": plain}, metadata={"scrapbook": {"name": name}}
        )

    cell = nbformat.v4.new_code_cell("glue(...)")
    cell.outputs = [glued("share", "np.float64(0.25)"), glued("count", "12"), glued("unused", "np.int64(3)")]
    notebook = nbformat.v4.new_notebook(cells=[cell])
    page = tmp_path / "page.md"
    page.write_text("A {glue:text}`share:.1%` share of {glue:text}`count` and {glue:text}`missing:.2f`.\n")
    problems = booklint.glue_problems(notebook, page)
    assert len(problems) == 2
    assert "'missing' is used but never glued" in problems[0]
    assert "'share' holds a numpy scalar (np.float64(0.25))" in problems[1]


def test_retired_notation_is_found_in_math_but_not_in_code(tmp_path):
    notation = tmp_path / "notation.md"
    notation.write_text(
        "(notation-retired)=\n## Retired\n\n| Not | Instead |\n|---|---|\n"
        "| `L_{\\max}` | $T_{\\max}$ |\n| `VC` | $\\lvert\\mathcal{V}\\rvert C$ |\n"
        "| `\\|V\\|` | $\\lvert\\mathcal{V}\\rvert$ (a pipe in a table's cell is written \\|) |\n"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "It costs $L_{\\max} \\times C$, and $N = 12LC^2 + V C$.\n\n"
        "```{code-cell} ipython3\nL_{\\max} = VC\n```\n\n`L_{\\max}` in code is fine; so is $\\text{DVC}$.\n"
        "A vocabulary of $|V|$ tokens.\n"
    )
    problems = booklint.notation_problems([page, notation], notation)
    assert len(problems) == 2, problems
    assert "L_{\\\\max}" in problems[0] and problems[0].startswith("page:1")
    assert "'|V|'" in problems[1] and problems[1].startswith("page:8")


def svg_of(fig) -> str:
    from io import StringIO

    out = StringIO()
    fig.savefig(out, format="svg")
    plt.close(fig)
    return out.getvalue()


def notebook_with(
    svg: str | None,
    caption="What to see: the loss falls and then flattens out.",
    alt="A line that falls steeply and then flattens to the right.",
    png=False,
):
    cell = nbformat.v4.new_code_cell("plot()")
    data = {"image/png": "iVBORw0KGgo="} if png else {"image/svg+xml": svg}
    cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
    cell.metadata["mystnb"] = {"figure": {"caption": caption}, "image": {"alt": alt}}
    return nbformat.v4.new_notebook(cells=[cell])


@pytest.fixture
def book_style():
    with plt.style.context(viz.BOOK_STYLE):
        yield


def test_a_figure_in_the_book_style_passes(book_style):
    fig, ax = plt.subplots()
    ax.plot([3, 2, 1])
    ax.set_xlabel("step")
    assert booklint.figure_problems(notebook_with(svg_of(fig)), "p") == []


def test_small_text_on_a_phone_is_reported_with_its_size(book_style):
    fig, ax = plt.subplots(figsize=(11, 3))  # twice the column: labels shrink to half on a phone
    ax.plot([3, 2, 1])
    (problem,) = booklint.figure_problems(notebook_with(svg_of(fig)), "p")
    assert "under 9 px" in problem and "make the figure narrower" in problem


def test_a_missing_caption_alt_text_or_a_raster_figure_is_reported(book_style):
    fig, _ = plt.subplots()
    svg = svg_of(fig)
    assert "caption" in booklint.figure_problems(notebook_with(svg, caption=""), "p")[0]
    assert "alt text" in booklint.figure_problems(notebook_with(svg, alt="output_3_0.png"), "p")[0]
    assert "raster" in booklint.figure_problems(notebook_with(None, png=True), "p")[0]


def test_svg_text_sizes_reads_each_label_at_its_largest_font(book_style):
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set_xlabel(r"time $T^2$", fontsize=11)
    ax.set_title("title", fontsize=15)
    width, sizes = booklint.svg_text_sizes(svg_of(fig))
    assert width == pytest.approx(4 * 72)
    assert dict((w, s) for s, w in sizes)["title"] == pytest.approx(15)
    assert max(s for s, w in sizes if "time" in w) == pytest.approx(
        11
    )  # the exponent is smaller; the label is not


def test_svg_text_sizes_reads_text_kept_as_text_too(book_style):
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set_xlabel(r"time $T^2$", fontsize=13)
    with plt.rc_context({"svg.fonttype": "none"}):
        width, sizes = booklint.svg_text_sizes(svg_of(fig))
    assert max(s for s, w in sizes if "time" in w) == pytest.approx(13)


def test_every_page_accounts_for_the_numbers_in_its_prose():
    problems = booklint.number_problems(PAGES, BOOK / "numbers")
    assert not problems, f"{len(problems)} numbers in prose are not accounted for:\n" + "\n".join(
        problems[:40]
    )


def test_every_page_follows_the_notation_page():
    problems = booklint.notation_problems(PAGES, BOOK / "notation.md")
    assert not problems, "\n".join(problems)


UNITS_PAGE = """# Sizes

```{code-cell} ipython3
n = 3 * 2**30
print(f"{n / 2**30:.1f} GiB, {n / 1e9:.1f} GB, {n / 2**20:,.0f} MB")
print(f"{n / 1e9:.1f} GiB")
per_head = n / 2**20  # MB
fine = n / 1e6  # MB
print(f"{n / 2**30:.1f} GiB is {2**30 / 1e9 - 1:.1%} more than a GB")
```

```{code-cell} ipython3
ax.axhline(80, label="80 GB GPU")
ax.set_ylabel("memory (GiB)")
```

```{code-cell} ipython3
H200_GB = 141  # in GB, as the data sheet says
print(f"{n / 2**30:.1f} GiB")
ax.set(xlabel=f"GiB for {n / 1e9:.0f}B parameters")
```
"""


def test_sizes_are_labelled_with_the_prefix_of_their_divisor(tmp_path):
    """A value divided by 2**20 printed as MB, one divided by 1e9 printed as GiB, a comment that
    says MB after a division by 2**20, and a figure whose line says GB on a GiB axis are reported;
    the right labels, a string that compares both units, a printout that mixes them outside a
    figure and a count of billions on a GiB axis are not. The notation page must define both."""
    page = tmp_path / "page.md"
    page.write_text(UNITS_PAGE)
    notation = tmp_path / "notation.md"
    notation.write_text("A **GB** is 10^9 bytes, a **GiB** 2^30.\n")
    problems = booklint.unit_problems([page], notation)
    assert [p.split(": ")[0] for p in problems] == ["page:5", "page:6", "page:7", "page:13"], problems
    assert "power of two is labelled MB" in problems[0]
    assert "power of ten is labelled GiB" in problems[1]
    assert "one figure labels sizes in GB or MB (line 13) and in GiB or MiB (line 14)" in problems[3]
    notation.write_text("Sizes are in bytes.\n")
    assert sum("does not define" in p for p in booklint.unit_problems([page], notation)) == 2


def test_every_page_labels_sizes_as_the_notation_page_defines_them():
    assert booklint.unit_problems(PAGES, BOOK / "notation.md") == []


def test_myst_left_unparsed_in_a_built_page_is_found():
    """A fence whose caption holds a role (not parsed: the page prints it), a role the build did
    not know, a target label printed as text; code, outputs and scripts may hold them."""
    html = (
        "<html><body><p>```{table} Wrong translations (seeds <code class='literal'>{glue:text}</code>)</p>"
        "<p>The loss is {glue:text}<code>loss:.2f</code>.</p><p>(sec-heads)=</p>"
        "<pre>```{code-cell} ipython3\nx = {1, 2}\n```</pre><script>var s = '{ref}';</script>"
        "<p>A set {1, 2} and a dict {'a': 1} are not MyST; nor is {dim}.</p></body></html>"
    )
    found = booklint.raw_markup(html)
    assert [f.split(" in: ")[0] for f in found] == ["'```{table}'", "'{glue:text}'", "'(sec-heads)='"]
    shown = "<p>Link a term with <code>{term}`KV cache`</code>; {x} and ``code``.</p><pre>:::{note}</pre>"
    assert booklint.raw_markup(shown) == []  # MyST shown on purpose, in code
    math = r'<p>The <span class="math">\(\pi_{\text{ref}}\)</span>.</p><div class="math">\[x_{\text{ref}}\]</div>'
    assert booklint.raw_markup(math) == []  # LaTeX, not a role
    assert [f.split(" in: ")[0] for f in booklint.raw_markup(math + "<p>see {ref}</p>")] == ["'{ref}'"]
