"""Checks for Exercise 8 (cross-attention and the decoder of an encoder-decoder).

Each part has two entry points, both called from the notebook with the student's object.
``check_*`` holds the *public* checks: small, fixed examples. ``grade_*`` holds the *hidden*
checks: the student's code against independent references (Hugging Face's BART
``shift_tokens_right``, ``nn.MultiheadAttention``, ``nn.TransformerDecoderLayer``,
``F.cross_entropy(label_smoothing=...)``) and against :mod:`coursekit.seq2seq` on fresh
seeded float64 inputs, plus properties (a future target does not change earlier outputs,
padded source tokens get no attention). Before the generic "differs" hint, each check
tries the common mistakes and names the one that matches.

Modules cross no wire: under the autograder the student's code runs in a sandboxed
process, so the graders of parts 2 and 3 receive *classes* (the notebook's
``MultiHeadAttention``, the student's ``PreNormDecoderLayer``), build the modules with them
in the student's process and push weights with ``load_state_dict``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from coursekit import layers as L
from coursekit import multihead as mh
from coursekit import seq2seq as ref
from coursekit.attention import causal_mask, padding_mask, softmax
from coursekit.grading.ch07_gpt import attention_pair  # the notebook's MultiHeadAttention and ours, same weights
from coursekit.grading.core import (
    Grader,
    close,
    describe,
    expect_value_error,
    first_match,
    generator,
    is_tensor,
    probe,
    rand,
    random_weights,
    same,
)

__all__ = [
    "check_shift_right", "check_cross_attention", "check_pre_norm_decoder_layer", "check_label_smoothed_loss",
    "grade_shift_right", "grade_cross_attention", "grade_pre_norm_decoder_layer", "grade_label_smoothed_loss",
]

C, H, DFF = 12, 4, 20  # D = 3: scaling by sqrt(C) and by sqrt(D) differ; C and H as ch07's attention_pair
D = C // H
BOS, PAD = 1, 0


def _ids(name: str, *shape: int, low: int = 3, high: int = 30) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=generator(name))


# =========================================================================== part 1: shift_right

_DROPS_FIRST = ("the first label was dropped instead of the last: the decoder input is bos_id followed by "
                "labels[:, :-1] (position t holds target t - 1; the last target is never an input)")
_NO_BOS = "the decoder input must start with bos_id: torch.cat([a column of bos_id, labels[:, :-1]], dim=1)"
_ROLLED = ("torch.roll wraps the last label around to position 0: drop the last label and put bos_id at "
           "position 0 instead")
_MINUS_100 = ("a label of -100 (Hugging Face's 'not scored') is not a token id and would crash the embedding: "
              "replace it with pad_id in the decoder input")
_SHIFTED_LEFT = ("the labels were shifted left: the decoder input at position t must be target t - 1 "
                 "(shift right, with bos_id at position 0)")


def _hf_shift(labels: torch.Tensor, bos_id: int, pad_id: int) -> torch.Tensor:
    """Hugging Face BART's ``shift_tokens_right`` (coursekit's reference without transformers)."""
    try:
        from transformers.models.bart.modeling_bart import shift_tokens_right
    except ImportError:
        return ref.shift_right(labels, bos_id, pad_id)
    return shift_tokens_right(labels, pad_id, bos_id)


def _shift_mistakes(labels, bos_id, pad_id):
    B = labels.shape[0]
    bos = labels.new_full((B, 1), bos_id)
    fill = labels.new_full((B, 1), pad_id)
    clean = lambda t: t.masked_fill(t == -100, pad_id)  # noqa: E731
    return [
        (clean(torch.cat([bos, labels[:, 1:]], 1)), _DROPS_FIRST),
        (clean(torch.cat([fill, labels[:, :-1]], 1)), _NO_BOS),
        (clean(torch.roll(labels, 1, dims=1)), _ROLLED),
        (clean(torch.cat([labels[:, 1:], bos], 1)), _SHIFTED_LEFT),
        (torch.cat([bos, labels[:, :-1]], 1), _MINUS_100),
    ]


def _shift_call(g: Grader, shift_right, labels, bos_id, pad_id):
    p = probe(shift_right, labels.clone(), bos_id, pad_id)
    out = p.result
    B, T = labels.shape
    if is_tensor(out) and out.shape == (B, T + 1):
        g.fail(f"the output has T + 1 = {T + 1} columns: keep the length T, the decoder input is bos_id followed by "
               "labels[:, :-1] (drop the last label)")
    g.expect(is_tensor(out) and out.shape == (B, T) and out.dtype == torch.long,
             f"for labels {describe(labels)} expected a torch.long tensor of shape {(B, T)}, got {describe(out)}")
    if p.args and is_tensor(p.args[0]) and not torch.equal(p.args[0], labels):
        g.fail("shift_right changed labels in place: the caller still needs them as the targets; return a new tensor "
               "(torch.cat, masked_fill rather than masked_fill_)")
    return out


def grade_shift_right(shift_right) -> None:
    """Grade a student's ``shift_right(labels, bos_id, pad_id)``."""
    g = Grader("shift_right")

    with g.check("equals Hugging Face BART's shift_tokens_right on random labels"):
        for B, T, bos_id in ((3, 6, BOS), (1, 1, 7), (4, 9, 2)):
            labels = _ids(f"shift.rand.{T}", B, T)
            out = _shift_call(g, shift_right, labels, bos_id, PAD)
            expected = _hf_shift(labels, bos_id, PAD)
            first_match(g, out, _shift_mistakes(labels, bos_id, PAD), expected)
            g.expect(same(out, expected), f"for labels of shape {(B, T)} and bos_id={bos_id} the output differs from "
                                           "[bos_id, labels[:, 0], ..., labels[:, -2]] in every row")

    with g.check("bos_id and pad_id are the arguments, not fixed numbers"):
        labels = _ids("shift.args", 2, 5)
        labels[1, 3:] = 9
        out = _shift_call(g, shift_right, labels, 5, 9)
        g.expect(same(out, _hf_shift(labels, 5, 9)),
                 "with bos_id=5 and pad_id=9 the output differs from the reference: use the arguments bos_id and pad_id")

    with g.check("padding is shifted along, and a label of -100 becomes pad_id"):
        labels = _ids("shift.pad", 3, 7)
        labels[0, 5:] = PAD
        labels[1, 2:] = -100
        labels[2, 6] = -100
        out = _shift_call(g, shift_right, labels, BOS, PAD)
        expected = _hf_shift(labels, BOS, PAD)
        first_match(g, out, _shift_mistakes(labels, BOS, PAD), expected)
        g.expect(bool((out != -100).all()), _MINUS_100)
        g.expect(same(out, expected), "with padding and -100 labels the output differs from Hugging Face's shift_tokens_right")

    with g.check("1-D labels raise a ValueError"):
        expect_value_error(g, lambda: shift_right(torch.tensor([4, 5, 6]), BOS, PAD), "1-D labels",
                            "labels must be (B, T); a single sequence is labels[None]")

    g.finish()


