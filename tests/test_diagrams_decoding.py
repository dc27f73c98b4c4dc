"""coursekit.diagrams.decoding: the drawn beam tree is beam_search's, the drawn cut-offs are the filters'.

The beam tree is checked against :func:`coursekit.decoding.beam_search` itself: a recording
wrapper around the model sees which beams ``beam_search`` keeps at every step (the tokens it
feeds and the cache reorders it asks for), and its returned best sequence and score are compared
with the tree's best final beam. The cut-offs are checked on a fixed distribution whose answers
are counted by hand.
"""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch
from matplotlib.colors import to_hex
from torch import nn

from coursekit import decoding, gpt
from coursekit.diagrams import decoding as diagrams

matplotlib.use("Agg")


def tiny_gpt(seed: int) -> gpt.GPT:
    torch.manual_seed(seed)
    m = gpt.GPT(gpt.GPTConfig(vocab_size=11, block_size=16, n_layers=1, n_heads=2, d_model=8))
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(8)  # peakier predictions, so that beams part ways
    return m.eval()


def decode(ids: list[int]) -> str:
    return "".join("abcdefg hi-"[i] for i in ids)  # a space and a hyphen among them


class Recorder(nn.Module):
    """Passes calls to a language model, and rebuilds the beams ``beam_search`` keeps from them."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.cfg = model, model.cfg
        self.levels: list[list[list[int]]] = []
        self._beams: torch.Tensor | None = None
        self._order: torch.Tensor | None = None

    def init_cache(self, *args, **kwargs):
        cache = self.model.init_cache(*args, **kwargs)
        reorder = cache.reorder

        def recording_reorder(index):
            self._order = index.clone()
            reorder(index)

        cache.reorder = recording_reorder
        return cache

    def forward(self, idx, cache=None):
        if self._beams is None:  # the prompt
            self._beams = idx[:, :0]
        else:  # the kept tokens of one step, after the reorder that puts their parents in place
            self._beams = torch.cat([self._beams[self._order], idx], dim=1)
            self.levels.append(self._beams.tolist())
        return self.model(idx, cache=cache)


CASES = [(seed, width, steps) for seed in range(3) for width in (1, 2, 3) for steps in (1, 4)]


@pytest.mark.parametrize("seed,width,steps", CASES)
def test_tree_keeps_the_beams_beam_search_keeps(seed, width, steps):
    model = tiny_gpt(seed)
    prompt = torch.randint(0, 11, (1, 3), generator=torch.Generator().manual_seed(seed))
    tree = diagrams.trace_beam_search(model, prompt, steps, width)
    # beam_search with one more step feeds the beams kept after each of the first `steps` steps
    recorder = Recorder(model)
    decoding.beam_search(recorder, prompt, steps + 1, beam_width=width)
    assert len(recorder.levels) == steps
    for t, beams in enumerate(recorder.levels, start=1):
        assert [tree.tokens(t, r) for r in range(len(tree.kept(t)))] == beams, f"step {t}"


@pytest.mark.parametrize("seed,width,steps", CASES)
def test_tree_final_beam_is_beam_search_output(seed, width, steps):
    model = tiny_gpt(seed)
    prompt = torch.randint(0, 11, (1, 3), generator=torch.Generator().manual_seed(seed))
    tree = diagrams.trace_beam_search(model, prompt, steps, width)
    tokens, score = decoding.beam_search(model, prompt, steps, beam_width=width)
    best, total = tree.final()[0]
    assert best == tokens[0, 3:].tolist()
    assert total / steps == pytest.approx(score, abs=1e-6)  # beam_search ranks by total / n ** 1
    for new, total in tree.final():  # every final score is that beam's log-probability
        lp = decoding.sequence_logprob(model, prompt, torch.tensor([new])).item()
        assert total == pytest.approx(lp, abs=1e-4)


def test_pruned_candidates_score_no_better_than_the_kept():
    model = tiny_gpt(5)
    tree = diagrams.trace_beam_search(model, torch.tensor([[1, 2]]), 5, 3)
    for level in tree.levels:
        kept = [n.score for n in level if n.kept]
        pruned = [n.score for n in level if not n.kept]
        assert len(kept) == 3 and (pruned or level[0].step == 1)
        assert max(pruned, default=-math.inf) <= min(kept)
        assert [n.score for n in sorted((n for n in level if n.kept), key=lambda n: n.rank)] == sorted(kept)[
            ::-1
        ]
        for n in level:  # a node's score is its parent's plus its own log-probability
            parent = 0.0 if n.step == 1 else tree.kept(n.step - 1)[n.parent].score
            assert n.score == pytest.approx(parent + n.logprob, abs=1e-5)


def texts(fig) -> dict[str, str]:
    return {t.get_gid(): t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid()}


def test_drawn_tree_shows_the_final_beams_of_beam_search():
    model = tiny_gpt(1)
    prompt = torch.tensor([[4, 7, 2]])
    tree = diagrams.trace_beam_search(model, prompt, 4, 3)
    fig = diagrams.beam_tree(tree, decode)
    drawn = texts(fig)
    tokens, _ = decoding.beam_search(model, prompt, 4, beam_width=3)
    assert drawn["final-0"] == "\u2192 " + diagrams.show_token(decode(tokens[0, 3:].tolist()))
    for r, (new, total) in enumerate(tree.final()):
        assert drawn[f"final-{r}"] == "\u2192 " + diagrams.show_token(decode(new))
        label = drawn[f"beam-4-{r}"]
        assert label.startswith(diagrams.show_token(decode(new[-1:])) + " ")
        assert float(label.rsplit(" ", 1)[1].replace("\u2212", "-")) == pytest.approx(total, abs=0.051)
    assert drawn["prompt"] == diagrams.show_token(decode([4, 7, 2]))
    assert sum(g.startswith("pruned-") for g in drawn) == sum(
        not n.kept for level in tree.levels for n in level
    )
    assert fig.get_figwidth() <= 5.5
    assert min(t.get_fontsize() for ax in fig.axes for t in ax.texts) >= 11


def test_show_token_makes_white_space_visible():
    assert diagrams.show_token("a b\n") == "a\u2423b\\n"


# probabilities 0.30, 0.20, 0.15, 0.10, 0.08, 0.07, 0.06, 0.04 in a shuffled vocabulary order
PROBS = torch.tensor([0.06, 0.15, 0.30, 0.07, 0.10, 0.04, 0.20, 0.08])


@pytest.mark.parametrize(
    "k,p,n_k,n_p",
    [
        (3, 0.7, 3, 4),  # mass before the 4th: 0.65 < 0.7, before the 5th: 0.75
        (1, 0.25, 1, 1),  # the top token alone reaches p
        (5, 0.31, 5, 2),  # the 0.20 that crosses p is kept
        (8, 1.0, 8, 8),
    ],
)
def test_drawn_cutoffs_are_what_the_filters_keep(k, p, n_k, n_p):
    logits = PROBS.log()
    assert int(torch.isfinite(decoding.top_k_filter(logits, k)).sum()) == n_k
    assert int(torch.isfinite(decoding.top_p_filter(logits, p)).sum()) == n_p
    fig = diagrams.cutoffs(logits, k, p, decode, shown=8)
    ax = fig.axes[0]
    cuts = {line.get_gid(): line.get_xdata()[0] for line in ax.lines if line.get_gid()}
    assert cuts["cut:top-k"] == pytest.approx(n_k - 0.5)
    assert cuts["cut:top-p"] == pytest.approx(n_p - 0.5)
    bars = ax.patches[:8]
    heights = [b.get_height() for b in bars]
    assert heights == pytest.approx(sorted(PROBS.tolist(), reverse=True), abs=1e-6)
    dropped = [to_hex(b.get_facecolor()) == "#bbbbbb" for b in bars]
    assert dropped == [i >= max(n_k, n_p) for i in range(8)]
    order = PROBS.argsort(descending=True)
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        diagrams.show_token(decode([int(i)])) for i in order
    ]
    cumulative = next(line for line in ax.lines if line.get_gid() == "cumulative").get_ydata()
    assert cumulative[-1] == pytest.approx(1.0, abs=1e-6)
    assert fig.get_figwidth() <= 5.5


def test_cutoffs_on_one_distribution_only():
    with pytest.raises(ValueError, match=r"one distribution \(V,\)"):
        diagrams.cutoffs(torch.zeros(2, 5), 2, 0.5, decode)
