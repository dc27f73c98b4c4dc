"""Chapter 10's diagram: tiled attention with the online softmax.

:func:`tile_schedule` lists the tiles of the ``(T, S)`` score grid in the order
:func:`coursekit.long_context.tiled_attention` computes them: for each block of ``block_q``
queries, the key tiles of ``block_k`` keys from left to right, up to the last tile that holds a
key some query of the block may see (with ``causal``, the later tiles lie wholly in the block's
future and are skipped). It follows the same loops and the same skip condition; the tests check
it against the tiles ``tiled_attention`` actually reads.

:func:`tiling` draws that schedule: the grid cut into query blocks and key tiles, the tiles
computed and skipped, the causal boundary, the order in which one query block visits its tiles,
and the update of the running maximum ``m``, sum ``l`` and weighted sum ``a`` at each tile.

Drawn elements carry a ``gid`` naming what they show (``"tile:2:1:full"``: query block 2, key
tile 1, every key visible; ``"step:2:1:2"``: the second tile block 2 visits is key tile 1),
which is how the tests read a figure back.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from coursekit import viz
from coursekit.long_context import tiled_attention

__all__ = ["BLOCK_Q", "BLOCK_K", "Tile", "tile_schedule", "tiling"]

#: the tile sizes ``tiled_attention`` uses unless told otherwise
BLOCK_Q: int = inspect.signature(tiled_attention).parameters["block_q"].default
BLOCK_K: int = inspect.signature(tiled_attention).parameters["block_k"].default

_FULL, _PARTIAL, _SKIPPED, _PATH = "#56B4E9", "#B9DDF2", "#FFFFFF", "#D55E00"
_STATES = ("full", "partial", "skipped")


@dataclass(frozen=True)
class Tile:
    """One ``block_q x block_k`` tile of the score grid.

    Attributes:
        block: index of its query block (rows ``rows[0] .. rows[1] - 1``).
        tile: index of its key tile (columns ``cols[0] .. cols[1] - 1``).
        rows: ``(i0, i1)``, the queries of the block.
        cols: ``(j0, j1)``, the keys of the tile.
        state: ``"full"`` (computed, every key visible to every query of the block),
            ``"partial"`` (computed, the causal mask hides some keys from some queries) or
            ``"skipped"`` (never computed: every key lies in the future of every query).
        step: its place in the block's walk over the keys (``1`` first), ``None`` if skipped.
    """

    block: int
    tile: int
    rows: tuple[int, int]
    cols: tuple[int, int]
    state: str
    step: int | None

    @property
    def computed(self) -> bool:
        return self.state != "skipped"


def tile_schedule(
    T: int, S: int, block_q: int = BLOCK_Q, block_k: int = BLOCK_K, causal: bool = False
) -> list[Tile]:
    """Every tile of a ``(T, S)`` score grid in the order ``tiled_attention`` visits it.

    Args:
        T: queries, ``>= 1``.
        S: keys, ``>= 1`` (``>= T`` with ``causal``; queries are the last ``T`` positions).
        block_q: queries per block, ``>= 1``.
        block_k: keys per tile, ``>= 1``.
        causal: skip the tiles in a block's future, as ``tiled_attention(causal=True)`` does.

    Returns:
        ``ceil(T / block_q) * ceil(S / block_k)`` tiles, block by block and, within a block, key
        tile by key tile: the order of the computation. Example: ``tile_schedule(4, 4, 2, 2,
        causal=True)`` gives block 0 tiles ``0`` (partial, step 1) and ``1`` (skipped), block 1
        tiles ``0`` (full, step 1) and ``1`` (partial, step 2).

    Raises:
        ValueError: a size below 1, or ``causal`` with ``S < T``.
    """
    if min(T, S, block_q, block_k) < 1:
        raise ValueError(f"T, S, block_q and block_k must be positive, got {T}, {S}, {block_q}, {block_k}")
    if causal and S < T:
        raise ValueError(f"a causal mask needs at least as many keys as queries, got T={T} and S={S}")
    tiles = []
    for b, i0 in enumerate(range(0, T, block_q)):
        i1 = min(i0 + block_q, T)
        step = 0
        for t, j0 in enumerate(range(0, S, block_k)):
            j1 = min(j0 + block_k, S)
            if causal and j0 > i1 - 1 + S - T:  # tiled_attention's skip condition
                state = "skipped"
            elif causal and j1 - 1 > i0 + S - T:  # the block's first query does not see the tile's last key
                state = "partial"
            else:
                state = "full"
            step = step + 1 if state != "skipped" else step
            tiles.append(Tile(b, t, (i0, i1), (j0, j1), state, step if state != "skipped" else None))
    return tiles


def _ticks(starts: list[int], end: int) -> list[int]:
    """Tile boundaries to label: at most five or so, and the end unless it crowds the last."""
    kept = starts[:: -(-len(starts) // 5)]
    gap = kept[1] - kept[0] if len(kept) > 1 else end
    return kept + [end] if end - kept[-1] >= gap / 2 else kept


def tiling(
    T: int = 4 * BLOCK_Q,
    S: int | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    causal: bool = True,
    block: int | None = None,
) -> Figure:
    """Draw the score grid cut into tiles, the tiles one query block visits, and the update per tile.

    Args:
        T, S, block_q, block_k, causal: as for :func:`tile_schedule` (``S`` defaults to ``T``).
        block: the query block whose walk is numbered; by default the last block that skips a
            tile (with ``causal``), else the middle one.

    Returns:
        The figure: on the left the grid (computed tiles shaded, tiles the causal mask cuts in a
        lighter shade, skipped tiles crossed out, the causal boundary dashed), on the right the
        numbered walk of ``block`` and the online-softmax update each tile applies.
    """
    S = T if S is None else S
    tiles = tile_schedule(T, S, block_q, block_k, causal)
    n_blocks = tiles[-1].block + 1
    if block is None:
        skipping = [t.block for t in tiles if t.state == "skipped"]
        block = max(skipping) if skipping else n_blocks // 2
    if not 0 <= block < n_blocks:
        raise ValueError(f"block must be in 0 .. {n_blocks - 1}, got {block}")
    with plt.style.context(viz.BOOK_STYLE):  # the book's style whatever style is active
        return _draw(tiles, T, S, block_q, block_k, causal, block)


def _draw(tiles: list[Tile], T: int, S: int, block_q: int, block_k: int, causal: bool, block: int) -> Figure:
    fig, (grid, text) = plt.subplots(1, 2, figsize=(5.5, 3.4), width_ratios=[1, 1.2])
    for tile in tiles:
        (i0, i1), (j0, j1) = tile.rows, tile.cols
        colour = {"full": _FULL, "partial": _PARTIAL, "skipped": _SKIPPED}[tile.state]
        grid.add_patch(
            Rectangle(
                (j0, i0),
                j1 - j0,
                i1 - i0,
                facecolor=colour,
                edgecolor="black",
                lw=1.0,
                gid=f"tile:{tile.block}:{tile.tile}:{tile.state}",
            )
        )
        if tile.state == "skipped":
            grid.plot([j0, j1], [i0, i1], color="0.6", lw=0.8)
            grid.plot([j0, j1], [i1, i0], color="0.6", lw=0.8)
    walk = [t for t in tiles if t.block == block and t.computed]
    (i0, i1) = walk[0].rows
    grid.add_patch(Rectangle((0, i0), S, i1 - i0, fill=False, edgecolor=_PATH, lw=2.4, zorder=3))
    for tile in walk:
        (j0, j1) = tile.cols
        grid.text(
            (j0 + j1) / 2,
            (i0 + i1) / 2,
            str(tile.step),
            ha="center",
            va="center",
            color="white",
            fontweight="bold",
            zorder=4,
            gid=f"step:{tile.block}:{tile.tile}:{tile.step}",
            bbox=dict(boxstyle="circle,pad=0.2", facecolor=_PATH, edgecolor="none"),
        )
    if causal:  # key j is visible to query i when j <= i + S - T
        grid.plot([S - T, S], [0, T], color="black", ls="--", lw=1.0)
    grid.set(xlim=(0, S), ylim=(T, 0), aspect="equal", xlabel="key position $j$", ylabel="query position $i$")
    grid.set_xticks(_ticks([t.cols[0] for t in tiles if t.block == 0], S))
    grid.set_yticks(_ticks([t.rows[0] for t in tiles if t.tile == 0], T))
    grid.grid(False)
    for side in ("top", "right"):
        grid.spines[side].set_visible(True)
    grid.set_title(f"tiles of {block_q} x {block_k}", loc="left")

    text.axis("off")
    skipped = [t for t in tiles if t.block == block and not t.computed]
    lines = [(f"query block {block}, in order:", "black")]
    for tile in walk:
        note = "all keys visible" if tile.state == "full" else "future keys masked"
        lines.append((f"{tile.step}: key tile {tile.tile}, {note}", _PATH))
    if skipped:
        lines.append(
            (
                f"key tile{'s' if len(skipped) > 1 else ''} "
                f"{', '.join(str(t.tile) for t in skipped)}: skipped",
                "0.4",
            )
        )
    lines += [
        ("start: $m = -\\infty,\\ \\ell = 0,\\ a = 0$", "black"),
        ("each tile updates each query:", "black"),
        ("$m_{new} = \\max\\,(m,\\ \\max\\, s_j)$", "black"),
        ("$\\ell \\leftarrow e^{m - m_{new}} \\ell + \\Sigma\\, e^{s_j - m_{new}}$", "black"),
        ("$a \\leftarrow e^{m - m_{new}} a + \\Sigma\\, e^{s_j - m_{new}} v_j$", "black"),
        ("$m \\leftarrow m_{new}$", "black"),
        ("after the last tile: $o = a / \\ell$", "black"),
    ]
    y, step = 1.0, 1.0 / (len(lines) + 0.5)
    for k, (line, colour) in enumerate(lines):
        if k == len(lines) - 7:
            y -= step / 2  # a gap between the walk and the update
        text.text(0.0, y, line, color=colour, va="top", transform=text.transAxes)
        y -= step
    return fig
