"""Checks for the appendix exercise (transformer arithmetic).

Each part has two entry points, both called from the notebook with the student's
function. ``check_*`` holds the *public* checks: one or two worked examples.
``grade_*`` holds the *hidden* checks: the student's function on several shapes and
settings against :mod:`coursekit.arithmetic` (whose formulas the course's tests compare
with real modules, real caches, real optimizer states and torch's FLOP counter), with a
relative tolerance (:data:`RTOL`). Before the generic "expected ..." hint, each check
computes the answers of the usual mistakes (the factor 2 of keys and values, bits for
bytes, GB for GiB, biases and norms forgotten, ``2 N D`` for ``6 N D`` ...) and names the
one the student's number equals.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from coursekit import arithmetic as ref
from coursekit.grading.core import Grader, describe, is_tensor

__all__ = [
    "RTOL",
    "check_decoder_params", "check_training_memory", "check_kv_cache", "check_training_days",
    "grade_decoder_params", "grade_training_memory", "grade_kv_cache", "grade_training_days",
]

#: Relative tolerance of every numeric answer: rounding differences pass, a missing term does not.
RTOL = 1e-6


def _number(x) -> float | None:
    """``x`` as a float if it is a plain number (int, float, numpy scalar or one-element tensor)."""
    if isinstance(x, bool) or isinstance(x, np.bool_):
        return None
    if isinstance(x, numbers.Real):
        return float(x)
    if isinstance(x, np.ndarray) and x.size == 1 and np.issubdtype(x.dtype, np.number):
        return float(x.reshape(()))
    if is_tensor(x) and x.numel() == 1 and x.dtype != torch.bool and not x.is_complex():
        return float(x.reshape(()))
    return None


def _fmt(x: float) -> str:
    """Whole numbers with thousands separators (parameter counts), the rest with 7 significant digits."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:.7g}"


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=RTOL, abs_tol=0.0)


def _expect_value(g: Grader, got, expected: float, call: str, mistakes=()) -> None:
    """Fail unless ``got`` is ``expected`` within :data:`RTOL`; name the mistakes it equals.

    ``mistakes`` are ``(value, hint)`` pairs: the answers of known wrong formulas (a mistake
    that happens to give the right answer on this input is skipped). When several give the
    student's number, every one is named.
    """
    value = _number(got)
    if value is None:
        g.fail(f"{call} should return a number, got {describe(got)}")
    if not math.isfinite(value):
        g.fail(f"{call} returned {value}, expected {_fmt(expected)}")
    if _close(value, expected):
        return
    matching = (hint for wrong, hint in mistakes if not _close(wrong, expected) and _close(value, wrong))
    hints = list(dict.fromkeys(matching))  # each hint once, in order
    if hints:
        g.fail(f"{call} = {_fmt(value)}, expected {_fmt(expected)}: " + "; or: ".join(hints))
    g.fail(f"{call} = {_fmt(value)}, expected {_fmt(expected)} (relative tolerance {RTOL:g})")


def _call(name: str, *args, **kwargs) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


# =========================================================================== part 1: decoder_params

_RULE_OF_THUMB = ("that is the rule of thumb V C + 12 L C^2: count every parameter exactly (position embeddings, "
                  "biases, layer norms, the true key/value width)")
_NO_BIASES = ("the biases are missing: each linear layer here has one (the q, k and v projections, the output "
              "projection and both feed-forward layers), one value per output")
_NO_NORMS = ("the layer norms are missing: two per layer and one final norm, each with a scale and a shift "
             "of d_model values (2 d_model)")
_NO_BIASES_NORMS = "the biases and the layer norms are missing: " + _NO_BIASES.split(": ", 1)[1] + \
    "; and two layer norms per layer plus a final one, 2 d_model each"
_ONE_VECTOR_NORMS = "a layer norm has two vectors of d_model values, a scale and a shift: 2 d_model, not d_model"
_NO_FINAL_NORM = "the final layer norm (2 d_model, after the last layer) is missing"
_NO_POSITIONS = "the learned position embeddings (n_positions x d_model) are missing"
_IGNORED_GQA = ("the key and value projections have n_kv_heads * d_head outputs each (d_head = d_model // n_heads), "
                "not d_model: with grouped-query attention only the query and output projections are d_model x d_model")
