"""Plotting helpers shared by the book's chapters.

Every function draws on a Matplotlib ``Axes`` (a new figure and axes when ``ax``
is ``None``) and returns that ``Axes``, so pages can compose panels with
``plt.subplots``. Nothing here calls ``plt.show()``: the page does.

Conventions (see the book's notation page): an attention matrix has shape
``(T, S)``, one row per query and one column per key, so queries run down the
vertical axis and keys along the horizontal one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes

if TYPE_CHECKING:  # torch is imported only by the caller that has tensors: a page without them starts faster
    import torch

__all__ = ["BOOK_STYLE", "attention_heatmap", "loss_curves", "use_book_style"]

#: the book's one Matplotlib style: figure size for the text column, 11.5 pt text, SVG with text kept
BOOK_STYLE = Path(__file__).with_name("book.mplstyle")


def use_book_style() -> None:
    """Draw every later figure in the book's style, and show it as SVG in a notebook.

    SVG stays sharp at any width, and the book's checks read each label's size from it to
    measure how large it is rendered (:mod:`coursekit.booklint`). Outside IPython only the style is applied.
    """
    plt.style.use(BOOK_STYLE)
    try:
        from IPython import get_ipython
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:  # plain Python: no inline backend to configure
        return
    if get_ipython() is not None:
        set_matplotlib_formats("svg")


def _as_matrix(weights: torch.Tensor | np.ndarray) -> np.ndarray:
    """A 2-D float NumPy copy of ``weights`` (booleans become 0.0 and 1.0)."""
    torch = sys.modules.get("torch")  # a tensor can only come from a program that imported torch
    if torch is not None and isinstance(weights, torch.Tensor):
        weights = weights.detach().to("cpu")
        weights = weights.to(torch.float64) if weights.dtype == torch.bool else weights
        array = weights.numpy()
    else:
        array = np.asarray(weights)
    if array.ndim != 2:
        hint = " (pass one matrix, e.g. weights[0] for the first sequence)" if array.ndim > 2 else ""
        raise ValueError(f"weights must be a 2-D (T, S) matrix, got shape {tuple(array.shape)}{hint}")
    if array.dtype == np.bool_:
        array = array.astype(np.float64)
    if not np.issubdtype(array.dtype, np.number):
        raise TypeError(f"weights must be numeric or boolean, got dtype {array.dtype}")
    return array


def _check_labels(labels: Sequence[str] | None, n: int, name: str, axis: str) -> list[str]:
    if labels is None:
        return [str(i) for i in range(n)]
    labels = [str(label) for label in labels]
    if len(labels) != n:
        raise ValueError(f"{name} has {len(labels)} entries but weights has {axis}={n}")
    return labels


def attention_heatmap(
    weights: torch.Tensor | np.ndarray,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    *,
    annotate: bool = False,
    fmt: str = "{:.2f}",
    cmap: str = "viridis",
    vmin: float | None = 0.0,
    vmax: float | None = 1.0,
    colorbar: bool = True,
) -> Axes:
    """Draw a ``(T, S)`` attention matrix (or mask) as an image with token labels.

    Row ``t`` is query ``t`` and column ``s`` is key ``s``, so entry ``(t, s)`` is
    how much query ``t`` attends to key ``s``. Boolean masks are drawn as 0 and 1.

    Args:
        weights: ``(T, S)`` tensor or array: attention weights, scores or a mask.
        query_labels: ``T`` labels for the rows; defaults to ``0 .. T-1``.
        key_labels: ``S`` labels for the columns; defaults to ``0 .. S-1``.
        ax: the Axes to draw on; a new figure is made when ``None``.
        title: the Axes' title.
        annotate: write each entry's value (formatted with ``fmt``) in its cell.
        fmt: format string for the annotations.
        cmap: Matplotlib colormap name.
        vmin: value mapped to the bottom of the colormap; ``None`` for the data's
            minimum (0 suits weights, which lie in [0, 1]).
        vmax: value mapped to the top of the colormap; ``None`` for the data's maximum.
        colorbar: add a colorbar next to the Axes.

    Returns:
        The Axes, with the ``(T, S)`` image as ``ax.images[0]``.

    Raises:
        ValueError: if ``weights`` is not 2-D or a label list has the wrong length.
        TypeError: if ``weights`` is neither numeric nor boolean.
    """
    matrix = _as_matrix(weights)  # (T, S)
    T, S = matrix.shape
    rows = _check_labels(query_labels, T, "query_labels", "T")
    cols = _check_labels(key_labels, S, "key_labels", "S")
    if ax is None:
        # one cell of about 0.4 inch, within the book's 5.5-inch column
        side = min(0.4, 4.5 / max(S, 1), 4.0 / max(T, 1))
        _, ax = plt.subplots(figsize=(side * S + 1.6, side * T + 1.4))

    image = ax.imshow(matrix, cmap=cmap, vmin=vmin, vmax=vmax, aspect="equal", interpolation="nearest")
    words = max(map(len, cols), default=0) > 2  # slant word labels so they do not overlap
    ax.set_xticks(
        range(S),
        cols,
        rotation=60 if words else 0,
        ha="right" if words else "center",
        rotation_mode="anchor" if words else "default",
    )
    ax.set_yticks(range(T), rows)
    ax.grid(False)  # grid lines would cross the cells
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title is not None:
        ax.set_title(title)
    if annotate:
        for t in range(T):
            for s in range(S):
                r, g, b, _ = image.cmap(image.norm(matrix[t, s]))
                luminance = 0.299 * r + 0.587 * g + 0.114 * b
                ax.text(
                    s,
                    t,
                    fmt.format(matrix[t, s]),
                    ha="center",
                    va="center",
                    color="black" if luminance > 0.5 else "white",
                )
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return ax


def loss_curves(
    history: Any, ax: Axes | None = None, *, keys: Sequence[str] | None = None, title: str | None = None
) -> Axes:
    """Plot the training loss of every step and the evaluation losses against the step.

    Args:
        history: a :class:`coursekit.train.History` (anything with ``steps``,
            ``train_loss`` and ``evals``, a list of ``{"step": s, name: value}``).
        ax: the Axes to draw on; a new figure is made when ``None``.
        keys: the evaluation metrics to draw; default every one whose name contains
            ``"loss"`` (so an accuracy is not drawn on the loss axis).
        title: the Axes' title.

    Returns:
        The Axes: ``ax.lines[0]`` is the training loss (one point per step), then one
        line with markers per evaluation metric, in ``keys`` order, and a legend.

    Raises:
        ValueError: if the history is empty or a requested key was never evaluated.
    """
    steps, train_loss, evals = list(history.steps), list(history.train_loss), list(history.evals)
    if len(steps) != len(train_loss):
        raise ValueError(f"history has {len(steps)} steps but {len(train_loss)} training losses")
    if not steps and not evals:
        raise ValueError("the history is empty: nothing to plot (train for at least one step)")
    available = list(dict.fromkeys(k for record in evals for k in record if k != "step"))
    if keys is None:
        keys = [k for k in available if "loss" in k]
    missing = [k for k in keys if k not in available]
    if missing:
        raise ValueError(f"no evaluation recorded {missing}; the history has {available}")
    if ax is None:
        _, ax = plt.subplots()
    if steps:
        ax.plot(steps, train_loss, lw=0.8, alpha=0.6, label="train (per batch)")
    for key in keys:
        points = [(record["step"], record[key]) for record in evals if key in record]
        ax.plot([s for s, _ in points], [v for _, v in points], marker="o", ms=3, label=key)
    ax.set_xlabel("step (optimizer updates)")
    ax.set_ylabel("loss")
    if title is not None:
        ax.set_title(title)
    ax.legend()
    return ax
