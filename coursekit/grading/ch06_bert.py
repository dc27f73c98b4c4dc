"""Checks for Exercise 6 (BERT: embeddings, masking, the MLM loss, the [CLS] head).

Each graded part is a :class:`~coursekit.grading.spec.Spec`, one ``Clause`` per promise of its text, each
test written once: ``check_*`` run the clauses' small fixed examples, ``grade_*`` their hidden inputs
(drawn across the allowed shapes, then fixed ones). Modules get random weights with ``load_state_dict``
and are compared with :mod:`coursekit.bert` in float64; each dropout is checked alone, with its ``p`` set
to 1 (and 0.5). The masking functions are random: their checks test the rule's exact parts on any shape
and its proportions on about 16,000 tokens from a generator the grader seeds (within five binomial
standard deviations), never one random stream. Under the autograder a ``torch.Generator`` or a
``SpecialTokens`` cannot cross into the sandbox, so both are built there from the notebook's own
``torch`` and ``SpecialTokens``; what the student's class builds serves one check (:func:`_once`).

Over 500 lines: one clause per promise of the exercise text for each graded part, with the inputs that
provoke it and the common mistakes its hints name; splitting it would scatter one exercise's
specification over several files.
"""

from __future__ import annotations

import math
import weakref
from types import FunctionType

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from coursekit import bert as ref
from coursekit.grading.core import (
    Grader,
    call_student,
    close,
    default_device,
    describe,
    expect_value_error,
    first_match,
    generator,
    is_a,
    is_tensor,
    load_weights,
    magnitude,
    probe,
    raise_unless_student_error,
    rand,
    random_weights,
    said,
    set_attr,
    student_side,
    tensor,
)
from coursekit.grading.questions import Prediction, expect_in_band
from coursekit.grading.spec import Call, Clause, Spec, new_tensor, raises

#: the graded parts, by the names of their entry points ``check_<part>`` and ``grade_<part>``
_PARTS = ("bert_embeddings", "mask_tokens", "mlm_loss", "cls_head", "corrupted_fraction", "mask_whole_words")
_PARTS += ("predict_random_share", "predict_mlm_head_params", "predict_same_topic_negatives")
__all__ = [f"{verb}_{part}" for part in _PARTS for verb in ("check", "grade")]

V, MAXLEN, C, K = 30, 12, 16, 3
Z = 5.0  # binomial standard deviations a count may stray from its expectation
SPECIAL = (40, 41, 42, 43)  # [PAD], [CLS], [SEP], [MASK] after 40 ordinary ids
SEEDS = st.integers(0, 2**16)


def _generator(seed: int):
    return student_side("torch", torch).Generator().manual_seed(seed)


def _special(pad: int, cls: int, sep: int, mask: int):
    return student_side("SpecialTokens", ref.SpecialTokens)(pad, cls, sep, mask)


