"""Chapter 4's norm and feed-forward experiment: LayerNorm + GELU against Llama's RMSNorm + SwiGLU.

The task is the chapter's copy task (:func:`copy_batch`: :data:`HALF` random tokens from a
vocabulary of :data:`V`, then the same tokens again; :func:`copy_loss` scores the second half),
and the model the chapter's :class:`CopyLM`: token and learned position embeddings, a causal
pre-norm :class:`~coursekit.layers.Encoder` of :data:`N_LAYERS` layers of width :data:`C`, and a
linear read-out. The variants of :data:`VARIANTS` differ only in the norm and the feed-forward
of every layer (and in the stack's final norm):

- ``"layernorm+gelu"``: :class:`~coursekit.layers.LayerNorm` and a GELU
  :class:`~coursekit.layers.FeedForward` of hidden width ``4 C`` with biases (GPT-2's choice);
- ``"rmsnorm+swiglu"``: :class:`~coursekit.layers.RMSNorm` and a bias-free
  :class:`~coursekit.layers.SwiGLU` of hidden width :data:`D_FF_SWIGLU` (Llama's choice), which
  makes the two models' parameter counts agree to within half a percent;
- ``"rmsnorm+gelu"`` and ``"layernorm+swiglu"``: one change at a time.

The Llama variants are built by composition, replacing the submodules of the chapter's
:class:`~coursekit.layers.EncoderLayer` (whose classes the exercise grades) after construction.
Each run trains with Adam at a constant learning rate, one of :data:`LRS` (the chapter's two
rates), for :data:`STEPS` steps on batches of :data:`BATCH` fresh sequences, then measures the
loss on :data:`EVAL_SEQS` held-out sequences (the same for every run). Seed ``s`` fixes the
initial weights (``torch.manual_seed(s)``) and the training batches (a generator seeded
``1 + s``), so for one seed every variant sees the same batches.

``python -m coursekit.experiments.norm_ffn`` runs every variant at both rates for every seed of
:data:`SEEDS` (24 runs, about three minutes on one core) and rewrites :data:`RESULTS`, which the
chapter loads.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.experiments._results import CommittedResults
from coursekit.layers import Encoder, RMSNorm, SwiGLU, count_params, llama_ffn_hidden

__all__ = [
    "BATCH",
    "C",
    "D_FF_SWIGLU",
    "EVAL_SEQS",
    "HALF",
    "LRS",
    "N_HEADS",
    "N_LAYERS",
    "RESULTS",
    "SEEDS",
    "STEPS",
    "V",
    "VARIANTS",
    "CopyLM",
    "copy_batch",
    "copy_loss",
    "held_out_loss",
    "load_results",
    "lr_key",
    "run_all",
    "settings",
    "train_run",
]

V, HALF, BATCH = 16, 8, 16  #: the copy task of Chapter 4: vocabulary, half length, sequences per step
C, N_HEADS, N_LAYERS = 32, 4, 12  #: the chapter's stack
#: SwiGLU hidden width: Llama's rule ``int(8 C / 3)`` rounded up to a multiple of 8 (88 at C = 32)
D_FF_SWIGLU = llama_ffn_hidden(C, multiple_of=8)
STEPS, LRS = 200, (1e-3, 3e-3)  #: Adam steps at a constant learning rate, the chapter's two rates
EVAL_SEQS = 512  #: held-out sequences for the final loss
SEEDS = (0, 1, 2)
VARIANTS = ("layernorm+gelu", "rmsnorm+swiglu", "rmsnorm+gelu", "layernorm+swiglu")
RESULTS = Path(__file__).with_name("norm_ffn_results.json")
_COMMITTED = CommittedResults(
    module="coursekit.experiments.norm_ffn",
    path=RESULTS,
    fmt="coursekit-norm-ffn",
    version=1,
    what="stored norm and feed-forward experiment",
    seeds=SEEDS,
)


class CopyLM(nn.Module):
    """Token and position embeddings, a causal pre-norm stack, a linear read-out.

    Args:
        variant: one of :data:`VARIANTS`, ``"<norm>+<feed-forward>"``.

    Raises:
        ValueError: if ``variant`` is not one of :data:`VARIANTS`.
    """

    def __init__(self, variant: str):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {list(VARIANTS)}, got {variant!r}")
        norm, ffn = variant.split("+")
        self.tok, self.pos = nn.Embedding(V, C), nn.Embedding(2 * HALF, C)
        self.blocks = Encoder(N_LAYERS, C, N_HEADS, dropout=0.0, activation="gelu", norm_first=True)
        for layer in self.blocks.layers:  # composition: the graded EncoderLayer is used as it is
            if norm == "rmsnorm":
                layer.norm1, layer.norm2 = RMSNorm(C), RMSNorm(C)
            if ffn == "swiglu":
                layer.ff = SwiGLU(C, D_FF_SWIGLU)
        if norm == "rmsnorm":
            self.blocks.norm = RMSNorm(C)
        self.head = nn.Linear(C, V)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` token ids -> ``(B, T, V)`` logits, each position seeing itself and the past."""
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))  # (B, T, C)
        return self.head(self.blocks(x, is_causal=True))  # (B, T, V)