def check_shift_right(shift_right) -> None:
    """Public checks of ``shift_right`` on one hand-made batch."""
    g = Grader("shift_right (public)")
    with g.check("[[5, 6, 7, EOS=2], [8, 2, PAD, PAD]] -> [[BOS=1, 5, 6, 7], [1, 8, 2, 0]]"):
        labels = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
        out = shift_right(labels.clone(), 1, 0)
        expected = torch.tensor([[1, 5, 6, 7], [1, 8, 2, 0]])
        g.expect(is_tensor(out) and out.shape == (2, 4) and out.dtype == torch.long,
                 f"expected a (2, 4) torch.long tensor, got {describe(out)}")
        first_match(g, out, _shift_mistakes(labels, 1, 0), expected)
        g.expect(torch.equal(out, expected), f"expected\n{expected}\ngot\n{out}")
    with g.check("-100 becomes pad_id"):
        out = shift_right(torch.tensor([[5, 6, -100, -100]]), 1, 0)
        g.expect(is_tensor(out) and out.tolist() == [[1, 5, 6, 0]], f"expected [[1, 5, 6, 0]], got {out}: " + _MINUS_100)
    g.finish()


# =========================================================================== part 2: cross_attention

_KV_FROM_X = ("the keys and values come from x: in cross-attention only the queries come from the decoder's x, the keys "
              "and values from the encoder's memory (attn.project(x, memory))")
_Q_FROM_MEMORY = ("the queries come from memory: the output must have one row per decoder position, (B, T, C); "
                  "queries from x, keys and values from memory")
_MASK_IGNORED = ("memory_key_padding_mask was ignored: padded source tokens must get no attention; broadcast it to "
                 "(B, 1, 1, S) and mask the scores")
_MASK_INVERTED = ("memory_key_padding_mask is inverted: in this course True marks a real source token (may attend) and "
                  "False padding")
_NOT_SCALED = "the scores are not scaled: divide q k^T by sqrt(D), D = attn.d_head"
_SCALED_BY_C = f"the scores are scaled by 1/sqrt(C): divide by sqrt(D), the head width D = attn.d_head = {D}, not the model width"
_NO_OUT_PROJ = "the output projection is missing: return attn.out_proj(merge_heads(out))"
_WRONG_AXIS = ("the softmax runs over the wrong axis: each query's weights must sum to 1 over the S source positions "
               "(the last axis of the (B, H, T, S) scores)")
_CAUSAL = ("cross-attention is not causal: every target position may read the whole source (mask only the padding), "
           "the causal mask belongs to the decoder's self-attention")


