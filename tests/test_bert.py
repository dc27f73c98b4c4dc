"""coursekit.bert against Hugging Face BERT (tiny random configs, no download), closed forms,
binomial bounds for the masking rule; Chapter 6's experiment (coursekit.experiments.bert_mlm,
coursekit.experiments.topics) and the committed checkpoint bert-small."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from coursekit import bert as B
from coursekit import checkpoints, data
from coursekit.experiments import bert_mlm as M
from coursekit.experiments import topics as T
from tests.conftest import TOL, assert_close
from tests.conftest import randomise as _randomise

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ROOT / "checkpoints"
#: The tiny model the parity tests use: every feature on (2 segments, padding, 2 layers).
TINY = replace(B.BERT_PRESETS["nano"], vocab_size=40, max_len=12, dropout=0.0)
#: How far from its expectation a binomial count may fall, in standard deviations. With
#: a fixed generator the tests are deterministic; 5 sigma keeps them valid for any seed.
Z = 5.0


def hf():
    transformers = pytest.importorskip("transformers")
    return transformers


def hf_mlm(cfg=TINY, seed=0, attn="eager"):
    t = hf()
    torch.manual_seed(seed)
    return t.BertForMaskedLM(t.BertConfig(**cfg.hf_kwargs(), attn_implementation=attn)).double().eval()


def hf_classifier(cfg=TINY, n_classes=3, seed=0):
    t = hf()
    torch.manual_seed(seed)
    config = t.BertConfig(**cfg.hf_kwargs(), num_labels=n_classes, attn_implementation="eager")
    return t.BertForSequenceClassification(config).double().eval()


def randomise(module, seed=0):
    """Random values everywhere (biases, norms and the MLM bias too; 1-D ones around 1), so no mapping error hides."""
    return _randomise(module, seed, scale=0.3, offset_1d=1.0)


def batch(cfg=TINY, B_=3, T=10, seed=0):
    """ids, a padding mask (True = real; row 1 has 4 pads, row 2 has 1) and random segments."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (B_, T), generator=g)
    mask = torch.ones(B_, T, dtype=torch.bool)
    mask[1, T - 4 :] = False
    mask[2, T - 1 :] = False
    segments = torch.randint(0, cfg.n_segments, (B_, T), generator=g)
    return ids, mask, segments


# --------------------------------------------------------------------------- Hugging Face parity


def test_logits_equal_hugging_face_with_its_weights():
    theirs = randomise(hf_mlm())
    ours = B.BertForMaskedLM(TINY).double().eval()
    ours.load_state_dict(B.from_hf_state_dict(theirs.state_dict()))
    ids, mask, segments = batch()
    expected = theirs(input_ids=ids, attention_mask=mask.long(), token_type_ids=segments).logits
    assert_close(ours(ids, mask, segments), expected)


def test_hugging_face_equals_ours_with_our_weights():
    ours = randomise(B.BertForMaskedLM(TINY).double().eval(), seed=1)
    theirs = hf_mlm(seed=5)
    theirs.load_state_dict(B.to_hf_state_dict(ours.state_dict()))  # strict: every HF key, nothing else
    ids, mask, segments = batch(seed=1)
    expected = theirs(input_ids=ids, attention_mask=mask.long(), token_type_ids=segments).logits
    assert_close(ours(ids, mask, segments), expected)


def test_float32_with_hugging_face_sdpa_attention():
    """The default float32 path (HF's SDPA kernel vs our attention) agrees within TOL[float32]."""
    theirs = randomise(hf_mlm(attn="sdpa")).float()
    ours = B.BertForMaskedLM(TINY).eval()
    ours.load_state_dict(B.from_hf_state_dict(theirs.state_dict()))
    ids, mask, segments = batch(seed=2)
    expected = theirs(input_ids=ids, attention_mask=mask.long(), token_type_ids=segments).logits
    real = mask[..., None].expand_as(expected)
    torch.testing.assert_close(ours(ids, mask, segments)[real], expected[real], **TOL[torch.float32])


def test_state_dict_names_round_trip_and_match_hugging_face():
    ours = randomise(B.BertForMaskedLM(TINY).double())
    sd = ours.state_dict()
    hf_keys = set(hf_mlm().state_dict())
    assert set(B.to_hf_state_dict(sd)) == hf_keys
    back = B.from_hf_state_dict(B.to_hf_state_dict(sd))
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)


def test_qkv_rows_are_query_key_value_in_that_order():
    theirs = randomise(hf_mlm())
    ours = B.from_hf_state_dict(theirs.state_dict())
    w = ours["bert.encoder.layers.1.self_attn.qkv_proj.weight"]
    C = TINY.d_model
    for j, part in enumerate(("query", "key", "value")):
        assert torch.equal(
            w[j * C : (j + 1) * C], theirs.state_dict()[f"bert.encoder.layer.1.attention.self.{part}.weight"]
        )


