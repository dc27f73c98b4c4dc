"""The Exercise 8 graders, tested like code: correct implementations written differently get full
marks, the public checks catch the plain mistakes, and the references the graders use agree with
the independent ones the text names.

(The reference passing, the stubs failing and every catalogued mutant losing its points with its
hint are checked for every assignment by ``tests/test_graders.py``.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from coursekit import layers, multihead
from coursekit import seq2seq as ref
from coursekit.grading import GradingFailure, harness
from coursekit.grading import ch08_seq2seq as grader
from coursekit.grading.core import tensor
from tests.grading_support import full_marks, public_checks
from tests.mutants.ch08_seq2seq import MUTANTS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny tensors run on one thread

A = "ch08_seq2seq"
#: the classes the notebook passes to a grader besides the student's object
EXTRA = {"cross_attention": (multihead.MultiHeadAttention,)}
PUBLIC = public_checks(grader)


# --------------------------------------------------------------------------- correct alternatives

_LAYER_HEAD = """
class PreNormDecoderLayer(DecoderLayer):
    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, dropout: float = 0.1,
                 activation: str = "relu", eps: float = 1e-5, bias: bool = True):
        super().__init__(d_model, n_heads, d_ff, dropout, activation, norm_first=True, eps=eps, bias=bias)

    def forward(self, x, memory, memory_key_padding_mask=None):
"""

CORRECT = {
    "shift_right": {
        "an empty tensor filled column by column": """
def shift_right(labels, bos_id, pad_id):
    if not torch.is_tensor(labels) or labels.ndim != 2 or labels.dtype != torch.int64 or labels.size(1) == 0:
        raise ValueError("labels must be a (B, T) LongTensor with T >= 1")
    out = torch.empty_like(labels)
    out[:, 0] = bos_id
    out[:, 1:] = labels[:, :-1]
    out[out == -100] = pad_id
    return out
""",
        "Hugging Face's shift_tokens_right, copied": """
def shift_right(labels, bos_id, pad_id):
    if labels.dim() != 2 or labels.shape[-1] < 1 or labels.dtype != torch.long:
        raise ValueError(f"bad labels {labels.dtype} {tuple(labels.shape)}")
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = bos_id
    shifted.masked_fill_(shifted == -100, pad_id)
    return shifted
""",
        "torch.roll, then the first column and torch.where": """
def shift_right(labels, bos_id, pad_id):
    if labels.dim() != 2 or labels.shape[1] < 1 or labels.dtype != torch.long:
        raise ValueError("labels")
    rolled = torch.roll(labels, shifts=1, dims=-1)
    rolled[:, 0] = bos_id
    return torch.where(rolled == -100, torch.full_like(rolled, pad_id), rolled)
""",
    },
    "cross_attention": {
        "by hand: masked_fill, softmax, nan_to_num for sources with no real token": """
