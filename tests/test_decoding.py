"""coursekit.decoding: filters and logits processors against Hugging Face's, sampling frequencies by a
chi-square test, generation with and without the cache, and beam search on constructed models."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import decoding, gpt

stats = pytest.importorskip("scipy.stats")
logits_process = pytest.importorskip("transformers.generation.logits_process")


def rand_logits(B=4, V=50, seed=0, scale=2.0):
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed)) * scale


# --------------------------------------------------------------------------- filters


@pytest.mark.parametrize("k", [1, 3, 10, 50, 80])
def test_top_k_equals_hf_warper(k):
    logits = rand_logits()
    expected = logits_process.TopKLogitsWarper(k)(None, logits.clone())
    assert torch.equal(decoding.top_k_filter(logits, k), expected)


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.99, 1.0])
def test_top_p_equals_hf_warper(p):
    logits = rand_logits(seed=1)
    expected = logits_process.TopPLogitsWarper(p)(None, logits.clone())
    assert torch.equal(decoding.top_p_filter(logits, p), expected)


def test_top_p_keeps_the_token_that_crosses_p():
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    kept = decoding.top_p_filter(logits, 0.6).isfinite()
    assert kept.tolist() == [[True, True, False]]  # 0.5 < 0.6, so the 0.3 that crosses it stays
    assert decoding.top_p_filter(logits, 0.5).isfinite().tolist() == [[True, False, False]]  # 0.5 reaches it
    assert decoding.top_p_filter(logits, 0.01).isfinite().sum() == 1  # the top token always survives


def test_top_k_keeps_ties_and_rejects_bad_k():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0]])
    assert decoding.top_k_filter(logits, 1).isfinite().tolist() == [[False, True, True, False]]
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match="k must be a positive integer"):
            decoding.top_k_filter(logits, bad)
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\]"):
        decoding.top_p_filter(logits, 0.0)


@pytest.mark.parametrize("p_base", [0.0, 0.05, 0.2, 0.5, 0.9, 1.0])
def test_min_p_equals_hf_warper(p_base):
    logits = rand_logits(seed=4).double()
    expected = logits_process.MinPLogitsWarper(p_base)(None, logits.clone())
    assert torch.equal(decoding.min_p_filter(logits, p_base), expected)


# --------------------------------------------------------------------------- logits processors


def rand_ids(B=4, T=30, V=6, seed=0):
    """Ids from a few tokens only, so that tokens and n-grams repeat."""
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.2, 2.0])
@pytest.mark.parametrize("T", [0, 1, 7, 30])
def test_repetition_penalty_equals_hf_processor(penalty, T):
    for seed in range(3):
        logits = rand_logits(V=12, seed=seed).double()  # (4, 12), both signs
        ids = rand_ids(T=T, V=12, seed=seed)
        expected = logits_process.RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
        got = decoding.repetition_penalty(logits, ids, penalty)
        assert torch.equal(got, expected)
        changed = (got != logits).any(dim=-1)
        assert changed.tolist() == [penalty != 1.0 and T > 0] * 4  # only a real penalty on seen ids acts


def test_repetition_penalty_worked_example_and_errors():
    logits = torch.tensor([[2.0, -1.0, 0.5]])
    assert decoding.repetition_penalty(logits, torch.tensor([[0, 1, 0]]), 2.0).tolist() == [[1.0, -2.0, 0.5]]
    assert logits.tolist() == [[2.0, -1.0, 0.5]]  # not changed in place
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="penalty must be a finite number > 0"):
            decoding.repetition_penalty(logits, torch.tensor([[0]]), bad)
    with pytest.raises(ValueError, match=r"expected logits \(B, V\) and prev_ids \(B, T\)"):
        decoding.repetition_penalty(logits, torch.tensor([[0], [1]]), 1.2)
    with pytest.raises(ValueError, match="torch.long"):
        decoding.repetition_penalty(logits, torch.tensor([[0.0]]), 1.2)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("T", [0, 2, 3, 30])
def test_no_repeat_ngram_equals_hf_processor(n, T):
    banned_any = False
    for seed in range(3):
        logits = rand_logits(V=12, seed=seed).double()
        ids = rand_ids(T=T, V=4, seed=seed)  # 4 tokens in 30 ids: n-grams repeat
        expected = logits_process.NoRepeatNGramLogitsProcessor(n)(ids, logits.clone())
        got = decoding.no_repeat_ngram_filter(logits, ids, n)
        assert torch.equal(got, expected)
        banned_any |= bool(got.isinf().any())
    if T < n:
        assert not banned_any  # with fewer than n ids there is no n-gram to repeat
    elif T == 30:
        assert banned_any  # 30 ids of 4 tokens: some n-gram's start recurs at the end


def test_no_repeat_ngram_worked_example_and_errors():
    logits = torch.zeros(1, 8)
    got = decoding.no_repeat_ngram_filter(logits, torch.tensor([[5, 7, 5]]), 2)
    assert got.isinf().nonzero()[:, 1].tolist() == [7]
    assert decoding.no_repeat_ngram_filter(logits, torch.tensor([[5, 7, 5]]), 1).isinf().nonzero()[
        :, 1
    ].tolist() == [
        5,
        7,
    ]
    assert not logits.isinf().any()
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="n must be a positive integer"):
            decoding.no_repeat_ngram_filter(logits, torch.tensor([[1]]), bad)


@pytest.mark.usefixtures("one_thread")
def test_generate_with_processors_equals_hf_generate():
    """Greedy decoding with a repetition penalty and 3-gram blocking, against Hugging Face's
    ``generate(repetition_penalty=..., no_repeat_ngram_size=...)`` on identical weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    m = small_gpt(seed=5)
    hf = GPT2LMHeadModel(GPT2Config(**gpt.hf_config_kwargs(m.cfg))).eval()
    hf.load_state_dict(gpt.to_hf_state_dict(m.state_dict()))
    processors = [
        partial(decoding.repetition_penalty, penalty=1.5),
        partial(decoding.no_repeat_ngram_filter, n=3),
    ]
    for seed in range(2):
        prompt = torch.randint(0, 23, (2, 4), generator=torch.Generator().manual_seed(seed))
        expected = hf.generate(
            prompt,
            max_new_tokens=30,
            min_new_tokens=30,
            do_sample=False,
            repetition_penalty=1.5,
            no_repeat_ngram_size=3,
            eos_token_id=None,
            pad_token_id=0,
            attention_mask=torch.ones_like(prompt),
        )
        got = decoding.generate(m, prompt, 30, logits_processors=processors)
        assert torch.equal(got, expected)
        plain = decoding.generate(m, prompt, 30)
        assert not torch.equal(got, plain)  # the processors changed the text
        for row in got.tolist():
            grams = [tuple(row[i : i + 3]) for i in range(len(row) - 2)]
            assert len(grams) == len(set(grams))  # no 3-gram occurs twice


