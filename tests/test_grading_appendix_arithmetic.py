"""The appendix exercise's graders, tested like code: correct answers written differently keep full marks,
numbers of any plain type are read, and the hints name the numbers and every matching mistake.

The reference passing, the release failing and the catalogue's mistakes losing their points (with
their hints) are tested for every exercise by ``tests/test_graders.py``; what the generated mutants
do, by ``tests/test_mutation.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coursekit import arithmetic as ref
from coursekit.grading import GradingFailure
from coursekit.grading import appendix_arithmetic as grader
from tests.grading_support import full_marks

A = "appendix_arithmetic"

#: answer cell grade id -> correct answers written differently from the instructor's
ALTERNATIVES = {
    "decoder_params": {
        "module by module": """
def decoder_params(vocab_size, n_positions, d_model, n_layers, n_heads, n_kv_heads=None, d_ff=None, tied=True):
    if n_kv_heads is None:
        n_kv_heads = n_heads
    if d_ff is None:
        d_ff = 4 * d_model
    require_positive(integer=True, vocab_size=vocab_size, n_positions=n_positions, d_model=d_model,
                     n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads, d_ff=d_ff)
    if d_model % n_heads != 0:
        raise ValueError(f"n_heads={n_heads} does not divide d_model={d_model}")
    if n_heads % n_kv_heads != 0:
        raise ValueError(f"n_kv_heads={n_kv_heads} does not divide n_heads={n_heads}")

    def linear(n_in, n_out, bias=True):
        return n_in * n_out + (n_out if bias else 0)

    head_dim = d_model // n_heads
    layer = (linear(d_model, d_model) + 2 * linear(d_model, n_kv_heads * head_dim) + linear(d_model, d_model)
             + linear(d_model, d_ff) + linear(d_ff, d_model) + 2 * (2 * d_model))
    total = vocab_size * d_model + n_positions * d_model + n_layers * layer + 2 * d_model
    if not tied:
        total += linear(d_model, vocab_size, bias=False)
    return total
""",
    },
    "training_memory_gib": {
        "float bytes from bits, a lookup table": """
BITS = {"fp32": 32, "fp16": 16, "bf16": 16}
STATE_BITS = {"sgd": 0, "momentum": 32, "adam": 64, "adam8bit": 16}

def memory_per_param(precision="fp32", optimizer="adam", fp32_grads=False):
    if precision not in BITS:
        raise ValueError(f"unknown precision {precision!r}: use fp32, fp16 or bf16")
    if optimizer not in STATE_BITS:
        raise ValueError(f"unknown optimizer {optimizer!r}: use sgd, momentum, adam or adam8bit")
    weights = BITS[precision] / 8
    return {"weights": weights, "gradients": 4.0 if fp32_grads else weights,
            "master weights": 0.0 if precision == "fp32" else 4.0, "optimizer states": STATE_BITS[optimizer] / 8}


def training_memory_gib(n_params, precision="fp32", optimizer="adam"):
    require_positive(n_params=n_params)
    per_param = memory_per_param(precision, optimizer)
    total_bytes = sum(per_param[k] for k in ("weights", "gradients", "master weights", "optimizer states"))
    return total_bytes * n_params / 1024**3
""",
    },
    "kv_cache_gib": {
        "bytes per value, then GiB": """
