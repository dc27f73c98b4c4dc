"""coursekit.gpt against Hugging Face GPT-2 (tiny random configs, no download) and true properties."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
import torch

from coursekit import decoding, gpt
from coursekit.multihead import MultiHeadAttention
from tests.conftest import assert_close, randomise

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

CFG = gpt.GPTConfig(vocab_size=61, block_size=40, n_layers=2, n_heads=4, d_model=32)


def ours(cfg=CFG, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return randomise(gpt.GPT(cfg), seed).to(dtype).eval()


def hf_from(model: gpt.GPT) -> GPT2LMHeadModel:
    hf = GPT2LMHeadModel(GPT2Config(**gpt.hf_config_kwargs(model.cfg))).to(model.tok_emb.weight.dtype).eval()
    hf.load_state_dict(gpt.to_hf_state_dict(model.state_dict()))
    return hf


def tokens(B, T, V=CFG.vocab_size, seed=0):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- Hugging Face parity


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu"])
def test_logits_equal_hf_gpt2_through_our_mapping(activation):
    m = ours(replace(CFG, activation=activation))
    hf = hf_from(m)
    x = tokens(3, 17)
    torch.testing.assert_close(m(x), hf(x).logits, rtol=0, atol=1e-5)


def test_hf_weights_load_into_ours():
    torch.manual_seed(1)
    hf = randomise(GPT2LMHeadModel(GPT2Config(**gpt.hf_config_kwargs(CFG))), seed=1).eval()
    m = gpt.GPT(gpt.config_from_hf(hf.config)).eval()
    m.load_state_dict(gpt.from_hf_state_dict(hf.state_dict()))
    x = tokens(2, 11, seed=1)
    torch.testing.assert_close(m(x), hf(x).logits, rtol=0, atol=1e-5)
    assert m.lm_head.weight is m.tok_emb.weight


def test_mapping_round_trips_and_transposes_conv1d():
    m = ours()
    sd = m.state_dict()
    hf_sd = gpt.to_hf_state_dict(sd)
    assert hf_sd["transformer.h.0.attn.c_attn.weight"].shape == (
        CFG.d_model,
        3 * CFG.d_model,
    )  # Conv1D: (in, out)
    assert torch.equal(hf_sd["transformer.h.1.mlp.c_proj.weight"], sd["blocks.1.ff.linear2.weight"].t())
    back = gpt.from_hf_state_dict(hf_sd)
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)


def test_greedy_generation_identical_to_hf_generate():
    m = ours(replace(CFG, block_size=64))
    hf = hf_from(m)
    prompt = tokens(2, 5, seed=3)
    expected = hf.generate(
        prompt, max_new_tokens=30, min_new_tokens=30, do_sample=False, attention_mask=torch.ones_like(prompt)
    )
    assert torch.equal(decoding.generate(m, prompt, 30), expected)
    assert torch.equal(decoding.generate(m, prompt, 30, use_cache=False), expected)


def test_causal_lm_loss_equals_hf_loss_with_labels():
    m = ours()
    hf = hf_from(m)
    x = tokens(3, 12, seed=4)
    labels = x.clone()
    labels[0, 5:] = -100  # ignored positions are ignored the same way
    torch.testing.assert_close(
        gpt.causal_lm_loss(m(x), labels), hf(x, labels=labels).loss, rtol=1e-6, atol=1e-6
    )


def test_from_hf_rejects_unknown_names_and_untied_head():
    hf_sd = gpt.to_hf_state_dict(ours().state_dict())
    with pytest.raises(KeyError, match="transformer.h.0.attn.rotary"):
        gpt.from_hf_state_dict({**hf_sd, "transformer.h.0.attn.rotary": torch.zeros(1)})
    with pytest.raises(ValueError, match="ties them"):
        gpt.from_hf_state_dict({**hf_sd, "lm_head.weight": torch.zeros_like(hf_sd["lm_head.weight"])})
    sd = gpt.from_hf_state_dict(
        {**hf_sd, "transformer.h.0.attn.bias": torch.ones(1, 1, 4, 4)}
    )  # old mask buffer
    assert "blocks.0.attn.bias" not in sd


@pytest.mark.parametrize("name", ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"])
def test_parameter_counts_match_hf_on_meta(name):
    cfg = gpt.GPT_PRESETS[name]
    with torch.device("meta"):
        hf = GPT2LMHeadModel(GPT2Config(**gpt.hf_config_kwargs(cfg)))
        m = gpt.GPT(cfg)
    n_hf = sum(p.numel() for p in hf.parameters())
    assert sum(p.numel() for p in m.parameters()) == n_hf == gpt.gpt_param_count(cfg)


def test_gpt3_is_175b_and_bias_free_counts():
    assert abs(gpt.gpt_param_count(gpt.GPT_PRESETS["gpt3"]) / 175e9 - 1) < 0.005
    cfg = replace(CFG, bias=False)
    assert sum(p.numel() for p in gpt.GPT(cfg).parameters()) == gpt.gpt_param_count(cfg)


# --------------------------------------------------------------------------- built from chapters 2-4


def test_causal_self_attention_equals_chapter2_module():
    torch.manual_seed(0)
    attn = randomise(MultiHeadAttention(CFG.d_model, CFG.n_heads)).double().eval()
    x = torch.randn(2, 9, CFG.d_model, dtype=torch.float64)
    assert_close(gpt.causal_self_attention(attn, x), attn(x, is_causal=True)[0])


def test_output_layer_is_tied_and_init_scales_residual_projections():
    m = gpt.GPT(replace(CFG, n_layers=8, d_model=64, n_heads=4))
    assert m.lm_head.weight is m.tok_emb.weight
    std_out = m.blocks[0].attn.out_proj.weight.std().item()
    std_in = m.blocks[0].attn.qkv_proj.weight.std().item()
    assert abs(std_in - 0.02) < 0.002 and abs(std_out - 0.02 / 4) < 0.001  # 1 / sqrt(2 L) = 1/4


def test_changing_future_tokens_leaves_earlier_logits_unchanged():
    m = ours(dtype=torch.float64)
    x = tokens(2, 20)
    y = x.clone()
    y[:, 12:] = tokens(2, 8, seed=9)
    assert_close(m(y)[:, :12], m(x)[:, :12])
    assert not torch.allclose(m(y)[:, 12:], m(x)[:, 12:])


# --------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_cached_decoding_gives_the_uncached_logits(dtype, atol):
    m = ours(dtype=dtype)
    seq = tokens(2, 30, seed=5)
    full = m(seq)  # (B, 30, V)
    cache = m.init_cache(2)
    steps = [m(seq[:, :6], cache=cache)]  # a prompt of 6, then one token at a time
    for t in range(6, 30):
        steps.append(m(seq[:, t : t + 1], cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=atol)
    assert cache.length == 30


def test_cache_extended_by_chunks_uses_a_bottom_right_causal_mask():
    m = ours(dtype=torch.float64)
    seq = tokens(1, 24, seed=6)
    cache = m.init_cache(1)
    chunks = [m(seq[:, a:b], cache=cache) for a, b in ((0, 5), (5, 13), (13, 24))]
    assert_close(torch.cat(chunks, dim=1), m(seq))


def test_cache_positions_continue_after_the_cached_tokens():
    m = ours(dtype=torch.float64)
    seq = tokens(1, 8, seed=7)
    cache = m.init_cache(1)
    m(seq[:, :7], cache=cache)
    last = m(seq[:, 7:], cache=cache)
    fresh = m(seq[:, 7:])  # the same token at position 0, with no past: a different prediction
    assert_close(last[:, 0], m(seq)[:, 7])
    assert not torch.allclose(last, fresh)


def test_cache_size_and_overflow_errors():
    m = ours()
    cache = m.init_cache(3, max_len=10)
    layer = cache.layers[0]
    assert cache.nbytes() == 2 * CFG.n_layers * 3 * CFG.n_heads * 10 * CFG.d_head * 4
    m(tokens(3, 10), cache=cache)
    with pytest.raises(ValueError, match="10 positions; 10 are used and 1 more do not fit"):
        m(tokens(3, 1), cache=cache)
    with pytest.raises(ValueError, match="max_len must be in"):
        m.init_cache(1, max_len=CFG.block_size + 1)
    with pytest.raises(ValueError, match="expected k and v of shape"):
        layer.update(torch.zeros(3, CFG.n_heads, 1, 3), torch.zeros(3, CFG.n_heads, 1, 3))


def test_bad_inputs_are_named():
    m = ours()
    with pytest.raises(ValueError, match="exceed block_size=40"):
        m(tokens(1, 41))
    with pytest.raises(ValueError, match=r"torch.long token ids"):
        m(torch.zeros(1, 3))
    with pytest.raises(TypeError, match="GPTConfig"):
        gpt.GPT({"vocab_size": 3})
    with pytest.raises(ValueError, match="n_heads=3 must divide d_model=32"):
        replace(CFG, n_heads=3)
    with pytest.raises(ValueError, match="activation"):
        replace(CFG, activation="relu")
    with pytest.raises(ValueError, match="at least 2 tokens"):
        gpt.causal_lm_loss(torch.zeros(1, 1, 5), torch.zeros(1, 1, dtype=torch.long))


def test_causal_lm_loss_pairs_each_position_with_the_next_token():
    logits = torch.full((1, 3, 4), -1e9)
    logits[0, 0, 2] = logits[0, 1, 3] = 0.0  # position 0 predicts token 2, position 1 token 3
    ids = torch.tensor([[1, 2, 3]])
    assert gpt.causal_lm_loss(logits, ids).item() == pytest.approx(0.0, abs=1e-6)
    assert gpt.causal_lm_loss(logits, torch.tensor([[2, 3, 0]])).item() > 1e8  # unshifted targets are wrong


# --------------------------------------------------------------------------- perplexity and baselines


@pytest.mark.parametrize("n_ids,block", [(12, 16), (17, 16), (50, 16), (41, 7)])
def test_perplexity_is_hf_loss_exponentiated(n_ids, block):
    """Hugging Face's mean loss (its own shift) on each window of ``block + 1`` ids overlapping by one,
    weighted by the window's predictions, exponentiated: one window when ``n_ids <= block + 1``."""
    m = ours()
    hf = hf_from(m)
    ids = tokens(1, n_ids, seed=11)[0]
    total, count = 0.0, 0
    for start in range(0, n_ids - 1, block):
        window = ids[start : start + block + 1][None]  # (1, t + 1)
        with torch.no_grad():
            loss = hf(window, labels=window).loss.double().item()
        total, count = total + loss * (window.shape[1] - 1), count + window.shape[1] - 1
    assert count == n_ids - 1
    expected = math.exp(total / count)
    assert gpt.perplexity(m, ids, block) == pytest.approx(expected, rel=1e-5)
    assert gpt.perplexity(m, ids, block) == pytest.approx(2 ** gpt.bits_per_char(m, ids, block), rel=1e-12)


