"""The Exercise 10 graders, tested like code: the reference and hand-written correct solutions
pass, every mutant is caught with its hint, a stub fails plainly, and the grader's models of
the mistakes really are mistakes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from coursekit import attention, long_context
from coursekit.grading import GradingFailure
from coursekit.grading import ch10_long_context as grader
from coursekit.grading.core import rand
from tests.mutants.ch10_long_context import BY_HAND, MUTANTS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny tensors run on one thread

GRADERS = {
    "tiled_attention": grader.grade_tiled_attention,
    "sliding_window_mask": grader.grade_sliding_window_mask,
    "causal_linear_attention": grader.grade_causal_linear_attention,
    "kv_cache_size": grader.grade_kv_cache_size,
}

PUBLIC = {
    "tiled_attention": grader.check_tiled_attention,
    "sliding_window_mask": grader.check_sliding_window_mask,
    "causal_linear_attention": grader.check_causal_linear_attention,
    "kv_cache_size": grader.check_kv_cache_size,
}

#: a (T, T) allocation is refused at once only if the kernel does not overcommit blindly
OVERCOMMIT_ALWAYS = Path("/proc/sys/vm/overcommit_memory").is_file() and \
    Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1"


def namespace(**overrides):
    """What a student's notebook holds: the imports cell plus the reference definitions."""
    ns = {
        "torch": torch, "math": math, "F": F,
        "check_attention_inputs": attention.check_attention_inputs, "causal_mask": attention.causal_mask,
        "scaled_dot_product_attention": attention.scaled_dot_product_attention,
        "elu_feature_map": long_context.elu_feature_map,
    }
    ns.update({part: getattr(long_context, part) for part in GRADERS})
    ns.update(overrides)
    return ns


def compiled(source: str, target: str):
    ns = namespace()
    exec(compile(source, f"<{target}>", "exec"), ns)
    return ns[target]


@pytest.mark.parametrize("part", list(GRADERS))
def test_a_correct_solution_written_differently_scores_full_marks(part, capsys):
    """The mutants' base: correct code in a student's style, which the mistakes are edits of."""
    GRADERS[part](compiled(BY_HAND[part], part))
    assert "checks passed" in capsys.readouterr().out


CAUGHT_BY_PUBLIC = [m for m in MUTANTS if m.name in {
    "tiled_no_rescale_acc", "tiled_divide_early", "tiled_no_scale", "tiled_causal_top_left",
    "window_off_by_one", "window_not_causal", "window_top_left",
    "linear_not_causal", "linear_no_normaliser", "linear_feature_not_positive", "linear_excludes_the_diagonal",
    "kv_no_factor_two", "kv_query_heads", "kv_dtype_ignored", "kv_in_bits",
}]


@pytest.mark.parametrize("mutant", CAUGHT_BY_PUBLIC, ids=lambda m: m.name)
def test_public_checks_catch_the_common_mistakes(mutant):
    with pytest.raises(GradingFailure):
        PUBLIC[mutant.part](compiled(mutant.source, mutant.target))


def test_grading_is_deterministic():
    seen = []

    def spy(q, k, v, eps=1e-6):
        seen.append((q.clone(), k.clone(), v.clone()))
        return long_context.causal_linear_attention(q, k, v, eps)

    grader.grade_causal_linear_attention(spy)
    first = list(seen)
    seen.clear()
    grader.grade_causal_linear_attention(spy)
    assert len(first) == len(seen) and all(torch.equal(a, b) for x, y in zip(first, seen) for a, b in zip(x, y))


def test_the_modelled_mistakes_differ_from_the_right_answer():
    """Every wrong answer the hints describe is really wrong on the inputs the graders use."""
    q, k, v = rand("public.tiled.q", 1, 6, 4, scale=3.0), rand("public.tiled.k", 1, 6, 4, scale=3.0), \
        rand("public.tiled.v", 1, 6, 2)
    q = q[:, 3:]  # 3 queries, 6 keys: the top-left and bottom-right causal masks differ
    right = grader._naive(q, k, v, causal=True)
    wrong = grader._tiled_mistakes(q, k, v, causal=True, block_q=2, block_k=4)
    assert all(not torch.allclose(w, right) for w, _ in wrong)
    T, S, W = 3, 8, 2
    right = long_context.sliding_window_mask(T, W, S)
    assert all(not torch.equal(w, right) for w, _ in grader._window_mistakes(T, S, W))
    q, k, v = rand("lin.eps.q", 1, 6, 3), rand("lin.eps.k", 1, 6, 3), rand("lin.eps.v", 1, 6, 3)
    right = grader._recurrence(q, k, v, 0.5)
    assert all(not torch.allclose(w, right) for w, _ in grader._linear_mistakes(q, k, v, 0.5))
    shown = set()
    for kwargs, expected, wrong in grader._kv_cases():
        assert expected == long_context.kv_cache_size(**kwargs)
        shown |= {hint for value, hint in wrong if value != expected}  # a mistake may be harmless in some cases
    assert shown == {hint for _, hint in grader._kv_cases()[0][2]}  # but every one shows in some case


def test_the_recurrence_reference_equals_the_parallel_form():
    q, k, v = rand("x.q", 2, 9, 3), rand("x.k", 2, 9, 3), rand("x.v", 2, 9, 4)
    torch.testing.assert_close(grader._recurrence(q, k, v, 1e-6),
                               long_context.linear_attention_parallel(q, k, v, causal=True), rtol=1e-10, atol=1e-12)


def test_hints_for_wrong_return_types():
    with pytest.raises(GradingFailure, match="should return an int"):
        grader.grade_kv_cache_size(lambda *a, **kw: float(long_context.kv_cache_size(*a, **kw)))
    with pytest.raises(GradingFailure, match="should be a boolean tensor"):
        grader.grade_sliding_window_mask(lambda *a, **kw: long_context.sliding_window_mask(*a, **kw).int())
