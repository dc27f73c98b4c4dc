"""Chapter 3's experiment: train short, test long, for four ways of telling a model positions.

:class:`TinyLM` is a two-layer causal Transformer whose only difference between variants is how
it sees positions (a learned table, sinusoids, RoPE or ALiBi, from :mod:`coursekit.positional`).
:func:`train_and_test` trains one variant on sequences of :data:`TRAIN_T` tokens of a synthetic
task (:func:`latest_marked`, :func:`three_back`) and returns its accuracy at each of the
:data:`TEST_T` lengths.

The chapter trains seed 0 live. The spread over :data:`SEEDS` comes from :data:`RESULTS`, which
``python -m coursekit.experiments.positional`` rewrites (all variants, tasks and seeds; a few
minutes on two cores, one thread per run).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.attention import causal_mask, scaled_dot_product_attention
from coursekit.experiments._results import CommittedResults
from coursekit.positional import (
    LearnedPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    sinusoidal_encoding,
)

__all__ = [
    "BATCH",
    "KINDS",
    "MARK_PROB",
    "OFFSET",
    "PLAIN",
    "RESULTS",
    "SEEDS",
    "STEPS",
    "TASKS",
    "TEST_T",
    "TRAIN_T",
    "V",
    "TinyLM",
    "latest_marked",
    "load_results",
    "run_all",
    "three_back",
    "train_and_test",
]

V = 16  #: vocabulary of both tasks
PLAIN = 8  #: tokens 0 .. PLAIN-1 are plain, PLAIN .. 2*PLAIN-1 "marked" (latest marked token)
MARK_PROB = 0.15  #: share of marked positions (latest marked token)
OFFSET = 3  #: how far back the target is (three back)
TRAIN_T, STEPS, BATCH = 32, 300, 16  #: training length, steps, sequences per step
TEST_T = (32, 48, 64, 96, 128)  #: test lengths
KINDS = ("learned", "sinusoidal", "rope", "alibi")
SEEDS = (0, 1, 2, 3, 4)
RESULTS = Path(__file__).with_name("positional_results.json")
_COMMITTED = CommittedResults(
    module="coursekit.experiments.positional",
    path=RESULTS,
    fmt="coursekit-positional-extrapolation",
    version=1,
    what="stored positional-encoding experiment",
    seeds=SEEDS,
)


class TinyLM(nn.Module):
    """A small causal Transformer; `kind` chooses how it sees positions."""

    def __init__(self, kind, V, C=64, H=4, n_layers=2, max_len=128):
        super().__init__()
        self.kind, self.H = kind, H
        self.embed = nn.Embedding(V, C)
        self.wpe = LearnedPositionalEmbedding(max_len, C) if kind == "learned" else None
        self.register_buffer("slopes", alibi_slopes(H))
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                dict(
                    ln1=nn.LayerNorm(C),
                    qkv=nn.Linear(C, 3 * C),
                    out=nn.Linear(C, C),
                    ln2=nn.LayerNorm(C),
                    mlp=nn.Sequential(nn.Linear(C, 2 * C), nn.GELU(), nn.Linear(2 * C, C)),
                )
            )
            for _ in range(n_layers)
        )
        self.ln, self.unembed = nn.LayerNorm(C), nn.Linear(C, V)

    def forward(self, tokens):  # tokens: (B, T)
        B, T = tokens.shape
        x = self.embed(tokens)  # (B, T, C)
        positions = torch.arange(T)
        if self.kind == "learned":
            x = x + self.wpe(positions)  # + (T, C)
        if self.kind == "sinusoidal":
            x = x + sinusoidal_encoding(T, x.shape[-1])  # + (T, C)
        mask = alibi_bias(self.slopes, T) if self.kind == "alibi" else causal_mask(T)
        for layer in self.layers:
            qkv = layer.qkv(layer.ln1(x)).view(B, T, 3, self.H, -1)  # (B, T, 3, H, D)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, T, D)
            if self.kind == "rope":
                q, k = apply_rope(q, positions), apply_rope(k, positions)
            out, _ = scaled_dot_product_attention(q, k, v, mask=mask)  # (B, H, T, D)
            x = x + layer.out(out.transpose(1, 2).reshape(B, T, -1))  # (B, T, C)
            x = x + layer.mlp(layer.ln2(x))
        return self.unembed(self.ln(x))  # (B, T, V)


def latest_marked(B, T, g):
    """Tokens below PLAIN are plain, the others marked; the target is the most recent marked token
    (-100: none yet)."""
    tokens = torch.randint(0, PLAIN, (B, T), generator=g)
    marked = torch.rand(B, T, generator=g) < MARK_PROB
    tokens = torch.where(marked, tokens + PLAIN, tokens)  # (B, T)
    last = torch.where(marked, torch.arange(T), -1).cummax(dim=1).values  # (B, T): index of the latest
    return tokens, torch.where(last >= 0, tokens.gather(1, last.clamp(min=0)), -100)


def three_back(B, T, g):
    """The target at position t is the token at t - OFFSET (-100: nothing to copy yet)."""
    tokens = torch.randint(0, V, (B, T), generator=g)
    targets = torch.full_like(tokens, -100)
    targets[:, OFFSET:] = tokens[:, :-OFFSET]
    return tokens, targets


TASKS = {"latest marked token": latest_marked, "three back": three_back}


def train_and_test(kind, task, seed=0):
    """Train `kind` on `task` at length TRAIN_T; return its accuracy at each length of TEST_T."""
    torch.manual_seed(seed)  # the model's initial weights
    g = torch.Generator().manual_seed(1 + 2 * seed)  # the training batches
    model = TinyLM(kind, V)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(STEPS):
        tokens, targets = task(BATCH, TRAIN_T, g)
        loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())  # -100 is ignored
        opt.zero_grad()
        loss.backward()
        opt.step()
    g = torch.Generator().manual_seed(2)  # the same test sequences for every seed
    accuracy = []
    with torch.no_grad():
        for T in TEST_T:
            tokens, targets = task(128, T, g)
            keep = targets != -100
            accuracy.append((model(tokens).argmax(-1)[keep] == targets[keep]).float().mean().item())
    return accuracy


def run_all(seeds=SEEDS) -> dict[str, dict[str, list[list[float]]]]:
    """Every task, variant and seed: ``{task: {kind: [accuracies of seed s, for s in seeds]}}``."""
    return {
        name: {kind: [train_and_test(kind, task, seed) for seed in seeds] for kind in KINDS}
        for name, task in TASKS.items()
    }


def load_results(path: str | Path = RESULTS) -> dict:
    """The stored runs: ``{"seeds": [...], "test_t": [...], "accuracy": {task: {kind: [[...] per seed]}}}``.

    Raises:
        ValueError: if the file was written for other test lengths, tasks or variants.
    """
    return _COMMITTED.read(
        path,
        layout_ok=lambda data: (
            data["test_t"] == list(TEST_T)
            and list(data["accuracy"]) == list(TASKS)
            and all(list(per_kind) == list(KINDS) for per_kind in data["accuracy"].values())
        ),
    )


def main(argv: list[str] | None = None) -> None:
    _COMMITTED.main(
        argv,
        "Rerun Chapter 3's extrapolation experiment for several seeds.",
        lambda args: {"test_t": list(TEST_T), "accuracy": run_all(args.seeds)},
    )


if __name__ == "__main__":
    main()