def _manual(r, q_src, kv_src, mask=None, scale=None, dim=-1, out_proj=True):
    """``r``'s attention from ``q_src`` to ``kv_src`` computed by hand, with a mistake's knobs."""
    q = r.project(q_src, kv_src)[0]  # (B, H, Tq, D)
    _, k, v = r.project(kv_src)  # (B, H, S, D)
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(D) if scale is None else scale)
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
        (_manual(r, x, memory, m4, scale=1 / math.sqrt(C))[0], _SCALED_BY_C),
        (_manual(r, x, memory, m4, out_proj=False)[0], _NO_OUT_PROJ),
        (_manual(r, x, memory, m4, dim=-2)[0], _WRONG_AXIS),
    ]
    if T > 1:
        causal = torch.ones(T, S, dtype=torch.bool).tril()  # (T, S), as a student would write it
        out.append((_manual(r, x, memory, causal if m4 is None else causal & m4)[0], _CAUSAL))
    if keep is not None:
        out.insert(0, (_manual(r, x, memory)[0], _MASK_IGNORED))
        out.insert(1, (_manual(r, x, memory, ~m4)[0], _MASK_INVERTED))
    if T == S:
        out.insert(0, (r(x)[0], _KV_FROM_X))
    return out


def _cross_call(g: Grader, fn, m, x, memory, keep=None):
    result = fn(m, x, memory) if keep is None else fn(m, x, memory, keep)
    B, T, S = x.shape[0], x.shape[1], memory.shape[1]
    g.expect(isinstance(result, tuple) and len(result) == 2,
             f"cross_attention should return a pair (out, weights), got {describe(result)}")
    out, w = result
    if is_tensor(out) and out.shape == (B, S, C) and S != T:
        g.fail(_Q_FROM_MEMORY)
    if is_tensor(w) and w.shape == (B, H, T, T) and S != T:
        g.fail(_KV_FROM_X)
    g.expect(is_tensor(out) and out.shape == (B, T, C) and out.dtype == x.dtype,
             f"for x {describe(x)} and memory {describe(memory)} the output should be (B, T, C) = {(B, T, C)} of x's dtype, "
             f"got {describe(out)}")
    g.expect(is_tensor(w) and w.shape == (B, H, T, S),
             f"the weights should be (B, H, T, S) = {(B, H, T, S)}, one row per query and head, got {describe(w)}")
    return out, w