def test_a_model_that_knows_nothing_has_perplexity_v():
    V = 37
    uniform = lambda idx: torch.zeros(*idx.shape, V)  # noqa: E731
    ids = tokens(1, 30, V=V)[0]
    assert gpt.perplexity(uniform, ids, 8) == pytest.approx(V, rel=1e-12)
    assert gpt.unigram_loss(ids, ids, V, add=0.0) <= math.log(V)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        gpt.perplexity(uniform, ids[:1], 8)


def test_unigram_loss_worked_example_and_independent_count():
    assert gpt.unigram_loss(torch.tensor([0, 0, 1]), torch.tensor([0, 1]), 3, add=0.0) == pytest.approx(
        -(math.log(2 / 3) + math.log(1 / 3)) / 2
    )
    fit, text, V, add = tokens(1, 200, V=9, seed=12)[0], tokens(1, 50, V=11, seed=13)[0], 11, 0.5
    counts = Counter(fit.tolist())
    expected = -sum(math.log((counts[x] + add) / (len(fit) + add * V)) for x in text.tolist()) / len(text)
    assert gpt.unigram_loss(fit, text, V, add) == pytest.approx(expected, rel=1e-12)  # ids 9, 10 unseen
    assert gpt.unigram_loss(fit, text, V, add=0.0) == math.inf  # unseen without smoothing: impossible
    freqs = torch.tensor([counts[x] for x in sorted(counts)], dtype=torch.float64) / len(fit)
    assert gpt.unigram_loss(fit, fit, 9, add=0.0) == pytest.approx(-(freqs * freqs.log()).sum().item())


