"""Checks for Exercise 8 (cross-attention and the decoder of an encoder-decoder).

Each graded part is a :class:`~coursekit.grading.spec.Spec`: one ``Clause`` per rule of the part's text,
its test written once. ``check_*`` (public) runs each clause on its small fixed examples; ``grade_*``
(hidden) runs it on inputs drawn across what the text allows (batch sizes and lengths including 1,
T != S, padded and fully padded sources, every grouping of key/value heads, layers with and without
biases, both float dtypes, large logits, any smoothing and padding id), then on fixed edge inputs.
Results are compared with independent references (Hugging Face's BART ``shift_tokens_right`` in the
tests, ``nn.MultiheadAttention``, ``nn.TransformerDecoderLayer``, ``F.cross_entropy(label_smoothing=...)``)
and with :mod:`coursekit.seq2seq` in float64, plus properties (a future target does not change earlier
outputs, padded source tokens get no attention). Each dropout is checked alone and deterministically:
at probability 1 in training mode, and for cross-attention's returned weights, each either dropped or
scaled by ``1 / (1 - p)`` with the output computed from them. Before the generic "differs" hint, a
check names the common mistake that matches. The generic kinds of clause (a ValueError, no change in
place, the promised kind of result, a new tensor, an order-free mapping, an experiment's stated
procedure) come from :mod:`coursekit.grading.spec`.

Modules cross no wire: under the autograder the student's code runs in a sandboxed process, so the
graders of parts 2 and 3 receive *classes* (the notebook's ``MultiHeadAttention``, the student's
``PreNormDecoderLayer``), build the modules with them in the student's process and push weights with
``load_state_dict``.

Over 500 lines: one clause per rule of the exercise text for each graded part, with the inputs that
provoke it and the common mistakes its hints name; splitting it would scatter one exercise's
specification over several files.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn

from coursekit import layers as L
from coursekit import multihead as mh
from coursekit import seq2seq as ref
from coursekit.attention import causal_mask, softmax
from coursekit.experiments import number_words
from coursekit.grading.ch07_gpt import _num, attention_pair  # Exercise 7's helpers and attention pair
from coursekit.grading.core import (
    Grader,
    call_student,
    close,
    describe,
    dtype_name,
    expect_value_error,
    first_match,
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
from coursekit.grading.spec import (
    Call,
    Clause,
    Spec,
    new_tensor,
    order_free,
    procedure,
    raises,
    returns,
    unchanged,
)

_PARTS = ("shift_right", "cross_attention", "pre_norm_decoder_layer", "label_smoothed_loss", "heldout_loss")
_PARTS += ("predict_smoothing_floor", "predict_encoder_passes", "predict_bleu_one_word")
_PARTS += ("length_penalty_score",)
__all__ = [f"{verb}_{part}" for part in _PARTS for verb in ("check", "grade")]

C, H, DFF = 12, 4, 20  # D = 3: scaling by sqrt(C) and by sqrt(D) differ; C and H as ch07's attention_pair
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


def _ids_from(seed: int, *shape: int) -> torch.Tensor:
    return torch.randint(3, 30, shape, generator=_gen(seed, 7))


def _inputs_text(B: int, T: int, S: int, Cc: int, keep=None, dtype=torch.float64) -> str:
    """x, memory and the padding mask (its 0/1 rows when small, else its shape) of a call, for a hint."""
    shown = "" if keep is None else keep.int().tolist() if keep.numel() <= 16 else tuple(keep.shape)
    mask = "" if keep is None else f", memory_key_padding_mask {shown}"
    return f"x ({B}, {T}, {Cc}) {dtype_name(dtype)}, memory ({B}, {S}, {Cc}){mask})"


def _pair_inputs(Cc: int, B: int, T: int, S: int, seed: int, dtype=torch.float64):
    """x (B, T, C) and memory (B, S, C) of a cross-attention or decoder-layer check, from ``seed``."""
    return tensor(seed, B, T, Cc, dtype=dtype), tensor(seed + 1, B, S, Cc, dtype=dtype)


def _keep_mask(seed: int, B: int, S: int, empty_rows: bool = False) -> torch.Tensor:
    """A (B, S) padding mask: a random length per row (at least 1 unless ``empty_rows``), True first."""
    lengths = torch.randint(0 if empty_rows else 1, S + 1, (B,), generator=_gen(seed, 13))
    return torch.arange(S)[None, :] < lengths[:, None]


def ref_padding(lengths: list[int], S: int) -> torch.Tensor:
    """A (B, S) padding mask, True at the first ``lengths[b]`` positions of row b."""
    return torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]


# =========================================================================== part 1: shift_right

#: the hints of shift_right's common mistakes, in the order :func:`_shift_mistakes` tries them
_SHIFT_HINTS = {
    "drops_first": "the first label was dropped instead of the last: the decoder input is bos_id followed by "
    "labels[:, :-1] (position t holds target t - 1; the last target is never an input)",
    "no_bos": "the decoder input must start with bos_id: torch.cat([a column of bos_id, labels[:, :-1]], "
    "dim=1)",
    "rolled": "torch.roll wraps the last label around to position 0: drop the last label and put bos_id at "
    "position 0 instead",
    "shifted_left": "the labels were shifted left: the decoder input at position t must be target t - 1 "
    "(shift right, with bos_id at position 0)",
    "minus_100": "a label of -100 (Hugging Face's 'not scored') is not a token id and would crash the "
    "embedding: replace it with pad_id in the decoder input",
}
_FIXED_IDS = "bos_id and pad_id are arguments: use them, not fixed numbers"
_KEEP_LABELS = "the caller still needs them as the targets; build a new tensor "
_KEEP_LABELS += "(torch.cat, masked_fill rather than masked_fill_)"


def _shift_mistakes(labels, bos_id, pad_id):
    """The decoder inputs of the common wrong shifts with their hints; those of a bos_id or pad_id fixed at the
    chapter's values last."""
    column = lambda value: labels.new_full((labels.shape[0], 1), value)  # (B, 1)
    clean = lambda t, pad=pad_id: t.masked_fill(t == -100, pad)
    wrong = {
        "drops_first": clean(torch.cat([column(bos_id), labels[:, 1:]], 1)),
        "no_bos": clean(torch.cat([column(pad_id), labels[:, :-1]], 1)) if bos_id != pad_id else None,
        "rolled": clean(torch.roll(labels, 1, dims=1)),
        "shifted_left": clean(torch.cat([labels[:, 1:], column(bos_id)], 1)),
        "minus_100": torch.cat([column(bos_id), labels[:, :-1]], 1),
    }
    out = [(wrong[k], hint) for k, hint in _SHIFT_HINTS.items()]
    for b, p in ((BOS, PAD), (BOS, pad_id), (bos_id, PAD)):
        if (b, p) != (bos_id, pad_id):
            out.append((clean(torch.cat([column(b), labels[:, :-1]], 1), p), _FIXED_IDS))
    return out


def _shift_where(labels, bos_id, pad_id, keywords=False) -> str:
    shown = labels.tolist() if labels.numel() <= 12 else describe(labels)
    args = f"bos_id={bos_id}, pad_id={pad_id}" if keywords else f"{bos_id}, {pad_id}"
    return f"shift_right({shown}, {args})"


def _shift_test(g: Grader, shift_right, case, values: bool = True) -> None:
    """One shift_right case (see :func:`_shift_labels`): the kind of result, no change in place, and (with
    ``values``) the reference's values, a known mistake named first."""
    labels, bos_id, pad_id, keywords, what = _shift_labels(case)
    where = _shift_where(labels, bos_id, pad_id, keywords)
    args, kwargs = ((), {"bos_id": bos_id, "pad_id": pad_id}) if keywords else ((bos_id, pad_id), {})
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
        g.fail(f"{where} changed labels in place: {_KEEP_LABELS}")
    if not values:
        return
    expected = ref.shift_right(labels, bos_id, pad_id)
    first_match(g, out, [(m, f"{where}: {h}") for m, h in _shift_mistakes(labels, bos_id, pad_id)], expected)
    if bool((out == -100).any()):
        g.fail(f"{where}: {_SHIFT_HINTS['minus_100']}")
    g.expect(torch.equal(out, expected), f"{where}: expected {expected.tolist()}, got {out.tolist()}{what}")


_SHIFT_SIZES = st.tuples(st.integers(1, 4), st.integers(1, 9))


@dataclass(frozen=True)
class _Given:
    """A worked example written out: the labels as rows, and the ids (by keyword or positionally)."""

    labels: tuple
    bos_id: int = BOS
    pad_id: int = PAD
    keywords: bool = False


