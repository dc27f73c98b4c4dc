"""Chapter 6's sentence-pair experiment: next-sentence against sentence-order prediction.

The documents are the topics of ``pydoc_data.topics`` (the Python reference manual, the corpus of
the ``bert-small`` checkpoint), encoded with the checkpoint's BPE, less the topics that are copies
of others (:func:`coursekit.experiments.topics.duplicate_topics`). Within each topic the first 80%
of the tokens train and the last 20% test (:data:`TEST_FRACTION`; half and half for the overlap
classifier), so no test text is ever seen in training. Each part is cut into consecutive segments
(:func:`cut_segments`), and the segments are paired by :func:`coursekit.bert.nsp_pairs` (BERT's
next-sentence prediction: the next segment, or a random segment of another topic) or
:func:`coursekit.bert.sop_pairs` (ALBERT's sentence-order prediction: two neighbours, in order or
swapped).

Two measurements, each for every seed of :data:`SEEDS` (a seed draws the segment lengths, the
coins and the random segments, and for fine-tuning also the head and the batches):

- **what word overlap alone can do** (:func:`overlap_sweep`): a logistic regression on two
  order-free numbers per pair (:func:`overlap_features`: the cosine similarity of the two
  segments' TF-IDF vectors and the Jaccard overlap of their word sets), for segments of every
  length of :data:`OVERLAP_LENGTHS` tokens, half of each topic for test
  (:data:`OVERLAP_TEST_FRACTION`). The features do not change when the two segments are
  swapped, so on sentence-order pairs this classifier is at chance by construction; on
  next-sentence pairs it measures how much of the task is topic;
- **fine-tuning bert-small on the pair tasks** (:func:`finetune_pairs`): ``[CLS] a [SEP] b [SEP]``
  with segments of :data:`PAIR_LENGTHS` tokens (so a pair fits the model's 64 positions), with
  the segment ids 0/1 of :func:`coursekit.bert.pack_pairs` (``"segment ids"``) or with every
  id 0 (``"all zeros"``: the segment embedding ablated), :data:`STEPS` steps of
  :data:`BATCH` pairs at learning rate :data:`LR`. Beside them, the overlap classifier on the
  same pairs.

``python -m coursekit.experiments.bert_pairs`` reruns everything (about four minutes of CPU on
one thread) and rewrites :data:`RESULTS`, which the chapter loads.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from coursekit import checkpoints, train
from coursekit.bert import Bert, BertClassifier, SpecialTokens, nsp_pairs, pack_pairs, sop_pairs
from coursekit.experiments._results import CommittedResults
from coursekit.experiments.topics import duplicate_topics

__all__ = [
    "BATCH",
    "CHECKPOINT",
    "LR",
    "OVERLAP_LENGTHS",
    "OVERLAP_TEST_FRACTION",
    "PAIR_LENGTHS",
    "RESULTS",
    "SEEDS",
    "STEPS",
    "TASKS",
    "TEST_FRACTION",
    "VARIANTS",
    "cut_segments",
    "finetune_pairs",
    "load_results",
    "make_pairs",
    "overlap_accuracy",
    "overlap_features",
    "overlap_sweep",
    "pair_accuracy",
    "run_all",
    "segment_ids",
    "settings",
    "topic_tokens",
]

CHECKPOINT = "bert-small"  #: the pretrained encoder and its tokenizer
TEST_FRACTION = 0.2  #: the last share of each topic's tokens that is test text (fine-tuning)
#: the same for the overlap classifier: two parameters need few training pairs, and long segments
#: give few pairs, so half of each topic is test text
OVERLAP_TEST_FRACTION = 0.5
TASKS = {"nsp": nsp_pairs, "sop": sop_pairs}  #: next-sentence and sentence-order prediction
OVERLAP_LENGTHS = (16, 32, 64, 128)  #: segment lengths (tokens) of the overlap classifier's sweep
PAIR_LENGTHS = (10, 30)  #: fine-tuning segments: lengths uniform in this range, so a pair fits 64 positions
VARIANTS = ("segment ids", "all zeros")  #: the segment ids the fine-tuned model is given
STEPS, BATCH, LR = 300, 32, 1e-3  #: fine-tuning: AdamW steps, pairs per step, peak learning rate
HEAD_DROPOUT = 0.1  #: dropout before the classifier, as in Chapter 6's topic fine-tuning
SEEDS = (0, 1, 2)
RESULTS = Path(__file__).with_name("bert_pairs_results.json")
_COMMITTED = CommittedResults(
    module="coursekit.experiments.bert_pairs",
    path=RESULTS,
    fmt="coursekit-bert-pairs",
    version=1,
    what="stored sentence-pair experiment",
    seeds=SEEDS,
)


# --------------------------------------------------------------------------- data


def topic_tokens(tokenizer) -> dict[str, list[int]]:
    """Every topic of ``pydoc_data.topics`` that is not a copy of another, encoded: ``{key: ids}``,
    in sorted key order."""
    from pydoc_data.topics import topics

    dupes = duplicate_topics(topics)
    return {key: tokenizer.encode_ordinary(topics[key]) for key in sorted(topics) if key not in dupes}


def cut_segments(ids: list[int], lo: int, hi: int, generator: torch.Generator) -> list[list[int]]:
    """Cut ``ids`` into consecutive segments whose lengths are drawn uniformly from ``[lo, hi]``.

    The segments start at the first token and follow each other without gap; the tail that is
    too short for the next drawn length is left out. Example: 10 tokens with ``lo = hi = 4`` give
    ``[ids[0:4], ids[4:8]]``.

    Raises:
        ValueError: unless ``1 <= lo <= hi``.
    """
    if not 1 <= lo <= hi:
        raise ValueError(f"segment lengths need 1 <= lo <= hi, got lo={lo}, hi={hi}")
    out, start = [], 0
    while True:
        n = int(torch.randint(lo, hi + 1, (), generator=generator))
        if start + n > len(ids):
            return out
        out.append(ids[start : start + n])
        start += n


def make_pairs(
    task: str, tokens: dict[str, list[int]], lo: int, hi: int, seed: int, test_fraction: float = TEST_FRACTION
):
    """Training and test pairs of ``task`` (a key of :data:`TASKS`) from segments of ``lo`` to ``hi`` tokens.

    Each topic's first ``1 - test_fraction`` of tokens are cut into the training documents and
    the rest into the test documents; random segments of next-sentence pairs come from the same
    part. One generator seeded ``seed`` draws the lengths, then the training pairs, then the test pairs.

    Returns:
        ``(train_pairs, test_pairs)``, lists of ``(a, b, label)``.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {list(TASKS)}, got {task!r}")
    g = torch.Generator().manual_seed(seed)
    parts: tuple[list, list] = ([], [])
    for ids in tokens.values():
        cut = round((1 - test_fraction) * len(ids))
        parts[0].append(cut_segments(ids[:cut], lo, hi, g))
        parts[1].append(cut_segments(ids[cut:], lo, hi, g))
    return TASKS[task](parts[0], g), TASKS[task](parts[1], g)