def test_unigram_loss_bad_inputs():
    ids = torch.tensor([0, 1, 2])
    for args, match in (
        ((ids, ids, 2), r"ids must lie in \[0, vocab_size=2\)"),
        ((ids.float(), ids, 3), "fit_ids must be 1-D torch.long"),
        ((ids, ids[None], 3), "ids must be 1-D torch.long"),
        ((ids, ids[:0], 3), "at least one token"),
        ((ids, ids, 3, -1.0), "add must be >= 0"),
        ((ids[:0], ids, 3, 0.0), "add must be >= 0"),
    ):
        with pytest.raises(ValueError, match=match):
            gpt.unigram_loss(*args)


# --------------------------------------------------------------------------- packing: one causal block per document


def sorted_doc_ids(B, T, n_docs, seed):
    """``(B, T)`` non-decreasing document ids with up to ``n_docs`` documents per row."""
    raw = torch.randint(0, n_docs, (B, T), generator=torch.Generator().manual_seed(seed))
    return raw.sort(dim=-1).values


def test_document_causal_mask_equals_a_brute_force_loop():
    doc = sorted_doc_ids(3, 17, 4, seed=0)
    mask = gpt.document_causal_mask(doc)
    expected = torch.zeros(3, 17, 17, dtype=torch.bool)
    for b in range(3):
        for i in range(17):
            for j in range(17):
                expected[b, i, j] = j <= i and doc[b, j] == doc[b, i]
    assert mask.dtype == torch.bool and torch.equal(mask, expected)
    assert torch.equal(gpt.document_causal_mask(doc[1]), expected[1])  # one row without a batch axis


