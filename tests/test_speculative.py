"""coursekit.speculative: the accept/reject rule emits the target's distribution (chi-square tests
with fixed seeds), greedy speculative decoding equals the target's own greedy decoding, and the
bookkeeping (target passes, accepted drafts) matches an independent simulation."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from coursekit import decoding, gpt
from coursekit.speculative import (
    SpeculativeStats,
    expected_tokens_per_pass,
    first_layers,
    speculative_generate,
    speculative_verify,
)

stats = pytest.importorskip("scipy.stats")
pytestmark = pytest.mark.usefixtures("one_thread")  # decoding is many tiny ops: threads only spin

#: a p-value below this fails a test of "these frequencies follow that distribution"; the seeds are
#: fixed, so each test is deterministic
ALPHA = 1e-4


def nano_gpt(seed: int, vocab_size: int = 23, n_layers: int = 2, scale: float = 8.0) -> gpt.GPT:
    """A float64 random GPT; ``scale`` multiplies the weights so that its predictions are uneven."""
    torch.manual_seed(seed)
    m = gpt.GPT(gpt.GPTConfig(vocab_size=vocab_size, block_size=40, n_layers=n_layers, n_heads=2, d_model=16))
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(scale)
    return m.double().eval()


def chisquare_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness of fit; cells expected below 5 draws are pooled into one."""
    n = counts.sum()
    expected = probs.double() / probs.sum() * n
    small = expected < 5
    obs = torch.cat([counts[~small].double(), counts[small].double().sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    if exp[-1] == 0:
        assert obs[-1] == 0, "draws where the distribution has no mass"
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs.numpy(), exp.numpy()).pvalue)


# --------------------------------------------------------------------------- the formula


def test_expected_tokens_per_pass_is_the_geometric_series():
    for a, k in itertools.product([0.0, 0.3, 0.5, 0.9, 0.99], [0, 1, 3, 8]):
        assert expected_tokens_per_pass(a, k) == pytest.approx(sum(a**i for i in range(k + 1)), rel=1e-12)
    assert expected_tokens_per_pass(0.5, 3) == pytest.approx(1.875)  # the docstring's example
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    with pytest.raises(ValueError, match=r"a must be in \[0, 1\]"):
        expected_tokens_per_pass(1.2, 3)


# --------------------------------------------------------------------------- the draft


