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
from tests.grading_support import full_marks, namespace, public_checks
from tests.mutants import edit
from tests.mutants.ch10_long_context import BY_HAND, MUTANTS, TILED_BY_HAND

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny tensors run on one thread

#: the parts whose public checks must catch every catalogued mutant, and whose reference the notebook holds
PUBLIC = public_checks(
    grader, only=["tiled_attention", "sliding_window_mask", "causal_linear_attention", "kv_cache_size"]
)

#: the imports cell of a student's notebook (the reference definitions of PUBLIC's parts come after it)
IMPORTS = {
    "torch": torch,
    "math": math,
    "F": F,
    "check_attention_inputs": attention.check_attention_inputs,
    "causal_mask": attention.causal_mask,
    "scaled_dot_product_attention": attention.scaled_dot_product_attention,
    "elu_feature_map": long_context.elu_feature_map,
}

#: a (T, T) allocation is refused at once only if the kernel does not overcommit blindly
OVERCOMMIT_ALWAYS = (
    Path("/proc/sys/vm/overcommit_memory").is_file()
    and Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1"
)


def compiled(source: str, target: str):
    ns = namespace(IMPORTS, long_context, PUBLIC)
    exec(compile(source, f"<{target}>", "exec"), ns)
    return ns[target]


TILED_LOGSUMEXP = '''
def tiled_attention(q, k, v, causal=False, mask=None, block_q=64, block_k=64, scale=None):
    """The normalised online softmax: a running log-sum-exp and an output that is always a weighted mean."""
    check_attention_inputs(q, k, v, mask)
    if mask is not None and mask.dtype is not torch.bool:
        raise TypeError("mask must be boolean")
    if min(block_q, block_k) <= 0:
        raise ValueError(f"block sizes must be >= 1, got {block_q}, {block_k}")
    T, S = q.size(-2), k.size(-2)
    if causal and S < T:
        raise ValueError(f"causal needs S >= T, got {T} > {S}")
    scale = q.size(-1) ** -0.5 if scale is None else scale
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    full = None if mask is None else mask.expand(*batch, T, S)
    blocks = []
    for i in range(0, T, block_q):
        rows = torch.arange(i, min(i + block_q, T), device=q.device) + (S - T)
        lse = q.new_full((*batch, len(rows), 1), -math.inf)
        out = q.new_zeros((*batch, len(rows), v.size(-1)))
        for j in range(0, S, block_k):
            cols = torch.arange(j, min(j + block_k, S), device=q.device)
            s = torch.einsum("...td,...sd->...ts", q[..., i:i + block_q, :], k[..., j:j + block_k, :]) * scale
            keep = torch.ones_like(s, dtype=torch.bool)
            if causal:
                keep = keep & (cols[None, :] <= rows[:, None])
            if full is not None:
                keep = keep & full[..., i:i + block_q, j:j + block_k]
            s = s.masked_fill(~keep, -math.inf)
            new = torch.logaddexp(lse, torch.logsumexp(s, -1, keepdim=True))
            ref = torch.where(new == -math.inf, torch.zeros_like(new), new)
            out = torch.exp(lse - ref) * out + torch.exp(s - ref) @ v[..., j:j + block_k, :]
            lse = new
        blocks.append(out)
    return torch.cat(blocks, -2)
'''

#: half precision computed in float32 and rounded once at the end
TILED_UPCAST = edit(
    TILED_BY_HAND,
    (
        "    scale = 1 / math.sqrt",
        "    dtype = q.dtype\n"
        "    if dtype in (torch.float16, torch.bfloat16):\n"
        "        q, k, v = q.float(), k.float(), v.float()\n"
        "    scale = 1 / math.sqrt",
    ),
    ("    return torch.cat(out, dim=-2)", "    return torch.cat(out, dim=-2).to(dtype)"),
)

#: phi(x) = elu(x) + 1 written out instead of the given elu_feature_map
LINEAR_ELU = edit(
    BY_HAND["causal_linear_attention"],
    ("phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)", "phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1"),
)

WINDOW_TRIANGLES = """
def sliding_window_mask(T, window, S=None, device=None):
    if type(window) is not int or window <= 0:
        raise ValueError(f"window must be a positive int, got {window!r}")
    S = T if S is None else S
    if T < 0 or S < T:
        raise ValueError(f"expected 0 <= T <= S, got T={T}, S={S}")
    ones = torch.ones(T, S, dtype=torch.bool, device=device)
    return ones.tril(S - T) & ones.triu(S - T - window + 1)
"""

LINEAR_CHUNKED = """
def causal_linear_attention(q, k, v, eps=1e-6):
    check_attention_inputs(q, k, v)
    if q.shape[-2] != k.shape[-2] or eps < 0:
        raise ValueError(f"need T == S and eps >= 0, got {q.shape[-2]}, {k.shape[-2]}, eps={eps}")
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    state = q.new_zeros(*batch, q.shape[-1], v.shape[-1])
    z = q.new_zeros(*batch, q.shape[-1])
    out = []
    for c in range(0, q.shape[-2], 1024):
        qc, kc, vc = fq[..., c:c + 1024, :], fk[..., c:c + 1024, :], v[..., c:c + 1024, :]
        A = (qc @ kc.transpose(-1, -2)).tril()
        num = qc @ state + A @ vc
        den = (qc * z.unsqueeze(-2)).sum(-1, keepdim=True) + A.sum(-1, keepdim=True)
        out.append(num / (den + eps))
        state = state + kc.transpose(-1, -2) @ vc
        z = z + kc.sum(-2)
    return torch.cat(out, -2)
"""

