"""Chapter 7's diagrams: a beam-search tree, and the top-k and top-p cut-offs on one distribution.

:func:`trace_beam_search` runs the steps of :func:`coursekit.decoding.beam_search` (without an
EOS token: every hypothesis runs for ``steps`` tokens) and records, at each step, the
candidates that compete for the ``W`` places: each live beam's ``W`` likeliest continuations
(no other candidate can be among the ``W`` best, since the ``W`` continuations of its own beam
outrank it), the ``W`` best of which are kept. It drives the model the way ``beam_search`` does
(one cached prompt pass, then the kept tokens with the cache reordered), so the logits, and
hence the kept beams, are the same; the tests check the final beams against ``beam_search``.

:func:`cutoffs` draws a next-token distribution sorted by probability and marks what
:func:`coursekit.decoding.top_k_filter` and :func:`coursekit.decoding.top_p_filter` keep: the
cut positions are the numbers of tokens those filters leave finite.

Drawn elements carry a ``gid`` naming what they show (``"beam-3-0"``: the best kept beam after
step 3; ``"final-0"``: the text of the best final beam; ``"cut:top-k"``), which is how the tests
read a figure back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from torch import nn

from coursekit import decoding, viz

__all__ = ["BeamNode", "BeamTree", "trace_beam_search", "beam_tree", "cutoffs", "show_token"]

_KEPT, _PRUNED, _BEST = "#0072B2", "#999999", "#D55E00"


def _book_style(draw):
    """Draw in the book's style (:data:`coursekit.viz.BOOK_STYLE`) whatever style is active."""

    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        with plt.style.context(viz.BOOK_STYLE):
            return draw(*args, **kwargs)

    return wrapper


@dataclass(frozen=True)
class BeamNode:
    """One candidate of one beam-search step.

    Attributes:
        step: ``1 .. steps``.
        parent: the index of the beam it extends among the previous step's kept beams
            (``0`` at step 1: the prompt).
        token: the token it appends.
        logprob: ``log p(token | prompt and parent's tokens)``.
        score: the total log-probability of its new tokens (what beam search ranks by).
        rank: its place among the kept beams of its step (``0`` the best), ``None`` if pruned.
    """

    step: int
    parent: int
    token: int
    logprob: float
    score: float
    rank: int | None

    @property
    def kept(self) -> bool:
        return self.rank is not None


@dataclass(frozen=True)
class BeamTree:
    """What :func:`trace_beam_search` saw: the prompt, the width and each step's candidates."""

    prompt: list[int]
    width: int
    levels: list[list[BeamNode]]  # levels[t - 1]: the candidates of step t, grouped by parent

    def kept(self, step: int) -> list[BeamNode]:
        """The beams kept at ``step``, best first."""
        return sorted((n for n in self.levels[step - 1] if n.kept), key=lambda n: n.rank)

    def tokens(self, step: int, rank: int) -> list[int]:
        """The new tokens of the kept beam of rank ``rank`` after ``step`` steps."""
        node, out = self.kept(step)[rank], []
        for t in range(step, 0, -1):
            out.append(node.token)
            if t > 1:
                node = self.kept(t - 1)[node.parent]
        return out[::-1]

    def final(self) -> list[tuple[list[int], float]]:
        """The final beams, best first: (new tokens, total log-probability)."""
        steps = len(self.levels)
        return [(self.tokens(steps, n.rank), n.score) for n in self.kept(steps)]


