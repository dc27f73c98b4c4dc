"""Chapter 9's data-scale experiment: the CNN and the ViT trained on fewer and fewer digits.

**Data.** The chapter's split (:func:`~coursekit.experiments.digits.digits_split`: 1,437 training
and 360 test digits). A run with ``n`` training images trains on :func:`subset` ``(n, seed)`` of
the training images and is tested on all 360 test images, the same for every run. The subsets
are *stratified* (each class within one image of its share of ``n``) and *nested* (for one seed,
the subset of 100 contains the subset of 50, and so on up to the whole training set); they depend
on the seed only, so the CNN and the ViT of one seed train on the same images.

**Training.** Each model trains with its chapter recipe from
:data:`~coursekit.experiments.digits.DIGITS_RECIPES` (batch size, learning rate, weight decay,
shifts, label smoothing, warmup and cosine schedule) compressed to the same :data:`STEPS` updates
for both (:func:`recipe`: half the CNN's chapter steps, a quarter of the ViT's), to fit the whole
grid in about five minutes of one CPU thread. Batches are drawn with replacement, so every run
makes the same number of updates whatever ``n``: a small subset is seen many more times
(epochs = steps x batch / n). Seed ``s`` fixes the subset, the initial weights
(``torch.manual_seed(s)``) and the batches and shifts (``TrainConfig.seed = s``).
scikit-learn's two baselines of the chapter are fitted on the same subsets for reference.

``python -m coursekit.experiments.data_scale`` runs every size of :data:`SIZES` for every seed of
:data:`SEEDS` (36 network runs, about five minutes on one thread) and rewrites :data:`RESULTS`,
which the chapter loads.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, replace
from pathlib import Path

import torch
from torch import nn

from coursekit.experiments import digits
from coursekit.experiments._results import CommittedResults
from coursekit.layers import count_params
from coursekit.vit import VIT_PRESETS, ViT

__all__ = [
    "MODELS",
    "RESULTS",
    "SEEDS",
    "SIZES",
    "STEPS",
    "baselines_run",
    "load_results",
    "make_model",
    "recipe",
    "run_all",
    "settings",
    "subset",
    "subset_digest",
    "train_run",
]

SIZES = (50, 100, 200, 400, 800, 1437)  #: training-set sizes; the last is the whole training split
SEEDS = (0, 1, 2)
MODELS = ("cnn", "vit")  #: keys of DIGITS_RECIPES: SmallCNN and ViT(VIT_PRESETS["small"])
#: updates of every run, for both models: the CNN's chapter recipe has 1,000 and the ViT's 2,000
STEPS = 500
RESULTS = Path(__file__).with_name("data_scale_results.json")
_COMMITTED = CommittedResults(
    module="coursekit.experiments.data_scale",
    path=RESULTS,
    fmt="coursekit-data-scale",
    version=1,
    what="stored data-scale experiment",
    seeds=SEEDS,
)


def subset(labels: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Sorted indices of a stratified random subset of ``n`` of the images with ``labels``.

    Each class's images are shuffled (by a generator seeded ``seed``); the ``i``-th of the
    ``n_c`` images of class ``c`` gets the key ``(i + 1/2) / n_c``, and the ``n`` images with the
    smallest keys (ties in random order) form the subset. So the subsets of one seed are nested
    (each is a prefix of one order), and each class holds ``n n_c / N`` images to within one.

    Example: labels ``[0, 0, 0, 0, 1, 1]`` and ``n = 3`` give two images of class 0 and one of 1.

    Args:
        labels: ``(N,)`` class of each image.
        n: the subset's size, ``1 <= n <= N``.
        seed: chooses the subset.

    Returns:
        ``(n,)`` long, increasing indices into ``labels``.
    """
    N = len(labels)
    if not 1 <= n <= N:
        raise ValueError(f"n must be in [1, {N}], got {n}")
    g = torch.Generator().manual_seed(seed)
    keys = torch.empty(N, dtype=torch.float64)
    for c in torch.unique(labels).tolist():
        members = (labels == c).nonzero().flatten()  # (n_c,)
        order = members[torch.randperm(len(members), generator=g)]  # (n_c,): the class shuffled
        keys[order] = (torch.arange(len(members), dtype=torch.float64) + 0.5) / len(members)
    tie_break = torch.randperm(N, generator=g)  # (N,): a random order among equal keys
    by_tie = torch.argsort(tie_break)
    first = by_tie[torch.argsort(keys[by_tie], stable=True)][:n]  # smallest keys, ties in random order
    return torch.sort(first).values


def subset_digest(indices: torch.Tensor) -> str:
    """A short fingerprint of a subset's indices (stored with each run, to check the file is current)."""
    return hashlib.sha1(str(indices.tolist()).encode()).hexdigest()[:12]


def recipe(model: str) -> digits.Recipe:
    """The chapter's recipe for ``model`` compressed to :data:`STEPS` updates: ``max_steps`` is
    :data:`STEPS` and the warmup keeps its share of the schedule; everything else (batch size,
    learning rate, weight decay, shifts, label smoothing) is the chapter's. No evaluations during
    training.

    Example: the ViT's 2,000 steps with 100 of warmup become 500 with 25.
    """
    base = digits.DIGITS_RECIPES[model]
    warmup = round(base.train.warmup_steps * STEPS / base.train.max_steps)
    cfg = replace(base.train, max_steps=STEPS, warmup_steps=warmup, eval_interval=STEPS)
    return base._replace(train=cfg)


