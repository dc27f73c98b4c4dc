"""Checks for Exercise 6 (BERT: embeddings, masking, the MLM loss, the [CLS] head).

``check_*`` are the public checks: every clause the hidden checks grade, each on one small fixed
example. ``grade_*`` are the hidden ones: one named check per clause of the part's text and
docstring. Modules get random weights pushed with ``load_state_dict`` (so the submodule names of
the instructions matter) and are compared with :mod:`coursekit.bert` in float64 on examples drawn
across the allowed shapes (:func:`~coursekit.grading.core.for_all`: batch 1 and more, sequences of
1 to ``max_len`` tokens, several segment counts and widths). Each dropout is checked in isolation
and deterministically: with its ``p`` set to 1 (everything it sees becomes 0), and, at ``p = 0.5``,
every output of the embeddings must be 0 or twice the dropout-free value. ``mask_tokens`` is
random, so its checks never expect one particular random stream: they test the rule's exact
parts on any shape (specials never chosen, labels, untouched positions), and its proportions on
about 16,000 tokens with a generator the grader seeds (within five binomial standard deviations).

Under the autograder a ``torch.Generator`` or a :class:`~coursekit.bert.SpecialTokens` is not data
that can cross into the sandbox, so both are built there, from the notebook's own ``torch`` and
``SpecialTokens`` (imported by its locked first cell), beside the student's function.

Over 500 lines: one named check per clause of the exercise text for each graded part, public and
hidden, with the inputs that provoke each clause and the common mistakes each hint names; splitting
it would scatter one exercise's specification over several files.
"""

from __future__ import annotations

import math

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
    for_all,
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

__all__ = [
    "check_bert_embeddings",
    "check_mask_tokens",
    "check_mlm_loss",
    "check_cls_head",
    "grade_bert_embeddings",
    "grade_mask_tokens",
    "grade_mlm_loss",
    "grade_cls_head",
    "check_predict_random_share",
    "grade_predict_random_share",
    "check_predict_mlm_head_params",
    "grade_predict_mlm_head_params",
    "check_predict_same_topic_negatives",
    "grade_predict_same_topic_negatives",
    "check_corrupted_fraction",
    "grade_corrupted_fraction",
    "check_mask_whole_words",
    "grade_mask_whole_words",
]

V, MAXLEN, C, K = 30, 12, 16, 3
Z = 5.0  # binomial standard deviations a count may stray from its expectation


def _generator(seed: int):
    return student_side("torch", torch).Generator().manual_seed(seed)


def _special(pad: int, cls: int, sep: int, mask: int):
    return student_side("SpecialTokens", ref.SpecialTokens)(pad, cls, sep, mask)