def test_document_causal_mask_of_one_document_is_the_causal_mask():
    from coursekit.attention import causal_mask

    assert torch.equal(gpt.document_causal_mask(torch.full((9,), 3)), causal_mask(9))
    assert torch.equal(
        gpt.document_causal_mask(torch.zeros(2, 9, dtype=torch.long)), causal_mask(9).expand(2, 9, 9)
    )


def test_packed_attention_equals_each_document_alone():
    """With the block-diagonal mask, attention over a packed window is each document's own causal attention."""
    torch.manual_seed(0)
    attn = randomise(MultiHeadAttention(CFG.d_model, CFG.n_heads)).double().eval()
    lengths = [5, 1, 7, 3]
    x = torch.randn(1, sum(lengths), CFG.d_model, dtype=torch.float64)  # (1, T, C)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # (T,)
    packed = gpt.padded_self_attention(attn, x, gpt.document_causal_mask(doc)[None, None])  # (1, T, C)
    alone = torch.cat([gpt.causal_self_attention(attn, part) for part in x.split(lengths, dim=1)], dim=1)
    assert_close(packed, alone)
    plain = gpt.causal_self_attention(attn, x)  # without the mask, later documents see the earlier ones
    assert_close(plain[:, : lengths[0]], alone[:, : lengths[0]])
    assert not torch.allclose(plain[:, lengths[0] :], alone[:, lengths[0] :])


