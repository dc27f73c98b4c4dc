"""The Exercise 7 graders, tested like code: reference passes, every mutant is caught, the toy
models mean what their docstrings say, and the expected answers do not hang on near-ties."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import attention, decoding, gpt, multihead
from coursekit.grading import GradingFailure
from coursekit.grading import ch07_gpt as grader
from coursekit.grading.core import rand
from tests.mutants.ch07_gpt import MUTANTS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny tensors run on one thread

#: the classes the notebook passes to the graders of parts 4 and 5, besides the student's function
EXTRA = {
    "beam_search": (grader.TableLM, gpt.GPT, gpt.GPTConfig),
    "causal_self_attention": (multihead.MultiHeadAttention, gpt.LayerCache),
}
PUBLIC_EXTRA = {
    "beam_search": (grader.TableLM,),
    "causal_self_attention": (multihead.MultiHeadAttention, gpt.LayerCache),
}

GRADERS = {
    "causal_lm_loss": (grader.grade_causal_lm_loss, gpt),
    "top_k_filter": (grader.grade_top_k_filter, decoding),
    "top_p_filter": (grader.grade_top_p_filter, decoding),
    "beam_search": (grader.grade_beam_search, decoding),
    "causal_self_attention": (grader.grade_causal_self_attention, gpt),
}

PUBLIC = {
    "causal_lm_loss": grader.check_causal_lm_loss,
    "top_k_filter": grader.check_top_k_filter,
    "top_p_filter": grader.check_top_p_filter,
    "beam_search": grader.check_beam_search,
    "causal_self_attention": grader.check_causal_self_attention,
}


def grade(part, fn):
    GRADERS[part][0](fn, *EXTRA.get(part, ()))


def namespace(**overrides):
    """What a student's notebook holds: the imports cell plus the reference definitions."""
    ns = {
        "torch": torch, "math": math, "nn": nn, "F": F,
        "causal_mask": attention.causal_mask, "MultiHeadAttention": multihead.MultiHeadAttention,
        "merge_heads": multihead.merge_heads, "repeat_kv": multihead.repeat_kv,
        "GPT": gpt.GPT, "GPTConfig": gpt.GPTConfig, "KVCache": gpt.KVCache, "LayerCache": gpt.LayerCache,
        "generate": decoding.generate, "sample_next": decoding.sample_next, "sequence_logprob": decoding.sequence_logprob,
        "TableLM": grader.TableLM,
    }
    ns.update({part: getattr(module, part) for part, (_, module) in GRADERS.items()})
    ns.update(overrides)
    return ns


CAUGHT_BY_PUBLIC = [m for m in MUTANTS if m.name in {
    "loss_not_shifted", "loss_shift_wrong_way", "loss_mean_over_ignored", "top_k_drops_ties", "top_k_keeps_k_plus_one",
    "top_p_drops_the_crossing_token", "top_p_unsorted", "beam_not_normalised",
    "beam_greedy_per_beam", "csa_top_left_mask", "csa_cache_not_extended", "csa_no_scale", "csa_no_out_proj",
}]


@pytest.mark.parametrize("mutant", CAUGHT_BY_PUBLIC, ids=lambda m: m.name)
def test_public_checks_catch_the_common_mistakes(mutant):
    ns = namespace()
    exec(compile(mutant.source, mutant.name, "exec"), ns)
    with pytest.raises(GradingFailure):
        PUBLIC[mutant.part](ns[mutant.target], *PUBLIC_EXTRA.get(mutant.part, ()))


def test_grading_is_deterministic():
    seen = []

    def spy(logits, k):
        seen.append(logits.clone())
        return decoding.top_k_filter(logits, k)

    grader.grade_top_k_filter(spy)
    first = list(seen)
    seen.clear()
    grader.grade_top_k_filter(spy)
    assert len(first) == len(seen) and all(torch.equal(a, b) for a, b in zip(first, seen))


# --------------------------------------------------------------------------- the toy models


def brute_force(logp: torch.Tensor, eos: int, n: int, alpha: float) -> tuple[list[int], float]:
    """The best hypothesis from token 0 over every sequence of at most n tokens, ending at its
    first EOS (or after n tokens), ranked by total / length ** alpha."""
    best, best_score = None, -math.inf
    V = logp.shape[0]
    for length in range(1, n + 1):
        for seq in itertools.product(range(V), repeat=length):
            if eos in seq[:-1] or (length < n and seq[-1] != eos):
                continue
            path = [0, *seq]
            score = sum(float(logp[a, b]) for a, b in zip(path, path[1:])) / length ** alpha
            if score > best_score:
                best, best_score = path, score
    return best, best_score


@pytest.mark.parametrize("table,eos,n,alpha,expected", [
    (grader._length_table, grader._EOS_LEN, 6, 1.0, [0, 1, 2, 3]),
    (grader._length_table, grader._EOS_LEN, 6, 0.0, [0, 3]),
    (grader._stop_table, grader._EOS_STOP, 6, 1.0, [0, 1, 3]),
    (grader._stop_table, grader._EOS_STOP, 6, 0.0, [0, 1, 3]),
    (grader._eos_beam_table, grader._EOS_KEEP, 4, 1.0, [0, 2, 3, 8]),
])
def test_toy_tables_have_the_best_hypotheses_the_grader_expects(table, eos, n, alpha, expected):
    logp = grader._table_logp(table())
    assert brute_force(logp, eos, n, alpha)[0] == expected
    tokens, score = decoding.beam_search(grader.TableLM(logp), torch.tensor([[0]]), n, 2, eos_id=eos, length_penalty=alpha)
    assert tokens[0].tolist() == expected
    assert score == pytest.approx(brute_force(logp, eos, n, alpha)[1], abs=1e-5)