def test_decoder_is_tied_to_the_token_embedding():
    model = B.BertForMaskedLM(TINY)
    assert not any("decoder" in k for k in model.state_dict())
    hf_sd = B.to_hf_state_dict(model.state_dict())
    assert hf_sd["cls.predictions.decoder.weight"] is model.state_dict()[
        "bert.embeddings.token.weight"
    ] or torch.equal(hf_sd["cls.predictions.decoder.weight"], model.bert.embeddings.token.weight)
    untied = dict(hf_sd, **{"cls.predictions.decoder.weight": hf_sd["cls.predictions.decoder.weight"] + 1})
    with pytest.raises(ValueError, match="tied"):
        B.from_hf_state_dict(untied)


def test_classifier_equals_hugging_face_sequence_classification_both_ways():
    theirs = randomise(hf_classifier())
    ours = B.BertClassifier(TINY, 3).double().eval()
    ours.load_state_dict(B.from_hf_state_dict(theirs.state_dict()))
    ids, mask, segments = batch(seed=3)
    expected = theirs(input_ids=ids, attention_mask=mask.long(), token_type_ids=segments).logits
    assert_close(ours(ids, mask, segments), expected)

    randomise(ours, seed=4)
    other = hf_classifier(seed=7)
    other.load_state_dict(B.to_hf_state_dict(ours.state_dict()))
    expected = other(input_ids=ids, attention_mask=mask.long(), token_type_ids=segments).logits
    assert_close(ours(ids, mask, segments), expected)


def test_classifier_from_bert_copies_the_encoder_and_adds_a_fresh_head():
    bert = randomise(B.Bert(TINY))
    clf = B.BertClassifier.from_bert(bert, 5)
    assert all(torch.equal(v, bert.state_dict()[k]) for k, v in clf.bert.state_dict().items())
    assert clf.head.classifier.out_features == 5 and clf.bert is not bert


