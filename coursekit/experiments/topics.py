"""The fine-tuning task of Chapter 6: which part of the Python documentation a passage comes from.

The passages are the topics of ``pydoc_data.topics`` (the help texts of the interpreter),
labelled with the four groups of :data:`TOPIC_GROUPS`; within each topic the first 80% of its
passages train and the last 20% test. :func:`finetune` trains a
:class:`~coursekit.bert.BertClassifier` on them and :func:`logistic_regression_baseline` is the
bag-of-words yardstick. The unlabeled pretraining text of :mod:`coursekit.experiments.bert_mlm`
contains these passages.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from coursekit import train
from coursekit.bert import Bert, BertClassifier, BertConfig, SpecialTokens

__all__ = [
    "GROUP_NAMES",
    "TOPIC_GROUPS",
    "TopicData",
    "accuracy",
    "check_topic_groups",
    "classifier_loss",
    "duplicate_topics",
    "finetune",
    "logistic_regression_baseline",
    "topic_group",
    "topic_passages",
]

#: Every key of ``pydoc_data.topics`` by the documentation file it comes from, in four groups.
TOPIC_GROUPS: dict[str, tuple[str, ...]] = {
    # reference/simple_stmts and reference/compound_stmts
    "statements": (
        "assert",
        "assignment",
        "async",
        "augassign",
        "break",
        "class",
        "compound",
        "continue",
        "del",
        "else",
        "for",
        "function",
        "global",
        "if",
        "import",
        "nonlocal",
        "pass",
        "raise",
        "return",
        "try",
        "while",
        "with",
        "yield",
    ),
    # reference/expressions and reference/lexical_analysis
    "expressions": (
        "atom-identifiers",
        "atom-literals",
        "attribute-references",
        "await",
        "binary",
        "bitwise",
        "booleans",
        "calls",
        "comparisons",
        "conversions",
        "dict",
        "exprlists",
        "floating",
        "id-classes",
        "identifiers",
        "imaginary",
        "in",
        "integers",
        "lambda",
        "lists",
        "numbers",
        "operator-summary",
        "power",
        "shifting",
        "slicings",
        "strings",
        "subscriptions",
        "unary",
    ),
    # reference/datamodel and reference/executionmodel
    "data model": (
        "attribute-access",
        "callable-types",
        "context-managers",
        "customization",
        "dynamic-features",
        "exceptions",
        "execmodel",
        "naming",
        "numeric-types",
        "objects",
        "sequence-types",
        "specialnames",
        "types",
    ),
    # library/stdtypes, library/string (format strings) and library/pdb
    "built-in types": (
        "bltin-code-objects",
        "bltin-ellipsis-object",
        "bltin-null-object",
        "bltin-type-objects",
        "debugger",
        "formatstrings",
        "specialattrs",
        "string-methods",
        "truth",
        "typesfunctions",
        "typesmapping",
        "typesmethods",
        "typesmodules",
        "typesseq",
        "typesseq-mutable",
    ),
}
GROUP_NAMES = tuple(TOPIC_GROUPS)


def topic_group(key: str) -> int:
    """The index in :data:`GROUP_NAMES` of the group of topic ``key``."""
    for i, keys in enumerate(TOPIC_GROUPS.values()):
        if key in keys:
            return i
    raise KeyError(
        f"topic {key!r} is in no group of TOPIC_GROUPS: add it to the group of its documentation file"
    )


def check_topic_groups(keys) -> None:
    """Raise unless every key of ``keys`` is in exactly one group and every grouped key exists."""
    keys = set(keys)
    grouped = [k for ks in TOPIC_GROUPS.values() for k in ks]
    twice = sorted({k for k in grouped if grouped.count(k) > 1})
    new, gone = sorted(keys - set(grouped)), sorted(set(grouped) - keys)
    if twice or new or gone:
        raise ValueError(
            f"TOPIC_GROUPS does not fit this Python's pydoc_data.topics: in no group {new}, "
            f"in several groups {twice}, grouped but not a topic {gone}"
        )


def duplicate_topics(topics: dict[str, str]) -> dict[str, str]:
    """Topics whose text is mostly inside another topic: ``{key: container}``.

    A topic is a duplicate when at least half of its paragraphs (of more than 60
    characters) occur verbatim in a longer topic, or in one of equal length that sorts
    first (``"if"`` and ``"else"`` are the same text; ``"for"`` is a section of
    ``"compound"``). Keeping them would put the same text in training and test.
    """

    def paragraphs(t):
        return [p.strip() for p in t.split("\n\n") if len(p.strip()) > 60]

    out = {}
    for a in sorted(topics):
        ps = paragraphs(topics[a])
        for b in sorted(topics):
            bigger = len(topics[b]) > len(topics[a]) or (len(topics[b]) == len(topics[a]) and b < a)
            if b != a and bigger and ps and sum(p in topics[b] for p in ps) >= len(ps) / 2:
                out[a] = b
                break
    return out


class TopicData(NamedTuple):
    """Passages as ``[CLS] window [SEP] [PAD]...``: ``ids`` ``(N, T)``, ``mask`` ``(N, T)`` (True =
    real token), ``labels`` ``(N,)``, ``texts`` (the windows decoded) and ``topics`` (their keys)."""

    ids: torch.Tensor
    mask: torch.Tensor
    labels: torch.Tensor
    texts: list[str]
    topics: list[str]


def topic_passages(
    tokenizer, special: SpecialTokens, length: int = 62, min_length: int = 8, test_fraction: float = 0.2
) -> tuple[TopicData, TopicData]:
    """The fine-tuning task: which group of :data:`TOPIC_GROUPS` a passage comes from.

    Each topic (except :func:`duplicate_topics`) is cut into consecutive windows of
    ``length`` tokens; a last, shorter window is kept if it has ``min_length`` tokens or
    more (and padded). Within each topic the last ``round(test_fraction * n)`` of its
    ``n`` passages are the test set and the rest train, so test text follows, and never
    overlaps, the training text of its topic.

    Returns:
        ``(train, test)`` :class:`TopicData`, each passage ``length + 2`` tokens.
    """
    from pydoc_data.topics import topics

    check_topic_groups(topics)
    dupes = duplicate_topics(topics)
    T = length + 2
    split: tuple[list, list] = ([], [])
    for key in sorted(topics):
        if key in dupes:
            continue
        ids = tokenizer.encode_ordinary(topics[key])
        windows = [ids[i : i + length] for i in range(0, len(ids), length)]
        windows = [w for w in windows if len(w) >= min_length]
        n_test = round(test_fraction * len(windows))
        for j, w in enumerate(windows):
            split[j >= len(windows) - n_test].append((w, topic_group(key), key))

    def pack(rows):
        x = torch.full((len(rows), T), special.pad)
        for i, (w, _, _) in enumerate(rows):
            x[i, : len(w) + 2] = torch.tensor([special.cls, *w, special.sep])
        return TopicData(
            x,
            x != special.pad,
            torch.tensor([g for _, g, _ in rows]),
            [tokenizer.decode(w) for w, _, _ in rows],
            [k for _, _, k in rows],
        )

    return pack(split[0]), pack(split[1])


def classifier_loss(model: nn.Module, batch) -> torch.Tensor:
    """``loss_fn`` for :func:`coursekit.train.train`: cross-entropy of ``model(ids, mask)``."""
    ids, mask, labels = batch
    return F.cross_entropy(model(ids, mask), labels)


@torch.no_grad()
def accuracy(model: nn.Module, d: TopicData, batch_size: int = 128) -> float:
    """Fraction of the passages of ``d`` classified correctly, in eval mode."""
    was_training = model.training
    model.eval()
    pred = torch.cat(
        [
            model(d.ids[i : i + batch_size], d.mask[i : i + batch_size]).argmax(-1)
            for i in range(0, len(d.labels), batch_size)
        ]
    )
    model.train(was_training)
    return float((pred == d.labels).double().mean())


def finetune(
    bert: Bert | None,
    config: BertConfig,
    train_data: TopicData,
    test_data: TopicData,
    cfg: train.TrainConfig,
    dropout: float = 0.1,
    progress: bool = False,
) -> tuple[BertClassifier, train.History]:
    """Fine-tune a :class:`~coursekit.bert.BertClassifier` (from ``bert``, or from scratch if ``None``; head
    dropout ``dropout``) with :func:`coursekit.train.train`; batches are random training
    passages. Test accuracy is evaluated at every ``cfg.eval_interval`` steps."""
    torch.manual_seed(cfg.seed)  # the head's initialisation
    k = len(GROUP_NAMES)
    model = (
        BertClassifier.from_bert(bert, k, dropout) if bert is not None else BertClassifier(config, k, dropout)
    )
    n = len(train_data.labels)

    def batch_fn(step, g):
        i = torch.randint(n, (cfg.batch_size,), generator=g)  # (B,)
        return train_data.ids[i], train_data.mask[i], train_data.labels[i]

    history = train.train(
        model,
        batch_fn,
        cfg,
        loss_fn=classifier_loss,
        eval_fn=lambda m: {"test_accuracy": accuracy(m, test_data)},
        progress=progress,
    )
    return model, history


def logistic_regression_baseline(train_data: TopicData, test_data: TopicData, C: float = 10.0) -> float:
    """Test accuracy of a bag-of-words logistic regression on the same passages.

    Features: TF-IDF of word unigrams and bigrams of the decoded passages (scikit-learn's
    ``TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)``); ``LogisticRegression(C=C)``.
    ``C`` is fixed in advance, not tuned on the test set.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    x_train = vectorizer.fit_transform(train_data.texts)
    clf = LogisticRegression(C=C, max_iter=2000).fit(x_train, train_data.labels.numpy())
    return float((clf.predict(vectorizer.transform(test_data.texts)) == test_data.labels.numpy()).mean())