def test_greedy_trap_fools_greedy_decoding():
    model = grader.TableLM(grader._table_logp(grader._greedy_trap()))
    assert decoding.generate(model, torch.tensor([[0]]), 2)[0].tolist() == [0, 1, 3]
    assert decoding.beam_search(model, torch.tensor([[0]]), 2, 2, length_penalty=0.0)[0][0].tolist() == [0, 2, 3]


def test_table_lm_follows_the_decoding_protocol_and_checks_its_cache():
    p = torch.rand(6, 6, generator=torch.Generator().manual_seed(0))
    model = grader.TableLM.from_probs(p)
    assert torch.allclose(model.logp.exp().sum(-1), torch.ones(6))
    idx = torch.tensor([[0, 3, 5], [2, 2, 1]])
    assert torch.equal(model(idx), model.logp[idx])
    cache = model.init_cache(2, 4)
    model(idx, cache=cache)
    assert cache.length == 3
    cache.reorder(torch.tensor([1, 1, 0]))
    with pytest.raises(ValueError, match="reorder the cache"):
        model(torch.tensor([[1], [2]]), cache=cache)
    model(torch.tensor([[1], [2], [3]]), cache=cache)
    with pytest.raises(ValueError, match="do not fit"):
        model(torch.tensor([[1], [2], [3]]), cache=cache)
    with pytest.raises(ValueError, match="out of range"):
        cache.reorder(torch.tensor([3]))
    # a forgotten reorder fails on the table model as it does on a GPT
    ns = namespace()
    exec(compile(next(m for m in MUTANTS if m.name == "beam_cache_not_reordered").source, "m", "exec"), ns)
    with pytest.raises(ValueError, match="reorder the cache"):
        ns["beam_search"](model, torch.tensor([[0]]), 3, 2)


def test_filter_expectations_equal_hugging_face_and_coursekit():
    """The grader's expected filters (Hugging Face's warpers) equal coursekit's on every input it uses."""
    pytest.importorskip("transformers")
    for x in (rand("topk.hf", 4, 40, scale=2.0), rand("topp.compose", 3, 20, scale=2.0)):
        for k in (1, 2, 4, 6, 7, 39):
            assert torch.equal(grader._warped("k", k, x), decoding.top_k_filter(x, k))
    for dtype in (torch.float64, torch.float32):
        x = rand("topp.hf", 6, 40, dtype=dtype, scale=2.0)
        for p in (0.05, 0.3, 0.5, 0.8, 0.9, 0.97):
            assert torch.equal(grader._warped("p", p, x), decoding.top_p_filter(x, p))


def _beam_search_float64():
    """The reference beam search computing its scores in float64 instead of float32."""
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(decoding.beam_search))
    for old, new in (("logits.float()", "logits.double()"), ("torch.zeros(1)", "torch.zeros(1, dtype=torch.float64)"),
                     ("torch.tensor(keep_score)", "torch.tensor(keep_score, dtype=torch.float64)")):
        assert source.count(old) == 1
        source = source.replace(old, new)
    ns = {"torch": torch, "F": F, "nn": nn}
    exec(source, ns)
    return ns["beam_search"]


def test_gpt_beam_cases_do_not_hang_on_rounding():
    """A student who scores in float64 (or sums in another order) must get the grader's sequences:
    the reference's float64 twin gives the same tokens on every GPT case the grader uses."""
    beam64 = _beam_search_float64()
    _, local = grader._gpt_pair(gpt.GPT, gpt.GPTConfig, seed=4)
    for i, (W, n, alpha, eos_at) in enumerate(((3, 12, 1.0, None), (4, 10, 0.7, 3), (2, 8, 0.0, 2))):
        prompt = grader._prompt(f"beam.gpt.{i}", T0=4)
        eos = None if eos_at is None else int(decoding.beam_search(local, prompt, n, W)[0][0, 4 + eos_at])
        a, sa = decoding.beam_search(local, prompt, n, W, eos_id=eos, length_penalty=alpha)
        b, sb = beam64(local.double(), prompt, n, W, eos_id=eos, length_penalty=alpha)
        local.float()
        assert torch.equal(a, b) and sa == pytest.approx(sb, abs=1e-4)
    _, local = grader._gpt_pair(gpt.GPT, gpt.GPTConfig, seed=6, dropout=0.3)
    prompt = grader._prompt("beam.mode", T0=4)
    assert torch.equal(decoding.beam_search(local, prompt, 10, 3)[0], beam64(local.double(), prompt, 10, 3)[0])
    _, local = grader._gpt_pair(gpt.GPT, gpt.GPTConfig, seed=3)  # beam_width=1 against greedy decoding
    for i in range(3):
        prompt = grader._prompt(f"beam.greedy.{i}")
        greedy = decoding.generate(local, prompt, 20)
        eos = int(greedy[0, 12])
        greedy_eos = decoding.generate(local, prompt, 20, eos_id=eos)
        assert torch.equal(beam64(local.double(), prompt, 20, 1)[0], greedy)
        assert torch.equal(beam64(local, prompt, 20, 1, eos_id=eos, length_penalty=0.0)[0], greedy_eos)
        local.float()


def test_beam_search_gets_a_hint_for_a_wrong_return_type():
    def no_score(model, prompt, max_new_tokens, beam_width=4, *, eos_id=None, length_penalty=1.0):
        return decoding.beam_search(model, prompt, max_new_tokens, beam_width, eos_id=eos_id, length_penalty=length_penalty)[0]

    with pytest.raises(GradingFailure, match=r"must return a tuple \(tokens, score\)"):
        grade("beam_search", no_score)