def _shift_labels(case):
    """``(labels, bos_id, pad_id, keywords, hint suffix)`` of a case: a :class:`_Given`, ``"mixed"`` (padding, a
    tail of -100 and a lone -100), ``((B, T), seed)``, ``((B, T), rate, seed)`` (about ``rate`` of the labels
    -100) or ``((B, T), bos_id, pad_id, keywords, seed)`` (30% of them -100)."""
    if isinstance(case, _Given):
        return torch.tensor(case.labels), case.bos_id, case.pad_id, case.keywords, ""
    if case == "mixed":
        labels = _ids_from(4, 3, 7)
        labels[0, 5:] = PAD
        labels[1, 2:] = -100
        labels[2, 6] = -100
        return labels, BOS, PAD, False, ""
    (B, T), *rest, seed = case
    labels = _ids_from(seed, B, T)
    if len(rest) == 3:
        labels = labels.masked_fill(torch.rand(B, T, generator=_gen(seed, 3)) < 0.3, -100)
        return labels, *rest, f" ({_FIXED_IDS})"
    if rest:
        labels = labels.masked_fill(torch.rand(B, T, generator=_gen(seed, 5)) < rest[0], -100)
    return labels, BOS, PAD, False, ""


def _shift_untouched(case) -> Call:
    labels = _shift_labels((case[0], 0.3, case[1]))[0]
    return Call(_shift_where(labels, BOS, PAD), (labels, BOS, PAD))


def _shift_bad(case) -> Call:
    (B, T), which, seed = case
    labels = _ids_from(seed, B, T)
    x, what = {
        "1-D": (labels[0], f"1-D labels {tuple(labels[0].shape)}"),
        "3-D": (labels[..., None], f"3-D labels {(B, T, 1)}"),
        "T = 0": (labels[:, :0], f"labels {(B, 0)} (T = 0)"),
        "int32": (labels.int(), f"int32 labels {(B, T)}"),
        "float": (labels.float(), f"float32 labels {(B, T)}"),
    }[which]
    return Call(what, (x, BOS, PAD))


_SHIFT_CASES = st.tuples(_SHIFT_SIZES, SEEDS)
_SHIFT_ERRORS = ["1-D", "3-D", "T = 0", "int32", "float"]

SHIFT_RIGHT = Spec(
    "shift_right",
    [
        Clause(
            "returns a (B, T) torch.long tensor (any B, T >= 1)",
            functools.partial(_shift_test, values=False),
            _SHIFT_CASES,
            key="shift.shape",
            budget="small",
            examples=[((1, 1), 0)],
        ),
        Clause(
            "position 0 holds bos_id and position t label t - 1 (the last label is dropped)",
            _shift_test,
            _SHIFT_CASES,
            key="shift.values",
            budget="more",
            examples=[((2, 4), 1), _Given(((5, 6, 7, 2), (8, 2, 0, 0)))],  # [[1, 5, 6, 7], [1, 8, 2, 0]]
        ),
        Clause(
            "bos_id and pad_id are the arguments (any ids, positionally or by keyword)",
            _shift_test,
            st.tuples(_SHIFT_SIZES, st.integers(0, 40), st.integers(0, 40), st.booleans(), SEEDS),
            key="shift.args",
            budget="more",
            examples=[((2, 5), 5, 9, False, 2), _Given(((5, -100), (-100, 6)), 4, 9, keywords=True)],
        ),
        Clause(
            "a label of -100 becomes pad_id (anywhere, and padding is shifted along)",
            _shift_test,
            st.tuples(_SHIFT_SIZES, st.sampled_from([0.3, 0.7, 1.0]), SEEDS),
            key="shift.ignore",
            examples=[((2, 5), 0.7, 3), _Given(((5, 6, -100, -100),))],
            also=["mixed"],
        ),
        unchanged(
            _shift_untouched,
            _SHIFT_CASES,
            key="shift.inplace",
            budget="handful",
            examples=[((2, 4), 5)],
            text="leaves labels unchanged",
            advice=_KEEP_LABELS,
        ),
        raises(
            _shift_bad,
            st.tuples(_SHIFT_SIZES, st.sampled_from(_SHIFT_ERRORS), SEEDS),
            key="shift.errors",
            examples=[((2, 3), "1-D", 6), ((2, 3), "float", 7)],
            also=[((2, 3), kind, 7) for kind in _SHIFT_ERRORS],
            fix="labels must be a 2-D (B, T) tensor of torch.long token ids with T >= 1; one sequence is "
            "labels[None]",
            text="raises ValueError unless labels is a 2-D torch.long tensor with T >= 1",
        ),
    ],
)
check_shift_right, grade_shift_right = SHIFT_RIGHT.graders()


# =========================================================================== part 2: cross_attention

#: the hints of cross-attention's common mistakes, in the order :func:`_cross_mistakes` tries them
_CROSS_HINTS = {
    "kv_from_x": "the keys and values come from x: in cross-attention only the queries come from the decoder's "
    "x, the keys and values from the encoder's memory (attn.project(x, memory))",
    "mask_ignored": "memory_key_padding_mask was ignored: padded source tokens must get no attention; broadcast "
    "it to (B, 1, 1, S) and mask the scores",
    "mask_inverted": "memory_key_padding_mask is inverted: in this course True marks a real source token (may "
    "attend) and False padding",
    "not_scaled": "the scores are not scaled: divide q k^T by sqrt(D), D = attn.d_head",
    "by_width": "the scores are scaled by 1/sqrt(C): divide by sqrt(D), the head width D = attn.d_head = {d_head}, "
    "not the model width",
    "no_out_proj": "the output projection is missing: return attn.out_proj(merge_heads(out))",
    "wrong_axis": "the softmax runs over the wrong axis: each query's weights must sum to 1 over the S source "
    "positions (the last axis of the (B, H, T, S) scores)",
    "groups": "the key/value heads are not repeated for the query heads: with attn.n_kv_heads < attn.n_heads use "
    "repeat_kv(k, attn.n_heads // attn.n_kv_heads) (query head h reads key/value head h // (H / H_kv))",
    "causal": "cross-attention is not causal: every target position may read the whole source (mask only the "
    "padding), the causal mask belongs to the decoder's self-attention",
}


def _manual(r, q_src, kv_src, mask=None, scale=None, dim=-1, out_proj=True, tiled=False):
    """``r``'s attention output from ``q_src`` to ``kv_src`` computed by hand, with a mistake's knobs."""
    q, k, v = r.project(q_src, kv_src)  # (B, H, Tq, D), (B, H_kv, S, D) x 2
    n_rep = r.n_heads // r.n_kv_heads
    if tiled:
        k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)
    else:
        k, v = mh.repeat_kv(k, n_rep), mh.repeat_kv(v, n_rep)
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(r.d_head) if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = mh.merge_heads(softmax(scores, dim=dim) @ v)  # a fully masked row gives zeros, as in the reference
    return r.out_proj(out) if out_proj else out


def _cross_mistakes(r, x, memory, keep):
    """The outputs of the common wrong cross-attentions with ``r``'s weights, each with its hint."""
    m4 = None if keep is None else keep[:, None, None, :]  # (B, 1, 1, S)
    T, S = x.shape[1], memory.shape[1]
    attend = functools.partial(_manual, r, x, memory)
    causal = torch.ones(T, S, dtype=torch.bool).tril()  # (T, S), as a student would write it
    wrong = {
        "kv_from_x": r(x)[0] if T == S else None,
        "mask_ignored": None if keep is None else attend(),
        "mask_inverted": None if keep is None else attend(~m4),
        "not_scaled": attend(m4, scale=1.0),
        "by_width": attend(m4, scale=1 / math.sqrt(r.d_model)),
        "no_out_proj": attend(m4, out_proj=False),
        "wrong_axis": attend(m4, dim=-2),
        "groups": attend(m4, tiled=True) if 1 < r.n_kv_heads < r.n_heads else None,
        "causal": attend(causal if m4 is None else causal & m4) if T > 1 else None,
    }
    return [(wrong[k], hint.format(d_head=r.d_head)) for k, hint in _CROSS_HINTS.items()]


def _cross_where(config, B, T, S, keep=None, dtype=torch.float64, extra="") -> str:
    Cc, Hh, kv, bias = config
    inputs = _inputs_text(B, T, S, Cc, keep, dtype)
    return f"cross_attention(attn (C={Cc}, H={Hh}, n_kv_heads={kv}, bias={bias}{extra}), {inputs}"


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
        g.fail(
            f"{where}: the queries come from memory: the output must have one row per decoder position, (B, T, "
            "C); queries from x, keys and values from memory"
        )
    if is_tensor(w) and w.shape == (B, Hh, T, T) and S != T:
        g.fail(f"{where}: {_CROSS_HINTS['kv_from_x']}")
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


def _cross_pair(student, name: str, config, dropout: float = 0.0):
    """The student's attention module (built with their class) and coursekit's, with ``config``."""
    Cc, Hh, kv, bias = config
    return attention_pair(student[1], name, kv, dropout, d_model=Cc, n_heads=Hh, bias=bias)


def _cross_case(g: Grader, student, name: str, config, sizes, keep=None, dtype=torch.float64, seed=0) -> None:
    """The student's cross-attention against Chapter 2's ``attn(x, kv=memory, key_padding_mask=...)``."""
    (B, T, S), Cc, Hh = sizes, config[0], config[1]
    m, r = _cross_pair(student, name, config)
    x, memory = _pair_inputs(Cc, B, T, S, seed)
    expected, expected_w = r(x, kv=memory, key_padding_mask=keep, need_weights=True)
    where = _cross_where(config, B, T, S, keep, dtype)
    if dtype != torch.float64:
        m.to(dtype)
    out, w = _cross_call(g, student[0], where, m, x.to(dtype), memory.to(dtype), keep, Hh)
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


