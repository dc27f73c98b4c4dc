"""Chapter 6's labelled-data sweep: when does pretraining start to pay on the topic task?

The task is the chapter's passage classification (:func:`coursekit.experiments.topics.topic_passages`:
which of four parts of the Python reference manual a 62-token passage comes from, the last 20% of
each topic's passages for test). For every size of :data:`SIZES` (``"all"``: every training
passage) and every seed of :data:`SEEDS`, :func:`labelled_subset` keeps that many training
passages (the first ``n`` of a permutation drawn from the seed, so a seed's smaller sets are
inside its larger ones), and three classifiers learn from them:

- ``"pretrained"``: the ``bert-small`` checkpoint's encoder with a new ``[CLS]`` head, fine-tuned;
- ``"random init"``: the same architecture from a random initialisation, trained the same way;
- ``"tf-idf"``: the chapter's bag-of-words logistic regression
  (:func:`coursekit.experiments.topics.logistic_regression_baseline`).

Both networks train for :data:`STEPS` steps of :data:`BATCH` passages drawn with replacement from
the subset, at learning rate :data:`LR` (chosen before the sweep, the same for every size: a
small set is seen many times over, a large one about twice), and are scored on every test passage.
Seed ``s`` fixes the subset, the head (and the random encoder), and the batches.

``python -m coursekit.experiments.bert_labels`` reruns the sweep (about three minutes of CPU on
one thread) and rewrites :data:`RESULTS`, which the chapter loads.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from coursekit import checkpoints, train
from coursekit.experiments._results import CommittedResults
from coursekit.experiments.topics import TopicData, finetune, logistic_regression_baseline, topic_passages

__all__ = [
    "BATCH",
    "CHECKPOINT",
    "INITS",
    "LR",
    "RESULTS",
    "SEEDS",
    "SIZES",
    "STEPS",
    "labelled_subset",
    "load_results",
    "run_all",
    "run_size",
    "settings",
    "size_key",
]

CHECKPOINT = "bert-small"  #: the pretrained encoder and its tokenizer
SIZES = (16, 32, 64, 128, 256, None)  #: labelled training passages; ``None``: all of them
INITS = ("pretrained", "random init")  #: where the fine-tuned encoder starts
STEPS, BATCH, LR = 200, 16, 1e-3  #: AdamW steps, passages per step, peak learning rate
SEEDS = (0, 1, 2)
RESULTS = Path(__file__).with_name("bert_labels_results.json")
_COMMITTED = CommittedResults(
    module="coursekit.experiments.bert_labels",
    path=RESULTS,
    fmt="coursekit-bert-labels",
    version=1,
    what="stored labelled-data sweep",
    seeds=SEEDS,
)


def size_key(n: int | None) -> str:
    """The key of a size in the stored results: ``16 -> "16"``, ``None -> "all"``."""
    return "all" if n is None else str(n)


def labelled_subset(data: TopicData, n: int | None, seed: int) -> TopicData:
    """The first ``n`` passages of a random permutation of ``data`` drawn from ``seed`` (all for ``None``).

    For one seed, the subset of a smaller ``n`` is inside the subset of a larger one.

    Raises:
        ValueError: ``n`` is not between 1 and the number of passages.
    """
    total = len(data.labels)
    if n is not None and not 1 <= n <= total:
        raise ValueError(f"n must be between 1 and {total} passages (or None for all), got {n}")
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[: total if n is None else n]
    return TopicData(
        data.ids[order],
        data.mask[order],
        data.labels[order],
        [data.texts[i] for i in order],
        [data.topics[i] for i in order],
    )


def run_size(n: int | None, seed: int, ck, train_data: TopicData, test_data: TopicData) -> dict[str, float]:
    """Test accuracy of each classifier trained on :func:`labelled_subset` ``(train_data, n, seed)``.

    Returns:
        ``{"pretrained": float, "random init": float, "tf-idf": float}``, rounded to 6 decimals.
    """
    subset = labelled_subset(train_data, n, seed)
    cfg = train.TrainConfig(
        max_steps=STEPS,
        batch_size=BATCH,
        lr=LR,
        warmup_steps=STEPS // 10,
        weight_decay=0.01,
        eval_interval=STEPS,
        seed=seed,
    )
    out = {}
    for init in INITS:
        bert = ck.model.bert if init == "pretrained" else None
        _, history = finetune(bert, ck.model.config, subset, test_data, cfg)  # seeds the head from cfg.seed
        out[init] = round(history.evals[-1]["test_accuracy"], 6)
    out["tf-idf"] = round(logistic_regression_baseline(subset, test_data), 6)
    return out


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def settings() -> dict:
    """What a stored result depends on besides the code: the corpus (this Python's manual), the
    checkpoint and every constant of the sweep."""
    from pydoc_data.topics import topics

    weights, _, tokenizer = checkpoints.files(CHECKPOINT)  # the .pt, .json and .tokenizer.json files
    return {
        "topics_sha256": _sha("\0".join(f"{k}\0{topics[k]}" for k in sorted(topics)).encode()),
        "checkpoint": CHECKPOINT,
        "checkpoint_sha256": _sha(weights.read_bytes() + tokenizer.read_bytes()),
        "sizes": [size_key(n) for n in SIZES],
        "inits": list(INITS),
        "steps": STEPS,
        "batch": BATCH,
        "lr": LR,
    }


def run_all(seeds=SEEDS) -> dict:
    """Every size and seed: ``{"n_train", "n_test", "majority", "runs": {size_key: [run_size per seed]}}``.

    ``majority`` is the test accuracy of always answering the most frequent group of all the training passages.
    """
    ck = checkpoints.load(CHECKPOINT)
    train_data, test_data = topic_passages(ck.tokenizer, ck.special)
    majority = (test_data.labels == torch.bincount(train_data.labels).argmax()).double().mean()
    return {
        "n_train": len(train_data.labels),
        "n_test": len(test_data.labels),
        "majority": round(float(majority), 6),
        "runs": {size_key(n): [run_size(n, s, ck, train_data, test_data) for s in seeds] for n in SIZES},
    }


def load_results(path: str | Path = RESULTS) -> dict:
    """The stored sweep: ``{"seeds", "settings": settings(), "cpu_seconds", **run_all(seeds)}``.

    Raises:
        ValueError: if the file was written with other settings than the code's (rerun
            ``python -m coursekit.experiments.bert_labels``).
    """
    return _COMMITTED.read(
        path,
        settings=settings(),
        layout_ok=lambda data: (
            list(data["runs"]) == [size_key(n) for n in SIZES]
            and all(
                len(runs) == len(data["seeds"]) and all(list(r) == [*INITS, "tf-idf"] for r in runs)
                for runs in data["runs"].values()
            )
        ),
    )


def main(argv: list[str] | None = None) -> None:
    _COMMITTED.main(
        argv,
        "Rerun Chapter 6's sweep over the number of labelled passages.",
        lambda args: {"settings": settings(), **run_all(args.seeds)},
    )


if __name__ == "__main__":
    main()