# --------------------------------------------------------------------------- sampling


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, None, None), (0.7, 5, None), (1.3, None, 0.8), (1.0, 6, 0.7)]
)
def test_sampling_frequencies_match_the_filtered_distribution(temperature, top_k, top_p):
    logits = rand_logits(B=1, V=12, seed=2, scale=1.0)
    expected_logits = logits / temperature
    if top_k is not None:
        expected_logits = logits_process.TopKLogitsWarper(top_k)(None, expected_logits)
    if top_p is not None:
        expected_logits = logits_process.TopPLogitsWarper(top_p)(None, expected_logits)
    probs = F.softmax(expected_logits.double(), dim=-1)[0]
    n = 20_000
    g = torch.Generator().manual_seed(3)
    draws = decoding.sample_next(logits.expand(n, -1), g, temperature, top_k, top_p)
    counts = torch.bincount(draws, minlength=12).double()
    support = probs > 0
    assert counts[~support].sum() == 0  # filtered tokens are never drawn
    result = stats.chisquare(counts[support].numpy(), (probs[support] / probs[support].sum() * n).numpy())
    assert result.pvalue > 1e-3, f"frequencies {counts.tolist()} vs expected {(probs * n).tolist()}"


def test_sampling_uses_only_the_given_generator():
    logits = rand_logits(B=8)
    a = decoding.sample_next(logits, torch.Generator().manual_seed(5))
    torch.manual_seed(123)  # the global state does not matter
    b = decoding.sample_next(logits, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="explicit torch.Generator"):
        decoding.sample_next(logits)
    assert torch.equal(decoding.sample_next(logits, temperature=0), logits.argmax(-1))
    with pytest.raises(ValueError, match="temperature"):
        decoding.sample_next(logits, torch.Generator(), temperature=-1)


