"""Chapter 1's recurrence experiment: how far back can a GRU and one attention layer recall a token?

The task (:func:`recall_batch`) is a sequence of ``k + 1`` random tokens from a vocabulary of
:data:`V`; the model reads it all and, at the last position, must name the *first* token, which
sits ``k`` steps back behind ``k`` random distractors. Chance is ``1 / V``.

Two models of the same width :data:`C` read the sequence:

- :class:`GRUReader`: token embeddings, one ``nn.GRU`` layer, a linear read-out of the last hidden
  state. Whatever it knows about the first token has to survive ``k`` updates of that state.
- :class:`AttentionReader`: token embeddings plus the sinusoidal positions of
  :func:`~coursekit.positional.sinusoidal_encoding`, one causal
  :class:`~coursekit.attention.SelfAttention` layer with a residual connection, a LayerNorm and a
  linear read-out at the last position. Its last query can reach the first token in one step.

Each run trains one model for one distance ``k`` with :func:`coursekit.train.train` (AdamW,
warmup and cosine decay, clipping; settings in :data:`TRAIN`) for :data:`STEPS` steps on batches
of :data:`BATCH` fresh sequences, then measures its accuracy on :data:`EVAL_SEQS` held-out
sequences (the same for every run and seed). Seed ``s`` fixes the initial weights
(``torch.manual_seed(s)``) and the training batches (:func:`coursekit.train.train` draws them from
a generator seeded ``s + 1``), so for one seed and distance both models see the same batches.

``python -m coursekit.experiments.recurrence`` trains both models at every distance of
:data:`DISTANCES` for every seed of :data:`SEEDS` and rewrites :data:`RESULTS`, which the chapter
loads (one thread; the wall-clock and processor time it took are stored in the file).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import torch
from torch import nn

from coursekit.attention import SelfAttention, causal_mask
from coursekit.experiments._results import CommittedResults
from coursekit.positional import sinusoidal_encoding
from coursekit.train import TrainConfig, lm_loss, train

__all__ = [
    "BATCH",
    "C",
    "DISTANCES",
    "EVAL_SEQS",
    "MODELS",
    "RESULTS",
    "SEEDS",
    "STEPS",
    "TRAIN",
    "V",
    "AttentionReader",
    "GRUReader",
    "accuracy",
    "load_results",
    "make_model",
    "recall_batch",
    "run_all",
    "settings",
    "train_config",
    "train_run",
]

V = 16  #: vocabulary; chance accuracy is 1 / V
C = 64  #: width of both models
DISTANCES = (2, 4, 8, 16, 32, 64, 128)  #: how many steps back the first token is
STEPS, BATCH = 300, 32  #: training steps per run, sequences per step
EVAL_SEQS = 512  #: held-out sequences per distance
#: the training loop's settings (coursekit.train); :func:`train_config` sets each run's seed
TRAIN = TrainConfig(
    max_steps=STEPS,
    batch_size=BATCH,
    lr=3e-3,
    warmup_steps=30,
    weight_decay=0.0,
    grad_clip=1.0,
    eval_interval=STEPS,
    eval_batches=1,
)
MODELS = ("gru", "attention")
SEEDS = (0, 1, 2)
RESULTS = Path(__file__).with_name("recurrence_results.json")
_COMMITTED = CommittedResults(
    module="coursekit.experiments.recurrence",
    path=RESULTS,
    fmt="coursekit-recurrence-recall",
    version=1,
    what="stored recurrence experiment",
    seeds=SEEDS,
)


class GRUReader(nn.Module):
    """Embeddings, one GRU layer of width ``C``, a linear read-out of the last hidden state.

    Args:
        V: vocabulary size ``|V|``.
        C: embedding and hidden width.
    """

    def __init__(self, V: int = V, C: int = C):
        super().__init__()
        self.embed = nn.Embedding(V, C)
        self.gru = nn.GRU(C, C, batch_first=True)
        self.head = nn.Linear(C, V)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` token ids -> ``(B, V)`` logits for the token to recall, read at the last step."""
        _, h_last = self.gru(self.embed(tokens))  # h_last: (1, B, C), the state after T updates
        return self.head(h_last[0])  # (B, V)