def test_mapping_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unexpected Hugging Face key"):
        B.from_hf_state_dict({"bert.encoder.layer.0.crossattention.self.query.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="query, key and value"):
        B.from_hf_state_dict({"bert.encoder.layer.0.attention.self.query.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="no Hugging Face name"):
        B.to_hf_state_dict({"bert.pooler.weight": torch.zeros(1)})


# --------------------------------------------------------------------------- question answering


def hf_qa(cfg=TINY, seed=0):
    t = hf()
    torch.manual_seed(seed)
    config = t.BertConfig(**cfg.hf_kwargs(), attn_implementation="eager")
    return t.BertForQuestionAnswering(config).double().eval()


def test_question_answering_equals_hugging_face_both_ways():
    """Start and end logits: ours from HF's weights, and HF's from ours (strict loads both ways)."""
    theirs = randomise(hf_qa())
    ours = B.BertForQuestionAnswering(TINY).double().eval()
    ours.load_state_dict(B.from_hf_state_dict(theirs.state_dict()))
    ids, mask, segments = batch(seed=5)
    out = theirs(input_ids=ids, attention_mask=mask.long(), token_type_ids=segments)
    start, end = ours(ids, mask, segments)
    assert start.shape == end.shape == ids.shape
    assert_close(start, out.start_logits)
    assert_close(end, out.end_logits)

    randomise(ours, seed=6)
    other = hf_qa(seed=8)
    other.load_state_dict(B.to_hf_state_dict(ours.state_dict()))
    out = other(input_ids=ids, attention_mask=mask.long(), token_type_ids=segments)
    start, end = ours(ids, mask, segments)
    assert_close(start, out.start_logits)
    assert_close(end, out.end_logits)


def test_span_head_is_hugging_face_qa_outputs_on_any_hidden_states():
    """Row 0 of qa_outputs gives the start logits and row 1 the end logits, as in HF's split."""
    theirs = randomise(hf_qa(), seed=2)
    head = B.SpanHead(TINY.d_model).double()
    head.qa_outputs.load_state_dict(theirs.qa_outputs.state_dict())
    h = torch.randn(3, 7, TINY.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    start, end = theirs.qa_outputs(h).split(1, dim=-1)  # HF's own forward: (B, T, 1) each
    ours = head(h)
    assert_close(ours[0], start.squeeze(-1))
    assert_close(ours[1], end.squeeze(-1))
    with pytest.raises(ValueError, match=r"\(B, T, C\) with C = 16"):
        head(h[..., :8])


def brute_force_span(start, end, max_len, allowed):
    """Every pair (i, j) in order; a strictly higher score wins, so ties keep the first."""
    best = None
    T = len(start)
    for i in range(T):
        for j in range(i, min(T, i + max_len)):
            if all(allowed[i : j + 1]):
                score = start[i] + end[j]
                if best is None or score > best[2]:
                    best = (i, j, score)
    return best


@pytest.mark.parametrize("max_len", [1, 2, 3, 30])
def test_best_span_equals_brute_force_with_ties_and_masked_positions(max_len):
    g = torch.Generator().manual_seed(max_len)
    B_, T = 64, 9
    # small integers: many ties between spans
    start = torch.randint(-2, 3, (B_, T), generator=g).double()
    end = torch.randint(-2, 3, (B_, T), generator=g).double()
    allowed = torch.rand(B_, T, generator=g) < 0.7  # holes: a span may not cross a forbidden position
    allowed[:16] = torch.arange(T) >= 4  # [CLS] question [SEP] | context: one contiguous block
    allowed[:, 0] |= ~allowed.any(1)  # every row allows something
    i, j, score = B.best_span(start, end, max_len, allowed)
    n_ties = 0
    for b in range(B_):
        expected = brute_force_span(start[b].tolist(), end[b].tolist(), max_len, allowed[b].tolist())
        assert (int(i[b]), int(j[b]), float(score[b])) == expected
        tops = [
            (p, q)
            for p in range(T)
            for q in range(p, min(T, p + max_len))
            if allowed[b, p : q + 1].all() and start[b, p] + end[b, q] == expected[2]
        ]
        n_ties += len(tops) > 1
    assert n_ties > 5  # the test does exercise the tie rule
    assert i.dtype == j.dtype == torch.long and score.dtype == torch.float64


def test_best_span_is_not_the_two_argmaxes():
    """The docstring's example: the best start comes after the best end; masks win over scores."""
    start, end = torch.tensor([[0.0, 3.0, 1.0]]), torch.tensor([[2.0, 0.0, 1.0]])
    i, j, score = B.best_span(start, end, 3)
    assert (int(i), int(j), float(score)) == (1, 2, 4.0)
    assert int(start.argmax()) > int(end.argmax())
    i, j, _ = B.best_span(start, end, 1)  # one-token answers only
    assert (int(i), int(j)) == (1, 1)
    i, j, score = B.best_span(start, end, 3, torch.tensor([[True, False, True]]))
    assert (int(i), int(j), float(score)) == (0, 0, 2.0)


@pytest.mark.parametrize(
    "args,match",
    [
        ((torch.zeros(2, 4), torch.zeros(2, 5), 3), r"both be \(B, T\)"),
        ((torch.zeros(4), torch.zeros(4), 3), r"both be \(B, T\)"),
        ((torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long), 3), "floating point"),
        ((torch.tensor([[0.0, float("nan")]]), torch.zeros(1, 2), 3), "finite"),
        ((torch.zeros(1, 2), torch.tensor([[0.0, float("-inf")]]), 3), "finite"),
        ((torch.zeros(1, 2), torch.zeros(1, 2), 0), "max_len must be an int >= 1"),
        ((torch.zeros(1, 2), torch.zeros(1, 2), 2.0), "max_len must be an int >= 1"),
        ((torch.zeros(1, 2), torch.zeros(1, 2), True), "max_len must be an int >= 1"),
        ((torch.zeros(1, 2), torch.zeros(1, 2), 2, torch.ones(1, 2)), "allowed must be a boolean"),
        (
            (torch.zeros(1, 2), torch.zeros(1, 2), 2, torch.ones(1, 3, dtype=torch.bool)),
            "allowed must be a boolean",
        ),
        (
            (torch.zeros(2, 2), torch.zeros(2, 2), 2, torch.tensor([[True, False], [False, False]])),
            "row 1 allows no",
        ),
    ],
)
def test_best_span_bad_input_gets_a_clear_error(args, match):
    with pytest.raises(ValueError, match=match):
        B.best_span(*args)


# --------------------------------------------------------------------------- parameter counts


@pytest.mark.parametrize("name,published", [("bert-base", 110e6), ("bert-large", 340e6)])
def test_parameter_counts_equal_hugging_face_on_the_meta_device(name, published):
    t = hf()
    cfg = B.BERT_PRESETS[name]
    with torch.device("meta"):
        mlm = t.BertForMaskedLM(t.BertConfig(**cfg.hf_kwargs()))
        base = t.BertModel(t.BertConfig(**cfg.hf_kwargs()))
        clf = t.BertForSequenceClassification(t.BertConfig(**cfg.hf_kwargs(), num_labels=4))
        ours = B.BertForMaskedLM(cfg)
    assert (
        B.bert_params(cfg, "mlm")
        == sum(p.numel() for p in mlm.parameters())
        == sum(p.numel() for p in ours.parameters())
    )
    assert B.bert_params(cfg, "pooler") == sum(p.numel() for p in base.parameters())
    assert B.bert_params(cfg, "classifier", 4) == sum(p.numel() for p in clf.parameters())
    # Devlin et al. (2019) report 110M and 340M; the exact counts are 109.5M and 335.1M
    assert abs(B.bert_params(cfg, "pooler") - published) / published < 0.02


@pytest.mark.parametrize("preset", ["nano", "small"])
def test_parameter_count_of_our_modules(preset):
    cfg = B.BERT_PRESETS[preset]
    assert B.bert_params(cfg, "mlm") == sum(p.numel() for p in B.BertForMaskedLM(cfg).parameters())
    assert B.bert_params(cfg, "none") == sum(p.numel() for p in B.Bert(cfg).parameters())
    assert B.bert_params(cfg, "classifier", 3) == sum(
        p.numel() for p in B.BertClassifier(cfg, 3).parameters()
    )
    with pytest.raises(ValueError, match="head must be one of"):
        B.bert_params(cfg, "nsp")


# --------------------------------------------------------------------------- properties and errors


def test_padding_does_not_change_the_real_tokens_outputs():
    model = randomise(B.BertForMaskedLM(TINY).double().eval())
    g = torch.Generator().manual_seed(0)
    ids, segments = (
        torch.randint(0, TINY.vocab_size, (1, 6), generator=g),
        torch.randint(0, 2, (1, 6), generator=g),
    )
    padded = torch.cat([ids, torch.randint(0, TINY.vocab_size, (1, 5))], 1)
    mask = torch.arange(11)[None] < 6
    alone = model(ids, None, segments)
    with_pads = model(padded, mask, torch.cat([segments, torch.ones(1, 5, dtype=torch.long)], 1))
    assert_close(with_pads[:, :6], alone)


def test_segment_embeddings_change_the_output():
    model = randomise(B.Bert(TINY).double().eval())
    ids, mask, _ = batch()
    assert not torch.allclose(model(ids, mask, torch.ones_like(ids)), model(ids, mask))
    assert_close(model(ids, mask), model(ids, mask, torch.zeros_like(ids)))


def test_bert_has_no_dropout_inside_the_feed_forward():
    """BERT's intermediate layer has no dropout (HF's BertIntermediate); torch's layer does."""
    model = B.Bert(TINY)
    assert all(isinstance(layer.ff.dropout, torch.nn.Identity) for layer in model.encoder.layers)
    assert all(layer.dropout1.p == TINY.dropout and not layer.norm_first for layer in model.encoder.layers)


def test_initialisation_is_berts():
    model = B.BertForMaskedLM(B.BERT_PRESETS["small"])
    w = model.bert.encoder.layers[0].ff.linear1.weight.detach()
    assert abs(float(w.std()) - 0.02) < 0.001 and not model.bert.encoder.layers[0].ff.linear1.bias.any()
    assert not model.mlm.bias.any()


@pytest.mark.parametrize(
    "bad,match",
    [
        (lambda ids: (ids.int(),), "torch.long"),
        (lambda ids: (ids[0],), r"\(B, T\)"),
        (lambda ids: (ids + TINY.vocab_size,), "token ids must be in"),
        (lambda ids: (torch.zeros(1, TINY.max_len + 1, dtype=torch.long),), "positions"),
        (lambda ids: (ids, torch.ones_like(ids)), "boolean"),
        (lambda ids: (ids, None, torch.full_like(ids, 2)), "segment ids"),
    ],
)
def test_bad_input_gets_a_clear_error(bad, match):
    model = B.BertForMaskedLM(TINY)
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=match):
        model(*bad(ids))


def test_config_and_special_tokens_validate():
    with pytest.raises(ValueError, match="must divide"):
        replace(TINY, n_heads=3)
    with pytest.raises(ValueError, match="activation"):
        replace(TINY, activation="swish")
    with pytest.raises(ValueError, match="distinct"):
        B.SpecialTokens(1, 1, 2, 3)
    sp = B.SpecialTokens.after(1024)
    assert sp.ids == (1024, 1025, 1026, 1027) and sp.name(1027) == "[MASK]" and sp.name(5) is None


def test_gradcheck_of_the_classifier_head_and_the_loss():
    torch.manual_seed(0)
    head = B.ClsHead(4, 3, dropout=0.0).double()
    h = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(head, (h,))
    logits = torch.randn(2, 5, 7, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[-100, 3, -100, 0, -100], [6, -100, -100, -100, 1]])
    assert torch.autograd.gradcheck(lambda x: B.mlm_loss(x, labels), (logits,))


# --------------------------------------------------------------------------- masking


def within(count: int, n: int, p: float) -> bool:
    """``count`` successes of ``n`` trials is within Z standard deviations of ``n p``."""
    return abs(count - n * p) <= Z * math.sqrt(n * p * (1 - p)) + 1


def sentences(special, n_ordinary, B_=128, T=128, seed=0):
    """``[CLS] words [SEP] [PAD]...`` rows with random lengths, ordinary ids only inside."""
    g = torch.Generator().manual_seed(seed)
    ordinary = torch.tensor([i for i in range(n_ordinary + 4) if i not in special.ids])
    ids = ordinary[torch.randint(len(ordinary), (B_, T), generator=g)]
    lengths = torch.randint(T // 2, T + 1, (B_,), generator=g)
    for b, n in enumerate(lengths.tolist()):
        ids[b, 0], ids[b, n - 1] = special.cls, special.sep
        ids[b, n:] = special.pad
    return ids


@pytest.mark.parametrize(
    "special", [B.SpecialTokens.after(60), B.SpecialTokens(0, 1, 2, 3)], ids=["appended", "first"]
)
@pytest.mark.parametrize("p", [0.15, 0.4])
def test_mask_tokens_follows_the_80_10_10_rule(special, p):
    V = 64
    ids = sentences(special, V - 4)
    inputs, labels = B.mask_tokens(ids, special, V, torch.Generator().manual_seed(1), p)
    assert inputs.dtype == labels.dtype == torch.long and inputs.shape == labels.shape == ids.shape
    is_special = torch.isin(ids, torch.tensor(special.ids))
    sel = labels != -100
    assert not (sel & is_special).any(), "a special token was selected"
    assert torch.equal(labels[sel], ids[sel]), "labels hold the original ids"
    assert torch.equal(inputs[~sel], ids[~sel]), "unselected positions are unchanged"
    n, k = int((~is_special).sum()), int(sel.sum())
    assert within(k, n, p)
    masked = int((inputs[sel] == special.mask).sum())
    kept = int((inputs[sel] == ids[sel]).sum())
    swapped = inputs[sel][(inputs[sel] != special.mask) & (inputs[sel] != ids[sel])]
    assert within(masked, k, 0.8)
    assert within(kept, k, 0.1 + 0.1 / (V - 4))  # a random token equals the original 1 in V - 4 times
    assert within(len(swapped), k, 0.1 * (1 - 1 / (V - 4)))
    assert not torch.isin(swapped, torch.tensor(special.ids)).any() and int(swapped.max()) < V


def test_random_replacements_cover_the_ordinary_vocabulary_uniformly():
    special, V = B.SpecialTokens.after(12), 16
    ids = sentences(special, 12, B_=256, T=256)
    inputs, labels = B.mask_tokens(ids, special, V, torch.Generator().manual_seed(0), 0.5)
    sel = labels != -100
    swapped = inputs[sel][(inputs[sel] != special.mask) & (inputs[sel] != ids[sel])]
    counts = torch.bincount(swapped, minlength=V)[:12]
    assert all(within(int(c), len(swapped), 1 / 12) for c in counts)


def test_mask_tokens_uses_only_its_generator_and_leaves_the_input():
    special = B.SpecialTokens.after(30)
    ids = sentences(special, 30, B_=8, T=32)
    before, state = ids.clone(), torch.get_rng_state()
    a = B.mask_tokens(ids, special, 34, torch.Generator().manual_seed(3))
    b = B.mask_tokens(ids, special, 34, torch.Generator().manual_seed(3))
    c = B.mask_tokens(ids, special, 34, torch.Generator().manual_seed(4))
    assert torch.equal(torch.get_rng_state(), state) and torch.equal(ids, before)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[1], c[1])


def test_mlm_loss_is_cross_entropy_over_selected_positions_only():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=g, dtype=torch.float64)
    labels = torch.full((3, 7), -100)
    labels[0, 2], labels[1, 5], labels[2, 0], labels[2, 6] = 4, 10, 0, 7
    sel = labels != -100
    expected = -torch.log_softmax(logits[sel], -1).gather(1, labels[sel][:, None]).mean()
    assert_close(B.mlm_loss(logits, labels), expected)
    # changing the logits of unselected positions changes nothing
    other = logits.clone()
    other[~sel] = torch.randn(int((~sel).sum()), 11, generator=g, dtype=torch.float64)
    assert_close(B.mlm_loss(other, labels), expected)


def test_mlm_loss_errors():
    with pytest.raises(ValueError, match="no position is selected"):
        B.mlm_loss(torch.randn(2, 3, 5), torch.full((2, 3), -100))
    with pytest.raises(ValueError, match="shape of logits"):
        B.mlm_loss(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_mlm_batch_is_cls_window_sep_with_masks():
    special = B.SpecialTokens.after(100)
    tokens = torch.arange(100).repeat(5)  # ordinary ids 0..99, consecutive
    inputs, labels = M.mlm_batch(tokens, special, 20, 8, 104, torch.Generator().manual_seed(0))
    assert inputs.shape == (8, 22)
    assert (inputs[:, 0] == special.cls).all() and (inputs[:, -1] == special.sep).all()
    original = torch.where(labels != -100, labels, inputs)[:, 1:-1]
    assert ((original[:, 1:] - original[:, :-1]) % 100 == 1).all(), "windows are contiguous text"


def test_count_baselines_on_a_text_whose_bigrams_are_certain():
    special = B.SpecialTokens.after(8)
    tokens = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 0] * 50)  # 0 is the most frequent
    batches = M.mlm_eval_batches(tokens, special, 30, 16, 12, n_batches=4, seed=0)
    base = M.mlm_baselines(tokens, batches, special, 12)
    targets = torch.cat([lab[lab != -100] for _, lab in batches])
    assert base["unigram"] == pytest.approx(float((targets == 0).double().mean()))
    assert base["bigram"] > 0.85 > base["unigram"]  # 1 -> 2 -> 3 -> 0 always; after 0: 1 (3 in 4 times)