@torch.no_grad()
def trace_beam_search(model: nn.Module, prompt: torch.Tensor, steps: int, width: int) -> BeamTree:
    """Beam search without EOS, recording every step's competing candidates.

    Args:
        model: a language model with a KV cache (see :mod:`coursekit.decoding`).
        prompt: ``(1, T0)`` token ids.
        steps: new tokens per hypothesis, ``>= 1``.
        width: the beam width ``W >= 1``.

    Returns:
        The :class:`BeamTree`; its :meth:`BeamTree.final` beams are those ``beam_search`` ranks.
    """
    if prompt.dim() != 2 or prompt.shape[0] != 1:
        raise ValueError(f"expected one prompt of shape (1, T0), got {tuple(prompt.shape)}")
    if steps < 1 or width < 1:
        raise ValueError(f"steps and width must be >= 1, got steps={steps}, width={width}")
    was_training = model.training
    model.eval()
    try:
        cache = model.init_cache(1, prompt.shape[1] + steps)
        logits = model(prompt, cache=cache)[:, -1]  # (1, V)
        scores = torch.zeros(1)  # (N,) total log-probability of each live beam
        levels = []
        for t in range(1, steps + 1):
            logp = F.log_softmax(logits.float(), dim=-1)  # (N, V)
            V = logp.shape[-1]
            cand = (scores[:, None] + logp).view(-1)  # (N V,)
            top_idx = cand.topk(min(width, cand.numel())).indices.tolist()  # the kept, best first
            rank = {i: r for r, i in enumerate(top_idx)}
            nodes = []
            for beam in range(logp.shape[0]):
                best_children = logp[beam].topk(min(width, V)).indices.tolist()
                kept_here = [i % V for i in top_idx if i // V == beam and i % V not in best_children]
                for tok in best_children + kept_here:  # kept_here: only where ties broke differently
                    i = beam * V + tok
                    nodes.append(BeamNode(t, beam, tok, logp[beam, tok].item(), cand[i].item(), rank.get(i)))
            levels.append(nodes)
            if t == steps:
                break
            keep_beam = [i // V for i in top_idx]
            keep_tok = [i % V for i in top_idx]
            cache.reorder(torch.tensor(keep_beam))
            tokens = torch.tensor(keep_tok)[:, None]  # (N, 1)
            scores = cand[torch.tensor(top_idx)]
            logits = model(tokens, cache=cache)[:, -1]  # (N, V)
        return BeamTree(prompt[0].tolist(), width, levels)
    finally:
        model.train(was_training)


def show_token(text: str) -> str:
    """A token's text as a label: a space as ``␣``, a newline as ``\\n``."""
    return text.replace(" ", "\u2423").replace("\n", "\\n").replace("\t", "\\t")


@_book_style
def beam_tree(tree: BeamTree, decode: Callable[[list[int]], str]) -> Figure:
    """Draw a :class:`BeamTree`: one column per step, kept beams in blue, pruned ones in grey.

    Each node shows its token and the total log-probability of its hypothesis; the best final
    beam's path is drawn in orange, and each final beam's new text is written at the right.

    Args:
        tree: from :func:`trace_beam_search`.
        decode: token ids -> text (a tokenizer's ``decode``).

    Returns:
        The figure (5.5 inches wide).
    """
    steps = len(tree.levels)
    rows = max(len(level) for level in tree.levels)
    fig, ax = plt.subplots(figsize=(5.5, 0.3 * rows + 0.9))
    ax.set_axis_off()
    x_of = [0.0] + [1.0 + 1.25 * t for t in range(steps)]  # column centres; the prompt at 0
    y_of: list[list[float]] = []
    for level in tree.levels:
        n = len(level)
        y_of.append([(rows - 1) / 2 - i * (rows - 1) / max(n - 1, 1) if n > 1 else 0.0 for i in range(n)])
    best_path = _best_path(tree)

    ax.text(
        x_of[0],
        0,
        show_token(decode(tree.prompt)),
        ha="center",
        va="center",
        gid="prompt",
        bbox=dict(boxstyle="round,pad=0.25", fc="white", ec="black", lw=1.0),
    )
    for t, level in enumerate(tree.levels, start=1):
        # the live beams of step t are the kept beams of step t - 1 in rank order
        parents = (
            {0: 0.0}
            if t == 1
            else {n.rank: y_of[t - 2][i] for i, n in enumerate(tree.levels[t - 2]) if n.kept}
        )
        for i, node in enumerate(level):
            y = y_of[t - 1][i]
            on_best = best_path[t - 1] == i
            colour = _BEST if on_best else _KEPT if node.kept else _PRUNED
            ax.plot(
                [x_of[t - 1] + 0.3, x_of[t] - 0.42],
                [parents[node.parent], y],
                color=colour,
                lw=2.0 if on_best else 1.0,
                zorder=1,
            )
            label = f"{show_token(decode([node.token]))} {node.score:.1f}".replace(" -", " \u2212")
            ax.text(
                x_of[t],
                y,
                label,
                ha="center",
                va="center",
                color="black" if node.kept else _PRUNED,
                fontweight="bold" if node.kept else "normal",
                gid=f"beam-{t}-{node.rank}" if node.kept else f"pruned-{t}-{i}",
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=colour, lw=1.5 if node.kept else 0.6),
            )
        ax.text(x_of[t], (rows - 1) / 2 + 0.9, f"step {t}", ha="center", va="center")
    for r, node in enumerate(tree.kept(steps)):
        i = tree.levels[-1].index(node)
        text = show_token(decode(tree.tokens(steps, r)))
        ax.text(
            x_of[-1] + 0.5,
            y_of[-1][i],
            f"\u2192 {text}",
            ha="left",
            va="center",
            gid=f"final-{r}",
            color=_BEST if r == 0 else "black",
        )
    ax.set_xlim(-0.5, x_of[-1] + 1.5)
    ax.set_ylim(-(rows - 1) / 2 - 0.6, (rows - 1) / 2 + 1.2)
    return fig


def _best_path(tree: BeamTree) -> list[int]:
    """For each step, the index within its level of the node on the best final beam's path."""
    steps = len(tree.levels)
    node = tree.kept(steps)[0]
    path = [0] * steps
    for t in range(steps, 0, -1):
        path[t - 1] = tree.levels[t - 1].index(node)
        if t > 1:
            node = tree.kept(t - 1)[node.parent]
    return path


@_book_style
def cutoffs(
    logits: torch.Tensor,
    k: int,
    p: float,
    decode: Callable[[list[int]], str],
    shown: int = 20,
) -> Figure:
    """The ``shown`` likeliest tokens of one distribution as bars, and where top-k and top-p cut.

    The cut positions are counted from :func:`coursekit.decoding.top_k_filter` and
    :func:`coursekit.decoding.top_p_filter` (the tokens they leave finite; both keep a prefix
    of the sorted order). A line shows the cumulative probability, which top-p cuts where it
    first reaches ``p``.

    Args:
        logits: ``(V,)`` next-token logits.
        k, p: the filters' settings.
        decode: token ids -> text, for the bar labels.
        shown: how many of the likeliest tokens to draw.

    Returns:
        The figure (the book's 5.5-inch width).
    """
    if logits.dim() != 1:
        raise ValueError(f"expected one distribution (V,), got {tuple(logits.shape)}")
    logits = logits.float()
    probs = F.softmax(logits, dim=-1)  # (V,)
    order = probs.argsort(descending=True, stable=True)  # (V,)
    kept_k = torch.isfinite(decoding.top_k_filter(logits, k))[order]  # (V,) in sorted order
    kept_p = torch.isfinite(decoding.top_p_filter(logits, p))[order]
    n_k, n_p = int(kept_k.sum()), int(kept_p.sum())
    shown = min(max(shown, n_k + 1, n_p + 1), len(probs))
    sorted_p = probs[order][:shown].tolist()
    fig, ax = plt.subplots()
    colours = [
        "#0072B2" if a and b else "#56B4E9" if a or b else "#BBBBBB"
        for a, b in zip(kept_k[:shown].tolist(), kept_p[:shown].tolist())
    ]
    ax.bar(range(shown), sorted_p, color=colours, gid="bars")
    cum = probs[order].cumsum(0)[:shown].tolist()
    ax.plot(range(shown), cum, "o-", color="black", lw=1.0, ms=3, gid="cumulative", label="cumulative")
    ax.axhline(p, color="black", ls=":", lw=1.0)
    for name, n, colour in (("top-k", n_k, "#D55E00"), ("top-p", n_p, "#009E73")):
        ax.axvline(n - 0.5, color=colour, ls="--", lw=1.6, gid=f"cut:{name}")
        ax.text(
            n - 0.4,
            0.6 if name == "top-k" else 0.75,
            f"{name}\nkeeps {n}",
            color=colour,
            ha="left",
            va="center",
        )
    ax.text(-0.4, p + 0.015, f"p = {p:g}", ha="left", va="bottom")
    ax.set_xticks(range(shown), [show_token(decode([int(i)])) for i in order[:shown]])
    ax.tick_params(axis="x", length=0)
    ax.grid(axis="x", visible=False)
    ax.set_xlim(-0.6, shown - 0.4)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("next token, likeliest first")
    ax.set_ylabel("probability")
    ax.legend(
        handles=[
            Patch(color="#0072B2", label="kept by both"),
            Patch(color="#56B4E9", label="kept by one"),
            Patch(color="#BBBBBB", label="dropped"),
            ax.lines[0],
        ],
        loc="lower right",
        bbox_to_anchor=(1.0, 0.08),
    )
    return fig
