"""The Exercise 6 graders, tested like code: correct answers written differently keep full marks.

The reference passing, the release failing and the catalogue's mistakes losing their points (with
their hints) are tested for every exercise by ``tests/test_graders.py``; what the generated mutants
do, by ``tests/test_mutation.py``.
"""

from __future__ import annotations

import pytest
import torch

from coursekit.grading import ch06_bert as grader
from coursekit.grading.core import GradingFailure
from tests.grading_support import full_marks

A = "ch06_bert"

#: answer cell grade id -> correct answers written differently from the instructor's
ALTERNATIVES = {
    "BertEmbeddings": {
        "nn.LayerNorm, sliced positions, F.dropout with the module's p": """
class BertEmbeddings(nn.Module):
    def __init__(self, vocab_size, max_len, d_model, n_segments=2, dropout=0.1, eps=1e-12):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.segment = nn.Embedding(n_segments, d_model)
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids, token_type_ids=None):
        B, T = input_ids.shape
        if T > self.position.weight.shape[0]:
            raise ValueError(f"sequence of length {T} is longer than max_len={self.position.weight.shape[0]}")
        if token_type_ids is None:
            token_type_ids = input_ids.new_zeros(B, T)
        x = self.token(input_ids) + self.position.weight[:T] + self.segment(token_type_ids)
        return F.dropout(self.norm(x), p=self.dropout.p, training=self.training)
""",
        "expanded position ids moved with .to(), a module list": """
class BertEmbeddings(nn.Module):
    def __init__(self, vocab_size, max_len, d_model, n_segments=2, dropout=0.1, eps=1e-12):
        super().__init__()
        self.max_len = max_len
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.segment = nn.Embedding(n_segments, d_model)
        self.norm = LayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids, token_type_ids=None):
        B, T = input_ids.shape
        if T > self.max_len:
            raise ValueError(f"got {T} tokens, at most {self.max_len} allowed")
        positions = torch.arange(T).to(input_ids.device).unsqueeze(0).expand(B, T)
        segments = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        parts = [self.token(input_ids), self.position(positions), self.segment(segments)]
        return self.dropout(self.norm(sum(parts)))
""",
    },
    "mask_tokens": {
        "exactly k positions, Bernoulli draws (Hugging Face's order)": """
def mask_tokens(input_ids, special, vocab_size, generator, mlm_probability=0.15):
    is_special = torch.isin(input_ids, torch.tensor(special.ids))
    scores = torch.rand(input_ids.shape, generator=generator).masked_fill(is_special, 2.0)
    k = round(mlm_probability * int((~is_special).sum()))
    selected = torch.zeros(input_ids.numel(), dtype=torch.bool)
    selected[scores.flatten().argsort()[:k]] = True
    selected = selected.view(input_ids.shape)
    labels = input_ids.masked_fill(~selected, -100)
    inputs = input_ids.clone()
    replace = torch.bernoulli(torch.full(input_ids.shape, 0.8), generator=generator).bool() & selected
    inputs[replace] = special.mask
    rand = torch.bernoulli(torch.full(input_ids.shape, 0.5), generator=generator).bool() & selected & ~replace
    ordinary = torch.tensor([i for i in range(vocab_size) if i not in special.ids])
    inputs[rand] = ordinary[torch.randint(len(ordinary), (int(rand.sum()),), generator=generator)]
    return inputs, labels
""",
        "a probability matrix, one categorical draw per position": """
def mask_tokens(input_ids, special, vocab_size, generator, mlm_probability=0.15):
    specials = set(special.ids)
    is_special = torch.tensor([[int(i) in specials for i in row] for row in input_ids.tolist()],
                              dtype=torch.bool).view(input_ids.shape)
    probability = torch.full(input_ids.shape, float(mlm_probability)).masked_fill(is_special, 0.0)
    selected = torch.bernoulli(probability, generator=generator).bool()
    labels = torch.full_like(input_ids, -100)
    labels[selected] = input_ids[selected]
    action = torch.multinomial(torch.tensor([0.8, 0.1, 0.1]), input_ids.numel(), replacement=True,
                               generator=generator).view(input_ids.shape)
    ordinary = [i for i in range(vocab_size) if i not in specials]
    random_ids = torch.tensor(ordinary)[torch.randint(0, len(ordinary), input_ids.shape, generator=generator)]
    inputs = input_ids.clone()
    inputs[selected & (action == 0)] = special.mask
    inputs[selected & (action == 1)] = random_ids[selected & (action == 1)]
    return inputs, labels
""",
    },
    "mlm_loss": {
        "log_softmax and gather": """
def mlm_loss(logits, labels):
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels {list(labels.shape)} do not match logits {list(logits.shape)}[:-1] = "
                         f"{list(logits.shape[:-1])}")
    mask = labels != -100
    if mask.sum() == 0:
        raise ValueError("nothing to predict")
    logp = F.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(picked * mask).sum() / mask.sum()
""",
        "logsumexp, boolean indexing": """
def mlm_loss(logits, labels):
    if tuple(labels.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"expected labels of shape {tuple(logits.shape[:-1])}, got {tuple(labels.shape)}")
    sel = labels != -100
    if not sel.any():
        raise ValueError("no label to predict")
    x, y = logits[sel], labels[sel]
    return (torch.logsumexp(x, dim=-1) - x[torch.arange(len(y)), y]).mean()
""",
        "the largest logit subtracted, nll_loss": """
def mlm_loss(logits, labels):
    if labels.size() != logits.size()[:-1]:
        raise ValueError(f"shape mismatch: logits {logits.size()} and labels {labels.size()}")
    if (labels == -100).all():
        raise ValueError("all labels are -100")
    z = logits - logits.amax(dim=-1, keepdim=True).detach()
    logp = z - z.exp().sum(-1, keepdim=True).log()
    return F.nll_loss(logp.flatten(0, -2), labels.flatten())
""",
    },
    "ClsHead": {
        "pooler on every position, then position 0; F.linear": """
class ClsHead(nn.Module):
    def __init__(self, d_model, n_classes, dropout=0.1):
        super().__init__()
        self.pooler = nn.Linear(d_model, d_model)
        self.act = nn.Tanh()
        self.dropout = nn.Dropout(p=dropout)
        self.classifier = nn.Linear(d_model, n_classes)

    def forward(self, hidden):
        pooled = self.act(self.pooler(hidden))[:, 0, :]
        pooled = self.dropout(pooled)
        return F.linear(pooled, self.classifier.weight, self.classifier.bias)
""",
        "select and addmm": """
class ClsHead(nn.Module):
    def __init__(self, d_model, n_classes, dropout=0.1):
        super().__init__()
        self.pooler = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_model, n_classes)

    def forward(self, hidden):
        cls = hidden.select(1, 0)
        pooled = torch.addmm(self.pooler.bias, cls, self.pooler.weight.t()).tanh()
        return self.classifier(self.dropout(pooled))
""",
    },
    "predict_same_topic_negatives": {
        "an upper-case letter with spaces": 'predict_same_topic_negatives = " B "\n'
    },
}