# --------------------------------------------------------------------------- word overlap


def overlap_features(pairs, tokenizer, vectorizer) -> np.ndarray:
    """Two order-free numbers per pair: the cosine similarity of the segments' TF-IDF vectors and
    the Jaccard overlap ``|A & B| / |A | B|`` of their word sets (0 when both are empty).

    Args:
        pairs: ``(a, b, ...)`` token id segments, decoded with ``tokenizer``.
        vectorizer: a fitted scikit-learn ``TfidfVectorizer`` (l2-normalised rows); its words are
            the word sets.

    Returns:
        ``(N, 2)`` float64. Swapping ``a`` and ``b`` gives the same row.
    """
    a = vectorizer.transform([tokenizer.decode(p[0]) for p in pairs])  # (N, words), rows of norm 1
    b = vectorizer.transform([tokenizer.decode(p[1]) for p in pairs])  # (N, words)
    cosine = np.asarray(a.multiply(b).sum(1)).ravel()  # (N,)
    a_set, b_set = (a > 0).astype(np.float64), (b > 0).astype(np.float64)
    shared = np.asarray(a_set.multiply(b_set).sum(1)).ravel()  # (N,)
    union = np.asarray(a_set.sum(1)).ravel() + np.asarray(b_set.sum(1)).ravel() - shared  # (N,)
    return np.stack([cosine, shared / np.maximum(union, 1)], axis=1)  # (N, 2)