def _cross_shape(g: Grader, student, case) -> None:
    config, (B, T, S), dtype, seed = case
    m, _ = _cross_pair(student, f"cross.shape.{seed}", config)
    m.to(dtype)
    x, memory = _pair_inputs(config[0], B, T, S, seed, dtype)
    _cross_call(g, student[0], _cross_where(config, B, T, S, None, dtype), m, x, memory, None, config[1])


def _cross_plain(g: Grader, student, case) -> None:
    if case[0] != "torch":
        config, sizes, dtype, seed = case
        return _cross_case(g, student, f"cross.plain.{seed}", config, sizes, None, dtype, seed)
    _, T, S = case  # against torch's own module
    m, r = attention_pair(student[1], f"cross.torch.{T}.{S}")
    x, memory = rand(f"cross.torch.{T}.x", 2, T, C), rand(f"cross.torch.{S}.m", 2, S, C)
    where = _cross_where(CONFIGS[0], 2, T, S)
    out, w = _cross_call(g, student[0], where, m, x, memory)
    t = nn.MultiheadAttention(C, H, batch_first=True).double().eval()
    t.load_state_dict(L.to_torch_state_dict(r.state_dict()))
    t_out, t_w = t(x, memory, memory, average_attn_weights=False)
    first_match(g, out, [(mm, f"{where}: {h}") for mm, h in _cross_mistakes(r, x, memory, None)], t_out)
    g.expect(close(out, t_out), f"{where}: the output differs from nn.MultiheadAttention(x, memory, memory)")
    g.expect(close(w, t_w), f"{where}: the weights differ from nn.MultiheadAttention's, per head")


def _cross_masked(g: Grader, student, case, kind: str = "mask") -> None:
    """A drawn padding mask (``kind`` "mask"); one with rows of no real token, the first at least ("empty"); a
    mask or none, as ``case[2]`` says ("gqa"); or the fixed mask ("fixed")."""
    if case == "fixed":
        keep = ref_padding([5, 3, 2], 6)
        return _cross_case(g, student, "cross.mask.fixed", CONFIGS[0], (3, 4, 6), keep, seed=3)
    config, (B, T, S), *masked, seed = case
    keep = _keep_mask(seed, B, S, empty_rows=kind == "empty") if masked != [False] else None
    if kind == "empty":
        keep[0] = False  # at least one row with no real token
    _cross_case(g, student, f"cross.{kind}.{seed}", config, (B, T, S), keep, seed=seed)


def _cross_gradients(g: Grader, student, case) -> None:
    config, (B, T, S), seed = case
    m, r = _cross_pair(student, f"cross.grad.{seed}", config)
    x, memory = _pair_inputs(config[0], B, T, S, seed)
    keep, up = _keep_mask(seed, B, S), tensor(seed + 2, B, T, config[0])
    where = _cross_where(config, B, T, S, keep)
    xs, ms = x.clone().requires_grad_(), memory.clone().requires_grad_()
    p = call_student(g, where, probe, student[0], m, xs, ms, keep, backward=(0, up))
    xr, mr = x.clone().requires_grad_(), memory.clone().requires_grad_()
    (r(xr, kv=mr, key_padding_mask=keep)[0] * up).sum().backward()
    grads = p.grads or [None, None, None, None]
    for i, name, want in ((1, "x", xr.grad), (2, "memory", mr.grad)):
        g.expect(
            grads[i] is not None,
            f"{where}: no gradient reached {name}: avoid .detach(), .item() or in-place changes",
        )
        g.expect(
            close(grads[i], want), f"{where}: the gradient with respect to {name} differs from the reference"
        )


def _cross_dropout(g: Grader, student, case) -> None:
    config, (B, T, S), p, training, seed = case
    fn, Hh = student[0], config[1]
    m, r = _cross_pair(student, f"cross.dropout.{seed}", config, dropout=0.5)
    if p != 0.5:
        set_attr(m, "dropout", p)
    if training:
        m.train()
    x, memory = _pair_inputs(config[0], B, T, S, seed)
    keep = _keep_mask(seed, B, S)
    mode = f", attn.dropout={p}, {'training' if training else 'eval'} mode"
    where = _cross_where(config, B, T, S, keep, extra=mode)
    out, w = _cross_call(g, fn, where, m, x, memory, keep, Hh)
    expected, expected_w = r(x, kv=memory, key_padding_mask=keep, need_weights=True)
    if not training:
        if not (close(out, expected) and close(w, expected_w)):
            # the same call with attn.dropout = 0: right then, the dropout acted in eval mode (weights that
            # only look dropped, say all zero, can have another cause: an inverted mask)
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
        f"{where}: each returned weight must be 0 (dropped) or the softmax weight times 1 / (1 - p): apply "
        "F.dropout(weights, attn.dropout) when attn.training, and return the dropped weights",
    )
    v = mh.repeat_kv(r.project(x, memory)[2], r.n_heads // r.n_kv_heads)
    g.expect(
        close(out, r.out_proj(mh.merge_heads(w @ v))),
        f"{where}: out must be computed from the dropped weights: out = out_proj(merge_heads(weights @ v)) "
        "after the dropout",
    )


def _cross_bad(case) -> Call:
    (B, T, S), which, seed = case
    x, memory = _pair_inputs(C, B, T, S, seed)
    keep = _keep_mask(seed, B, S)
    mask, what = {
        "float": (keep.double(), f"a float64 mask {(B, S)}"),
        "long": (keep.long(), f"an int64 mask {(B, S)}"),
        "S + 1": (torch.cat([keep, keep[:, :1]], 1), f"a mask {(B, S + 1)} for memory {(B, S, C)}"),
        "1-D": (keep[0], f"a 1-D mask {(S,)} for memory {(B, S, C)}"),
        "3-D": (keep[:, None, :], f"a mask {(B, 1, S)} for memory {(B, S, C)}"),
        "B + 1": (torch.cat([keep, keep[:1]], 0), f"a mask {(B + 1, S)} for memory {(B, S, C)}"),
    }[which]

    def attn(g: Grader, student):
        """The student's cross_attention with an attention module built with their class as its first argument."""
        return functools.partial(student[0], attention_pair(student[1], f"cross.bad.{seed}")[0])

    return Call(what, (x, memory, mask), build=attn)


_SIZES = st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 6))  # (B, T, S)
_DTYPES = st.sampled_from(FLOATS)
_CONFIGS = st.sampled_from(CONFIGS)
_CROSS_CASES = st.tuples(_CONFIGS, _SIZES, SEEDS)
_CROSS_DTYPED = st.tuples(_CONFIGS, _SIZES, _DTYPES, SEEDS)
_BAD_MASKS = ["float", "long", "S + 1", "1-D", "3-D", "B + 1"]

CROSS_ATTENTION = Spec(
    "cross_attention",
    [
        Clause(
            "returns (out (B, T, C) of x's dtype, weights (B, H, T, S)) (float32 and float64)",
            _cross_shape,
            _CROSS_DTYPED,
            key="cross.shape",
            budget="handful",
            examples=[(CONFIGS[0], (2, 3, 5), torch.float32, 0)],
        ),
        Clause(
            "queries from x, keys and values from memory, no causal mask: equals Chapter 2's attention and "
            "nn.MultiheadAttention (any B, T, S, heads, with or without biases)",
            _cross_plain,
            _CROSS_DTYPED,
            key="cross.plain",
            budget="more",
            examples=[(CONFIGS[0], (2, 4, 6), torch.float64, 1)],
            also=[("torch", 4, 6), ("torch", 5, 5), ("torch", 1, 3)],
        ),
        Clause(
            "memory_key_padding_mask (B, S), True at real source tokens: padded tokens get no attention",
            _cross_masked,
            _CROSS_CASES,
            key="cross.mask",
            budget="more",
            examples=[(CONFIGS[0], (3, 4, 6), 2)],
            also=["fixed"],
        ),
        Clause(
            "a source row with no real token gets all-zero weights, and its output is out_proj's bias",
            functools.partial(_cross_masked, kind="empty"),
            _CROSS_CASES,
            key="cross.empty",
            budget="small",
            examples=[(CONFIGS[0], (2, 3, 4), 4)],
        ),
        Clause(
            "grouped key/value heads (attn.n_kv_heads < attn.n_heads) are repeated for the query heads",
            functools.partial(_cross_masked, kind="gqa"),
            st.tuples(st.sampled_from(GQA_CONFIGS), _SIZES, st.booleans(), SEEDS),
            key="cross.gqa",
            budget="some",
            examples=[(CONFIGS[1], (2, 3, 5), True, 5)],
            also=[(CONFIGS[1], (2, 3, 5), False, 6)],
        ),
        Clause(
            "gradients reach x and memory as in Chapter 2's attention",
            _cross_gradients,
            _CROSS_CASES,
            key="cross.grad",
            budget="few",
            examples=[(CONFIGS[0], (2, 3, 4), 7)],
        ),
        Clause(
            "no dropout in eval mode; in training mode each weight is dropped with probability attn.dropout "
            "(or scaled by 1 / (1 - p)) and out is computed from the dropped weights",
            _cross_dropout,
            st.tuples(_CONFIGS, _SIZES, st.sampled_from([0.5, 0.25, 1.0]), st.booleans(), SEEDS),
            key="cross.dropout",
            budget="more",
            examples=[(CONFIGS[0], (2, 3, 4), 1.0, True, 8), (CONFIGS[0], (2, 4, 5), 0.5, False, 9)],
            also=[
                (CONFIGS[0], (2, 4, 5), p, training, 9)
                for p, training in ((0.25, True), (1.0, True), (0.5, False))
            ],
        ),
        raises(
            _cross_bad,
            st.tuples(_SIZES, st.sampled_from(_BAD_MASKS), SEEDS),
            key="cross.bad",
            budget="some",
            examples=[((2, 3, 4), "float", 10)],
            also=[((2, 3, 4), kind, 11) for kind in _BAD_MASKS],
            fix="the mask must be a boolean (B, S) tensor, True at real tokens",
            text="a memory_key_padding_mask that is not a boolean (B, S) tensor raises ValueError",
        ),
    ],
)
check_cross_attention, grade_cross_attention = CROSS_ATTENTION.graders()