_KV_WIDTH = "the key/value width is n_kv_heads * d_head with d_head = d_model // n_heads, not n_kv_heads * d_model"
_TIED_TWICE = "with tied=True the output layer reuses the token embedding matrix: it adds no parameters"
_UNTIED_MISSING = "with tied=False the output layer is a separate vocab_size x d_model matrix (no bias): add it"
_IGNORED_D_FF = "use d_ff for the feed-forward width (4 * d_model only when d_ff is None)"


def _decoder_mistakes(V, T, C, L, H, H_kv=None, d_ff=None, tied=True) -> list[tuple[float, str]]:
    """The answers of the usual wrong counts, with their hints."""
    H_kv = H if H_kv is None else H_kv
    f = 4 * C if d_ff is None else d_ff
    exact = ref.decoder_params(V, T, C, L, H, H_kv, f, tied)
    kv = H_kv * (C // H)
    biases = (C + 2 * kv) + C + f + C
    norms = L * 4 * C + 2 * C
    head = 0 if tied else V * C
    wide_kv = exact + L * 2 * (C + 1) * (H_kv * C - kv)
    return [
        (V * C + 12 * L * C * C, _RULE_OF_THUMB),
        (V * C + 12 * L * C * C + head, _RULE_OF_THUMB),
        (exact - L * biases - norms, _NO_BIASES_NORMS),
        (exact - L * biases, _NO_BIASES),
        (exact - norms, _NO_NORMS),
        (exact - norms / 2, _ONE_VECTOR_NORMS),
        (exact - 2 * C, _NO_FINAL_NORM),
        (exact - T * C, _NO_POSITIONS),
        (ref.decoder_params(V, T, C, L, H, H, f, tied), _IGNORED_GQA),
        (wide_kv, _KV_WIDTH),
        (exact + V * C, _TIED_TWICE if tied else "the untied output layer has no bias and is counted once"),
        (exact - head, _UNTIED_MISSING),
        (ref.decoder_params(V, T, C, L, H, H_kv, None, tied), _IGNORED_D_FF),
    ]


def _check_decoder(g: Grader, decoder_params, args: tuple, kwargs: dict | None = None) -> None:
    kwargs = kwargs or {}
    names = ("vocab_size", "n_positions", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "tied")
    full = dict(zip(names, args)) | kwargs
    got = decoder_params(*args, **kwargs)
    _expect_value(g, got, ref.decoder_params(**full), _call("decoder_params", *args, **kwargs),
                  _decoder_mistakes(*(full.get(n) for n in names[:5]), full.get("n_kv_heads"), full.get("d_ff"),
                                    full.get("tied", True)))


def grade_decoder_params(decoder_params) -> None:
    """Grade ``decoder_params(vocab_size, n_positions, d_model, n_layers, n_heads, n_kv_heads, d_ff, tied)``."""
    g = Grader("decoder_params")

    with g.check("the GPT-2 family (multi-head attention, tied output layer)"):
        for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"):
            c = ref.PUBLISHED[name]
            _check_decoder(g, decoder_params, (c.vocab_size, c.block_size, c.d_model, c.n_layers, c.n_heads))

    with g.check("grouped-query attention: k and v have n_kv_heads * d_head outputs"):
        for args in ((50257, 1024, 768, 12, 12, 4), (32000, 4096, 4096, 32, 32, 8), (1000, 64, 96, 3, 6, 1)):
            _check_decoder(g, decoder_params, args)

    with g.check("an explicit feed-forward width d_ff"):
        _check_decoder(g, decoder_params, (32000, 2048, 2048, 16, 16, 4, 5504))
        _check_decoder(g, decoder_params, (500, 32, 64, 2, 4, 2, 100))

    with g.check("an untied output layer adds vocab_size x d_model"):
        _check_decoder(g, decoder_params, (32000, 4096, 4096, 32, 32, 8, 11008, False))
        _check_decoder(g, decoder_params, (50257, 1024, 768, 12, 12), {"tied": False})

    with g.check("defaults: n_kv_heads=None is multi-head attention, d_ff=None is 4 * d_model"):
        got = decoder_params(1000, 128, 256, 4, 8)
        explicit = ref.decoder_params(1000, 128, 256, 4, 8, 8, 1024)
        _expect_value(g, got, explicit, "decoder_params(1000, 128, 256, 4, 8)", _decoder_mistakes(1000, 128, 256, 4, 8))

    g.finish()


def check_decoder_params(decoder_params) -> None:
    g = Grader("decoder_params (public)")
    with g.check("GPT-2 small: decoder_params(50257, 1024, 768, 12, 12) == 124,439,808"):
        _check_decoder(g, decoder_params, (50257, 1024, 768, 12, 12))
    with g.check("with 4 key/value heads: decoder_params(50257, 1024, 768, 12, 12, 4) == 114,990,336"):
        _check_decoder(g, decoder_params, (50257, 1024, 768, 12, 12, 4))
    g.finish()


# =========================================================================== part 2: training_memory_gib

_GB = "a GiB is 2**30 bytes; you divided by 10**9, which is a GB"
_BITS = "you counted bits, not bytes (a float32 value is 4 bytes, 32 bits): divide by 8"
_NO_GRADS = "the gradients are missing: training keeps one per parameter (4 bytes in fp32, 2 in fp16/bf16)"
_NO_MASTER = ("the float32 master weights are missing: mixed precision keeps 16-bit weights and gradients "
              "(2 + 2 bytes) and a float32 copy of the weights (4 bytes) that the optimizer updates")
_FP32_GRADS = ("here gradients are kept in 16 bits, as the weights (ZeRO's convention: 16 bytes for mixed-precision "
               "Adam); you kept them in float32 (the 18-byte convention)")
_MIXED_AS_FP32 = ("in mixed precision (fp16/bf16) the weights and gradients are 16-bit, 2 bytes each; "
                  "only the master copy and the optimizer states are float32")
_ONE_MOMENT = "Adam keeps two moments per parameter (m and v), 4 bytes each in float32: 8 bytes of state"
_MOMENTUM_TWO = "SGD with momentum keeps one buffer per parameter (4 bytes in float32), not two"
_MOMENTUM_NONE = "SGD with momentum keeps a momentum buffer per parameter (4 bytes in float32)"
_SGD_STATE = "plain SGD keeps no optimizer state: only weights and gradients (and the master copy in mixed precision)"
_ADAM8_BYTES = "8-bit Adam stores each of its two moments in 8 bits = 1 byte (2 bytes of state), not 8 bytes"
_ADAM8_FP32 = "8-bit Adam stores its two moments in 8 bits, 1 byte each, not in float32"
_ADAM8_ONE = "8-bit Adam still keeps two moments (m and v), 1 byte each: 2 bytes of state"

PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("sgd", "momentum", "adam", "adam8bit")


def _memory_mistakes(n: float, precision: str, optimizer: str) -> list[tuple[float, str]]:
    comp = ref.memory_per_param(precision, optimizer)
    mixed = precision != "fp32"
    variants = [({"gradients": 0}, _NO_GRADS)]
    if mixed:
        variants += [({"master weights": 0}, _NO_MASTER), ({"gradients": 4}, _FP32_GRADS),
                     ({"weights": 4, "gradients": 4}, _MIXED_AS_FP32)]
    states = {"adam": [(4, _ONE_MOMENT)], "momentum": [(8, _MOMENTUM_TWO), (0, _MOMENTUM_NONE)],
              "sgd": [(4, _SGD_STATE), (8, _SGD_STATE)],
              "adam8bit": [(16, _ADAM8_BYTES), (8, _ADAM8_FP32), (1, _ADAM8_ONE)]}
    variants += [({"optimizer states": s}, hint) for s, hint in states[optimizer]]
    out = []
    for change, hint in variants:
        out.append((n * sum((comp | change).values()) / 2**30, hint))
    total = sum(comp.values())
    out += [(n * total / 1e9, _GB), (n * total * 8 / 2**30, _BITS), (n * total * 8 / 1e9, _BITS)]
    return out


def _check_memory(g: Grader, training_memory_gib, n: float, precision: str, optimizer: str) -> None:
    got = training_memory_gib(n, precision, optimizer)
    _expect_value(g, got, ref.training_memory_gib(n, precision, optimizer),
                  _call("training_memory_gib", n, precision, optimizer), _memory_mistakes(n, precision, optimizer))


def grade_training_memory(training_memory_gib) -> None:
    """Grade ``training_memory_gib(n_params, precision, optimizer)``."""
    g = Grader("training_memory_gib")

    with g.check("the result is in GiB (2**30 bytes)"):
        _check_memory(g, training_memory_gib, 2**30, "fp32", "sgd")
        _check_memory(g, training_memory_gib, 1e9, "fp32", "adam")

    with g.check("weights and gradients: plain SGD, fp32 and mixed precision"):
        for precision in PRECISIONS:
            _check_memory(g, training_memory_gib, 3e9, precision, "sgd")

    with g.check("SGD with momentum keeps one float32 buffer"):
        for precision in PRECISIONS:
            _check_memory(g, training_memory_gib, 1.3e8, precision, "momentum")

    with g.check("Adam keeps two float32 moments: 16 bytes per parameter in mixed precision and in fp32"):
        for precision in ("bf16", "fp16", "fp32"):
            _check_memory(g, training_memory_gib, 7e9, precision, "adam")

    with g.check("8-bit Adam keeps two 1-byte moments"):
        for precision in ("fp32", "bf16"):
            _check_memory(g, training_memory_gib, 7e9, precision, "adam8bit")

    with g.check("unknown precision or optimizer names raise a ValueError"):
        for args in ((1e9, "fp8", "adam"), (1e9, "fp32", "adagrad")):
            try:
                got = training_memory_gib(*args)
            except ValueError:
                continue
            g.fail(f"{_call('training_memory_gib', *args)} returned {got!r}: raise a ValueError that names the "
                   f"accepted values ({', '.join(PRECISIONS)} and {', '.join(OPTIMIZERS)})")

    g.finish()


def check_training_memory(training_memory_gib) -> None:
    g = Grader("training_memory_gib (public)")
    with g.check("1e9 parameters, fp32 Adam: 16e9 bytes = 14.90 GiB"):
        _check_memory(g, training_memory_gib, 1e9, "fp32", "adam")
    with g.check("1e9 parameters, bf16 Adam: 2 + 2 + 4 + 8 = 16 bytes, 14.90 GiB too"):
        _check_memory(g, training_memory_gib, 1e9, "bf16", "adam")
    g.finish()


# =========================================================================== part 3: kv_cache_gib

_NO_FACTOR_2 = ("the factor 2 is missing: every layer caches a key AND a value vector per token and key/value head")
_N_HEADS = ("with grouped-query attention only the n_kv_heads key/value heads are cached, not the n_heads query heads")
_D_MODEL = "each cached head has width d_head = d_model // n_heads, not d_model"
_KV_BITS = "bits is the number of bits per cached value: divide by 8 to get bytes"
_IGNORED_BITS = "use the bits argument (bits / 8 bytes per value), not always 2 bytes"
_KV_GB = "a GiB is 2**30 bytes; you divided by 10**9, which is a GB"
_MIB = "a GiB is 2**30 bytes; you divided by 2**20 (a MiB)"
_NO_BATCH = "multiply by the batch: every sequence has its own cache"


def _kv_mistakes(L, H, H_kv, C, T, B=1, bits=16) -> list[tuple[float, str]]:
    right = ref.kv_cache_gib(L, H, H_kv, C, T, B, bits)
    n_bytes = right * 2**30
    out = [
        (right / 2, _NO_FACTOR_2),
        (right * H / H_kv, _N_HEADS),
        (right * H, _D_MODEL),
        (right * 8, _KV_BITS),
        (right * 16 / bits, _IGNORED_BITS),
        (n_bytes / 1e9, _KV_GB),
        (n_bytes / 2**20, _MIB),
        (right / B, _NO_BATCH),
    ]
    if H_kv != H:
        out.append((right * H * H / H_kv, _N_HEADS + "; and " + _D_MODEL))
    return out


def _check_kv(g: Grader, kv_cache_gib, *args) -> None:
    got = kv_cache_gib(*args)
    _expect_value(g, got, ref.kv_cache_gib(*args), _call("kv_cache_gib", *args), _kv_mistakes(*args))


def grade_kv_cache(kv_cache_gib) -> None:
    """Grade ``kv_cache_gib(n_layers, n_heads, n_kv_heads, d_model, seq_len, batch, bits)``."""
    g = Grader("kv_cache_gib")

    with g.check("multi-head attention (n_kv_heads = n_heads), 16 bits"):
        _check_kv(g, kv_cache_gib, 12, 12, 12, 768, 1024, 1, 16)
        _check_kv(g, kv_cache_gib, 48, 25, 25, 1600, 1024, 1, 16)

    with g.check("grouped-query attention caches n_kv_heads heads of width d_model // n_heads"):
        _check_kv(g, kv_cache_gib, 32, 32, 8, 4096, 8192, 1, 16)
        _check_kv(g, kv_cache_gib, 80, 64, 8, 8192, 4096, 1, 16)
        _check_kv(g, kv_cache_gib, 28, 28, 4, 3584, 32768, 1, 16)

    with g.check("the batch multiplies the cache"):
        _check_kv(g, kv_cache_gib, 32, 32, 8, 4096, 2048, 16, 16)

    with g.check("bits per value: a quantized cache (8 and 4 bits)"):
        _check_kv(g, kv_cache_gib, 32, 32, 8, 4096, 8192, 1, 8)
        _check_kv(g, kv_cache_gib, 32, 32, 4, 4096, 100000, 2, 4)

    with g.check("multi-query attention (n_kv_heads = 1) and the default batch and bits"):
        got = kv_cache_gib(24, 16, 1, 2048, 2048)
        _expect_value(g, got, ref.kv_cache_gib(24, 16, 1, 2048, 2048), "kv_cache_gib(24, 16, 1, 2048, 2048)",
                      _kv_mistakes(24, 16, 1, 2048, 2048))

    g.finish()


def check_kv_cache(kv_cache_gib) -> None:
    g = Grader("kv_cache_gib (public)")
    with g.check("a Llama-3-8B shape at 8192 tokens: kv_cache_gib(32, 32, 8, 4096, 8192) == 1.0"):
        _check_kv(g, kv_cache_gib, 32, 32, 8, 4096, 8192, 1, 16)
    g.finish()


# =========================================================================== part 4: training_days

_2ND = ("training costs 6 N D FLOPs (2 N D in the forward pass, 4 N D in the backward pass); "
        "2 N D is the forward pass alone")
_NO_MFU = "divide by the MFU as well: the GPUs deliver only mfu x their peak"
_MFU_TIMES = "the achieved throughput is n_gpus * peak * mfu: divide the FLOPs by it (you multiplied by mfu)"
_HOURS = "return days: divide the seconds by 86400 (24 * 3600); you returned hours"
_SECONDS = "return days: divide the seconds by 86400 (24 * 3600)"
_MINUTES = "return days: divide the seconds by 86400 (24 * 3600); you returned minutes"
_TERA = "gpu_tflops is in TFLOP/s: multiply by 10**12 to get FLOP/s"
_NO_GPUS = "divide by the number of GPUs: they share the work"


def _days_mistakes(N, D, n_gpus, tflops, mfu) -> list[tuple[float, str]]:
    right = ref.training_days(N, D, n_gpus, tflops, mfu)
    return [
        (right / 3, _2ND), (right * mfu, _NO_MFU), (right * mfu * mfu, _MFU_TIMES), (right * 24, _HOURS),
        (right * 86400, _SECONDS), (right * 1440, _MINUTES), (right * 1e12, _TERA), (right * n_gpus, _NO_GPUS),
        (right / 3 * mfu, _2ND + "; and " + _NO_MFU),
    ]


def _check_days(g: Grader, training_days, *args) -> None:
    got = training_days(*args)
    _expect_value(g, got, ref.training_days(*args), _call("training_days", *args), _days_mistakes(*args))


def grade_training_days(training_days) -> None:
    """Grade ``training_days(n_params, n_tokens, n_gpus, gpu_tflops, mfu)``."""
    g = Grader("training_days")

    with g.check("GPT-3's 175B parameters on 300B tokens, 1024 A100s at 40% MFU"):
        _check_days(g, training_days, 175e9, 300e9, 1024, 312.0, 0.4)

    with g.check("a Chinchilla-sized run: 70B parameters, 1.4T tokens, 2048 H100s at 35% MFU"):
        _check_days(g, training_days, 70e9, 1.4e12, 2048, 989.0, 0.35)

    with g.check("small runs: the units (TFLOP/s, seconds to days)"):
        _check_days(g, training_days, 1.24e8, 1e10, 1, 125.0, 0.3)
        _check_days(g, training_days, 1e9, 2e10, 8, 312.0, 0.45)

    with g.check("twice the GPUs take half the time"):
        one = _number(training_days(7e9, 2e12, 256, 989.0, 0.4))
        two = _number(training_days(7e9, 2e12, 512, 989.0, 0.4))
        g.expect(one is not None and two is not None and _close(one, 2 * two),
                 f"256 GPUs gave {one} days and 512 GPUs {two}: the time must halve when the GPUs double "
                 "(" + _NO_GPUS + ")")

    g.finish()


def check_training_days(training_days) -> None:
    g = Grader("training_days (public)")
    with g.check("1e9 parameters, 2e10 tokens, 8 GPUs of 312 TFLOP/s at 50% MFU: 1.113 days"):
        _check_days(g, training_days, 1e9, 2e10, 8, 312.0, 0.5)
    g.finish()