def test_evaluate_mlm_counts_every_masked_position_once():
    model = B.BertForMaskedLM(TINY).eval()
    special = B.SpecialTokens.after(36)
    batches = M.mlm_eval_batches(torch.arange(36).repeat(10), special, 8, 4, 40, n_batches=3)
    got = M.evaluate_mlm(model, batches)
    with torch.no_grad():
        logits = torch.cat([model(x)[y != -100] for x, y in batches])
    targets = torch.cat([y[y != -100] for _, y in batches])
    assert got["n_masked"] == len(targets)
    assert got["loss"] == pytest.approx(float(F.cross_entropy(logits, targets)), rel=1e-5)
    assert got["accuracy"] == pytest.approx(float((logits.argmax(-1) == targets).double().mean()))


def test_encode_with_special_gives_the_mask_its_leading_space():
    tok = data.bpe_tokenizer("the if statement and the for statement " * 20, 300)
    special = B.SpecialTokens.after(tok.vocab_size)
    ids = M.encode_with_special(tok, special, "the [MASK] statement")
    assert ids == tok.encode("the") + [special.mask] + tok.encode(" statement")


# --------------------------------------------------------------------------- the classification task


def test_every_topic_of_this_python_is_in_exactly_one_group():
    from pydoc_data.topics import topics

    T.check_topic_groups(topics)
    grouped = [k for keys in T.TOPIC_GROUPS.values() for k in keys]
    assert sorted(grouped) == sorted(topics)
    with pytest.raises(ValueError, match="in no group \\['match'\\]"):
        T.check_topic_groups([*topics, "match"])
    with pytest.raises(KeyError, match="'match'"):
        T.topic_group("match")


