"""Checks for Exercise 8 (cross-attention and the decoder of an encoder-decoder).

Each part has two entry points, both called from the notebook with the student's object.
``check_*`` holds the *public* checks: one small, fixed example per clause of the part's text.
``grade_*`` holds the *hidden* checks: one named check per clause, on inputs drawn across what
the text allows (:func:`~coursekit.grading.core.for_all`: batch sizes and lengths including 1,
T != S, padded and fully padded sources, every grouping of key/value heads, layers with and
without biases, both float dtypes, large logits where stability is promised, any smoothing and
padding id), compared with independent references (Hugging Face's BART ``shift_tokens_right``
in the tests, ``nn.MultiheadAttention``, ``nn.TransformerDecoderLayer``,
``F.cross_entropy(label_smoothing=...)``) and with :mod:`coursekit.seq2seq` in float64, plus
properties (a future target does not change earlier outputs, padded source tokens get no
attention). Each dropout is checked in isolation and deterministically: with probability 1 in
training mode (everything it acts on is dropped), and for cross-attention's weights, which are
returned, by checking that each weight is either dropped or scaled by ``1 / (1 - p)`` and that
the output is computed from them. Before the generic "differs" hint, each check tries the common
mistakes and names the one that matches.

Modules cross no wire: under the autograder the student's code runs in a sandboxed process, so
the graders of parts 2 and 3 receive *classes* (the notebook's ``MultiHeadAttention``, the
student's ``PreNormDecoderLayer``), build the modules with them in the student's process and
push weights with ``load_state_dict``.

Shared helpers come from :mod:`coursekit.grading.core` (``call_student`` turns an exception of
the student's code into a hint that names the input).

Over 500 lines: one named check per clause of the exercise text for each graded part, public and
hidden, with the inputs that provoke each clause and the common mistakes each hint names; splitting
it would scatter one exercise's specification over several files.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn

from coursekit import layers as L
from coursekit import multihead as mh
from coursekit import seq2seq as ref
from coursekit.attention import causal_mask, softmax
from coursekit.experiments import number_words
from coursekit.grading.ch07_gpt import (
    _num,
    attention_pair,
)  # Exercise 7's helpers and attention pair
from coursekit.grading.core import (
    Grader,
    call_student,
    close,
    describe,
    dtype_name,
    expect_value_error,
    first_match,
    for_all,
    is_tensor,
    magnitude,
    probe,
    rand,
    random_weights,
    set_attr,
    student_side,
    tensor,
)
from coursekit.grading.questions import Prediction, expect_in_band

__all__ = [
    "check_shift_right",
    "check_cross_attention",
    "check_pre_norm_decoder_layer",
    "check_label_smoothed_loss",
    "grade_shift_right",
    "grade_cross_attention",
    "grade_pre_norm_decoder_layer",
    "grade_label_smoothed_loss",
    "check_predict_smoothing_floor",
    "grade_predict_smoothing_floor",
    "check_predict_encoder_passes",
    "grade_predict_encoder_passes",
    "check_predict_bleu_one_word",
    "grade_predict_bleu_one_word",
    "check_heldout_loss",
    "grade_heldout_loss",
    "check_length_penalty_score",
    "grade_length_penalty_score",
]

C, H, DFF = 12, 4, 20  # D = 3: scaling by sqrt(C) and by sqrt(D) differ; C and H as ch07's attention_pair
D = C // H
BOS, PAD = 1, 0
FLOATS = (torch.float64, torch.float32)
SEEDS = st.integers(0, 2**31 - 1)
#: (C, H, H_kv, bias) of the attention modules the cross-attention checks draw
CONFIGS = [
    (12, 4, 4, True),
    (12, 4, 2, True),
    (12, 4, 1, False),
    (6, 1, 1, True),
    (6, 3, 3, False),
    (8, 2, 1, True),
    (12, 6, 3, False),
    (12, 6, 2, True),
    (10, 5, 5, True),
]
GQA_CONFIGS = [c for c in CONFIGS if c[2] < c[1]]


def _gen(seed: int, offset: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed) + offset)


def _ids_from(seed: int, *shape: int, low: int = 3, high: int = 30) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=_gen(seed, 7))


def _mask_text(keep: torch.Tensor) -> str:
    """A padding mask for a hint: its 0/1 rows when small, else its shape."""
    return str(keep.int().tolist()) if keep.numel() <= 16 else str(tuple(keep.shape))


def _keep_mask(seed: int, B: int, S: int, empty_rows: bool = False) -> torch.Tensor:
    """A (B, S) padding mask: a random length per row (at least 1 unless ``empty_rows``), True first."""
    low = 0 if empty_rows else 1
    lengths = torch.randint(low, S + 1, (B,), generator=_gen(seed, 13))
    return torch.arange(S)[None, :] < lengths[:, None]


# =========================================================================== part 1: shift_right

_DROPS_FIRST = (
    "the first label was dropped instead of the last: the decoder input is bos_id followed by "
    "labels[:, :-1] (position t holds target t - 1; the last target is never an input)"
)
_NO_BOS = "the decoder input must start with bos_id: torch.cat([a column of bos_id, labels[:, :-1]], dim=1)"
_ROLLED = (
    "torch.roll wraps the last label around to position 0: drop the last label and put bos_id at "
    "position 0 instead"
)
_MINUS_100 = (
    "a label of -100 (Hugging Face's 'not scored') is not a token id and would crash the embedding: "
    "replace it with pad_id in the decoder input"
)
_SHIFTED_LEFT = (
    "the labels were shifted left: the decoder input at position t must be target t - 1 "
    "(shift right, with bos_id at position 0)"
)
_FIXED_IDS = "bos_id and pad_id are arguments: use them, not fixed numbers"


def _shift_mistakes(labels, bos_id, pad_id):
    B = labels.shape[0]
    bos = labels.new_full((B, 1), bos_id)
    fill = labels.new_full((B, 1), pad_id)

    def clean(t, pad=pad_id):
        return t.masked_fill(t == -100, pad)

    out = [
        (clean(torch.cat([bos, labels[:, 1:]], 1)), _DROPS_FIRST),
        (clean(torch.roll(labels, 1, dims=1)), _ROLLED),
        (clean(torch.cat([labels[:, 1:], bos], 1)), _SHIFTED_LEFT),
        (torch.cat([bos, labels[:, :-1]], 1), _MINUS_100),
    ]
    if bos_id != pad_id:
        out.insert(1, (clean(torch.cat([fill, labels[:, :-1]], 1)), _NO_BOS))
    for b, p in ((BOS, PAD), (BOS, pad_id), (bos_id, PAD)):
        if (b, p) != (bos_id, pad_id):
            out.append((clean(torch.cat([labels.new_full((B, 1), b), labels[:, :-1]], 1), p), _FIXED_IDS))
    return out


def _shift_where(labels, bos_id, pad_id, keywords=False) -> str:
    shown = labels.tolist() if labels.numel() <= 12 else f"{describe(labels)}"
    args = f"bos_id={bos_id}, pad_id={pad_id}" if keywords else f"{bos_id}, {pad_id}"
    return f"shift_right({shown}, {args})"


def _shift_call(g: Grader, shift_right, labels, bos_id, pad_id, keywords=False):
    where = _shift_where(labels, bos_id, pad_id, keywords)
    kwargs = {"bos_id": bos_id, "pad_id": pad_id} if keywords else {}
    args = () if keywords else (bos_id, pad_id)
    p = call_student(g, where, probe, shift_right, labels.clone(), *args, **kwargs)
    out = p.result
    B, T = labels.shape
    if is_tensor(out) and out.shape == (B, T + 1):
        g.fail(
            f"{where}: the output has T + 1 = {T + 1} columns: keep the length T, the decoder input is bos_id "
            "followed by labels[:, :-1] (drop the last label)"
        )
    g.expect(
        is_tensor(out) and out.shape == (B, T) and out.dtype == torch.long,
        f"{where}: expected a torch.long tensor of shape {(B, T)}, got {describe(out)}",
    )
    if p.args and is_tensor(p.args[0]) and not torch.equal(p.args[0], labels):
        g.fail(
            f"{where} changed labels in place: the caller still needs them as the targets; build a new tensor "
            "(torch.cat, masked_fill rather than masked_fill_)"
        )
    return out, where


def _shift_value(g: Grader, shift_right, labels, bos_id, pad_id, keywords=False, what: str = "") -> None:
    out, where = _shift_call(g, shift_right, labels, bos_id, pad_id, keywords)
    expected = ref.shift_right(labels, bos_id, pad_id)
    first_match(g, out, [(m, f"{where}: {h}") for m, h in _shift_mistakes(labels, bos_id, pad_id)], expected)
    if bool((out == -100).any()):
        g.fail(f"{where}: {_MINUS_100}")
    g.expect(torch.equal(out, expected), f"{where}: expected {expected.tolist()}, got {out.tolist()}{what}")


_SHIFT_SIZES = st.tuples(st.integers(1, 4), st.integers(1, 9))


def grade_shift_right(shift_right) -> None:
    """Grade a student's ``shift_right(labels, bos_id, pad_id)``."""
    g = Grader("shift_right")

    with g.check("returns a (B, T) torch.long tensor (any B, T >= 1)"):

        def shape(case):
            (B, T), seed = case
            _shift_call(g, shift_right, _ids_from(seed, B, T), BOS, PAD)

        for_all("shift.shape", st.tuples(_SHIFT_SIZES, SEEDS), shape, max_examples=6, first=((1, 1), 0))

    with g.check("position 0 holds bos_id and position t label t - 1 (the last label is dropped)"):

        def shifted(case):
            (B, T), seed = case
            _shift_value(g, shift_right, _ids_from(seed, B, T), BOS, PAD)

        for_all("shift.values", st.tuples(_SHIFT_SIZES, SEEDS), shifted, max_examples=12, first=((2, 4), 1))

    with g.check("bos_id and pad_id are the arguments (any ids, positionally or by keyword)"):

        def arguments(case):
            (B, T), bos_id, pad_id, keywords, seed = case
            labels = _ids_from(seed, B, T)
            labels = labels.masked_fill(torch.rand(B, T, generator=_gen(seed, 3)) < 0.3, -100)
            _shift_value(g, shift_right, labels, bos_id, pad_id, keywords, what=f" ({_FIXED_IDS})")

        for_all(
            "shift.args",
            st.tuples(_SHIFT_SIZES, st.integers(0, 40), st.integers(0, 40), st.booleans(), SEEDS),
            arguments,
            max_examples=12,
            first=((2, 5), 5, 9, False, 2),
        )

    with g.check("a label of -100 becomes pad_id (anywhere, and padding is shifted along)"):

        def minus_100(case):
            (B, T), rate, seed = case
            labels = _ids_from(seed, B, T)
            labels = labels.masked_fill(torch.rand(B, T, generator=_gen(seed, 5)) < rate, -100)
            _shift_value(g, shift_right, labels, BOS, PAD)

        for_all(
            "shift.ignore",
            st.tuples(_SHIFT_SIZES, st.sampled_from([0.3, 0.7, 1.0]), SEEDS),
            minus_100,
            max_examples=10,
            first=((2, 5), 0.7, 3),
        )
        labels = _ids_from(4, 3, 7)
        labels[0, 5:] = PAD
        labels[1, 2:] = -100
        labels[2, 6] = -100
        _shift_value(g, shift_right, labels, BOS, PAD)

    with g.check("leaves labels unchanged"):

        def untouched(case):
            (B, T), seed = case
            labels = _ids_from(seed, B, T).masked_fill(torch.rand(B, T, generator=_gen(seed, 5)) < 0.3, -100)
            _shift_call(g, shift_right, labels, BOS, PAD)

        for_all("shift.inplace", st.tuples(_SHIFT_SIZES, SEEDS), untouched, max_examples=5, first=((2, 4), 5))

    with g.check("raises ValueError unless labels is a 2-D torch.long tensor with T >= 1"):

        def errors(case):
            (B, T), which, seed = case
            labels = _ids_from(seed, B, T)
            bad = {
                "1-D": (
                    labels[0],
                    f"1-D labels {tuple(labels[0].shape)}",
                    "labels must be (B, T); one sequence is labels[None]",
                ),
                "3-D": (labels[..., None], f"3-D labels {(B, T, 1)}", "labels must be (B, T)"),
                "T = 0": (labels[:, :0], f"labels {(B, 0)} (T = 0)", "a target sequence needs T >= 1"),
                "int32": (labels.int(), f"int32 labels {(B, T)}", "token ids are torch.long"),
                "float": (labels.float(), f"float32 labels {(B, T)}", "token ids are torch.long"),
            }
            x, what, fix = bad[which]
            expect_value_error(g, lambda: shift_right(x, BOS, PAD), what, fix)

        kinds = ["1-D", "3-D", "T = 0", "int32", "float"]
        for_all(
            "shift.errors",
            st.tuples(_SHIFT_SIZES, st.sampled_from(kinds), SEEDS),
            errors,
            max_examples=10,
            first=((2, 3), "1-D", 6),
        )
        for kind in kinds:
            errors(((2, 3), kind, 7))

    g.finish()


