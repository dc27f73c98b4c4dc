"""The Exercise 1 graders, tested like code: correct answers written differently keep full marks,
failures are reported check by check, grading is deterministic and cannot be fooled by a tensor subclass.

The catalogue of wrong answers (``tests/mutants/ch01_attention.py``) is graded by ``tests/test_graders.py``.
"""

from __future__ import annotations

import pytest
import torch

from coursekit import attention as ref
from coursekit.grading import GradingFailure, harness
from coursekit.grading import ch01_attention as grader
from tests.grading_support import full_marks

ASSIGNMENT = "ch01_attention"

#: Correct answers that differ from the instructor's: other formulas, other torch functions, loops.
#: (part's answer cell grade id, name, source): each must keep every point of its part.
ALTERNATIVES = [
    (
        "softmax",
        "log_sum_exp",
        """
def softmax(x, dim=-1):
    lse = torch.logsumexp(x, dim=dim, keepdim=True)
    out = torch.exp(x - lse)
    return torch.where(torch.isneginf(lse), torch.zeros_like(out), out)
""",
    ),
    (
        "softmax",
        "moved_axis_and_clamps",
        """
def softmax(x, dim=-1):
    y = x.movedim(dim, -1)
    m = y.max(dim=-1, keepdim=True).values.clamp(min=torch.finfo(x.dtype).min)
    e = (y - m).exp()
    p = e / e.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny)
    return p.movedim(-1, dim)
""",
    ),
    (
        "softmax",
        "torch_softmax_without_nan",
        """
def softmax(x, dim=-1):
    return torch.softmax(x, dim=dim).nan_to_num(0.0)
""",
    ),
    (
        "softmax",
        "float64_internally",
        """
def softmax(x, dim=-1):
    y = x.double()
    m = y.amax(dim=dim, keepdim=True).nan_to_num(neginf=0.0)
    e = torch.exp(y - m)
    s = e.sum(dim=dim, keepdim=True)
    return (e / torch.where(s == 0, torch.ones_like(s), s)).to(x.dtype)
""",
    ),
    (
        "causal_mask",
        "tril_with_an_offset",
        """
def causal_mask(T, S=None, device=None):
    S = T if S is None else S
    if not 0 <= T <= S:
        raise ValueError(f"need 0 <= T <= S, got T={T}, S={S}")
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)
""",
    ),
    (
        "causal_mask",
        "not_triu",
        """
def causal_mask(T, S=None, device=None):
    if S is None:
        S = T
    if T < 0 or T > S:
        raise ValueError(f"T={T} and S={S} do not satisfy 0 <= T <= S")
    return ~torch.ones(T, S, dtype=torch.bool, device=device).triu(S - T + 1)
""",
    ),
    (
        "causal_mask",
        "loop",
        """
def causal_mask(T, S=None, device=None):
    S = T if S is None else S
    if T < 0 or S < T:
        raise ValueError(f"causal_mask: T={T}, S={S}")
    m = torch.zeros(T, S, dtype=torch.bool, device=device)
    for i in range(T):
        m[i, : i + S - T + 1] = True
    return m
""",
    ),
    (
        "causal_mask",
        "offsets",
        """
def causal_mask(T, S=None, device=None):
    S = T if S is None else S
    if T < 0 or S < T:
        raise ValueError(f"T={T}, S={S}")
    offset = torch.arange(S, device=device).unsqueeze(0) - torch.arange(T, device=device).unsqueeze(1)
    return offset <= S - T
""",
    ),
    (
        "scaled_dot_product_attention",
        "einsum_and_where",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("...td,...sd->...ts", q, k) * scale
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = torch.where(mask, scores, torch.tensor(float("-inf"), dtype=scores.dtype))
        else:
            scores = scores + mask
    weights = softmax(scores, dim=-1)
    return torch.einsum("...ts,...sd->...td", weights, v), weights
""",
    ),
    (
        "scaled_dot_product_attention",
        "additive_mask_and_division",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    if scale is None:
        scores = q @ k.mT / math.sqrt(q.size(-1))
    else:
        scores = q @ k.mT * scale
    if mask is not None:
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(mask.logical_not(), float("-inf"))
        scores = scores + mask
    weights = softmax(scores, -1)
    out = torch.matmul(weights, v)
    return out, weights
""",
    ),
    (
        "scaled_dot_product_attention",
        "own_log_sum_exp",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = torch.matmul(q, k.transpose(-1, -2)).mul(scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    weights = torch.where(torch.isneginf(lse), torch.zeros_like(scores), torch.exp(scores - lse))
    return weights @ v, weights
""",
    ),
    (
        "SelfAttention",
        "functional_projections",
        """
class SelfAttention(nn.Module):
    def __init__(self, d_model, d_head=None, bias=True):
        super().__init__()
        d_head = d_head or d_model
        self.d_model = d_model
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, d_head, bias) for _ in range(3))

    def forward(self, x, mask=None):
        if x.ndim != 3 or x.size(-1) != self.d_model:
            raise ValueError(f"x must be (B, T, {self.d_model}), got {list(x.shape)}")
        q = F.linear(x, self.q_proj.weight, self.q_proj.bias)
        k = F.linear(x, self.k_proj.weight, self.k_proj.bias)
        v = F.linear(x, self.v_proj.weight, self.v_proj.bias)
        return scaled_dot_product_attention(q, k, v, mask)
""",
    ),
    (
        "SelfAttention",
        "explicit_shape_unpacking",
        """
class SelfAttention(nn.Module):
    def __init__(self, d_model, d_head=None, bias=True):
        super().__init__()
        if d_head is None:
            d_head = d_model
        self.q_proj = nn.Linear(d_model, d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, d_head, bias=bias)

    def forward(self, x, mask=None):
        if x.dim() != 3:
            raise ValueError(f"expected a 3-D x (B, T, C), got shape {tuple(x.shape)}")
        B, T, C = x.shape
        if C != self.q_proj.in_features:
            raise ValueError(f"expected width {self.q_proj.in_features}, got x of shape {tuple(x.shape)}")
        out, weights = scaled_dot_product_attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask=mask)
        return out, weights
