"""coursekit.diagrams.attention: Chapter 1's Q/K/V diagram draws the shapes attention returns, legibly."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # headless; must precede any pyplot import

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Patch  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from coursekit.attention import scaled_dot_product_attention  # noqa: E402
from coursekit.diagrams import attention as diagram  # noqa: E402

#: the book's column and its smallest text (coursekit/book.mplstyle)
MAX_WIDTH_IN, MIN_FONT_PT = 5.5, 11.0
#: how far (inches) an arrow's end may sit from the edge of the box it names
EDGE_IN = 0.02


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def texts(fig) -> dict[str, Text]:
    """Every text with a gid, by gid."""
    return {t.get_gid(): t for t in fig.findobj(Text) if t.get_gid() and t.get_text().strip()}


def boxes(fig) -> dict[str, Patch]:
    return {p.get_gid(): p for p in fig.findobj(Patch) if p.get_gid() and not isinstance(p, FancyArrowPatch)}


def arrows(fig) -> dict[str, FancyArrowPatch]:
    return {p.get_gid(): p for p in fig.findobj(FancyArrowPatch)}


def legibility_problems(fig) -> list[str]:
    """What would make a hand-placed diagram hard to read: too wide, small text, text that leaves
    the figure or its box, or two texts on top of each other."""
    problems = []
    width = fig.get_size_inches()[0]
    if width > MAX_WIDTH_IN:
        problems.append(f"figure {width} in wide, more than {MAX_WIDTH_IN}")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    drawn = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    extent = {id(t): t.get_window_extent(renderer) for t in drawn}
    shapes = boxes(fig)
    for t in drawn:
        box = extent[id(t)]
        if t.get_fontsize() < MIN_FONT_PT:
            problems.append(f"{t.get_text()!r} is {t.get_fontsize():g} pt")
        if not page.contains(box.x0, box.y0) or not page.contains(box.x1, box.y1):
            problems.append(f"{t.get_text()!r} leaves the figure")
        gid = t.get_gid() or ""
        owner = shapes.get(gid.split(":", 1)[1]) if gid.startswith(("label:", "shape:")) else None
        if owner is not None:
            inside = owner.get_window_extent(renderer)
            if not (
                inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1
            ):
                problems.append(f"{t.get_text()!r} sticks out of its box {owner.get_gid()!r}")
    for i, a in enumerate(drawn):
        for b in drawn[i + 1 :]:
            if extent[id(a)].overlaps(extent[id(b)]):
                problems.append(f"{a.get_text()!r} overlaps {b.get_text()!r}")
    return problems


def arrow_ends_problems(fig) -> list[str]:
    """Each arrow ``flow:A->B`` must start on box A and end on box B (within EDGE_IN).

    The diagrams draw in inches (one data unit per inch), so positions and boxes compare directly.
    """
    shapes = boxes(fig)
    problems = []
    for gid, arrow in arrows(fig).items():
        if not gid.startswith("flow:"):
            continue
        source, target = gid.removeprefix("flow:").split("->")
        ends = arrow._posA_posB  # the start and the tip, as drawn (matplotlib keeps no public getter)
        for name, (x, y) in ((source, ends[0]), (target, ends[1])):
            box = shapes[name]
            x0, y0 = box.get_x(), box.get_y()
            x1, y1 = x0 + box.get_width(), y0 + box.get_height()
            inside = x0 - EDGE_IN <= x <= x1 + EDGE_IN and y0 - EDGE_IN <= y <= y1 + EDGE_IN
            on_edge = min(abs(x - x0), abs(x - x1), abs(y - y0), abs(y - y1)) <= EDGE_IN
            if not (inside and on_edge):
                problems.append(f"{gid}: an end at ({x:.2f}, {y:.2f}) in is not on the edge of box {name!r}")
    return problems


def letters(shape, sizes: dict[str, int]) -> str:
    """Written here again, not taken from the module: (3, 4) with T=3, D=4 -> '$(T, D)$'."""
    by_size = {n: k for k, n in sizes.items()}
    return "$(" + ", ".join(by_size[n] for n in shape) + ")$"


@pytest.mark.parametrize("T, S, C, D", [(3, 5, 7, 4), (6, 2, 9, 5), (11, 13, 8, 16)])
def test_shape_labels_equal_the_shapes_attention_returns(T, S, C, D):
    x, source = torch.randn(T, C), torch.randn(S, C)  # (T, C), (S, C)
    w_q, w_k, w_v = torch.randn(C, D), torch.randn(C, D), torch.randn(C, D)  # each (C, D)
    q, k, v = x @ w_q, source @ w_k, source @ w_v
    mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)  # (T, S), bottom-right causal, any T and S
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    sizes = {"T": T, "S": S, "C": C, "D": D}
    expected = {
        "X": x.shape,
        "source": source.shape,
        "W_Q": w_q.shape,
        "W_K": w_k.shape,
        "W_V": w_v.shape,
        "Q": q.shape,
        "K": k.shape,
        "V": v.shape,
        "scores": weights.shape,
        "mask": mask.shape,
        "weights": weights.shape,
        "output": out.shape,
    }
    drawn = texts(diagram.qkv_flow(T, S, C, D))
    assert {name: drawn[f"shape:{name}"].get_text() for name in expected} == {
        name: letters(shape, sizes) for name, shape in expected.items()
    }
    # the notation the chapter's prose uses
    assert drawn["shape:Q"].get_text() == "$(T, D)$" and drawn["shape:K"].get_text() == "$(S, D)$"
    assert drawn["shape:weights"].get_text() == "$(T, S)$" and drawn["shape:output"].get_text() == "$(T, D)$"


def test_the_labels_follow_the_code(monkeypatch):
    """Were attention to return its weights transposed, the diagram would draw (S, T): it reads the code."""

    def transposed(q, k, v, mask=None, scale=None):
        out, weights = scaled_dot_product_attention(q, k, v, mask, scale)
        return out, weights.transpose(-2, -1)

    monkeypatch.setattr(diagram, "scaled_dot_product_attention", transposed)
    assert texts(diagram.qkv_flow())["shape:weights"].get_text() == "$(S, T)$"


def test_sizes_that_coincide_are_refused():
    with pytest.raises(ValueError, match="its own size"):
        diagram.qkv_flow(T=4, S=4, C=7, D=5)  # T = S: a 4 could not be read back as T or S
    with pytest.raises(ValueError, match="no letter has size 9"):
        diagram.symbolic((3, 9), {"T": 3, "D": 4})


def test_the_flow_runs_from_projections_through_scores_mask_and_softmax_to_the_output():
    fig = diagram.qkv_flow()
    drawn = set(arrows(fig))
    expected = {
        "flow:X->W_Q",
        "flow:source->W_K",
        "flow:source->W_V",
        "flow:W_Q->Q",
        "flow:W_K->K",
        "flow:W_V->V",
        "flow:Q->scores",
        "flow:K->scores",
        "flow:scores->mask",
        "flow:mask->weights",
        "flow:weights->output",
        "flow:V->output",
    }
    assert drawn == expected  # in particular, the values never enter the scores
    assert arrow_ends_problems(fig) == []


def test_the_diagram_is_legible_at_the_book_column():
    assert legibility_problems(diagram.qkv_flow()) == []


def test_the_legibility_check_catches_small_overflowing_text():
    fig = diagram.qkv_flow()
    texts(fig)["label:mask"].set_fontsize(8)
    texts(fig)["label:weights"].set_text("softmax over keys, written out at far too great a length")
    problems = legibility_problems(fig)
    assert any("8 pt" in p for p in problems)
    assert any("sticks out of its box 'weights'" in p for p in problems)


def test_the_arrow_check_catches_an_arrow_that_misses_its_box():
    fig = diagram.qkv_flow()
    arrow = arrows(fig)["flow:K->scores"]
    arrow.set_positions(arrow._posA_posB[0], (5.0, 1.0))  # now ends beside the values' column
    assert arrow_ends_problems(fig) == [
        "flow:K->scores: an end at (5.00, 1.00) in is not on the edge of box 'scores'"
    ]