def _within(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= Z * math.sqrt(n * p * (1 - p)) + 1


def _ints(seed: int, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(int(seed)))


def _has_dropout(g: Grader, m, what: str, p: float) -> None:
    layer = getattr(m, "dropout", None)
    g.expect(is_a(layer, "torch.nn.modules.dropout.Dropout"), f"{what} needs an nn.Dropout called dropout")
    g.expect(layer.p == p, f"{what}: dropout.p should be the dropout argument, {p}, got {layer.p}")


def _on_default_device(device: str, call):
    """``call()`` with torch's default device set to ``device`` where the student's code runs.

    With ``device="meta"``, a position tensor made without ``device=input_ids.device`` is a meta tensor, and
    an ``nn.Embedding`` of CPU weights looked up with it returns uninitialised memory instead of the rows: the
    output changes. Blocks of NaN are freed first, so that the memory handed out is unlikely to hold, by
    chance, the very rows an earlier computation left there."""
    t = student_side("torch", torch)
    for n in (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024):
        t.full((n,), float("nan"), dtype=torch.float64)
    with default_device(device):
        return call()


# --------------------------------------------------------------------------- BertEmbeddings


def _emb_reference(weights, n_segments=2, d_model=C, eps=1e-12, max_len=MAXLEN, dropout=0.0):
    r = ref.BertEmbeddings(V, max_len, d_model, n_segments, dropout, eps).double().eval()
    r.load_state_dict(weights)
    return r


def _layer_norm(x, weight, bias, eps):
    """Layer norm over the last axis, written out (``F.layer_norm`` spins up threads: slow on tiny inputs)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def _emb_mistakes(w, ids, seg, d_model=C, eps=1e-12):
    T = ids.shape[1]
    tok, pos, sg = w["token.weight"][ids], w["position.weight"][:T], w["segment.weight"][seg]
    norm = lambda x: _layer_norm(x, w["norm.weight"], w["norm.bias"], eps)  # noqa: E731
    shifted = w["position.weight"][1 : T + 1] if T < w["position.weight"].shape[0] else None
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
    if shifted is not None:
        out.append(
            (norm(tok + shifted + sg), "positions start at 0: use position(torch.arange(T)), not 1 .. T")
        )
    return out


class _Embeddings:
    """The student's ``BertEmbeddings`` of each configuration, built once with loaded weights."""

    def __init__(self, g: Grader, BertEmbeddings, name: str):
        self.g, self.cls, self.name, self.built = g, BertEmbeddings, name, {}

    def get(self, n_segments: int, d_model: int, eps: float = 1e-12, max_len: int = MAXLEN):
        key = (n_segments, d_model, eps, max_len)
        if key not in self.built:
            what = (
                f"BertEmbeddings({V}, {max_len}, {d_model}, n_segments={n_segments}, dropout=0.0, eps={eps})"
            )
            m = call_student(
                self.g, what, self.cls, V, max_len, d_model, n_segments=n_segments, dropout=0.0, eps=eps
            )
            m = m.double().eval()
            w = random_weights(ref.BertEmbeddings(V, max_len, d_model, n_segments), f"{self.name}.{key}")
            load_weights(self.g, m, w, "BertEmbeddings")
            self.built[key] = (m, w, _emb_reference(w, n_segments, d_model, eps, max_len), what)
        return self.built[key]


def _expect_embedding(g: Grader, out, expected, w, ids, seg, what: str, d_model=C, eps=1e-12) -> None:
    g.expect(
        is_tensor(out) and out.shape == expected.shape and out.dtype == expected.dtype,
        f"{what}: expected a float64 tensor of shape {tuple(expected.shape)}, got {describe(out)}",
    )
    first_match(
        g, out, [(x, f"{what}: {hint}") for x, hint in _emb_mistakes(w, ids, seg, d_model, eps)], expected
    )
    g.expect(close(out, expected), f"{what}: the output differs from norm(token + position + segment)")


def grade_bert_embeddings(BertEmbeddings) -> None:
    """Grade ``BertEmbeddings(vocab_size, max_len, d_model, n_segments=2, dropout=0.1, eps=1e-12)``."""
    g = Grader("BertEmbeddings")
    fresh = lambda: _Embeddings(g, BertEmbeddings, "emb")  # noqa: E731 (one per check: checks run in fresh processes)

    with g.check(
        "has nn.Embedding token (V, C), position (max_len, C), segment (n_segments, C), norm (eps) and "
        "an nn.Dropout dropout (p)"
    ):
        for args, kwargs, n_seg, p, eps in (
            ((V, MAXLEN, C), {}, 2, 0.1, 1e-12),
            ((V, 7, 5, 3, 0.3, 0.5), {}, 3, 0.3, 0.5),
            ((V, 4, 6), {"n_segments": 1, "eps": 1e-5, "dropout": 0.0}, 1, 0.0, 1e-5),
        ):
            what = f"BertEmbeddings{args}" + (f" with {kwargs}" if kwargs else "")
            m = call_student(g, what, BertEmbeddings, *args, **kwargs)
            max_len, d_model = args[1], args[2]
            shapes = (
                ("token", (V, d_model)),
                ("position", (max_len, d_model)),
                ("segment", (n_seg, d_model)),
            )
            for name, shape in shapes:
                layer = getattr(m, name, None)
                g.expect(
                    is_a(layer, "torch.nn.modules.sparse.Embedding"),
                    f"{what} needs an nn.Embedding called {name}",
                )
                got = tuple(layer.weight.shape)
                g.expect(got == shape, f"{what}: {name} should be an embedding of shape {shape}, got {got}")
            sd = m.state_dict()
            names = {"token.weight", "position.weight", "segment.weight", "norm.weight", "norm.bias"}
            g.expect(
                isinstance(sd, dict) and set(sd) == names,
                f"{what}: expected the parameters {sorted(names)}, got "
                f"{sorted(sd) if isinstance(sd, dict) else describe(sd)}",
            )
            got_eps = getattr(getattr(m, "norm", None), "eps", None)
            g.expect(
                got_eps == eps,
                f"{what}: the norm's eps should be {eps}, got {got_eps}: build it as LayerNorm(d_model, eps)",
            )
            _has_dropout(g, m, what, p)

    with g.check(
        "matches norm(token + position + segment) with loaded weights: any batch, 1 to max_len tokens, "
        "1 to 3 segments"
    ):
        modules = fresh()

        def test(case):
            B, T, n_seg, d_model, seed = case
            m, w, r, built = modules.get(n_seg, d_model)
            ids, seg = _ids_and_segments(seed, B, T, n_seg)
            what = f"{built}, input_ids {tuple(ids.shape)} and token_type_ids"
            out = call_student(g, what, m, ids, seg)
            _expect_embedding(g, out, r(ids, seg), w, ids, seg, what, d_model)

        sizes = st.tuples(
            st.integers(1, 3),
            st.integers(1, MAXLEN),
            st.integers(1, 3),
            st.sampled_from((C, 5)),
            st.integers(0, 2**16),
        )
        for_all("emb.values", sizes, test, first=(1, 3, 2, C, 0))

    with g.check("token_type_ids=None means segment 0 for every token"):
        modules = fresh()

        def test(case):
            B, T, seed = case
            m, w, r, built = modules.get(2, C)
            ids = _ids_and_segments(seed, B, T, 2)[0]
            what = f"{built} on input_ids {tuple(ids.shape)} without token_type_ids"
            out = call_student(g, what, m, ids)
            zeros = torch.zeros_like(ids)
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
            _expect_embedding(g, out, r(ids, zeros), w, ids, zeros, what)

        for_all(
            "emb.default",
            st.tuples(st.integers(1, 3), st.integers(1, MAXLEN), st.integers(0, 2**16)),
            test,
            max_examples=8,
            first=(2, 5, 0),
        )

    with g.check("the norm uses the eps argument"):
        modules = fresh()
        for eps in (0.5, 3.0):
            m, w, r, built = modules.get(2, C, eps)
            ids, seg = _ids_and_segments(7, 2, 6, 2)
            out = call_student(g, built, m, ids, seg)
            if is_tensor(out) and not close(out, r(ids, seg)) and close(out, _emb_reference(w)(ids, seg)):
                g.fail(
                    f"{built}: the output is the one with eps=1e-12: build the norm as LayerNorm(d_model, eps)"
                )
            _expect_embedding(g, out, r(ids, seg), w, ids, seg, f"{built}, input_ids (2, 6)", eps=eps)

    with g.check("more tokens than max_len raise a ValueError naming both numbers (max_len tokens work)"):
        modules = fresh()
        m, _, r, built = modules.get(2, C, 1e-12, 7)
        ids = _ids_and_segments(3, 2, 7, 2)[0]
        out = call_student(g, f"{built} on input_ids (2, 7)", m, ids)
        g.expect(
            is_tensor(out) and out.shape == (2, 7, C),
            f"{built} on input_ids (2, 7) (max_len tokens) should give "
            f"a (2, 7, {C}) tensor, got {describe(out)}",
        )
        for T in (9, 8):
            ids = _ids_and_segments(3, 1, T, 2)[0]
            expect_value_error(
                g,
                lambda ids=ids: m(ids),
                f"input_ids (1, {T}) and max_len=7",
                f"say that the input has {T} tokens but the model only {7} positions",
            )
            try:
                m(ids)
            except ValueError as e:
                g.expect(
                    str(T) in said(e) and "7" in said(e),
                    f"the ValueError for input_ids (1, {T}) and max_len=7 should name both numbers, it says: {e}",
                )

    with g.check("dropout after the norm, only in training mode (checked with its p set to 1, and at 0.5)"):
        m = call_student(
            g, f"BertEmbeddings({V}, {MAXLEN}, {C}, 2, 0.5)", BertEmbeddings, V, MAXLEN, C, 2, 0.5
        ).double()
        w = random_weights(ref.BertEmbeddings(V, MAXLEN, C), "emb.dropout")
        load_weights(g, m, w, "BertEmbeddings")
        ids, seg = _ids_and_segments(11, 8, MAXLEN, 2)
        own = m.eval()(ids, seg)  # the student's output without dropout: this check grades the dropout alone
        again = m(ids, seg)
        g.expect(
            is_tensor(own)
            and is_tensor(again)
            and close(own, again)
            and float((own == 0).double().mean()) < 0.05,
            "in eval mode dropout must do nothing (two calls in eval mode differ, or hold zeros): use "
            "nn.Dropout, which follows the module's train() and eval()",
        )
        set_attr(m.dropout, "p", 1.0)
        out = m.train()(ids, seg)
        if is_tensor(out) and out.shape == own.shape and close(out, w["norm.bias"].expand_as(own).clone()):
            g.fail(
                "with the dropout's p set to 1 the output is the norm's bias: the dropout comes before the norm; "
                "apply it after: dropout(norm(x))"
            )
        g.expect(
            is_tensor(out) and close(out, torch.zeros_like(own)),
            f"with the dropout's p set to 1 (training mode) every output should be 0 (got {describe(out)}): "
            "the output is dropout(norm(x)), and the module's dropout is self.dropout",
        )
        g.expect(
            close(m.eval()(ids, seg), own),
            "with the dropout's p set to 1, eval mode must still give the output without dropout",
        )
        set_attr(m.dropout, "p", 0.5)
        out = m.train()(ids, seg)
        g.expect(
            is_tensor(out) and out.shape == own.shape,
            f"in training mode: expected a tensor of shape {tuple(own.shape)}, got {describe(out)}",
        )
        dropped = out == 0
        zeros = float(dropped.double().mean())
        g.expect(
            0.35 < zeros < 0.65,
            f"in training mode with dropout=0.5 about half the outputs should be exactly 0, "
            f"got {zeros:.0%}: apply nn.Dropout(dropout) to the normalised sum",
        )
        g.expect(
            close(out, torch.where(dropped, torch.zeros_like(own), 2 * own)),
            "in training mode with dropout=0.5 every output should be 0 or twice the output in eval mode "
            "(nn.Dropout scales what it keeps by 1 / (1 - p)): apply the dropout once, to norm(...), and "
            "nowhere else",
        )

    with g.check("positions (and default segment ids) are made on input_ids' device"):
        m, w, r, built = _Embeddings(g, BertEmbeddings, "emb.device").get(2, C)  # weights no other check uses
        ids = _ids_and_segments(5, 2, 6, 2)[0]
        try:  # first, so that no memory freed by an earlier call of this module holds its positions' values
            out = _on_default_device("meta", lambda: m(ids))
        except Exception as e:  # noqa: BLE001
            if "meta" not in str(
                e
            ):  # moving a tensor made on the default device with .to(input_ids.device) is fine
                raise_unless_student_error(e)
                g.fail(
                    f"with torch's default device set elsewhere ('meta') and input_ids on the CPU, your code raised "
                    f"{type(e).__name__.removeprefix('Student')}: {e}"
                )
        else:
            own = call_student(g, f"{built} on input_ids (2, 6)", m, ids)
            g.expect(
                is_tensor(out) and is_tensor(own) and close(out, own),
                "with torch's default device set elsewhere (torch.set_default_device('meta')) and input_ids on "
                "the CPU, the output changed: make positions with torch.arange(T, device=input_ids.device) "
                "(and default segment ids with torch.zeros_like(input_ids)), so that they are on input_ids' "
                "device",
            )

    g.finish()


def _ids_and_segments(seed: int, B: int, T: int, n_segments: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _ints(seed, V, B, T), _ints(seed + 1, n_segments, B, T)


def check_bert_embeddings(BertEmbeddings) -> None:
    """Public: ``BertEmbeddings(10, 6, 4, 3, 0.2, 1e-6)`` with loaded weights, against the formula on a small batch."""
    g = Grader("BertEmbeddings (public)")
    what = "BertEmbeddings(10, 6, 4, 3, 0.2, 1e-6)"
    w = random_weights(ref.BertEmbeddings(10, 6, 4, 3), "public.emb")
    r = ref.BertEmbeddings(10, 6, 4, 3, 0.0, 1e-6).double().eval()
    r.load_state_dict(w)
    ids, seg = torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([[0, 2, 1], [0, 1, 1]])

    def loaded():  # built in each check: under the autograder every check runs in a fresh process
        m = call_student(g, what, BertEmbeddings, 10, 6, 4, 3, 0.2, 1e-6).double().eval()
        load_weights(g, m, w, "BertEmbeddings")
        return m

    with g.check(
        "submodules token (10, 4), position (6, 4), segment (3, 4) embeddings, norm (eps) and dropout (p)"
    ):
        m = call_student(g, what, BertEmbeddings, 10, 6, 4, 3, 0.2, 1e-6)
        sd = m.state_dict()
        g.expect(
            isinstance(sd, dict) and set(sd) == set(w),
            f"expected parameters {sorted(w)}, got {sorted(sd) if isinstance(sd, dict) else describe(sd)}",
        )
        g.expect(
            getattr(getattr(m, "norm", None), "eps", None) == 1e-6,
            "the norm's eps should be the eps argument",
        )
        _has_dropout(g, m, what, 0.2)
    with g.check("with loaded weights, equals norm(token + position + segment) on input_ids (2, 3)"):
        out = call_student(g, "m(input_ids, token_type_ids)", loaded(), ids, seg)
        _expect_embedding(g, out, r(ids, seg), w, ids, seg, "on input_ids (2, 3)", 4, 1e-6)
    with g.check("token_type_ids=None means segment 0"):
        out = loaded()(ids)
        g.expect(is_tensor(out) and close(out, r(ids)), "m(input_ids) should use segment 0 everywhere")
    with g.check("7 tokens with max_len=6 raise a ValueError naming both numbers"):
        m = loaded()
        expect_value_error(
            g,
            lambda: m(torch.zeros(1, 7, dtype=torch.long)),
            "input_ids (1, 7) and max_len=6",
            "the input has 7 tokens, the model 6 positions",
        )
    with g.check("dropout after the norm in training mode: with its p set to 1 every output is 0"):
        m = loaded()
        set_attr(m.dropout, "p", 1.0)
        out = m.train()(ids, seg)
        g.expect(
            is_tensor(out) and close(out, torch.zeros(2, 3, 4, dtype=torch.float64)),
            f"got {describe(out)} with values that are not all 0: return self.dropout(self.norm(x))",
        )
    with g.check("positions are made on input_ids' device (torch.arange(T, device=input_ids.device))"):
        m = loaded()
        try:  # before any other call of this module (see grade_bert_embeddings)
            out = _on_default_device("meta", lambda: m(ids, seg))
        except Exception as e:  # noqa: BLE001
            if "meta" not in str(e):
                raise
        else:
            own = m(ids, seg)
            g.expect(
                is_tensor(out) and is_tensor(own) and close(out, own),
                "with torch.set_default_device('meta') the output changed: make positions on input_ids.device",
            )
    g.finish()


# --------------------------------------------------------------------------- mask_tokens


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


def _masked(g: Grader, mask_tokens, ids, special_ids, vocab_size, seed, p=None):
    """Call ``mask_tokens`` and check the exact parts of the rule (whatever the random draws):
    the types and shapes, the input left unchanged, labels, specials, untouched positions."""
    args = (ids.clone(), _special(*special_ids), vocab_size, _generator(seed)) + (() if p is None else (p,))
    what = (
        f"mask_tokens(input_ids {tuple(ids.shape)}, special ids {special_ids}, vocab_size={vocab_size}"
        + ("" if p is None else f", mlm_probability={p}")
        + ")"
    )
    try:
        result = probe(mask_tokens, *args)
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
            f"{what}: {name} should be a torch.long tensor of the input's shape {tuple(ids.shape)}, got "
            f"{describe(x)}",
        )
    g.expect(
        torch.equal(result.args[0], ids),
        f"{what} changed its input_ids in place: build new tensors "
        "(torch.where or .clone()) and leave the input as it was",
    )
    sel = labels != -100
    is_special = torch.isin(ids, torch.tensor(special_ids))
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
    chosen = int((sel & is_special).sum())
    g.expect(
        chosen == 0,
        f"{what}: {chosen} special tokens ([PAD], [CLS], [SEP], [MASK]) were selected: never select "
        "a special token (exclude them with torch.isin(input_ids, torch.tensor(special.ids)))",
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
        f"{what}: a selected position became {int(bad[0]) if len(bad) else ''}, a special "
        "token other than [MASK] or an id outside the vocabulary: draw random tokens from the "
        "ordinary ids only, the ids in [0, vocab_size) that are not in special.ids",
    )
    return inputs, labels, sel, is_special


def _proportions(
    g: Grader, mask_tokens, special_ids, n_ordinary=40, p=0.15, B=128, T=128, name="mask", pass_p=True
) -> None:
    """The rule's proportions on ``B * T`` tokens: the selection rate, then 80/10/10."""
    ids = _sentences(special_ids, n_ordinary, B, T, name)
    inputs, labels, sel, is_special = _masked(
        g, mask_tokens, ids, special_ids, n_ordinary + 4, 7, p if pass_p else None
    )
    g.expect(
        not bool(sel[~is_special].all()) or p == 1,
        "labels has no -100 at any ordinary position: labels must be -100 at every position that was not selected",
    )
    n, k = int((~is_special).sum()), int(sel.sum())
    rate = f"mlm_probability={p}" if pass_p else f"the default mlm_probability ({p})"
    g.expect(
        _within(k, n, p),
        f"with {rate} you selected {k / n:.1%} of the {n} ordinary tokens, expected about "
        f"{p:.0%}: select each non-special position with probability mlm_probability "
        "(torch.rand(shape, generator=generator) < mlm_probability)",
    )
    new, old = inputs[sel], ids[sel]
    masked = int((new == special_ids[3]).sum())
    g.expect(
        masked < k,
        "every selected position became [MASK]: only 80% should; 10% get a random token and 10% "
        "keep their own",
    )
    swapped = new[(new != special_ids[3]) & (new != old)]
    g.expect(
        _within(masked, k, 0.8), f"{masked / k:.1%} of the selected positions became [MASK], expected 80%"
    )
    g.expect(
        _within(len(swapped), k, 0.1 * (1 - 1 / n_ordinary)),
        f"{len(swapped) / k:.1%} of the selected positions got a random token, expected 10%",
    )
    kept = int((new == old).sum())
    g.expect(
        _within(kept, k, 0.1 + 0.1 / n_ordinary),
        f"{kept / k:.1%} of the selected positions kept their token, expected 10%",
    )


def grade_mask_tokens(mask_tokens) -> None:
    """Grade ``mask_tokens(input_ids, special, vocab_size, generator, mlm_probability=0.15)``."""
    g = Grader("mask_tokens")

    with g.check(
        "returns two new (B, T) torch.long tensors, leaves input_ids unchanged; labels hold the original id "
        "at selected positions and -100 elsewhere; specials never selected; only selected positions change"
    ):

        def test(case):
            B, T, V_, order, p, seed = case
            special_ids = tuple(order[:4])
            ids = _ints(seed, V_, B, T)
            _masked(g, mask_tokens, ids, special_ids, V_, seed, p)

        shapes = st.tuples(st.integers(1, 4), st.integers(1, 12), st.integers(6, 12)).flatmap(
            lambda s: st.tuples(
                st.just(s[0]),
                st.just(s[1]),
                st.just(s[2]),
                st.permutations(list(range(s[2]))),
                st.sampled_from((0.15, 0.5, 1.0, 0.0)),
                st.integers(0, 2**16),
            )
        )
        for_all("mask.rule", shapes, test, max_examples=25, first=(2, 6, 8, list(range(8)), 0.5, 0))

    with g.check("mlm_probability=0 selects nothing; mlm_probability=1 selects every ordinary token"):
        for B, T in ((1, 1), (3, 7)):
            ids = _sentences((40, 41, 42, 43), 40, B, T, f"mask.edges.{B}")
            inputs, labels, sel, is_special = _masked(g, mask_tokens, ids, (40, 41, 42, 43), 44, 1, 0.0)
            g.expect(
                not bool(sel.any()),
                f"with mlm_probability=0 and input_ids {tuple(ids.shape)} you selected "
                f"{int(sel.sum())} positions: nothing should be selected",
            )
            inputs, labels, sel, is_special = _masked(g, mask_tokens, ids, (40, 41, 42, 43), 44, 2, 1.0)
            g.expect(
                torch.equal(sel, ~is_special),
                f"with mlm_probability=1 and input_ids {tuple(ids.shape)} every "
                "ordinary (non-special) position must be selected",
            )

    with g.check(
        "the default mlm_probability selects 15% and corrupts 80/10/10 (16,000 tokens, specials appended)"
    ):
        _proportions(g, mask_tokens, (40, 41, 42, 43), name="mask.appended", pass_p=False)

    with g.check("80/10/10 with the special tokens first, as in Google's BERT vocabulary ([PAD] = 0)"):
        _proportions(g, mask_tokens, (0, 1, 2, 3), name="mask.first")

    with g.check("mlm_probability=0.4 selects 40%"):
        _proportions(g, mask_tokens, (40, 41, 42, 43), p=0.4, B=64, name="mask.rate")

    with g.check("random tokens are drawn uniformly from the ordinary ids, wherever the special ids are"):
        special_ids, vocab_size = (5, 0, 9, 2), 12  # [PAD] 5, [CLS] 0, [SEP] 9, [MASK] 2
        ordinary = [i for i in range(vocab_size) if i not in special_ids]
        ids = torch.full((128, 128), ordinary[0])
        ids[64:] = ordinary[-1]  # two original ids: every ordinary id is a replacement somewhere
        ids[:, 0], ids[:, -1] = 0, 9
        inputs, _, sel, _ = _masked(g, mask_tokens, ids, special_ids, vocab_size, 5, 1.0)
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

    with g.check("all randomness comes from the generator argument"):
        ids = _sentences((30, 31, 32, 33), 30, 16, 32, "mask.generator")
        special = _special(30, 31, 32, 33)
        a = call_student(g, "mask_tokens(...)", mask_tokens, ids, special, 34, _generator(3))
        b = call_student(g, "mask_tokens(...)", mask_tokens, ids, special, 34, _generator(3))
        c = call_student(g, "mask_tokens(...)", mask_tokens, ids, special, 34, _generator(4))
        same = all(is_tensor(x) and is_tensor(y) and torch.equal(x, y) for x, y in zip(a, b))
        g.expect(
            same,
            "two calls with generators seeded alike gave different results: draw every random number "
            "with generator=generator (torch.rand(..., generator=generator), "
            "torch.randint(..., generator=generator))",
        )
        g.expect(
            not (torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])),
            "different seeds gave the same result: use the generator argument",
        )

    with g.check("rows of special tokens only: nothing selected"):
        ids = torch.tensor([[41, 42, 40, 40], [41, 42, 40, 40]])
        inputs, labels, sel, _ = _masked(g, mask_tokens, ids, (40, 41, 42, 43), 44, 0)
        g.expect(
            not bool(sel.any()) and torch.equal(inputs, ids),
            "a row of [CLS] [SEP] [PAD] [PAD] has nothing to select: every label -100, the input unchanged",
        )

    g.finish()


