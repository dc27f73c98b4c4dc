r"""The book's map of the whole model, each part labelled with the chapter that builds it.

The map runs top to bottom: tokens, their embedding plus positions, ``L`` layers of
attention, add & norm, (in a decoder of an encoder-decoder, cross-attention), feed-forward and
add & norm, then the output head and what it predicts. Each stage names the chapters that build
it by their assignment (``"ch04_layers"``), and :func:`chapter_number` numbers them from
:data:`coursekit.chapters.CHAPTERS`, the course's one table of chapters, so a label cannot name a
chapter that does not exist. The shapes written beside the arrows are measured on a
:class:`coursekit.gpt.GPT` by :func:`model_shapes`.

Every box carries a ``gid`` (its stage's name), its chapter label the ``gid``
``"chapters:<name>"`` and each shape label beside an arrow ``"tensor:<name>"`` (a name of
:func:`model_shapes`). The logits' shape holds the vocabulary size $|\mathcal{V}|$, whose
calligraphic letter no browser font is sure to have: it is drawn as outlines, a
:class:`~matplotlib.patches.PathPatch` whose label is the mathtext it shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, PathPatch
from matplotlib.textpath import TextPath
from matplotlib.transforms import Affine2D

from coursekit.chapters import CHAPTERS
from coursekit.diagrams.attention import canvas, draw_arrow, draw_box, symbolic
from coursekit.gpt import GPT, GPT_PRESETS

__all__ = ["STAGES", "Stage", "chapter_label", "chapter_number", "draw_outlined", "model_map", "model_shapes"]


@dataclass(frozen=True)
class Stage:
    """One box of the map.

    Attributes:
        name: the box's ``gid``.
        text: what the box says.
        chapters: the assignments of the chapters that build it, e.g. ``("ch04_layers",)``.
        kind: its colour, a key of :data:`coursekit.diagrams.attention.FILL`.
        optional: drawn dashed: only some models have it.
    """

    name: str
    text: str
    chapters: tuple[str, ...]
    kind: str = "op"
    optional: bool = False


#: the map's boxes from top to bottom; the last two sit side by side (the two kinds of output)
STAGES: tuple[Stage, ...] = (
    Stage("tokens", "tokens: text or image patches", ("ch05_bpe", "ch09_vit"), "input"),
    Stage("embedding", "token embedding + positions", ("ch03_positional",), "weight"),
    Stage("attention", "multi-head attention", ("ch01_attention", "ch02_multihead", "ch10_long_context")),
    Stage("add_norm1", "add & norm", ("ch04_layers",), "tensor"),
    Stage(
        "cross", "cross-attention, add & norm\n(decoder of an encoder-decoder)", ("ch08_seq2seq",), "op", True
    ),
    Stage("feed_forward", "feed-forward", ("ch04_layers",)),
    Stage("add_norm2", "add & norm", ("ch04_layers",), "tensor"),
    Stage("head", "output head", ("ch06_bert", "ch07_gpt", "ch09_vit"), "weight"),
    Stage("next_token", "next-token distribution", ("ch07_gpt", "ch08_seq2seq"), "output"),
    Stage("class", "class (from [CLS])", ("ch06_bert", "ch09_vit"), "output"),
)
_LAYER = ("attention", "add_norm1", "cross", "feed_forward", "add_norm2")  # the boxes inside "L x"


def chapter_number(assignment: str) -> int:
    """The chapter's number: its place among the numbered chapters of :data:`~coursekit.chapters.CHAPTERS`.

    ``chapter_number("ch04_layers")`` is ``4``. ``ValueError`` for an assignment that is not a
    numbered chapter (an appendix has a letter, not a number).
    """
    numbered = [c.assignment for c in CHAPTERS if c.assignment.startswith("ch")]
    if assignment not in numbered:
        raise ValueError(f"{assignment!r} is not a numbered chapter; they are {numbered}")
    return numbered.index(assignment) + 1


def chapter_label(chapters: tuple[str, ...]) -> str:
    """``("ch01_attention", "ch02_multihead")`` -> ``"Chapters 1, 2"``; one chapter -> ``"Chapter 1"``."""
    numbers = sorted(chapter_number(c) for c in chapters)
    return ("Chapter " if len(numbers) == 1 else "Chapters ") + ", ".join(map(str, numbers))


def model_shapes(B: int = 2, T: int = 5, preset: str = "nano") -> dict[str, tuple[int, ...]]:
    """Shapes between the map's stages, measured on a :class:`~coursekit.gpt.GPT` in evaluation mode.

    Returns:
        ``{"tokens": (B, T), "embedded": (B, T, C), "layers": (B, T, C), "logits": (B, T, V)}``
        as numbers: the token ids, the sum of token and position embeddings, the last layer's
        output, and the logits.
    """
    model = GPT(GPT_PRESETS[preset]).eval()
    seen: dict[str, tuple[int, ...]] = {}
    hooks = [
        model.drop.register_forward_hook(lambda m, i, o: seen.__setitem__("embedded", tuple(o.shape))),
        model.blocks[-1].register_forward_hook(lambda m, i, o: seen.__setitem__("layers", tuple(o.shape))),
    ]
    tokens = torch.zeros(B, T, dtype=torch.long)  # (B, T)
    with torch.no_grad():
        logits = model(tokens)  # (B, T, V)
    for hook in hooks:
        hook.remove()
    return {"tokens": tuple(tokens.shape), **seen, "logits": tuple(logits.shape)}


def draw_outlined(ax: Axes, xy: tuple[float, float], text: str, gid: str, size_pt: float = 11.0) -> PathPatch:
    """Draw ``text`` (mathtext) as filled outlines, its left edge at ``x`` and centred on ``y`` (inches).

    Text in the book's SVG stays text and is set in the reader's fonts; outlines keep symbols that
    those fonts lack. The patch's label is ``text``.
    """
    path = TextPath((0, 0), text, size=size_pt / 72)  # one data unit per inch
    box = path.get_extents()
    x, y = xy
    patch = PathPatch(
        path.transformed(Affine2D().translate(x - box.x0, y - (box.y0 + box.y1) / 2)),
        facecolor="black",
        edgecolor="none",
        label=text,
    )
    patch.set_gid(gid)
    ax.add_patch(patch)
    return patch


def model_map() -> Figure:
    """Draw the whole model on one page, each box with the chapters that build it.

    The layer is drawn post-norm, as in the original Transformer and BERT (add, then norm);
    Chapter 4 explains the pre-norm layer that the book's GPT and ViT use.

    Returns:
        A 5.5-inch-wide figure in the book's style.
    """
    cfg = GPT_PRESETS["nano"]
    B, T = 2, 5
    sizes = {"B": B, "T": T, "C": cfg.d_model, r"|\mathcal{V}|": cfg.vocab_size}
    shapes = {name: symbolic(shape, sizes) for name, shape in model_shapes(B, T).items()}
    stage = {s.name: s for s in STAGES}

    box_h, tall_h, gap, pad = 0.42, 0.64, 0.36, 0.16  # inches
    cx, w = 2.1, 2.7  # the column of boxes
    tag_x = cx + w / 2 + 0.18  # chapter labels start here
    frame_left, frame_right = cx - w / 2 - 0.3, cx + w / 2 + 0.1
    heights = {s.name: tall_h if "\n" in s.text else box_h for s in STAGES}
    column = [s.name for s in STAGES[:-2]]
    total = (sum(heights[n] for n in column) + tall_h + gap * len(column) + 2 * pad) + 0.2
    fig, ax = canvas(5.5, total)

    centre: dict[str, float] = {}
    y = total - 0.1
    for name in column:
        if name == _LAYER[0]:
            y -= pad
        centre[name] = y - heights[name] / 2
        y -= heights[name] + gap
        if name == _LAYER[-1]:
            y -= pad
    for name in column:
        s = stage[name]
        draw_box(ax, name, (cx, centre[name]), (w, heights[name]), s.text, s.kind, dashed=s.optional)
        ax.text(
            tag_x, centre[name], chapter_label(s.chapters), ha="left", va="center", gid=f"chapters:{name}"
        )

    def bottom(n):
        return centre[n] - heights[n] / 2

    def top(n):
        return centre[n] + heights[n] / 2

    for upper, lower in zip(column, column[1:]):
        draw_arrow(ax, (cx, bottom(upper)), (cx, top(lower)), f"flow:{upper}->{lower}")

    # the layer, repeated L times
    frame_top, frame_bottom = top(_LAYER[0]) + pad, bottom(_LAYER[-1]) - pad
    frame = FancyBboxPatch(
        (frame_left, frame_bottom),
        frame_right - frame_left,
        frame_top - frame_bottom,
        boxstyle="round,pad=0,rounding_size=0.1",
        facecolor="none",
        edgecolor="#555555",
        lw=1.2,
    )
    frame.set_gid("layer")
    ax.add_patch(frame)
    ax.text(
        frame_left - 0.08,
        (frame_top + frame_bottom) / 2,
        r"$L\,\times$",
        ha="right",
        va="center",
        gid="layer:count",
    )
    # residual paths: from above each sub-layer, around it, into its add & norm
    rx = frame_left + 0.15
    for sub, add in (("attention", "add_norm1"), ("feed_forward", "add_norm2")):
        start = top(sub) + gap / 2 if sub != "attention" else frame_top - pad / 2
        ax.plot([cx, rx, rx], [start, start, centre[add]], color="black", lw=1.2, gid=f"residual:{sub}")
        draw_arrow(ax, (rx, centre[add]), (cx - w / 2, centre[add]), f"residual:{sub}->{add}")

    # shapes beside the arrows between the stages
    for tensor, (upper, lower) in {
        "tokens": ("tokens", "embedding"),
        "embedded": ("embedding", "attention"),
        "layers": ("add_norm2", "head"),
    }.items():
        y_mid = (bottom(upper) + (top(lower) if lower != "attention" else frame_top)) / 2
        if upper == "add_norm2":
            y_mid = (frame_bottom + top(lower)) / 2
        ax.text(cx + 0.1, y_mid, shapes[tensor], ha="left", va="center", gid=f"tensor:{tensor}")

    # the two kinds of output, side by side below the head
    out_y = bottom("head") - gap - tall_h / 2
    for name, x in (("next_token", 1.4), ("class", 4.1)):
        s = stage[name]
        draw_box(
            ax,
            name,
            (x, out_y),
            (2.6, tall_h),
            s.text,
            s.kind,
            chapter_label(s.chapters),
            shape_gid=f"chapters:{name}",
        )
        draw_arrow(ax, (cx, bottom("head")), (x, out_y + tall_h / 2), f"flow:head->{name}")
    draw_outlined(ax, (0.1, (bottom("head") + out_y + tall_h / 2) / 2), shapes["logits"], "tensor:logits")
    return fig