""",
    ),
    ("predict_leaked_pairs", "an int written as a float", "predict_leaked_pairs = 7.0\n"),
    ("predict_score_variance", "an upper-case letter with spaces", 'predict_score_variance = " C "\n'),
    ("predict_sequential_steps", "an upper-case letter", 'predict_sequential_steps = "D"\n'),
    (
        "score_variance",
        "einsum and a variance written out",
        """
def score_variance(D, n, generator, scaled=False):
    if not (isinstance(D, int) and isinstance(n, int)) or D < 1 or n < 2:
        raise ValueError(f"need D >= 1 and n >= 2, got D={D}, n={n}")
    q = torch.randn((n, D), generator=generator, dtype=torch.float64)
    k = torch.randn((n, D), generator=generator, dtype=torch.float64)
    s = torch.einsum("nd,nd->n", q, k) * (D ** -0.5 if scaled else 1.0)
    return float(((s - s.mean()) ** 2).sum() / (n - 1))
""",
    ),
    (
        "online_softmax",
        "running statistics with logaddexp, one column block at a time",
        """
def online_softmax(x, block):
    if type(block) is not int or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    lse = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)  # running log of the sum of exp
    for i in range(0, x.shape[-1], block):
        lse = torch.logaddexp(lse, torch.logsumexp(x[..., i : i + block], dim=-1))
    finite = torch.isfinite(lse)
    safe = torch.where(finite, lse, torch.zeros_like(lse))
    return torch.where(finite[..., None], torch.exp(x - safe[..., None]), torch.zeros_like(x))
""",
    ),
]


@pytest.mark.parametrize("grade_id, name, source", ALTERNATIVES, ids=[f"{a[0]}-{a[1]}" for a in ALTERNATIVES])
def test_a_correct_alternative_keeps_full_marks(grade_id, name, source):
    assert len(full_marks(ASSIGNMENT, grade_id, source)) == 2


def test_every_part_has_correct_alternatives():
    assert {a[0] for a in ALTERNATIVES} == {p.grade_id for p in harness.parts(ASSIGNMENT)}


def test_failure_message_lists_each_failed_check():
    def bad_softmax(x, dim=-1):
        return torch.exp(x)  # unnormalised

    with pytest.raises(GradingFailure) as info:
        grader.grade_softmax(bad_softmax)
    message = str(info.value)
    assert message.startswith("softmax: ")
    assert "do not sum to 1" in message
    assert len(info.value.failures) >= 2


def test_a_hint_names_the_smallest_failing_input():
    def wrong_for_odd_lengths(x, dim=-1):  # right except along an axis of odd length
        p = ref.softmax(x, dim)
        return p if x.shape[dim] % 2 == 0 else p.flip(dim)

    with pytest.raises(GradingFailure) as info:
        grader.grade_softmax(wrong_for_odd_lengths)
    hints = dict(info.value.failures)
    assert "for x (3,) float64" in hints["equals exp(x) / sum(exp(x)) along the last axis by default"]


def test_student_exception_is_reported_with_its_line():
    def broken(q, k, v, mask=None, scale=None):
        return q @ k  # wrong: (T, D) @ (S, D)

    with pytest.raises(GradingFailure, match=r"your code raised RuntimeError.*line \d+"):
        grader.grade_attention(broken)


def test_grading_is_deterministic():
    seen = []

    def spy(x, dim=-1):
        seen.append(x.clone())
        return ref.softmax(x, dim)

    grader.grade_softmax(spy)
    first = list(seen)
    seen.clear()
    grader.grade_softmax(spy)
    assert len(first) == len(seen) and all(torch.equal(a, b) for a, b in zip(first, seen))


def test_a_lying_tensor_subclass_fails_in_process_too():
    class Liar(torch.Tensor):
        def __eq__(self, other):
            return True

    def causal_mask(T, S=None, device=None):
        return torch.zeros(T, T if S is None else S, dtype=torch.bool).as_subclass(Liar)

    with pytest.raises(GradingFailure, match="got Liar"):
        grader.grade_causal_mask(causal_mask)


def test_the_device_of_a_result_is_read_through_the_sandbox_error_too():
    g = grader.Grader("device")

    def meta_under_the_autograder(*args, **kwargs):  # what a meta tensor does on its way out of the sandbox
        raise NotImplementedError("Cannot copy out of meta tensor; no data!")

    assert grader._device_type(g, "call", meta_under_the_autograder) == "meta"
    assert grader._device_type(g, "call", ref.causal_mask, 2, device="meta") == "meta"
    assert grader._device_type(g, "call", ref.causal_mask, 2) == "cpu"


def test_a_hint_names_the_bias_clause_when_bias_false_is_not_passed_on():
    from tests.mutants import failures

    said = failures("ch01_attention", "self_attention_always_biased", hidden=True)
    assert "with bias=False no layer has a bias" in said
    assert "named as in the instructions" not in said