def check_mask_tokens(mask_tokens) -> None:
    """Public: the rule on 4,096 tokens (looser bounds than the hidden checks would allow alone)."""
    g = Grader("mask_tokens (public)")
    with g.check(
        "two new (B, T) long tensors, input unchanged, labels, specials never chosen (input_ids (2, 5))"
    ):
        ids = torch.tensor([[41, 7, 8, 9, 42], [41, 3, 42, 40, 40]])
        _masked(g, mask_tokens, ids, (40, 41, 42, 43), 44, 0, 0.5)
    with g.check(
        "mlm_probability=1 selects every ordinary token, 0 none; a row of specials has nothing to select"
    ):
        _, _, sel, _ = _masked(g, mask_tokens, torch.tensor([[41, 42, 40, 40]]), (40, 41, 42, 43), 44, 0, 1.0)
        g.expect(
            not bool(sel.any()), "[CLS] [SEP] [PAD] [PAD] has nothing to select, even with mlm_probability=1"
        )
        ids = torch.tensor([[41, 7, 8, 9, 42]])
        _, _, sel, is_special = _masked(g, mask_tokens, ids, (40, 41, 42, 43), 44, 0, 1.0)
        g.expect(
            torch.equal(sel, ~is_special), "with mlm_probability=1 every ordinary position must be selected"
        )
        _, _, sel, _ = _masked(g, mask_tokens, ids, (40, 41, 42, 43), 44, 0, 0.0)
        g.expect(not bool(sel.any()), "with mlm_probability=0 nothing may be selected")
    with g.check("masking 64 rows of 64 tokens: 15% by default, 80/10/10"):
        _proportions(g, mask_tokens, (40, 41, 42, 43), B=64, T=64, name="public.mask", pass_p=False)
    with g.check("specials first ([PAD] = 0): replacements are ordinary ids"):
        _proportions(g, mask_tokens, (0, 1, 2, 3), B=32, T=64, name="public.first", p=0.5)
    with g.check("random tokens are uniform over the ordinary ids (specials at 5, 0, 9, 2 of 12 ids)"):
        ids = torch.full((64, 64), 1)
        ids[32:] = 11
        inputs, _, sel, _ = _masked(g, mask_tokens, ids, (5, 0, 9, 2), 12, 5, 1.0)
        for i in (1, 3, 4, 6, 7, 8, 10, 11):
            elsewhere = sel & (ids != i)
            k, n_i = int(elsewhere.sum()), int((inputs[elsewhere] == i).sum())
            g.expect(
                _within(n_i, k, 0.1 / 8),
                f"id {i} replaced {n_i / k:.2%} of the selected positions, expected "
                "1.25% for each of the 8 ordinary ids",
            )
    with g.check("the same seed gives the same masks"):
        ids = _sentences((30, 31, 32, 33), 30, 4, 16, "public.generator")
        a = mask_tokens(ids, _special(30, 31, 32, 33), 34, _generator(3))
        b = mask_tokens(ids, _special(30, 31, 32, 33), 34, _generator(3))
        g.expect(
            all(is_tensor(x) and is_tensor(y) and torch.equal(x, y) for x, y in zip(a, b)),
            "draw every random number with generator=generator",
        )
    g.finish()


