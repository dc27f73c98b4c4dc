"""coursekit.diagrams.model: the map of the whole model names real chapters, in the book's order,
and draws the shapes a GPT produces."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless; must precede any pyplot import

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from matplotlib.patches import PathPatch  # noqa: E402

from coursekit.diagrams import model as diagram  # noqa: E402
from coursekit.gpt import GPT, GPT_PRESETS  # noqa: E402
from tests.test_diagrams_attention import arrow_ends_problems, arrows, legibility_problems, letters, texts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def drawn():
    return texts(diagram.model_map())


def toc_chapters() -> list[str]:
    """The numbered chapters' files in the order _toc.yml lists them: ``["book/ch01_attention", ...]``."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files = [entry["file"] for entry in toc["chapters"]]
    return [f for f in files if re.match(r"ch\d\d_", Path(f).name)]


def labels(fig) -> dict[str, str]:
    """What the map writes, by gid: its texts, and the label of what it draws as outlines."""
    found = {gid: t.get_text() for gid, t in texts(fig).items()}
    return found | {p.get_gid(): p.get_label() for p in fig.findobj(PathPatch) if p.get_gid()}


def numbers(label: str) -> list[int]:
    """``"Chapters 1, 2, 10"`` -> ``[1, 2, 10]``."""
    match = re.fullmatch(r"Chapters? (\d+(?:, \d+)*)", label)
    assert match, f"not a chapter label: {label!r}"
    return [int(n) for n in match.group(1).split(", ")]


def test_each_chapter_label_is_the_chapters_place_in_the_table_of_contents(drawn):
    chapters = toc_chapters()
    for k, file in enumerate(chapters, start=1):
        assert Path(file).name.startswith(f"ch{k:02d}_"), f"_toc.yml lists {file} as chapter {k}"
    for stage in diagram.STAGES:
        expected = sorted(chapters.index(f"book/{assignment}") + 1 for assignment in stage.chapters)
        assert numbers(drawn[f"chapters:{stage.name}"].get_text()) == expected, stage.name


def test_every_chapter_has_its_place_on_the_map(drawn):
    labelled = {n for gid, t in drawn.items() if gid.startswith("chapters:") for n in numbers(t.get_text())}
    assert labelled == set(range(1, len(toc_chapters()) + 1))


def test_a_label_cannot_name_a_chapter_that_does_not_exist():
    with pytest.raises(ValueError, match="not a numbered chapter"):
        diagram.chapter_label(("ch11_retrieval",))
    with pytest.raises(ValueError, match="not a numbered chapter"):
        diagram.chapter_number("appendix_arithmetic")
    assert diagram.chapter_label(("ch10_long_context", "ch02_multihead")) == "Chapters 2, 10"
    assert diagram.chapter_label(("ch04_layers",)) == "Chapter 4"


@pytest.mark.parametrize("B, T", [(2, 5), (3, 7)])
def test_the_shapes_are_those_of_a_gpt(B, T):
    cfg = GPT_PRESETS["nano"]
    model = GPT(cfg).eval()
    idx = torch.randint(cfg.vocab_size, (B, T))  # (B, T)
    with torch.no_grad():
        embedded = model.tok_emb(idx) + model.pos_emb(torch.arange(T))  # (B, T, C)
        x = embedded
        for block in model.blocks:
            x = block(x)
        logits = model(idx)
    expected = {"tokens": idx.shape, "embedded": embedded.shape, "layers": x.shape, "logits": logits.shape}
    assert diagram.model_shapes(B, T) == {name: tuple(shape) for name, shape in expected.items()}
    if (B, T) == (2, 5):  # the sizes the map is drawn with
        sizes = {"B": B, "T": T, "C": cfg.d_model, r"|\mathcal{V}|": cfg.vocab_size}
        drawn = labels(diagram.model_map())
        for name, shape in expected.items():
            assert drawn[f"tensor:{name}"] == letters(shape, sizes), name
        assert drawn["tensor:logits"] == r"$(B, T, |\mathcal{V}|)$"


def test_the_arrows_follow_the_model_from_tokens_to_outputs():
    fig = diagram.model_map()
    order = ["tokens", "embedding", "attention", "add_norm1", "cross", "feed_forward", "add_norm2", "head"]
    flows = {f"flow:{a}->{b}" for a, b in zip(order, order[1:])} | {
        "flow:head->next_token",
        "flow:head->class",
    }
    residuals = {"residual:attention->add_norm1", "residual:feed_forward->add_norm2"}
    assert set(arrows(fig)) == flows | residuals
    assert arrow_ends_problems(fig) == []
    assert texts(fig)["layer:count"].get_text() == r"$L\,\times$"  # L is the number of layers


def test_the_map_is_legible_at_the_book_column():
    fig = diagram.model_map()
    assert legibility_problems(fig) == []
    (outlined,) = [p for p in fig.findobj(PathPatch) if p.get_gid() == "tensor:logits"]
    renderer = fig.canvas.get_renderer()
    box = outlined.get_window_extent(renderer)
    assert 11 / 72 * 0.6 * fig.dpi <= box.height <= 11 / 72 * 1.6 * fig.dpi  # a line of 11 pt text
    assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1)
    assert not any(box.overlaps(t.get_window_extent(renderer)) for t in texts(fig).values())


def figure_cells(page: Path) -> dict[str, dict]:
    """The page's code cells that draw a diagram (by the function they call) -> their mystnb options."""
    from myst_nb.core.read import read_myst_markdown_notebook

    notebook = read_myst_markdown_notebook(page.read_text(encoding="utf-8"))
    found = {}
    for index, cell in enumerate(notebook.cells):
        for call in re.findall(r"(\w+)\(\)", cell.source) if cell.cell_type == "code" else []:
            found[call] = {"index": index, **cell.metadata.get("mystnb", {})}
    return found


def test_the_pages_show_the_diagrams_where_the_book_points_to_them():
    intro = figure_cells(ROOT / "book" / "intro.md")["model_map"]
    assert intro["figure"]["name"] == "fig-model-map"  # chapters point back with {numref}`fig-model-map`
    assert intro["figure"]["caption"].strip() and intro["image"]["alt"].strip()
    page = ROOT / "book" / "ch01_attention.md"
    flow = figure_cells(page)["qkv_flow"]
    assert flow["figure"]["caption"].strip() and flow["image"]["alt"].strip()
    text = page.read_text(encoding="utf-8")
    assert text.index("qkv_flow()") < text.index("$$"), "the Q/K/V diagram must come before the formulas"
