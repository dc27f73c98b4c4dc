"""Left-padded batches: ``GPT.forward(attention_mask=...)``, ``positions_from_mask``, ``padded_self_attention``
and ``decoding.generate_batch``, against one-by-one decoding (the definition of what a batch must give) and
Hugging Face's ``GPT2LMHeadModel`` with left padding on the same weights (tiny random configs, no download)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
import torch

from coursekit import decoding, gpt
from tests.conftest import assert_close, randomise

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = gpt.GPTConfig(vocab_size=61, block_size=48, n_layers=2, n_heads=4, d_model=32)
#: prompt-length mixes: ragged, equal, one very short next to a long one, a single prompt
MIXES = [(7, 2, 11, 1), (5, 5, 5), (1, 12), (3,)]


def ours(cfg=CFG, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return randomise(gpt.GPT(cfg), seed).to(dtype).eval()


def hf_from(model: gpt.GPT) -> GPT2LMHeadModel:
    hf = GPT2LMHeadModel(GPT2Config(**gpt.hf_config_kwargs(model.cfg))).to(model.tok_emb.weight.dtype).eval()
    hf.load_state_dict(gpt.to_hf_state_dict(model.state_dict()))
    return hf


def prompts_of(lengths, seed=0, V=CFG.vocab_size):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (n,), generator=g) for n in lengths]


def alone(model, prompt, n, **kwargs):
    """One-by-one decoding: what ``generate_batch`` must return for this prompt."""
    return decoding.generate(model, prompt[None], n, **kwargs)[0]


# --------------------------------------------------------------------------- padding and positions


def test_left_pad_worked_example_and_errors():
    ids, mask = decoding.left_pad([torch.tensor([5, 6, 7]), torch.tensor([8])], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[True, True, True], [False, False, True]]
    for bad, match in (
        ([], "non-empty list"),
        (torch.zeros(2, 3, dtype=torch.long), "non-empty list"),
        ([torch.tensor([1]), torch.zeros(0, dtype=torch.long)], "prompt 1 must be a 1-D torch.long tensor"),
        ([torch.zeros(1, 3, dtype=torch.long)], r"prompt 0 .* got torch.int64 \(1, 3\)"),
        ([torch.zeros(3)], "torch.float32"),
        ([[1, 2]], "got list"),
    ):
        with pytest.raises(ValueError, match=match):
            decoding.left_pad(bad, 0)


def test_positions_from_mask_example_and_hf_formula_at_real_tokens():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    pos = gpt.positions_from_mask(mask)
    assert pos.tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]
    hf = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # GPT-2's prepare_inputs_for_generation
    assert torch.equal(pos[mask.bool()], hf[mask.bool()])
    assert torch.equal(gpt.positions_from_mask(mask.bool()), pos)


# --------------------------------------------------------------------------- the forward pass


@pytest.mark.parametrize("lengths", MIXES)
def test_padded_logits_at_real_tokens_equal_the_unpadded_rows(lengths):
    m = ours(dtype=torch.float64)
    prompts = prompts_of(lengths)
    ids, mask = decoding.left_pad(prompts, pad_id=3)
    logits = m(ids, attention_mask=mask)  # (B, T_max, V)
    for i, p in enumerate(prompts):
        assert_close(logits[i, -p.numel() :], m(p[None])[0])
    assert torch.isfinite(logits).all()  # padding positions too


@pytest.mark.parametrize("lengths", MIXES)
def test_cached_padded_logits_equal_the_unpadded_rows(lengths):
    """Prefill the padded prompts into the cache, then feed 6 tokens one at a time with a growing mask."""
    m = ours(dtype=torch.float64)
    prompts = prompts_of(lengths, seed=1)
    cont = torch.randint(0, CFG.vocab_size, (len(prompts), 6), generator=torch.Generator().manual_seed(2))
    ids, mask = decoding.left_pad(prompts, pad_id=0)
    cache = m.init_cache(len(prompts))
    steps = [m(ids, cache=cache, attention_mask=mask)]
    for t in range(cont.shape[1]):
        mask = torch.cat([mask, torch.ones(len(prompts), 1, dtype=torch.bool)], dim=1)
        steps.append(m(cont[:, t : t + 1], cache=cache, attention_mask=mask))
    logits = torch.cat(steps, dim=1)  # (B, T_max + 6, V)
    for i, p in enumerate(prompts):
        full = torch.cat([p, cont[i]])[None]
        assert_close(logits[i, ids.shape[1] - p.numel() :], m(full)[0])


def test_padded_logits_equal_hf_with_attention_mask_and_its_positions():
    m = ours()
    hf = hf_from(m)
    prompts = prompts_of((9, 3, 14, 1), seed=3)
    ids, mask = decoding.left_pad(prompts, pad_id=0)
    hf_pos = (mask.long().cumsum(-1) - 1).masked_fill(~mask, 1)
    expected = hf(ids, attention_mask=mask.long(), position_ids=hf_pos).logits
    got = m(ids, attention_mask=mask)
    torch.testing.assert_close(got[mask], expected[mask], rtol=0, atol=1e-5)


def test_an_all_true_mask_is_the_unmasked_model():
    m = ours(dtype=torch.float64)
    x = torch.randint(0, CFG.vocab_size, (3, 20), generator=torch.Generator().manual_seed(4))
    ones = torch.ones_like(x)  # 0/1 integers are accepted too
    assert_close(m(x, attention_mask=ones), m(x))
    cache_a, cache_b = m.init_cache(3), m.init_cache(3)
    a = [m(x[:, :8], cache=cache_a, attention_mask=ones[:, :8])]
    b = [m(x[:, :8], cache=cache_b)]
    for t in range(8, 20):
        a.append(m(x[:, t : t + 1], cache=cache_a, attention_mask=ones[:, : t + 1]))
        b.append(m(x[:, t : t + 1], cache=cache_b))
    assert_close(torch.cat(a, dim=1), torch.cat(b, dim=1))


def test_padded_self_attention_equals_the_causal_one_under_a_causal_mask():
    m = ours(dtype=torch.float64)
    attn = m.blocks[0].attn
    h = torch.randn(2, 9, CFG.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 1, 9, 9, dtype=torch.bool).tril()
    assert_close(gpt.padded_self_attention(attn, h, mask), gpt.causal_self_attention(attn, h))
    with pytest.raises(ValueError, match=r"mask must be boolean \(2, 1, 9, 9\)"):
        gpt.padded_self_attention(attn, h, mask[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fully_masked_queries_give_out_proj_bias_and_finite_logits(dtype):
    """Documented: a query that sees no key gets a zero attention output (then out_proj's bias);
    a row without any real token still gets finite logits."""
    m = ours(dtype=dtype)
    attn = m.blocks[0].attn
    h = torch.randn(1, 4, CFG.d_model, dtype=dtype)
    mask = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    mask[0, 0, 2:, 2:] = True  # queries 0 and 1 (leading padding) see nothing
    out = gpt.padded_self_attention(attn, h, mask)
    assert torch.equal(out[0, :2], attn.out_proj.bias.expand(2, -1))
    assert torch.isfinite(out).all()
    ids = torch.randint(0, CFG.vocab_size, (2, 6))
    no_token = torch.tensor([[False] * 6, [False, False, True, True, True, True]])
    logits = m(ids, attention_mask=no_token)
    assert torch.isfinite(logits).all()
    cache = m.init_cache(2)
    assert torch.isfinite(m(ids, cache=cache, attention_mask=no_token)).all()


def test_positions_that_count_the_padding_change_the_logits():
    """Why positions must skip the padding: the same real tokens at shifted positions predict differently."""
    m = ours(dtype=torch.float64)
    p = prompts_of((4,))[0]
    ids, mask = decoding.left_pad([p, torch.cat([p, p])], pad_id=0)  # row 0: 4 pads, then p
    right = m(ids, attention_mask=mask)[0, -4:]
    shifted = m(ids, attention_mask=mask, position_ids=torch.arange(8).expand(2, -1))[0, -4:]
    assert_close(right, m(p[None])[0])
    assert not torch.allclose(shifted, right)


def test_bad_masks_and_positions_are_named():
    m = ours()
    x = torch.randint(0, CFG.vocab_size, (2, 5))
    with pytest.raises(ValueError, match=r"attention_mask must be .* \(2, 5\), got torch.bool \(2, 4\)"):
        m(x, attention_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention_mask must be boolean or 0/1 integers"):
        m(x, attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="only 0 .padding. and 1"):
        m(x, attention_mask=torch.full((2, 5), 2))
    cache = m.init_cache(2)
    m(x, cache=cache)
    with pytest.raises(ValueError, match=r"\(B, cached \+ new\) = \(2, 6\)"):
        m(x[:, :1], cache=cache, attention_mask=torch.ones(2, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"position_ids must be \(2, 5\) torch.long"):
        m(x, position_ids=torch.arange(5))
    with pytest.raises(ValueError, match=r"position_ids must be in \[0, block_size=48\), got 0 .. 48"):
        m(x, position_ids=torch.tensor([[0, 1, 2, 3, 48]] * 2))


# --------------------------------------------------------------------------- generate_batch


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("lengths", MIXES)
def test_batched_greedy_equals_one_by_one(lengths, use_cache):
    m = ours()
    prompts = prompts_of(lengths, seed=6)
    out = decoding.generate_batch(m, prompts, 25, use_cache=use_cache)
    assert len(out) == len(prompts)
    for row, p in zip(out, prompts):
        assert torch.equal(row, alone(m, p, 25, use_cache=use_cache))
        assert row.shape == (p.numel() + 25,)


def test_batched_greedy_with_eos_stops_rows_where_they_stop_alone():
    m = ours()
    prompts = prompts_of((6, 2, 9, 4), seed=7)
    free = [alone(m, p, 25) for p in prompts]
    eos = int(free[1][prompts[1].numel() + 3])  # row 1's 4th new token
    finish = [
        (f[p.numel() :] == eos).nonzero()[0, 0].item() + 1 if (f[p.numel() :] == eos).any() else None
        for f, p in zip(free, prompts)
    ]
    assert len({f for f in finish}) > 1, "the rows should finish at different steps (or not at all)"
    for use_cache in (True, False):
        out = decoding.generate_batch(m, prompts, 25, eos_id=eos, use_cache=use_cache)
        for row, p, n in zip(out, prompts, finish):
            assert torch.equal(row, alone(m, p, 25, eos_id=eos, use_cache=use_cache))
            assert row.numel() == p.numel() + (25 if n is None else n)


def test_batch_stops_once_every_row_has_finished():
    """A model that always predicts token 0: with eos 0 every row ends after one token."""
    m = ours()
    with torch.no_grad():
        m.norm.bias.zero_()
        m.norm.weight.zero_()
        m.norm.bias[0] = 1.0
        m.tok_emb.weight[0] = 10.0  # logits = tok_emb @ norm(x) = 10 for token 0, 0 for others
    calls = []
    m.register_forward_hook(lambda *_: calls.append(1))
    out = decoding.generate_batch(m, prompts_of((3, 5)), 20, eos_id=0)
    assert [r.numel() for r in out] == [4, 6] and all(r[-1] == 0 for r in out)
    assert len(calls) == 1  # one step, not 20


def test_uncached_batches_crop_past_the_block_like_one_by_one():
    m = ours(replace(CFG, block_size=16))
    prompts = prompts_of((10, 3, 14), seed=8)
    out = decoding.generate_batch(m, prompts, 30, use_cache=False)
    for row, p in zip(out, prompts):
        assert torch.equal(row, alone(m, p, 30, use_cache=False))
    with pytest.raises(
        ValueError, match=r"longest prompt \(14\) \+ max_new_tokens \(30\) exceed block_size=16"
    ):
        decoding.generate_batch(m, prompts, 30)


@pytest.mark.parametrize(
    "kwargs", [dict(temperature=1.0), dict(temperature=0.8, top_k=8), dict(temperature=1.2, top_p=0.9)]
)
@pytest.mark.parametrize("use_cache", [True, False])
def test_sampling_with_one_generator_per_row_equals_one_by_one(kwargs, use_cache):
    m = ours()
    prompts = prompts_of((5, 1, 8, 3), seed=9)
    free = alone(
        m, prompts[0], 30, generator=torch.Generator().manual_seed(100), use_cache=use_cache, **kwargs
    )
    eos = int(free[prompts[0].numel() + 4])  # row 0 stops by its 5th new token
    gens = [torch.Generator().manual_seed(100 + i) for i in range(len(prompts))]
    out = decoding.generate_batch(m, prompts, 30, generator=gens, eos_id=eos, use_cache=use_cache, **kwargs)
    for i, (row, p) in enumerate(zip(out, prompts)):
        g = torch.Generator().manual_seed(100 + i)
        assert torch.equal(row, alone(m, p, 30, generator=g, eos_id=eos, use_cache=use_cache, **kwargs))
        assert torch.equal(gens[i].get_state(), g.get_state())  # the same draws, no more
    assert out[0].numel() <= prompts[0].numel() + 5  # row 0 stopped early


def test_one_shared_generator_is_generate_for_one_prompt_and_seeded_for_many():
    m = ours()
    prompts = prompts_of((6, 2), seed=10)
    one = decoding.generate_batch(
        m, prompts[:1], 20, temperature=1.0, generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(
        one[0], alone(m, prompts[0], 20, temperature=1.0, generator=torch.Generator().manual_seed(1))
    )
    a = decoding.generate_batch(m, prompts, 20, temperature=1.0, generator=torch.Generator().manual_seed(2))
    b = decoding.generate_batch(m, prompts, 20, temperature=1.0, generator=torch.Generator().manual_seed(2))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="explicit torch.Generator"):
        decoding.generate_batch(m, prompts, 5, temperature=1.0)


def test_logits_processors_see_each_row_without_its_padding():
    m = ours()
    prompts = prompts_of((6, 2, 9), seed=11, V=12)  # few distinct tokens: repeats to penalise
    processors = [
        partial(decoding.repetition_penalty, penalty=1.5),
        partial(decoding.no_repeat_ngram_filter, n=3),
    ]
    out = decoding.generate_batch(m, prompts, 20, logits_processors=processors, pad_id=5)
    for row, p in zip(out, prompts):
        assert torch.equal(row, alone(m, p, 20, logits_processors=processors))


def test_the_pad_id_does_not_change_the_result():
    m = ours()
    prompts = prompts_of((7, 1, 4), seed=12)
    ref = decoding.generate_batch(m, prompts, 15, pad_id=0)
    for pad_id in (1, 17, CFG.vocab_size - 1):
        got = decoding.generate_batch(m, prompts, 15, pad_id=pad_id)
        assert all(torch.equal(x, y) for x, y in zip(got, ref))


@pytest.mark.parametrize("with_eos", [False, True])
def test_batched_greedy_equals_hf_generate_with_left_padding(with_eos):
    m = ours(replace(CFG, block_size=64))
    hf = hf_from(m)
    prompts = prompts_of((9, 3, 14, 1, 6), seed=13)
    n = 30
    eos = int(alone(m, prompts[1], n)[prompts[1].numel() + 5]) if with_eos else None
    pad_id = 0
    ids, mask = decoding.left_pad(prompts, pad_id)
    expected = hf.generate(
        ids,
        attention_mask=mask.long(),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=pad_id,
        **({} if with_eos else dict(min_new_tokens=n)),
    )
    out = decoding.generate_batch(m, prompts, n, eos_id=eos, pad_id=pad_id)
    T0 = ids.shape[1]
    stopped = 0
    for row, p, hf_row in zip(out, prompts, expected):
        hf_row = hf_row[T0 - p.numel() :]  # strip the left padding
        new = hf_row[p.numel() :]
        if eos is not None and (new == eos).any():
            stopped += 1
            hf_row = hf_row[: p.numel() + (new == eos).nonzero()[0, 0].item() + 1]  # HF pads after EOS
        assert torch.equal(row, hf_row)
    assert stopped >= (1 if with_eos else 0)


def test_generate_batch_bad_inputs_and_mode():
    m = ours().train()
    prompts = prompts_of((3, 2))
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        decoding.generate_batch(m, prompts, -1)
    with pytest.raises(ValueError, match="a list of 2"):
        decoding.generate_batch(m, prompts, 5, temperature=1.0, generator=[torch.Generator()])
    with pytest.raises(ValueError, match="a list of 2"):
        decoding.generate_batch(m, prompts, 5, temperature=1.0, generator=[torch.Generator(), 3])
    with pytest.raises(ValueError, match="prompt 0"):
        decoding.generate_batch(m, [torch.zeros(0, dtype=torch.long)], 5)
    out = decoding.generate_batch(m, prompts, 0)
    assert all(torch.equal(r, p) for r, p in zip(out, prompts))
    assert m.training  # the mode is restored