# --------------------------------------------------------------------------- generate


def small_gpt(seed=0, block_size=48, vocab_size=23):
    torch.manual_seed(seed)
    m = gpt.GPT(
        gpt.GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layers=2, n_heads=2, d_model=16)
    )
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(20)  # peaky predictions, so that sequences differ
    return m.eval()


def test_generate_with_and_without_cache_gives_identical_tokens():
    m = small_gpt()
    prompt = torch.randint(0, 23, (3, 4), generator=torch.Generator().manual_seed(0))
    for kwargs in ({}, {"temperature": 0.9, "top_k": 8}, {"temperature": 1.1, "top_p": 0.9}):
        a = decoding.generate(m, prompt, 40, generator=torch.Generator().manual_seed(1), **kwargs)
        b = decoding.generate(
            m, prompt, 40, generator=torch.Generator().manual_seed(1), use_cache=False, **kwargs
        )
        assert a.shape == (3, 44) and torch.equal(a, b)
        assert torch.equal(a[:, :4], prompt)


def test_generate_without_cache_crops_to_the_block():
    m = small_gpt(block_size=16)
    prompt = torch.zeros(1, 4, dtype=torch.long)
    assert decoding.generate(m, prompt, 30, use_cache=False).shape == (1, 34)
    with pytest.raises(ValueError, match="exceed block_size=16"):
        decoding.generate(m, prompt, 30)


def test_generate_pads_finished_rows_with_eos_and_stops():
    m = small_gpt()
    prompt = torch.randint(0, 23, (4, 3), generator=torch.Generator().manual_seed(2))
    free = decoding.generate(m, prompt, 30)
    eos = int(free[0, 5])  # a token row 0 emits at step 3
    out = decoding.generate(m, prompt, 30, eos_id=eos)
    for row, full in zip(out, free):
        new = full[3:].tolist()
        if eos in new:
            cut = 3 + new.index(eos)
            assert torch.equal(row[: cut + 1], full[: cut + 1]) and (row[cut:] == eos).all()
        else:
            assert torch.equal(row, full[: row.numel()])
    assert out.shape[1] <= free.shape[1]
    assert m.training is False


# --------------------------------------------------------------------------- beam search


class TableLM(nn.Module):
    """A toy language model: the next token's log-probabilities depend on the last token only."""

    @dataclass
    class Cfg:
        block_size: int = 100

    class Cache:
        def __init__(self):
            self.length = 0

        def reorder(self, index):
            pass

    def __init__(self, logp: torch.Tensor):
        super().__init__()
        self.cfg = self.Cfg()
        self.register_buffer("logp", logp)  # (V, V): row = last token

    def init_cache(self, batch_size, max_len=None):
        return self.Cache()

    def forward(self, idx, cache=None):
        if cache is not None:
            cache.length += idx.shape[1]
        return self.logp[idx]  # (B, T, V)


def greedy_trap():
    """From token 0: token 1 is likelier (0.6) than 2 (0.4), but after 1 the best next token
    has 0.4 while after 2 it has 0.9. So greedy picks 1 (0.6 * 0.4 = 0.24), the best pair is 2, 3 (0.36)."""
    p = torch.full((5, 5), 1e-9)
    p[0, 1], p[0, 2] = 0.6, 0.4
    p[1, 3], p[1, 4], p[1, 0] = 0.4, 0.3, 0.3
    p[2, 3], p[2, 4] = 0.9, 0.1
    p[3, 4], p[4, 4] = 1.0, 1.0
    return TableLM((p / p.sum(-1, keepdim=True)).log())


