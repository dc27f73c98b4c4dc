"""The Exercise 3 graders, tested like code: correct answers written differently pass, the
commonest mistakes fail even the public checks, and the grading itself behaves (hints name the
student's line, inputs repeat, a lying tensor subclass fails)."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
from torch import nn

from coursekit import positional as ref
from coursekit.grading import GradingFailure
from coursekit.grading import ch03_positional as grader
from tests.grading_support import full_marks, namespace, public_checks
from tests.mutants.ch03_positional import MUTANTS

ASSIGNMENT = "ch03_positional"

PUBLIC = public_checks(grader, only=["sinusoidal_encoding", "apply_rope", "alibi_slopes", "alibi_bias"])
#: the imports cell of a student's notebook (the reference definitions of PUBLIC's parts come after it)
IMPORTS = {"torch": torch, "math": math, "nn": nn, "rope_angles": ref.rope_angles}


# --------------------------------------------------------------------------- correct alternatives

_SIN_CHECKS = """
    if T < 0 or C <= 0 or C % 2:
        raise ValueError(f"need T >= 0 and an even C > 0, got T={T} and C={C}")
    if base <= 0:
        raise ValueError(f"base must be positive, got {base}")
"""
_ROPE_CHECKS = """
    positions = torch.as_tensor(positions, device=x.device)
    if x.dim() < 2 or x.shape[-1] % 2:
        raise ValueError(f"x must be (..., T, D) with an even D, got {tuple(x.shape)}")
    if positions.dim() not in (1, 2) or positions.shape[-1] != x.shape[-2]:
        raise ValueError(f"positions must be (T,) or (B, T), got {tuple(positions.shape)}")
    if positions.dim() == 2 and (x.dim() not in (3, 4) or x.shape[0] != positions.shape[0]):
        raise ValueError(f"positions (B, T) need x (B, T, D) or (B, H, T, D), got {tuple(x.shape)}")
"""
_BIAS_CHECKS = """
    S = T if S is None else S
    if not isinstance(slopes, torch.Tensor) or slopes.dim() != 1 or not slopes.dtype.is_floating_point:
        raise ValueError(f"slopes must be a floating (H,) tensor, got {slopes!r}")
    if T < 0 or S < T:
        raise ValueError(f"need 0 <= T <= S, got T={T} and S={S}")
"""

ALTERNATIVES = {
    "sinusoidal_encoding": {
        "exp_log_frequencies": """
def sinusoidal_encoding(T, C, base=10000.0, dtype=torch.float32):"""
        + _SIN_CHECKS
        + """
    pe = torch.zeros(T, C, dtype=torch.float64)
    position = torch.arange(0, T, dtype=torch.float64).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, C, 2, dtype=torch.float64) * -(math.log(base) / C))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe.to(dtype)
""",
        "python_loops": """
def sinusoidal_encoding(T, C, base=10000.0, dtype=torch.float32):"""
        + _SIN_CHECKS
        + """
    rows = []
    for p in range(T):
        row = []
        for i in range(C // 2):
            w = base ** (-2 * i / C)
            row += [math.sin(p * w), math.cos(p * w)]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64).reshape(T, C).to(dtype)
""",
        "complex_polar": """