# --------------------------------------------------------------------------- mlm_loss


def _loss_case(seed: int, lead: tuple, V_: int, dtype=torch.float64, scale=2.0, keep=0.3):
    logits = tensor(seed, *lead, V_, dtype=dtype, scale=scale)
    labels = _ints(seed + 1, V_, *lead)
    chosen = torch.rand(lead, generator=torch.Generator().manual_seed(seed + 2)) < keep
    chosen.view(-1)[int(seed) % chosen.numel()] = True
    return logits, torch.where(chosen, labels, -100)


def _loss_reference(logits, labels):
    V_ = logits.shape[-1]
    return F.cross_entropy(logits.double().reshape(-1, V_), labels.reshape(-1), ignore_index=-100).to(
        logits.dtype
    )


def _loss_mistakes(logits, labels):
    V_ = logits.shape[-1]
    sel = labels != -100
    ce = F.cross_entropy(logits.double().reshape(-1, V_), labels.clamp(min=0).reshape(-1), reduction="none")
    ce = ce.view(labels.shape)
    d = logits.dtype
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


def _expect_loss(g: Grader, mlm_loss, logits, labels, what: str) -> None:
    out = call_student(g, what, mlm_loss, logits.clone(), labels.clone())
    expected = _loss_reference(logits, labels)
    g.expect(
        is_tensor(out) and out.dim() == 0 and out.dtype == logits.dtype,
        f"{what}: return a scalar (0-dimensional) tensor of the logits' dtype "
        f"{str(logits.dtype).removeprefix('torch.')}, got {describe(out)}",
    )
    first_match(g, out, [(x, f"{what}: {hint}") for x, hint in _loss_mistakes(logits, labels)], expected)
    g.expect(
        bool(torch.isfinite(out)),
        f"{what}: the loss is {float(out)}, expected {float(expected):.6g}: compute "
        "the log-softmax stably (F.cross_entropy or F.log_softmax, or subtract the "
        "largest logit before exp), not log(softmax(...)) or exp(...) / sum(exp(...))",
    )
    g.expect(
        close(out, expected, magnitude=magnitude(logits)),
        f"{what}: the loss should be {float(expected):.6g} (the mean cross-entropy over the positions with "
        f"labels != -100), got {float(out):.6g}",
    )


def _shapes():
    return st.tuples(
        st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
        st.integers(2, 7),
        st.integers(0, 2**16),
    )