def grade_cross_attention(cross_attention, MultiHeadAttention) -> None:
    """Grade a student's ``cross_attention(attn, x, memory, memory_key_padding_mask=None)``.

    ``MultiHeadAttention`` is the notebook's name for Chapter 2's class: the module is built
    with it, where the student's code runs.
    """
    g = Grader("cross_attention")

    with g.check("queries from x, keys and values from memory: equals nn.MultiheadAttention(x, memory, memory)"):
        for T, S in ((4, 6), (5, 5), (1, 3)):
            m, r = attention_pair(MultiHeadAttention, f"cross.plain.{T}.{S}")
            x, memory = rand(f"cross.plain.{T}.x", 2, T, C), rand(f"cross.plain.{S}.m", 2, S, C)
            out, w = _cross_call(g, cross_attention, m, x, memory)
            t = nn.MultiheadAttention(C, H, batch_first=True).double().eval()
            t.load_state_dict(L.to_torch_state_dict(r.state_dict()))
            t_out, t_w = t(x, memory, memory, average_attn_weights=False)
            first_match(g, out, _cross_mistakes(r, x, memory, None), t_out)
            g.expect(close(out, t_out), f"for T={T}, S={S} the output differs from nn.MultiheadAttention with the same weights")
            g.expect(close(w, t_w), f"for T={T}, S={S} the weights differ from softmax(q k^T / sqrt(D)) per head")

    with g.check("memory_key_padding_mask (True = real source token): padded tokens get no attention"):
        m, r = attention_pair(MultiHeadAttention, "cross.mask")
        x, memory = rand("cross.mask.x", 3, 4, C), rand("cross.mask.m", 3, 6, C)
        keep = padding_mask([5, 3, 2], S=6)  # every source is padded, and none is only padding
        out, w = _cross_call(g, cross_attention, m, x, memory, keep)
        expected, expected_w = r(x, kv=memory, key_padding_mask=keep, need_weights=True)
        first_match(g, out, _cross_mistakes(r, x, memory, keep), expected)
        g.expect(bool((w[~keep[:, None, None, :].expand_as(w)] == 0).all()),
                 "padded source positions got attention weight: mask their scores with -inf before the softmax")
        g.expect(close(out, expected) and close(w, expected_w), "with a memory_key_padding_mask the output or the weights "
                                                                "differ from Chapter 2's attention with key_padding_mask")

    with g.check("each query's weights sum to 1 over the real source tokens"):
        m, r = attention_pair(MultiHeadAttention, "cross.sums")
        x, memory = rand("cross.sums.x", 2, 5, C), rand("cross.sums.m", 2, 4, C)
        keep = padding_mask([4, 1], S=4)
        _, w = _cross_call(g, cross_attention, m, x, memory, keep)
        g.expect(close(w.sum(-1), torch.ones(2, H, 5, dtype=torch.float64)), _WRONG_AXIS)

    with g.check("grouped key/value heads (attn.n_kv_heads = 1) are repeated for the query heads"):
        m, r = attention_pair(MultiHeadAttention, "cross.gqa", n_kv=1)
        x, memory = rand("cross.gqa.x", 2, 3, C), rand("cross.gqa.m", 2, 5, C)
        keep = padding_mask([5, 2], S=5)
        out, w = _cross_call(g, cross_attention, m, x, memory, keep)
        expected, expected_w = r(x, kv=memory, key_padding_mask=keep, need_weights=True)
        g.expect(close(out, expected) and close(w, expected_w),
                 "with attn.n_kv_heads=1 the output differs from Chapter 2's attention: repeat the key/value heads for the "
                 "query heads with repeat_kv(k, attn.n_heads // attn.n_kv_heads)")

    with g.check("gradients reach x and memory as in Chapter 2's attention"):
        m, r = attention_pair(MultiHeadAttention, "cross.grad")
        x, memory = rand("cross.grad.x", 2, 3, C), rand("cross.grad.m", 2, 4, C)
        keep = padding_mask([4, 3], S=4)
        up = rand("cross.grad.up", 2, 3, C)
        p = probe(cross_attention, m, x.clone().requires_grad_(), memory.clone().requires_grad_(), keep, backward=(0, up))
        xr, mr = x.clone().requires_grad_(), memory.clone().requires_grad_()
        (r(xr, kv=mr, key_padding_mask=keep)[0] * up).sum().backward()
        grads = p.grads or [None, None, None, None]
        g.expect(grads[1] is not None and close(grads[1], xr.grad),
                 "the gradient with respect to x differs from the reference: avoid .detach(), .item() or in-place changes")
        g.expect(grads[2] is not None and close(grads[2], mr.grad), "the gradient with respect to memory differs from the reference")

    with g.check("dropout on the weights only in training mode"):
        m, r = attention_pair(MultiHeadAttention, "cross.dropout", dropout=0.5)
        x, memory = rand("cross.dropout.x", 2, 4, C), rand("cross.dropout.m", 2, 5, C)
        out, _ = _cross_call(g, cross_attention, m, x, memory)
        g.expect(close(out, r(x, kv=memory)[0]), "in eval mode with attn.dropout=0.5 the output differs from the reference: "
                                                 "apply dropout only when attn.training")
        m.train()
        out, _ = _cross_call(g, cross_attention, m, x, memory)
        g.expect(not close(out, r(x, kv=memory)[0]),
                 "in training mode with attn.dropout=0.5 nothing was dropped: F.dropout(weights, attn.dropout) when attn.training")

    g.finish()


def check_cross_attention(cross_attention, MultiHeadAttention) -> None:
    """Public checks of ``cross_attention``: shapes, then Chapter 2's attention with a source padding mask."""
    g = Grader("cross_attention (public)")
    x, memory = rand("public.cross.x", 2, 3, C), rand("public.cross.m", 2, 5, C)
    with g.check("x (2, 3, C) and memory (2, 5, C) give out (2, 3, C) and weights (2, H, 3, 5)"):
        m, r = attention_pair(MultiHeadAttention, "public.cross")  # built inside the check: each check is a fresh process
        _cross_call(g, cross_attention, m, x, memory)
    with g.check("equals attn(x, kv=memory, key_padding_mask=mask, need_weights=True) with the second source padded"):
        m, r = attention_pair(MultiHeadAttention, "public.cross")
        keep = padding_mask([5, 2], S=5)
        out, w = _cross_call(g, cross_attention, m, x, memory, keep)
        expected, expected_w = r(x, kv=memory, key_padding_mask=keep, need_weights=True)
        first_match(g, out, _cross_mistakes(r, x, memory, keep), expected)
        g.expect(close(out, expected), "the output differs from Chapter 2's attention with queries from x and keys/values from memory")
        g.expect(close(w, expected_w), "the weights differ from Chapter 2's attention weights")
    g.finish()


# =========================================================================== part 3: PreNormDecoderLayer

_POST_NORM = ("this is post-norm (x = norm(x + sublayer(x))): a pre-norm layer normalises each sub-layer's input and "
              "adds the result to the un-normalised stream, x = x + sublayer(norm(x))")