def copy_batch(g: torch.Generator, B: int = BATCH) -> torch.Tensor:
    """``B`` sequences of :data:`HALF` random tokens followed by the same tokens: ``(B, 2 HALF)``.

    Example: with ``HALF = 3`` a row could be ``[5, 0, 9, 5, 0, 9]``.
    """
    first = torch.randint(0, V, (B, HALF), generator=g)  # (B, HALF)
    return torch.cat([first, first], dim=1)  # (B, 2 HALF)


def copy_loss(model: nn.Module, seq: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of predicting the second half of ``seq`` ``(B, 2 HALF)``, each
    token from all the tokens before it."""
    logits = model(seq[:, :-1])  # (B, 2 HALF - 1, V)
    return F.cross_entropy(logits[:, HALF - 1 :].flatten(0, 1), seq[:, HALF:].flatten())


def held_out_loss(model: nn.Module) -> float:
    """The copy loss on :data:`EVAL_SEQS` held-out sequences, the same for every run and seed."""
    seq = copy_batch(torch.Generator().manual_seed(12345), EVAL_SEQS)  # (EVAL_SEQS, 2 HALF)
    with torch.no_grad():
        return copy_loss(model.eval(), seq).item()


def train_run(variant: str, lr: float, seed: int = 0) -> dict[str, float | list[float]]:
    """Train one :class:`CopyLM` on the copy task with Adam at the constant learning rate ``lr``.

    Returns:
        ``{"train_loss": [loss of each of the STEPS steps], "held_out_loss": float}``, in nats,
        rounded to 6 decimals (what the results file stores).
    """
    torch.manual_seed(seed)  # the initial weights
    model, g = CopyLM(variant), torch.Generator().manual_seed(1 + seed)  # g: the training batches
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(STEPS):
        loss = copy_loss(model, copy_batch(g))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 6))
    return {"train_loss": losses, "held_out_loss": round(held_out_loss(model), 6)}


def settings() -> dict:
    """What a stored result depends on besides the code: the task, the model, the training and the
    parameter count of each variant."""
    return {
        "V": V,
        "half": HALF,
        "batch": BATCH,
        "C": C,
        "n_heads": N_HEADS,
        "n_layers": N_LAYERS,
        "d_ff_swiglu": D_FF_SWIGLU,
        "steps": STEPS,
        "lrs": list(LRS),
        "eval_seqs": EVAL_SEQS,
        "variants": list(VARIANTS),
        "params": {variant: _n_params(variant) for variant in VARIANTS},
    }


def _n_params(variant):
    with torch.device("meta"):  # shapes only: no memory, and the global random stream is left alone
        return count_params(CopyLM(variant))


def lr_key(lr: float) -> str:
    """The key of a learning rate in the stored results: ``0.003 -> "0.003"``."""
    return f"{lr:g}"


def run_all(seeds=SEEDS) -> dict[str, dict[str, list[dict]]]:
    """Every rate, variant and seed: ``{lr_key(lr): {variant: [train_run(variant, lr, s) for s in seeds]}}``."""
    return {lr_key(lr): {v: [train_run(v, lr, seed) for seed in seeds] for v in VARIANTS} for lr in LRS}


def load_results(path: str | Path = RESULTS) -> dict:
    """The stored runs: ``{"seeds": [...], "settings": settings(), "runs": {lr_key: {variant: [run per seed]}}}``,
    each run as :func:`train_run` returns it.

    Raises:
        ValueError: if the file was written with other settings than the code's (rerun
            ``python -m coursekit.experiments.norm_ffn``).
    """
    return _COMMITTED.read(
        path,
        settings=settings(),
        layout_ok=lambda data: (
            [(lr, list(runs)) for lr, runs in data["runs"].items()]
            == [(lr_key(lr), list(VARIANTS)) for lr in LRS]
        ),
    )


def main(argv: list[str] | None = None) -> None:
    _COMMITTED.main(
        argv,
        "Rerun Chapter 4's LayerNorm + GELU versus RMSNorm + SwiGLU experiment for several seeds.",
        lambda args: {"settings": settings(), "runs": run_all(args.seeds)},
    )


if __name__ == "__main__":
    main()