def test_duplicate_topics_are_sections_of_bigger_ones():
    from pydoc_data.topics import topics

    dupes = T.duplicate_topics(topics)
    assert (
        dupes["if"] == dupes["else"] == dupes["for"] == "compound"
        and dupes["customization"] == "specialnames"
    )
    assert "compound" not in dupes and "specialnames" not in dupes and "typesseq" not in dupes
    for key, container in dupes.items():
        assert T.topic_group(key) == T.topic_group(container)


def test_topic_passages_split_each_topic_in_order():
    text = data.split_text(data.load_text("python-docs"))[0]
    tok = data.bpe_tokenizer(text[:60000], 400)
    special = B.SpecialTokens.after(tok.vocab_size)
    train_d, test_d = T.topic_passages(tok, special, length=30)
    for d in (train_d, test_d):
        assert d.ids.shape[1] == 32 and (d.ids[:, 0] == special.cls).all()
        assert torch.equal(d.mask, d.ids != special.pad)
        last = d.mask.sum(1) - 1
        assert (d.ids[torch.arange(len(last)), last] == special.sep).all()
        assert set(d.labels.tolist()) == {0, 1, 2, 3}
    n_train, n_test = len(train_d.labels), len(test_d.labels)
    assert 0.15 < n_test / (n_train + n_test) < 0.25
    assert not set(train_d.topics) & set(T.duplicate_topics(__import__("pydoc_data.topics").topics.topics))