def test_document_ids_count_the_end_of_text_tokens_before_each_token():
    E = 9
    assert gpt.document_ids(torch.tensor([1, 2, E, 3, E, 4]), E).tolist() == [0, 0, 0, 1, 1, 2]
    ids = torch.randint(0, 4, (2, 30), generator=torch.Generator().manual_seed(1))  # E = 0 is frequent
    expected = [[sum(int(v == 0) for v in row[:t]) for t in range(len(row))] for row in ids.tolist()]
    assert gpt.document_ids(ids, 0).tolist() == expected
    assert gpt.document_causal_mask(gpt.document_ids(ids, 0)).shape == (2, 30, 30)


def test_packing_bad_inputs_are_named():
    with pytest.raises(ValueError, match="non-decreasing"):
        gpt.document_causal_mask(torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="integer ids"):
        gpt.document_causal_mask(torch.zeros(4))
    with pytest.raises(ValueError, match="integer token ids"):
        gpt.document_ids(torch.tensor(3), 3)


# --------------------------------------------------------------------------- direct preference optimization


def answer_batch(B=3, T=12, seed=0):
    """Token ids ``(B, T)`` and an answer mask marking a different stretch of each row."""
    ids = tokens(B, T, seed=seed)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b, (start, end) in enumerate([(4, 12), (2, 9), (7, 8)][:B]):
        mask[b, start:end] = True
    return ids, mask


def test_sequence_log_prob_equals_a_float64_brute_force():
    """Each answer token scored by a separate forward pass over its prefix alone, summed in Python."""
    m = ours(dtype=torch.float64)
    ids, mask = answer_batch()
    expected = []
    with torch.no_grad():
        for b in range(ids.shape[0]):
            total = 0.0
            for t in range(1, ids.shape[1]):
                if mask[b, t]:
                    logits = m(ids[b : b + 1, :t])[0, -1]  # (V,): the next token after ids[b, :t]
                    total += torch.log_softmax(logits, dim=-1)[ids[b, t]].item()
            expected.append(total)
        got = gpt.sequence_log_prob(m, ids, mask)
    assert got.dtype == torch.float64 and got.shape == (3,)
    assert_close(got, torch.tensor(expected, dtype=torch.float64))


def test_sequence_log_prob_sums_over_the_answer_tokens_only():
    ids, mask = answer_batch()
    logits = torch.randn(
        3, 12, CFG.vocab_size, generator=torch.Generator().manual_seed(2), dtype=torch.float64
    )
    base = gpt.sequence_log_prob(lambda idx: logits, ids, mask)
    outside = logits.clone()
    outside[0, 2] += 5.0  # position 2 scores token 3, a prompt token of row 0
    outside[:, -1] += 5.0  # the last position scores no token at all
    assert torch.equal(gpt.sequence_log_prob(lambda idx: outside, ids, mask), base)
    inside = logits.clone()
    inside[0, 3, ids[0, 4]] += 5.0  # position 3 scores token 4, the first answer token of row 0
    changed = gpt.sequence_log_prob(lambda idx: inside, ids, mask)
    assert changed[0] > base[0] and torch.equal(changed[1:], base[1:])


def test_dpo_loss_equals_a_float64_brute_force():
    g = torch.Generator().manual_seed(3)
    pc, pr, rc, rr = (-20 * torch.rand(5, generator=g, dtype=torch.float64) for _ in range(4))
    beta = 0.3
    loss, chosen, rejected = gpt.dpo_loss(pc, pr, rc, rr, beta=beta)
    margins = [
        beta * ((a - c) - (b - d)) for a, b, c, d in zip(pc.tolist(), pr.tolist(), rc.tolist(), rr.tolist())
    ]
    expected = sum(math.log(1 + math.exp(-z)) for z in margins) / len(margins)  # -log sigmoid(z)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert_close(chosen, beta * (pc - rc))
    assert_close(rejected, beta * (pr - rr))
    assert not chosen.requires_grad
    big = torch.tensor([1e4], dtype=torch.float64)  # stable far from zero: no overflow to inf or nan
    assert gpt.dpo_loss(-big, big, big, -big, beta=beta)[0].item() == pytest.approx(2 * beta * 2e4, rel=1e-12)
    assert gpt.dpo_loss(big, -big, -big, big, beta=beta)[0].item() == 0.0