def grade_mlm_loss(mlm_loss) -> None:
    """Grade ``mlm_loss(logits, labels)``."""
    g = Grader("mlm_loss")

    with g.check(
        "a scalar of the logits' dtype: the mean cross-entropy over the positions with labels != -100, for "
        "logits (..., V) with any number of leading axes"
    ):

        def test(case):
            (lead, V_, seed), dtype = case
            logits, labels = _loss_case(seed, lead, V_, dtype)
            _expect_loss(
                g,
                mlm_loss,
                logits,
                labels,
                f"for {str(dtype).removeprefix('torch.')} logits "
                f"{tuple(logits.shape)} and labels {labels.tolist()}",
            )

        logits, labels = _loss_case(1, (3, 8), 11)
        _expect_loss(g, mlm_loss, logits, labels, "for logits (3, 8, 11)")
        for_all(
            "loss.values",
            st.tuples(_shapes(), st.sampled_from((torch.float64, torch.float32))),
            test,
            first=(((2, 3), 4, 0), torch.float64),
        )

    with g.check("stable for large logits (hundreds to thousands), in float32 and float64"):

        def test(case):
            (lead, V_, seed), dtype, scale = case
            logits, labels = _loss_case(seed, lead, V_, dtype, scale)
            _expect_loss(
                g,
                mlm_loss,
                logits,
                labels,
                f"for {str(dtype).removeprefix('torch.')} logits "
                f"{tuple(logits.shape)} of magnitude {scale:g}",
            )

        for_all(
            "loss.stable",
            st.tuples(
                _shapes(), st.sampled_from((torch.float64, torch.float32)), st.sampled_from((300.0, 3000.0))
            ),
            test,
            max_examples=12,
            first=(((2, 3), 4, 0), torch.float32, 3000.0),
        )

    with g.check("logits at unselected positions do not matter"):
        logits, labels = _loss_case(5, (3, 8), 11)
        other = logits.clone()
        other[labels == -100] = rand("loss.ignore.other", int((labels == -100).sum()), 11, scale=5.0)
        a = call_student(g, "mlm_loss(logits, labels)", mlm_loss, logits, labels)
        b = call_student(g, "mlm_loss(other_logits, labels)", mlm_loss, other, labels)
        g.expect(
            is_tensor(a) and is_tensor(b) and close(a, b),
            "changing the logits at positions with label -100 changed the loss: only selected positions count",
        )

    with g.check(
        "gradient: zero at unselected positions, (softmax - one-hot) / n at the n selected ones; the "
        "inputs are left unchanged"
    ):
        logits, labels = _loss_case(9, (3, 8), 11)
        p = probe(
            mlm_loss,
            logits.clone().requires_grad_(),
            labels.clone(),
            backward=(None, torch.tensor(1.0, dtype=torch.float64)),
        )
        x = logits.clone().requires_grad_()
        F.cross_entropy(x.reshape(-1, 11), labels.reshape(-1), ignore_index=-100).backward()
        g.expect(
            p.grads and p.grads[0] is not None,
            "the loss does not depend on the logits through autograd: avoid .item(), .detach() or .numpy()",
        )
        g.expect(
            close(p.grads[0], x.grad), "the gradient with respect to the logits differs from the reference"
        )
        g.expect(
            is_tensor(p.args[0])
            and close(p.args[0].detach(), logits)
            and is_tensor(p.args[1])
            and torch.equal(p.args[1], labels),
            "mlm_loss changed its logits or labels in place: leave the inputs as they were",
        )

    with g.check("no selected position (every label -100) raises a ValueError"):
        for lead in ((3, 8), (5,)):
            logits, _ = _loss_case(2, lead, 11)
            expect_value_error(
                g,
                lambda: mlm_loss(logits, torch.full(lead, -100)),
                f"logits {tuple(logits.shape)} and every label -100",
                "the mean over no position is NaN: say that no position is selected",
            )

    with g.check("labels whose shape is not logits.shape[:-1] raise a ValueError naming both shapes"):
        logits = rand("loss.shape", 2, 3, 5)
        for labels in (
            torch.zeros(2, 4, dtype=torch.long),
            torch.zeros(6, dtype=torch.long),
            torch.zeros(2, 3, 1, dtype=torch.long),
            torch.zeros(3, 2, dtype=torch.long),
        ):
            expect_value_error(
                g,
                lambda labels=labels: mlm_loss(logits, labels),
                f"logits (2, 3, 5) and labels {tuple(labels.shape)}",
                f"say that labels must have the shape (2, 3), and that they have {tuple(labels.shape)}",
            )
        try:
            mlm_loss(logits, torch.zeros(2, 4, dtype=torch.long))
        except ValueError as e:
            message = said(e).replace(" ", "")
            g.expect(
                "2,3" in message and "2,4" in message,
                f"the ValueError for logits (2, 3, 5) and labels (2, 4) should name the expected shape (2, 3) "
                f"and the labels' shape (2, 4), it says: {e}",
            )

    g.finish()


def check_mlm_loss(mlm_loss) -> None:
    """Public: two positions selected by hand, and one small example of every other clause."""
    g = Grader("mlm_loss (public)")
    with g.check(
        "a scalar of the logits' dtype: logits (1, 3, 2), labels [[-100, 1, 0]] -> (-log 3/4 - log 1/2) / 2"
    ):
        logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3.0)], [5.0, 5.0]]], dtype=torch.float64)
        out = call_student(g, "mlm_loss(logits, labels)", mlm_loss, logits, torch.tensor([[-100, 1, 0]]))
        expected = torch.tensor((math.log(4 / 3) + math.log(2)) / 2, dtype=torch.float64)
        g.expect(is_tensor(out) and out.dim() == 0, f"return a scalar tensor, got {describe(out)}")
        g.expect(
            close(out, expected),
            f"expected {float(expected):.5f} (position 0 is not selected), got {float(out):.5f}",
        )
    with g.check("logits (N, V) with labels (N,), and logits (2, 2, 3, V)"):
        for lead in ((4,), (2, 2, 3)):
            logits, labels = _loss_case(3, lead, 5)
            _expect_loss(g, mlm_loss, logits, labels, f"for logits {tuple(logits.shape)}")
    with g.check("stable for large logits: float32 logits of magnitude 1000"):
        logits, labels = _loss_case(4, (2, 3), 5, torch.float32, 1000.0)
        _expect_loss(g, mlm_loss, logits, labels, "for float32 logits (2, 3, 5) of magnitude 1000")
    with g.check(
        "only selected positions count, in the value and in the gradient; the inputs are left unchanged"
    ):
        logits, labels = _loss_case(6, (2, 3), 5)
        other = logits.clone()
        other[labels == -100] = 7.0
        a, b = call_student(g, "mlm_loss(logits, labels)", mlm_loss, logits, labels), mlm_loss(other, labels)
        g.expect(
            is_tensor(a) and is_tensor(b) and close(a, b),
            "the logits at positions with label -100 changed the loss",
        )
        p = probe(
            mlm_loss,
            logits.clone().requires_grad_(),
            labels.clone(),
            backward=(None, torch.tensor(1.0, dtype=torch.float64)),
        )
        g.expect(
            p.grads and p.grads[0] is not None and bool((p.grads[0][labels == -100] == 0).all()),
            "the gradient must reach the logits, and be 0 at positions with label -100",
        )
        g.expect(is_tensor(p.args[1]) and torch.equal(p.args[1], labels), "labels were changed in place")
    with g.check("every label -100 raises a ValueError"):
        expect_value_error(
            g, lambda: mlm_loss(torch.zeros(2, 3, 5), torch.full((2, 3), -100)), "every label -100"
        )
    with g.check("labels (2, 4) for logits (2, 3, 5) raise a ValueError naming both shapes"):
        expect_value_error(
            g,
            lambda: mlm_loss(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long)),
            "logits (2, 3, 5) and labels (2, 4)",
        )
    g.finish()


# --------------------------------------------------------------------------- ClsHead


def _cls_mistakes(w, h):
    lin = lambda x, n: F.linear(x, w[f"{n}.weight"], w[f"{n}.bias"])  # noqa: E731
    return [
        (
            lin(torch.tanh(lin(h[:, -1], "pooler")), "classifier"),
            "you pooled the last position: BERT classifies from [CLS], the first position, h[:, 0]",
        ),
        (
            lin(torch.tanh(lin(h.mean(1), "pooler")), "classifier"),
            "you averaged over the positions: BERT's pooler reads only the [CLS] position, h[:, 0]",
        ),
        (
            lin(lin(h[:, 0], "pooler"), "classifier"),
            "the tanh is missing: pooled = torch.tanh(pooler(h[:, 0]))",
        ),
        (
            torch.tanh(lin(lin(h[:, 0], "pooler"), "classifier")),
            "the tanh belongs after the pooler, not after the classifier: the logits are not squashed",
        ),
        (lin(torch.relu(lin(h[:, 0], "pooler")), "classifier"), "BERT's pooler uses tanh, not ReLU"),
    ]


def _cls_module(g: Grader, ClsHead, d_model: int, n_classes: int, name: str, dropout: float = 0.0):
    what = f"ClsHead({d_model}, {n_classes}, {dropout})"
    m = call_student(g, what, ClsHead, d_model, n_classes, dropout).double().eval()
    w = random_weights(ref.ClsHead(d_model, n_classes), name)
    load_weights(g, m, w, "ClsHead")
    r = ref.ClsHead(d_model, n_classes, 0.0).double().eval()
    r.load_state_dict(w)
    return m, r, w, what