# =========================================================================== part 3: PreNormDecoderLayer

_NOT_CAUSAL = "the self-attention must be causal: self.self_attn(self.norm1(x), is_causal=True)"
_NO_RESIDUAL = "a residual connection is missing: every sub-layer adds its output to the stream, "
_NO_RESIDUAL += "x = x + dropout(sublayer(norm(x)))"
#: the hints of the common wrong layers, in the order :func:`_layer_mistakes` computes them
_LAYER_HINTS = (
    "this is post-norm (x = norm(x + sublayer(x))): a pre-norm layer normalises each sub-layer's input and "
    "adds the result to the un-normalised stream, x = x + sublayer(norm(x))",
    "memory_key_padding_mask was ignored: pass it on to cross_attention",
    _NOT_CAUSAL,
    "cross-attention must take its keys and values from memory: "
    "cross_attention(self.cross_attn, self.norm2(x), memory, memory_key_padding_mask)",
    "do not normalise memory in the decoder (the encoder stack already did): only the query side, norm2(x)",
    _NO_RESIDUAL,
    _NO_RESIDUAL,
    _NO_RESIDUAL,
    "do not replace x by its normalised version: the residual adds the sub-layer's output to the "
    "un-normalised x (x = x + f(norm(x)), not x = norm(x); x = x + f(x))",
)
#: the dropouts of the layer, each checked alone: what it drops, by its name
_DROPOUTS = {
    "dropout1": "the self-attention sub-layer's output: x = x + dropout1(self_attn(norm1(x)))",
    "dropout2": "the cross-attention sub-layer's output: x = x + dropout2(c)",
    "dropout3": "the feed-forward sub-layer's output: x = x + dropout3(ff(norm3(x)))",
    "self_attn.dropout": "the self-attention weights, inside self.self_attn(...) (Chapter 2's module applies its "
    "own dropout)",
    "cross_attn.dropout": "the cross-attention weights, inside your cross_attention(self.cross_attn, ...)",
    "ff.dropout": "the feed-forward's hidden activations, inside self.ff(...)",
}
#: (C, H, d_ff, bias, activation) of the layers the checks draw
LAYERS = [
    (12, 4, 20, True, "relu"),
    (12, 4, 20, True, "gelu"),
    (8, 2, 16, False, "relu"),
    (6, 1, 10, True, "gelu"),
    (12, 6, 24, False, "gelu"),
]


def _dropout(m, which: str):
    """``(owner, attribute, its name)`` of the dropout ``which`` of the layer ``m``: an attention module's float
    ``dropout``, else an nn.Dropout's ``p`` (works through the sandbox too)."""
    path, attr = (which.split(".")[0], "dropout") if "attn" in which else (which, "p")
    for name in path.split("."):
        m = getattr(m, name)
    return m, attr, f"{path}.{attr}"


def _layer_triple(g: Grader, PreNormDecoderLayer, name: str, config=None, dropout=0.0, with_torch=False):
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
        "the layer's parameters must be those of Chapter 4's DecoderLayer (keep the given __init__); "
        f"missing {sorted(expected - got)[:4]}, unexpected {sorted(got - expected)[:4]}",
    )
    m.load_state_dict(weights)
    m.eval()
    if not with_torch:
        return m, r, None
    t = nn.TransformerDecoderLayer(Cc, Hh, dff, 0.0, activation, batch_first=True, norm_first=True, bias=bias)
    t.double().eval()
    t.load_state_dict(L.to_torch_state_dict(weights))
    return m, r, t


def _torch_layer(t, x, memory, keep=None):
    mask = None if keep is None else ~keep
    return t(x, memory, tgt_mask=~causal_mask(x.shape[1]), tgt_is_causal=True, memory_key_padding_mask=mask)


def _layer_mistakes(r, x, memory, keep):
    """Outputs of the common wrong layers, computed with the reference layer's submodules, with their hints."""

    def layer(self_causal=True, kv=None, mask=keep, res=(True, True, True), stream=False):
        h = r.norm1(x) if stream else x
        a = r.self_attn(r.norm1(x) if not stream else h, is_causal=self_causal)[0]
        h = h + a if res[0] else a
        n = r.norm2(h)
        h2 = n if stream else h
        kv = n if kv == "x" else (r.norm2(memory) if kv == "normed" else memory)
        c = r.cross_attn(n, kv=kv, key_padding_mask=mask)[0]
        h = h2 + c if res[1] else c
        n3 = r.norm3(h)
        h3 = n3 if stream else h
        f = r.ff(n3)
        return h3 + f if res[2] else f

    T, S = x.shape[1], memory.shape[1]
    with torch.no_grad():
        Cc, Hh, dff = r.self_attn.d_model, r.self_attn.n_heads, r.ff.linear1.out_features
        act = "relu" if isinstance(r.ff.act, nn.ReLU) else "gelu"
        post = L.DecoderLayer(Cc, Hh, dff, 0.0, act, norm_first=False, bias=r.ff.linear1.bias is not None)
        post.double().eval()
        post.load_state_dict(r.state_dict())
        wrong = [
            post(x, memory, memory_key_padding_mask=keep),
            None if keep is None else layer(mask=None),
            layer(self_causal=False),
            layer(kv="x", mask=None if T != S else keep) if T == S or keep is None else None,
            layer(kv="normed"),
            layer(res=(False, True, True)),
            layer(res=(True, False, True)),
            layer(res=(True, True, False)),
            layer(stream=True),
        ]
    return list(zip(wrong, _LAYER_HINTS))


def _layer_where(config, B, T, S, keep=None, dtype=torch.float64, extra="") -> str:
    Cc, Hh, dff, bias, act = config
    inputs = _inputs_text(B, T, S, Cc, keep, dtype)
    return f"PreNormDecoderLayer({Cc}, {Hh}, {dff}, activation={act!r}, bias={bias}{extra})({inputs}"


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
            "cross-attention weights, and take the cross-attention's keys and values from memory: "
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


def _layer_case(g: Grader, cls, name: str, config, sizes, keep=None, seed=0, torch_reference=False) -> None:
    (B, T, S), M = sizes, config[0]
    m, r, t = _layer_triple(g, cls, name, config, with_torch=torch_reference)
    x, memory = _pair_inputs(M, B, T, S, seed)
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
        g.fail(
            f"{where}: the second returned value should be the cross-attention weights (B, H, T, S) that "
            "cross_attention returns, not the self-attention's"
        )
    g.expect(
        close(w, expected_w, magnitude=magnitude(x, memory)),
        f"{where}: the weights differ from those of cross_attention(self.cross_attn, self.norm2(x), memory, "
        "memory_key_padding_mask), computed after the self-attention sub-layer",
    )


def _dec_shape(g: Grader, cls, case) -> None:
    config, (B, T, S), dtype, seed = case
    m, _, _ = _layer_triple(g, cls, f"dec.shape.{seed}", config)
    m.to(dtype)
    x, memory = _pair_inputs(config[0], B, T, S, seed, dtype)
    _layer_call(g, _layer_where(config, B, T, S, None, dtype), m, x, memory, None, config[1])


def _dec_values(g: Grader, cls, case, masked: bool = False) -> None:
    """``(config, sizes, seed)``, with a drawn padding mask when ``masked``; or against torch's own layer:
    ``("torch", config, (T, S))``, or ``"torch"`` (a fixed mask)."""
    if case == "torch":
        keep = ref_padding([6, 3, 1], 6)
        return _layer_case(g, cls, "dec.mask.torch", LAYERS[0], (3, 4, 6), keep, seed=4, torch_reference=True)
    if case[0] == "torch":
        _, config, (T, S) = case
        return _layer_case(g, cls, f"dec.torch.{config[4]}", config, (2, T, S), seed=2, torch_reference=True)
    config, (B, T, S), seed = case
    keep = _keep_mask(seed, B, S) if masked else None
    _layer_case(g, cls, f"dec.{'mask' if masked else 'values'}.{seed}", config, (B, T, S), keep, seed=seed)