def check_shift_right(shift_right) -> None:
    """Public checks of ``shift_right``: one small example per clause the hidden checks grade."""
    g = Grader("shift_right (public)")
    labels = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    with g.check("returns a (B, T) torch.long tensor"):
        _shift_call(g, shift_right, labels, 1, 0)
    with g.check("[[5, 6, 7, EOS=2], [8, 2, PAD, PAD]] -> [[BOS=1, 5, 6, 7], [1, 8, 2, 0]]"):
        _shift_value(g, shift_right, labels, 1, 0)
    with g.check("bos_id=4 and pad_id=9 by keyword: [[5, -100]] -> [[4, 5]], [[-100, 6]] -> [[4, 9]]"):
        _shift_value(g, shift_right, torch.tensor([[5, -100], [-100, 6]]), 4, 9, keywords=True)
    with g.check("-100 becomes pad_id"):
        _shift_value(g, shift_right, torch.tensor([[5, 6, -100, -100]]), 1, 0)
    with g.check("labels are left unchanged"):
        _shift_call(g, shift_right, torch.tensor([[5, -100, 7]]), 1, 0)
    with g.check("1-D labels and float labels raise ValueError"):
        expect_value_error(
            g,
            lambda: shift_right(torch.tensor([4, 5, 6]), BOS, PAD),
            "1-D labels",
            "labels must be (B, T); a single sequence is labels[None]",
        )
        expect_value_error(
            g,
            lambda: shift_right(torch.tensor([[4.0, 5.0]]), BOS, PAD),
            "float labels",
            "token ids are torch.long",
        )
    g.finish()


# =========================================================================== part 2: cross_attention

_KV_FROM_X = (
    "the keys and values come from x: in cross-attention only the queries come from the decoder's x, the "
    "keys "
    "and values from the encoder's memory (attn.project(x, memory))"
)
_Q_FROM_MEMORY = (
    "the queries come from memory: the output must have one row per decoder position, (B, T, C); "
    "queries from x, keys and values from memory"
)
_MASK_IGNORED = (
    "memory_key_padding_mask was ignored: padded source tokens must get no attention; broadcast it to "
    "(B, 1, 1, S) and mask the scores"
)
_MASK_INVERTED = (
    "memory_key_padding_mask is inverted: in this course True marks a real source token (may attend) and "
    "False padding"
)
_NOT_SCALED = "the scores are not scaled: divide q k^T by sqrt(D), D = attn.d_head"
_NO_OUT_PROJ = "the output projection is missing: return attn.out_proj(merge_heads(out))"
_WRONG_AXIS = (
    "the softmax runs over the wrong axis: each query's weights must sum to 1 over the S source positions "
    "(the last axis of the (B, H, T, S) scores)"
)
_CAUSAL = (
    "cross-attention is not causal: every target position may read the whole source (mask only the padding), "
    "the causal mask belongs to the decoder's self-attention"
)
_GROUPS = (
    "the key/value heads are not repeated for the query heads: with attn.n_kv_heads < attn.n_heads use "
    "repeat_kv(k, attn.n_heads // attn.n_kv_heads) (query head h reads key/value head h // (H / H_kv))"
)


def _manual(r, q_src, kv_src, mask=None, scale=None, dim=-1, out_proj=True, tiled=False):
    """``r``'s attention from ``q_src`` to ``kv_src`` computed by hand, with a mistake's knobs."""
    q, k, v = r.project(q_src, kv_src)  # (B, H, Tq, D), (B, H_kv, S, D) x 2
    n_rep = r.n_heads // r.n_kv_heads
    if tiled:
        k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)
    else:
        k, v = mh.repeat_kv(k, n_rep), mh.repeat_kv(v, n_rep)
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(r.d_head) if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = softmax(scores, dim=dim)  # a fully masked row gives zeros, as in the reference
    out = mh.merge_heads(w @ v)
    return (r.out_proj(out) if out_proj else out), w


def _cross_mistakes(r, x, memory, keep):
    m4 = None if keep is None else keep[:, None, None, :]
    T, S = x.shape[1], memory.shape[1]
    out = [
        (_manual(r, x, memory, m4, scale=1.0)[0], _NOT_SCALED),
        (
            _manual(r, x, memory, m4, scale=1 / math.sqrt(r.d_model))[0],
            f"the scores are scaled by 1/sqrt(C): divide by sqrt(D), the head width D = attn.d_head = {r.d_head}, not "
            "the model width",
        ),
        (_manual(r, x, memory, m4, out_proj=False)[0], _NO_OUT_PROJ),
        (_manual(r, x, memory, m4, dim=-2)[0], _WRONG_AXIS),
    ]
    if 1 < r.n_kv_heads < r.n_heads:
        out.append((_manual(r, x, memory, m4, tiled=True)[0], _GROUPS))
    if T > 1:
        causal = torch.ones(T, S, dtype=torch.bool).tril()  # (T, S), as a student would write it
        out.append((_manual(r, x, memory, causal if m4 is None else causal & m4)[0], _CAUSAL))
    if keep is not None:
        out.insert(0, (_manual(r, x, memory)[0], _MASK_IGNORED))
        out.insert(1, (_manual(r, x, memory, ~m4)[0], _MASK_INVERTED))
    if T == S:
        out.insert(0, (r(x)[0], _KV_FROM_X))
    return out


def _cross_where(config, B, T, S, keep=None, dtype=torch.float64, extra="") -> str:
    Cc, Hh, kv, bias = config
    mask = "" if keep is None else f", memory_key_padding_mask {_mask_text(keep)}"
    return (
        f"cross_attention(attn (C={Cc}, H={Hh}, n_kv_heads={kv}, bias={bias}{extra}), x ({B}, {T}, {Cc}) "
        f"{dtype_name(dtype)}, memory ({B}, {S}, {Cc}){mask})"
    )


def _cross_call(g: Grader, fn, where: str, m, x, memory, keep=None, n_heads: int | None = None):
    args = (m, x, memory) if keep is None else (m, x, memory, keep)
    result = call_student(g, where, fn, *args)
    B, T, S, Cc = x.shape[0], x.shape[1], memory.shape[1], x.shape[2]
    Hh = n_heads or H
    g.expect(
        isinstance(result, tuple) and len(result) == 2,
        f"{where}: cross_attention should return a tuple (out, weights), got {describe(result)}",
    )
    out, w = result
    if is_tensor(out) and out.shape == (B, S, Cc) and S != T:
        g.fail(f"{where}: {_Q_FROM_MEMORY}")
    if is_tensor(w) and w.shape == (B, Hh, T, T) and S != T:
        g.fail(f"{where}: {_KV_FROM_X}")
    g.expect(
        is_tensor(out) and out.shape == (B, T, Cc) and out.dtype == x.dtype,
        f"{where}: the output should be (B, T, C) = {(B, T, Cc)} of x's dtype {dtype_name(x.dtype)}, "
        f"got {describe(out)}",
    )
    g.expect(
        is_tensor(w) and w.shape == (B, Hh, T, S),
        f"{where}: the weights should be (B, H, T, S) = {(B, Hh, T, S)}, one row per head and query, got "
        f"{describe(w)}",
    )
    return out, w


def _cross_case(
    g: Grader,
    fn,
    MultiHeadAttention,
    name: str,
    config,
    B: int,
    T: int,
    S: int,
    keep=None,
    dtype=torch.float64,
    seed: int = 0,
) -> None:
    """The student's cross-attention against Chapter 2's ``attn(x, kv=memory, key_padding_mask=...)``."""
    Cc, Hh, kv, bias = config
    m, r = attention_pair(MultiHeadAttention, name, kv, d_model=Cc, n_heads=Hh, bias=bias)
    x, memory = tensor(seed, B, T, Cc), tensor(seed + 1, B, S, Cc)
    expected, expected_w = r(x, kv=memory, key_padding_mask=keep, need_weights=True)
    where = _cross_where(config, B, T, S, keep, dtype)
    if dtype != torch.float64:
        m.to(dtype)
    out, w = _cross_call(g, fn, where, m, x.to(dtype), memory.to(dtype), keep, Hh)
    if keep is not None and is_tensor(w) and w.dtype.is_floating_point:
        padded = ~keep[:, None, None, :].expand_as(w)
        if bool((w[padded] != 0).any()):
            g.fail(
                f"{where}: padded source positions got attention weight: mask their scores with -inf before the "
                "softmax (True in memory_key_padding_mask marks a real token)"
            )
    if dtype == torch.float64:
        first_match(
            g, out, [(mm, f"{where}: {h}") for mm, h in _cross_mistakes(r, x, memory, keep)], expected
        )
    M = magnitude(x, memory)
    g.expect(
        close(out, expected.to(dtype), magnitude=M),
        f"{where}: the output differs from Chapter 2's attn(x, kv=memory, key_padding_mask=mask)[0] with the same "
        "weights (queries from x, keys and values from memory, softmax(q k^T / sqrt(D)) over the S source "
        "positions)",
    )
    g.expect(
        close(w, expected_w.to(dtype), magnitude=M),
        f"{where}: the weights differ from softmax(q k^T / sqrt(D)) over the source positions, per head",
    )


_CROSS_SIZES = st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 6))