def sinusoidal_encoding(T, C, base=10000.0, dtype=torch.float32):"""
        + _SIN_CHECKS
        + """
    angles = torch.outer(torch.arange(T, dtype=torch.float64),
                         torch.pow(base, -torch.arange(C // 2, dtype=torch.float64) * 2 / C))
    z = torch.polar(torch.ones_like(angles), angles)  # cos + i sin
    return torch.view_as_real(z).flip(-1).reshape(T, C).to(dtype)  # (sin, cos) pairs
""",
    },
    "apply_rope": {
        "complex_multiplication": """
def apply_rope(x, positions, base=10000.0, scaling=None, factor=1.0):"""
        + _ROPE_CHECKS
        + """
    D = x.shape[-1]
    angles = rope_angles(positions, D, base=base, scaling=scaling, factor=factor)
    if positions.dim() == 2 and x.dim() == 4:
        angles = angles.unsqueeze(1)
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    z = torch.complex(x[..., : D // 2].to(work), x[..., D // 2 :].to(work))
    z = z * torch.polar(torch.ones_like(angles), angles).to(z.dtype)
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)
""",
        "einsum_rotation_matrices": """
def apply_rope(x, positions, base=10000.0, scaling=None, factor=1.0):"""
        + _ROPE_CHECKS
        + """
    D = x.shape[-1]
    angles = rope_angles(positions, D, base=base, scaling=scaling, factor=factor)
    if positions.dim() == 2 and x.dim() == 4:
        angles = angles[:, None, :, :]
    c, s = angles.cos(), angles.sin()
    R = torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)  # (..., T, D/2, 2, 2)
    pairs = torch.stack([x[..., : D // 2], x[..., D // 2 :]], dim=-1).double()  # (..., T, D/2, 2)
    out = torch.einsum("...ij,...j->...i", R, pairs)
    return torch.cat([out[..., 0], out[..., 1]], dim=-1).to(x.dtype)
""",
        "loop_over_pairs": """
def apply_rope(x, positions, base=10000.0, scaling=None, factor=1.0):"""
        + _ROPE_CHECKS
        + """
    D = x.shape[-1]
    angles = rope_angles(positions, D, base=base, scaling=scaling, factor=factor)
    if positions.dim() == 2 and x.dim() == 4:
        angles = angles.unsqueeze(1)
    halves = []
    for i in range(D // 2):
        a, b = x[..., i], x[..., i + D // 2]
        c, s = angles[..., i].cos().to(x.dtype), angles[..., i].sin().to(x.dtype)
        halves.append((a * c - b * s, a * s + b * c))
    first = torch.stack([h[0] for h in halves], dim=-1)
    second = torch.stack([h[1] for h in halves], dim=-1)
    return torch.cat([first, second], dim=-1)
""",
    },
    "alibi_slopes": {
        "the_papers_code": """
def alibi_slopes(H, dtype=torch.float32):
    if H < 1:
        raise ValueError(f"need at least one head, got {H}")

    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start**i for i in range(n)]

    if math.log2(H).is_integer():
        slopes = power_of_2(H)
    else:
        closest = 2 ** math.floor(math.log2(H))
        slopes = power_of_2(closest) + power_of_2(2 * closest)[0::2][: H - closest]
    return torch.tensor(slopes, dtype=dtype)
""",
        "torch_pow": """
def alibi_slopes(H, dtype=torch.float32):
    if H < 1:
        raise ValueError(f"need at least one head, got {H}")
    n = 2 ** int(math.log2(H))
    first = torch.pow(2.0, -8.0 * torch.arange(1, n + 1, dtype=torch.float64) / n)
    extra = torch.pow(2.0, -8.0 * torch.arange(1, 2 * n + 1, 2, dtype=torch.float64) / (2 * n))[: H - n]
    return torch.cat([first, extra]).to(dtype)
""",
    },
    "alibi_bias": {
        "relative_positions_and_where": """
def alibi_bias(slopes, T, S=None):"""
        + _BIAS_CHECKS
        + """
    rel = torch.arange(S, device=slopes.device)[None, :] - torch.arange(S - T, S, device=slopes.device)[:, None]
    bias = slopes.view(-1, 1, 1) * rel.to(slopes.dtype)
    return torch.where(rel > 0, torch.full_like(bias, float("-inf")), bias)
""",
        "triu_mask": """
def alibi_bias(slopes, T, S=None):"""
        + _BIAS_CHECKS
        + """
    future = torch.ones(T, S, dtype=torch.bool, device=slopes.device).triu(S - T + 1)
    q = torch.arange(S - T, S, device=slopes.device, dtype=slopes.dtype)
    k = torch.arange(S, device=slopes.device, dtype=slopes.dtype)
    distance = q[:, None] - k[None, :]
    return (-slopes[:, None, None] * distance).masked_fill(future, -math.inf)
""",
        "python_loops": """
def alibi_bias(slopes, T, S=None):"""
        + _BIAS_CHECKS
        + """
    out = slopes.new_full((slopes.shape[0], T, S), float("-inf"))
    for i in range(T):
        for j in range(i + S - T + 1):
            out[:, i, j] = -slopes * (i + S - T - j)
    return out
""",
    },
    "sinusoidal_similarity": {
        "float32_table_and_cosine_similarity": """
def sinusoidal_similarity(k, C, T=512, base=10000.0):
    if k < 0 or T < 1:
        raise ValueError(f"need k >= 0 and T >= 1, got k={k}, T={T}")
    pe = sinusoidal_encoding(T + k, C, base=base)
    sims = torch.nn.functional.cosine_similarity(pe[:T].double(), pe[k:].double(), dim=-1)
    return float(sims.mean())
""",
    },
    "ntk_scaled_base": {
        "through_logarithms": """
def ntk_scaled_base(base, D, factor):
    if D % 2 or D <= 2 or base <= 1 or factor <= 0:
        raise ValueError(f"bad arguments base={base}, D={D}, factor={factor}")
    return math.exp(math.log(base) + math.log(factor) * D / (D - 2))
""",
    },
}
CASES = [(part, name, src) for part, alts in ALTERNATIVES.items() for name, src in alts.items()]


@pytest.mark.parametrize("part, name, source", CASES, ids=[f"{p}-{n}" for p, n, _ in CASES])
def test_a_correct_answer_written_differently_keeps_full_marks(part, name, source):
    full_marks(ASSIGNMENT, part, textwrap.dedent(source))


# --------------------------------------------------------------------------- the graders themselves


@pytest.mark.parametrize(
    "name,part",
    [
        ("sinusoidal_sin_cos_swapped", "sinusoidal_encoding"),
        ("rope_interleaved_pairs", "apply_rope"),
        ("rope_rotates_backwards", "apply_rope"),
        ("alibi_slopes_naive_rule", "alibi_slopes"),
        ("alibi_bias_sign_flipped", "alibi_bias"),
        ("sinusoidal_angles_in_dtype", "sinusoidal_encoding"),
        ("rope_drops_scaling", "apply_rope"),
        ("alibi_bias_square_only", "alibi_bias"),
    ],
)
def test_public_checks_catch_the_commonest_mistakes(name, part):
    mutant = next(m for m in MUTANTS if m.name == name)
    ns = namespace(IMPORTS, ref, PUBLIC)
    exec(compile(mutant.source, f"<mutant {name}>", "exec"), ns)
    with pytest.raises(GradingFailure):
        PUBLIC[part](ns[mutant.target])


def test_a_failing_example_is_shrunk_and_named_in_the_hint():
    mutant = next(m for m in MUTANTS if m.name == "rope_rotates_backwards")
    ns = namespace(IMPORTS, ref, PUBLIC)
    exec(compile(mutant.source, "<mutant>", "exec"), ns)
    with pytest.raises(
        GradingFailure, match=r"for x \(1, 1, 2, 4\) and positions \[0, 1\]: the rotation goes"
    ):
        grader.grade_apply_rope(ns["apply_rope"])


def test_student_exception_is_reported_with_its_line():
    def broken(x, positions, base=10000.0, scaling=None, factor=1.0):
        return x @ positions  # wrong shapes

    with pytest.raises(GradingFailure, match=r"your code raised RuntimeError.*line \d+"):
        grader.grade_apply_rope(broken)


def test_grading_is_deterministic():
    seen = []

    def spy(x, positions, **kwargs):
        seen.append(x.clone())
        return ref.apply_rope(x, positions, **kwargs)

    grader.grade_apply_rope(spy)
    first = list(seen)
    seen.clear()
    grader.grade_apply_rope(spy)
    assert len(first) == len(seen) and all(torch.equal(a, b) for a, b in zip(first, seen))


def test_a_lying_tensor_subclass_fails_in_process_too():
    class Liar(torch.Tensor):
        def __eq__(self, other):
            return True

    def alibi_slopes(H, dtype=torch.float32):
        return torch.zeros(H, dtype=dtype).as_subclass(Liar)

    with pytest.raises(GradingFailure, match="got Liar"):
        grader.grade_alibi_slopes(alibi_slopes)


def test_a_dtype_error_in_the_device_check_says_dtype_and_not_device():
    def alibi_bias(slopes, T, S=None):
        return ref.alibi_bias(slopes, T, S).float()

    g = grader.Grader("alibi_bias")
    with g.check("device"):
        grader._bias_on_slopes_device(g, alibi_bias, torch.tensor([0.5, 0.25], dtype=torch.float64), 2, 4)
    [(_, hint)] = g.failures
    assert "the slopes' dtype, float64" in hint and "device=slopes.device" not in hint