class AttentionReader(nn.Module):
    """Token embeddings plus sinusoidal positions, one causal single-head self-attention layer with
    a residual connection, a LayerNorm and a linear read-out at the last position.

    Args:
        max_len: longest sequence the position table covers.
        V: vocabulary size ``|V|``.
        C: embedding and attention width (``D = C``).
    """

    def __init__(self, max_len: int, V: int = V, C: int = C):
        super().__init__()
        self.embed = nn.Embedding(V, C)
        self.register_buffer("pos", sinusoidal_encoding(max_len, C), persistent=False)  # (max_len, C)
        self.attn = SelfAttention(C)
        self.ln = nn.LayerNorm(C)
        self.head = nn.Linear(C, V)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` token ids -> ``(B, V)`` logits for the token to recall, read at the last position."""
        T = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:T]  # (B, T, C) + (T, C)
        out, _ = self.attn(x, mask=causal_mask(T))  # (B, T, C)
        return self.head(self.ln(x + out)[:, -1])  # (B, V)


def make_model(kind: str, k: int) -> nn.Module:
    """A fresh model of ``kind`` (one of :data:`MODELS`) for sequences of ``k + 1`` tokens.

    Raises:
        ValueError: if ``kind`` is not one of :data:`MODELS`.
    """
    if kind == "gru":
        return GRUReader()
    if kind == "attention":
        return AttentionReader(max_len=k + 1)
    raise ValueError(f"kind must be one of {list(MODELS)}, got {kind!r}")


def recall_batch(k: int, B: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``B`` sequences of ``k + 1`` random tokens and, for each, its first token.

    Example: with ``k = 3`` a row could be ``[5, 0, 9, 2]`` with target ``5``: the token ``k``
    steps before the last one.

    Args:
        k: distance from the last position back to the first, at least 1.
        B: number of sequences.
        g: the generator all tokens are drawn from.

    Returns:
        ``(tokens, targets)`` of shapes ``(B, k + 1)`` and ``(B,)``.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    tokens = torch.randint(0, V, (B, k + 1), generator=g)  # (B, k + 1)
    return tokens, tokens[:, 0]


@torch.no_grad()
def accuracy(model: nn.Module, k: int, n: int = EVAL_SEQS) -> float:
    """Share of ``n`` held-out sequences (the same for every run) whose first token ``model`` names."""
    tokens, targets = recall_batch(k, n, torch.Generator().manual_seed(12345))
    was_training = model.training
    model.eval()
    try:
        return (model(tokens).argmax(-1) == targets).float().mean().item()
    finally:
        model.train(was_training)


def train_config(seed: int = 0, steps: int = STEPS) -> TrainConfig:
    """The training loop's settings for one run: :data:`TRAIN` with this seed and number of steps."""
    return replace(
        TRAIN, seed=seed, max_steps=steps, eval_interval=steps, warmup_steps=min(TRAIN.warmup_steps, steps)
    )


def train_run(kind: str, k: int, seed: int = 0, steps: int = STEPS) -> dict[str, float]:
    """Train one fresh model of ``kind`` on distance ``k`` and measure it.

    Args:
        kind: one of :data:`MODELS`.
        k: the recall distance.
        seed: seeds the initial weights and the training batches.
        steps: training steps (the stored results use :data:`STEPS`; a quick check uses fewer).

    Returns:
        ``{"accuracy": held-out accuracy, "final_loss": mean training loss over the last tenth of
        the steps (nats)}``, both rounded to 6 decimals (what the results file stores).
    """
    torch.manual_seed(seed)  # the initial weights
    model = make_model(kind, k)
    history = train(
        model,
        lambda step, g: recall_batch(k, BATCH, g),
        train_config(seed, steps),
        loss_fn=lm_loss,
        progress=False,
    )
    tail = history.train_loss[-max(1, steps // 10) :]
    return {"accuracy": round(accuracy(model, k), 6), "final_loss": round(sum(tail) / len(tail), 6)}


def settings(steps: int = STEPS, distances=DISTANCES) -> dict:
    """What a stored result depends on besides the code: task, models, training and evaluation
    (the training loop's settings as :func:`train_config` gives them for seed 0)."""
    cfg = asdict(train_config(0, steps))
    return {
        "V": V,
        "C": C,
        "distances": list(distances),
        "steps": steps,
        "batch": BATCH,
        "eval_seqs": EVAL_SEQS,
        "models": list(MODELS),
        "train": {**cfg, "betas": list(cfg["betas"])},
    }


def run_all(seeds=SEEDS, distances=DISTANCES, steps: int = STEPS) -> dict[str, list[list[dict]]]:
    """Every model, seed and distance: ``{kind: [[train_run(kind, k, s, steps) for k in distances]
    for s in seeds]}``."""
    return {kind: [[train_run(kind, k, s, steps) for k in distances] for s in seeds] for kind in MODELS}


def load_results(path: str | Path = RESULTS) -> dict:
    """The stored runs: ``{"seeds": [...], "settings": settings(), "runs": {kind: [[run per k] per seed]}}``,
    each run as :func:`train_run` returns it.

    Raises:
        ValueError: if the file was written with other settings than the code's (rerun
            ``python -m coursekit.experiments.recurrence``).
    """
    return _COMMITTED.read(
        path,
        settings=settings(),
        layout_ok=lambda data: (
            list(data["runs"]) == list(MODELS)
            and all(
                len(per_seed) == len(data["seeds"]) and all(len(runs) == len(DISTANCES) for runs in per_seed)
                for per_seed in data["runs"].values()
            )
        ),
    )


def main(argv: list[str] | None = None) -> None:
    def options(parser):
        parser.add_argument(
            "--steps", type=int, default=STEPS, help="training steps per run (a quick check uses fewer)"
        )
        parser.add_argument("--distances", type=int, nargs="+", default=list(DISTANCES))

    _COMMITTED.main(
        argv,
        "Rerun Chapter 1's recall-at-distance-k experiment (GRU against one attention layer).",
        lambda args: {
            "settings": settings(args.steps, args.distances),
            "runs": run_all(args.seeds, args.distances, args.steps),
        },
        options=options,
    )


if __name__ == "__main__":
    main()
