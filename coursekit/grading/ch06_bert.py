"""Checks for Exercise 6 (BERT: embeddings, masking, the MLM loss, the [CLS] head).

``check_*`` are the public checks (a small fixed example each); ``grade_*`` the hidden
ones. Modules get random weights pushed with ``load_state_dict`` (so the submodule names
of the instructions matter) and are compared with :mod:`coursekit.bert` on seeded
float64 inputs. ``mask_tokens`` is random, so its checks never expect one particular
random stream: they call it with a generator the grader seeds, on about 16,000 tokens,
and test the rule itself (specials never chosen, labels, and the 15% / 80-10-10
proportions within five binomial standard deviations).

Under the autograder a ``torch.Generator`` or a :class:`~coursekit.bert.SpecialTokens` is
not data that can cross into the sandbox, so both are built there, from the notebook's own
``torch`` and ``SpecialTokens`` (imported by its locked first cell), beside the student's
function.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from coursekit import bert as ref
from coursekit.grading.core import (
    Grader,
    close,
    describe,
    first_match,
    generator,
    is_a,
    is_tensor,
    load_weights,
    probe,
    rand,
    random_weights,
    student_side,
)

__all__ = [
    "check_bert_embeddings", "check_mask_tokens", "check_mlm_loss", "check_cls_head",
    "grade_bert_embeddings", "grade_mask_tokens", "grade_mlm_loss", "grade_cls_head",
]

V, MAXLEN, C, K = 30, 12, 16, 3
Z = 5.0  # binomial standard deviations a count may stray from its expectation


def _generator(seed: int):
    return student_side("torch", torch).Generator().manual_seed(seed)


def _special(pad: int, cls: int, sep: int, mask: int):
    return student_side("SpecialTokens", ref.SpecialTokens)(pad, cls, sep, mask)


def _within(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= Z * math.sqrt(n * p * (1 - p)) + 1


# --------------------------------------------------------------------------- BertEmbeddings


def _emb_reference(weights, eps=1e-12):
    r = ref.BertEmbeddings(V, MAXLEN, C, 2, 0.0, eps).double().eval()
    r.load_state_dict(weights)
    return r


def grade_bert_embeddings(BertEmbeddings) -> None:
    """Grade ``BertEmbeddings(vocab_size, max_len, d_model, n_segments=2, dropout=0.1, eps=1e-12)``."""
    g = Grader("BertEmbeddings")

    def build(name, **kwargs):
        m = BertEmbeddings(V, MAXLEN, C, 2, **{"dropout": 0.0, **kwargs}).double().eval()
        weights = random_weights(ref.BertEmbeddings(V, MAXLEN, C), name)
        load_weights(g, m, weights, "BertEmbeddings")
        return m, weights

    with g.check("has token, position and segment embeddings and a norm"):
        m = BertEmbeddings(V, MAXLEN, C)
        for name, shape in (("token", (V, C)), ("position", (MAXLEN, C)), ("segment", (2, C))):
            layer = getattr(m, name, None)
            g.expect(is_a(layer, "torch.nn.modules.sparse.Embedding"), f"BertEmbeddings needs an nn.Embedding called {name}")
            got = tuple(layer.weight.shape)
            g.expect(got == shape, f"{name} should be an embedding of shape {shape}, got {got}")
        g.expect("norm.weight" in m.state_dict(), "BertEmbeddings needs a layer norm called norm (LayerNorm(d_model, eps))")

    with g.check("matches the reference with random weights, segments and positions"):
        m, w = build("emb.values")
        ids = torch.randint(0, V, (3, 9), generator=generator("emb.values.ids"))
        seg = torch.randint(0, 2, (3, 9), generator=generator("emb.values.seg"))
        out = m(ids, seg)
        g.expect(is_tensor(out) and out.shape == (3, 9, C), f"expected a (3, 9, {C}) tensor, got {describe(out)}")
        tok, pos, sg = w["token.weight"][ids], w["position.weight"][:9], w["segment.weight"][seg]
        norm = lambda x: F.layer_norm(x, (C,), w["norm.weight"], w["norm.bias"], 1e-12)  # noqa: E731
        first_match(g, out, [
            (norm(tok + pos), "the segment embedding is missing: add segment(token_type_ids) to the token and position embeddings"),
            (tok + pos + sg, "the layer norm is missing: return dropout(norm(token + position + segment))"),
            (norm(tok + sg), "the position embedding is missing: add position(arange(T)) (positions 0 .. T-1)"),
            (norm(tok + w["position.weight"][1:10] + sg), "positions start at 0: use position(torch.arange(T)), not 1 .. T"),
        ])
        g.expect(close(out, _emb_reference(w)(ids, seg)), "the output differs from norm(token + position + segment)")

    with g.check("token_type_ids defaults to segment 0"):
        m, w = build("emb.default")
        ids = torch.randint(0, V, (2, 5), generator=generator("emb.default.ids"))
        out = m(ids)
        g.expect(close(out, _emb_reference(w)(ids, torch.zeros_like(ids))),
                 "m(ids) without token_type_ids should use segment 0 for every token (torch.zeros_like(input_ids))")

    with g.check("passes eps to the layer norm"):
        m, w = build("emb.eps", eps=0.5)
        ids = torch.randint(0, V, (2, 6), generator=generator("emb.eps.ids"))
        out = m(ids)
        g.expect(close(out, _emb_reference(w, eps=0.5)(ids)),
                 "with eps=0.5 the output differs: build the norm as LayerNorm(d_model, eps)")

    with g.check("dropout after the norm, only in training mode"):
        m = BertEmbeddings(V, MAXLEN, C, 2, 0.5).double()
        m.load_state_dict(random_weights(ref.BertEmbeddings(V, MAXLEN, C), "emb.dropout"))
        ids = torch.randint(0, V, (8, 12), generator=generator("emb.dropout.ids"))
        out = m.train()(ids)
        zeros = float((out == 0).double().mean()) if is_tensor(out) else 0.0
        g.expect(0.35 < zeros < 0.65, f"in training mode with dropout=0.5 about half the outputs should be exactly 0, got "
                                      f"{zeros:.0%}: apply nn.Dropout(dropout) to the normalised sum")
        a, b = m.eval()(ids), m(ids)
        g.expect(close(a, b) and float((a == 0).double().mean()) < 0.05, "in eval mode dropout must do nothing")

    g.finish()


def check_bert_embeddings(BertEmbeddings) -> None:
    """Public: ``BertEmbeddings(10, 6, 4, dropout=0.0)`` against the formula on a small batch."""
    g = Grader("BertEmbeddings (public)")
    with g.check("BertEmbeddings(10, 6, 4) equals norm(token + position + segment)"):
        torch.manual_seed(0)
        m = BertEmbeddings(10, 6, 4, 2, 0.0).eval()
        sd = m.state_dict()
        names = {"token.weight", "position.weight", "segment.weight", "norm.weight", "norm.bias"}
        g.expect(isinstance(sd, dict) and set(sd) == names,
                 f"expected parameters {sorted(names)}, got {sorted(sd) if isinstance(sd, dict) else describe(sd)}")
        ids, seg = torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([[0, 0, 1], [0, 1, 1]])
        x = sd["token.weight"][ids] + sd["position.weight"][:3] + sd["segment.weight"][seg]
        expected = F.layer_norm(x, (4,), sd["norm.weight"], sd["norm.bias"], 1e-12)
        out = m(ids, seg)
        g.expect(is_tensor(out) and out.shape == (2, 3, 4), f"expected a (2, 3, 4) tensor, got {describe(out)}")
        g.expect(torch.allclose(out, expected, atol=1e-5), "the output differs from norm(token + position + segment)")
    g.finish()


# --------------------------------------------------------------------------- mask_tokens


def _sentences(special_ids, n_ordinary: int, B: int, T: int, name: str) -> torch.Tensor:
    """``[CLS] words [SEP] [PAD]...`` rows of random length with ordinary ids inside."""
    pad, cls, sep, _ = special_ids
    g = generator(name)
    ordinary = torch.tensor([i for i in range(n_ordinary + 4) if i not in special_ids])
    ids = ordinary[torch.randint(len(ordinary), (B, T), generator=g)]
    for b, n in enumerate(torch.randint(T // 2, T + 1, (B,), generator=g).tolist()):
        ids[b, 0], ids[b, n - 1] = cls, sep
        ids[b, n:] = pad
    return ids


def _mask_rule(g: Grader, mask_tokens, special_ids, n_ordinary=40, p=0.15, B=128, T=128, name="mask") -> None:
    """Call ``mask_tokens`` once and check every part of the rule on its answer."""
    V_ = n_ordinary + 4
    ids = _sentences(special_ids, n_ordinary, B, T, name)
    result = probe(mask_tokens, ids.clone(), _special(*special_ids), V_, _generator(7), p)
    out = result.result
    g.expect(type(out) in (tuple, list) and len(out) == 2, f"return a pair (inputs, labels), got {describe(out)}")
    inputs, labels = out
    for what, x in (("inputs", inputs), ("labels", labels)):
        g.expect(is_tensor(x) and x.shape == ids.shape and x.dtype == torch.long,
                 f"{what} should be a torch.long tensor of the input's shape {tuple(ids.shape)}, got {describe(x)}")
    g.expect(torch.equal(result.args[0], ids), "mask_tokens changed its input_ids in place: build new tensors "
                                               "(torch.where or .clone()) and leave the input as it was")
    sel = labels != -100
    g.expect(not bool(sel.all()), "labels has no -100 at all: labels must be -100 at every position that was not "
                                  "selected (only selected positions are predicted)")
    g.expect(torch.equal(labels[sel], ids[sel]),
             "labels must hold the original token id at the selected positions and -100 everywhere else "
             "(not the corrupted input, not 0)")
    is_special = torch.isin(ids, torch.tensor(special_ids))
    chosen = int((sel & is_special).sum())
    g.expect(chosen == 0, f"{chosen} special tokens ([PAD], [CLS], [SEP]) were selected: never select a special "
                          "token (exclude them with torch.isin(input_ids, torch.tensor(special.ids)))")
    g.expect(torch.equal(inputs[~sel], ids[~sel]),
             "an unselected position changed: only selected positions (labels != -100) may be corrupted")
    n, k = int((~is_special).sum()), int(sel.sum())
    g.expect(_within(k, n, p), f"with mlm_probability={p} you selected {k / n:.1%} of the {n} ordinary tokens, "
                               f"expected about {p:.0%}: select each non-special position with probability "
                               "mlm_probability (torch.rand(shape, generator=generator) < mlm_probability)")
    new = inputs[sel]
    masked = int((new == special_ids[3]).sum())
    g.expect(masked < k, "every selected position became [MASK]: only 80% should; 10% get a random token and 10% "
                         "keep their own")
    swapped = new[(new != special_ids[3]) & (new != ids[sel])]
    bad = swapped[torch.isin(swapped, torch.tensor(special_ids)) | (swapped < 0) | (swapped >= V_)]
    g.expect(len(bad) == 0, f"a random replacement was a special token or outside the vocabulary (id {int(bad[0]) if len(bad) else ''}): "
                            "draw random tokens from the ordinary ids only, the ids in [0, vocab_size) that are "
                            "not in special.ids")
    g.expect(_within(masked, k, 0.8), f"{masked / k:.1%} of the selected positions became [MASK], expected 80%")
    g.expect(_within(len(swapped), k, 0.1 * (1 - 1 / n_ordinary)),
             f"{len(swapped) / k:.1%} of the selected positions got a random token, expected 10%")
    g.expect(len(set(swapped.tolist())) > n_ordinary // 2,
             f"random replacements used only {len(set(swapped.tolist()))} distinct ids: draw uniformly from all "
             "ordinary ids with the generator")
    kept = int((new == ids[sel]).sum())
    g.expect(_within(kept, k, 0.1 + 0.1 / n_ordinary), f"{kept / k:.1%} of the selected positions kept their token, "
                                                       "expected 10%")


def grade_mask_tokens(mask_tokens) -> None:
    """Grade ``mask_tokens(input_ids, special, vocab_size, generator, mlm_probability=0.15)``."""
    g = Grader("mask_tokens")

    with g.check("80/10/10 on 16,000 tokens, specials appended after the vocabulary"):
        _mask_rule(g, mask_tokens, (40, 41, 42, 43), name="mask.appended")

    with g.check("80/10/10 with the special tokens first, as in Google's BERT vocabulary ([PAD] = 0)"):
        _mask_rule(g, mask_tokens, (0, 1, 2, 3), name="mask.first")

    with g.check("mlm_probability=0.4 selects 40%"):
        _mask_rule(g, mask_tokens, (40, 41, 42, 43), p=0.4, B=64, name="mask.rate")

    with g.check("all randomness comes from the generator argument"):
        ids = _sentences((30, 31, 32, 33), 30, 16, 32, "mask.generator")
        special = _special(30, 31, 32, 33)
        a = mask_tokens(ids, special, 34, _generator(3))
        b = mask_tokens(ids, special, 34, _generator(3))
        c = mask_tokens(ids, special, 34, _generator(4))
        same = all(is_tensor(x) and is_tensor(y) and torch.equal(x, y) for x, y in zip(a, b))
        g.expect(same, "two calls with generators seeded alike gave different results: draw every random number "
                       "with generator=generator (torch.rand(..., generator=generator), torch.randint(..., generator=generator))")
        g.expect(not torch.equal(a[1], c[1]), "different seeds gave the same selection: use the generator argument")

    with g.check("short rows of special tokens only: nothing selected"):
        ids = torch.tensor([[41, 42, 40, 40], [41, 42, 40, 40]])
        inputs, labels = mask_tokens(ids, _special(40, 41, 42, 43), 44, _generator(0))
        g.expect(is_tensor(labels) and bool((labels == -100).all()) and torch.equal(inputs, ids),
                 "a row of [CLS] [SEP] [PAD] [PAD] has nothing to select: every label -100, the input unchanged")

    g.finish()


def check_mask_tokens(mask_tokens) -> None:
    """Public: the rule on 4,096 tokens (looser bounds than the hidden checks would allow alone)."""
    g = Grader("mask_tokens (public)")
    with g.check("masking 64 rows of 64 tokens: specials never chosen, labels, 15% and 80/10/10"):
        _mask_rule(g, mask_tokens, (40, 41, 42, 43), B=64, T=64, name="public.mask")
    g.finish()


# --------------------------------------------------------------------------- mlm_loss


def _loss_case(name: str, B=3, T=8, V_=11):
    logits = rand(name + ".logits", B, T, V_, scale=2.0)
    labels = torch.randint(0, V_, (B, T), generator=generator(name + ".labels"))
    keep = torch.rand(B, T, generator=generator(name + ".keep")) < 0.3
    keep[0, 0] = True
    return logits, torch.where(keep, labels, -100)


def grade_mlm_loss(mlm_loss) -> None:
    """Grade ``mlm_loss(logits, labels)``."""
    g = Grader("mlm_loss")

    with g.check("equals cross-entropy over the selected positions"):
        logits, labels = _loss_case("loss.values")
        out = mlm_loss(logits, labels)
        sel = labels != -100
        ce = F.cross_entropy(logits.reshape(-1, 11), labels.clamp(min=0).reshape(-1), reduction="none").view(labels.shape)
        g.expect(is_tensor(out) and out.dim() == 0, f"return a scalar tensor, got {describe(out)}")
        first_match(g, out, [
            (ce[sel].sum() / labels.numel(), "the loss is averaged over all positions: divide by the number of "
                                             "selected positions (labels != -100), e.g. F.cross_entropy(..., ignore_index=-100)"),
            (ce.mean(), "unselected positions (label -100) count in the loss: ignore them (ignore_index=-100)"),
            (ce[sel].sum(), "that is the sum: return the mean over the selected positions"),
        ])
        g.expect(close(out, ce[sel].mean()), "the loss differs from the mean cross-entropy over the positions with "
                                             "labels != -100")

    with g.check("logits of unselected positions do not matter"):
        logits, labels = _loss_case("loss.ignore")
        other = logits.clone()
        other[labels == -100] = rand("loss.ignore.other", int((labels == -100).sum()), 11, scale=5.0)
        a, b = mlm_loss(logits, labels), mlm_loss(other, labels)
        g.expect(is_tensor(a) and is_tensor(b) and close(a, b),
                 "changing the logits at positions with label -100 changed the loss: only selected positions count")

    with g.check("gradient: zero at unselected positions, softmax - one-hot over n at selected ones"):
        logits, labels = _loss_case("loss.grad")
        p = probe(mlm_loss, logits.clone().requires_grad_(), labels, backward=(None, torch.tensor(1.0, dtype=torch.float64)))
        x = logits.clone().requires_grad_()
        F.cross_entropy(x.reshape(-1, 11), labels.reshape(-1), ignore_index=-100).backward()
        g.expect(p.grads and p.grads[0] is not None, "the loss does not depend on the logits through autograd: "
                                                      "avoid .item(), .detach() or .numpy()")
        g.expect(close(p.grads[0], x.grad), "the gradient with respect to the logits differs from the reference")

    with g.check("no selected position raises ValueError"):
        logits, _ = _loss_case("loss.empty")
        try:
            out = mlm_loss(logits, torch.full((3, 8), -100))
        except ValueError:
            pass
        except Exception as e:  # noqa: BLE001
            g.fail(f"with every label -100 your code raised {type(e).__name__}; raise a ValueError saying that no "
                   "position is selected")
        else:
            g.fail(f"with every label -100 you returned {out if not is_tensor(out) else float(out)}: the mean over "
                   "no position is NaN; raise a ValueError saying that no position is selected")

    with g.check("works for (N, V) logits and (N,) labels too"):
        logits, labels = _loss_case("loss.flat", B=1, T=12)
        out = mlm_loss(logits[0], labels[0])
        g.expect(close(out, F.cross_entropy(logits[0], labels[0], ignore_index=-100)),
                 "with logits (N, V) and labels (N,) the loss differs: flatten with reshape(-1, V), reshape(-1)")

    g.finish()


def check_mlm_loss(mlm_loss) -> None:
    """Public: two positions selected by hand."""
    g = Grader("mlm_loss (public)")
    with g.check("logits (1, 3, 2), labels [[-100, 1, 0]]"):
        logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3.0)], [5.0, 5.0]]])
        out = mlm_loss(logits, torch.tensor([[-100, 1, 0]]))
        expected = (math.log(4 / 3) + math.log(2)) / 2  # -log(3/4) and -log(1/2), averaged over 2
        g.expect(is_tensor(out) and out.dim() == 0, f"return a scalar tensor, got {describe(out)}")
        g.expect(abs(float(out) - expected) < 1e-5,
                 f"expected (-log 3/4 - log 1/2) / 2 = {expected:.5f} (position 0 is not selected), got {float(out):.5f}")
    g.finish()


# --------------------------------------------------------------------------- ClsHead


def grade_cls_head(ClsHead) -> None:
    """Grade ``ClsHead(d_model, n_classes, dropout=0.1)``."""
    g = Grader("ClsHead")

    def build(name):
        m = ClsHead(C, K, 0.0).double().eval()
        w = random_weights(ref.ClsHead(C, K), name)
        load_weights(g, m, w, "ClsHead")
        r = ref.ClsHead(C, K, 0.0).double().eval()
        r.load_state_dict(w)
        return m, r, w

    with g.check("has pooler (C -> C) and classifier (C -> K)"):
        m = ClsHead(C, K)
        for name, shape in (("pooler", (C, C)), ("classifier", (C, K))):
            layer = getattr(m, name, None)
            g.expect(is_a(layer, "torch.nn.modules.linear.Linear"), f"ClsHead needs an nn.Linear called {name}")
            g.expect((layer.in_features, layer.out_features) == shape,
                     f"{name} should map {shape[0]} to {shape[1]} features, got {layer.in_features} -> {layer.out_features}")

    with g.check("matches classifier(tanh(pooler(h[:, 0]))) with random weights"):
        m, r, w = build("cls.values")
        h = rand("cls.values.h", 4, 7, C)
        out = m(h)
        g.expect(is_tensor(out) and out.shape == (4, K), f"expected a (4, {K}) tensor, got {describe(out)}")
        lin = lambda x, n: F.linear(x, w[f"{n}.weight"], w[f"{n}.bias"])  # noqa: E731
        first_match(g, out, [
            (lin(torch.tanh(lin(h[:, -1], "pooler")), "classifier"),
             "you pooled the last position: BERT classifies from [CLS], the first position, h[:, 0]"),
            (lin(torch.tanh(lin(h.mean(1), "pooler")), "classifier"),
             "you averaged over the positions: BERT's pooler reads only the [CLS] position, h[:, 0]"),
            (lin(lin(h[:, 0], "pooler"), "classifier"),
             "the tanh is missing: pooled = torch.tanh(pooler(h[:, 0]))"),
            (torch.tanh(lin(lin(h[:, 0], "pooler"), "classifier")),
             "the tanh belongs after the pooler, not after the classifier: the logits are not squashed"),
            (lin(torch.relu(lin(h[:, 0], "pooler")), "classifier"), "BERT's pooler uses tanh, not ReLU"),
        ])
        g.expect(close(out, r(h)), "the output differs from classifier(dropout(tanh(pooler(h[:, 0]))))")

    with g.check("only position 0 matters"):
        m, r, _ = build("cls.position")
        h = rand("cls.position.h", 2, 5, C)
        h2 = h.clone()
        h2[:, 1:] = rand("cls.position.other", 2, 4, C)
        a, b = m(h), m(h2)
        g.expect(is_tensor(a) and is_tensor(b) and close(a, b),
                 "changing positions 1 .. T-1 changed the logits: the head reads the [CLS] position only")

    with g.check("dropout before the classifier, only in training mode"):
        m = ClsHead(C, K, 0.5).double()
        m.load_state_dict(random_weights(ref.ClsHead(C, K), "cls.dropout"))
        h = rand("cls.dropout.h", 64, 3, C)
        a, b = m.eval()(h), m(h)
        g.expect(close(a, b), "in eval mode the output must not change between calls")
        c = m.train()(h)
        g.expect(is_tensor(c) and not close(c, a), "in training mode with dropout=0.5 the output should change: "
                                                   "apply nn.Dropout(dropout) to the pooled vector")

    g.finish()


def check_cls_head(ClsHead) -> None:
    """Public: ``ClsHead(4, 2)`` on a hand-made batch."""
    g = Grader("ClsHead (public)")
    with g.check("ClsHead(4, 2, dropout=0.0) on (2, 3, 4) encoder outputs"):
        torch.manual_seed(0)
        m = ClsHead(4, 2, 0.0).eval()
        sd = m.state_dict()
        names = {"pooler.weight", "pooler.bias", "classifier.weight", "classifier.bias"}
        g.expect(isinstance(sd, dict) and set(sd) == names,
                 f"expected parameters {sorted(names)}, got {sorted(sd) if isinstance(sd, dict) else describe(sd)}")
        h = torch.arange(24, dtype=torch.float32).view(2, 3, 4) / 10
        pooled = torch.tanh(F.linear(h[:, 0], sd["pooler.weight"], sd["pooler.bias"]))
        expected = F.linear(pooled, sd["classifier.weight"], sd["classifier.bias"])
        out = m(h)
        g.expect(is_tensor(out) and out.shape == (2, 2), f"expected a (2, 2) tensor, got {describe(out)}")
        g.expect(torch.allclose(out, expected, atol=1e-5), "the output differs from classifier(tanh(pooler(h[:, 0])))")
    g.finish()
