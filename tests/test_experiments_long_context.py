"""coursekit.experiments.long_context: the memory probe against the size of the scores, the
needle task against its definition, and true properties of the train-short, test-long model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from coursekit.experiments import long_context as ex
from tests.conftest import assert_close


@pytest.mark.slow  # three fresh Python processes, about 2 s each
def test_peak_memory_of_tiled_attention_is_far_below_naive():
    T = 4096  # scores of 64 MiB; the tiled call holds a few MiB (its output, the tiles, allocator slack)
    naive_peak = ex.attention_peak_memory("naive", T)
    tiled_peak = ex.attention_peak_memory("tiled", T, block_size=256)
    scores = T * T * 4  # one float32 (T, T) matrix
    assert naive_peak["finite"] and tiled_peak["finite"]
    assert naive_peak["peak_bytes"] >= scores  # the scores are materialised at least once
    assert tiled_peak["peak_bytes"] < scores / 4
    with pytest.raises(ValueError, match="method must be one of"):
        ex.attention_peak_memory("flash", T)


@pytest.mark.parametrize("position", ex.POSITIONS)
def test_context_lm_is_causal_for_every_position_kind(position):
    torch.manual_seed(0)
    model = ex.ContextLM(ex.NEEDLE_VOCAB, position, d_model=16, max_len=32).eval()
    a = torch.randint(0, ex.NEEDLE_VOCAB, (2, 20))
    b = a.clone()
    b[:, 12:] = torch.randint(0, ex.NEEDLE_VOCAB, (2, 8))
    with torch.no_grad():
        assert_close(model(a)[:, :12], model(b)[:, :12])
        assert model(a).shape == (2, 20, ex.NEEDLE_VOCAB)


def test_context_lm_rope_scaling_is_wired_in():
    torch.manual_seed(0)
    model = ex.ContextLM(ex.NEEDLE_VOCAB, "rope", d_model=16).eval()
    x = torch.randint(0, ex.NEEDLE_VOCAB, (1, 30))
    with torch.no_grad():
        plain = model(x)
        model.rope_scaling, model.rope_factor = "linear", 1.0
        assert_close(model(x), plain)  # factor 1 changes nothing
        model.rope_factor = 4.0
        assert not torch.allclose(model(x), plain)
        model.rope_scaling = "ntk"
        assert not torch.allclose(model(x), plain)


def test_context_lm_learned_table_and_bad_position():
    model = ex.ContextLM(ex.NEEDLE_VOCAB, "learned", d_model=16, max_len=32)
    with pytest.raises(ValueError, match="positions must lie in 0 .. 31"):
        model(torch.zeros(1, 40, dtype=torch.long))
    with pytest.raises(ValueError, match="position must be one of"):
        ex.ContextLM(ex.NEEDLE_VOCAB, "t5")


def test_needle_task_targets_follow_the_marker():
    tokens, targets = ex.needle_task(50, 30, torch.Generator().manual_seed(0))
    marker = ex.NEEDLE_VOCAB - 1
    assert tokens.shape == targets.shape == (50, 30) and int(tokens.max()) == marker
    for row, target in zip(tokens, targets):
        (where,) = (row == marker).nonzero(as_tuple=True)
        assert len(where) == 1
        p = int(where)
        assert (target[: p + 1] == -100).all()
        assert (target[p + 1 :] == row[p + 1]).all() and 8 <= int(row[p + 1]) < 16
    with pytest.raises(ValueError, match="T >= 2"):
        ex.needle_task(2, 1, torch.Generator())


def test_needle_accuracy_of_an_oracle_and_a_short_training_run():
    class Oracle(torch.nn.Module):
        def forward(self, tokens):
            marker = ex.NEEDLE_VOCAB - 1
            where = (tokens == marker).int().argmax(-1)  # (B,)
            needle = tokens[torch.arange(len(tokens)), where + 1]  # (B,)
            return F.one_hot(needle, ex.NEEDLE_VOCAB)[:, None, :].expand(*tokens.shape, -1).double()

    assert ex.needle_accuracy(Oracle(), 40) == 1.0
    model = ex.train_context_model("alibi", T=16, steps=3, batch=4, d_model=16)
    assert not model.training and 0.0 <= ex.needle_accuracy(model, 32, n=4) <= 1.0