def test_dpo_loss_is_log_2_when_the_policy_is_the_reference():
    m = ours(dtype=torch.float64)
    chosen_ids, chosen_mask = answer_batch(seed=4)
    rejected_ids, rejected_mask = answer_batch(seed=5)
    pc = gpt.sequence_log_prob(m, chosen_ids, chosen_mask)
    pr = gpt.sequence_log_prob(m, rejected_ids, rejected_mask)
    loss, chosen, rejected = gpt.dpo_loss(pc, pr, pc.detach(), pr.detach(), beta=0.5)
    assert loss.item() == pytest.approx(math.log(2), rel=1e-12)
    assert chosen.abs().max().item() == 0.0 and rejected.abs().max().item() == 0.0


def test_dpo_gradient_raises_the_chosen_answer_relative_to_the_rejected_one():
    import copy

    policy = ours(dtype=torch.float64)
    reference = copy.deepcopy(policy).requires_grad_(False)
    chosen_ids, chosen_mask = answer_batch(seed=6)
    rejected_ids, rejected_mask = answer_batch(seed=7)
    beta = 0.2
    with torch.no_grad():
        rc = gpt.sequence_log_prob(reference, chosen_ids, chosen_mask)
        rr = gpt.sequence_log_prob(reference, rejected_ids, rejected_mask)

    def forward():
        pc = gpt.sequence_log_prob(policy, chosen_ids, chosen_mask)
        pr = gpt.sequence_log_prob(policy, rejected_ids, rejected_mask)
        return pc, pr, gpt.dpo_loss(pc, pr, rc, rr, beta=beta)

    pc, pr, (loss, chosen, rejected) = forward()
    pc.retain_grad()
    pr.retain_grad()
    loss.backward()
    # the closed form: d loss / d log pi(y_w) = -beta sigmoid(r_l - r_w) / B, the opposite for y_l
    weight = beta * torch.sigmoid(rejected - chosen) / len(chosen)
    assert_close(pc.grad, -weight)
    assert_close(pr.grad, weight)
    margin_before = (chosen - rejected).sum().item()
    with torch.no_grad():
        for p in policy.parameters():
            p -= 0.1 * p.grad  # one step of plain SGD
    _, _, (loss_after, chosen_after, rejected_after) = forward()
    assert (chosen_after - rejected_after).sum().item() > margin_before
    assert loss_after.item() < loss.item()


def test_dpo_bad_inputs_are_named():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="one shape and dtype"):
        gpt.dpo_loss(x, x, x, torch.zeros(2))
    with pytest.raises(ValueError, match="one shape and dtype"):
        gpt.dpo_loss(x, x, x, x.double())
    with pytest.raises(ValueError, match="1-D floating"):
        gpt.dpo_loss(*(torch.zeros(3, dtype=torch.long),) * 4)
    with pytest.raises(ValueError, match="1-D floating"):
        gpt.dpo_loss(*(torch.zeros(0),) * 4)
    for beta in (0.0, -1.0, math.inf, math.nan, True):
        with pytest.raises(ValueError, match="beta must be"):
            gpt.dpo_loss(x, x, x, x, beta=beta)
    m = ours()
    ids, mask = answer_batch()
    for args, match in (
        ((ids.float(), mask), r"\(B, T\) torch.long"),
        ((ids[:, :1], mask[:, :1]), "T >= 2"),
        ((ids, mask.long()), "answer_mask must be boolean"),
        ((ids, mask[:, :5]), "answer_mask must be boolean"),
        ((ids, mask | (torch.arange(12) == 0)), "marks position 0"),
        ((ids, mask & (torch.arange(3) != 2)[:, None]), "at least one answer token"),
    ):
        with pytest.raises(ValueError, match=match):
            gpt.sequence_log_prob(m, *args)
    with pytest.raises(ValueError, match=r"must return logits \(B, T, V\)"):
        gpt.sequence_log_prob(lambda idx: torch.zeros(3, 12), ids, mask)