def grade_cls_head(ClsHead) -> None:
    """Grade ``ClsHead(d_model, n_classes, dropout=0.1)``."""
    g = Grader("ClsHead")

    with g.check(
        "has nn.Linear pooler (C -> C), an nn.Dropout dropout (p) and nn.Linear classifier (C -> K)"
    ):
        for args, p in (((C, K), 0.1), ((5, 2, 0.3), 0.3), ((3, 7, 0.0), 0.0)):
            what = f"ClsHead{args}"
            m = call_student(g, what, ClsHead, *args)
            d_model, n_classes = args[:2]
            for name, shape in (("pooler", (d_model, d_model)), ("classifier", (d_model, n_classes))):
                layer = getattr(m, name, None)
                g.expect(
                    is_a(layer, "torch.nn.modules.linear.Linear"), f"{what} needs an nn.Linear called {name}"
                )
                g.expect(
                    (layer.in_features, layer.out_features) == shape,
                    f"{what}: {name} should map {shape[0]} to {shape[1]} features, got "
                    f"{layer.in_features} -> {layer.out_features}",
                )
            _has_dropout(g, m, what, p)

    with g.check(
        "matches classifier(tanh(pooler(h[:, 0]))) with loaded weights: any batch, length, width and classes"
    ):
        built = {}

        def test(case):
            B, T, d_model, n_classes, seed = case
            if (d_model, n_classes) not in built:
                built[d_model, n_classes] = _cls_module(
                    g, ClsHead, d_model, n_classes, f"cls.values.{d_model}.{n_classes}"
                )
            m, r, w, what = built[d_model, n_classes]
            h = tensor(seed, B, T, d_model)
            out = call_student(g, f"{what} on hidden {tuple(h.shape)}", m, h)
            expected = r(h)
            g.expect(
                is_tensor(out) and out.shape == expected.shape and out.dtype == expected.dtype,
                f"{what} on hidden {tuple(h.shape)}: expected a float64 tensor of shape {tuple(expected.shape)}, "
                f"got {describe(out)}",
            )
            first_match(
                g,
                out,
                [(x, f"{what} on hidden {tuple(h.shape)}: {hint}") for x, hint in _cls_mistakes(w, h)],
                expected,
            )
            g.expect(
                close(out, expected),
                f"{what} on hidden {tuple(h.shape)}: the output differs from "
                "classifier(dropout(tanh(pooler(h[:, 0]))))",
            )

        sizes = st.tuples(
            st.integers(1, 4),
            st.integers(1, 6),
            st.sampled_from((C, 5)),
            st.sampled_from((K, 1, 4)),
            st.integers(0, 2**16),
        )
        for_all("cls.values", sizes, test, first=(2, 3, C, K, 0))

    with g.check("only position 0 matters"):
        m, r, _, what = _cls_module(g, ClsHead, C, K, "cls.position")
        h = rand("cls.position.h", 2, 5, C)
        h2 = h.clone()
        h2[:, 1:] = rand("cls.position.other", 2, 4, C)
        a, b = m(h), m(h2)
        g.expect(
            is_tensor(a) and is_tensor(b) and close(a, b),
            "changing positions 1 .. T-1 changed the logits: the head reads the [CLS] position only",
        )

    with g.check("dropout between the tanh and the classifier, only in training mode (its p set to 1)"):
        m, r, w, what = _cls_module(g, ClsHead, C, K, "cls.dropout", dropout=0.5)
        h = rand("cls.dropout.h", 4, 3, C)
        own = m(h)  # eval mode: the student's output without dropout; this check grades the dropout alone
        g.expect(
            is_tensor(own) and close(m(h), own),
            f"{what} in eval mode: two calls differ, so dropout is active: "
            "use nn.Dropout, which does nothing in eval mode",
        )
        set_attr(m.dropout, "p", 1.0)
        out = m.train()(h)
        bias = w["classifier.bias"].expand(4, K).clone()
        g.expect(
            is_tensor(out) and out.shape == bias.shape, f"{what} in training mode returned {describe(out)}"
        )
        if close(out, torch.zeros_like(bias)):
            g.fail(
                "with the dropout's p set to 1 the logits are 0: the dropout belongs before the classifier, "
                "not after it: classifier(dropout(tanh(pooler(h[:, 0]))))"
            )
        g.expect(
            close(out, bias),
            "with the dropout's p set to 1 (training mode) the logits should be the "
            "classifier's bias (everything the classifier sees is dropped): apply self.dropout "
            "to the pooled vector, between the tanh and the classifier",
        )
        g.expect(
            close(m.eval()(h), own),
            "with the dropout's p set to 1, eval mode must still give the output without dropout",
        )

    g.finish()


def check_cls_head(ClsHead) -> None:
    """Public: ``ClsHead(4, 2, 0.2)`` with loaded weights on a hand-made batch."""
    g = Grader("ClsHead (public)")
    w = random_weights(ref.ClsHead(4, 2), "public.cls")
    h = torch.arange(24, dtype=torch.float64).view(2, 3, 4) / 10
    r = ref.ClsHead(4, 2, 0.0).double().eval()
    r.load_state_dict(w)

    def loaded():  # built in each check: under the autograder every check runs in a fresh process
        m = call_student(g, "ClsHead(4, 2, 0.2)", ClsHead, 4, 2, 0.2).double().eval()
        load_weights(g, m, w, "ClsHead")
        return m

    with g.check("nn.Linear pooler (4 -> 4), nn.Dropout dropout (p=0.2), nn.Linear classifier (4 -> 2)"):
        m = call_student(g, "ClsHead(4, 2, 0.2)", ClsHead, 4, 2, 0.2)
        sd = m.state_dict()
        g.expect(
            isinstance(sd, dict) and set(sd) == set(w),
            f"expected parameters {sorted(w)}, got {sorted(sd) if isinstance(sd, dict) else describe(sd)}",
        )
        _has_dropout(g, m, "ClsHead(4, 2, 0.2)", 0.2)
    with g.check(
        "with loaded weights, equals classifier(tanh(pooler(h[:, 0]))) on hidden (2, 3, 4); only position "
        "0 matters"
    ):
        m = loaded()
        out = m(h)
        h2 = h.clone()
        h2[:, 1:] = -h2[:, 1:]
        g.expect(is_tensor(m(h2)) and close(m(h2), out), "changing positions 1 .. T-1 changed the logits")
        g.expect(is_tensor(out) and out.shape == (2, 2), f"expected a (2, 2) tensor, got {describe(out)}")
        first_match(g, out, _cls_mistakes(w, h), r(h))
        g.expect(close(out, r(h)), "the output differs from classifier(tanh(pooler(h[:, 0])))")
    with g.check(
        "dropout before the classifier in training mode: with its p set to 1 the logits are the "
        "classifier's bias"
    ):
        m = loaded()
        set_attr(m.dropout, "p", 1.0)
        out = m.train()(h)
        g.expect(
            is_tensor(out) and close(out, w["classifier.bias"].expand(2, 2).clone()),
            f"got {describe(out)}, not the classifier's bias: apply self.dropout between the tanh and the "
            "classifier",
        )
    g.finish()


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