def overlap_accuracy(train_pairs, test_pairs, tokenizer) -> float:
    """Test accuracy of a logistic regression (scikit-learn, ``C = 1``) on :func:`overlap_features`.

    The TF-IDF vocabulary and weights (``sublinear_tf=True``) are fitted on the training pairs'
    segments only.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    texts = sorted({tokenizer.decode(s) for p in train_pairs for s in p[:2]})
    vectorizer = TfidfVectorizer(sublinear_tf=True).fit(texts)
    y_train = np.array([p[2] for p in train_pairs])
    y_test = np.array([p[2] for p in test_pairs])
    clf = LogisticRegression().fit(overlap_features(train_pairs, tokenizer, vectorizer), y_train)
    return float((clf.predict(overlap_features(test_pairs, tokenizer, vectorizer)) == y_test).mean())


def overlap_sweep(tokens, tokenizer, seed: int) -> dict[str, dict[str, dict]]:
    """:func:`overlap_accuracy` for every task and every segment length of :data:`OVERLAP_LENGTHS`.

    Returns:
        ``{task: {str(length): {"accuracy": float, "n_train": int, "n_test": int}}}``.
    """
    out: dict[str, dict[str, dict]] = {}
    for task in TASKS:
        out[task] = {}
        for length in OVERLAP_LENGTHS:
            train_pairs, test_pairs = make_pairs(task, tokens, length, length, seed, OVERLAP_TEST_FRACTION)
            out[task][str(length)] = {
                "accuracy": round(overlap_accuracy(train_pairs, test_pairs, tokenizer), 6),
                "n_train": len(train_pairs),
                "n_test": len(test_pairs),
            }
    return out


# --------------------------------------------------------------------------- fine-tuning


def segment_ids(token_type_ids: torch.Tensor, variant: str) -> torch.Tensor:
    """The segment ids the model is given: the packed ones (``"segment ids"``) or zeros (``"all zeros"``)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {list(VARIANTS)}, got {variant!r}")
    return token_type_ids if variant == "segment ids" else torch.zeros_like(token_type_ids)


def _trim(ids, mask, types):
    """Drop the columns that are padding in every row (the model's output at real tokens is unchanged)."""
    T = int(mask.sum(1).max())
    return ids[:, :T], mask[:, :T], types[:, :T]


@torch.no_grad()
def pair_accuracy(
    model: BertClassifier, packed, labels: torch.Tensor, variant: str, batch_size: int = 256
) -> float:
    """Share of the packed pairs ``(input_ids, attention_mask, token_type_ids)`` classified right, in eval mode."""
    was_training = model.training
    model.eval()
    right = 0
    for i in range(0, len(labels), batch_size):
        ids, mask, types = _trim(*(t[i : i + batch_size] for t in packed))
        right += int(
            (model(ids, mask, segment_ids(types, variant)).argmax(-1) == labels[i : i + batch_size]).sum()
        )
    model.train(was_training)
    return right / len(labels)


def finetune_pairs(
    bert: Bert, special: SpecialTokens, train_pairs, test_pairs, variant: str, seed: int
) -> dict[str, float | list[float]]:
    """Fine-tune a copy of ``bert`` with a new ``[CLS]`` head on pairs ``(a, b, label)``, two classes.

    Inputs are :func:`~coursekit.bert.pack_pairs` with the segment ids of ``variant``
    (:func:`segment_ids`, the same at training and test). Seed ``seed`` fixes the head
    (``torch.manual_seed``) and the batches (:func:`coursekit.train.train`).

    Returns:
        ``{"test_accuracy": float, "curve": [test accuracy at steps 0, STEPS/4, ..., STEPS]}``,
        rounded to 6 decimals.
    """
    torch.manual_seed(seed)
    model = BertClassifier.from_bert(bert, 2, HEAD_DROPOUT)
    packed_train = pack_pairs(train_pairs, special)  # each (N, T)
    packed_test = pack_pairs(test_pairs, special)
    y_train = torch.tensor([p[2] for p in train_pairs])
    y_test = torch.tensor([p[2] for p in test_pairs])

    def batch_fn(step, g):
        i = torch.randint(len(y_train), (BATCH,), generator=g)  # (B,)
        return (*_trim(*(t[i] for t in packed_train)), y_train[i])

    def loss_fn(m, batch):
        ids, mask, types, y = batch
        return F.cross_entropy(m(ids, mask, segment_ids(types, variant)), y)

    cfg = train.TrainConfig(
        max_steps=STEPS,
        batch_size=BATCH,
        lr=LR,
        warmup_steps=STEPS // 10,
        weight_decay=0.01,
        eval_interval=STEPS // 4,
        seed=seed,
    )
    history = train.train(
        model,
        batch_fn,
        cfg,
        loss_fn=loss_fn,
        eval_fn=lambda m: {"acc": pair_accuracy(m, packed_test, y_test, variant)},
        progress=False,
    )
    curve = [round(e["acc"], 6) for e in history.evals]
    return {"test_accuracy": curve[-1], "curve": curve}


