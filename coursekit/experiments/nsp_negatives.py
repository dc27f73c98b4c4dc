"""Chapter 6's negatives experiment: how much of next-sentence prediction is the topic?

Chapter 6's word-overlap classifier (:func:`coursekit.experiments.bert_pairs.overlap_accuracy`: a
logistic regression on two order-free numbers per pair, the TF-IDF cosine and the word overlap)
solves most of BERT's next-sentence pairs, because a negative ``b`` is a segment of *another topic*.
This experiment keeps everything else and draws the negatives from *the same topic* instead: a
segment of ``a``'s own document that is neither ``a`` nor one of its two neighbours
(:func:`same_topic_pairs`). Topic no longer tells the classes apart; what word overlap still finds
is how much more a passage shares with the text right after it than with the rest of its topic.

**Data.** As the chapter's overlap sweep at its longest segments: the topics of
``pydoc_data.topics`` in ``bert-small``'s BPE (:func:`~coursekit.experiments.bert_pairs.topic_tokens`),
the first half of each topic's tokens for training and the second for test, cut into segments
of :data:`LENGTH` tokens. Only the documents (halves of topics) with at least
:data:`MIN_SEGMENTS` segments take part, in both kinds of pairs, so that every ``a`` has a far
segment; the two kinds differ only in where a negative comes from. Seed ``s`` draws the coins and
the negatives (the segments themselves are fixed by the length).

``python -m coursekit.experiments.nsp_negatives`` runs both kinds for every seed of :data:`SEEDS`
(about a minute on one thread) and rewrites :data:`RESULTS`, which Chapter 6's exercise reads
(``predict_same_topic_negatives``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from coursekit.bert import _check_documents, _coin, nsp_pairs
from coursekit.experiments import bert_pairs
from coursekit.experiments._results import CommittedResults

__all__ = [
    "GAP",
    "LENGTH",
    "MIN_SEGMENTS",
    "NEGATIVES",
    "RESULTS",
    "SEEDS",
    "load_results",
    "make_pairs",
    "run_all",
    "run_seed",
    "same_topic_pairs",
    "settings",
]

LENGTH = bert_pairs.OVERLAP_LENGTHS[-1]  #: segment length in tokens: the chapter sweep's longest, 128
MIN_SEGMENTS = 4  #: a document takes part only with this many segments: every a has a far segment
GAP = 2  #: a same-topic negative lies at least this many segments from a (neither a nor a neighbour)
SEEDS = (0, 1, 2)
RESULTS = Path(__file__).with_name("nsp_negatives_results.json")
_COMMITTED = CommittedResults(
    module="coursekit.experiments.nsp_negatives",
    path=RESULTS,
    fmt="coursekit-nsp-negatives",
    version=1,
    what="stored next-sentence negatives experiment",
    seeds=SEEDS,
)


def same_topic_pairs(
    documents: Sequence[Sequence[Sequence[int]]], generator: torch.Generator, gap: int = GAP
) -> list[tuple[Sequence[int], Sequence[int], int]]:
    """Next-sentence pairs whose negatives come from the same document.

    As :func:`coursekit.bert.nsp_pairs`, each document's segments are taken two at a time,
    ``(s0, s1), (s2, s3), ...``, and a fair coin decides: label 1 keeps ``(s_2j, s_2j+1)``; label 0
    replaces ``s_2j+1`` by a segment ``s_k`` of the same document with ``|k - 2j| >= gap``, drawn
    uniformly (with ``gap = 2``: neither ``a`` itself nor a segment next to it).
    Example: one document ``[s0, s1, s2, s3]`` may give ``[(s0, s3, 0), (s2, s3, 1)]``.

    Args:
        documents: each a list of consecutive segments (token id sequences, none empty).
        generator: the source of every coin and draw.
        gap: the least distance, in segments, between ``a`` and its negative; at least 2.

    Returns:
        ``(a, b, label)`` triples, document by document, the segments themselves (not copies).

    Raises:
        ValueError: an empty segment, a gap below 2, or a pair with no segment far enough away.
    """
    if not isinstance(gap, int) or gap < 2:
        raise ValueError(
            f"gap must be an integer >= 2 (a negative is neither a nor the next segment), got {gap!r}"
        )
    _check_documents(documents)
    out = []
    for d, segments in enumerate(documents):
        for j in range(0, len(segments) - 1, 2):
            if _coin(generator):
                out.append((segments[j], segments[j + 1], 1))
                continue
            far = [k for k in range(len(segments)) if abs(k - j) >= gap]
            if not far:
                raise ValueError(
                    f"document {d} has {len(segments)} segments: segment {j} has none {gap} or more away"
                )
            out.append((segments[j], segments[far[int(torch.randint(len(far), (), generator=generator))]], 0))
    return out


#: where a negative b comes from -> the pairing
NEGATIVES = {"other topic": nsp_pairs, "same topic": same_topic_pairs}


def make_pairs(negatives: str, tokens: dict[str, list[int]], seed: int):
    """Training and test pairs whose negatives come from ``negatives`` (a key of :data:`NEGATIVES`).

    Each topic's first half of tokens is cut into a training document and the second half into a
    test document, of :data:`LENGTH`-token segments; a document with fewer than
    :data:`MIN_SEGMENTS` segments is left empty. One generator seeded ``seed`` draws the training
    pairs, then the test pairs.

    Returns:
        ``(train_pairs, test_pairs)``, lists of ``(a, b, label)``.
    """
    if negatives not in NEGATIVES:
        raise ValueError(f"negatives must be one of {list(NEGATIVES)}, got {negatives!r}")
    fixed = torch.Generator()  # cut_segments draws lengths in [LENGTH, LENGTH]: nothing random
    parts: tuple[list, list] = ([], [])
    for ids in tokens.values():
        cut = round((1 - bert_pairs.OVERLAP_TEST_FRACTION) * len(ids))
        for part, half in zip(parts, (ids[:cut], ids[cut:])):
            segments = bert_pairs.cut_segments(half, LENGTH, LENGTH, fixed)
            part.append(segments if len(segments) >= MIN_SEGMENTS else [])
    g = torch.Generator().manual_seed(seed)
    pair = NEGATIVES[negatives]
    return pair(parts[0], g), pair(parts[1], g)


def run_seed(seed: int, tokenizer, tokens: dict[str, list[int]] | None = None) -> dict[str, dict]:
    """``{negatives: {"accuracy": the overlap classifier's test accuracy, "n_train", "n_test"}}``."""
    tokens = tokens if tokens is not None else bert_pairs.topic_tokens(tokenizer)
    out = {}
    for negatives in NEGATIVES:
        train_pairs, test_pairs = make_pairs(negatives, tokens, seed)
        out[negatives] = {
            "accuracy": round(bert_pairs.overlap_accuracy(train_pairs, test_pairs, tokenizer), 6),
            "n_train": len(train_pairs),
            "n_test": len(test_pairs),
        }
    return out


def settings() -> dict:
    """What a stored result depends on besides the code: the corpus and tokenizer (as the chapter's
    pair experiment records them) and every constant here."""
    base = bert_pairs.settings()
    return {
        **{k: base[k] for k in ("topics_sha256", "checkpoint", "checkpoint_sha256", "overlap_test_fraction")},
        "negatives": list(NEGATIVES),
        "length": LENGTH,
        "min_segments": MIN_SEGMENTS,
        "gap": GAP,
    }


def run_all(seeds=SEEDS) -> list[dict]:
    """:func:`run_seed` for every seed."""
    from coursekit import checkpoints

    tokenizer = checkpoints.load(bert_pairs.CHECKPOINT).tokenizer
    tokens = bert_pairs.topic_tokens(tokenizer)
    return [run_seed(s, tokenizer, tokens) for s in seeds]


def load_results(path: str | Path = RESULTS) -> dict:
    """The stored runs: ``{"seeds", "settings": settings(), "runs": [run_seed(s) per seed]}``.

    Raises:
        ValueError: if the file was written with other settings than the code's (rerun
            ``python -m coursekit.experiments.nsp_negatives``).
    """
    return _COMMITTED.read(
        path,
        settings=settings(),
        layout_ok=lambda data: (
            len(data["runs"]) == len(data["seeds"]) and all(list(r) == list(NEGATIVES) for r in data["runs"])
        ),
    )


def main(argv: list[str] | None = None) -> None:
    _COMMITTED.main(
        argv,
        "Rerun Chapter 6's next-sentence negatives experiment: word overlap on negatives of another topic "
        "and of the same topic.",
        lambda args: {"settings": settings(), "runs": run_all(args.seeds)},
    )


if __name__ == "__main__":
    main()