def cross_attention(attn, x, memory, memory_key_padding_mask=None):
    q, k, v = attn.project(x, memory)
    rep = attn.n_heads // attn.n_kv_heads
    k, v = repeat_kv(k, rep), repeat_kv(v, rep)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if memory_key_padding_mask is not None:
        m = memory_key_padding_mask
        if m.dtype != torch.bool or tuple(m.shape) != (memory.shape[0], memory.shape[1]):
            raise ValueError("memory_key_padding_mask must be a bool (B, S) tensor")
        scores = scores.masked_fill(~m[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if attn.training:
        weights = F.dropout(weights, p=attn.dropout)
    return attn.out_proj(merge_heads(weights @ v)), weights
""",
        "einsum over groups of heads, an additive float mask": """
def cross_attention(attn, x, memory, memory_key_padding_mask=None):
    B, T, C = x.shape
    S = memory.shape[1]
    if memory_key_padding_mask is not None and (memory_key_padding_mask.dtype is not torch.bool
                                                or memory_key_padding_mask.shape != (B, S)):
        raise ValueError("mask")
    q, k, v = attn.project(x, memory)
    G, H, D = attn.n_kv_heads, attn.n_heads, attn.d_head
    qg = q.view(B, G, H // G, T, D)
    scores = torch.einsum("bgrtd,bgsd->bgrts", qg, k) / D ** 0.5
    if memory_key_padding_mask is not None:
        add = torch.zeros(B, S, dtype=scores.dtype).masked_fill(~memory_key_padding_mask, float("-inf"))
        scores = scores + add[:, None, None, None, :]
    w = torch.softmax(scores, -1)
    w = torch.where(torch.isnan(w), torch.zeros_like(w), w).reshape(B, H, T, S)
    if attn.training and attn.dropout > 0:
        w = F.dropout(w, attn.dropout, training=True)
    out = torch.einsum("bgrts,bgsd->bgrtd", w.view(B, G, H // G, T, S), v).reshape(B, H, T, D)
    return attn.out_proj(out.transpose(1, 2).reshape(B, T, C)), w
""",
    },
    "PreNormDecoderLayer": {
        "an explicit causal mask, one line per sub-layer": _LAYER_HEAD
        + """
        T = x.shape[1]
        h = self.norm1(x)
        x = x + self.dropout1(self.self_attn(h, mask=torch.ones(T, T, dtype=torch.bool).tril())[0])
        c, w = cross_attention(self.cross_attn, self.norm2(x), memory, memory_key_padding_mask=memory_key_padding_mask)
        x = x + self.dropout2(c)
        return x + self.dropout3(self.ff(self.norm3(x))), w
""",
        "keyword arguments and a residual variable": _LAYER_HEAD
        + """
        residual = x
        a, _ = self.self_attn(self.norm1(residual), is_causal=True, need_weights=False)
        residual = residual + self.dropout1(a)
        attended, weights = cross_attention(attn=self.cross_attn, x=self.norm2(residual), memory=memory,
                                            memory_key_padding_mask=memory_key_padding_mask)
        residual = residual + self.dropout2(attended)
        residual = residual + self.dropout3(self.ff(self.norm3(residual)))
        return residual, weights
""",
    },
    "label_smoothed_loss": {
        "logsumexp: -log p_v = lse - z_v": """
def label_smoothed_loss(logits, targets, smoothing=0.1, pad_id=0):
    if logits.dim() < 2 or tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError("targets must have the shape logits.shape[:-1]")
    z = logits.reshape(-1, logits.shape[-1])
    t = targets.reshape(-1)
    keep = t != pad_id
    if keep.sum() == 0:
        raise ValueError("only padding")
    z, t = z[keep], t[keep]
    lse = torch.logsumexp(z, dim=-1)
    nll = lse - z.gather(1, t[:, None])[:, 0]
    smooth = lse - z.mean(dim=-1)
    return ((1 - smoothing) * nll + smoothing * smooth).mean()
""",
        "a smoothed one-hot target distribution": """
def label_smoothed_loss(logits, targets, smoothing=0.1, pad_id=0):
    if logits.ndim < 2 or targets.shape != logits.shape[:-1]:
        raise ValueError("shapes")
    V = logits.shape[-1]
    mask = (targets != pad_id)
    if not mask.any():
        raise ValueError("nothing to score")
    q = F.one_hot(targets.clamp(0, V - 1), V).to(logits.dtype) * (1 - smoothing) + smoothing / V
    per = -(q * F.log_softmax(logits, dim=-1)).sum(-1)
    return (per * mask).sum() / mask.sum()
""",
        "F.cross_entropy with label_smoothing, after the checks": """
def label_smoothed_loss(logits, targets, smoothing=0.1, pad_id=0):
    if logits.dim() < 2 or targets.shape != logits.shape[:-1]:
        raise ValueError("targets must be logits.shape[:-1]")
    if bool((targets == pad_id).all()):
        raise ValueError("every target is padding")
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=pad_id, label_smoothing=smoothing)
""",
    },
}


@pytest.mark.parametrize("part, label", [(p, label) for p, alts in CORRECT.items() for label in alts])
def test_correct_alternatives_get_full_marks(part, label):
    full_marks(A, part, CORRECT[part][label])


# --------------------------------------------------------------------------- the public checks

CAUGHT_BY_PUBLIC = [
    "shift_drops_first_label",
    "shift_forgets_bos",
    "shift_rolls",
    "shift_keeps_minus_100",
    "shift_in_place",
    "shift_no_value_error",
    "cross_kv_from_decoder",
    "cross_mask_ignored",
    "cross_mask_inverted",
    "cross_no_out_proj",
    "cross_nan_for_a_source_without_tokens",
    "cross_without_repeat_kv",
    "cross_dropout_in_eval_mode",
    "layer_post_norm",
    "layer_not_causal",
    "layer_no_cross_residual",
    "layer_memory_mask_ignored",
    "layer_dropout2_on_the_input",
    "loss_smooths_other_classes",
    "loss_counts_padding",
    "loss_summed",
    "loss_no_smoothing",
    "loss_log_of_softmax",
    "loss_fixed_pad_id",
    "loss_nan_for_only_padding",
]


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.name in CAUGHT_BY_PUBLIC], ids=lambda m: m.name)
def test_public_checks_catch_the_plain_mistakes(mutant):
    ns = harness.namespace(A)
    exec(compile(mutant.source, f"<mutant {mutant.name}>", "exec"), ns)
    with pytest.raises(GradingFailure):
        PUBLIC[mutant.part](ns[mutant.target], *EXTRA.get(mutant.part, ()))


def test_the_catalogue_names_exist():
    assert set(CAUGHT_BY_PUBLIC) <= {m.name for m in MUTANTS}


# --------------------------------------------------------------------------- the references


def test_shift_right_equals_hugging_face_bart():
    pytest.importorskip("transformers")
    from transformers.models.bart.modeling_bart import shift_tokens_right

    for seed in range(10):
        labels = grader._ids_from(seed, 1 + seed % 3, 1 + seed % 7)
        labels[torch.rand(labels.shape, generator=torch.Generator().manual_seed(seed)) < 0.3] = -100
        for bos, pad in ((1, 0), (5, 9)):
            assert torch.equal(ref.shift_right(labels, bos, pad), shift_tokens_right(labels, pad, bos))


def test_the_layer_reference_equals_torch_with_and_without_biases():
    for config in grader.LAYERS:
        _, r, t = grader._layer_triple(
            grader.Grader("x"), ref.PreNormDecoderLayer, f"test.{config}", config, with_torch=True
        )
        x, memory = tensor(1, 2, 4, config[0]), tensor(2, 2, 5, config[0])
        keep = grader._keep_mask(3, 2, 5)
        assert torch.allclose(r(x, memory, keep)[0], grader._torch_layer(t, x, memory, keep), atol=1e-10)


def test_cross_attention_reference_handles_a_source_without_tokens():
    m, r = grader.attention_pair(multihead.MultiHeadAttention, "test.empty")
    x, memory = tensor(1, 2, 3, grader.C), tensor(2, 2, 4, grader.C)
    keep = grader.ref_padding([4, 0], 4)
    out, w = r(x, kv=memory, key_padding_mask=keep, need_weights=True)
    assert torch.equal(w[1], torch.zeros_like(w[1]))
    assert torch.allclose(out[1], r.out_proj.bias.expand(3, -1))
    assert torch.allclose(ref.cross_attention(m, x, memory, keep)[0], out)


def test_label_smoothing_reference_is_the_formula_of_the_text():
    logits = tensor(1, 3, 4, 7)
    targets = torch.randint(1, 7, (3, 4), generator=torch.Generator().manual_seed(2))
    targets[0, 2:] = 0
    lp = F.log_softmax(logits, -1)
    per = 0.7 * -lp.gather(-1, targets[..., None])[..., 0] + 0.3 * -lp.mean(-1)
    assert torch.allclose(grader._smoothed_ref(logits, targets, 0.3), per[targets != 0].mean())


def test_a_layer_stub_fails_plainly():
    class Stub(layers.DecoderLayer):
        def __init__(self, d_model, n_heads, d_ff=None, dropout=0.1, activation="relu", eps=1e-5, bias=True):
            super().__init__(d_model, n_heads, d_ff, dropout, activation, norm_first=True, eps=eps, bias=bias)

        def forward(self, x, memory, memory_key_padding_mask=None):
            raise NotImplementedError()

    with pytest.raises(GradingFailure, match="not implemented yet"):
        grader.grade_pre_norm_decoder_layer(Stub)


def test_dropout_isolation_tells_where_a_dropout_is_applied():
    """With only dropout1 at p = 1 the reference's self-attention sub-layer adds nothing; a layer that applies
    dropout1 to the sub-layer's input instead (so attends over zeros) gives another output."""
    _, r, _ = grader._layer_triple(grader.Grader("x"), ref.PreNormDecoderLayer, "test.isolation")
    r.dropout1.p = 1.0
    r.train()
    x, memory = tensor(3, 2, 3, grader.C), tensor(4, 2, 4, grader.C)
    expected = r(x, memory)[0]
    c = ref.cross_attention(r.cross_attn, r.norm2(x), memory)[0]
    assert torch.allclose(expected, x + c + r.ff(r.norm3(x + c)))  # the sub-layer added nothing
    h = x + r.self_attn(r.dropout1(r.norm1(x)), is_causal=True)[0]  # dropout on the input instead
    c = ref.cross_attention(r.cross_attn, r.norm2(h), memory)[0]
    wrong = h + c + r.ff(r.norm3(h + c))
    assert not torch.allclose(wrong, expected)


# --------------------------------------------------------------------------- predict, then check


def test_the_bleu_question_is_what_its_explanation_says():
    """Seven one-word references translated one too high and one four-word reference translated exactly: every
    wrong output is a different single word; corpus BLEU is 100 (4/11)^(1/4), as sacrebleu computes it, while the
    mean of the sentence scores is 12.5 (exact match); the question's answer is the corpus score."""
    from sacrebleu.metrics import BLEU

    from coursekit.experiments import number_words as num

    refs = [num.english(n) for n in grader.BLEU_ONE_WORD_NUMBERS] + [num.english(grader.BLEU_LONG_NUMBER)]
    hyps = [num.english(n + 1) for n in grader.BLEU_ONE_WORD_NUMBERS] + [refs[-1]]
    assert all(len(r.split()) == 1 for r in refs[:-1]) and len(refs[-1].split()) == 4
    assert all(h != r and len(h.split()) == 1 for h, r in zip(hyps[:-1], refs[:-1]))
    corpus = ref.bleu(hyps, refs)
    assert corpus == pytest.approx(BLEU().corpus_score(hyps, [refs]).score, abs=1e-9)
    assert corpus == pytest.approx(100 * (4 / 11) ** 0.25, abs=1e-9)
    sentences = [ref.bleu([h], [r], effective_order=True) for h, r in zip(hyps, refs)]
    assert sum(sentences) / len(sentences) == pytest.approx(12.5)
    assert grader.BLEU_ONE_WORD.truth() == "d"


def test_dropout_in_eval_mode_is_named_only_when_it_is_the_cause():
    """The eval-mode check tells dropout in eval mode from an inverted mask (whose weights may look dropped)."""
    from tests.mutants import failures

    said = failures("ch08_seq2seq", "cross_dropout_in_eval_mode", hidden=True)
    assert "dropout was applied in eval mode" in said
    said = failures("ch08_seq2seq", "cross_mask_inverted", hidden=True)
    assert "dropout was applied in eval mode" not in said and "output or the weights" not in said


def test_a_wrong_gradient_is_not_blamed_on_detach():
    """Ignoring the padding mask changes the gradient; only a missing gradient is told to avoid .detach()."""
    from tests.mutants import failures

    said = failures("ch08_seq2seq", "cross_mask_ignored", hidden=True)
    assert (
        "the gradient with respect to x differs from the reference" in said and "avoid .detach()" not in said
    )