KV_PRODUCT = """
def kv_cache_size(n_layers, n_heads, d_head, seq_len, n_kv_heads=None, batch=1, dtype=torch.float16, window=None):
    kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    sizes = dict(n_layers=n_layers, n_heads=n_heads, d_head=d_head, n_kv_heads=kv_heads, batch=batch)
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if seq_len < 0 or (window is not None and window < 1) or n_heads % kv_heads != 0:
        raise ValueError(f"bad arguments: seq_len={seq_len}, window={window}, n_kv_heads={kv_heads}")
    bits = torch.finfo(dtype).bits if dtype.is_floating_point else torch.iinfo(dtype).bits
    cached = seq_len if window is None else min(seq_len, window)
    return math.prod([2, n_layers, batch, cached, kv_heads, d_head]) * bits // 8
"""


@pytest.mark.parametrize(
    "part, source",
    [(part, source) for part, source in BY_HAND.items()]
    + [
        ("tiled_attention", TILED_LOGSUMEXP),
        ("tiled_attention", TILED_UPCAST),
        ("sliding_window_mask", WINDOW_TRIANGLES),
        ("causal_linear_attention", LINEAR_CHUNKED),
        ("causal_linear_attention", LINEAR_ELU),
        ("kv_cache_size", KV_PRODUCT),
    ],
    ids=[f"{part}-by-hand" for part in BY_HAND]
    + [
        "tiled-logsumexp",
        "tiled-float32-inside",
        "window-triangles",
        "linear-chunked",
        "linear-elu-plus-one",
        "kv-product-of-bits",
    ],
)
def test_a_correct_implementation_written_differently_gets_full_marks(part, source):
    """Correct code in other styles (the mutants' base among them), graded as a notebook is: public and hidden cells."""
    assert len(full_marks("ch10_long_context", part, source)) == 2


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.part in PUBLIC], ids=lambda m: m.name)
def test_public_checks_catch_every_catalogued_mistake(mutant):
    """The public checks name every clause the hidden ones grade, on a small example each."""
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
    assert len(first) == len(seen) and all(
        torch.equal(a, b) for x, y in zip(first, seen) for a, b in zip(x, y)
    )


def test_the_modelled_mistakes_differ_from_the_right_answer():
    """Every wrong answer the hints describe is really wrong on the inputs the graders use."""
    q, k, v = (
        rand("public.tiled.q", 1, 6, 4, scale=3.0),
        rand("public.tiled.k", 1, 6, 4, scale=3.0),
        rand("public.tiled.v", 1, 6, 2),
    )
    q = q[:, 3:]  # 3 queries, 6 keys: the top-left and bottom-right causal masks differ
    right = grader._naive(q, k, v, causal=True)
    case = grader._Tiled(0, ((1,), (1,), (1,)), 3, 6, 4, 2, causal=True, block_q=2, block_k=4)
    wrong = [w for w, _ in grader._tiled_mistakes(case, q, k, v, None) if w is not None]
    assert len(wrong) >= 5 and all(not torch.allclose(w, right) for w in wrong)
    T, S, W = 3, 8, 2
    right = long_context.sliding_window_mask(T, W, S)
    assert all(not torch.equal(w, right) for w, _ in grader._window_mistakes(T, S, W))
    q, k, v = rand("lin.eps.q", 1, 6, 3), rand("lin.eps.k", 1, 6, 3), rand("lin.eps.v", 1, 6, 3)
    right = grader._recurrence(q, k, v, 0.5)
    assert all(not torch.allclose(w, right) for w, _ in grader._linear_mistakes(q, k, v, 0.5))
    shown = set()
    for kwargs, expected, wrong in grader._kv_cases():
        assert expected == long_context.kv_cache_size(**kwargs)
        shown |= {
            hint for value, hint in wrong if value != expected
        }  # a mistake may be harmless in some cases
    assert shown == {hint for _, hint in grader._kv_cases()[0][2]}  # but every one shows in some case


def test_the_recurrence_reference_equals_the_parallel_form():
    q, k, v = rand("x.q", 2, 9, 3), rand("x.k", 2, 9, 3), rand("x.v", 2, 9, 4)
    torch.testing.assert_close(
        grader._recurrence(q, k, v, 1e-6),
        long_context.linear_attention_parallel(q, k, v, causal=True),
        rtol=1e-10,
        atol=1e-12,
    )


def test_hints_for_wrong_return_types():
    with pytest.raises(GradingFailure, match="should return an int"):
        grader.grade_kv_cache_size(lambda *a, **kw: float(long_context.kv_cache_size(*a, **kw)))
    with pytest.raises(GradingFailure, match="should be a boolean tensor"):
        grader.grade_sliding_window_mask(lambda *a, **kw: long_context.sliding_window_mask(*a, **kw).int())


def test_a_wrong_tile_offset_is_not_called_an_ignored_causal_mask():
    """Keys counted from 0 in every tile look, on a small shrunk example, like no causal mask at all;
    the grader asks the same call with one tile and names the offset."""
    from tests.mutants import failures

    said = failures("ch10_long_context", "tiled_causal_tile_offset", hidden=True)
    assert "right in one tile but not across tiles" in said and "causal=True is ignored" not in said
    said = failures("ch10_long_context", "tiled_ignores_causal", hidden=True)
    assert "causal=True is ignored" in said and "across tiles" not in said


def test_a_hint_shows_the_number_the_student_gave():
    with pytest.raises(GradingFailure) as failed:
        grader.grade_window_mass(lambda *args, **kwargs: 0.125)
    assert "gave float 0.125" in str(failed.value) or "got float 0.125" in str(failed.value)