def make_model(model: str) -> nn.Module:
    """A fresh ``"cnn"`` (:class:`~coursekit.experiments.digits.SmallCNN`) or ``"vit"``
    (:class:`~coursekit.vit.ViT` with ``VIT_PRESETS["small"]``), initialised from the global
    random state."""
    if model == "cnn":
        return digits.SmallCNN()
    if model == "vit":
        return ViT(VIT_PRESETS["small"])
    raise ValueError(f"model must be one of {list(MODELS)}, got {model!r}")


def train_run(model: str, n: int, seed: int, split: digits.DigitsSplit | None = None) -> dict:
    """Train ``model`` on :func:`subset` ``(n, seed)`` of the training split with :func:`recipe`.

    Returns:
        ``{"subset": subset_digest, "final_loss": the last step's training loss,
        "train_accuracy": on the subset (unshifted), "test_accuracy": on the whole test split}``,
        floats rounded to 6 decimals (what the results file stores).
    """
    split = split if split is not None else digits.digits_split()
    idx = subset(split.train_y, n, seed)
    x, y = split.train_x[idx], split.train_y[idx]
    r = recipe(model)
    torch.manual_seed(seed)  # the initial weights
    net = make_model(model)
    history = digits.fit_classifier(
        net,
        x,
        y,
        replace(r.train, seed=seed),  # the batches and shifts
        max_shift=r.max_shift,
        label_smoothing=r.label_smoothing,
    )
    return {
        "subset": subset_digest(idx),
        "final_loss": round(history.train_loss[-1], 6),
        "train_accuracy": round(digits.accuracy(net, x, y), 6),
        "test_accuracy": round(digits.accuracy(net, split.test_x, split.test_y), 6),
    }


def baselines_run(n: int, seed: int, split: digits.DigitsSplit | None = None) -> dict[str, float]:
    """scikit-learn's baselines of the chapter (:func:`~coursekit.experiments.digits.sklearn_baselines`)
    fitted on :func:`subset` ``(n, seed)``: ``{name: test accuracy}``, rounded to 6 decimals."""
    split = split if split is not None else digits.digits_split()
    idx = subset(split.train_y, n, seed)
    sub = digits.DigitsSplit(split.train_x[idx], split.train_y[idx], split.test_x, split.test_y)
    return {name: round(acc, 6) for name, acc in digits.sklearn_baselines(sub).items()}


def settings() -> dict:
    """What a stored result depends on besides the code: sizes, models, recipes, parameter counts."""
    return {
        "sizes": list(SIZES),
        "models": list(MODELS),
        "steps": STEPS,
        "recipes": {m: _recipe_settings(m) for m in MODELS},
        "params": {m: _n_params(m) for m in MODELS},
    }


def _recipe_settings(model):
    r = recipe(model)
    cfg = {k: v for k, v in asdict(r.train).items() if k != "seed"}  # the seed is the run's
    return {
        **cfg,
        "betas": list(r.train.betas),
        "max_shift": r.max_shift,
        "label_smoothing": r.label_smoothing,
    }


def _n_params(model):
    # built on the CPU (the models are small) inside fork_rng, so the global random stream is left
    # alone; the meta device would do it without memory, but costs torch._dynamo's import (1.5 s)
    with torch.random.fork_rng(devices=[]):
        return count_params(make_model(model))


def run_all(seeds=SEEDS) -> dict[str, dict[str, list[dict]]]:
    """``{str(n): {model: [train_run(model, n, s) for s in seeds], "baselines": [...]}}`` for every size."""
    split = digits.digits_split()
    runs = {}
    for n in SIZES:
        runs[str(n)] = {m: [train_run(m, n, s, split) for s in seeds] for m in MODELS}
        runs[str(n)]["baselines"] = [baselines_run(n, s, split) for s in seeds]
    return runs


def load_results(path: str | Path = RESULTS) -> dict:
    """The stored runs: ``{"seeds": [...], "settings": settings(), "runs": {str(n): {model: [run per seed],
    "baselines": [...]}}}``, each run as :func:`train_run` returns it.

    Raises:
        ValueError: if the file was written with other settings than the code's (rerun
            ``python -m coursekit.experiments.data_scale``).
    """
    return _COMMITTED.read(
        path,
        settings=settings(),
        layout_ok=lambda data: (
            list(data["runs"]) == [str(n) for n in SIZES]
            and all(
                list(per_model) == [*MODELS, "baselines"]
                and all(len(runs) == len(data["seeds"]) for runs in per_model.values())
                for per_model in data["runs"].values()
            )
        ),
    )


def main(argv: list[str] | None = None) -> None:
    _COMMITTED.main(
        argv,
        "Rerun Chapter 9's training-set-size sweep of the CNN and the ViT for several seeds.",
        lambda args: {"settings": settings(), "runs": run_all(args.seeds)},
    )


if __name__ == "__main__":
    main()