_NOT_CAUSAL = "the self-attention must be causal: self.self_attn(self.norm1(x), is_causal=True)"
_LAYER_KV_FROM_X = ("cross-attention must take its keys and values from memory: "
                    "cross_attention(self.cross_attn, self.norm2(x), memory, memory_key_padding_mask)")
_NORMED_MEMORY = "do not normalise memory in the decoder (the encoder stack already did): only the query side, norm2(x)"
_LAYER_MASK_IGNORED = "memory_key_padding_mask was ignored: pass it on to cross_attention"
_NO_RESIDUAL = "a residual connection is missing: every sub-layer adds its output to the stream, x = x + dropout(sublayer(norm(x)))"
_NORMED_STREAM = ("do not replace x by its normalised version: the residual adds the sub-layer's output to the "
                  "un-normalised x (x = x + f(norm(x)), not x = norm(x); x = x + f(x))")
_WRONG_WEIGHTS = ("the second returned value should be the cross-attention weights (B, H, T, S) that cross_attention "
                  "returns, not the self-attention's")


def _layer_triple(g: Grader, PreNormDecoderLayer, name: str, activation: str = "relu", dropout: float = 0.0):
    """The student's layer (built with their class), coursekit's, and torch's, with the same random weights."""
    r = ref.PreNormDecoderLayer(C, H, DFF, dropout=0.0, activation=activation).double().eval()
    weights = random_weights(r, name)
    r.load_state_dict(weights)
    m = PreNormDecoderLayer(C, H, DFF, dropout=dropout, activation=activation)
    m.double()
    sd = m.state_dict()
    got, expected = set(sd) if isinstance(sd, dict) else set(), set(weights)
    g.expect(got == expected, f"the layer's parameters must be those of Chapter 4's DecoderLayer (keep the given __init__); "
                              f"missing {sorted(expected - got)[:4]}, unexpected {sorted(got - expected)[:4]}")
    m.load_state_dict(weights)
    m.eval()
    t = nn.TransformerDecoderLayer(C, H, DFF, dropout=0.0, activation=activation, batch_first=True,
                                   norm_first=True).double().eval()
    t.load_state_dict(L.to_torch_state_dict(weights))
    return m, r, t


def _torch_layer(t, x, memory, keep=None):
    return t(x, memory, tgt_mask=~causal_mask(x.shape[1]), tgt_is_causal=True,
             memory_key_padding_mask=None if keep is None else ~keep)


def _layer_mistakes(r, x, memory, keep):
    """Outputs of the common wrong layers, computed with the reference layer's submodules."""
    def ca(h, kv, mask=keep):
        return r.cross_attn(h, kv=kv, key_padding_mask=mask)[0]

    def sa(h, causal=True):
        return r.self_attn(h, is_causal=causal)[0]

    out = []
    with torch.no_grad():
        post = L.DecoderLayer(C, H, DFF, dropout=0.0, activation="relu" if isinstance(r.ff.act, nn.ReLU) else "gelu",
                              norm_first=False).double().eval()
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
            out.insert(2, (layer(kv="x", mask=None if x.shape[1] != memory.shape[1] else keep), _LAYER_KV_FROM_X))
        if keep is not None:
            out.insert(1, (layer(mask=None), _LAYER_MASK_IGNORED))
    return out


def _layer_call(g: Grader, m, x, memory, keep=None):
    result = m(x, memory) if keep is None else m(x, memory, keep)
    B, T, S = x.shape[0], x.shape[1], memory.shape[1]
    g.expect(isinstance(result, tuple) and len(result) == 2,
             f"the layer should return a pair (out, cross-attention weights), got {describe(result)}")
    out, w = result
    if is_tensor(w) and w.shape == (B, H, T, T) and T != S:
        g.fail(_LAYER_KV_FROM_X + " (the weights are (B, H, T, T): the keys came from x)")
    g.expect(is_tensor(out) and out.shape == x.shape and out.dtype == x.dtype,
             f"for x {describe(x)} and memory {describe(memory)} the output should have x's shape and dtype, got {describe(out)}")
    g.expect(is_tensor(w) and w.shape == (B, H, T, S), f"the weights should be (B, H, T, S) = {(B, H, T, S)}, got {describe(w)}")
    return out, w