@pytest.mark.parametrize("n_layers", [1, 2])
def test_first_layers_is_gpt2_with_fewer_layers(n_layers):
    """Against Hugging Face's GPT-2 built with ``n_layer = n_layers`` from the first blocks' weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    target = nano_gpt(0, n_layers=3)
    draft = first_layers(target, n_layers)
    hf_cfg = GPT2Config(**gpt.hf_config_kwargs(replace(target.cfg, n_layers=n_layers)))
    hf = GPT2LMHeadModel(hf_cfg).double().eval()
    hf_weights = gpt.to_hf_state_dict(target.state_dict())
    kept = {
        k: v
        for k, v in hf_weights.items()
        if not k.startswith("transformer.h.") or int(k.split(".")[2]) < n_layers
    }
    hf.load_state_dict(kept)
    idx = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(draft(idx), hf(idx).logits, rtol=0, atol=1e-10)
        assert not torch.allclose(draft(idx), target(idx))  # the last layers matter
    assert draft.cfg == replace(target.cfg, n_layers=n_layers) and draft.training is False
    assert draft.tok_emb.weight.data_ptr() == target.tok_emb.weight.data_ptr()  # shared, not copied
    assert draft.blocks[0] is target.blocks[0]
    with pytest.raises(ValueError, match=r"n_layers must be an integer in \[1, 3\]"):
        first_layers(target, 4)


# --------------------------------------------------------------------------- the accept/reject rule


def test_verify_emits_the_target_distribution_at_every_position():
    """Each row drafts 2 tokens from q; what the rule emits at positions 1, 2, 3 must follow p_1, p_2,
    p_3 (the third only exists where both drafts were accepted). The first drafted token is accepted
    with probability sum_x min(p_1(x), q_1(x))."""
    B, K, V = 200_000, 2, 6
    g = torch.Generator().manual_seed(0)
    p = F.softmax(torch.randn(K + 1, V, generator=g, dtype=torch.float64) * 1.5, dim=-1)  # (K + 1, V)
    q = F.softmax(torch.randn(K, V, generator=g, dtype=torch.float64) * 1.5, dim=-1)  # (K, V)
    drafted = torch.stack([torch.multinomial(q[i], B, replacement=True, generator=g) for i in range(K)], 1)
    n, nxt = speculative_verify(p.expand(B, -1, -1), q.expand(B, -1, -1), drafted, g)
    assert n.shape == nxt.shape == (B,) and n.dtype == nxt.dtype == torch.long
    assert n.min() >= 0 and n.max() <= K
    emitted = torch.where(torch.arange(K + 1) < n[:, None], F.pad(drafted, (0, 1)), -1)  # (B, K + 1)
    emitted[torch.arange(B), n] = nxt  # accepted drafts, then the rule's own token, then -1
    for i in range(K + 1):
        rows = n >= i  # the rows that emit a token at position i
        counts = torch.bincount(emitted[rows, i], minlength=V)
        assert chisquare_pvalue(counts, p[i]) > ALPHA, f"position {i}: {counts.tolist()} vs {p[i].tolist()}"
        if i < K:  # the test can tell p from q: the draft's own distribution is rejected
            assert chisquare_pvalue(counts, q[i]) < 1e-12
    accept_rate = torch.minimum(p[0], q[0]).sum().item()
    assert stats.binomtest(int((n >= 1).sum()), B, accept_rate).pvalue > ALPHA


def test_verify_never_accepts_a_token_the_target_rules_out():
    """p has no mass on drafted token 0: it is always rejected, and the residual never draws it."""
    p = torch.tensor([[[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]]], dtype=torch.float64).expand(500, -1, -1)
    q = torch.tensor([[[0.9, 0.05, 0.05]]], dtype=torch.float64).expand(500, -1, -1)
    n, nxt = speculative_verify(p, q, torch.zeros(500, 1, dtype=torch.long), torch.Generator().manual_seed(1))
    assert (n == 0).all() and (nxt != 0).all()
    # with q equal to p every draft is accepted, and the last token comes from p's extra position
    n, nxt = speculative_verify(
        p, p[:, :1], torch.ones(500, 1, dtype=torch.long), torch.Generator().manual_seed(2)
    )
    assert (n == 1).all() and set(nxt.tolist()) <= {0, 1, 2}
    with pytest.raises(ValueError, match=r"expected p \(B, k \+ 1, V\)"):
        speculative_verify(p, p, torch.ones(500, 1, dtype=torch.long), torch.Generator())


# --------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_greedy_speculative_decoding_is_the_targets_greedy_decoding(k):
    target = nano_gpt(0)
    drafts = {"other model": nano_gpt(1, n_layers=1), "first layer": first_layers(target, 1)}
    for (name, draft), seed in itertools.product(drafts.items(), range(3)):
        prompt = torch.randint(0, 23, (1, 1 + seed), generator=torch.Generator().manual_seed(seed))
        out, st = speculative_generate(target, draft, prompt, 30, k)
        assert torch.equal(out, decoding.generate(target, prompt, 30)), f"{name}, k={k}, seed={seed}"
        assert st.new_tokens == 30 == st.accepted + st.target_passes


def simulate_greedy_rounds(target, draft, prompt, n_new, k) -> SpeculativeStats:
    """The greedy rounds computed without caches: the draft's greedy continuation of each prefix
    against the target's greedy text, matched token by token."""
    truth = decoding.generate(target, prompt, n_new, use_cache=False)[0].tolist()
    st, t = SpeculativeStats(), prompt.shape[1]
    while t < len(truth):
        K = min(k, len(truth) - t - 1)
        proposal = decoding.generate(draft, torch.tensor([truth[:t]]), K, use_cache=False)[0, t:].tolist()
        n = next((i for i in range(K) if proposal[i] != truth[t + i]), K)
        st.target_passes += 1
        st.draft_passes += K
        st.drafted += K
        st.accepted += n
        st.checked += min(n + 1, K)
        t += n + 1
    st.new_tokens = n_new
    return st


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_bookkeeping_matches_a_simulation_without_caches(k):
    target, draft = nano_gpt(2), nano_gpt(3, n_layers=1, scale=3.0)
    for seed in range(3):
        prompt = torch.randint(0, 23, (1, 3), generator=torch.Generator().manual_seed(seed))
        _, st = speculative_generate(target, draft, prompt, 25, k)
        assert st == simulate_greedy_rounds(target, draft, prompt, 25, k)
        assert 0 <= st.accepted < st.drafted  # some, not all, drafts were accepted: the test has teeth