def _dec_causal(g: Grader, cls, case) -> None:
    config, (B, T, S), cut, seed = case
    T = T + 1
    cut = 1 + cut % (T - 1)
    m, _, _ = _layer_triple(g, cls, f"dec.future.{seed}", config)
    x, memory = _pair_inputs(config[0], B, T, S, seed)
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


def _dec_dropout(g: Grader, cls, case) -> None:
    which, config, (B, T, S), seed = case
    m, r, _ = _layer_triple(g, cls, f"dec.dropout.{seed}", config)
    set_attr(*_dropout(m, which)[:2], 1.0)
    setattr(*_dropout(r, which)[:2], 1.0)
    m.train()
    r.train()
    x, memory = _pair_inputs(config[0], B, T, S, seed)
    keep = _keep_mask(seed, B, S)
    where = _layer_where(config, B, T, S, keep, extra=f", {which}=1.0, training mode")
    out, w = _layer_call(g, where, m, x, memory, keep, config[1])
    expected, expected_w = r(x, memory, keep)
    g.expect(
        close(out, expected, magnitude=magnitude(x, memory)) and close(w, expected_w),
        f"{where}: with only {which} at p = 1 the output differs from the reference, which drops {_DROPOUTS[which]} "
        "and nothing else: apply each dropout exactly where the text puts it, once",
    )


def _dec_eval(g: Grader, cls, case) -> None:
    config, (B, T, S), everything, seed = case
    m, r, _ = _layer_triple(g, cls, f"dec.eval.{seed}", config, dropout=0.5)
    if everything:
        for which in _DROPOUTS:
            set_attr(*_dropout(m, which)[:2], 1.0)
    x, memory = _pair_inputs(config[0], B, T, S, seed)
    extra = f", every dropout at {'1.0' if everything else '0.5'}, eval mode"
    where = _layer_where(config, B, T, S, None, extra=extra)
    out, _ = _layer_call(g, where, m, x, memory, None, config[1])
    g.expect(
        close(out, r(x, memory)[0]),
        f"{where}: the output differs from the reference: dropout applies only in training mode (use the "
        "nn.Dropout modules self.dropout1/2/3, not F.dropout without training=self.training)",
    )


def _dec_gradients(g: Grader, cls, case) -> None:
    config, (B, T, S), seed = case
    m, r, t = _layer_triple(g, cls, f"dec.grad.{seed}", config, with_torch=True)
    x, memory = _pair_inputs(config[0], B, T, S, seed)
    keep, up = _keep_mask(seed, B, S), tensor(seed + 2, B, T, config[0])
    where = _layer_where(config, B, T, S, keep)
    xs, ms = x.clone().requires_grad_(), memory.clone().requires_grad_()
    p = call_student(g, where, probe, m, xs, ms, keep, backward=(0, up))
    xr, mr = x.clone().requires_grad_(), memory.clone().requires_grad_()
    (_torch_layer(t, xr, mr, keep) * up).sum().backward()
    for label, got, want in zip(("x", "memory"), (p.grads or [None, None])[:2], (xr.grad, mr.grad)):
        g.expect(
            got is not None and close(got, want, magnitude=magnitude(x, memory, up)),
            f"{where}: the gradient with respect to {label} differs from the reference",
        )


def _dec_defaults(g: Grader, cls, case) -> None:
    d, h = case
    m, r = cls(d, h), ref.PreNormDecoderLayer(d, h)
    sd, rd = m.state_dict(), r.state_dict()
    shapes = {k: tuple(v.shape) for k, v in sd.items()} if isinstance(sd, dict) else {}
    g.expect(
        shapes == {k: tuple(v.shape) for k, v in rd.items()},
        f"PreNormDecoderLayer({d}, {h}) should have the parameters of DecoderLayer({d}, {h}, norm_first=True) "
        f"(d_ff = {4 * d}, with biases): keep the given __init__ and its defaults",
    )
    for owner, attr, name in map(functools.partial(_dropout, m), _DROPOUTS):
        got = getattr(owner, attr)
        g.expect(
            got == 0.1,
            f"PreNormDecoderLayer({d}, {h}).{name} is {got!r}: the default dropout is 0.1 "
            "(keep the given __init__)",
        )
    g.expect(
        m.norm1.eps == 1e-5 and m.norm3.eps == 1e-5,
        f"PreNormDecoderLayer({d}, {h}).norm1.eps is {m.norm1.eps!r}: the default eps is 1e-5 (keep the given "
        "__init__)",
    )
    x, memory = rand("dec.defaults.x", 1, 3, d), rand("dec.defaults.m", 1, 2, d)
    m.double()
    m.load_state_dict({k: v.double() for k, v in rd.items()})
    m.eval()
    r.double().eval()
    where = f"PreNormDecoderLayer({d}, {h})(x (1, 3, {d}), memory (1, 2, {d}))"
    out, _ = _layer_call(g, where, m, x, memory, None, h)
    g.expect(
        close(out, r(x, memory)[0]),
        f"PreNormDecoderLayer({d}, {h}) differs from the reference with the same weights: the default "
        "activation is relu (keep the given __init__)",
    )


_LAYER_CASES = st.tuples(st.sampled_from(LAYERS), _SIZES, SEEDS)

PRE_NORM_DECODER_LAYER = Spec(
    "PreNormDecoderLayer",
    [
        Clause(
            "returns (out of x's shape and dtype, cross-attention weights (B, H, T, S)) (float32 and float64)",
            _dec_shape,
            st.tuples(st.sampled_from(LAYERS), _SIZES, _DTYPES, SEEDS),
            key="dec.shape",
            budget="few",
            examples=[(LAYERS[0], (2, 3, 4), torch.float32, 0)],
        ),
        Clause(
            "equals nn.TransformerDecoderLayer(norm_first=True) with a causal mask (relu and gelu, with and "
            "without biases, any B, T, S)",
            _dec_values,
            _LAYER_CASES,
            key="dec.values",
            budget="some",
            examples=[(LAYERS[0], (2, 5, 7), 1)],
            also=[("torch", LAYERS[0], (5, 7)), ("torch", LAYERS[1], (4, 4)), ("torch", LAYERS[2], (3, 2))],
        ),
        Clause(
            "memory_key_padding_mask reaches cross-attention, and the weights returned are cross-attention's",
            functools.partial(_dec_values, masked=True),
            _LAYER_CASES,
            key="dec.mask",
            budget="small",
            examples=[(LAYERS[0], (3, 4, 6), 3)],
            also=["torch"],
        ),
        Clause(
            "the self-attention is causal: changing later targets does not change earlier outputs",
            _dec_causal,
            st.tuples(st.sampled_from(LAYERS), _SIZES, st.integers(0, 4), SEEDS),
            key="dec.future",
            budget="small",
            examples=[(LAYERS[0], (2, 5, 5), 3, 5)],
        ),
        Clause(
            "each dropout alone, with probability 1 in training mode, drops what the text says: dropout1, "
            "dropout2, dropout3 (the sub-layers' outputs), self_attn's and cross_attn's weights, ff's hidden "
            "units",
            _dec_dropout,
            # the layers with biases (LAYERS 0, 1 and 3): a sub-layer of zeros still outputs something
            st.tuples(
                st.sampled_from(sorted(_DROPOUTS)), st.sampled_from(LAYERS[:2] + LAYERS[3:4]), _SIZES, SEEDS
            ),
            key="dec.dropout",
            budget="small",
            examples=[("dropout1", LAYERS[0], (2, 3, 4), 6), ("dropout2", LAYERS[0], (2, 3, 4), 7)],
            also=[(which, LAYERS[0], (2, 3, 4), 7) for which in _DROPOUTS],
        ),
        Clause(
            "no dropout in eval mode (dropout=0.5, and every dropout at p = 1)",
            _dec_eval,
            st.tuples(st.sampled_from(LAYERS), _SIZES, st.booleans(), SEEDS),
            key="dec.eval",
            budget="few",
            examples=[(LAYERS[0], (2, 3, 4), True, 8)],
        ),
        Clause(
            "gradients reach x and memory as in nn.TransformerDecoderLayer",
            _dec_gradients,
            _LAYER_CASES,
            key="dec.grad",
            budget="tiny",
            examples=[(LAYERS[1], (2, 4, 5), 9)],
        ),
        Clause(
            "keeps the given __init__: DecoderLayer's parameters and defaults (d_ff = 4 C, dropout 0.1, relu, "
            "eps 1e-5, biases)",
            _dec_defaults,
            examples=[(8, 2)],
        ),
    ],
)
check_pre_norm_decoder_layer, grade_pre_norm_decoder_layer = PRE_NORM_DECODER_LAYER.graders(
    "pre_norm_decoder_layer"
)


# =========================================================================== part 4: label_smoothed_loss