def grade_pre_norm_decoder_layer(PreNormDecoderLayer) -> None:
    """Grade a student's ``PreNormDecoderLayer`` class (Chapter 4's ``DecoderLayer`` with a pre-norm ``forward``)."""
    g = Grader("PreNormDecoderLayer")

    for activation, (T, S) in (("relu", (5, 7)), ("gelu", (4, 4))):
        with g.check(f"{activation}, T={T}, S={S}: equals nn.TransformerDecoderLayer(norm_first=True) with a causal mask"):
            m, r, t = _layer_triple(g, PreNormDecoderLayer, f"dec.{activation}", activation)
            x, memory = rand(f"dec.{activation}.x", 2, T, C), rand(f"dec.{activation}.m", 2, S, C)
            out, _ = _layer_call(g, m, x, memory)
            expected = _torch_layer(t, x, memory)
            first_match(g, out, _layer_mistakes(r, x, memory, None), expected)
            g.expect(close(out, expected), "the output differs from nn.TransformerDecoderLayer(norm_first=True) with the same "
                                           "weights: x = x + self_attn(norm1(x)) (causal); x = x + cross(norm2(x), memory); "
                                           "x = x + ff(norm3(x))")

    with g.check("memory_key_padding_mask reaches cross-attention, and the weights returned are cross-attention's"):
        m, r, t = _layer_triple(g, PreNormDecoderLayer, "dec.mask")
        x, memory = rand("dec.mask.x", 3, 4, C), rand("dec.mask.m", 3, 6, C)
        keep = padding_mask([6, 3, 1], S=6)
        out, w = _layer_call(g, m, x, memory, keep)
        expected = _torch_layer(t, x, memory, keep)
        first_match(g, out, _layer_mistakes(r, x, memory, keep), expected)
        g.expect(close(out, expected), "with a memory_key_padding_mask the output differs from nn.TransformerDecoderLayer")
        expected_w = r(x, memory, keep)[1]
        self_w = r.self_attn(r.norm1(x), is_causal=True, need_weights=True)[1]
        if is_tensor(w) and w.shape == self_w.shape and close(w, self_w):
            g.fail(_WRONG_WEIGHTS)
        g.expect(close(w, expected_w), "the weights differ from those of cross_attention(self.cross_attn, self.norm2(x), memory, "
                                       "memory_key_padding_mask), computed after the self-attention sub-layer")

    with g.check("a future target does not change earlier outputs"):
        m, r, t = _layer_triple(g, PreNormDecoderLayer, "dec.future")
        x, memory = rand("dec.future.x", 2, 6, C), rand("dec.future.m", 2, 5, C)
        y = x.clone()
        y[:, 4:] = rand("dec.future.y", 2, 2, C)
        a, _ = _layer_call(g, m, x, memory)
        b, _ = _layer_call(g, m, y, memory)
        g.expect(close(a[:, :4], b[:, :4]), "outputs at positions 0-3 changed when only positions 4-5 changed: information "
                                            "leaks from the future (" + _NOT_CAUSAL + ")")

    with g.check("dropout does nothing in eval mode and something in training mode"):
        m, r, t = _layer_triple(g, PreNormDecoderLayer, "dec.dropout", dropout=0.5)
        x, memory = rand("dec.dropout.x", 2, 4, C), rand("dec.dropout.m", 2, 5, C)
        out, _ = _layer_call(g, m, x, memory)
        g.expect(close(out, _torch_layer(t, x, memory)), "in eval mode with dropout=0.5 the output differs from the reference")
        m.train()
        out, _ = _layer_call(g, m, x, memory)
        g.expect(not close(out, _torch_layer(t, x, memory)),
                 "in training mode dropout=0.5 changed nothing: apply self.dropout1/2/3 to the sub-layers' outputs")

    with g.check("gradients reach x and memory as in nn.TransformerDecoderLayer"):
        m, r, t = _layer_triple(g, PreNormDecoderLayer, "dec.grad", "gelu")
        x, memory = rand("dec.grad.x", 2, 4, C), rand("dec.grad.m", 2, 5, C)
        keep = padding_mask([5, 3], S=5)
        up = rand("dec.grad.up", 2, 4, C)
        p = probe(m, x.clone().requires_grad_(), memory.clone().requires_grad_(), keep, backward=(0, up))
        xr, mr = x.clone().requires_grad_(), memory.clone().requires_grad_()
        (_torch_layer(t, xr, mr, keep) * up).sum().backward()
        for label, got, want in zip(("x", "memory"), (p.grads or [None, None])[:2], (xr.grad, mr.grad)):
            g.expect(got is not None and close(got, want), f"the gradient with respect to {label} differs from the reference")

    g.finish()


