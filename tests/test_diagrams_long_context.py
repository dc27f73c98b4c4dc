"""Chapter 10's tiling diagram shows the tiles ``tiled_attention`` really computes, in its order."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.patches import Rectangle
from torch.overrides import TorchFunctionMode

from coursekit import long_context as lc
from coursekit.diagrams import long_context as diagram

#: (T, S, block_q, block_k, causal): tiles that divide and that do not, more keys than queries, one tile
CASES = [
    (256, 256, 64, 64, True),
    (256, 256, 64, 64, False),
    (10, 12, 4, 5, True),
    (9, 9, 3, 2, True),
    (7, 20, 3, 6, True),
    (5, 5, 8, 8, True),
    (6, 11, 4, 3, False),
]


class _SliceLog(TorchFunctionMode):
    """Records, in order, which rows of ``q`` and ``k`` are sliced out: the tiles being computed."""

    def __init__(self, q, k):
        super().__init__()
        self.q, self.k, self.events = q, k, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__ and args[0] is self.q:
            self.events.append(("q", args[1][-2].start))
        elif func is torch.Tensor.__getitem__ and args[0] is self.k:
            self.events.append(("k", args[1][-2].start))
        return func(*args, **(kwargs or {}))


def computed_in_order(T, S, block_q, block_k, causal):
    """``(query block, key tile)`` of every tile ``tiled_attention`` reads keys for, in order."""
    q, k, v = (torch.randn(1, n, 4, generator=torch.Generator().manual_seed(n)) for n in (T, S, S))
    with _SliceLog(q, k) as log:
        lc.tiled_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
    order, block = [], None
    for which, start in log.events:
        if which == "q":
            block = start // block_q
        else:
            order.append((block, start // block_k))
    return order


def computed_by_poisoning(T, S, block_q, block_k, causal):
    """The same set found from the output alone: a NaN value in a tile that is read poisons its block."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, 4, generator=g, dtype=torch.float64) for n in (T, S, S))
    read = set()
    for tile, j0 in enumerate(range(0, S, block_k)):
        bad = v.clone()
        bad[:, j0 : j0 + block_k] = float("nan")
        out = lc.tiled_attention(q, k, bad, causal=causal, block_q=block_q, block_k=block_k)
        for block, i0 in enumerate(range(0, T, block_q)):
            rows = out[:, i0 : i0 + block_q]
            assert (
                rows.isnan().all() or not rows.isnan().any()
            )  # a tile is read by the whole block or not at all
            if rows.isnan().any():
                read.add((block, tile))
    return read


@pytest.mark.parametrize("case", CASES)
def test_schedule_is_the_order_tiled_attention_computes(case):
    schedule = diagram.tile_schedule(*case)
    computed = [(t.block, t.tile) for t in schedule if t.computed]
    assert computed == computed_in_order(*case)
    assert set(computed) == computed_by_poisoning(*case)
    T, S, block_q, block_k, _ = case
    assert len(schedule) == -(-T // block_q) * -(-S // block_k)
    for block in {t.block for t in schedule}:
        steps = [t.step for t in schedule if t.block == block and t.computed]
        assert steps == list(range(1, len(steps) + 1))


@pytest.mark.parametrize("case", [c for c in CASES if c[-1]])
def test_states_follow_the_causal_mask(case):
    T, S = case[:2]
    visible = torch.ones(T, S, dtype=torch.bool).tril(S - T)  # query i sees key j <= i + S - T
    for t in diagram.tile_schedule(*case):
        part = visible[t.rows[0] : t.rows[1], t.cols[0] : t.cols[1]]
        expected = "full" if part.all() else "skipped" if not part.any() else "partial"
        assert t.state == expected, t


def test_bad_arguments_are_refused_like_tiled_attention():
    for args in ((4, 4, 0, 2, False), (4, 4, 2, 0, False), (5, 4, 2, 2, True)):
        with pytest.raises(ValueError):
            diagram.tile_schedule(*args)
        T, S, block_q, block_k, causal = args
        with pytest.raises(ValueError):
            lc.tiled_attention(
                torch.zeros(T, 2),
                torch.zeros(S, 2),
                torch.zeros(S, 2),
                causal=causal,
                block_q=block_q,
                block_k=block_k,
            )


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[4]])
def test_figure_draws_the_computed_and_skipped_tiles(case):
    T, S, block_q, block_k, causal = case
    fig = diagram.tiling(T, S, block_q, block_k, causal)
    try:
        drawn = {}
        for patch in fig.axes[0].patches:
            if isinstance(patch, Rectangle) and (patch.get_gid() or "").startswith("tile:"):
                _, block, tile, state = patch.get_gid().split(":")
                drawn[int(block), int(tile)] = state
        order = computed_in_order(*case)
        assert {key for key, state in drawn.items() if state != "skipped"} == set(order)
        assert len(drawn) == -(-T // block_q) * -(-S // block_k)
        # the numbered walk is one query block's tiles in the order tiled_attention computes them
        numbers = [x for x in fig.axes[0].texts if (x.get_gid() or "").startswith("step:")]
        walk = [tuple(int(n) for n in x.get_gid().split(":")[1:]) for x in numbers]  # (block, tile, step)
        block = walk[0][0]
        assert [(b, t) for b, t, _ in sorted(walk, key=lambda w: w[2])] == [
            bt for bt in order if bt[0] == block
        ]
        assert [x.get_text() for x in numbers] == [str(n) for _, _, n in walk]
        assert fig.get_figwidth() <= 5.5
        sizes = [x.get_fontsize() for ax in fig.axes for x in ax.texts] + [
            lab.get_fontsize() for ax in fig.axes for lab in ax.get_xticklabels() + ax.get_yticklabels()
        ]
        assert min(sizes) >= 11
    finally:
        plt.close(fig)


def test_default_walk_is_the_last_block_that_skips():
    fig = diagram.tiling()  # 4 x 4 tiles of tiled_attention's default size, causal
    try:
        gids = [x.get_gid() for x in fig.axes[0].texts if (x.get_gid() or "").startswith("step:")]
        assert gids == ["step:2:0:1", "step:2:1:2", "step:2:2:3"]
    finally:
        plt.close(fig)