_PADDING_COUNTED = "padding positions are scored: a target equal to pad_id must count neither in the sum "
_PADDING_COUNTED += "nor in the number of positions the mean divides by"
#: the hints of the common wrong losses, in the order :func:`_loss_mistakes` computes them
_LOSS_HINTS = (
    "smoothing was not applied: the loss is (1 - smoothing) * (-log p_y) + smoothing * mean_v(-log p_v)",
    "the smoothing mass went to the V - 1 wrong classes only: spread it uniformly over all V classes, the right "
    "one included (the convention of Szegedy et al. and of F.cross_entropy(label_smoothing=...)), i.e. "
    "smoothing * mean over all V of -log p_v",
    "the weights are swapped: (1 - smoothing) on -log p of the right token, smoothing on the uniform part",
    _PADDING_COUNTED,
    "the mean divides by every position, padding included: divide by the number of non-padding targets",
    "the loss is summed over positions: return the mean over the non-padding targets",
    "the uniform part sums -log p_v over the V classes: take the mean over the classes (divide by V)",
    "the pad_id argument was not used (padding 0 was skipped instead): ignore the targets equal to pad_id",
    "the smoothing argument was not used (0.1 was)",
)


def _smoothed_ref(logits, targets, eps, pad_id=PAD):
    """F.cross_entropy with label smoothing ``eps`` over every position whose target is not ``pad_id``."""
    flat = logits.reshape(-1, logits.shape[-1])  # (N, V)
    return F.cross_entropy(flat, targets.reshape(-1), ignore_index=pad_id, label_smoothing=eps)


def _loss_mistakes(logits, targets, eps, pad_id=PAD):
    """The losses of the common wrong formulas (in float64, cast to the logits' dtype), with their hints."""
    V, dtype = logits.shape[-1], logits.dtype
    lp = F.log_softmax(logits.double().reshape(-1, V), -1)  # (N, V)
    t = targets.reshape(-1)
    keep = t != pad_id
    nll = -lp.gather(-1, t.clamp(0, V - 1)[:, None]).squeeze(-1)  # (N,)
    uniform = -lp.mean(-1)
    others = (-lp.sum(-1) - nll) / max(V - 1, 1)
    per = (1 - eps) * nll + eps * uniform
    wrong = [
        nll[keep].mean(),
        ((1 - eps) * nll + eps * others)[keep].mean(),
        (eps * nll + (1 - eps) * uniform)[keep].mean(),
        per.mean(),
        per[keep].sum() / t.numel(),
        per[keep].sum(),
        ((1 - eps) * nll - eps * lp.sum(-1))[keep].mean(),
        per[t != PAD].mean() if pad_id != PAD else None,
        (0.9 * nll + 0.1 * uniform)[keep].mean() if eps != 0.1 else None,
    ]
    return [(None if w is None else w.to(dtype), hint) for w, hint in zip(wrong, _LOSS_HINTS)]


def _ls_where(logits, targets, eps, pad_id, extra="") -> str:
    shown = targets.tolist() if targets.numel() <= 12 else tuple(targets.shape)
    args = "" if eps is None else f", smoothing={eps}"
    args += "" if pad_id is None else f", pad_id={pad_id}"
    return f"label_smoothed_loss(logits {tuple(logits.shape)} {dtype_name(logits.dtype)}, targets {shown}{args}){extra}"


def _ls_value(g: Grader, fn, logits, targets, eps=None, pad_id=None, positional=False, extra="") -> None:
    """Call the student's loss (smoothing and pad_id by default, by keyword or positionally) and compare."""
    where = _ls_where(logits, targets, eps, pad_id, extra)
    e, p = (0.1 if eps is None else eps), (PAD if pad_id is None else pad_id)
    given = {k: v for k, v in (("smoothing", eps), ("pad_id", pad_id)) if v is not None}
    args, kwargs = ((logits, targets, e, p), {}) if positional else ((logits, targets), given)
    out = call_student(g, where, fn, *args, **kwargs)
    expected = _smoothed_ref(logits.double(), targets, e, p).to(logits.dtype)
    g.expect(
        is_tensor(out) and out.dim() == 0 and out.dtype == logits.dtype,
        f"{where}: the loss should be a scalar (0-dimensional) tensor of the logits' dtype "
        f"{dtype_name(logits.dtype)}, got {describe(out)}",
    )
    if not bool(torch.isfinite(out)):
        g.fail(
            f"{where}: got {_num(out)}; the loss is inf or NaN for large logits: log(softmax(x)) underflows to "
            "log(0); use F.log_softmax, which subtracts the maximum first"
        )
    mistakes = _loss_mistakes(logits, targets, e, p)
    if eps is None:
        zero = _smoothed_ref(logits.double(), targets, 0.0, p).to(logits.dtype)
        default = (
            "without a smoothing argument the loss must use the default smoothing=0.1 (the signature's default), "
            "not 0"
        )
        mistakes.insert(0, (zero, default))
    first_match(g, out, [(m, f"{where}: {h}") for m, h in mistakes], expected)
    g.expect(
        close(out, expected, magnitude=magnitude(logits)),
        f"{where}: expected {float(expected):.6g} (F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), "
        f"ignore_index={p}, label_smoothing={e})), got {_num(out)}",
    )


def _ls_case(seed: int, lead: tuple, V: int, pad_id: int, rate: float, dtype=torch.float64, scale=2.0):
    """Logits ``(*lead, V)`` and targets ``lead`` in ``[0, V)`` but ``pad_id``, about ``rate`` of them set to
    ``pad_id`` (the first one never)."""
    logits = tensor(seed, *lead, V, dtype=dtype, scale=scale)
    targets = torch.randint(0, V, lead, generator=_gen(seed, 7))
    targets = torch.where(targets == pad_id, (targets + 1) % V, targets)
    drop = torch.rand(lead, generator=_gen(seed, 9)) < rate
    drop.view(-1)[0] = False
    return logits, targets.masked_fill(drop, pad_id)


def _ls_kind(case) -> Call:
    lead, V, dtype, seed = case
    logits, targets = _ls_case(seed, lead, V, PAD, 0.3, dtype)
    return Call(_ls_where(logits, targets, None, None), (logits, targets))


def _ls_values(g: Grader, fn, case) -> None:
    """``(lead, V, eps, dtype, positional, seed)``, or ``(lead, V, seed)`` (the default smoothing by keyword, float64),
    or "uniform"."""
    if case == "uniform":  # closed form: uniform logits give log V whatever the smoothing
        targets = torch.randint(1, 6, (2, 5), generator=_gen(2, 0))
        targets[1, 3:] = PAD
        return _ls_value(g, fn, torch.zeros(2, 5, 6, dtype=torch.float64), targets, 0.2)
    lead, V, *rest, seed = case
    eps, dtype, positional = rest or (0.1, torch.float64, False)
    logits, targets = _ls_case(seed, lead, V, PAD, 0.3, dtype)
    _ls_value(g, fn, logits, targets, eps, None, positional and eps is not None)


def _ls_padding(g: Grader, fn, case) -> None:
    lead, V, which, rate, positional, seed = case
    pad_id = {"default": None, "zero": 0, "three": 3 % V, "last": V - 1}[which]
    logits, targets = _ls_case(seed, lead, V, PAD if pad_id is None else pad_id, rate)
    _ls_value(g, fn, logits, targets, None if positional else 0.1, pad_id, positional and pad_id is not None)


def _ls_stable(g: Grader, fn, case) -> None:
    lead, V, scale, eps, seed = case
    logits, targets = _ls_case(seed, lead, V, PAD, 0.3, torch.float32, scale)
    _ls_value(g, fn, logits, targets, eps, extra=f" (logits of scale {scale:g})")


def _ls_gradients(g: Grader, fn, case) -> None:
    lead, V, eps, seed = case
    logits, targets = _ls_case(seed, lead, V, PAD, 0.4)
    where = _ls_where(logits, targets, eps, None)
    one = torch.tensor(1.0, dtype=torch.float64)
    p = call_student(g, where, probe, fn, logits.clone().requires_grad_(), targets, eps, backward=(None, one))
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
        close(grad, lr.grad), f"{where}: the gradient with respect to the logits differs from the reference"
    )


def _ls_untouched(case) -> Call:
    lead, V, pad_id, seed = case
    pad_id = min(pad_id, V - 1)
    logits, targets = _ls_case(seed, lead, V, pad_id, 0.4)
    return Call(_ls_where(logits, targets, 0.1, pad_id), (logits, targets, 0.1, pad_id))


def _ls_bad(case) -> Call:
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
    what = f"logits {tuple(logits.shape)} and targets {tuple(bad.shape)}"
    if which == "padding":
        what = f"every target equal to pad_id (logits {tuple(logits.shape)})"
    return Call(what, (logits, bad, 0.1))


_LEAD = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
_SMOOTHING = st.sampled_from([None, 0.0, 0.3, 0.75, 1.0, 0.1])
_PAD_IDS = st.sampled_from(["default", "zero", "three", "last"])  # pad_id None (left out), 0, 3 % V, V - 1
_LARGE = st.sampled_from([100.0, 1e3, 1e4])  # the scale of float32 logits
_LS_ERRORS = ["longer", "flat", "with V", "padding"]