def brute_force_best(model, prompt, n):
    V = model.logp.shape[0]
    best, best_lp = None, -math.inf
    for seq in itertools.product(range(V), repeat=n):
        cont = torch.tensor([seq])
        lp = decoding.sequence_logprob(model, prompt, cont).item()
        if lp > best_lp:
            best, best_lp = cont, lp
    return best, best_lp


def test_beam_search_finds_the_likeliest_sequence_greedy_misses():
    model, prompt = greedy_trap(), torch.tensor([[0]])
    greedy = decoding.generate(model, prompt, 2, use_cache=True)
    best, best_lp = brute_force_best(model, prompt, 2)
    assert greedy[0, 1:].tolist() == [1, 3] and best[0].tolist() == [2, 3]
    tokens, score = decoding.beam_search(model, prompt, 2, beam_width=2, length_penalty=0.0)
    assert tokens[0, 1:].tolist() == [2, 3]
    assert score == pytest.approx(best_lp, abs=1e-5)


def test_beam_width_one_is_greedy_on_a_gpt():
    m = small_gpt(seed=3)
    for seed in range(3):
        prompt = torch.randint(0, 23, (1, 5), generator=torch.Generator().manual_seed(seed))
        tokens, _ = decoding.beam_search(m, prompt, 20, beam_width=1)
        assert torch.equal(tokens, decoding.generate(m, prompt, 20))
        eos = int(decoding.generate(m, prompt, 20)[0, 12])
        tokens, _ = decoding.beam_search(m, prompt, 20, beam_width=1, eos_id=eos, length_penalty=0.0)
        assert torch.equal(tokens, decoding.generate(m, prompt, 20, eos_id=eos))


def test_beam_search_equals_hf_beam_search_without_eos():
    from transformers import GPT2Config, GPT2LMHeadModel

    m = small_gpt(seed=4)
    hf = GPT2LMHeadModel(GPT2Config(**gpt.hf_config_kwargs(m.cfg))).eval()
    hf.load_state_dict(gpt.to_hf_state_dict(m.state_dict()))
    prompt = torch.randint(0, 23, (1, 4), generator=torch.Generator().manual_seed(4))
    expected = hf.generate(
        prompt,
        max_new_tokens=12,
        min_new_tokens=12,
        num_beams=3,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        attention_mask=torch.ones_like(prompt),
    )
    tokens, score = decoding.beam_search(m, prompt, 12, beam_width=3)
    assert torch.equal(tokens, expected)
    assert score == pytest.approx(decoding.sequence_logprob(m, prompt, tokens[:, 4:]).item() / 12, abs=1e-4)


def test_length_normalisation_decides_between_short_and_long_hypotheses():
    """EOS right away has probability 0.4; the path 1, 2, EOS has 0.6 at each step, a lower total
    (0.216) but a higher mean log-probability. With alpha = 0 the short one wins, with alpha = 1 the long one."""
    V, eos = 4, 3
    p = torch.full((V, V), 1e-9)
    p[0, eos], p[0, 1] = 0.4, 0.6
    p[1, 2], p[1, eos] = 0.6, 0.4
    p[2, 2], p[2, eos] = 0.4, 0.6
    model = TableLM((p / p.sum(-1, keepdim=True)).log())
    short, s0 = decoding.beam_search(
        model, torch.tensor([[0]]), 6, beam_width=2, eos_id=eos, length_penalty=0.0
    )
    long, s1 = decoding.beam_search(
        model, torch.tensor([[0]]), 6, beam_width=2, eos_id=eos, length_penalty=1.0
    )
    assert short[0].tolist() == [0, eos] and s0 == pytest.approx(math.log(0.4), abs=1e-6)
    assert long[0].tolist() == [0, 1, 2, eos]
    assert s1 == pytest.approx(math.log(0.6**3) / 3, abs=1e-6)


def test_beam_search_bad_inputs():
    m = small_gpt()
    with pytest.raises(ValueError, match="one prompt of shape"):
        decoding.beam_search(m, torch.zeros(2, 3, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="beam_width"):
        decoding.beam_search(m, torch.zeros(1, 3, dtype=torch.long), 5, beam_width=0)