def check_pre_norm_decoder_layer(PreNormDecoderLayer) -> None:
    """Public checks of ``PreNormDecoderLayer(8, 2)`` against ``nn.TransformerDecoderLayer(norm_first=True)``."""
    g = Grader("PreNormDecoderLayer (public)")
    with g.check("PreNormDecoderLayer(8, 2, dropout=0.0) equals torch's pre-norm layer with its weights"):
        layer = PreNormDecoderLayer(8, 2, dropout=0.0)
        layer.eval()
        sd = layer.state_dict()
        t = nn.TransformerDecoderLayer(8, 2, 32, dropout=0.0, batch_first=True, norm_first=True).eval()
        t.load_state_dict(L.to_torch_state_dict(sd))
        x, memory = rand("public.dec.x", 2, 4, 8, dtype=torch.float32), rand("public.dec.m", 2, 6, 8, dtype=torch.float32)
        keep = padding_mask([6, 3], S=6)
        result = layer(x, memory, keep)
        g.expect(isinstance(result, tuple) and len(result) == 2, f"the layer should return (out, weights), got {describe(result)}")
        out, w = result
        g.expect(is_tensor(out) and out.shape == (2, 4, 8), f"expected out of shape (2, 4, 8), got {describe(out)}")
        g.expect(is_tensor(w) and w.shape == (2, 2, 4, 6), f"expected cross-attention weights (2, 2, 4, 6), got {describe(w)}")
        expected = t(x, memory, tgt_mask=~causal_mask(4), tgt_is_causal=True, memory_key_padding_mask=~keep)
        g.expect(torch.allclose(out, expected, atol=1e-5),
                 "the output differs from nn.TransformerDecoderLayer(norm_first=True) with a causal mask: "
                 "x = x + self_attn(norm1(x)); x = x + cross(norm2(x), memory); x = x + ff(norm3(x))")
    g.finish()


# =========================================================================== part 4: label_smoothed_loss

_NO_SMOOTHING = "smoothing was not applied: the loss is (1 - smoothing) * (-log p_y) + smoothing * mean_v(-log p_v)"
_OTHER_CLASSES = ("the smoothing mass went to the V - 1 wrong classes only: spread it uniformly over all V classes, the right "
                  "one included (the convention of Szegedy et al. and of F.cross_entropy(label_smoothing=...)), i.e. "
                  "smoothing * mean over all V of -log p_v")
_SWAPPED = "the weights are swapped: (1 - smoothing) on -log p of the right token, smoothing on the uniform part"
_PADDING_COUNTED = ("padding positions are scored: a target equal to pad_id must count neither in the sum nor in the "
                    "number of positions the mean divides by")
_DIVIDED_BY_ALL = ("the mean divides by every position, padding included: divide by the number of non-padding targets")
_SUMMED = "the loss is summed over positions: return the mean over the non-padding targets"
_CLASS_SUM = "the uniform part sums -log p_v over the V classes: take the mean over the classes (divide by V)"


def _smoothed_ref(logits, targets, eps, pad_id=PAD):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=pad_id, label_smoothing=eps)


def _loss_mistakes(logits, targets, eps, pad_id=PAD):
    V = logits.shape[-1]
    lp = F.log_softmax(logits.reshape(-1, V), -1)  # (N, V)
    t = targets.reshape(-1)
    keep = t != pad_id
    safe = t.clamp(0, V - 1)
    nll = -lp.gather(-1, safe[:, None]).squeeze(-1)  # (N,)
    uniform = -lp.mean(-1)
    others = (-lp.sum(-1) - nll) / (V - 1)
    per = (1 - eps) * nll + eps * uniform
    return [
        ((nll[keep]).mean(), _NO_SMOOTHING),
        (((1 - eps) * nll + eps * others)[keep].mean(), _OTHER_CLASSES),
        ((eps * nll + (1 - eps) * uniform)[keep].mean(), _SWAPPED),
        (per.mean(), _PADDING_COUNTED),
        (per[keep].sum() / t.numel(), _DIVIDED_BY_ALL),
        (per[keep].sum(), _SUMMED),
        (((1 - eps) * nll - eps * lp.sum(-1))[keep].mean(), _CLASS_SUM),
    ]


def _scalar(g: Grader, out, dtype) -> None:
    g.expect(is_tensor(out) and out.dim() == 0 and out.dtype == dtype,
             f"the loss should be a scalar (0-dimensional) tensor of the logits' dtype {dtype}, got {describe(out)}")