LABEL_SMOOTHED_LOSS = Spec(
    "label_smoothed_loss",
    [
        returns(
            _ls_kind,
            lambda case: torch.empty((), dtype=case[2]),
            st.tuples(_LEAD, st.integers(2, 9), _DTYPES, SEEDS),
            key="ls.dtype",
            budget="handful",
            examples=[((2, 3), 7, torch.float32, 0)],
            text="returns a scalar tensor of the logits' dtype (float32 and float64)",
        ),
        Clause(
            "equals (1 - smoothing) * (-log p_y) + smoothing * mean_v(-log p_v), averaged over the non-padding "
            "targets, for any smoothing in [0, 1] (0.1 by default)",
            _ls_values,
            st.tuples(_LEAD, st.integers(2, 11), _SMOOTHING, _DTYPES, st.booleans(), SEEDS),
            key="ls.values",
            budget="wide",
            examples=[
                ((2, 3), 5, 0.3, torch.float64, False, 1),
                ((2, 3), 4, None, torch.float32, False, 1),
                "uniform",
            ],
            also=["uniform"],
        ),
        Clause(
            "targets equal to pad_id (0 by default, or any other id) count neither in the sum nor in the mean",
            _ls_padding,
            st.tuples(_LEAD, st.integers(2, 9), _PAD_IDS, st.sampled_from([0.3, 0.7]), st.booleans(), SEEDS),
            key="ls.pad",
            budget="plenty",
            examples=[((2, 4), 5, "three", 0.3, False, 2)],
        ),
        Clause(
            "any leading shape: (N, V) with (N,), (B, T, V) with (B, T), (B, T, U, V) with (B, T, U)",
            _ls_values,
            st.tuples(_LEAD, st.integers(2, 8), SEEDS),
            key="ls.shapes",
            budget="some",
            examples=[((7,), 5, 3)],
            also=[((1,), 5, 4), ((3, 2, 2), 5, 4)],
        ),
        Clause(
            "stable: float32 logits of magnitude 100 to 10^4 give a finite, accurate loss",
            _ls_stable,
            st.tuples(_LEAD, st.integers(2, 9), _LARGE, st.sampled_from([0.0, 0.1, 0.5]), SEEDS),
            key="ls.stable",
            budget="some",
            examples=[((1, 3), 4, 1e3, 0.1, 5)],
        ),
        Clause(
            "differentiable: the gradient is F.cross_entropy's, and padded positions get none",
            _ls_gradients,
            st.tuples(_LEAD, st.integers(2, 8), st.sampled_from([0.0, 0.1, 0.6]), SEEDS),
            key="ls.grad",
            budget="small",
            examples=[((2, 4), 6, 0.1, 6)],
        ),
        unchanged(
            _ls_untouched,
            st.tuples(_LEAD, st.integers(2, 8), st.sampled_from([PAD, 1, 4]), SEEDS),
            key="ls.inplace",
            budget="few",
            examples=[((2, 3), 5, 2, 7)],
            text="leaves logits and targets unchanged",
            advice="a loss that changed its inputs in place corrupts the caller's batch: compute new tensors (no "
            "masked_fill_ or item assignment on logits or targets)",
        ),
        raises(
            _ls_bad,
            st.tuples(_LEAD, st.integers(2, 8), st.sampled_from(_LS_ERRORS), SEEDS),
            key="ls.errors",
            budget="some",
            examples=[((2, 3), 5, "padding", 8), ((2, 3), 5, "longer", 9)],
            also=[((2, 3), 5, kind, 9) for kind in _LS_ERRORS],
            fix="targets must have the shape logits.shape[:-1], and some target must not be pad_id: with only "
            "padding there is nothing to average (a mean over nothing is NaN)",
            text="raises ValueError for targets not of shape logits.shape[:-1], and when every target is padding",
        ),
    ],
)
check_label_smoothed_loss, grade_label_smoothed_loss = LABEL_SMOOTHED_LOSS.graders()


# --------------------------------------------------------------------------- predict, then check


def _weights() -> dict[str, torch.Tensor]:
    """The committed checkpoint's state dict, loaded here (the grader's side: the sandbox has no checkpoints)."""
    from coursekit import checkpoints

    return checkpoints.load("seq2seq-numbers")[0].state_dict()


def _nearest(choices: dict[str, str], measured: float) -> str:
    """The letter of the choice nearest to ``measured`` (a choice's number is its first word)."""
    return min(choices, key=lambda c: abs(float(choices[c].split()[0]) - measured))


_FLOOR_CHOICES = {"a": "0", "b": "0.10", "c": "0.66", "d": "3.56 (ln 35)"}