# --------------------------------------------------------------------------- sentence pairs


def documents(sizes=(7, 4, 1, 6, 0, 9), width=3):
    """Documents of consecutive segments whose tokens name them: segment j of document d is
    ``[1000 d + 10 j + k for k < width]``, so any segment says where it came from."""
    return [[[1000 * d + 10 * j + k for k in range(width)] for j in range(n)] for d, n in enumerate(sizes)]


def where(segment):
    """(document, index) of a segment of :func:`documents`."""
    return segment[0] // 1000, segment[0] % 1000 // 10


def test_pack_pairs_equals_hugging_face_bert_tokenizer_on_a_padded_pair_batch(tmp_path):
    """The reference: transformers.BertTokenizer on a word-level vocabulary (no download), whose
    ids for [PAD] [UNK] [CLS] [SEP] [MASK] are 0..4 and for word ``w<i>`` are ``5 + i``."""
    t = hf()
    words = [f"w{i}" for i in range(30)]
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]))
    tokenizer = t.BertTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=False)
    pairs = [([3, 4], [7], 1), ([5], [8, 9, 10], 0), ([11, 12, 13, 14], [15], 1)]
    expected = tokenizer(
        [" ".join(words[i] for i in a) for a, _, _ in pairs],
        [" ".join(words[i] for i in b) for _, b, _ in pairs],
        padding=True,
    )
    special = B.SpecialTokens(pad=0, cls=2, sep=3, mask=4)
    ids, mask, segments = B.pack_pairs(
        [([5 + i for i in a], [5 + i for i in b]) for a, b, _ in pairs], special
    )
    assert ids.tolist() == expected["input_ids"]
    assert segments.tolist() == expected["token_type_ids"]
    assert mask.tolist() == [[bool(v) for v in row] for row in expected["attention_mask"]]
    assert ids.dtype == segments.dtype == torch.long and mask.dtype == torch.bool