# --------------------------------------------------------------------------- the committed runs


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def settings() -> dict:
    """What a stored result depends on besides the code: the corpus (this Python's manual), the
    checkpoint's weights and every constant of the experiment."""
    from pydoc_data.topics import topics

    weights, _, tokenizer = checkpoints.files(CHECKPOINT)  # the .pt, .json and .tokenizer.json files
    return {
        "topics_sha256": _sha("\0".join(f"{k}\0{topics[k]}" for k in sorted(topics)).encode()),
        "checkpoint": CHECKPOINT,
        "checkpoint_sha256": _sha(weights.read_bytes() + tokenizer.read_bytes()),
        "test_fraction": TEST_FRACTION,
        "overlap_test_fraction": OVERLAP_TEST_FRACTION,
        "tasks": list(TASKS),
        "overlap_lengths": list(OVERLAP_LENGTHS),
        "pair_lengths": list(PAIR_LENGTHS),
        "variants": list(VARIANTS),
        "steps": STEPS,
        "batch": BATCH,
        "lr": LR,
        "head_dropout": HEAD_DROPOUT,
    }


def run_seed(seed: int, ck=None) -> dict:
    """Everything for one seed: ``{"overlap": overlap_sweep(...), "pairs": {task: {...}}}`` where each
    task holds ``n_train``, ``n_test``, ``overlap`` (the overlap classifier's accuracy on the same
    pairs) and one :func:`finetune_pairs` result per variant."""
    ck = ck or checkpoints.load(CHECKPOINT)
    tokens = topic_tokens(ck.tokenizer)
    out = {"overlap": overlap_sweep(tokens, ck.tokenizer, seed), "pairs": {}}
    for task in TASKS:
        train_pairs, test_pairs = make_pairs(task, tokens, *PAIR_LENGTHS, seed)
        out["pairs"][task] = {
            "n_train": len(train_pairs),
            "n_test": len(test_pairs),
            "overlap": round(overlap_accuracy(train_pairs, test_pairs, ck.tokenizer), 6),
            **{
                v: finetune_pairs(ck.model.bert, ck.special, train_pairs, test_pairs, v, seed)
                for v in VARIANTS
            },
        }
    return out


def run_all(seeds=SEEDS) -> list[dict]:
    """:func:`run_seed` for every seed."""
    ck = checkpoints.load(CHECKPOINT)
    return [run_seed(s, ck) for s in seeds]


def load_results(path: str | Path = RESULTS) -> dict:
    """The stored runs: ``{"seeds", "settings": settings(), "cpu_seconds", "runs": [run_seed(s) per seed]}``.

    Raises:
        ValueError: if the file was written with other settings than the code's (rerun
            ``python -m coursekit.experiments.bert_pairs``).
    """

    def layout_ok(data):
        runs = data["runs"]
        return len(runs) == len(data["seeds"]) and all(
            list(r["overlap"]) == list(TASKS)
            and all(list(r["overlap"][t]) == [str(n) for n in OVERLAP_LENGTHS] for t in TASKS)
            and list(r["pairs"]) == list(TASKS)
            and all(set(VARIANTS) <= set(r["pairs"][t]) for t in TASKS)
            for r in runs
        )

    return _COMMITTED.read(
        path,
        settings=settings(),
        layout_ok=layout_ok,
    )


def main(argv: list[str] | None = None) -> None:
    _COMMITTED.main(
        argv,
        "Rerun Chapter 6's next-sentence against sentence-order prediction experiment.",
        lambda args: {"settings": settings(), "runs": run_all(args.seeds)},
    )


if __name__ == "__main__":
    main()