def grade_cross_attention(cross_attention, MultiHeadAttention) -> None:
    """Grade a student's ``cross_attention(attn, x, memory, memory_key_padding_mask=None)``.

    ``MultiHeadAttention`` is the notebook's name for Chapter 2's class: the module is built
    with it, where the student's code runs.
    """
    g = Grader("cross_attention")
    fn, MHA = cross_attention, MultiHeadAttention

    with g.check("returns (out (B, T, C) of x's dtype, weights (B, H, T, S)) (float32 and float64)"):

        def shapes(case):
            config, (B, T, S), dtype, seed = case
            Cc, Hh, kv, bias = config
            m, _ = attention_pair(MHA, f"cross.shape.{seed}", kv, d_model=Cc, n_heads=Hh, bias=bias)
            m.to(dtype)
            x, memory = tensor(seed, B, T, Cc, dtype=dtype), tensor(seed + 1, B, S, Cc, dtype=dtype)
            _cross_call(g, fn, _cross_where(config, B, T, S, None, dtype), m, x, memory, None, Hh)

        for_all(
            "cross.shape",
            st.tuples(st.sampled_from(CONFIGS), _CROSS_SIZES, st.sampled_from(FLOATS), SEEDS),
            shapes,
            max_examples=5,
            first=(CONFIGS[0], (2, 3, 5), torch.float32, 0),
        )

    with g.check(
        "queries from x, keys and values from memory, no causal mask: equals Chapter 2's attention and "
        "nn.MultiheadAttention (any B, T, S, heads, with or without biases)"
    ):

        def plain(case):
            config, (B, T, S), dtype, seed = case
            _cross_case(g, fn, MHA, f"cross.plain.{seed}", config, B, T, S, None, dtype, seed)

        for_all(
            "cross.plain",
            st.tuples(st.sampled_from(CONFIGS), _CROSS_SIZES, st.sampled_from(FLOATS), SEEDS),
            plain,
            max_examples=12,
            first=(CONFIGS[0], (2, 4, 6), torch.float64, 1),
        )
        for T, S in ((4, 6), (5, 5), (1, 3)):  # against torch's own module
            m, r = attention_pair(MHA, f"cross.torch.{T}.{S}")
            x, memory = rand(f"cross.torch.{T}.x", 2, T, C), rand(f"cross.torch.{S}.m", 2, S, C)
            where = _cross_where(CONFIGS[0], 2, T, S)
            out, w = _cross_call(g, fn, where, m, x, memory)
            t = nn.MultiheadAttention(C, H, batch_first=True).double().eval()
            t.load_state_dict(L.to_torch_state_dict(r.state_dict()))
            t_out, t_w = t(x, memory, memory, average_attn_weights=False)
            first_match(
                g, out, [(mm, f"{where}: {h}") for mm, h in _cross_mistakes(r, x, memory, None)], t_out
            )
            g.expect(
                close(out, t_out),
                f"{where}: the output differs from nn.MultiheadAttention(x, memory, memory)",
            )
            g.expect(close(w, t_w), f"{where}: the weights differ from nn.MultiheadAttention's, per head")

    with g.check(
        "memory_key_padding_mask (B, S), True at real source tokens: padded tokens get no attention"
    ):

        def masked(case):
            config, (B, T, S), seed = case
            _cross_case(g, fn, MHA, f"cross.mask.{seed}", config, B, T, S, _keep_mask(seed, B, S), seed=seed)

        for_all(
            "cross.mask",
            st.tuples(st.sampled_from(CONFIGS), _CROSS_SIZES, SEEDS),
            masked,
            max_examples=12,
            first=(CONFIGS[0], (3, 4, 6), 2),
        )
        _cross_case(g, fn, MHA, "cross.mask.fixed", CONFIGS[0], 3, 4, 6, ref_padding([5, 3, 2], 6), seed=3)

    with g.check("a source row with no real token gets all-zero weights, and its output is out_proj's bias"):

        def empty(case):
            config, (B, T, S), seed = case
            keep = _keep_mask(seed, B, S, empty_rows=True)
            keep[0] = False  # at least one row with no real token
            _cross_case(g, fn, MHA, f"cross.empty.{seed}", config, B, T, S, keep, seed=seed)

        for_all(
            "cross.empty",
            st.tuples(st.sampled_from(CONFIGS), _CROSS_SIZES, SEEDS),
            empty,
            max_examples=6,
            first=(CONFIGS[0], (2, 3, 4), 4),
        )

    with g.check("grouped key/value heads (attn.n_kv_heads < attn.n_heads) are repeated for the query heads"):

        def grouped(case):
            config, (B, T, S), masked_, seed = case
            keep = _keep_mask(seed, B, S) if masked_ else None
            _cross_case(g, fn, MHA, f"cross.gqa.{seed}", config, B, T, S, keep, seed=seed)

        for_all(
            "cross.gqa",
            st.tuples(st.sampled_from(GQA_CONFIGS), _CROSS_SIZES, st.booleans(), SEEDS),
            grouped,
            max_examples=8,
            first=(CONFIGS[1], (2, 3, 5), True, 5),
        )
        grouped((CONFIGS[1], (2, 3, 5), False, 6))

    with g.check("gradients reach x and memory as in Chapter 2's attention"):

        def gradients(case):
            config, (B, T, S), seed = case
            Cc, Hh, kv, bias = config
            m, r = attention_pair(MHA, f"cross.grad.{seed}", kv, d_model=Cc, n_heads=Hh, bias=bias)
            x, memory = tensor(seed, B, T, Cc), tensor(seed + 1, B, S, Cc)
            keep = _keep_mask(seed, B, S)
            up = tensor(seed + 2, B, T, Cc)
            where = _cross_where(config, B, T, S, keep)
            p = call_student(
                g,
                where,
                probe,
                fn,
                m,
                x.clone().requires_grad_(),
                memory.clone().requires_grad_(),
                keep,
                backward=(0, up),
            )
            xr, mr = x.clone().requires_grad_(), memory.clone().requires_grad_()
            (r(xr, kv=mr, key_padding_mask=keep)[0] * up).sum().backward()
            grads = p.grads or [None, None, None, None]
            for i, name, want in ((1, "x", xr.grad), (2, "memory", mr.grad)):
                g.expect(
                    grads[i] is not None,
                    f"{where}: no gradient reached {name}: avoid .detach(), .item() or in-place changes",
                )
                g.expect(
                    close(grads[i], want),
                    f"{where}: the gradient with respect to {name} differs from the reference",
                )

        for_all(
            "cross.grad",
            st.tuples(st.sampled_from(CONFIGS), _CROSS_SIZES, SEEDS),
            gradients,
            max_examples=4,
            first=(CONFIGS[0], (2, 3, 4), 7),
        )

    with g.check(
        "no dropout in eval mode; in training mode each weight is dropped with probability attn.dropout "
        "(or scaled by 1 / (1 - p)) and out is computed from the dropped weights"
    ):

        def dropout(case):
            config, (B, T, S), p, training, seed = case
            Cc, Hh, kv, bias = config
            m, r = attention_pair(
                MHA, f"cross.dropout.{seed}", kv, dropout=0.5, d_model=Cc, n_heads=Hh, bias=bias
            )
            if p != 0.5:
                set_attr(m, "dropout", p)
            if training:
                m.train()
            x, memory = tensor(seed, B, T, Cc), tensor(seed + 1, B, S, Cc)
            keep = _keep_mask(seed, B, S)
            where = _cross_where(
                config, B, T, S, keep, extra=f", attn.dropout={p}, {'training' if training else 'eval'} mode"
            )
            out, w = _cross_call(g, fn, where, m, x, memory, keep, Hh)
            expected, expected_w = r(x, kv=memory, key_padding_mask=keep, need_weights=True)
            if not training:
                if not (close(out, expected) and close(w, expected_w)):
                    # the same call with attn.dropout = 0: right then, the dropout acted in eval mode (weights
                    # that only look dropped, say all zero, can have another cause: an inverted mask)
                    set_attr(m, "dropout", 0.0)
                    without, w_without = _cross_call(g, fn, where, m, x, memory, keep, Hh)
                    g.expect(
                        not (close(without, expected) and close(w_without, expected_w)),
                        f"{where}: dropout was applied in eval mode (with attn.dropout = 0 the result is right); "
                        "apply dropout only when attn.training",
                    )
                    g.expect(
                        close(w, expected_w),
                        f"{where}: the weights differ from the reference's, which drops nothing in eval mode",
                    )
                    g.fail(f"{where}: out differs from the reference's, which drops nothing in eval mode")
                return
            kept = w != 0
            scaled = expected_w / (1 - p) if p < 1 else torch.zeros_like(expected_w)
            g.expect(
                close(torch.where(kept, w, scaled), scaled),
                f"{where}: each returned weight must be 0 (dropped) or the softmax weight times 1 / (1 - p): "
                "apply "
                "F.dropout(weights, attn.dropout) when attn.training, and return the dropped weights",
            )
            q, k, v = r.project(x, memory)
            v = mh.repeat_kv(v, r.n_heads // r.n_kv_heads)
            recomputed = r.out_proj(mh.merge_heads(w @ v))
            g.expect(
                close(out, recomputed),
                f"{where}: out must be computed from the dropped weights: out = out_proj(merge_heads(weights @ "
                "v)) "
                "after the dropout",
            )

        for_all(
            "cross.dropout",
            st.tuples(
                st.sampled_from(CONFIGS),
                _CROSS_SIZES,
                st.sampled_from([0.5, 0.25, 1.0]),
                st.booleans(),
                SEEDS,
            ),
            dropout,
            max_examples=12,
            first=(CONFIGS[0], (2, 3, 4), 1.0, True, 8),
        )
        for p, training in ((0.25, True), (1.0, True), (0.5, False)):
            dropout((CONFIGS[0], (2, 4, 5), p, training, 9))

    with g.check("a memory_key_padding_mask that is not a boolean (B, S) tensor raises ValueError"):

        def bad_mask(case):
            (B, T, S), which, seed = case
            m, _ = attention_pair(MHA, f"cross.bad.{seed}")
            x, memory = tensor(seed, B, T, C), tensor(seed + 1, B, S, C)
            keep = _keep_mask(seed, B, S)
            bad = {
                "float": (
                    keep.double(),
                    f"a float64 mask {(B, S)}",
                    "the mask must be boolean, True at real tokens",
                ),
                "long": (
                    keep.long(),
                    f"an int64 mask {(B, S)}",
                    "the mask must be boolean, True at real tokens",
                ),
                "S + 1": (
                    torch.cat([keep, keep[:, :1]], 1),
                    f"a mask {(B, S + 1)} for memory {(B, S, C)}",
                    "the mask must be (B, S)",
                ),
                "1-D": (keep[0], f"a 1-D mask {(S,)} for memory {(B, S, C)}", "the mask must be (B, S)"),
                "3-D": (
                    keep[:, None, :],
                    f"a mask {(B, 1, S)} for memory {(B, S, C)}",
                    "the mask must be (B, S)",
                ),
                "B + 1": (
                    torch.cat([keep, keep[:1]], 0),
                    f"a mask {(B + 1, S)} for memory {(B, S, C)}",
                    "the mask must be (B, S)",
                ),
            }
            mask, what, fix = bad[which]
            expect_value_error(g, lambda: fn(m, x, memory, mask), what, fix)

        kinds = ["float", "long", "S + 1", "1-D", "3-D", "B + 1"]
        for_all(
            "cross.bad",
            st.tuples(_CROSS_SIZES, st.sampled_from(kinds), SEEDS),
            bad_mask,
            max_examples=8,
            first=((2, 3, 4), "float", 10),
        )
        for kind in kinds:
            bad_mask(((2, 3, 4), kind, 11))

    g.finish()


def ref_padding(lengths: list[int], S: int) -> torch.Tensor:
    """A (B, S) padding mask, True at the first ``lengths[b]`` positions of row b."""
    return torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]


def check_cross_attention(cross_attention, MultiHeadAttention) -> None:
    """Public checks of ``cross_attention``: one small example per clause the hidden checks grade."""
    g = Grader("cross_attention (public)")
    fn, MHA = cross_attention, MultiHeadAttention
    with g.check("x (2, 3, C) and memory (2, 5, C) give out (2, 3, C) of x's dtype and weights (2, H, 3, 5)"):
        m, _ = attention_pair(MHA, "public.cross")
        m.float()
        x = rand("public.cross.x", 2, 3, C, dtype=torch.float32)
        memory = rand("public.cross.m", 2, 5, C, dtype=torch.float32)
        _cross_call(g, fn, _cross_where(CONFIGS[0], 2, 3, 5, None, torch.float32), m, x, memory)
    with g.check(
        "equals attn(x, kv=memory, need_weights=True) (queries from x, keys and values from memory)"
    ):
        _cross_case(g, fn, MHA, "public.cross.plain", CONFIGS[0], 2, 3, 5, seed=1)
    with g.check("the second source padded after 2 tokens: padded tokens get weight 0"):
        _cross_case(g, fn, MHA, "public.cross.mask", CONFIGS[0], 2, 3, 5, ref_padding([5, 2], 5), seed=2)
    with g.check("a source with no real token: zero weights, output = out_proj's bias"):
        _cross_case(g, fn, MHA, "public.cross.empty", CONFIGS[0], 2, 3, 4, ref_padding([4, 0], 4), seed=3)
    with g.check("n_kv_heads = 2 of 4 heads: key/value heads repeated for the query heads"):
        _cross_case(g, fn, MHA, "public.cross.gqa", CONFIGS[1], 2, 3, 5, ref_padding([5, 3], 5), seed=4)
    with g.check("the gradient reaches x and memory"):
        m, r = attention_pair(MHA, "public.cross.grad")
        x, memory = rand("public.cross.grad.x", 1, 2, C), rand("public.cross.grad.m", 1, 3, C)
        p = call_student(
            g,
            "cross_attention(attn, x (1, 2, C), memory (1, 3, C))",
            probe,
            fn,
            m,
            x.clone().requires_grad_(),
            memory.clone().requires_grad_(),
            backward=(0, torch.ones(1, 2, C, dtype=torch.float64)),
        )
        xr, mr = x.clone().requires_grad_(), memory.clone().requires_grad_()
        r(xr, kv=mr)[0].sum().backward()
        grads = p.grads or [None] * 3
        g.expect(
            grads[1] is not None
            and grads[2] is not None
            and close(grads[1], xr.grad)
            and close(grads[2], mr.grad),
            "the gradients with respect to x and memory differ from Chapter 2's attention",
        )
    with g.check(
        "attn.dropout = 0.5: nothing dropped in eval mode; attn.dropout = 1 in training mode drops every "
        "weight"
    ):
        m, r = attention_pair(MHA, "public.cross.dropout", dropout=0.5)
        x, memory = rand("public.cross.dropout.x", 2, 3, C), rand("public.cross.dropout.m", 2, 4, C)
        out, w = _cross_call(g, fn, "eval mode", m, x, memory)
        g.expect(
            close(out, r(x, kv=memory)[0]),
            "in eval mode with attn.dropout=0.5 the output differs from the "
            "reference: apply dropout only when attn.training",
        )
        m.train()
        set_attr(m, "dropout", 1.0)
        out, w = _cross_call(g, fn, "training mode, attn.dropout=1.0", m, x, memory)
        bias_only = torch.zeros(2, 3, C, dtype=torch.float64) + r.out_proj.bias
        g.expect(
            close(w, torch.zeros(2, H, 3, 4, dtype=torch.float64)) and close(out, bias_only),
            "in training mode with attn.dropout=1.0 every weight is dropped (the returned weights are 0) and out, "
            "recomputed from them, is out_proj's bias: weights = F.dropout(weights, attn.dropout); out = weights "
            "@ v",
        )
    with g.check("a float mask raises ValueError"):
        m, _ = attention_pair(MHA, "public.cross.bad")
        x, memory = rand("public.cross.bad.x", 2, 3, C), rand("public.cross.bad.m", 2, 4, C)
        expect_value_error(
            g,
            lambda: fn(m, x, memory, torch.ones(2, 4)),
            "a float mask (2, 4)",
            "the mask must be boolean, True at real tokens",
        )
    g.finish()


# =========================================================================== part 3: PreNormDecoderLayer