def _corruption_ids(
    special_ids: tuple, vocab_size: int, seed: int, B: int = 128, T: int = 384
) -> torch.Tensor:
    """``(B, T)`` ordinary ids framed as ``[CLS] ... [SEP] [PAD] ...``: a quarter of the positions are special."""
    ordinary = torch.tensor([i for i in range(vocab_size) if i not in special_ids])
    ids = ordinary[torch.randint(len(ordinary), (B, T), generator=torch.Generator().manual_seed(seed))]
    pad, cls, sep, _ = special_ids
    ids[:, 0] = cls
    ids[:, T - T // 4 :] = pad
    ids[:, T - T // 4 - 1] = sep
    return ids


def _expected_fraction(special_ids: tuple, vocab_size: int, p: float) -> float:
    n = vocab_size - len(special_ids)
    return p * (0.8 + 0.1 * (1 - 1 / n))


def _fraction(g: Grader, corrupted_fraction, ids, special_ids, vocab_size, seed, p=None):
    where = (
        f"corrupted_fraction(input_ids {tuple(ids.shape)}, special {special_ids}, {vocab_size}, generator"
        + ("" if p is None else f", mlm_probability={p}")
        + ")"
    )
    args = (ids, _special(*special_ids), vocab_size, _generator(seed)) + (() if p is None else (p,))
    return where, call_student(g, where, corrupted_fraction, *args)


def _in_band(g: Grader, where: str, got, special_ids, vocab_size, p) -> None:
    expected = _expected_fraction(special_ids, vocab_size, p)
    expect_in_band(
        g,
        where,
        got,
        expected * (1 - CORRUPTED_BAND),
        expected * (1 + CORRUPTED_BAND),
        f"expected about {expected:.4f} = {p} x (0.8 + 0.1 x (1 - 1/{vocab_size - 4})): count the ordinary "
        "positions whose token changed (kept tokens did not), divided by the number of ordinary positions "
        "(not of all positions); if Part 2's checks fail, fix mask_tokens first",
    )


def grade_corrupted_fraction(corrupted_fraction) -> None:
    """Grade the experiment ``corrupted_fraction(input_ids, special, vocab_size, generator,
    mlm_probability=0.15)``: a Python float within the band around p (0.8 + 0.1 (1 - 1/n))."""
    g = Grader("corrupted_fraction")
    appended, first = (1024, 1025, 1026, 1027), (0, 1, 2, 3)
    with g.check("returns a Python float"):
        ids = _corruption_ids(appended, 1028, 1, B=8, T=64)
        where, v = _fraction(g, corrupted_fraction, ids, appended, 1028, 2)
        g.expect(type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}")
    with g.check(
        f"the default mlm_probability (0.15) changes about 13.5% of the ordinary tokens (within "
        f"{CORRUPTED_BAND:.0%}), specials appended or first"
    ):
        for special_ids, seed in ((appended, 11), (first, 12)):
            ids = _corruption_ids(special_ids, 1028, seed)
            where, v = _fraction(g, corrupted_fraction, ids, special_ids, 1028, seed + 100)
            _in_band(g, where, v, special_ids, 1028, 0.15)
    with g.check(f"mlm_probability = 0.5 and 1.0, and a small vocabulary (within {CORRUPTED_BAND:.0%})"):
        for special_ids, vocab_size, p, seed in ((appended, 1028, 0.5, 21), (first, 12, 1.0, 22)):
            ids = _corruption_ids(special_ids, vocab_size, seed)
            where, v = _fraction(g, corrupted_fraction, ids, special_ids, vocab_size, seed + 100, p)
            _in_band(g, where, v, special_ids, vocab_size, p)
    with g.check("mlm_probability = 0 changes nothing"):
        ids = _corruption_ids(appended, 1028, 31, B=8, T=64)
        where, v = _fraction(g, corrupted_fraction, ids, appended, 1028, 32, 0.0)
        g.expect(v == 0, f"{where} gave {describe(v)}, expected 0.0: with nothing selected nothing changes")
    with g.check("draws from its generator: the same seed gives the same result, another seed another"):
        ids = _corruption_ids(appended, 1028, 41, B=32, T=128)
        _, a = _fraction(g, corrupted_fraction, ids, appended, 1028, 42)
        _, b = _fraction(g, corrupted_fraction, ids, appended, 1028, 42)
        _, c = _fraction(g, corrupted_fraction, ids, appended, 1028, 43)
        g.expect(
            a == b and a != c,
            f"two generators seeded alike gave {a!r} and {b!r}, and another seed gave {c!r}: pass the generator "
            "on to mask_tokens",
        )
    with g.check("raises ValueError when input_ids holds no ordinary token"):
        ids = torch.tensor([[1025, 1026, 1024, 1024]])
        expect_value_error(
            g,
            lambda: corrupted_fraction(ids, _special(*appended), 1028, _generator(0)),
            "input_ids of special tokens only",
            "the fraction would be 0 / 0",
        )
    g.finish()


def check_corrupted_fraction(corrupted_fraction) -> None:
    """Public checks of ``corrupted_fraction``: one measurement at the default rate."""
    g = Grader("corrupted_fraction (public)")
    special_ids = (1024, 1025, 1026, 1027)
    with g.check(
        f"about 13.5% of the ordinary tokens change at mlm_probability 0.15 (within {CORRUPTED_BAND:.0%})"
    ):
        ids = _corruption_ids(special_ids, 1028, 0)
        where, v = _fraction(g, corrupted_fraction, ids, special_ids, 1028, 1)
        _in_band(g, where, v, special_ids, 1028, 0.15)
    g.finish()


# --------------------------------------------------------------------------- stretch: whole-word masking


def _word_rows(special_ids, n_ordinary: int, B: int, T: int, name: str, longest: int = 4, gap: int = 1):
    """``[CLS] words [SEP] [PAD]...`` rows and their word ids: words of 1 to ``longest`` tokens, numbered
    ``0, gap, 2 * gap, ...`` in each row, ``-1`` at the special tokens."""
    ids = _sentences(special_ids, n_ordinary, B, T, name)
    gen = generator(name + ".words")
    starts = torch.rand(B, T, generator=gen) < 2 / (longest + 1)  # (B, T): a new word begins here
    lengths = torch.zeros(B, T, dtype=torch.long)
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
    for b in range(B):
        for w in words[b].unique().tolist():
            if w >= 0:
                lengths[b][words[b] == w] = int((words[b] == w).sum())
    return ids, words, lengths


def _word_keys(words: torch.Tensor) -> torch.Tensor:
    """A number per (row, word), ``-1`` at the special tokens."""
    W = int(words.max()) + 1 if words.numel() else 1
    rows = torch.arange(words.shape[0]).unsqueeze(1)  # (B, 1)
    return torch.where(words >= 0, rows * max(W, 1) + words, -1)


def _wwm(g: Grader, fn, ids, words, special_ids, vocab_size, seed, p=None):
    """Call ``mask_whole_words`` and check the exact parts of the rule: types and shapes, the inputs left
    unchanged, labels, specials never selected, whole words, untouched positions, valid replacements."""
    args = (ids.clone(), words.clone(), _special(*special_ids), vocab_size, _generator(seed))
    args += () if p is None else (p,)
    what = (
        f"mask_whole_words(input_ids {tuple(ids.shape)}, word_ids, special ids {special_ids}, "
        f"vocab_size={vocab_size}" + ("" if p is None else f", mlm_probability={p}") + ")"
    )
    try:
        result = probe(fn, *args)
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
            f"{what}: {name} should be a torch.long tensor of the input's shape {tuple(ids.shape)}, got "
            f"{describe(x)}",
        )
    g.expect(
        torch.equal(result.args[0], ids) and torch.equal(result.args[1], words),
        f"{what} changed input_ids or word_ids in place: build new tensors and leave the inputs as they were",
    )
    sel = labels != -100
    is_special = torch.isin(ids, torch.tensor(special_ids))
    g.expect(
        torch.equal(labels[sel], ids[sel]),
        f"{what}: labels must hold the original token id at the selected positions and -100 everywhere else",
    )
    chosen = int((sel & is_special).sum())
    g.expect(
        chosen == 0,
        f"{what}: {chosen} special tokens were selected: never select a special token (word id -1)",
    )
    keys = _word_keys(words)
    if bool((keys >= 0).any()):
        k, s = keys[keys >= 0], sel[keys >= 0].long()
        n = int(k.max()) + 1
        lo = torch.ones(n, dtype=torch.long).scatter_reduce(0, k, s, "amin")
        hi = torch.zeros(n, dtype=torch.long).scatter_reduce(0, k, s, "amax")
        split = int((lo < hi).sum())  # a word's tokens were not all selected alike (absent keys: lo 1, hi 0)
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
        "[MASK] or an id outside the vocabulary: draw random tokens from the ordinary ids only",
    )
    return inputs, labels, sel, is_special


def _wwm_proportions(
    g: Grader, fn, special_ids, p=0.15, B=128, T=128, name="wwm", pass_p=True, gap=1
) -> None:
    """Whole-word masking's proportions: the share of words selected, then 80/10/10 per token, and the
    tokens of one word corrupted independently (some words of 3 tokens mix [MASK] with other tokens)."""
    n_ordinary = 40
    ids, words, lengths = _word_rows(special_ids, n_ordinary, B, T, name, gap=gap)
    inputs, _, sel, is_special = _wwm(
        g, fn, ids, words, special_ids, n_ordinary + 4, 7, p if pass_p else None
    )
    first = (words >= 0) & torch.cat([torch.ones(B, 1, dtype=torch.bool), words[:, 1:] != words[:, :-1]], 1)
    n, k = int(first.sum()), int((sel & first).sum())
    rate = f"mlm_probability={p}" if pass_p else f"the default mlm_probability ({p})"
    g.expect(
        _within(k, n, p),
        f"with {rate} you selected {k / max(n, 1):.1%} of the {n} words, expected about {p:.0%}: select each "
        "word (not each token) with probability mlm_probability, so that a long word is no likelier than a "
        "short one",
    )
    k_tokens = int(sel.sum())
    new, old = inputs[sel], ids[sel]
    masked = int((new == special_ids[3]).sum())
    g.expect(
        _within(masked, k_tokens, 0.8),
        f"{masked / max(k_tokens, 1):.1%} of the selected tokens became [MASK], expected 80%",
    )
    swapped = int(((new != special_ids[3]) & (new != old)).sum())
    g.expect(
        _within(swapped, k_tokens, 0.1 * (1 - 1 / n_ordinary)),
        f"{swapped / max(k_tokens, 1):.1%} of the selected tokens got a random token, expected 10%",
    )
    kept = int((new == old).sum())
    g.expect(
        _within(kept, k_tokens, 0.1 + 0.1 / n_ordinary),
        f"{kept / max(k_tokens, 1):.1%} of the selected tokens kept their id, expected 10%",
    )
    three = sel & first & (lengths == 3)  # the first token of each selected word of three tokens
    mixed = 0
    for b, t in three.nonzero().tolist():
        m = inputs[b, t : t + 3] == special_ids[3]
        mixed += bool(m.any()) and not bool(m.all())
    n3 = int(three.sum())
    g.expect(
        _within(mixed, n3, 1 - 0.8**3 - 0.2**3),
        f"of {n3} selected words of three tokens, {mixed} mix [MASK] with other tokens, expected about 48%: "
        "decide 80/10/10 for each token on its own (one draw per token), not once per word",
    )