def test_pack_pairs_gives_segment_ids_0_then_1_and_pads_to_a_length():
    special = B.SpecialTokens.after(50)
    ids, mask, segments = B.pack_pairs([([1, 2, 3], [4, 5]), ([6], [7])], special, length=9)
    assert ids.tolist() == [[51, 1, 2, 3, 52, 4, 5, 52, 50], [51, 6, 52, 7, 52, 50, 50, 50, 50]]
    assert segments.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 0, 0, 0, 0]]
    assert torch.equal(mask, ids != special.pad)
    with pytest.raises(ValueError, match="needs 8 tokens packed .* but length is 7"):
        B.pack_pairs([([1, 2, 3], [4, 5])], special, length=7)
    with pytest.raises(ValueError, match="pair 1 has an empty segment"):
        B.pack_pairs([([1], [2]), ([], [2])], special)
    with pytest.raises(ValueError, match="at least one pair"):
        B.pack_pairs([], special)


def test_packed_pairs_run_through_the_model_with_their_segment_ids():
    """The segment ids change the encoding of b only through E_seg: all 0 differs, the real ids agree with HF."""
    special = B.SpecialTokens.after(TINY.vocab_size - 4)
    ids, mask, segments = B.pack_pairs([([1, 2], [3, 4, 5]), ([6, 7, 8], [9])], special)
    model = randomise(B.Bert(TINY).double().eval())
    with_ids, without = model(ids, mask, segments), model(ids, mask, torch.zeros_like(segments))
    assert not torch.allclose(with_ids[mask], without[mask])
    theirs = hf().BertModel(
        hf().BertConfig(**TINY.hf_kwargs(), attn_implementation="eager"), add_pooling_layer=False
    )
    theirs = theirs.double().eval()
    hf_state = {
        k.removeprefix("bert."): v
        for k, v in B.to_hf_state_dict({f"bert.{k}": v for k, v in model.state_dict().items()}).items()
    }
    theirs.load_state_dict(hf_state)
    expected = theirs(input_ids=ids, attention_mask=mask.long(), token_type_ids=segments).last_hidden_state
    assert_close(with_ids[mask], expected[mask])