SMOOTHING_FLOOR = Prediction(
    name="predict_smoothing_floor",
    question="The chapter's model was trained with label smoothing 0.1 over V = 35 German tokens until its "
    "label-smoothed loss reached the floor H(q), and it translates every test number right. Its plain cross-entropy "
    "(smoothing 0: the mean -log p of the right token) on held-out numbers is about?",
    tests="what a model at the label-smoothing floor predicts: p = q, so 1 - eps + eps/V on the right token, not 1",
    measure=lambda: _nearest(
        _FLOOR_CHOICES, number_words.heldout_loss(_weights(), 256, torch.Generator().manual_seed(0), 0.0)
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
_BLEU_CHOICES = {"a": "0", "b": "12.5", "c": "36", "d": "78"}


def _bleu_one_word() -> str:
    """Score BLEU_ONE_WORD's corpus with the chapter's BLEU and return the nearest choice."""
    english = number_words.english
    refs = [english(n) for n in BLEU_ONE_WORD_NUMBERS] + [english(BLEU_LONG_NUMBER)]
    hyps = [english(n + 1) for n in BLEU_ONE_WORD_NUMBERS] + [english(BLEU_LONG_NUMBER)]
    return _nearest(_BLEU_CHOICES, ref.bleu(hyps, refs))


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
    choices=_BLEU_CHOICES,
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
        weights = _weights()
        model.load_state_dict(weights)
        model.eval()
        src, tgt = make_batch(number_splits().test[::10])  # (500, S), (500, T)
        with torch.no_grad():
            _FULL_TEST["logits"] = model(src, ref.shift_right(tgt, ref.BOS, ref.PAD))  # (500, T, V)
        _FULL_TEST["targets"], _FULL_TEST["weights"] = tgt, weights
    return ref.label_smoothed_loss(_FULL_TEST["logits"], _FULL_TEST["targets"], smoothing).item()


def _heldout_call(n, seed: int, smoothing: float | None = None) -> Call:
    """``heldout_loss(weights, n, generator seeded seed[, smoothing])`` with the committed weights (the generator
    made in the student's process)."""
    _full_test_loss(0.1)  # loads the weights once
    where = f"heldout_loss(weights, {n}, generator{'' if smoothing is None else f', smoothing={smoothing}'})"
    generator = student_side("torch", torch).Generator().manual_seed(seed)
    return Call(where, (_FULL_TEST["weights"], n, generator) + (() if smoothing is None else (smoothing,)))


def _heldout(g: Grader, heldout_loss, n: int, seed: int, smoothing: float | None = None):
    c = _heldout_call(n, seed, smoothing)
    return c.where, call_student(g, c.where, heldout_loss, *c.args)


_HELDOUT_WHY = (
    "load the weights into Seq2Seq(SEQ2SEQ_PRESETS['small']) in eval mode, feed the decoder shift_right(tgt, BOS, PAD) "
    "(not the targets themselves), score the logits against tgt with "
    "your label_smoothed_loss at the given smoothing (part 4 must pass first), and draw from number_splits().test"
)


def _heldout_interval(smoothing: float | None) -> tuple[float, float]:
    truth = _full_test_loss(0.1 if smoothing is None else smoothing)
    return truth * (1 - HELDOUT_BAND), truth * (1 + HELDOUT_BAND)


def _heldout_value(g: Grader, heldout_loss, case) -> None:
    """``(n, seed)``: a Python float; ``(n, seed, smoothing)``: within the band."""
    where, v = _heldout(g, heldout_loss, *case)
    if len(case) == 2:
        return g.expect(
            type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}"
        )
    expect_in_band(g, where, v, *_heldout_interval(case[2]), _HELDOUT_WHY)


def _heldout_seeded(g: Grader, heldout_loss, case) -> None:
    n, seed, other = case
    (_, a), (_, b), (_, c) = (_heldout(g, heldout_loss, n, s) for s in (seed, seed, other))
    g.expect(
        a == b and a != c,
        f"two generators seeded alike gave {a!r} and {b!r}, and another seed gave {c!r}: draw the numbers with "
        "torch.randint(..., generator=generator), not from torch's global random state",
    )


def _heldout_bad(case) -> Call:
    n, smoothing = case
    return Call(f"n={n}, smoothing={smoothing}", _heldout_call(n, 0, smoothing).args)


def _heldout_reordered(case, backwards: bool) -> Call:
    c = _heldout_call(*case)
    if not backwards:
        return c
    weights = dict(reversed(list(c.args[0].items())))
    return Call(
        c.where.replace("weights", "weights with its items in reversed order", 1), (weights, *c.args[1:])
    )


def _heldout_stated(case) -> float:
    """The stated procedure, run by coursekit on a generator seeded alike."""
    n, seed, smoothing = case
    _full_test_loss(0.1)
    return number_words.heldout_loss(_FULL_TEST["weights"], n, torch.Generator().manual_seed(seed), smoothing)


HELDOUT_LOSS = Spec(
    "heldout_loss",
    [
        Clause(
            "returns a Python float, for n = 1 as for more numbers",
            _heldout_value,
            examples=[(32, 3)],
            also=[(1, 3)],
        ),
        Clause(
            f"smoothing 0.1 by default: within {HELDOUT_BAND:.0%} of the reference's loss on the test split",
            _heldout_value,
            examples=[(64, 11, None)],
            also=[(100, 12, None)],
        ),
        Clause(
            f"at smoothing 0, 0.3 and 1: within {HELDOUT_BAND:.0%} of the reference's loss on the test split",
            _heldout_value,
            examples=[(48, 21, 0.0)],
            also=[(48, 22, 0.3), (48, 23, 1.0)],
        ),
        Clause(
            "draws from its generator: the same seed gives the same result, another seed another",
            _heldout_seeded,
            examples=[(16, 31, 32)],
        ),
        raises(
            _heldout_bad,
            examples=[(0, 0.1)],
            also=[(-1, 0.1), (True, 0.1), (8, 1.5), (8, -0.1)],
            fix="say which argument is out of range",
            text="raises ValueError for an n that is not a positive integer (0, -1, True) or a smoothing outside "
            "[0, 1]",
        ),
        order_free(
            _heldout_reordered,
            text="loads weights by name: the order of the state dict's items does not change the result",
            examples=[(16, 33)],
        ),
        procedure(
            lambda case: _heldout_call(*case),
            _heldout_stated,
            text="computes exactly the stated procedure: n indices from torch.randint(len(test), (n,), "
            "generator=generator), the teacher-forced loss of those test numbers",
            steps="draw the indices with torch.randint(len(test), (n,), generator=generator) (uniformly, with "
            "replacement; not randperm, not the global generator), take those numbers of number_splits().test, "
            "build them with make_batch, feed the decoder shift_right(tgt, BOS, PAD) and score the logits with "
            "your label_smoothed_loss at the given smoothing",
            examples=[(16, 41, 0.0)],
            inputs=st.tuples(
                st.integers(1, 64), st.integers(100, 2**31 - 1), st.sampled_from([0.0, 0.1, 0.3, 1.0])
            ),
            key="heldout.procedure",
            band=lambda case: _heldout_interval(case[2]),
            rel=1e-5,
        ),
    ],
)
check_heldout_loss, grade_heldout_loss = HELDOUT_LOSS.graders()


# =========================================================================== stretch: the length penalty

#: the hints of the common wrong scores, in the order :func:`_lp_mistakes` computes them
_LP_HINTS = (
    "Wu et al.'s penalty is ((5 + n) / 6) ** alpha, not n ** alpha (the chapter's beam_search rule): the 5 "
    "softens the penalty of short hypotheses and the 6 makes lp(1) = 1",
    "raise the penalty to the power alpha: lp(n) = ((5 + n) / 6) ** alpha (alpha = 0 gives lp = 1)",
    "divide the log-probability by the penalty (logprob / lp(n)), do not multiply",
    "(5 + n) // 6 is integer division: convert the lengths to logprob's dtype and divide with /, "
    "so lp(2) = 7/6",
    "mind the brackets: ((5 + n) / 6) ** alpha, not (5 + n) / 6 ** alpha",
    "compute the penalty in logprob's dtype (length.to(logprob.dtype)): a float32 penalty rounds "
    "float64 scores",
)


def _lp_mistakes(logprob: torch.Tensor, length: torch.Tensor, alpha: float):
    n = length.to(logprob.dtype)
    floor = torch.div(5 + length, 6, rounding_mode="floor").to(logprob.dtype)
    wrong = [
        logprob / n**alpha,
        logprob / ((5 + n) / 6),
        logprob * ((5 + n) / 6) ** alpha,
        logprob / (floor**alpha),
        logprob / ((5 + n) / 6**alpha),
        logprob / ((5 + length.float()) / 6) ** alpha,
    ]
    return list(zip(wrong, _LP_HINTS))


def _lp_call(logprob: torch.Tensor, length: torch.Tensor, alpha) -> Call:
    """The call ``length_penalty_score(logprob, length, alpha)``, its tensors shown by value when small."""
    show = lambda t: str(t.tolist()) if t.numel() <= 6 else f"{dtype_name(t.dtype)} {tuple(t.shape)}"
    where = f"length_penalty_score({show(logprob)} {dtype_name(logprob.dtype)}, lengths {show(length)}, {alpha!r})"
    return Call(where, (logprob, length, alpha))


def _lp_case(g: Grader, fn, logprob: torch.Tensor, length: torch.Tensor, alpha: float, what="") -> None:
    where = _lp_call(logprob, length, alpha).where
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


def _lp_kind(case) -> Call:
    lead, K, dtype, broadcast, seed = case
    return _lp_call(*_lp_inputs(seed, lead, K, dtype, broadcast), 0.6)


def _lp_values(g: Grader, fn, case) -> None:
    lead, K, alpha, dtype, broadcast, seed = case
    logprob, length = _lp_inputs(seed, lead, K, dtype, broadcast)
    _lp_case(g, fn, logprob, length, alpha)


def _lp_ends(g: Grader, fn, case) -> None:
    K, alpha, seed = case
    logprob, length = _lp_inputs(seed, (), K, torch.float64, False)
    _lp_case(g, fn, logprob, length, 0.0, ": with alpha = 0, lp(n) = 1")
    _lp_case(g, fn, logprob, torch.ones_like(length), alpha, ": lp(1) = (6 / 6) ** alpha = 1")


def _lp_reranks(g: Grader, fn, alpha) -> None:
    _lp_case(g, fn, torch.tensor([-3.0, -4.0], dtype=torch.float64), torch.tensor([2, 6]), alpha)


def _lp_errors(g: Grader, fn, case) -> None:
    which, value = case
    logprob = torch.tensor([-1.0, -2.0], dtype=torch.float64)
    if which == "alpha":
        what, fix = f"alpha={value!r}", "alpha must be >= 0"
        expect_value_error(g, lambda: fn(logprob, torch.tensor([1, 2]), value), what, fix)
    elif which == "lengths":
        what, fix = f"lengths {list(value)}", "every length must be at least 1"
        expect_value_error(g, lambda: fn(logprob, torch.tensor(value), 0.6), what, fix)
    else:  # alpha = 0 and length 1: the edges the text allows
        _lp_case(g, fn, logprob, torch.tensor([1, 1]), 0.0)


def _lp_fresh(case) -> Call:
    alpha, dtype = case
    return _lp_call(*_lp_inputs(4, (2,), 3, dtype, False), alpha)


LENGTH_PENALTY_SCORE = Spec(
    "length_penalty_score",
    [
        returns(
            _lp_kind,
            lambda case: torch.empty((*case[0], case[1]), dtype=case[2]),
            st.tuples(_LP_LEAD, st.integers(1, 6), _DTYPES, st.booleans(), SEEDS),
            key="lp.shape",
            budget="small",
            examples=[((), 3, torch.float64, False, 0)],
            text="returns a tensor of the broadcast shape and logprob's dtype (float32 and float64)",
        ),
        Clause(
            "score = logprob / ((5 + n) / 6) ** alpha, for any alpha >= 0, shape and lengths",
            _lp_values,
            st.tuples(_LP_LEAD, st.integers(1, 8), _ALPHAS, _DTYPES, st.booleans(), SEEDS),
            key="lp.values",
            budget="wider",
            examples=[((2,), 4, 1.0, torch.float64, False, 1), ((3,), 2, 0.7, torch.float32, True, 1)],
        ),
        Clause(
            "alpha = 0 gives the raw log-probability, and lp(1) = 1 for every alpha",
            _lp_ends,
            st.tuples(st.integers(1, 8), _ALPHAS, SEEDS),
            key="lp.ends",
            budget="small",
            examples=[(3, 0.6, 2)],
        ),
        # the docstring's example: [-3.0, -4.0] with lengths [2, 6] and alpha 1 score [-2.571, -2.182]
        Clause(
            "re-ranks: a longer hypothesis can overtake a shorter one as alpha grows",
            _lp_reranks,
            examples=[0.0, 0.6, 1.0, 2.0],
        ),
        Clause(
            "an alpha below 0 or a length below 1 raises ValueError; alpha = 0 and length 1 are fine",
            _lp_errors,
            examples=[
                ("alpha", -0.1),
                ("alpha", -1.0),
                ("lengths", [0, 2]),
                ("lengths", [3, -1]),
                ("lengths", [0, 0]),
                ("fine", None),
            ],
        ),
        new_tensor(
            _lp_fresh,
            examples=[(0.0, torch.float64), (0.0, torch.float32), (1.0, torch.float64)],
            text="returns a new tensor, never logprob itself, at every alpha (alpha = 0 included)",
        ),
    ],
)
check_length_penalty_score, grade_length_penalty_score = LENGTH_PENALTY_SCORE.graders()