def grade_mask_whole_words(mask_whole_words) -> None:
    """Grade the stretch part ``mask_whole_words(input_ids, word_ids, special, vocab_size, generator, p)``."""
    g = Grader("mask_whole_words")

    with g.check(
        "returns two new (B, T) torch.long tensors, inputs unchanged; labels, specials never selected, whole "
        "words selected together, only selected positions change (any shape, word ids with gaps)"
    ):

        def test(case):
            B, T, V_, order, p, gap, seed = case
            special_ids = tuple(order[:4])
            ids = _ints(seed, V_, B, T)
            is_special = torch.isin(ids, torch.tensor(special_ids))
            starts = torch.rand(B, T, generator=torch.Generator().manual_seed(seed)) < 0.5
            words = torch.where(is_special, -1, (torch.cumsum(starts.long(), 1) * gap))
            _wwm(g, mask_whole_words, ids, words, special_ids, V_, seed, p)

        shapes = st.tuples(st.integers(1, 4), st.integers(1, 12), st.integers(6, 12)).flatmap(
            lambda s: st.tuples(
                st.just(s[0]),
                st.just(s[1]),
                st.just(s[2]),
                st.permutations(list(range(s[2]))),
                st.sampled_from((0.15, 0.5, 1.0, 0.0)),
                st.integers(1, 3),
                st.integers(0, 2**16),
            )
        )
        for_all("wwm.rule", shapes, test, max_examples=20, first=(2, 8, 8, list(range(8)), 0.5, 1, 0))

    with g.check("mlm_probability=0 selects nothing; mlm_probability=1 selects every ordinary token"):
        ids, words, _ = _word_rows((40, 41, 42, 43), 40, 3, 9, "wwm.edges")
        _, _, sel, _ = _wwm(g, mask_whole_words, ids, words, (40, 41, 42, 43), 44, 1, 0.0)
        g.expect(not bool(sel.any()), f"with mlm_probability=0 you selected {int(sel.sum())} positions")
        _, _, sel, is_special = _wwm(g, mask_whole_words, ids, words, (40, 41, 42, 43), 44, 2, 1.0)
        g.expect(
            torch.equal(sel, ~is_special), "with mlm_probability=1 every ordinary token must be selected"
        )

    with g.check("the default mlm_probability selects 15% of the words; 80/10/10 per token (16,000 tokens)"):
        _wwm_proportions(g, mask_whole_words, (40, 41, 42, 43), name="wwm.default", pass_p=False)

    with g.check(
        "mlm_probability=0.4 selects 40% of the words, special tokens first ([PAD] = 0), word ids 0, 2, 4"
    ):
        _wwm_proportions(g, mask_whole_words, (0, 1, 2, 3), p=0.4, B=64, name="wwm.rate", gap=2)

    with g.check("rows are masked independently: word w of row 0 and word w of row 1 are two words"):
        ids = torch.full((64, 12), 5)
        ids[:, 0], ids[:, -1] = 41, 42
        words = torch.cat([torch.tensor([-1]), torch.arange(10), torch.tensor([-1])]).repeat(64, 1)
        _, _, sel, _ = _wwm(g, mask_whole_words, ids, words, (40, 41, 42, 43), 44, 3, 0.5)
        g.expect(
            len({tuple(r) for r in sel.tolist()}) > 1,
            "64 rows with the same word ids got the same selection: draw one number per word *of each row* "
            "(a (B, W) tensor), not one per word index shared by every row",
        )

    with g.check("random tokens are drawn uniformly from the ordinary ids, wherever the special ids are"):
        special_ids, vocab_size = (5, 0, 9, 2), 12
        ordinary = [i for i in range(vocab_size) if i not in special_ids]
        ids = torch.full((128, 128), ordinary[0])
        ids[64:] = ordinary[-1]
        ids[:, 0], ids[:, -1] = 0, 9
        words = torch.where(torch.isin(ids, torch.tensor(special_ids)), -1, torch.arange(128) // 2)
        inputs, _, sel, _ = _wwm(g, mask_whole_words, ids, words, special_ids, vocab_size, 5, 1.0)
        for i in ordinary:
            elsewhere = sel & (ids != i)
            k, n_i = int(elsewhere.sum()), int((inputs[elsewhere] == i).sum())
            g.expect(
                _within(n_i, k, 0.1 / len(ordinary)),
                f"the random replacements should be uniform over the {len(ordinary)} ordinary ids {ordinary}, "
                f"but id {i} replaced {n_i / k:.2%} of the selected tokens, expected {0.1 / len(ordinary):.2%}",
            )

    with g.check("all randomness comes from the generator argument"):
        ids, words, _ = _word_rows((30, 31, 32, 33), 30, 16, 32, "wwm.generator")
        special = _special(30, 31, 32, 33)
        a = call_student(g, "mask_whole_words(...)", mask_whole_words, ids, words, special, 34, _generator(3))
        b = call_student(g, "mask_whole_words(...)", mask_whole_words, ids, words, special, 34, _generator(3))
        c = call_student(g, "mask_whole_words(...)", mask_whole_words, ids, words, special, 34, _generator(4))
        g.expect(
            all(is_tensor(x) and is_tensor(y) and torch.equal(x, y) for x, y in zip(a, b)),
            "two calls with generators seeded alike gave different results: draw every random number with "
            "generator=generator",
        )
        g.expect(
            not (torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])),
            "different seeds gave the same result: use the generator argument",
        )

    with g.check(
        "raises ValueError for mismatched shapes, 1-D input, a bad rate, or word ids that miss the specials"
    ):
        special = (40, 41, 42, 43)
        ids = torch.tensor([[41, 7, 8, 9, 42]])
        words = torch.tensor([[-1, 0, 0, 1, -1]])
        bad = (
            ((ids, words[:, :4], 0.15), "word_ids (1, 4) for input_ids (1, 5)"),
            ((ids[0], words[0], 0.15), "1-D input_ids (5,)"),
            ((ids, words, -0.1), "mlm_probability=-0.1"),
            ((ids, words, 1.5), "mlm_probability=1.5"),
            ((ids, torch.tensor([[-1, 0, -1, 1, -1]]), 0.15), "word id -1 at the ordinary token 8"),
            ((ids, torch.tensor([[0, 0, 0, 1, -1]]), 0.15), "word id 0 at [CLS]"),
        )
        for (x, w, p), what in bad:
            expect_value_error(
                g,
                lambda x=x, w=w, p=p: mask_whole_words(x, w, _special(*special), 44, _generator(0), p),
                what,
            )

    g.finish()


def check_mask_whole_words(mask_whole_words) -> None:
    """Public checks of ``mask_whole_words``: each clause on a small fixed example, proportions on 4,096 tokens."""
    g = Grader("mask_whole_words (public)")
    special = (40, 41, 42, 43)
    ids = torch.tensor([[41, 7, 8, 9, 42], [41, 3, 4, 42, 40]])
    words = torch.tensor([[-1, 0, 0, 1, -1], [-1, 0, 0, -1, -1]])
    with g.check("two new (B, T) long tensors, inputs unchanged, labels, specials never chosen, whole words"):
        for seed in range(8):
            _wwm(g, mask_whole_words, ids, words, special, 44, seed, 0.5)
    with g.check("mlm_probability=1 selects every ordinary token, 0 none"):
        _, _, sel, is_special = _wwm(g, mask_whole_words, ids, words, special, 44, 0, 1.0)
        g.expect(
            torch.equal(sel, ~is_special), "with mlm_probability=1 every ordinary token must be selected"
        )
        _, _, sel, _ = _wwm(g, mask_whole_words, ids, words, special, 44, 0, 0.0)
        g.expect(not bool(sel.any()), "with mlm_probability=0 nothing may be selected")
    with g.check("64 rows of 64 tokens: 15% of the words by default, 80/10/10 per token"):
        _wwm_proportions(g, mask_whole_words, special, B=64, T=64, name="public.wwm", pass_p=False)
    with g.check("rows with the same word ids are masked independently"):
        rows = torch.tensor([[41, 5, 5, 5, 5, 42]]).repeat(16, 1)
        w = torch.tensor([[-1, 0, 1, 2, 3, -1]]).repeat(16, 1)
        _, _, sel, _ = _wwm(g, mask_whole_words, rows, w, special, 44, 1, 0.5)
        g.expect(len({tuple(r) for r in sel.tolist()}) > 1, "draw one number per word of each row")
    with g.check("the same seed gives the same masks"):
        a = mask_whole_words(ids, words, _special(*special), 44, _generator(3))
        b = mask_whole_words(ids, words, _special(*special), 44, _generator(3))
        g.expect(
            all(is_tensor(x) and is_tensor(y) and torch.equal(x, y) for x, y in zip(a, b)),
            "draw every random number with generator=generator",
        )
    with g.check("raises ValueError when word_ids has another shape or mlm_probability is outside [0, 1]"):
        expect_value_error(
            g,
            lambda: mask_whole_words(ids, words[:, :4], _special(*special), 44, _generator(0)),
            "word_ids (2, 4)",
        )
        expect_value_error(
            g,
            lambda: mask_whole_words(ids, words, _special(*special), 44, _generator(0), 1.5),
            "mlm_probability=1.5",
        )
    g.finish()