def test_a_perfect_draft_needs_one_target_pass_per_k_plus_one_tokens():
    """Drafting with the target itself: every draft is accepted, greedy or sampled."""
    target = nano_gpt(4)
    prompt = torch.tensor([[1, 2, 3]])
    for k, temperature in itertools.product([1, 3, 4], [0.0, 1.0]):
        g = torch.Generator().manual_seed(k)
        out, st = speculative_generate(target, target, prompt, 20, k, temperature, g)
        assert out.shape == (1, 23)
        assert st.target_passes == math.ceil(20 / (k + 1))
        assert st.accepted == st.drafted == st.checked == 20 - st.target_passes
        assert st.acceptance_rate == 1.0 and st.tokens_per_target_pass == 20 / st.target_passes


# --------------------------------------------------------------------------- sampling


@pytest.mark.slow
def test_sampled_tokens_follow_the_target_distribution():
    """Slow (5 to 10 s): 3,000 speculative runs of 3 tokens with k = 2, which covers accepting
    both drafts (then the bonus token), rejecting the second and rejecting the first. The
    frequencies of the 64 possible triples must follow the target's own probabilities, computed
    exactly from its logits, and must be told apart from the draft's. (Resampling a rejected
    position from p instead of the residual max(0, p - q) fails this test with a p-value near 1e-89.)"""
    V, n_runs = 4, 3_000
    target, draft = nano_gpt(5, vocab_size=V, scale=4.0), nano_gpt(6, vocab_size=V, n_layers=1, scale=4.0)
    prompt = torch.tensor([[0, 1]])
    triples = torch.tensor(list(itertools.product(range(V), repeat=3)))  # (64, 3)

    def joint(model):
        with torch.no_grad():
            logp = F.log_softmax(model(torch.cat([prompt.expand(len(triples), -1), triples], 1)), -1)
        return logp[:, 1:4].gather(-1, triples[..., None]).squeeze(-1).sum(-1).exp()  # (64,)

    g = torch.Generator().manual_seed(7)
    counts = torch.zeros(len(triples), dtype=torch.long)
    passes = 0
    for _ in range(n_runs):
        out, st = speculative_generate(target, draft, prompt, 3, 2, 1.0, g)
        a, b, c = out[0, 2:].tolist()
        counts[a * V * V + b * V + c] += 1
        passes += st.target_passes
    assert chisquare_pvalue(counts, joint(target)) > ALPHA
    assert chisquare_pvalue(counts, joint(draft)) < 1e-12
    assert n_runs < passes < 3 * n_runs  # some runs needed one pass, others more


def test_sampling_is_reproducible_and_temperature_applies_to_both_models():
    target, draft = nano_gpt(8), nano_gpt(9, n_layers=1)
    prompt = torch.tensor([[4, 5]])
    a, _ = speculative_generate(target, draft, prompt, 15, 3, 0.8, torch.Generator().manual_seed(0))
    torch.manual_seed(123)  # the global state does not matter
    b, _ = speculative_generate(target, draft, prompt, 15, 3, 0.8, torch.Generator().manual_seed(0))
    assert torch.equal(a, b)
    # a temperature near 0 samples the argmax of both: the greedy output
    c, _ = speculative_generate(target, draft, prompt, 15, 3, 1e-6, torch.Generator().manual_seed(0))
    assert torch.equal(c, speculative_generate(target, draft, prompt, 15, 3)[0])


# --------------------------------------------------------------------------- contract


def test_bad_inputs_and_modes():
    target, draft = nano_gpt(0), nano_gpt(1, n_layers=1)
    prompt = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match=r"one sequence \(1, T0\)"):
        speculative_generate(target, draft, prompt.expand(2, -1), 5, 2)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        speculative_generate(target, draft, prompt, 5, 0)
    with pytest.raises(ValueError, match="explicit torch.Generator"):
        speculative_generate(target, draft, prompt, 5, 2, temperature=1.0)
    with pytest.raises(ValueError, match="share a vocabulary"):
        speculative_generate(target, nano_gpt(1, vocab_size=30), prompt, 5, 2)
    with pytest.raises(ValueError, match="exceed the target's block_size=40"):
        speculative_generate(target, draft, prompt, 39, 2)
    out, st = speculative_generate(target, draft, prompt, 0, 2)
    assert torch.equal(out, prompt) and st == SpeculativeStats()
    target.train()
    speculative_generate(target, draft, prompt, 5, 2)
    assert target.training and not draft.training
    shared = first_layers(target.eval(), 1).train()  # a draft in train mode sharing eval-mode blocks
    speculative_generate(target, shared, prompt, 5, 2)
    assert not target.training and not target.blocks[0].training  # the target's mode wins