_POST_NORM = (
    "this is post-norm (x = norm(x + sublayer(x))): a pre-norm layer normalises each sub-layer's input and "
    "adds the result to the un-normalised stream, x = x + sublayer(norm(x))"
)
_NOT_CAUSAL = "the self-attention must be causal: self.self_attn(self.norm1(x), is_causal=True)"
_LAYER_KV_FROM_X = (
    "cross-attention must take its keys and values from memory: "
    "cross_attention(self.cross_attn, self.norm2(x), memory, memory_key_padding_mask)"
)
_NORMED_MEMORY = (
    "do not normalise memory in the decoder (the encoder stack already did): only the query side, norm2(x)"
)
_LAYER_MASK_IGNORED = "memory_key_padding_mask was ignored: pass it on to cross_attention"
_NO_RESIDUAL = (
    "a residual connection is missing: every sub-layer adds its output to the stream, "
    "x = x + dropout(sublayer(norm(x)))"
)
_NORMED_STREAM = (
    "do not replace x by its normalised version: the residual adds the sub-layer's output to the "
    "un-normalised x (x = x + f(norm(x)), not x = norm(x); x = x + f(x))"
)
_WRONG_WEIGHTS = (
    "the second returned value should be the cross-attention weights (B, H, T, S) that cross_attention "
    "returns, not the self-attention's"
)
#: the dropouts of the layer, each checked alone: (where it lives, its attribute, what it drops)
_DROPOUTS = {
    "dropout1": (
        "dropout1",
        "p",
        "the self-attention sub-layer's output: x = x + dropout1(self_attn(norm1(x)))",
    ),
    "dropout2": ("dropout2", "p", "the cross-attention sub-layer's output: x = x + dropout2(c)"),
    "dropout3": ("dropout3", "p", "the feed-forward sub-layer's output: x = x + dropout3(ff(norm3(x)))"),
    "self_attn.dropout": (
        "self_attn",
        "dropout",
        "the self-attention weights, inside self.self_attn(...) (Chapter 2's module applies its own dropout)",
    ),
    "cross_attn.dropout": (
        "cross_attn",
        "dropout",
        "the cross-attention weights, inside your cross_attention(self.cross_attn, ...)",
    ),
    "ff.dropout": ("ff.dropout", "p", "the feed-forward's hidden activations, inside self.ff(...)"),
}
#: (C, H, d_ff, bias, activation) of the layers the checks draw
LAYERS = [
    (12, 4, 20, True, "relu"),
    (12, 4, 20, True, "gelu"),
    (8, 2, 16, False, "relu"),
    (6, 1, 10, True, "gelu"),
    (12, 6, 24, False, "gelu"),
]


def _sub(m, path: str):
    """``m.a.b`` for ``path`` ``"a.b"`` (works through the sandbox too)."""
    for name in path.split("."):
        m = getattr(m, name)
    return m


def _layer_triple(
    g: Grader, PreNormDecoderLayer, name: str, config=None, dropout: float = 0.0, with_torch: bool = False
):
    """The student's layer (built with their class), coursekit's, and (with ``with_torch``, else ``None``) torch's,
    with the same random weights."""
    Cc, Hh, dff, bias, activation = config or (C, H, DFF, True, "relu")
    r = ref.PreNormDecoderLayer(Cc, Hh, dff, dropout=0.0, activation=activation, bias=bias).double().eval()
    weights = random_weights(r, name)
    r.load_state_dict(weights)
    m = PreNormDecoderLayer(Cc, Hh, dff, dropout=dropout, activation=activation, bias=bias)
    m.double()
    sd = m.state_dict()
    got, expected = set(sd) if isinstance(sd, dict) else set(), set(weights)
    g.expect(
        got == expected,
        "the layer's parameters must be those of Chapter 4's DecoderLayer (keep the given "
        "__init__); "
        f"missing {sorted(expected - got)[:4]}, unexpected {sorted(got - expected)[:4]}",
    )
    m.load_state_dict(weights)
    m.eval()
    if not with_torch:
        return m, r, None
    t = (
        nn.TransformerDecoderLayer(
            Cc, Hh, dff, dropout=0.0, activation=activation, batch_first=True, norm_first=True, bias=bias
        )
        .double()
        .eval()
    )
    t.load_state_dict(L.to_torch_state_dict(weights))
    return m, r, t


def _torch_layer(t, x, memory, keep=None):
    return t(
        x,
        memory,
        tgt_mask=~causal_mask(x.shape[1]),
        tgt_is_causal=True,
        memory_key_padding_mask=None if keep is None else ~keep,
    )


def _layer_mistakes(r, x, memory, keep):
    """Outputs of the common wrong layers, computed with the reference layer's submodules."""

    def ca(h, kv, mask=keep):
        return r.cross_attn(h, kv=kv, key_padding_mask=mask)[0]

    def sa(h, causal=True):
        return r.self_attn(h, is_causal=causal)[0]

    out = []
    with torch.no_grad():
        Cc, Hh = r.self_attn.d_model, r.self_attn.n_heads
        post = (
            L.DecoderLayer(
                Cc,
                Hh,
                r.ff.linear1.out_features,
                dropout=0.0,
                activation="relu" if isinstance(r.ff.act, nn.ReLU) else "gelu",
                norm_first=False,
                bias=r.ff.linear1.bias is not None,
            )
            .double()
            .eval()
        )
        post.load_state_dict(r.state_dict())
        out.append((post(x, memory, memory_key_padding_mask=keep), _POST_NORM))

        def layer(self_causal=True, kv=None, mask=keep, res=(True, True, True), stream=False):
            h = r.norm1(x) if stream else x
            a = sa(r.norm1(x) if not stream else h, self_causal)
            h = h + a if res[0] else a
            n = r.norm2(h)
            h2 = n if stream else h
            c = ca(n, n if kv == "x" else (r.norm2(memory) if kv == "normed" else memory), mask)
            h = h2 + c if res[1] else c
            n3 = r.norm3(h)
            h3 = n3 if stream else h
            f = r.ff(n3)
            return h3 + f if res[2] else f

        out += [
            (layer(self_causal=False), _NOT_CAUSAL),
            (layer(kv="normed"), _NORMED_MEMORY),
            (layer(res=(False, True, True)), _NO_RESIDUAL),
            (layer(res=(True, False, True)), _NO_RESIDUAL),
            (layer(res=(True, True, False)), _NO_RESIDUAL),
            (layer(stream=True), _NORMED_STREAM),
        ]
        if x.shape[1] == memory.shape[1] or keep is None:
            out.insert(
                2, (layer(kv="x", mask=None if x.shape[1] != memory.shape[1] else keep), _LAYER_KV_FROM_X)
            )
        if keep is not None:
            out.insert(1, (layer(mask=None), _LAYER_MASK_IGNORED))
    return out


def _layer_where(config, B, T, S, keep=None, dtype=torch.float64, extra="") -> str:
    Cc, Hh, dff, bias, act = config
    mask = "" if keep is None else f", memory_key_padding_mask {_mask_text(keep)}"
    return (
        f"PreNormDecoderLayer({Cc}, {Hh}, {dff}, activation={act!r}, bias={bias}{extra})(x ({B}, {T}, {Cc}) "
        f"{dtype_name(dtype)}, memory ({B}, {S}, {Cc}){mask})"
    )


def _layer_call(g: Grader, where: str, m, x, memory, keep=None, n_heads: int = H):
    args = (x, memory) if keep is None else (x, memory, keep)
    result = call_student(g, where, m, *args)
    B, T, S = x.shape[0], x.shape[1], memory.shape[1]
    g.expect(
        isinstance(result, tuple) and len(result) == 2,
        f"{where}: the layer should return a tuple (out, cross-attention weights), got {describe(result)}",
    )
    out, w = result
    if is_tensor(w) and w.shape == (B, n_heads, T, T) and T != S:
        g.fail(
            f"{where}: the weights are (B, H, T, T) = {tuple(w.shape)}, not (B, H, T, S): return the "
            "cross-attention "
            "weights, and take the cross-attention's keys and values from memory: "
            "c, weights = cross_attention(self.cross_attn, self.norm2(x), memory, memory_key_padding_mask)"
        )
    g.expect(
        is_tensor(out) and out.shape == x.shape and out.dtype == x.dtype,
        f"{where}: the output should have x's shape and dtype, {describe(x)}, got {describe(out)}",
    )
    g.expect(
        is_tensor(w) and w.shape == (B, n_heads, T, S),
        f"{where}: the weights should be (B, H, T, S) = {(B, n_heads, T, S)}, got {describe(w)}",
    )
    return out, w


def _layer_case(
    g: Grader,
    PreNormDecoderLayer,
    name: str,
    config,
    B: int,
    T: int,
    S: int,
    keep=None,
    seed: int = 0,
    torch_reference: bool = False,
) -> None:
    m, r, t = _layer_triple(g, PreNormDecoderLayer, name, config, with_torch=torch_reference)
    x, memory = tensor(seed, B, T, config[0]), tensor(seed + 1, B, S, config[0])
    where = _layer_where(config, B, T, S, keep)
    out, w = _layer_call(g, where, m, x, memory, keep, config[1])
    expected, expected_w = r(x, memory, keep)
    if torch_reference:
        expected = _torch_layer(t, x, memory, keep)
    first_match(g, out, [(mm, f"{where}: {h}") for mm, h in _layer_mistakes(r, x, memory, keep)], expected)
    g.expect(
        close(out, expected, magnitude=magnitude(x, memory)),
        f"{where}: the output differs from nn.TransformerDecoderLayer(norm_first=True) with the same weights: "
        "x = x + self_attn(norm1(x)) (causal); x = x + cross(norm2(x), memory); x = x + ff(norm3(x))",
    )
    self_w = r.self_attn(r.norm1(x), is_causal=True, need_weights=True)[1]
    if T > 1 and is_tensor(w) and w.shape == self_w.shape and close(w, self_w):
        g.fail(f"{where}: {_WRONG_WEIGHTS}")
    g.expect(
        close(w, expected_w, magnitude=magnitude(x, memory)),
        f"{where}: the weights differ from those of cross_attention(self.cross_attn, self.norm2(x), memory, "
        "memory_key_padding_mask), computed after the self-attention sub-layer",
    )


_LAYER_SIZES = st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 6))