def grade_label_smoothed_loss(label_smoothed_loss) -> None:
    """Grade a student's ``label_smoothed_loss(logits, targets, smoothing=0.1, pad_id=0)``."""
    g = Grader("label_smoothed_loss")

    with g.check("returns a scalar tensor of the logits' dtype"):
        for dtype in (torch.float64, torch.float32):
            out = label_smoothed_loss(rand("ls.dtype", 2, 3, 7, dtype=dtype), _ids("ls.dtype.t", 2, 3, low=1, high=7), 0.1)
            _scalar(g, out, dtype)

    with g.check("equals F.cross_entropy(..., label_smoothing=smoothing, ignore_index=pad_id)"):
        for eps, (B, T, V) in ((0.1, (3, 6, 11)), (0.3, (2, 5, 7)), (0.0, (2, 4, 5)), (1.0, (1, 3, 4))):
            logits = rand(f"ls.ref.{eps}", B, T, V, scale=2.0)
            targets = _ids(f"ls.ref.{eps}.t", B, T, low=1, high=V)
            targets[0, T // 2:] = PAD
            out = label_smoothed_loss(logits, targets, eps)
            _scalar(g, out, torch.float64)
            expected = _smoothed_ref(logits, targets, eps)
            first_match(g, out, _loss_mistakes(logits, targets, eps), expected)
            g.expect(close(out, expected), f"with smoothing={eps} and (B, T, V) = {(B, T, V)} the loss differs from "
                                           "F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=pad_id, "
                                           "label_smoothing=smoothing)")

    with g.check("closed form: uniform logits give log V whatever the smoothing"):
        V = 6
        targets = _ids("ls.uniform.t", 2, 5, low=1, high=V)
        targets[1, 3:] = PAD
        out = label_smoothed_loss(torch.zeros(2, 5, V, dtype=torch.float64), targets, 0.2)
        _scalar(g, out, torch.float64)
        g.expect(close(out, torch.tensor(math.log(V), dtype=torch.float64)),
                 f"all logits 0 (a uniform prediction) must give log V = {math.log(V):.6f}, got {float(out):.6f}")

    with g.check("a different pad_id is honoured, and the targets may be flat (N,) with logits (N, V)"):
        V = 5
        logits = rand("ls.pad", 12, V)
        targets = _ids("ls.pad.t", 12, low=0, high=V)
        targets[[2, 5, 6]] = 4
        out = label_smoothed_loss(logits, targets, 0.1, pad_id=4)
        _scalar(g, out, torch.float64)
        expected = _smoothed_ref(logits, targets, 0.1, pad_id=4)
        first_match(g, out, _loss_mistakes(logits, targets, 0.1, pad_id=4), expected)
        g.expect(close(out, expected), "with pad_id=4 and (N, V) logits the loss differs from the reference: ignore the "
                                       "targets equal to the pad_id argument and flatten the leading axes")

    with g.check("gradients equal F.cross_entropy's"):
        logits = rand("ls.grad", 2, 4, 6)
        targets = _ids("ls.grad.t", 2, 4, low=1, high=6)
        targets[1, 2:] = PAD
        p = probe(label_smoothed_loss, logits.clone().requires_grad_(), targets, 0.1,
                  backward=(None, torch.tensor(1.0, dtype=torch.float64)))
        g.expect(is_tensor(p.result) and p.result.requires_grad,
                 "the loss does not depend on the logits through autograd: avoid .item(), .detach() or torch.tensor(...)")
        lr = logits.clone().requires_grad_()
        _smoothed_ref(lr, targets, 0.1).backward()
        grad = p.grads[0] if p.grads else None
        g.expect(is_tensor(grad) and close(grad, lr.grad), "the gradient with respect to the logits differs from the reference")
        g.expect(bool((grad[1, 2:] == 0).all()), "padded positions got a gradient: " + _PADDING_COUNTED)

    with g.check("only padding, or targets of the wrong shape, raise a ValueError"):
        expect_value_error(g, lambda: label_smoothed_loss(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), 0.1),
                            "every target equal to pad_id", "there is nothing to average; a mean over nothing is NaN")
        expect_value_error(g, lambda: label_smoothed_loss(torch.zeros(2, 3, 5), torch.ones(2, 4, dtype=torch.long), 0.1),
                            "logits (2, 3, 5) and targets (2, 4)", "targets must have the shape logits.shape[:-1]")

    g.finish()


def check_label_smoothed_loss(label_smoothed_loss) -> None:
    """Public checks of ``label_smoothed_loss`` on a small batch with padding."""
    g = Grader("label_smoothed_loss (public)")
    logits = rand("public.ls", 2, 3, 4, dtype=torch.float32)
    targets = torch.tensor([[1, 3, 2], [2, 0, 0]])
    with g.check("smoothing=0.1 with 2 padded targets equals F.cross_entropy(label_smoothing=0.1, ignore_index=0)"):
        out = label_smoothed_loss(logits, targets, 0.1)
        expected = _smoothed_ref(logits, targets, 0.1)
        g.expect(is_tensor(out) and out.dim() == 0, f"the loss should be a scalar tensor, got {describe(out)}")
        g.expect(torch.allclose(out, expected, atol=1e-6),
                 f"expected {float(expected):.6f} (the mean over the 4 real targets), got {float(out):.6f}")
    with g.check("smoothing=0 is the plain cross-entropy over the real targets"):
        out = label_smoothed_loss(logits, targets, 0.0)
        expected = _smoothed_ref(logits, targets, 0.0)
        g.expect(is_tensor(out) and out.dim() == 0 and torch.allclose(out, expected, atol=1e-6),
                 f"expected {float(expected):.6f}, got {describe(out) if not is_tensor(out) or out.dim() else float(out):}")
    g.finish()