CASES = [(gid, name) for gid, answers in ALTERNATIVES.items() for name in answers]


@pytest.mark.parametrize("gid, name", CASES, ids=[f"{g}: {n}" for g, n in CASES])
def test_a_correct_answer_written_differently_keeps_full_marks(gid, name):
    full_marks(A, gid, ALTERNATIVES[gid][name])


def test_an_unstable_loss_fails_at_large_logits_with_its_hint():
    def mlm_loss(logits, labels):
        if logits.shape[:-1] != labels.shape:
            raise ValueError(f"expected {tuple(logits.shape[:-1])}, got {tuple(labels.shape)}")
        sel = labels != -100
        if not sel.any():
            raise ValueError("nothing selected")
        p = torch.softmax(logits[sel], dim=-1)
        return -torch.log(p[torch.arange(int(sel.sum())), labels[sel]]).mean()

    with pytest.raises(GradingFailure) as info:
        grader.grade_mlm_loss(mlm_loss)
    assert "stable for large logits" in str(info.value) and "compute the log-softmax stably" in str(
        info.value
    )
    assert "checks failed" in str(info.value) and str(info.value).count("  - ") == 1


@pytest.mark.parametrize(
    "other, same, letter",
    [
        (0.86, 0.71, "b"),  # the committed runs' kind: topic is most, not all
        (0.86, 0.55, "c"),  # within 8 points of a coin
        (0.86, 0.83, "a"),  # within 5 points of the other topic's
        (0.70, 0.80, "d"),  # more than 5 points above it
        (0.86, 0.80, "no choice fits"),  # 6 points below: between (a) and (b)
        (0.86, 0.59, "no choice fits"),  # between chance and (b)'s 60%
    ],
)
def test_the_same_topic_question_names_a_letter_only_where_the_runs_fit_it(other, same, letter):
    from coursekit.grading.ch06_bert import same_topic_choice

    assert same_topic_choice(other, same).startswith(letter)


def test_a_hint_shows_the_number_the_student_gave():
    with pytest.raises(GradingFailure) as failed:
        grader.grade_corrupted_fraction(lambda *args, **kwargs: 0.125)
    assert "gave float 0.125, expected 0.0" in str(failed.value) and "gave float," not in str(failed.value)