def grade_pre_norm_decoder_layer(PreNormDecoderLayer) -> None:
    """Grade a student's ``PreNormDecoderLayer`` class (Chapter 4's ``DecoderLayer`` with a pre-norm ``forward``)."""
    g = Grader("PreNormDecoderLayer")
    cls = PreNormDecoderLayer

    with g.check(
        "returns (out of x's shape and dtype, cross-attention weights (B, H, T, S)) (float32 and float64)"
    ):

        def shapes(case):
            config, (B, T, S), dtype, seed = case
            m, _, _ = _layer_triple(g, cls, f"dec.shape.{seed}", config)
            m.to(dtype)
            x, memory = (
                tensor(seed, B, T, config[0], dtype=dtype),
                tensor(seed + 1, B, S, config[0], dtype=dtype),
            )
            _layer_call(g, _layer_where(config, B, T, S, None, dtype), m, x, memory, None, config[1])

        for_all(
            "dec.shape",
            st.tuples(st.sampled_from(LAYERS), _LAYER_SIZES, st.sampled_from(FLOATS), SEEDS),
            shapes,
            max_examples=4,
            first=(LAYERS[0], (2, 3, 4), torch.float32, 0),
        )

    with g.check(
        "equals nn.TransformerDecoderLayer(norm_first=True) with a causal mask (relu and gelu, with and "
        "without biases, any B, T, S)"
    ):

        def values(case):
            config, (B, T, S), seed = case
            _layer_case(g, cls, f"dec.values.{seed}", config, B, T, S, seed=seed)

        for_all(
            "dec.values",
            st.tuples(st.sampled_from(LAYERS), _LAYER_SIZES, SEEDS),
            values,
            max_examples=8,
            first=(LAYERS[0], (2, 5, 7), 1),
        )
        for config, (T, S) in ((LAYERS[0], (5, 7)), (LAYERS[1], (4, 4)), (LAYERS[2], (3, 2))):
            _layer_case(g, cls, f"dec.torch.{config[4]}", config, 2, T, S, seed=2, torch_reference=True)

    with g.check(
        "memory_key_padding_mask reaches cross-attention, and the weights returned are cross-attention's"
    ):

        def masked(case):
            config, (B, T, S), seed = case
            _layer_case(g, cls, f"dec.mask.{seed}", config, B, T, S, _keep_mask(seed, B, S), seed=seed)

        for_all(
            "dec.mask",
            st.tuples(st.sampled_from(LAYERS), _LAYER_SIZES, SEEDS),
            masked,
            max_examples=6,
            first=(LAYERS[0], (3, 4, 6), 3),
        )
        _layer_case(
            g,
            cls,
            "dec.mask.torch",
            LAYERS[0],
            3,
            4,
            6,
            ref_padding([6, 3, 1], 6),
            seed=4,
            torch_reference=True,
        )

    with g.check("the self-attention is causal: changing later targets does not change earlier outputs"):

        def causal(case):
            config, (B, T, S), cut, seed = case
            T = T + 1
            cut = 1 + cut % (T - 1)
            m, _, _ = _layer_triple(g, cls, f"dec.future.{seed}", config)
            x, memory = tensor(seed, B, T, config[0]), tensor(seed + 1, B, S, config[0])
            y = x.clone()
            y[:, cut:] = tensor(seed + 2, B, T - cut, config[0])
            where = _layer_where(config, B, T, S)
            a, _ = _layer_call(g, where, m, x, memory, None, config[1])
            b, _ = _layer_call(g, where, m, y, memory, None, config[1])
            g.expect(
                close(a[:, :cut], b[:, :cut]),
                f"{where}: outputs at positions 0 .. {cut - 1} changed when only positions {cut} .. {T - 1} of x "
                "changed: information leaks from the future (" + _NOT_CAUSAL + ")",
            )

        for_all(
            "dec.future",
            st.tuples(st.sampled_from(LAYERS), _LAYER_SIZES, st.integers(0, 4), SEEDS),
            causal,
            max_examples=6,
            first=(LAYERS[0], (2, 5, 5), 3, 5),
        )

    with g.check(
        "each dropout alone, with probability 1 in training mode, drops what the text says: dropout1, "
        "dropout2, dropout3 (the sub-layers' outputs), self_attn's and cross_attn's weights, ff's hidden "
        "units"
    ):

        def isolated(case):
            which, config, (B, T, S), seed = case
            path, attr, what = _DROPOUTS[which]
            m, r, _ = _layer_triple(g, cls, f"dec.dropout.{seed}", config)
            set_attr(_sub(m, path), attr, 1.0)
            setattr(_sub(r, path), attr, 1.0)
            m.train()
            r.train()
            x, memory = tensor(seed, B, T, config[0]), tensor(seed + 1, B, S, config[0])
            keep = _keep_mask(seed, B, S)
            where = _layer_where(config, B, T, S, keep, extra=f", {which}=1.0, training mode")
            out, w = _layer_call(g, where, m, x, memory, keep, config[1])
            expected, expected_w = r(x, memory, keep)
            g.expect(
                close(out, expected, magnitude=magnitude(x, memory)) and close(w, expected_w),
                f"{where}: with only {which} at p = 1 the output differs from the reference, which drops {what} "
                "and nothing else: apply each dropout exactly where the text puts it, once",
            )

        configs = [c for c in LAYERS if c[3]]  # with biases: a sub-layer of zeros still outputs something
        for_all(
            "dec.dropout",
            st.tuples(st.sampled_from(sorted(_DROPOUTS)), st.sampled_from(configs), _LAYER_SIZES, SEEDS),
            isolated,
            max_examples=6,
            first=("dropout1", LAYERS[0], (2, 3, 4), 6),
        )
        for which in _DROPOUTS:
            isolated((which, LAYERS[0], (2, 3, 4), 7))

    with g.check("no dropout in eval mode (dropout=0.5, and every dropout at p = 1)"):

        def eval_mode(case):
            config, (B, T, S), everything, seed = case
            m, r, _ = _layer_triple(g, cls, f"dec.eval.{seed}", config, dropout=0.5)
            if everything:
                for path, attr, _ in _DROPOUTS.values():
                    set_attr(_sub(m, path), attr, 1.0)
            x, memory = tensor(seed, B, T, config[0]), tensor(seed + 1, B, S, config[0])
            where = _layer_where(
                config, B, T, S, None, extra=f", every dropout at {'1.0' if everything else '0.5'}, eval mode"
            )
            out, _ = _layer_call(g, where, m, x, memory, None, config[1])
            g.expect(
                close(out, r(x, memory)[0]),
                f"{where}: the output differs from the reference: dropout applies only in training mode (use the "
                "nn.Dropout modules self.dropout1/2/3, not F.dropout without training=self.training)",
            )

        for_all(
            "dec.eval",
            st.tuples(st.sampled_from(LAYERS), _LAYER_SIZES, st.booleans(), SEEDS),
            eval_mode,
            max_examples=4,
            first=(LAYERS[0], (2, 3, 4), True, 8),
        )

    with g.check("gradients reach x and memory as in nn.TransformerDecoderLayer"):

        def gradients(case):
            config, (B, T, S), seed = case
            m, r, t = _layer_triple(g, cls, f"dec.grad.{seed}", config, with_torch=True)
            x, memory = tensor(seed, B, T, config[0]), tensor(seed + 1, B, S, config[0])
            keep = _keep_mask(seed, B, S)
            up = tensor(seed + 2, B, T, config[0])
            where = _layer_where(config, B, T, S, keep)
            p = call_student(
                g,
                where,
                probe,
                m,
                x.clone().requires_grad_(),
                memory.clone().requires_grad_(),
                keep,
                backward=(0, up),
            )
            xr, mr = x.clone().requires_grad_(), memory.clone().requires_grad_()
            (_torch_layer(t, xr, mr, keep) * up).sum().backward()
            for label, got, want in zip(("x", "memory"), (p.grads or [None, None])[:2], (xr.grad, mr.grad)):
                g.expect(
                    got is not None and close(got, want, magnitude=magnitude(x, memory, up)),
                    f"{where}: the gradient with respect to {label} differs from the reference",
                )

        for_all(
            "dec.grad",
            st.tuples(st.sampled_from(LAYERS), _LAYER_SIZES, SEEDS),
            gradients,
            max_examples=3,
            first=(LAYERS[1], (2, 4, 5), 9),
        )

    with g.check(
        "keeps the given __init__: DecoderLayer's parameters and defaults (d_ff = 4 C, dropout 0.1, relu, "
        "eps 1e-5, biases)"
    ):
        m = cls(8, 2)
        r = ref.PreNormDecoderLayer(8, 2)
        sd, rd = m.state_dict(), r.state_dict()
        shapes = {k: tuple(v.shape) for k, v in sd.items()} if isinstance(sd, dict) else {}
        g.expect(
            shapes == {k: tuple(v.shape) for k, v in rd.items()},
            "PreNormDecoderLayer(8, 2) should have the parameters of DecoderLayer(8, 2, norm_first=True) (d_ff = "
            "32, "
            "with biases): keep the given __init__ and its defaults",
        )
        for path, attr, _ in _DROPOUTS.values():
            got = getattr(_sub(m, path), attr)
            g.expect(
                got == 0.1,
                f"PreNormDecoderLayer(8, 2).{path}.{attr} is {got!r}: the default dropout is 0.1 "
                "(keep the given __init__)",
            )
        g.expect(
            m.norm1.eps == 1e-5 and m.norm3.eps == 1e-5,
            f"PreNormDecoderLayer(8, 2).norm1.eps is {m.norm1.eps!r}: the default eps is 1e-5 (keep the given "
            "__init__)",
        )
        x, memory = rand("dec.defaults.x", 1, 3, 8), rand("dec.defaults.m", 1, 2, 8)
        m.double()
        m.load_state_dict({k: v.double() for k, v in rd.items()})
        m.eval()
        r.double().eval()
        out, _ = _layer_call(
            g, "PreNormDecoderLayer(8, 2)(x (1, 3, 8), memory (1, 2, 8))", m, x, memory, None, 2
        )
        g.expect(
            close(out, r(x, memory)[0]),
            "PreNormDecoderLayer(8, 2) differs from the reference with the same "
            "weights: the default activation is relu (keep the given __init__)",
        )

    g.finish()


def check_pre_norm_decoder_layer(PreNormDecoderLayer) -> None:
    """Public checks of ``PreNormDecoderLayer``: one small example per clause the hidden checks grade."""
    g = Grader("PreNormDecoderLayer (public)")
    cls = PreNormDecoderLayer
    with g.check(
        "PreNormDecoderLayer(8, 2, dropout=0.0) returns (out (2, 4, 8) float32, weights (2, 2, 4, 6)) and "
        "equals "
        "torch's pre-norm layer with its weights"
    ):
        layer = cls(8, 2, dropout=0.0)
        layer.eval()
        sd = layer.state_dict()
        t = nn.TransformerDecoderLayer(8, 2, 32, dropout=0.0, batch_first=True, norm_first=True).eval()
        t.load_state_dict(L.to_torch_state_dict(sd))
        x = rand("public.dec.x", 2, 4, 8, dtype=torch.float32)
        memory = rand("public.dec.m", 2, 6, 8, dtype=torch.float32)
        keep = ref_padding([6, 3], 6)
        out, w = _layer_call(
            g, "PreNormDecoderLayer(8, 2)(x (2, 4, 8), memory (2, 6, 8), mask)", layer, x, memory, keep, 2
        )
        expected = t(x, memory, tgt_mask=~causal_mask(4), tgt_is_causal=True, memory_key_padding_mask=~keep)
        g.expect(
            close(out, expected, magnitude=magnitude(x, memory)),
            "the output differs from nn.TransformerDecoderLayer(norm_first=True) with a causal mask: "
            "x = x + self_attn(norm1(x)); x = x + cross(norm2(x), memory); x = x + ff(norm3(x))",
        )
    with g.check("gelu, no biases, T = 3, S = 2: equals the reference with random weights"):
        _layer_case(g, cls, "public.dec.values", LAYERS[2], 2, 3, 2, seed=1)
    with g.check("a padded source: the mask reaches cross-attention, whose weights are returned"):
        _layer_case(g, cls, "public.dec.mask", LAYERS[0], 2, 3, 4, ref_padding([4, 2], 4), seed=2)
    with g.check("changing the last target does not change the earlier outputs (causal self-attention)"):
        m, _, _ = _layer_triple(g, cls, "public.dec.future")
        x, memory = rand("public.dec.future.x", 1, 4, C), rand("public.dec.future.m", 1, 3, C)
        y = x.clone()
        y[:, 3] = 0.0
        a, _ = _layer_call(g, "x", m, x, memory)
        b, _ = _layer_call(g, "x with its last position changed", m, y, memory)
        g.expect(
            close(a[:, :3], b[:, :3]),
            "outputs at positions 0 .. 2 changed when only position 3 changed: " + _NOT_CAUSAL,
        )
    with g.check(
        "each dropout alone at p = 1 in training mode (here dropout2: the cross-attention sub-layer's output)"
    ):
        m, r, _ = _layer_triple(g, cls, "public.dec.dropout")
        set_attr(m.dropout2, "p", 1.0)
        r.dropout2.p = 1.0
        m.train()
        r.train()
        x, memory = rand("public.dec.dropout.x", 2, 3, C), rand("public.dec.dropout.m", 2, 4, C)
        out, _ = _layer_call(g, "dropout2 = 1.0, training mode", m, x, memory)
        g.expect(
            close(out, r(x, memory)[0]),
            "with only dropout2 at p = 1 the cross-attention sub-layer adds nothing: "
            "x = x + dropout2(c), and the other dropouts are off",
        )
    with g.check("no dropout in eval mode (dropout=0.5)"):
        m, r, _ = _layer_triple(g, cls, "public.dec.eval", dropout=0.5)
        x, memory = rand("public.dec.eval.x", 2, 3, C), rand("public.dec.eval.m", 2, 4, C)
        out, _ = _layer_call(g, "dropout=0.5, eval mode", m, x, memory)
        g.expect(
            close(out, r(x, memory)[0]), "in eval mode with dropout=0.5 the output differs from the reference"
        )
    with g.check("the gradient reaches x and memory"):
        m, r, t = _layer_triple(g, cls, "public.dec.grad", with_torch=True)
        x, memory = rand("public.dec.grad.x", 1, 2, C), rand("public.dec.grad.m", 1, 3, C)
        p = call_student(
            g,
            "layer(x (1, 2, C), memory (1, 3, C))",
            probe,
            m,
            x.clone().requires_grad_(),
            memory.clone().requires_grad_(),
            backward=(0, torch.ones(1, 2, C, dtype=torch.float64)),
        )
        xr, mr = x.clone().requires_grad_(), memory.clone().requires_grad_()
        _torch_layer(t, xr, mr).sum().backward()
        grads = p.grads or [None, None]
        g.expect(
            grads[0] is not None
            and grads[1] is not None
            and close(grads[0], xr.grad)
            and close(grads[1], mr.grad),
            "the gradients with respect to x and memory differ from nn.TransformerDecoderLayer's",
        )
    with g.check("the given __init__ and its defaults are kept (dropout 0.1)"):
        m = cls(8, 2)
        g.expect(
            m.dropout1.p == 0.1 and m.cross_attn.dropout == 0.1,
            "PreNormDecoderLayer(8, 2) should have dropout 0.1 everywhere: keep the given __init__",
        )
    g.finish()


# =========================================================================== part 4: label_smoothed_loss

_NO_SMOOTHING = (
    "smoothing was not applied: the loss is (1 - smoothing) * (-log p_y) + smoothing * mean_v(-log p_v)"
)
_OTHER_CLASSES = (
    "the smoothing mass went to the V - 1 wrong classes only: spread it uniformly over all V classes, "
    "the right "
    "one included (the convention of Szegedy et al. and of F.cross_entropy(label_smoothing=...)), i.e. "
    "smoothing * mean over all V of -log p_v"
)
_SWAPPED = (
    "the weights are swapped: (1 - smoothing) on -log p of the right token, smoothing on the uniform part"
)
_PADDING_COUNTED = (
    "padding positions are scored: a target equal to pad_id must count neither in the sum nor in the "
    "number of positions the mean divides by"
)
_DIVIDED_BY_ALL = (
    "the mean divides by every position, padding included: divide by the number of non-padding targets"
)
_SUMMED = "the loss is summed over positions: return the mean over the non-padding targets"
_CLASS_SUM = "the uniform part sums -log p_v over the V classes: take the mean over the classes (divide by V)"
_LS_UNSTABLE = (
    "the loss is inf or NaN for large logits: log(softmax(x)) underflows to log(0); use F.log_softmax, "
    "which "
    "subtracts the maximum first"
)