def _within(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= Z * math.sqrt(n * p * (1 - p)) + 1


def _ints(seed: int, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(int(seed)))


def _fixed(text: str, test, *cases, public: int = 1) -> Clause:
    """A clause on fixed inputs only: the first ``public`` cases are its public examples; the hidden
    check runs every case, in order."""
    return Clause(text, test, examples=cases[:public], also=cases[public:])


_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _once(g: Grader, key: tuple, make):
    """``make()``, once per check of ``g``: what the student's class built serves the current check
    only (under the autograder each check runs in a fresh process)."""
    built = _BUILT.setdefault(g, {})
    key = (len(g.results), *key)
    if key not in built:
        built[key] = make()
    return built[key]


def _loaded(module, weights):
    module = module.double().eval()
    module.load_state_dict(weights)
    return module


def _has(g: Grader, m, what: str, name: str, kind: str, module: str, p: float | None = None):
    """The submodule ``name`` of ``m``, an ``nn.<kind>`` of ``torch.nn.modules.<module>`` (a dropout: of
    probability ``p``)."""
    layer = getattr(m, name, None)
    g.expect(is_a(layer, f"torch.nn.modules.{module}.{kind}"), f"{what} needs an nn.{kind} called {name}")
    if p is not None:
        g.expect(layer.p == p, f"{what}: dropout.p should be the dropout argument, {p}, got {layer.p}")
    return layer


def _dropout_at_one(g: Grader, m, call: tuple, what: str, wrong: tuple, right: tuple):
    """The module's dropout alone: its output in eval mode (twice: dropout does nothing there), then in
    training mode with the dropout's ``p`` set to 1, which must equal ``right[0]`` (``wrong``: a
    mistake's output and hint first), then in eval mode again. Returns the eval-mode output."""
    own, again = m.eval()(*call), m(*call)  # the output without dropout: the dropout alone is graded
    g.expect(
        is_tensor(own) and is_tensor(again) and close(own, again),
        f"{what} in eval mode: two calls differ, so dropout is active: use nn.Dropout, which follows the "
        "module's train() and eval() (and does nothing in eval mode)",
    )
    set_attr(m.dropout, "p", 1.0)
    out = m.train()(*call)
    g.expect(is_tensor(out) and out.shape == own.shape, f"{what} in training mode returned {describe(out)}")
    if close(out, wrong[0]):
        g.fail(wrong[1])
    g.expect(close(out, right[0]), right[1])
    g.expect(
        close(m.eval()(*call), own),
        "with the dropout's p set to 1, eval mode must still give the output without dropout",
    )
    return own


# --------------------------------------------------------------------------- BertEmbeddings


def _emb_reference(weights, n_segments=2, d_model=C, eps=1e-12, max_len=MAXLEN):
    return _loaded(ref.BertEmbeddings(V, max_len, d_model, n_segments, 0.0, eps), weights)


_EMB = "norm(token + position + segment)"  # what BertEmbeddings returns (before dropout)


def _emb_mistakes(w, ids, seg, eps=1e-12):
    T = ids.shape[1]
    tok, pos, sg = w["token.weight"][ids], w["position.weight"][:T], w["segment.weight"][seg]

    def norm(x):
        """Layer norm over the last axis, written out (F.layer_norm spins up threads: slow on tiny inputs)."""
        x = x - x.mean(-1, keepdim=True)
        return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * w["norm.weight"] + w["norm.bias"]

    out = [
        (
            norm(tok + pos),
            "the segment embedding is missing: add segment(token_type_ids) to the token and position "
            "embeddings",
        ),
        (tok + pos + sg, "the layer norm is missing: return dropout(norm(token + position + segment))"),
        (norm(tok + sg), "the position embedding is missing: add position(arange(T)) (positions 0 .. T-1)"),
        (
            norm(tok + pos + w["segment.weight"][0]),
            "token_type_ids were ignored: add segment(token_type_ids)",
        ),
    ]
    if T < w["position.weight"].shape[0]:
        shifted = norm(tok + w["position.weight"][1 : T + 1] + sg)
        out.append((shifted, "positions start at 0: use position(torch.arange(T)), not 1 .. T"))
    return out


def _embeddings(g: Grader, BertEmbeddings, n_segments=2, d_model=C, eps=1e-12, max_len=MAXLEN, name="emb"):
    """The student's ``BertEmbeddings`` of this configuration with weights loaded (built once per check),
    its weights, the reference on them, and the call that built it."""
    key = (n_segments, d_model, eps, max_len)

    def make():
        what = f"BertEmbeddings({V}, {max_len}, {d_model}, n_segments={n_segments}, dropout=0.0, eps={eps})"
        m = call_student(
            g, what, BertEmbeddings, V, max_len, d_model, n_segments=n_segments, dropout=0.0, eps=eps
        )
        m = m.double().eval()
        w = random_weights(ref.BertEmbeddings(V, max_len, d_model, n_segments), f"{name}.{key}")
        load_weights(g, m, w, "BertEmbeddings")
        return m, w, _emb_reference(w, n_segments, d_model, eps, max_len), what

    return _once(g, (name, *key), make)


def _ids_and_segments(seed: int, B: int, T: int, n_segments: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _ints(seed, V, B, T), _ints(seed + 1, n_segments, B, T)


def _expect_output(g: Grader, out, expected, mistakes, what: str, formula: str) -> None:
    """A module's float64 output against the reference's: its shape, the mistakes' hints, then its values."""
    g.expect(
        is_tensor(out) and out.shape == expected.shape and out.dtype == expected.dtype,
        f"{what}: expected a float64 tensor of shape {tuple(expected.shape)}, got {describe(out)}",
    )
    first_match(g, out, [(x, f"{what}: {hint}") for x, hint in mistakes], expected)
    g.expect(close(out, expected), f"{what}: the output differs from {formula}")


def _emb_parts(g: Grader, BertEmbeddings, case) -> None:
    args, kwargs, n_seg, p, eps = case
    what = f"BertEmbeddings{args}" + (f" with {kwargs}" if kwargs else "")
    m = call_student(g, what, BertEmbeddings, *args, **kwargs)
    for name, shape in (("token", (V, args[2])), ("position", args[1:3]), ("segment", (n_seg, args[2]))):
        got = tuple(_has(g, m, what, name, "Embedding", "sparse").weight.shape)
        g.expect(got == shape, f"{what}: {name} should be an embedding of shape {shape}, got {got}")
    sd = m.state_dict()
    names = {"token.weight", "position.weight", "segment.weight", "norm.weight", "norm.bias"}
    g.expect(
        isinstance(sd, dict) and set(sd) == names,
        f"{what}: expected the parameters {sorted(names)}, got {sorted(sd) if isinstance(sd, dict) else describe(sd)}",
    )
    got_eps = getattr(getattr(m, "norm", None), "eps", None)
    g.expect(
        got_eps == eps,
        f"{what}: the norm's eps should be {eps}, got {got_eps}: build it as LayerNorm(d_model, eps)",
    )
    _has(g, m, what, "dropout", "Dropout", "dropout", p)


def _emb_values(g: Grader, BertEmbeddings, case) -> None:
    B, T, n_seg, d_model, seed = case
    m, w, r, built = _embeddings(g, BertEmbeddings, n_seg, d_model)
    ids, seg = _ids_and_segments(seed, B, T, n_seg)
    what = f"{built}, input_ids {tuple(ids.shape)} and token_type_ids"
    _expect_output(g, call_student(g, what, m, ids, seg), r(ids, seg), _emb_mistakes(w, ids, seg), what, _EMB)


def _emb_default_segment(g: Grader, BertEmbeddings, case) -> None:
    B, T, seed = case
    m, w, r, built = _embeddings(g, BertEmbeddings)
    ids = _ids_and_segments(seed, B, T, 2)[0]
    what = f"{built} on input_ids {tuple(ids.shape)} without token_type_ids"
    out, zeros = call_student(g, what, m, ids), torch.zeros_like(ids)
    if is_tensor(out) and close(out, r(ids, zeros)):
        return
    explicit = call_student(
        g, f"{built} on input_ids {tuple(ids.shape)} and token_type_ids of zeros", m, ids, zeros
    )
    if not (is_tensor(out) and is_tensor(explicit) and close(out, explicit)):
        g.fail(
            f"{what}: the output differs from the one with token_type_ids=torch.zeros_like(input_ids) "
            f"(got {describe(out)}): when token_type_ids is None, every token is in segment 0"
        )
    _expect_output(g, out, r(ids, zeros), _emb_mistakes(w, ids, zeros), what, _EMB)


def _emb_eps(g: Grader, BertEmbeddings, eps: float) -> None:
    m, w, r, built = _embeddings(g, BertEmbeddings, eps=eps)
    ids, seg = _ids_and_segments(7, 2, 6, 2)
    out = call_student(g, built, m, ids, seg)
    if is_tensor(out) and not close(out, r(ids, seg)) and close(out, _emb_reference(w)(ids, seg)):
        g.fail(f"{built}: the output is the one with eps=1e-12: build the norm as LayerNorm(d_model, eps)")
    _expect_output(g, out, r(ids, seg), _emb_mistakes(w, ids, seg, eps), f"{built}, input_ids (2, 6)", _EMB)


def _emb_length(g: Grader, BertEmbeddings, T: int) -> None:
    """``T`` tokens with ``max_len=7``: up to 7 work, more raise a ValueError naming both numbers."""
    m, _, _, built = _embeddings(g, BertEmbeddings, max_len=7)
    if T <= 7:
        out = call_student(g, f"{built} on input_ids (2, {T})", m, _ids_and_segments(3, 2, T, 2)[0])
        g.expect(
            is_tensor(out) and out.shape == (2, T, C),
            f"{built} on input_ids (2, {T}) (max_len tokens) should give a (2, {T}, {C}) tensor, got {describe(out)}",
        )
        return
    ids, what = _ids_and_segments(3, 1, T, 2)[0], f"input_ids (1, {T}) and max_len=7"
    expect_value_error(
        g, lambda: m(ids), what, f"say that the input has {T} tokens but the model only 7 positions"
    )
    try:
        m(ids)
    except ValueError as e:
        g.expect(
            str(T) in said(e) and "7" in said(e),
            f"the ValueError for {what} should name both numbers, it says: {e}",
        )


def _emb_dropout(g: Grader, BertEmbeddings, _case) -> None:
    m = call_student(g, f"BertEmbeddings({V}, {MAXLEN}, {C}, 2, 0.5)", BertEmbeddings, V, MAXLEN, C, 2, 0.5)
    w = random_weights(ref.BertEmbeddings(V, MAXLEN, C), "emb.dropout")
    load_weights(g, m.double(), w, "BertEmbeddings")
    call, shape = _ids_and_segments(11, 8, MAXLEN, 2), (8, MAXLEN, C)
    bias = (
        w["norm.bias"].expand(shape).clone(),
        "with the dropout's p set to 1 the output is the norm's bias: the dropout comes before the norm; "
        "apply it after: dropout(norm(x))",
    )
    zero = (
        torch.zeros(shape, dtype=torch.float64),
        "with the dropout's p set to 1 (training mode) every output should be 0: the output is "
        "dropout(norm(x)), and the module's dropout is self.dropout",
    )
    own = _dropout_at_one(g, m, call, "BertEmbeddings", bias, zero)
    g.expect(
        float((own == 0).double().mean()) < 0.05,
        "in eval mode dropout must do nothing (the output holds zeros): use nn.Dropout, which follows the "
        "module's train() and eval()",
    )
    set_attr(m.dropout, "p", 0.5)
    out = m.train()(*call)
    g.expect(
        is_tensor(out) and out.shape == own.shape,
        f"in training mode: expected a tensor of shape {tuple(own.shape)}, got {describe(out)}",
    )
    dropped = out == 0
    zeros = float(dropped.double().mean())
    g.expect(
        0.35 < zeros < 0.65,
        f"in training mode with dropout=0.5 about half the outputs should be exactly 0, got {zeros:.0%}: "
        "apply nn.Dropout(dropout) to the normalised sum",
    )
    g.expect(
        close(out, torch.where(dropped, torch.zeros_like(own), 2 * own)),
        "in training mode with dropout=0.5 every output should be 0 or twice the output in eval mode "
        "(nn.Dropout scales what it keeps by 1 / (1 - p)): apply the dropout once, to norm(...), and "
        "nowhere else",
    )


def _emb_device(g: Grader, BertEmbeddings, _case) -> None:
    m, _, _, built = _embeddings(g, BertEmbeddings, name="emb.device")  # weights no other check uses
    ids = _ids_and_segments(5, 2, 6, 2)[0]
    # With torch's default device set to meta, positions made without device=input_ids.device are meta
    # tensors, and looking CPU weights up with them returns uninitialised memory: the output changes. Blocks
    # of NaN are freed first, so that this memory is unlikely to hold the very rows an earlier call left.
    t = student_side("torch", torch)
    for n in (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024):
        t.full((n,), float("nan"), dtype=torch.float64)
    try:  # first, so that no memory freed by an earlier call of this module holds its positions' values
        with default_device("meta"):
            out = m(ids)
    except Exception as e:  # noqa: BLE001
        if "meta" in str(e):  # moving a tensor made on the default device with .to(input_ids.device) is fine
            return
        raise_unless_student_error(e)
        g.fail(
            "with torch's default device set elsewhere ('meta') and input_ids on the CPU, your code raised "
            f"{type(e).__name__.removeprefix('Student')}: {e}"
        )
    own = call_student(g, f"{built} on input_ids (2, 6)", m, ids)
    g.expect(
        is_tensor(out) and is_tensor(own) and close(out, own),
        "with torch's default device set elsewhere (torch.set_default_device('meta')) and input_ids on "
        "the CPU, the output changed: make positions with torch.arange(T, device=input_ids.device) "
        "(and default segment ids with torch.zeros_like(input_ids)), so that they are on input_ids' device",
    )


BERT_EMBEDDINGS = Spec(
    "BertEmbeddings",
    [
        _fixed(
            "has nn.Embedding token (V, C), position (max_len, C), segment (n_segments, C), norm (eps) and "
            "an nn.Dropout dropout (p)",
            _emb_parts,
            ((V, MAXLEN, C), {}, 2, 0.1, 1e-12),
            ((V, 7, 5, 3, 0.3, 0.5), {}, 3, 0.3, 0.5),
            ((V, 4, 6), {"n_segments": 1, "eps": 1e-5, "dropout": 0.0}, 1, 0.0, 1e-5),
        ),
        Clause(
            "matches norm(token + position + segment) with loaded weights: any batch, 1 to max_len tokens, "
            "1 to 3 segments",
            _emb_values,
            st.tuples(
                st.integers(1, 3), st.integers(1, MAXLEN), st.integers(1, 3), st.sampled_from((C, 5)), SEEDS
            ),
            key="emb.values",
            budget="wide",
            examples=[(1, 3, 2, C, 0)],
        ),
        Clause(
            "token_type_ids=None means segment 0 for every token",
            _emb_default_segment,
            st.tuples(st.integers(1, 3), st.integers(1, MAXLEN), SEEDS),
            key="emb.default",
            budget="some",
            examples=[(2, 5, 0)],
        ),
        _fixed("the norm uses the eps argument", _emb_eps, 0.5, 3.0),
        _fixed(
            "more tokens than max_len raise a ValueError naming both numbers (max_len tokens work)",
            _emb_length,
            7,
            9,
            8,
            public=2,
        ),
        _fixed(
            "dropout after the norm, only in training mode (checked with its p set to 1, and at 0.5)",
            _emb_dropout,
            None,
        ),
        _fixed("positions (and default segment ids) are made on input_ids' device", _emb_device, None),
    ],
)
check_bert_embeddings, grade_bert_embeddings = BERT_EMBEDDINGS.graders("bert_embeddings")


# --------------------------------------------------------------------------- mask_tokens (and mask_whole_words)


def _sentences(special_ids, n_ordinary: int, B: int, T: int, name: str) -> torch.Tensor:
    """``[CLS] words [SEP] [PAD]...`` rows of random length with ordinary ids inside."""
    pad, cls, sep, _ = special_ids
    gen = generator(name)
    ordinary = torch.tensor([i for i in range(n_ordinary + 4) if i not in special_ids])
    ids = ordinary[torch.randint(len(ordinary), (B, T), generator=gen)]
    for b, n in enumerate(torch.randint(T // 2, T + 1, (B,), generator=gen).tolist()):
        ids[b, 0], ids[b, n - 1] = cls, sep
        ids[b, n:] = pad
    return ids


def _rows(special_ids, B: int, T: int, name: str, words: bool, n_ordinary: int = 40, gap: int = 1, longest=4):
    """``(ids, word ids or None, word lengths or None)``: :func:`_sentences`, for ``mask_whole_words`` cut
    into words of 1 to ``longest`` tokens (numbered ``0, gap, 2 * gap, ...`` in each row, ``-1`` at the
    special tokens), with each token's word length."""
    ids = _sentences(special_ids, n_ordinary, B, T, name)
    if not words:
        return ids, None, None
    starts = torch.rand(B, T, generator=generator(name + ".words")) < 2 / (longest + 1)  # a new word begins
    words = torch.full((B, T), -1)
    for b in range(B):
        w, n = -1, 0
        for t in range(T):
            if int(ids[b, t]) in special_ids:
                n = 0
                continue
            if n == 0 or n == longest or bool(starts[b, t]):
                w, n = w + 1, 0
            words[b, t], n = w * gap, n + 1
    lengths = torch.where(words >= 0, (words.unsqueeze(2) == words.unsqueeze(1)).sum(2), 0)
    return ids, words, lengths


def _masking(g: Grader, fn, ids, special_ids, vocab_size, seed, p=None, words=None):
    """Call ``mask_tokens`` (``mask_whole_words`` when ``words`` are given) and check the exact parts of
    the rule, whatever the random draws: the types and shapes, the inputs left unchanged, labels,
    specials, whole words, untouched positions, valid replacements."""
    given = (ids,) if words is None else (ids, words)
    what = (
        f"{'mask_tokens' if words is None else 'mask_whole_words'}(input_ids {tuple(ids.shape)}"
        f"{'' if words is None else ', word_ids'}, special ids {special_ids}, vocab_size={vocab_size}"
        f"{'' if p is None else f', mlm_probability={p}'})"
    )
    args = (*(x.clone() for x in given), _special(*special_ids), vocab_size, _generator(seed))
    try:
        result = probe(fn, *args, *(() if p is None else (p,)))
    except Exception as e:  # noqa: BLE001
        raise_unless_student_error(e)
        g.fail(f"{what} raised {type(e).__name__.removeprefix('Student')}: {e}")
    out = result.result
    g.expect(
        type(out) in (tuple, list) and len(out) == 2,
        f"{what}: return a pair (inputs, labels), got {describe(out)}",
    )
    inputs, labels = out
    for name, x in (("inputs", inputs), ("labels", labels)):
        g.expect(
            is_tensor(x) and x.shape == ids.shape and x.dtype == torch.long,
            f"{what}: {name} should be a torch.long tensor of the input's shape {tuple(ids.shape)}, got {describe(x)}",
        )
    g.expect(
        all(torch.equal(a, b) for a, b in zip(result.args, given)),
        f"{what} changed {'its input_ids' if words is None else 'input_ids or word_ids'} in place: build new "
        "tensors (torch.where or .clone()) and leave the inputs as they were",
    )
    sel, is_special = labels != -100, torch.isin(ids, torch.tensor(special_ids))
    g.expect(
        bool((labels == -100).any()) or not bool(is_special.any()),
        f"{what}: labels has no -100 at all: labels must be -100 at every position that was not selected "
        "(only selected positions are predicted)",
    )
    g.expect(
        torch.equal(labels[sel], ids[sel]),
        f"{what}: labels must hold the original token id at the selected positions and -100 everywhere else "
        "(not the corrupted input, not 0)",
    )
    how = (
        "exclude them with torch.isin(input_ids, torch.tensor(special.ids))"
        if words is None
        else "word id -1"
    )
    g.expect(
        not bool((sel & is_special).any()),
        f"{what}: {int((sel & is_special).sum())} special tokens ([PAD], [CLS], [SEP], [MASK]) were selected: "
        f"never select a special token ({how})",
    )
    if words is not None:  # no word selected only in part: its tokens' least and largest choice agree
        W = int(words.max()) + 2 if words.numel() else 1
        at, s = torch.where(words >= 0, words, W - 1).long(), sel.long()  # specials in a column of their own
        lo = torch.ones(ids.shape[0], W, dtype=torch.long).scatter_reduce(1, at, s, "amin")
        split = int((lo < torch.zeros_like(lo).scatter_reduce(1, at, s, "amax"))[:, :-1].sum())
        g.expect(
            split == 0,
            f"{what}: {split} words were selected only in part: select each word as a whole (draw one number "
            "per word of each row, then give every token the choice of its word, e.g. with gather on word_ids)",
        )
    g.expect(
        torch.equal(inputs[~sel], ids[~sel]),
        f"{what}: an unselected position changed: only selected positions (labels != -100) may be corrupted",
    )
    new = inputs[sel]
    bad = new[
        (new != special_ids[3])
        & (torch.isin(new, torch.tensor(special_ids)) | (new < 0) | (new >= vocab_size))
    ]
    g.expect(
        len(bad) == 0,
        f"{what}: a selected position became {int(bad[0]) if len(bad) else ''}, a special token other than "
        "[MASK] or an id outside the vocabulary: draw random tokens from the ordinary ids only, the ids in "
        "[0, vocab_size) that are not in special.ids",
    )
    return inputs, labels, sel, is_special


def _proportions(g: Grader, fn, case) -> None:
    """The rule's proportions on ``B`` rows of 128 tokens: the selection rate (of the tokens, or of the
    words for ``mask_whole_words``), then 80/10/10 per token (and a word's tokens each on their own)."""
    special_ids, p, B, name, pass_p, words, gap = case
    ids, word_ids, lengths = _rows(special_ids, B, 128, name, words, gap=gap)
    inputs, _, sel, is_special = _masking(g, fn, ids, special_ids, 44, 7, p if pass_p else None, word_ids)
    rate = f"mlm_probability={p}" if pass_p else f"the default mlm_probability ({p})"
    if words:
        first = (word_ids >= 0) & torch.cat(
            [torch.ones(B, 1, dtype=torch.bool), word_ids[:, 1:] != word_ids[:, :-1]], 1
        )
        n, k = int(first.sum()), int((sel & first).sum())
        g.expect(
            _within(k, n, p),
            f"with {rate} you selected {k / max(n, 1):.1%} of the {n} words, expected about {p:.0%}: select each "
            "word (not each token) with probability mlm_probability, so that a long word is no likelier than a "
            "short one",
        )
    else:
        g.expect(
            not bool(sel[~is_special].all()) or p == 1,
            "labels has no -100 at any ordinary position: labels must be -100 at every position that was not selected",
        )
        n, k = int((~is_special).sum()), int(sel.sum())
        g.expect(
            _within(k, n, p),
            f"with {rate} you selected {k / n:.1%} of the {n} ordinary tokens, expected about {p:.0%}: select each "
            "non-special position with probability mlm_probability (torch.rand(shape, generator=generator) < "
            "mlm_probability)",
        )
    k, new, old = int(sel.sum()), inputs[sel], ids[sel]
    masked, kept = int((new == special_ids[3]).sum()), int((new == old).sum())
    swapped = int(((new != special_ids[3]) & (new != old)).sum())
    g.expect(
        masked < k,
        "every selected position became [MASK]: only 80% should; 10% get a random token and 10% keep their own",
    )
    for count, share, want, became in (
        (masked, 0.8, "80%", "became [MASK]"),
        (swapped, 0.1 * (1 - 1 / 40), "10%", "got a random token"),
        (kept, 0.1 + 0.1 / 40, "10%", "kept their token"),
    ):
        g.expect(
            _within(count, k, share), f"{count / k:.1%} of the selected positions {became}, expected {want}"
        )
    if words:
        three = sel & first & (lengths == 3)  # the first token of each selected word of three tokens
        fates = [inputs[b, t : t + 3] == special_ids[3] for b, t in three.nonzero().tolist()]
        mixed, n3 = sum(bool(m.any()) and not bool(m.all()) for m in fates), int(three.sum())
        g.expect(
            _within(mixed, n3, 1 - 0.8**3 - 0.2**3),
            f"of {n3} selected words of three tokens, {mixed} mix [MASK] with other tokens, expected about 48%: "
            "decide 80/10/10 for each token on its own (one draw per token), not once per word",
        )


def _edges(g: Grader, fn, case) -> None:
    """mlm_probability=0 selects nothing, mlm_probability=1 every ordinary token."""
    B, T, name, words = case
    ids, word_ids, _ = _rows(SPECIAL, B, T, name, words)
    _, _, sel, is_special = _masking(g, fn, ids, SPECIAL, 44, 1, 0.0, word_ids)
    g.expect(
        not bool(sel.any()),
        f"with mlm_probability=0 and input_ids {tuple(ids.shape)} you selected {int(sel.sum())} positions: "
        "nothing should be selected",
    )
    _, _, sel, is_special = _masking(g, fn, ids, SPECIAL, 44, 2, 1.0, word_ids)
    g.expect(
        torch.equal(sel, ~is_special),
        f"with mlm_probability=1 and input_ids {tuple(ids.shape)} every ordinary (non-special) position must be "
        "selected",
    )


def _uniform(g: Grader, fn, words: bool) -> None:
    """Random tokens are uniform over the ordinary ids, with the special ids scattered."""
    special_ids, vocab_size = (5, 0, 9, 2), 12  # [PAD] 5, [CLS] 0, [SEP] 9, [MASK] 2
    ordinary = [i for i in range(vocab_size) if i not in special_ids]
    ids = torch.full((128, 128), ordinary[0])
    ids[64:] = ordinary[-1]  # two original ids: every ordinary id is a replacement somewhere
    ids[:, 0], ids[:, -1] = 0, 9
    word_ids = torch.where(torch.isin(ids, torch.tensor(special_ids)), -1, torch.arange(128) // 2)
    inputs, _, sel, _ = _masking(g, fn, ids, special_ids, vocab_size, 5, 1.0, word_ids if words else None)
    for i in ordinary:
        elsewhere = sel & (ids != i)
        k, n_i = int(elsewhere.sum()), int((inputs[elsewhere] == i).sum())
        g.expect(
            _within(n_i, k, 0.1 / len(ordinary)),
            f"with special ids {special_ids} and vocab_size={vocab_size}, the random replacements should be "
            f"uniform over the {len(ordinary)} ordinary ids {ordinary} (about {0.1 / len(ordinary):.2%} of "
            f"the selected positions each), but id {i} replaced {n_i / k:.2%}: draw "
            "ordinary[torch.randint(len(ordinary), shape, generator=generator)]",
        )


def _seeded(g: Grader, fn, words: bool) -> None:
    """All randomness comes from the generator: seeds 3, 3 and 4."""
    special, name = (30, 31, 32, 33), "wwm.generator" if words else "mask.generator"
    given = [x for x in _rows(special, 16, 32, name, words, n_ordinary=30)[:2] if x is not None]
    what = f"{'mask_whole_words' if words else 'mask_tokens'}(...)"
    a, b, c = (call_student(g, what, fn, *given, _special(*special), 34, _generator(s)) for s in (3, 3, 4))
    g.expect(
        all(is_tensor(x) and is_tensor(y) and torch.equal(x, y) for x, y in zip(a, b)),
        "two calls with generators seeded alike gave different results: draw every random number with "
        "generator=generator (torch.rand(..., generator=generator), torch.randint(..., generator=generator))",
    )
    g.expect(
        not (torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])),
        "different seeds gave the same result: use the generator argument",
    )


def _fresh_call(case) -> Call:
    """A call of ``mask_tokens`` (or, with word ids, ``mask_whole_words``) where nothing changes."""
    ids, words, p = case
    given = [torch.tensor(x) for x in (ids, words) if x is not None]
    name = "mask_tokens" if words is None else "mask_whole_words"
    where = f"{name}(input_ids {[list(r) for r in ids]}, special ids {SPECIAL}, vocab_size=44, mlm_probability={p})"
    return Call(where, (*given, _special(*SPECIAL), 44, _generator(0), p))


_NEW_TENSORS = (
    "returns new tensors, never input_ids itself, also where nothing is selected (mlm_probability=0, rows of "
    "special tokens only)"
)


def _mask_rule(g: Grader, mask_tokens, case) -> None:
    B, T, V_, order, p, seed = case
    _masking(g, mask_tokens, _ints(seed, V_, B, T), tuple(order[:4]), V_, seed, p)


def _mask_specials_only(g: Grader, mask_tokens, _case) -> None:
    ids = torch.tensor([[41, 42, 40, 40], [41, 42, 40, 40]])
    inputs, _, sel, _ = _masking(g, mask_tokens, ids, SPECIAL, 44, 0)
    g.expect(
        not bool(sel.any()) and torch.equal(inputs, ids),
        "a row of [CLS] [SEP] [PAD] [PAD] has nothing to select: every label -100, the input unchanged",
    )


def _orders(with_gap: bool):
    """(B, T, V, a permutation of the V ids (its first four the special ids), p[, gap], seed)."""
    return st.tuples(st.integers(1, 4), st.integers(1, 12), st.integers(6, 12)).flatmap(
        lambda s: st.tuples(
            st.just(s[0]),
            st.just(s[1]),
            st.just(s[2]),
            st.permutations(list(range(s[2]))),
            st.sampled_from((0.15, 0.5, 1.0, 0.0)),
            *((st.integers(1, 3),) if with_gap else ()),
            st.integers(0, 2**16),
        )
    )


MASK_TOKENS = Spec(
    "mask_tokens",
    [
        Clause(
            "returns two new (B, T) torch.long tensors, leaves input_ids unchanged; labels hold the original id "
            "at selected positions and -100 elsewhere; specials never selected; only selected positions change",
            _mask_rule,
            _orders(False),
            key="mask.rule",
            budget="wider",
            examples=[(2, 6, 8, list(range(8)), 0.5, 0)],
        ),
        _fixed(
            "mlm_probability=0 selects nothing; mlm_probability=1 selects every ordinary token",
            _edges,
            (1, 1, "mask.edges.1", False),
            (3, 7, "mask.edges.3", False),
            public=2,
        ),
        _fixed(
            "the default mlm_probability selects 15% and corrupts 80/10/10 (16,000 tokens, specials appended)",
            _proportions,
            (SPECIAL, 0.15, 128, "mask.appended", False, False, 1),
        ),
        _fixed(
            "80/10/10 with the special tokens first, as in Google's BERT vocabulary ([PAD] = 0)",
            _proportions,
            ((0, 1, 2, 3), 0.15, 128, "mask.first", True, False, 1),
        ),
        _fixed(
            "mlm_probability=0.4 selects 40%", _proportions, (SPECIAL, 0.4, 64, "mask.rate", True, False, 1)
        ),
        _fixed(
            "random tokens are drawn uniformly from the ordinary ids, wherever the special ids are",
            _uniform,
            False,
        ),
        _fixed("all randomness comes from the generator argument", _seeded, False),
        _fixed("rows of special tokens only: nothing selected", _mask_specials_only, None),
        new_tensor(
            _fresh_call,
            examples=[
                (((41, 7, 8, 9, 42), (41, 3, 42, 40, 40)), None, 0.0),
                (((41, 42, 40, 40),), None, 0.15),
            ],
            text=_NEW_TENSORS,
        ),
    ],
)
check_mask_tokens, grade_mask_tokens = MASK_TOKENS.graders()


# --------------------------------------------------------------------------- mlm_loss


def _loss_case(seed: int, lead: tuple, V_: int, dtype=torch.float64, scale=2.0, keep=0.3):
    logits = tensor(seed, *lead, V_, dtype=dtype, scale=scale)
    labels = _ints(seed + 1, V_, *lead)
    chosen = torch.rand(lead, generator=torch.Generator().manual_seed(seed + 2)) < keep
    chosen.view(-1)[int(seed) % chosen.numel()] = True
    return logits, torch.where(chosen, labels, -100)


def _loss_mistakes(logits, labels):
    sel, d = labels != -100, logits.dtype
    ce = F.cross_entropy(logits.double().flatten(0, -2), labels.clamp(min=0).flatten(), reduction="none")
    ce = ce.view(labels.shape)
    return [
        (
            (ce[sel].sum() / labels.numel()).to(d),
            "the loss is averaged over all positions: divide by the number of selected positions (labels != -100), "
            "e.g. F.cross_entropy(..., ignore_index=-100)",
        ),
        (
            ce.mean().to(d),
            "unselected positions (label -100) count in the loss: ignore them (ignore_index=-100)",
        ),
        (ce[sel].sum().to(d), "that is the sum: return the mean over the selected positions"),
    ]


#: a worked example: position 0 is not selected; -log(3/4) at position 1 and -log(1/2) at position 2
_WORKED = (((0.0, 0.0), (0.0, math.log(3.0)), (5.0, 5.0)), (-100, 1, 0))


def _loss_values(g: Grader, mlm_loss, case) -> None:
    """``case``: ((leading axes, V, seed), dtype[, magnitude of the logits]), or the worked example."""
    if case == _WORKED:
        logits, labels = torch.tensor([_WORKED[0]], dtype=torch.float64), torch.tensor([_WORKED[1]])
        what = "for logits [[[0, 0], [0, log 3], [5, 5]]] and labels [[-100, 1, 0]] (the loss is (log 4/3 + log 2) / 2)"
    else:
        (lead, V_, seed), dtype, *scale = case
        logits, labels = _loss_case(seed, lead, V_, dtype, *scale)
        what = f"for {str(dtype).removeprefix('torch.')} logits {tuple(logits.shape)}"
        what += f" of magnitude {scale[0]:g}" if scale else f" and labels {labels.tolist()}"
    out = call_student(g, what, mlm_loss, logits.clone(), labels.clone())
    # cross_entropy ignores the label -100
    expected = F.cross_entropy(logits.double().flatten(0, -2), labels.flatten()).to(logits.dtype)
    g.expect(
        is_tensor(out) and out.dim() == 0 and out.dtype == logits.dtype,
        f"{what}: return a scalar (0-dimensional) tensor of the logits' dtype "
        f"{str(logits.dtype).removeprefix('torch.')}, got {describe(out)}",
    )
    first_match(g, out, [(x, f"{what}: {hint}") for x, hint in _loss_mistakes(logits, labels)], expected)
    g.expect(
        bool(torch.isfinite(out)),
        f"{what}: the loss is {float(out)}, expected {float(expected):.6g}: compute the log-softmax stably "
        "(F.cross_entropy or F.log_softmax, or subtract the largest logit before exp), not log(softmax(...)) or "
        "exp(...) / sum(exp(...))",
    )
    g.expect(
        close(out, expected, magnitude=magnitude(logits)),
        f"{what}: the loss should be {float(expected):.6g} (the mean cross-entropy over the positions with "
        f"labels != -100), got {float(out):.6g}",
    )


def _loss_ignores(g: Grader, mlm_loss, _case) -> None:
    logits, labels = _loss_case(5, (3, 8), 11)
    other = logits.clone()
    other[labels == -100] = rand("loss.ignore.other", int((labels == -100).sum()), 11, scale=5.0)
    a = call_student(g, "mlm_loss(logits, labels)", mlm_loss, logits, labels)
    b = call_student(g, "mlm_loss(other_logits, labels)", mlm_loss, other, labels)
    g.expect(
        is_tensor(a) and is_tensor(b) and close(a, b),
        "changing the logits at positions with label -100 changed the loss: only selected positions count",
    )


def _loss_gradient(g: Grader, mlm_loss, _case) -> None:
    logits, labels = _loss_case(9, (3, 8), 11)
    x, one = logits.clone().requires_grad_(), torch.tensor(1.0, dtype=torch.float64)
    p = probe(mlm_loss, logits.clone().requires_grad_(), labels.clone(), backward=(None, one))
    F.cross_entropy(x.reshape(-1, 11), labels.reshape(-1), ignore_index=-100).backward()
    g.expect(
        p.grads and p.grads[0] is not None,
        "the loss does not depend on the logits through autograd: avoid .item(), .detach() or .numpy()",
    )
    g.expect(close(p.grads[0], x.grad), "the gradient with respect to the logits differs from the reference")
    g.expect(
        is_tensor(p.args[0])
        and close(p.args[0].detach(), logits)
        and is_tensor(p.args[1])
        and torch.equal(p.args[1], labels),
        "mlm_loss changed its logits or labels in place: leave the inputs as they were",
    )


def _loss_shapes(g: Grader, mlm_loss, case) -> None:
    """``case``: the labels' shape for logits (2, 3, 5), and whether to read the message (once every
    shape raised: torch's own ValueError for (2, 4) names neither shape)."""
    shape, message = case
    logits, labels = rand("loss.shape", 2, 3, 5), torch.zeros(shape, dtype=torch.long)
    what = f"logits (2, 3, 5) and labels {shape}"
    if not message:
        fix = f"say that labels must have the shape (2, 3), and that they have {shape}"
        return expect_value_error(g, lambda: mlm_loss(logits, labels), what, fix)
    try:
        mlm_loss(logits, labels)
    except ValueError as e:
        g.expect(
            "2,3" in said(e).replace(" ", "") and "2,4" in said(e).replace(" ", ""),
            f"the ValueError for {what} should name the expected shape (2, 3) and the labels' shape (2, 4), "
            f"it says: {e}",
        )


_LEADS = st.tuples(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), st.integers(2, 7), SEEDS)
_DTYPES = st.sampled_from((torch.float64, torch.float32))

MLM_LOSS = Spec(
    "mlm_loss",
    [
        Clause(
            "a scalar of the logits' dtype: the mean cross-entropy over the positions with labels != -100, for "
            "logits (..., V) with any number of leading axes",
            _loss_values,
            st.tuples(_LEADS, _DTYPES),
            key="loss.values",
            budget="wide",
            first=(((2, 3), 4, 0), torch.float64),
            examples=[_WORKED, (((4,), 5, 3), torch.float64), (((2, 2, 3), 5, 3), torch.float64)],
            also=[(((3, 8), 11, 1), torch.float64)],
        ),
        Clause(
            "stable for large logits (hundreds to thousands), in float32 and float64",
            _loss_values,
            st.tuples(_LEADS, _DTYPES, st.sampled_from((300.0, 3000.0))),
            key="loss.stable",
            budget="more",
            first=(((2, 3), 4, 0), torch.float32, 3000.0),
            examples=[(((2, 3), 5, 4), torch.float32, 1000.0)],
        ),
        _fixed("logits at unselected positions do not matter", _loss_ignores, None),
        _fixed(
            "gradient: zero at unselected positions, (softmax - one-hot) / n at the n selected ones; the "
            "inputs are left unchanged",
            _loss_gradient,
            None,
        ),
        raises(
            lambda lead: Call(
                f"logits {(*lead, 11)} and every label -100",
                (_loss_case(2, lead, 11)[0], torch.full(lead, -100)),
            ),
            fix="the mean over no position is NaN: say that no position is selected",
            text="no selected position (every label -100) raises a ValueError",
            examples=[(3, 8)],
            also=[(5,)],
        ),
        _fixed(
            "labels whose shape is not logits.shape[:-1] raise a ValueError naming both shapes",
            _loss_shapes,
            ((2, 4), False),
            ((6,), False),
            ((2, 3, 1), False),
            ((3, 2), False),
            ((2, 4), True),
            public=2,
        ),
    ],
)
check_mlm_loss, grade_mlm_loss = MLM_LOSS.graders()


# --------------------------------------------------------------------------- ClsHead


def _cls_mistakes(w, h):
    lin = lambda x, n: F.linear(x, w[f"{n}.weight"], w[f"{n}.bias"])  # noqa: E731
    first = lin(h[:, 0], "pooler")
    return [
        (
            lin(torch.tanh(lin(h[:, -1], "pooler")), "classifier"),
            "you pooled the last position: BERT classifies from [CLS], the first position, h[:, 0]",
        ),
        (
            lin(torch.tanh(lin(h.mean(1), "pooler")), "classifier"),
            "you averaged over the positions: BERT's pooler reads only the [CLS] position, h[:, 0]",
        ),
        (lin(first, "classifier"), "the tanh is missing: pooled = torch.tanh(pooler(h[:, 0]))"),
        (
            torch.tanh(lin(first, "classifier")),
            "the tanh belongs after the pooler, not after the classifier: the logits are not squashed",
        ),
        (lin(torch.relu(first), "classifier"), "BERT's pooler uses tanh, not ReLU"),
    ]


def _cls_module(g: Grader, ClsHead, d_model: int, n_classes: int, name: str, dropout: float = 0.0):
    """The student's ``ClsHead`` with weights loaded (built once per check), the reference on them, the
    weights and the call that built it."""

    def make():
        what = f"ClsHead({d_model}, {n_classes}, {dropout})"
        m = call_student(g, what, ClsHead, d_model, n_classes, dropout).double().eval()
        w = random_weights(ref.ClsHead(d_model, n_classes), name)
        load_weights(g, m, w, "ClsHead")
        return m, _loaded(ref.ClsHead(d_model, n_classes, 0.0), w), w, what

    return _once(g, (name,), make)


def _cls_parts(g: Grader, ClsHead, case) -> None:
    args, p = case
    what, (d_model, n_classes) = f"ClsHead{args}", args[:2]
    m = call_student(g, what, ClsHead, *args)
    for name, shape in (("pooler", (d_model, d_model)), ("classifier", (d_model, n_classes))):
        layer = _has(g, m, what, name, "Linear", "linear")
        g.expect(
            (layer.in_features, layer.out_features) == shape,
            f"{what}: {name} should map {shape[0]} to {shape[1]} features, got "
            f"{layer.in_features} -> {layer.out_features}",
        )
    _has(g, m, what, "dropout", "Dropout", "dropout", p)


def _cls_values(g: Grader, ClsHead, case) -> None:
    B, T, d_model, n_classes, seed = case
    m, r, w, what = _cls_module(g, ClsHead, d_model, n_classes, f"cls.values.{d_model}.{n_classes}")
    h = tensor(seed, B, T, d_model)
    what = f"{what} on hidden {tuple(h.shape)}"
    formula = "classifier(dropout(tanh(pooler(h[:, 0]))))"
    _expect_output(g, call_student(g, what, m, h), r(h), _cls_mistakes(w, h), what, formula)


def _cls_position(g: Grader, ClsHead, _case) -> None:
    m = _cls_module(g, ClsHead, C, K, "cls.position")[0]
    h = rand("cls.position.h", 2, 5, C)
    h2 = h.clone()
    h2[:, 1:] = rand("cls.position.other", 2, 4, C)
    a, b = m(h), m(h2)
    g.expect(
        is_tensor(a) and is_tensor(b) and close(a, b),
        "changing positions 1 .. T-1 changed the logits: the head reads the [CLS] position only",
    )


def _cls_dropout(g: Grader, ClsHead, _case) -> None:
    m, _, w, what = _cls_module(g, ClsHead, C, K, "cls.dropout", dropout=0.5)
    zero = (
        torch.zeros(4, K, dtype=torch.float64),
        "with the dropout's p set to 1 the logits are 0: the dropout belongs before the classifier, "
        "not after it: classifier(dropout(tanh(pooler(h[:, 0]))))",
    )
    bias = (
        w["classifier.bias"].expand(4, K).clone(),
        "with the dropout's p set to 1 (training mode) the logits should be the classifier's bias (everything "
        "the classifier sees is dropped): apply self.dropout to the pooled vector, between the tanh and the "
        "classifier",
    )
    _dropout_at_one(g, m, (rand("cls.dropout.h", 4, 3, C),), what, zero, bias)


CLS_HEAD = Spec(
    "ClsHead",
    [
        _fixed(
            "has nn.Linear pooler (C -> C), an nn.Dropout dropout (p) and nn.Linear classifier (C -> K)",
            _cls_parts,
            ((C, K), 0.1),
            ((5, 2, 0.3), 0.3),
            ((3, 7, 0.0), 0.0),
        ),
        Clause(
            "matches classifier(tanh(pooler(h[:, 0]))) with loaded weights: any batch, length, width and classes",
            _cls_values,
            st.tuples(
                st.integers(1, 4),
                st.integers(1, 6),
                st.sampled_from((C, 5)),
                st.sampled_from((K, 1, 4)),
                SEEDS,
            ),
            key="cls.values",
            budget="wide",
            examples=[(2, 3, C, K, 0)],
        ),
        _fixed("only position 0 matters", _cls_position, None),
        _fixed(
            "dropout between the tanh and the classifier, only in training mode (its p set to 1)",
            _cls_dropout,
            None,
        ),
    ],
)
check_cls_head, grade_cls_head = CLS_HEAD.graders("cls_head")


# --------------------------------------------------------------------------- predict, then check


def _random_share() -> float:
    """Percent of ordinary tokens that ``mask_tokens`` replaces by a random token, on 256 x 1024 tokens
    of ``bert-small``'s vocabulary (1,028 ids): neither ``[MASK]`` nor the original afterwards. The
    binomial standard deviation of this share is about 0.024 percentage points."""
    special = ref.SpecialTokens.after(1024)
    ids = torch.randint(0, 1024, (256, 1024), generator=torch.Generator().manual_seed(6))  # (B, T)
    inputs, _ = ref.mask_tokens(ids, special, 1028, torch.Generator().manual_seed(7))
    return round(100 * float(((inputs != ids) & (inputs != special.mask)).double().mean()), 2)


RANDOM_SHARE = Prediction(
    name="predict_random_share",
    question="With BERT's masking (15% of the ordinary tokens selected, then 80/10/10), what percentage of "
    "all ordinary tokens ends up replaced by a random token?",
    tests="composing the two stages of the 80/10/10 rule: 10% of 15%",
    measure=_random_share,
    explanation="A token is replaced by a random one if it is selected (15%) and then draws the random branch "
    "(10% of those): 0.15 x 0.10 = 1.5% of all ordinary tokens; the measurement on 262,144 tokens gives "
    "{truth}. (A random token that happens to equal the original, 1 chance in 1,024 here, is not counted.) "
    "So the model sees a wrong token in only about 1 position in 67: enough that it cannot trust an "
    "unmasked input blindly, too few to damage the context.",
    rel=0.0,
    abs=0.25,
)

#: the choices of MLM_HEAD_PARAMS, in parameters
_HEAD_CHOICES = {"a": 30_522, "b": 622_650, "c": 23_440_896, "d": 24_063_546}


def _mlm_head_choice() -> str:
    base = ref.BERT_PRESETS["bert-base"]
    n = ref.bert_params(base, "mlm") - ref.bert_params(base, "none")
    return min(_HEAD_CHOICES, key=lambda c: abs(math.log(n) - math.log(_HEAD_CHOICES[c])))


MLM_HEAD_PARAMS = Prediction(
    name="predict_mlm_head_params",
    question="BERT-base (C = 768, V = 30,522) gets an MLM head on top of its encoder: a dense layer C -> C, a "
    "layer norm and an output layer C -> V with a bias, tied to the token embedding. How many parameters "
    "does the head add?",
    tests="weight tying: the C x V output matrix is the token embedding, so only its bias is new",
    measure=_mlm_head_choice,
    explanation="The output matrix is the token embedding itself, already counted, so the head adds only "
    "the dense layer (768 x 768 + 768), the layer norm (2 x 768) and the output bias (30,522): "
    "bert_params(base, 'mlm') - bert_params(base, 'none') = 622,650, answer {truth}. Untied, the 768 x "
    "30,522 output matrix alone would add 23.4 million parameters, a fifth of the whole model.",
    choices={
        "a": "about 30 thousand",
        "b": "about 0.6 million",
        "c": "about 23 million",
        "d": "about 24 million",
    },
)


def same_topic_choice(other_topic: float, same_topic: float) -> str:
    """SAME_TOPIC_NEGATIVES's letter for the overlap classifier's mean test accuracy with negatives of
    another topic and of the same topic: (c) within 8 points of 50%; (a) within 5 points of the other
    topic's; (d) more than 5 points above it; (b) from 60% up and at least 8 points below it. A mean of
    three seeds on 220 test pairs strays by about 2 points (one standard deviation), so between the
    bands no letter fits."""
    if abs(same_topic - 0.5) <= 0.08:
        return "c"
    if abs(same_topic - other_topic) <= 0.05:
        return "a"
    if same_topic > other_topic + 0.05:
        return "d"
    if 0.6 <= same_topic <= other_topic - 0.08:
        return "b"
    return f"no choice fits accuracies of {other_topic:.3f} (other topic) and {same_topic:.3f} (same topic)"


def _same_topic_negatives_choice() -> str:
    """The mean over the seeds of the committed runs of ``coursekit.experiments.nsp_negatives`` (its
    loader refuses a file the code would not write), as a letter."""
    from coursekit.experiments import nsp_negatives  # the loader, only when the question is graded

    runs = nsp_negatives.load_results()["runs"]
    other, same = (sum(r[k]["accuracy"] for r in runs) / len(runs) for k in nsp_negatives.NEGATIVES)
    return same_topic_choice(other, same)


SAME_TOPIC_NEGATIVES = Prediction(
    name="predict_same_topic_negatives",
    question="The chapter's word-overlap classifier (a logistic regression on the TF-IDF cosine and the word "
    "overlap of the two segments) gets most next-sentence pairs of 128-token segments right, since a negative "
    "B comes from another topic of the Python manual. Draw each negative from A's own topic instead: a segment "
    "of the same document that is neither A nor next to A. Everything else stays. What test accuracy does the "
    "classifier reach now?",
    tests="what a next-sentence negative gives away: mostly its topic, and also how much the text right after "
    "a passage goes on with its words",
    measure=_same_topic_negatives_choice,
    explanation="Answer {truth} (the check read the committed runs of coursekit.experiments.nsp_negatives, the "
    "mean over their seeds, against the same classifier with negatives from other topics on the same "
    "documents). Topic is most of what word overlap finds in next-sentence pairs, but not all. A passage of "
    "the manual goes on with the names, keywords and examples that the passage before it introduced, so the "
    "segment right after A shares more of A's words than a segment further on in the same topic, which shares "
    "only the topic's general vocabulary. With negatives from A's own topic the two numbers still separate "
    "many pairs: fewer than with negatives from another topic, and many more than a coin. Next-sentence "
    "prediction with random negatives therefore mixes three signals: the topic (which masked language "
    "modelling teaches already), this local cohesion, and the order. Sentence-order prediction keeps both "
    "segments of a pair and only swaps them, so topic and cohesion are the same for a pair and its swap and "
    "only the order is left to learn (Lan et al., 2020).",
    choices={
        "a": "about as high as with negatives from other topics: the classifier never relied on the topic",
        "b": "clearly above chance, but clearly below the accuracy with negatives from other topics",
        "c": "about chance (50%): within one topic, word overlap has nothing left to go on",
        "d": "higher than with negatives from other topics",
    },
)

check_predict_random_share, grade_predict_random_share = RANDOM_SHARE.graders()
check_predict_mlm_head_params, grade_predict_mlm_head_params = MLM_HEAD_PARAMS.graders()
check_predict_same_topic_negatives, grade_predict_same_topic_negatives = SAME_TOPIC_NEGATIVES.graders()


# --------------------------------------------------------------------------- experiment

#: the experiment's band, relative to the expectation p (0.8 + 0.1 (1 - 1/n)). The grader's inputs have
#: about 37,000 ordinary tokens, so the measured fraction strays from its expectation by at most 1.3% of
#: it (p = 0.15: standard deviation 0.0018 around 0.135); 7% is more than five standard deviations. The
#: classic mistakes land outside it: the selected share p (11% too high at p = 0.15), the [MASK] share
#: 0.8 p (11% too low), specials in the denominator (25% of the grader's positions: 25% too low).
CORRUPTED_BAND = 0.07
APPENDED, FIRST = (1024, 1025, 1026, 1027), (0, 1, 2, 3)  # special ids after 1,024 ordinary ones, or first


def _fraction(g: Grader, corrupted_fraction, case, *, mask_tokens=None):
    """``case``: (special ids, vocab size, mlm_probability (None: the default), seed of the ids, seed of the
    generator, B, T). Returns the call's text, its result (or ``mask_tokens``'s), the ids and the band."""
    special_ids, vocab_size, p, seed, gen_seed, B, T = case
    # (B, T) ordinary ids framed as [CLS] ... [SEP] [PAD] ...: a quarter of the positions are special
    ordinary = torch.tensor([i for i in range(vocab_size) if i not in special_ids])
    ids = ordinary[torch.randint(len(ordinary), (B, T), generator=torch.Generator().manual_seed(seed))]
    pad, cls, sep, _ = special_ids
    ids[:, 0], ids[:, T - T // 4 :], ids[:, T - T // 4 - 1] = cls, pad, sep
    where = f"corrupted_fraction(input_ids {tuple(ids.shape)}, special {special_ids}, {vocab_size}, generator"
    where += ")" if p is None else f", mlm_probability={p})"
    args = (ids, _special(*special_ids), vocab_size, _generator(gen_seed)) + (() if p is None else (p,))
    p = 0.15 if p is None else p
    expected = p * (0.8 + 0.1 * (1 - 1 / (vocab_size - len(special_ids))))
    band = (expected, expected * (1 - CORRUPTED_BAND), expected * (1 + CORRUPTED_BAND), p)
    fn, who = (corrupted_fraction, where) if mask_tokens is None else (mask_tokens, "your mask_tokens")
    return where, call_student(g, who, fn, *args), ids, band


def _fraction_type(g: Grader, corrupted_fraction, case) -> None:
    where, v, _, _ = _fraction(g, corrupted_fraction, case)
    g.expect(type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}")


def _fraction_in_band(g: Grader, corrupted_fraction, case) -> None:
    where, v, _, (expected, low, high, p) = _fraction(g, corrupted_fraction, case)
    why = (
        f"expected about {expected:.4f} = {p} x (0.8 + 0.1 x (1 - 1/{case[1] - 4})): count the ordinary "
        "positions whose token changed (kept tokens did not), divided by the number of ordinary positions "
        "(not of all positions); if Part 2's checks fail, fix mask_tokens first"
    )
    expect_in_band(g, where, v, low, high, why)


def _fraction_nothing(g: Grader, corrupted_fraction, case) -> None:
    where, v, _, _ = _fraction(g, corrupted_fraction, case)
    g.expect(v == 0, f"{where} gave {describe(v)}, expected 0.0: with nothing selected nothing changes")


def _fraction_seeded(g: Grader, corrupted_fraction, case) -> None:
    a, b, c = (_fraction(g, corrupted_fraction, (*case[:4], s, *case[5:]))[1] for s in (42, 42, 43))
    g.expect(
        a == b and a != c,
        f"two generators seeded alike gave {a!r} and {b!r}, and another seed gave {c!r}: pass the generator "
        "on to mask_tokens",
    )


def _fraction_procedure(g: Grader, corrupted_fraction, case) -> None:
    """Exactly one run of the notebook's own ``mask_tokens`` on the same seeded generator, counted over the
    ordinary positions (what :func:`~coursekit.grading.spec.procedure` states, with a reference that runs the
    student's ``mask_tokens``, which that constructor's reference cannot reach)."""
    where, got, ids, (_, low, high, _) = _fraction(g, corrupted_fraction, case)
    local = corrupted_fraction.__globals__ if isinstance(corrupted_fraction, FunctionType) else {}
    theirs = student_side("mask_tokens", local.get("mask_tokens", ref.mask_tokens))  # the notebook's own
    out = _fraction(g, corrupted_fraction, case, mask_tokens=theirs)[1]
    g.expect(
        isinstance(out, (tuple, list)) and len(out) == 2 and is_tensor(out[0]),
        "mask_tokens does not return (inputs, labels): fix Part 2 first",
    )
    ordinary = ~torch.isin(ids, torch.tensor(case[0]))
    want = int(((out[0] != ids) & ordinary).sum()) / int(ordinary.sum())
    number = isinstance(got, (int, float)) and not isinstance(got, bool)
    if number and abs(got - want) <= 1e-6 * want + 1e-12:
        return
    g.fail(
        f"{where} gave {got!r}, the stated procedure gives {want!r}"
        + (" (inside the band, so the procedure differs)" if number and low <= got <= high else "")
        + ": run your mask_tokens once, with the generator and mlm_probability you were given, and return the "
        "number of ordinary positions whose token changed divided by the number of ordinary positions"
    )


CORRUPTED_FRACTION = Spec(
    "corrupted_fraction",
    [
        _fixed("returns a Python float", _fraction_type, (APPENDED, 1028, None, 1, 2, 8, 64)),
        _fixed(
            f"the default mlm_probability (0.15) changes about 13.5% of the ordinary tokens (within "
            f"{CORRUPTED_BAND:.0%}), specials appended or first",
            _fraction_in_band,
            (APPENDED, 1028, None, 11, 111, 128, 384),
            (FIRST, 1028, None, 12, 112, 128, 384),
        ),
        _fixed(
            f"mlm_probability = 0.5 and 1.0, and a small vocabulary (within {CORRUPTED_BAND:.0%})",
            _fraction_in_band,
            (APPENDED, 1028, 0.5, 21, 121, 128, 384),
            (FIRST, 12, 1.0, 22, 122, 128, 384),
        ),
        _fixed(
            "mlm_probability = 0 changes nothing", _fraction_nothing, (APPENDED, 1028, 0.0, 31, 32, 8, 64)
        ),
        _fixed(
            "draws from its generator: the same seed gives the same result, another seed another",
            _fraction_seeded,
            (APPENDED, 1028, None, 41, 42, 32, 128),
        ),
        raises(
            lambda _: Call(
                "input_ids of special tokens only",
                (torch.tensor([[1025, 1026, 1024, 1024]]), _special(*APPENDED), 1028, _generator(0)),
            ),
            fix="the fraction would be 0 / 0",
            text="raises ValueError when input_ids holds no ordinary token",
            examples=[None],
        ),
        Clause(
            "is the stated procedure's result: one run of your mask_tokens on the generator given, the changed "
            "ordinary positions over all ordinary positions",
            _fraction_procedure,
            st.tuples(
                st.sampled_from([(APPENDED, 1028), (FIRST, 12), (FIRST, 1028)]),
                st.sampled_from([None, 0.3, 0.5, 1.0]),
                st.integers(100, 2**31 - 1),
                st.integers(100, 2**31 - 1),
            ).map(lambda d: (*d[0], *d[1:], 32, 128)),
            [(APPENDED, 1028, None, 51, 52, 128, 384)],
            key="fraction.procedure",
            budget="tiny",
            also=[(FIRST, 12, 0.5, 53, 54, 128, 384)],
        ),
    ],
)
check_corrupted_fraction, grade_corrupted_fraction = CORRUPTED_FRACTION.graders()


# --------------------------------------------------------------------------- stretch: whole-word masking


def _wwm_rule(g: Grader, mask_whole_words, case) -> None:
    B, T, V_, order, p, gap, seed = case
    ids, special_ids = _ints(seed, V_, B, T), tuple(order[:4])
    starts = torch.rand(B, T, generator=torch.Generator().manual_seed(seed)) < 0.5
    words = torch.where(torch.isin(ids, torch.tensor(special_ids)), -1, torch.cumsum(starts.long(), 1) * gap)
    _masking(g, mask_whole_words, ids, special_ids, V_, seed, p, words)


def _wwm_rows_apart(g: Grader, mask_whole_words, _case) -> None:
    ids = torch.full((64, 12), 5)
    ids[:, 0], ids[:, -1] = 41, 42
    words = torch.cat([torch.tensor([-1]), torch.arange(10), torch.tensor([-1])]).repeat(64, 1)
    _, _, sel, _ = _masking(g, mask_whole_words, ids, SPECIAL, 44, 3, 0.5, words)
    g.expect(
        len({tuple(r) for r in sel.tolist()}) > 1,
        "64 rows with the same word ids got the same selection: draw one number per word *of each row* "
        "(a (B, W) tensor), not one per word index shared by every row",
    )


_ROW, _WORDS = ((41, 7, 8, 9, 42),), ((-1, 0, 0, 1, -1),)

MASK_WHOLE_WORDS = Spec(
    "mask_whole_words",
    [
        Clause(
            "returns two new (B, T) torch.long tensors, inputs unchanged; labels, specials never selected, whole "
            "words selected together, only selected positions change (any shape, word ids with gaps)",
            _wwm_rule,
            _orders(True),
            key="wwm.rule",
            budget="wide",
            examples=[(2, 8, 8, list(range(8)), 0.5, 1, 0)],
        ),
        _fixed(
            "mlm_probability=0 selects nothing; mlm_probability=1 selects every ordinary token",
            _edges,
            (3, 9, "wwm.edges", True),
        ),
        _fixed(
            "the default mlm_probability selects 15% of the words; 80/10/10 per token (16,000 tokens)",
            _proportions,
            (SPECIAL, 0.15, 128, "wwm.default", False, True, 1),
        ),
        _fixed(
            "mlm_probability=0.4 selects 40% of the words, special tokens first ([PAD] = 0), word ids 0, 2, 4",
            _proportions,
            ((0, 1, 2, 3), 0.4, 64, "wwm.rate", True, True, 2),
        ),
        _fixed(
            "rows are masked independently: word w of row 0 and word w of row 1 are two words",
            _wwm_rows_apart,
            None,
        ),
        _fixed(
            "random tokens are drawn uniformly from the ordinary ids, wherever the special ids are",
            _uniform,
            True,
        ),
        _fixed("all randomness comes from the generator argument", _seeded, True),
        raises(
            lambda c: Call(
                c[3], (torch.tensor(c[0]), torch.tensor(c[1]), _special(*SPECIAL), 44, _generator(0), c[2])
            ),
            fix="say what was expected and what came",
            text="raises ValueError for mismatched shapes, 1-D input, a bad rate, or word ids that miss the specials",
            examples=[(_ROW, ((-1, 0, 0, 1),), 0.15, "word_ids (1, 4) for input_ids (1, 5)")],
            also=[
                (_ROW[0], _WORDS[0], 0.15, "1-D input_ids (5,)"),
                (_ROW, _WORDS, -0.1, "mlm_probability=-0.1"),
                (_ROW, _WORDS, 1.5, "mlm_probability=1.5"),
                (_ROW, ((-1, 0, -1, 1, -1),), 0.15, "word id -1 at the ordinary token 8"),
                (_ROW, ((0, 0, 0, 1, -1),), 0.15, "word id 0 at [CLS]"),
            ],
        ),
        new_tensor(
            _fresh_call,
            examples=[(_ROW, _WORDS, 0.0), (((41, 42, 40, 40),), ((-1, -1, -1, -1),), 0.5)],
            text=_NEW_TENSORS,
        ),
    ],
)
check_mask_whole_words, grade_mask_whole_words = MASK_WHOLE_WORDS.graders()