def test_sop_pairs_are_neighbours_kept_or_swapped_exactly():
    docs = documents()
    pairs = B.sop_pairs(docs, torch.Generator().manual_seed(0))
    assert len(pairs) == sum(len(d) // 2 for d in docs)
    seen = []
    for a, b, label in pairs:
        (da, ja), (db, jb) = where(a), where(b)
        assert da == db, "both segments come from one document"
        first, second = (ja, jb) if label == 1 else (jb, ja)
        assert first % 2 == 0 and second == first + 1, "neighbours, taken two at a time"
        assert (a, b) == (
            (docs[da][first], docs[da][second]) if label == 1 else (docs[da][second], docs[da][first])
        )
        assert label in (0, 1)
        seen.append((da, first))
    assert seen == sorted(seen) and len(set(seen)) == len(seen), "each neighbour pair once, in document order"


def test_nsp_pairs_keep_the_next_segment_or_draw_one_from_another_document():
    docs = documents()
    pairs = B.nsp_pairs(docs, torch.Generator().manual_seed(0))
    assert len(pairs) == sum(len(d) // 2 for d in docs)
    for a, b, label in pairs:
        (da, ja), (db, jb) = where(a), where(b)
        assert ja % 2 == 0 and a == docs[da][ja]
        if label == 1:
            assert (db, jb) == (da, ja + 1)
        else:
            assert label == 0 and db != da and b == docs[db][jb]
    assert [where(a) for a, _, _ in pairs] == [
        (d, j) for d, s in enumerate(docs) for j in range(0, len(s) - 1, 2)
    ]


@pytest.mark.parametrize("maker", [B.nsp_pairs, B.sop_pairs])
def test_pair_labels_are_fair_coins(maker):
    """Over 2,000 pairs the share of label 1 is within Z binomial standard deviations of 1/2."""
    docs = documents(sizes=(100,) * 40)
    labels = torch.tensor([label for _, _, label in maker(docs, torch.Generator().manual_seed(3))])
    n = len(labels)
    assert n == 2000
    assert abs(int(labels.sum()) - n / 2) < Z * math.sqrt(n / 4)
    again = torch.tensor([label for _, _, label in maker(docs, torch.Generator().manual_seed(3))])
    assert torch.equal(labels, again), "the same generator seed gives the same pairs"


def test_nsp_negatives_come_from_every_other_document_uniformly():
    """Negatives of document 0 are spread over the 9 others: a chi-square test at 5 sigma-ish (p < 1e-5)."""
    docs = documents(sizes=(2000,) + (3,) * 9)
    pairs = B.nsp_pairs(docs, torch.Generator().manual_seed(1))
    counts = torch.zeros(10)
    for a, b, label in pairs:
        if label == 0 and where(a)[0] == 0:
            counts[where(b)[0]] += 1
    assert counts[0] == 0
    expected = counts.sum() / 9
    chi2 = float(((counts[1:] - expected) ** 2 / expected).sum())
    assert chi2 < 40.0, f"chi-square {chi2:.1f} on 8 degrees of freedom"  # p < 1e-5


def test_pair_makers_refuse_empty_segments_and_a_lonely_document():
    with pytest.raises(ValueError, match="document 1 has an empty segment"):
        B.sop_pairs([[[1], [2]], [[3], []]], torch.Generator())
    with pytest.raises(ValueError, match="needs another document"):
        # the coin must come up 0 at least once in 64 pairs
        B.nsp_pairs([[[i] for i in range(128)]], torch.Generator().manual_seed(0))
    assert B.sop_pairs([[[1]], []], torch.Generator()) == []


# --------------------------------------------------------------------------- the committed checkpoint


@pytest.mark.slow  # not in the quick loop: evaluates the committed checkpoint on its whole validation split
def test_checkpoint_reproduces_its_recorded_validation_loss():
    """Deterministic re-evaluation of the committed float16 weights on the fixed validation set."""
    if not (CHECKPOINTS / "bert-small.pt").is_file():
        pytest.fail("checkpoints/bert-small.pt is missing: run `coursekit pretrain bert-small`")
    ck = checkpoints.load("bert-small", CHECKPOINTS)
    model, tok, special, metrics = ck.model, ck.tokenizer, ck.special, ck.metrics
    size = sum(p.stat().st_size for p in CHECKPOINTS.glob("bert-small*"))
    assert size < 6e6, f"the checkpoint files take {size / 1e6:.1f} MB"
    val_text = data.split_text(data.load_text("python-docs"))[1]
    val = data.encode_text(tok, val_text)
    v = metrics["validation"]
    batches = M.mlm_eval_batches(
        val,
        special,
        model.config.max_len - 2,
        v["batch_size"],
        model.config.vocab_size,
        v["batches"],
        v["seed"],
    )
    got = M.evaluate_mlm(model, batches)
    assert got["n_masked"] == v["n_masked"]
    assert got["loss"] == pytest.approx(v["loss"], abs=1e-4)
    assert got["accuracy"] == pytest.approx(v["accuracy"], abs=1e-3)
    assert v["accuracy"] > metrics["baselines"]["bigram"] + 0.05


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("COURSEKIT_RETRAIN") != "1", reason="retraining: set COURSEKIT_RETRAIN=1 (a few minutes)"
)
def test_retraining_a_short_version_writes_a_consistent_checkpoint(tmp_path):
    torch.set_num_threads(1)
    recipe = replace(M.BERT_SMALL, max_steps=150, finetune_steps=30)
    metrics = checkpoints.pretrain("bert-small", tmp_path, recipe, progress=False)["metrics"]
    ck = checkpoints.load("bert-small", tmp_path)
    model, tok, special, recorded = ck.model, ck.tokenizer, ck.special, ck.metrics
    assert recorded == json.loads(json.dumps(metrics))
    val = data.encode_text(tok, data.split_text(data.load_text("python-docs"))[1])
    batches = M.mlm_eval_batches(val, special, model.config.max_len - 2, 32, model.config.vocab_size, 8, 0)
    assert M.evaluate_mlm(model, batches)["loss"] == pytest.approx(recorded["validation"]["loss"], abs=1e-4)
    evals = metrics["train"]["evals"]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 1.0, "MLM training lowered the validation loss"
    assert metrics["validation"]["accuracy"] > metrics["baselines"]["unigram"]