def _smoothed_ref(logits, targets, eps, pad_id=PAD):
    V = logits.shape[-1]
    return F.cross_entropy(
        logits.reshape(-1, V), targets.reshape(-1), ignore_index=pad_id, label_smoothing=eps
    )


def _loss_mistakes(logits, targets, eps, pad_id=PAD):
    V, dtype = logits.shape[-1], logits.dtype
    lp = F.log_softmax(logits.double().reshape(-1, V), -1)  # (N, V)
    t = targets.reshape(-1)
    keep = t != pad_id
    safe = t.clamp(0, V - 1)
    nll = -lp.gather(-1, safe[:, None]).squeeze(-1)  # (N,)
    uniform = -lp.mean(-1)
    others = (-lp.sum(-1) - nll) / max(V - 1, 1)
    per = (1 - eps) * nll + eps * uniform
    out = [
        ((nll[keep]).mean(), _NO_SMOOTHING),
        (((1 - eps) * nll + eps * others)[keep].mean(), _OTHER_CLASSES),
        ((eps * nll + (1 - eps) * uniform)[keep].mean(), _SWAPPED),
        (per.mean(), _PADDING_COUNTED),
        (per[keep].sum() / t.numel(), _DIVIDED_BY_ALL),
        (per[keep].sum(), _SUMMED),
        (((1 - eps) * nll - eps * lp.sum(-1))[keep].mean(), _CLASS_SUM),
    ]
    if pad_id != PAD:
        out.append(
            (
                (per[t != PAD]).mean(),
                "the pad_id argument was not used (padding 0 was skipped instead): ignore "
                "the targets equal to pad_id",
            )
        )
    if eps != 0.1:
        out.append(
            (((0.9 * nll + 0.1 * uniform)[keep]).mean(), "the smoothing argument was not used (0.1 was)")
        )
    return [(m.to(dtype), h) for m, h in out]


def _ls_where(logits, targets, eps, pad_id, extra="") -> str:
    shown = targets.tolist() if targets.numel() <= 12 else tuple(targets.shape)
    args = "" if eps is None else f", smoothing={eps}"
    args += "" if pad_id is None else f", pad_id={pad_id}"
    return f"label_smoothed_loss(logits {tuple(logits.shape)} {dtype_name(logits.dtype)}, targets {shown}{args}){extra}"


def _scalar(g: Grader, out, dtype, where: str) -> None:
    g.expect(
        is_tensor(out) and out.dim() == 0 and out.dtype == dtype,
        f"{where}: the loss should be a scalar (0-dimensional) tensor of the logits' dtype {dtype_name(dtype)}, "
        f"got {describe(out)}",
    )


def _ls_value(g: Grader, fn, logits, targets, eps=None, pad_id=None, positional=False, extra="") -> None:
    """Call the student's loss (smoothing and pad_id by default, by keyword or positionally) and compare."""
    where = _ls_where(logits, targets, eps, pad_id, extra)
    if positional:
        args, kwargs = (logits, targets, 0.1 if eps is None else eps, PAD if pad_id is None else pad_id), {}
    else:
        args, kwargs = (logits, targets), {}
        if eps is not None:
            kwargs["smoothing"] = eps
        if pad_id is not None:
            kwargs["pad_id"] = pad_id
    out = call_student(g, where, fn, *args, **kwargs)
    e, p = (0.1 if eps is None else eps), (PAD if pad_id is None else pad_id)
    expected = _smoothed_ref(logits.double(), targets, e, p).to(logits.dtype)
    _scalar(g, out, logits.dtype, where)
    if not bool(torch.isfinite(out)):
        g.fail(f"{where}: got {_num(out)}; " + _LS_UNSTABLE)
    mistakes = _loss_mistakes(logits, targets, e, p)
    if eps is None:
        mistakes.insert(
            0,
            (
                _smoothed_ref(logits.double(), targets, 0.0, p).to(logits.dtype),
                "without a smoothing argument the loss must use the default smoothing=0.1 (the signature's "
                "default), not 0",
            ),
        )
    first_match(g, out, [(m, f"{where}: {h}") for m, h in mistakes], expected)
    g.expect(
        close(out, expected, magnitude=magnitude(logits)),
        f"{where}: expected {float(expected):.6g} (F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), "
        f"ignore_index={p}, label_smoothing={e})), got {_num(out)}",
    )


def _ls_case(
    seed: int, lead: tuple, V: int, pad_id: int, rate: float, dtype=torch.float64, scale: float = 2.0
):
    """Logits ``(*lead, V)`` and targets ``lead`` in ``[0, V)`` but ``pad_id``, about ``rate`` of them set to
    ``pad_id`` (the first one never)."""
    logits = tensor(seed, *lead, V, dtype=dtype, scale=scale)
    targets = torch.randint(0, V, lead, generator=_gen(seed, 7))
    targets = torch.where(targets == pad_id, (targets + 1) % V, targets)
    drop = torch.rand(lead, generator=_gen(seed, 9)) < rate
    drop.view(-1)[0] = False
    return logits, targets.masked_fill(drop, pad_id)


_LEAD = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
_SMOOTHING = st.sampled_from([None, 0.0, 0.3, 0.75, 1.0, 0.1])


def grade_label_smoothed_loss(label_smoothed_loss) -> None:
    """Grade a student's ``label_smoothed_loss(logits, targets, smoothing=0.1, pad_id=0)``."""
    g = Grader("label_smoothed_loss")
    fn = label_smoothed_loss

    with g.check("returns a scalar tensor of the logits' dtype (float32 and float64)"):

        def scalar(case):
            lead, V, dtype, seed = case
            logits, targets = _ls_case(seed, lead, V, PAD, 0.3, dtype)
            where = _ls_where(logits, targets, None, None)
            _scalar(g, call_student(g, where, fn, logits, targets), dtype, where)

        for_all(
            "ls.dtype",
            st.tuples(_LEAD, st.integers(2, 9), st.sampled_from(FLOATS), SEEDS),
            scalar,
            max_examples=5,
            first=((2, 3), 7, torch.float32, 0),
        )

    with g.check(
        "equals (1 - smoothing) * (-log p_y) + smoothing * mean_v(-log p_v), averaged over the non-padding "
        "targets, for any smoothing in [0, 1] (0.1 by default)"
    ):

        def values(case):
            lead, V, eps, dtype, positional, seed = case
            logits, targets = _ls_case(seed, lead, V, PAD, 0.3, dtype)
            _ls_value(g, fn, logits, targets, eps, None, positional and eps is not None)

        for_all(
            "ls.values",
            st.tuples(_LEAD, st.integers(2, 11), _SMOOTHING, st.sampled_from(FLOATS), st.booleans(), SEEDS),
            values,
            max_examples=20,
            first=((2, 3), 5, 0.3, torch.float64, False, 1),
        )
        V = 6  # closed form: uniform logits give log V whatever the smoothing
        targets = torch.randint(1, V, (2, 5), generator=_gen(2, 0))
        targets[1, 3:] = PAD
        _ls_value(g, fn, torch.zeros(2, 5, V, dtype=torch.float64), targets, 0.2)

    with g.check(
        "targets equal to pad_id (0 by default, or any other id) count neither in the sum nor in the mean"
    ):

        def padding(case):
            lead, V, which, rate, positional, seed = case
            pad_id = {"default": None, "zero": 0, "three": 3 % V, "last": V - 1}[which]
            logits, targets = _ls_case(seed, lead, V, PAD if pad_id is None else pad_id, rate)
            _ls_value(
                g, fn, logits, targets, None if positional else 0.1, pad_id, positional and pad_id is not None
            )

        for_all(
            "ls.pad",
            st.tuples(
                _LEAD,
                st.integers(2, 9),
                st.sampled_from(["default", "zero", "three", "last"]),
                st.sampled_from([0.3, 0.7]),
                st.booleans(),
                SEEDS,
            ),
            padding,
            max_examples=15,
            first=((2, 4), 5, "three", 0.3, False, 2),
        )

    with g.check("any leading shape: (N, V) with (N,), (B, T, V) with (B, T), (B, T, U, V) with (B, T, U)"):

        def shapes(case):
            lead, V, seed = case
            logits, targets = _ls_case(seed, lead, V, PAD, 0.3)
            _ls_value(g, fn, logits, targets, 0.1)

        for_all(
            "ls.shapes",
            st.tuples(_LEAD, st.integers(2, 8), SEEDS),
            shapes,
            max_examples=8,
            first=((7,), 5, 3),
        )
        for lead in ((1,), (3, 2, 2)):
            shapes((lead, 5, 4))

    with g.check("stable: float32 logits of magnitude 100 to 10^4 give a finite, accurate loss"):

        def stable(case):
            lead, V, scale, eps, seed = case
            logits, targets = _ls_case(seed, lead, V, PAD, 0.3, torch.float32, scale)
            _ls_value(g, fn, logits, targets, eps, extra=f" (logits of scale {scale:g})")

        for_all(
            "ls.stable",
            st.tuples(
                _LEAD,
                st.integers(2, 9),
                st.sampled_from([100.0, 1e3, 1e4]),
                st.sampled_from([0.0, 0.1, 0.5]),
                SEEDS,
            ),
            stable,
            max_examples=8,
            first=((1, 3), 4, 1e3, 0.1, 5),
        )

    with g.check("differentiable: the gradient is F.cross_entropy's, and padded positions get none"):

        def gradients(case):
            lead, V, eps, seed = case
            logits, targets = _ls_case(seed, lead, V, PAD, 0.4)
            where = _ls_where(logits, targets, eps, None)
            p = call_student(
                g,
                where,
                probe,
                fn,
                logits.clone().requires_grad_(),
                targets,
                eps,
                backward=(None, torch.tensor(1.0, dtype=torch.float64)),
            )
            g.expect(
                is_tensor(p.result) and p.result.requires_grad,
                f"{where}: the loss does not depend on the logits through autograd: avoid .item(), .detach() or "
                "torch.tensor(...)",
            )
            lr = logits.clone().requires_grad_()
            _smoothed_ref(lr, targets, eps).backward()
            grad = p.grads[0] if p.grads else None
            g.expect(
                is_tensor(grad) and grad.shape == logits.shape and bool((grad[targets == PAD] == 0).all()),
                f"{where}: padded positions got a gradient: " + _PADDING_COUNTED,
            )
            g.expect(
                close(grad, lr.grad),
                f"{where}: the gradient with respect to the logits differs from the reference",
            )

        for_all(
            "ls.grad",
            st.tuples(_LEAD, st.integers(2, 8), st.sampled_from([0.0, 0.1, 0.6]), SEEDS),
            gradients,
            max_examples=6,
            first=((2, 4), 6, 0.1, 6),
        )

    with g.check("leaves logits and targets unchanged"):

        def untouched(case):
            lead, V, pad_id, seed = case
            pad_id = min(pad_id, V - 1)
            logits, targets = _ls_case(seed, lead, V, pad_id, 0.4)
            where = _ls_where(logits, targets, 0.1, pad_id)
            p = call_student(g, where, probe, fn, logits.clone(), targets.clone(), 0.1, pad_id)
            same_logits = len(p.args) >= 2 and is_tensor(p.args[0]) and torch.equal(p.args[0], logits)
            g.expect(
                same_logits and is_tensor(p.args[1]) and torch.equal(p.args[1], targets),
                f"{where} changed its inputs in place: compute new tensors (no masked_fill_ or item assignment on "
                "logits or targets)",
            )

        for_all(
            "ls.inplace",
            st.tuples(_LEAD, st.integers(2, 8), st.sampled_from([PAD, 1, 4]), SEEDS),
            untouched,
            max_examples=4,
            first=((2, 3), 5, 2, 7),
        )

    with g.check(
        "raises ValueError for targets not of shape logits.shape[:-1], and when every target is padding"
    ):

        def errors(case):
            lead, V, which, seed = case
            logits, targets = _ls_case(seed, lead, V, PAD, 0.3)
            bad = {
                "longer": (
                    targets.reshape(-1)[None].expand(2, -1)
                    if len(lead) == 1
                    else torch.cat([targets, targets[..., :1]], -1)
                ),
                "flat": targets.reshape(-1) if len(lead) > 1 else targets[:, None],
                "with V": torch.zeros(*lead, V, dtype=torch.long) + 1,
                "padding": torch.zeros(lead, dtype=torch.long),
            }[which]
            what = (
                f"logits {tuple(logits.shape)} and targets {tuple(bad.shape)}"
                if which != "padding"
                else f"every target equal to pad_id (logits {tuple(logits.shape)})"
            )
            fix = (
                "there is nothing to average; a mean over nothing is NaN"
                if which == "padding"
                else "targets must have the shape logits.shape[:-1]"
            )
            expect_value_error(g, lambda: fn(logits, bad, 0.1), what, fix)

        kinds = ["longer", "flat", "with V", "padding"]
        for_all(
            "ls.errors",
            st.tuples(_LEAD, st.integers(2, 8), st.sampled_from(kinds), SEEDS),
            errors,
            max_examples=8,
            first=((2, 3), 5, "padding", 8),
        )
        for kind in kinds:
            errors(((2, 3), 5, kind, 9))

    g.finish()