def kv_cache_gib(n_layers, n_heads, n_kv_heads, d_model, seq_len, batch=1, bits=16):
    require_positive(integer=True, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                     d_model=d_model, seq_len=seq_len, batch=batch, bits=bits)
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not a multiple of n_heads={n_heads}")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    bytes_per_value = bits / 8
    per_token = 2 * n_layers * n_kv_heads * (d_model // n_heads) * bytes_per_value
    return per_token * seq_len * batch / math.pow(2, 30)
""",
    },
    "training_days": {
        "throughput first, then seconds": """
def training_days(n_params, n_tokens, n_gpus, gpu_tflops, mfu):
    require_positive(n_params=n_params, n_tokens=n_tokens, n_gpus=n_gpus, gpu_tflops=gpu_tflops, mfu=mfu)
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    throughput = n_gpus * gpu_tflops * 10**12 * mfu  # FLOP/s achieved
    return 6 * n_params * n_tokens / throughput / (24 * 60 * 60)
""",
    },
    "flops_ratio": {
        "real weights, FlopCounterMode with the math kernel": """
def flops_ratio(vocab_size, d_model, n_layers, n_heads, seq_len, batch=1):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    require_positive(integer=True, vocab_size=vocab_size, d_model=d_model, n_layers=n_layers,
                     n_heads=n_heads, seq_len=seq_len, batch=batch)
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not a multiple of n_heads={n_heads}")
    model = GPT(GPTConfig(vocab_size, seq_len, n_layers, n_heads, d_model)).eval()
    idx = torch.randint(0, vocab_size, (batch, seq_len))
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
        model(idx)
    n = sum(p.numel() for p in model.parameters())
    return float(counter.get_total_flops() / (2 * n * batch * seq_len))
""",
    },
}

CASES = [(gid, name) for gid, answers in ALTERNATIVES.items() for name in answers]


@pytest.mark.parametrize("gid, name", CASES, ids=[f"{g}: {n}" for g, n in CASES])
def test_a_correct_answer_written_differently_keeps_full_marks(gid, name):
    full_marks(A, gid, ALTERNATIVES[gid][name])


@pytest.mark.parametrize(
    "wrap", [float, np.float64, lambda x: torch.tensor(x, dtype=torch.float64), np.array]
)
def test_any_plain_number_type_is_accepted_and_rounding_passes(wrap):
    """A float, a numpy scalar or a one-element tensor or array is an answer; rounding differences pass."""
    grader.grade_kv_cache(lambda *a, **k: wrap(ref.kv_cache_gib(*a, **k) * (1 + 1e-13)))
    grader.grade_training_days(lambda *a, **k: wrap(ref.training_days(*a, **k)))


def test_off_by_more_than_rounding_fails_with_the_numbers():
    with pytest.raises(GradingFailure, match=r"= 1\.000001, expected 1$"):
        grader.check_kv_cache(lambda *a, **k: ref.kv_cache_gib(*a, **k) * (1 + 1e-6))


def test_a_parameter_count_must_be_exact():
    with pytest.raises(GradingFailure, match=r"= 124,439,809, expected 124,439,808"):
        grader.check_decoder_params(lambda *a, **k: ref.decoder_params(*a, **k) + 1)


@pytest.mark.parametrize("answer", ["1.0", None, [1.0], True])
def test_non_numbers_are_named(answer):
    with pytest.raises(GradingFailure, match="should return a number, got"):
        grader.check_kv_cache(lambda *a, **k: answer)


def test_ambiguous_numbers_name_every_matching_mistake():
    """fp32 Adam at 12 bytes is either a missing gradient or a missing moment: the hint says both."""

    def twelve_bytes(n, precision="fp32", optimizer="adam"):
        return n * 12 / 2**30

    with pytest.raises(GradingFailure) as info:
        grader.check_training_memory(twelve_bytes)
    assert "the gradients are missing" in str(info.value) and "Adam keeps two moments" in str(info.value)


def test_the_flops_band_is_narrower_than_every_mistake():
    """FLOPS_BAND's comment: on the graded shapes every listed mistake is at least twice the band away."""
    for shape in grader.FLOPS_SHAPES:
        flops, n, _ = grader._flops_parts(*shape)
        right = flops / (2 * n * shape[4] * shape[5])
        assert ref.flops_ratio(*shape) == pytest.approx(right, rel=1e-12)
        for wrong, hint in grader._flops_mistakes(*shape):
            if wrong != right:
                assert abs(wrong / right - 1) > 2 * grader.FLOPS_BAND, (shape, hint)


def test_chinchilla_optimal_is_the_minimum_on_the_budget():
    n, d = ref.chinchilla_optimal(5.76e23)
    assert 6 * n * d == pytest.approx(5.76e23, rel=1e-12)
    fit = ref.CHINCHILLA
    for f in (0.9, 1.1):
        assert fit.loss(n, d) < fit.loss(n * f, d / f)