def check_label_smoothed_loss(label_smoothed_loss) -> None:
    """Public checks of ``label_smoothed_loss``: one small example per clause the hidden checks grade."""
    g = Grader("label_smoothed_loss (public)")
    fn = label_smoothed_loss
    logits = rand("public.ls", 2, 3, 4, dtype=torch.float32)
    targets = torch.tensor([[1, 3, 2], [2, 0, 0]])
    with g.check("returns a scalar tensor of the logits' dtype"):
        where = _ls_where(logits, targets, 0.1, None)
        _scalar(g, call_student(g, where, fn, logits, targets, 0.1), torch.float32, where)
    with g.check(
        "smoothing=0.1 with 2 padded targets equals F.cross_entropy(label_smoothing=0.1, ignore_index=0); "
        "smoothing=0 is the plain cross-entropy, 0.1 the default"
    ):
        _ls_value(g, fn, logits, targets, 0.1)
        _ls_value(g, fn, logits, targets, 0.0)
        _ls_value(g, fn, logits, targets)
    with g.check("pad_id=2 skips the targets equal to 2"):
        _ls_value(g, fn, logits.double(), targets, 0.1, 2)
    with g.check("(N, V) logits with (N,) targets"):
        _ls_value(g, fn, logits.reshape(6, 4), targets.reshape(6), 0.2)
    with g.check("float32 logits of magnitude 1000 give a finite, accurate loss"):
        _ls_value(
            g,
            fn,
            rand("public.ls.big", 1, 3, 4, dtype=torch.float32, scale=1000.0),
            torch.tensor([[1, 3, 2]]),
            0.1,
        )
    with g.check("the gradient reaches the logits, and padded positions get none"):
        x = rand("public.ls.grad", 1, 3, 4)
        t = torch.tensor([[1, 0, 2]])
        p = call_student(
            g,
            "label_smoothed_loss(logits (1, 3, 4), [[1, 0, 2]], 0.1)",
            probe,
            fn,
            x.clone().requires_grad_(),
            t,
            0.1,
            backward=(None, torch.tensor(1.0, dtype=torch.float64)),
        )
        lr = x.clone().requires_grad_()
        _smoothed_ref(lr, t, 0.1).backward()
        grad = p.grads[0] if p.grads else None
        g.expect(
            is_tensor(grad) and close(grad, lr.grad),
            "the gradient differs from F.cross_entropy's (padding gets none)",
        )
    with g.check("logits and targets are left unchanged"):
        p = call_student(
            g,
            "label_smoothed_loss(logits (2, 3, 4), targets, 0.1)",
            probe,
            fn,
            logits.clone(),
            targets.clone(),
            0.1,
        )
        g.expect(
            torch.equal(p.args[0], logits) and torch.equal(p.args[1], targets),
            "label_smoothed_loss changed its inputs in place: compute new tensors",
        )
    with g.check("only padding, or targets of the wrong shape, raise a ValueError"):
        expect_value_error(
            g,
            lambda: fn(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), 0.1),
            "every target equal to pad_id",
            "there is nothing to average; a mean over nothing is NaN",
        )
        expect_value_error(
            g,
            lambda: fn(torch.zeros(2, 3, 5), torch.ones(2, 4, dtype=torch.long), 0.1),
            "logits (2, 3, 5) and targets (2, 4)",
            "targets must have the shape logits.shape[:-1]",
        )
    g.finish()


# --------------------------------------------------------------------------- predict, then check


def _weights() -> dict[str, torch.Tensor]:
    """The committed checkpoint's state dict, loaded here (the grader's side: the sandbox has no checkpoints)."""
    from coursekit import checkpoints

    return checkpoints.load("seq2seq-numbers")[0].state_dict()


_FLOOR_CHOICES = {"a": "0", "b": "0.10", "c": "0.66", "d": "3.56 (ln 35)"}


def _closest_choice(measured: float) -> str:
    return min(_FLOOR_CHOICES, key=lambda c: abs(float(_FLOOR_CHOICES[c].split()[0]) - measured))


SMOOTHING_FLOOR = Prediction(
    name="predict_smoothing_floor",
    question="The chapter's model was trained with label smoothing 0.1 over V = 35 German tokens until its "
    "label-smoothed loss reached the floor H(q), and it translates every test number right. Its plain cross-entropy "
    "(smoothing 0: the mean -log p of the right token) on held-out numbers is about?",
    tests="what a model at the label-smoothing floor predicts: p = q, so 1 - eps + eps/V on the right token, not 1",
    measure=lambda: _closest_choice(
        number_words.heldout_loss(_weights(), 256, torch.Generator().manual_seed(0), 0.0)
    ),
    explanation="Answer {truth} (coursekit's heldout_loss at smoothing 0 on 256 held-out numbers). The smoothed loss "
    "is the cross-entropy H(q, p) = H(q) + KL(q || p) against the smoothed target q, so it reaches its floor H(q) "
    "only at p = q: a model at the floor puts q's 1 - 0.1 + 0.1/35 = 0.903 on the right token, as it was trained "
    "to, and its plain cross-entropy is -ln 0.903 = 0.10 (Szegedy et al., 2016). 0 would need probability 1 on "
    "the right token: the argmax is right every time (0.903 against 0.003 for each other token), but exact match "
    "counts argmaxes and the loss counts probabilities. 0.66 is H(q), the floor of the smoothed loss, which also "
    "charges for the 0.1 spread over the wrong tokens; the plain loss scores the right token only, so it is lower. "
    "ln 35 is the loss of a uniform model: smoothing moves only a tenth of the target's mass, and the model stays "
    "confident.",
    choices=_FLOOR_CHOICES,
)

#: ENCODER_PASSES' source and search: a number with 11 German tokens, so no beam ends within the 6 steps
PASSES_NUMBER, PASSES_STEPS, PASSES_WIDTH = 345_678, 6, 4


def _encoder_passes() -> str:
    """Count the decoder's forward passes while beam_decode (width 4, 6 steps) translates one number."""
    from coursekit import checkpoints
    from coursekit.experiments.number_words import make_batch

    model = checkpoints.load("seq2seq-numbers")[0]
    calls = {"encoder": 0, "decoder": 0}
    hooks = [
        getattr(model, part).register_forward_hook(
            lambda *_, part=part: calls.__setitem__(part, calls[part] + 1)
        )
        for part in calls
    ]
    try:
        src, _ = make_batch([PASSES_NUMBER])
        out, _ = ref.beam_decode(model, src, beam_width=PASSES_WIDTH, max_new_tokens=PASSES_STEPS)
    finally:
        for h in hooks:
            h.remove()
    if calls["encoder"] != 1 or len(out) != PASSES_STEPS or ref.EOS in out.tolist():
        return "e"  # the setting the question describes no longer holds
    W, n = PASSES_WIDTH, PASSES_STEPS
    return {1: "a", W: "b", n: "c", W * n: "d"}.get(calls["decoder"], "e")


ENCODER_PASSES = Prediction(
    name="predict_encoder_passes",
    question=f"beam_decode(model, src, beam_width={PASSES_WIDTH}, max_new_tokens={PASSES_STEPS}) translates "
    f"{number_words.english(PASSES_NUMBER)} (11 German tokens, so the search runs all {PASSES_STEPS} steps). The "
    "encoder runs once. How many times does the decoder (model.decoder) run?",
    tests="how beam search drives a decoder: one call per step, the beams batched as rows; not one pass as in "
    "teacher forcing, not one call per beam",
    measure=_encoder_passes,
    explanation="Answer {truth}, counted with a forward hook on model.decoder. Decoding is autoregressive: the "
    "input of step t is the token chosen at step t - 1, so the decoder runs once per step. One pass (1) is teacher "
    "forcing, where every input token is known in advance; a search has to choose them first. Once per beam (4) "
    "would decode each beam in one pass, but a beam's tokens are chosen step by step too, and the beams themselves "
    "change from step to step as candidates are re-ranked. Within a step the beams do not depend on each other, so "
    "they travel as the rows of one batch: the first call reads BOS alone (1 row), each later one the "
    f"{PASSES_WIDTH} live beams ({PASSES_WIDTH} rows), and the cache is reordered to follow the beams that survive "
    f"(Chapter 7's beam_search, unchanged). A call per beam and step ({PASSES_WIDTH * PASSES_STEPS}) would compute "
    f"the same scores in {PASSES_WIDTH} times as many, smaller calls. Without a key/value cache each call re-reads "
    "the whole prefix, so the calls grow longer, not more numerous.",
    choices={
        "a": "once (1)",
        "b": f"once per beam ({PASSES_WIDTH})",
        "c": f"once per step ({PASSES_STEPS})",
        "d": f"once per beam and step ({PASSES_WIDTH * PASSES_STEPS})",
    },
)

#: BLEU_ONE_WORD's corpus: seven one-word references, each translated one too high (five -> six), and one of
#: four words translated exactly
BLEU_ONE_WORD_NUMBERS = (5, 7, 9, 11, 13, 15, 17)
BLEU_LONG_NUMBER = 2100
#: its choices: letter -> BLEU
_BLEU_CHOICES = {"a": 0.0, "b": 12.5, "c": 36.0, "d": 78.0}


def _bleu_one_word() -> str:
    """Score BLEU_ONE_WORD's corpus with the chapter's BLEU and return the nearest choice."""
    english = number_words.english
    refs = [english(n) for n in BLEU_ONE_WORD_NUMBERS] + [english(BLEU_LONG_NUMBER)]
    hyps = [english(n + 1) for n in BLEU_ONE_WORD_NUMBERS] + [english(BLEU_LONG_NUMBER)]
    score = ref.bleu(hyps, refs)
    return min(_BLEU_CHOICES, key=lambda c: abs(_BLEU_CHOICES[c] - score))


BLEU_ONE_WORD = Prediction(
    name="predict_bleu_one_word",
    question=f"A system translating German numbers into English gets {len(BLEU_ONE_WORD_NUMBERS)} one-word "
    "references wrong by one (six for five, ..., eighteen for seventeen) and the eighth, "
    f"{number_words.english(BLEU_LONG_NUMBER)}, exactly right. Its corpus BLEU (the chapter's bleu, sacrebleu's "
    "defaults: words split at spaces, n-grams up to 4) is about?",
    tests="what corpus BLEU pools: n-gram counts over all sentences, so one long right sentence supplies every "
    "higher order; not a mean of sentence scores",
    measure=_bleu_one_word,
    explanation="Answer {truth} (the corpus scored with coursekit.seq2seq.bleu). Corpus BLEU pools the clipped "
    "n-gram counts over all sentences before it divides (Papineni et al., 2002): p_1 = 4/11, since only the four "
    "words of the right sentence match, while p_2 = 3/3, p_3 = 2/2 and p_4 = 1/1 come from that sentence alone, "
    "because a one-word sentence adds nothing to either count of a higher order. Hypotheses and references have 11 "
    "words each, so BP = 1 and BLEU = 100 (4/11)^(1/4) = 78: seven wrong outputs in eight, and a high score. 0 "
    "would need an order with no n-grams in the whole corpus; one sentence of four words is enough to fill all "
    "four. 12.5 is the mean of the sentence-level BLEUs (100 once, 0 seven times), which here equals exact match: "
    "corpus BLEU is not an average of sentence scores, and it weights each sentence by its n-grams, so long "
    "sentences dominate it. 36 is p_1 alone, or the product of the four precisions without the fourth root of "
    "the geometric mean.",
    choices={"a": "0", "b": "12.5", "c": "36", "d": "78"},
)

check_predict_smoothing_floor, grade_predict_smoothing_floor = SMOOTHING_FLOOR.graders()
check_predict_encoder_passes, grade_predict_encoder_passes = ENCODER_PASSES.graders()
check_predict_bleu_one_word, grade_predict_bleu_one_word = BLEU_ONE_WORD.graders()


# --------------------------------------------------------------------------- experiment

#: The experiment's band: the reference's loss on 500 test numbers (measured when graded), within 2%. The committed
#: model puts almost the same probability on every right token, so a draw of 48 or more numbers moves the loss by
#: under 0.1% (measured over 8 seeds of 256: 0.66188-0.66191 at smoothing 0.1); 2% admits any correct draw, and the
#: classic mistakes land far outside: no shift (the decoder reads the answer) gives ~4.8, padding scored ~1.57, the
#: smoothing ignored 0.10 instead of 0.66.
HELDOUT_BAND = 0.02
_FULL_TEST: dict = {}


def _full_test_loss(smoothing: float) -> float:
    """The reference model's teacher-forced loss on every tenth number of the test split (500 numbers spread over
    the whole range; the split is sorted), computed with coursekit; the logits are computed once per process."""
    if not _FULL_TEST:
        from coursekit.experiments.number_words import make_batch, number_splits

        model = ref.Seq2Seq(ref.SEQ2SEQ_PRESETS["small"])
        model.load_state_dict(_weights())
        model.eval()
        src, tgt = make_batch(number_splits().test[::10])  # (500, S), (500, T)
        with torch.no_grad():
            _FULL_TEST["logits"] = model(src, ref.shift_right(tgt, ref.BOS, ref.PAD))  # (500, T, V)
        _FULL_TEST["targets"] = tgt
        _FULL_TEST["weights"] = _weights()
    return ref.label_smoothed_loss(_FULL_TEST["logits"], _FULL_TEST["targets"], smoothing).item()


def _seeded(seed: int):
    return student_side("torch", torch).Generator().manual_seed(seed)


def _heldout(g: Grader, heldout_loss, n: int, seed: int, smoothing: float | None = None):
    where = f"heldout_loss(weights, {n}, generator{'' if smoothing is None else f', smoothing={smoothing}'})"
    _full_test_loss(0.1)  # loads the weights once
    args = (_FULL_TEST["weights"], n, _seeded(seed)) + (() if smoothing is None else (smoothing,))
    return where, call_student(g, where, heldout_loss, *args)


_HELDOUT_WHY = (
    "load the weights into Seq2Seq(SEQ2SEQ_PRESETS['small']) in eval mode, feed the decoder shift_right(tgt, BOS, PAD) "
    "(not the targets themselves), score the logits against tgt with "
    "your label_smoothed_loss at the given smoothing (part 4 must pass first), and draw from number_splits().test"
)


def _heldout_band(g: Grader, heldout_loss, n: int, seed: int, smoothing: float | None) -> None:
    where, v = _heldout(g, heldout_loss, n, seed, smoothing)
    truth = _full_test_loss(0.1 if smoothing is None else smoothing)
    expect_in_band(g, where, v, truth * (1 - HELDOUT_BAND), truth * (1 + HELDOUT_BAND), _HELDOUT_WHY)


def grade_heldout_loss(heldout_loss) -> None:
    """Grade the experiment ``heldout_loss(weights, n, generator, smoothing=0.1)``: its measurements must fall
    within the stated band around the reference's loss on the test split."""
    g = Grader("heldout_loss")
    with g.check("returns a Python float, for n = 1 as for more numbers"):
        for n in (32, 1):
            where, v = _heldout(g, heldout_loss, n, 3)
            g.expect(
                type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}"
            )
    with g.check(
        f"smoothing 0.1 by default: within {HELDOUT_BAND:.0%} of the reference's loss on the test split"
    ):
        for n, seed in ((64, 11), (100, 12)):
            _heldout_band(g, heldout_loss, n, seed, None)
    with g.check(
        f"at smoothing 0, 0.3 and 1: within {HELDOUT_BAND:.0%} of the reference's loss on the test split"
    ):
        for smoothing, seed in ((0.0, 21), (0.3, 22), (1.0, 23)):
            _heldout_band(g, heldout_loss, 48, seed, smoothing)
    with g.check("draws from its generator: the same seed gives the same result, another seed another"):
        _, a = _heldout(g, heldout_loss, 16, 31)
        _, b = _heldout(g, heldout_loss, 16, 31)
        _, c = _heldout(g, heldout_loss, 16, 32)
        g.expect(
            a == b and a != c,
            f"two generators seeded alike gave {a!r} and {b!r}, and another seed gave {c!r}: draw the numbers with "
            "torch.randint(..., generator=generator), not from torch's global random state",
        )
    with g.check(
        "raises ValueError for an n that is not a positive integer (0, -1, True) or a smoothing outside [0, 1]"
    ):
        for n, smoothing in ((0, 0.1), (-1, 0.1), (True, 0.1), (8, 1.5), (8, -0.1)):
            expect_value_error(
                g,
                lambda n=n, smoothing=smoothing: heldout_loss(
                    _FULL_TEST["weights"], n, _seeded(0), smoothing
                ),
                f"n={n}, smoothing={smoothing}",
                "say which argument is out of range",
            )
    g.finish()


def check_heldout_loss(heldout_loss) -> None:
    """Public checks of ``heldout_loss``: one measurement at the default smoothing and one without smoothing."""
    g = Grader("heldout_loss (public)")
    with g.check("heldout_loss(weights, 128, generator) and (..., 0.0) match the reference's loss"):
        _heldout_band(g, heldout_loss, 128, 0, None)
        _heldout_band(g, heldout_loss, 128, 1, 0.0)
    g.finish()


# =========================================================================== stretch: the length penalty

_LP_POWER_HINT = (
    "Wu et al.'s penalty is ((5 + n) / 6) ** alpha, not n ** alpha (the chapter's beam_search rule): the 5 "
    "softens the penalty of short hypotheses and the 6 makes lp(1) = 1"
)
_LP_ALPHA_HINT = (
    "raise the penalty to the power alpha: lp(n) = ((5 + n) / 6) ** alpha (alpha = 0 gives lp = 1)"
)
_LP_DIVIDE_HINT = "divide the log-probability by the penalty (logprob / lp(n)), do not multiply"
_LP_INT_HINT = (
    "(5 + n) // 6 is integer division: convert the lengths to logprob's dtype and divide with /, so "
    "lp(2) = 7/6"
)
_LP_PRECEDENCE_HINT = "mind the brackets: ((5 + n) / 6) ** alpha, not (5 + n) / 6 ** alpha"
_LP_DTYPE_HINT = (
    "compute the penalty in logprob's dtype (length.to(logprob.dtype)): a float32 penalty rounds float64 "
    "scores"
)


def _lp_mistakes(logprob: torch.Tensor, length: torch.Tensor, alpha: float):
    n = length.to(logprob.dtype)
    lp = ((5 + n) / 6) ** alpha
    return [
        (logprob / n**alpha, _LP_POWER_HINT),
        (logprob / ((5 + n) / 6), _LP_ALPHA_HINT),
        (logprob * lp, _LP_DIVIDE_HINT),
        (
            logprob / (torch.div(5 + length, 6, rounding_mode="floor").to(logprob.dtype) ** alpha),
            _LP_INT_HINT,
        ),
        (logprob / ((5 + n) / 6**alpha), _LP_PRECEDENCE_HINT),
        (logprob / ((5 + length.float()) / 6) ** alpha, _LP_DTYPE_HINT),
    ]


def _lp_where(logprob: torch.Tensor, length: torch.Tensor, alpha) -> str:
    def show(t):
        return str(t.tolist()) if t.numel() <= 6 else f"{dtype_name(t.dtype)} {tuple(t.shape)}"

    return f"length_penalty_score({show(logprob)} {dtype_name(logprob.dtype)}, lengths {show(length)}, {alpha!r})"


def _lp_case(
    g: Grader, fn, logprob: torch.Tensor, length: torch.Tensor, alpha: float, what: str = ""
) -> None:
    where = _lp_where(logprob, length, alpha)
    p = call_student(g, where, probe, fn, logprob.clone(), length.clone(), alpha)
    out = p.result
    expected = ref.length_penalty_score(logprob, length, alpha)
    g.expect(
        is_tensor(out) and out.shape == expected.shape and out.dtype == expected.dtype,
        f"{where} should return a tensor {dtype_name(expected.dtype)} {tuple(expected.shape)} (the broadcast shape, "
        f"logprob's dtype), got {describe(out)}",
    )
    if len(p.args) >= 2 and not (torch.equal(p.args[0], logprob) and torch.equal(p.args[1], length)):
        g.fail(f"{where} changed its inputs in place: return a new tensor, the caller still needs them")
    first_match(g, out, [(m, f"{where}: {h}") for m, h in _lp_mistakes(logprob, length, alpha)], expected)
    g.expect(
        close(out, expected, magnitude=magnitude(logprob)),
        f"{where}: expected {_num(expected)}, got {_num(out)}{what}",
    )


def _lp_inputs(seed: int, lead: tuple, K: int, dtype: torch.dtype, broadcast: bool):
    """Log-probabilities ``(*lead, K)`` (negative, as summed log-probabilities are) and lengths 1..40 of
    shape ``(K,)`` (broadcast over the leading axes) or ``(*lead, K)``."""
    logprob = -tensor(seed, *lead, K, dtype=dtype, scale=4.0).abs() - 0.01
    shape = (K,) if broadcast else (*lead, K)
    length = torch.randint(1, 41, shape, generator=torch.Generator().manual_seed(seed + 1))
    return logprob, length


_ALPHAS = st.sampled_from([0.0, 0.3, 0.6, 0.7, 1.0, 1.5, 2.0])
_LP_LEAD = st.sampled_from([(), (1,), (2,), (3,), (2, 2)])


def grade_length_penalty_score(length_penalty_score) -> None:
    """Grade the stretch part ``length_penalty_score(logprob, length, alpha)``."""
    g = Grader("length_penalty_score")

    with g.check("returns a tensor of the broadcast shape and logprob's dtype (float32 and float64)"):

        def shape_dtype(case):
            lead, K, dtype, broadcast, seed = case
            logprob, length = _lp_inputs(seed, lead, K, dtype, broadcast)
            where = _lp_where(logprob, length, 0.6)
            out = call_student(g, where, length_penalty_score, logprob, length, 0.6)
            g.expect(
                is_tensor(out) and out.shape == logprob.shape and out.dtype == dtype,
                f"{where} should return a tensor {dtype_name(dtype)} {tuple(logprob.shape)}, got {describe(out)}",
            )

        for_all(
            "lp.shape",
            st.tuples(_LP_LEAD, st.integers(1, 6), st.sampled_from(FLOATS), st.booleans(), SEEDS),
            shape_dtype,
            max_examples=6,
            first=((), 3, torch.float64, False, 0),
        )

    with g.check("score = logprob / ((5 + n) / 6) ** alpha, for any alpha >= 0, shape and lengths"):

        def values(case):
            lead, K, alpha, dtype, broadcast, seed = case
            logprob, length = _lp_inputs(seed, lead, K, dtype, broadcast)
            _lp_case(g, length_penalty_score, logprob, length, alpha)

        for_all(
            "lp.values",
            st.tuples(_LP_LEAD, st.integers(1, 8), _ALPHAS, st.sampled_from(FLOATS), st.booleans(), SEEDS),
            values,
            max_examples=25,
            first=((2,), 4, 1.0, torch.float64, False, 1),
        )

    with g.check("alpha = 0 gives the raw log-probability, and lp(1) = 1 for every alpha"):

        def ends(case):
            K, alpha, seed = case
            logprob, length = _lp_inputs(seed, (), K, torch.float64, False)
            _lp_case(g, length_penalty_score, logprob, length, 0.0, ": with alpha = 0, lp(n) = 1")
            _lp_case(
                g,
                length_penalty_score,
                logprob,
                torch.ones_like(length),
                alpha,
                ": lp(1) = (6 / 6) ** alpha = 1",
            )

        for_all(
            "lp.ends", st.tuples(st.integers(1, 8), _ALPHAS, SEEDS), ends, max_examples=6, first=(3, 0.6, 2)
        )

    with g.check("re-ranks: a longer hypothesis can overtake a shorter one as alpha grows"):
        logprob = torch.tensor([-3.0, -4.0], dtype=torch.float64)
        length = torch.tensor([2, 6])
        for alpha in (0.0, 0.6, 1.0, 2.0):
            _lp_case(g, length_penalty_score, logprob, length, alpha)

    with g.check("an alpha below 0 or a length below 1 raises ValueError; alpha = 0 and length 1 are fine"):
        logprob = torch.tensor([-1.0, -2.0], dtype=torch.float64)
        for alpha in (-0.1, -1.0):
            expect_value_error(
                g,
                lambda alpha=alpha: length_penalty_score(logprob, torch.tensor([1, 2]), alpha),
                f"alpha={alpha!r}",
                "alpha must be >= 0",
            )
        for bad in ([0, 2], [3, -1], [0, 0]):
            expect_value_error(
                g,
                lambda bad=bad: length_penalty_score(logprob, torch.tensor(bad), 0.6),
                f"lengths {bad}",
                "every length must be at least 1",
            )
        _lp_case(g, length_penalty_score, logprob, torch.tensor([1, 1]), 0.0)

    g.finish()


def check_length_penalty_score(length_penalty_score) -> None:
    """Public checks of ``length_penalty_score``: the docstring's example and one small case per clause."""
    g = Grader("length_penalty_score (public)")
    logprob, length = torch.tensor([-3.0, -4.0], dtype=torch.float64), torch.tensor([2, 6])
    with g.check(
        "logprob [-3.0, -4.0], lengths [2, 6], alpha 1 score [-2.571, -2.182] (float64 and float32)"
    ):
        for dtype in FLOATS:
            _lp_case(g, length_penalty_score, logprob.to(dtype), length, 1.0)
    with g.check("alpha = 0 gives the raw log-probability; alpha = 0.6 as in Wu et al."):
        _lp_case(g, length_penalty_score, logprob, length, 0.0)
        _lp_case(g, length_penalty_score, logprob, length, 0.6)
    with g.check("lengths (2,) broadcast over logprob (3, 2)"):
        _lp_case(
            g, length_penalty_score, torch.tensor([[-1.0, -2.0], [-3.0, -4.0], [-0.5, -9.0]]), length, 0.7
        )
    with g.check("alpha = -0.5 and a length 0 raise ValueError"):
        expect_value_error(g, lambda: length_penalty_score(logprob, length, -0.5), "alpha=-0.5")
        expect_value_error(
            g, lambda: length_penalty_score(logprob, torch.tensor([0, 6]), 1.0), "lengths [0, 6]"
        )
    g.finish()
