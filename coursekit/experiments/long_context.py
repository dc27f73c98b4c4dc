"""Chapter 10's experiments: the memory of one attention call, and training short, testing long.

* **Memory.** :func:`attention_peak_memory` measures, in a fresh process, the most memory one
  call of naive, tiled (:func:`coursekit.long_context.tiled_attention`) or torch's fused
  attention holds beyond what was resident before it.
* **A longer context than trained.** :class:`ContextLM` is a tiny causal model whose position
  signal is a choice (none, learned, sinusoidal, RoPE with optional position interpolation or
  NTK-aware scaling, ALiBi; all from :mod:`coursekit.positional`);
  :func:`train_context_model` trains it short on the synthetic :func:`needle_task` with
  :func:`coursekit.train.train`, and :func:`needle_accuracy` tests it long.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.layers import FeedForward, FusedLayerNorm
from coursekit.multihead import MultiHeadAttention, merge_heads
from coursekit.positional import (
    LearnedPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    sinusoidal_encoding,
)
from coursekit.train import TrainConfig, lm_loss, train

__all__ = [
    "attention_peak_memory",
    "POSITIONS",
    "ContextLM",
    "needle_task",
    "NEEDLE_VOCAB",
    "train_context_model",
    "needle_accuracy",
]


# --------------------------------------------------------------------------- the memory of one attention call

_ATTENTION_METHODS = ("naive", "tiled", "torch")

_MEMORY_PROBE = r"""
import json, re, resource, sys, time
import torch
import torch.nn.functional as F
from coursekit import attention, long_context
torch.set_num_threads(1)
method, T, D, block, causal = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
def run(q, k, v):
    if method == "naive":
        mask = attention.causal_mask(q.shape[-2]) if causal else None
        return attention.scaled_dot_product_attention(q, k, v, mask=mask)[0]
    if method == "tiled":
        return long_context.tiled_attention(q, k, v, causal=causal, block_q=block, block_k=block)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
def kib(field):
    return int(re.search(field + r":\s+(\d+) kB", open("/proc/self/status").read()).group(1))
run(*(torch.randn(1, 1, 8, D) for _ in range(3)))  # load every kernel before measuring
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 1, T, D, generator=g) for _ in range(3))
try:  # reset the high-water mark VmHWM to the current resident set size (Linux >= 4.0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    measure, before = "VmHWM", kib("VmRSS")
except OSError:
    measure, before = "ru_maxrss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
out = run(q, k, v)
seconds = time.perf_counter() - start
after = kib("VmHWM") if measure == "VmHWM" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak_bytes": (after - before) * 1024, "seconds": seconds, "measure": measure,
                  "finite": bool(out.isfinite().all())}))
"""


def attention_peak_memory(
    method: str, T: int, D: int = 64, block_size: int = 512, causal: bool = False, timeout: float = 600.0
) -> dict:
    """Peak extra memory of one attention call, measured in a fresh Python process.

    The process builds ``q, k, v`` of shape ``(1, 1, T, D)`` in float32 on one thread and calls
    the method once on a tiny input (so that loading kernels is not counted). Then it resets the
    kernel's high-water mark of its resident set size to the current size (writing ``5`` to
    ``/proc/self/clear_refs``), makes the call, and reads the high-water mark (``VmHWM``) again:
    the difference is the most memory the call held at any moment beyond what was already
    resident, its ``(T, D)`` output included. Where the reset is not allowed, the growth of
    ``ru_maxrss`` (the peak since the process started) is reported instead, and ``"measure"``
    says so; it can read low, since an earlier transient may exceed the call's need.

    Args:
        method: ``"naive"`` (:func:`coursekit.attention.scaled_dot_product_attention`, which
            materialises the scores), ``"tiled"`` (:func:`~coursekit.long_context.tiled_attention` with square tiles of
            ``block_size``) or ``"torch"`` (``torch.nn.functional.scaled_dot_product_attention``).
        T: sequence length (queries and keys).
        D: head width.
        block_size: the tile of ``"tiled"``.
        causal: use a causal mask.
        timeout: seconds before the measurement is abandoned.

    Returns:
        ``{"method", "T", "D", "causal", "peak_bytes", "seconds", "measure", "finite"}``;
        ``seconds`` is the wall time of the call.
    """
    if method not in _ATTENTION_METHODS:
        raise ValueError(f"method must be one of {_ATTENTION_METHODS}, got {method!r}")
    if T < 1 or D < 1 or block_size < 1:
        raise ValueError(f"T, D and block_size must be positive, got T={T}, D={D}, block_size={block_size}")
    root = str(Path(__file__).resolve().parents[2])  # the directory that holds coursekit/
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    )
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _MEMORY_PROBE,
            method,
            str(T),
            str(D),
            str(block_size),
            "1" if causal else "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if run.returncode != 0:
        raise RuntimeError(f"the memory probe for {method} at T={T} failed:\n{run.stderr[-2000:]}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return {"method": method, "T": T, "D": D, "causal": causal, **result}


# --------------------------------------------------------------------------- train short, test long

#: How :class:`ContextLM` sees positions.
POSITIONS = ("none", "learned", "sinusoidal", "rope", "alibi")


class ContextLM(nn.Module):
    """A tiny pre-norm causal language model whose position signal is a choice.

    ``position`` is one of :data:`POSITIONS`: ``"none"`` (the causal mask is the only order
    signal), ``"learned"`` (a table of ``max_len`` rows added to the embeddings), ``"sinusoidal"``
    (added to the embeddings), ``"rope"`` (queries and keys rotated, with ``rope_scaling`` and
    ``rope_factor`` passed to :func:`~coursekit.positional.apply_rope`: set them after training
    for position interpolation, ``"linear"``, or NTK-aware scaling, ``"ntk"``) or ``"alibi"``
    (Press et al.'s bias). Each layer is Chapter 2's multi-head attention and Chapter 4's
    feed-forward, run through torch's fused attention.

    Args:
        vocab_size: ``V``.
        position: one of :data:`POSITIONS`.
        d_model, n_heads, n_layers: ``C``, ``H``, ``L``.
        max_len: rows of the learned table (the longest test length).
    """

    def __init__(
        self,
        vocab_size: int,
        position: str,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        max_len: int = 512,
    ):
        super().__init__()
        if position not in POSITIONS:
            raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
        self.position, self.n_heads = position, n_heads
        self.rope_scaling: str | None = None
        self.rope_factor = 1.0
        self.embed = nn.Embedding(vocab_size, d_model)
        self.wpe = LearnedPositionalEmbedding(max_len, d_model) if position == "learned" else None
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                dict(
                    norm1=FusedLayerNorm(d_model),
                    attn=MultiHeadAttention(d_model, n_heads),
                    norm2=FusedLayerNorm(d_model),
                    ff=FeedForward(d_model, 2 * d_model, "gelu"),
                )
            )
            for _ in range(n_layers)
        )
        self.norm = FusedLayerNorm(d_model)
        self.unembed = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` token ids -> ``(B, T, V)`` next-token logits."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (B, T), got {tuple(tokens.shape)}")
        T = tokens.shape[1]
        positions = torch.arange(T, device=tokens.device)
        x = self.embed(tokens)  # (B, T, C)
        if self.position == "learned":
            x = x + self.wpe(positions)  # + (T, C)
        elif self.position == "sinusoidal":
            x = x + sinusoidal_encoding(T, x.shape[-1]).to(x.device)  # + (T, C)
        bias = (
            alibi_bias(self.slopes, T) if self.position == "alibi" else None
        )  # (H, T, T), -inf above the diagonal
        for layer in self.layers:
            q, k, v = layer.attn.project(layer.norm1(x))  # each (B, H, T, D)
            if self.position == "rope":
                q, k = apply_rope(
                    torch.stack([q, k]), positions, scaling=self.rope_scaling, factor=self.rope_factor
                )
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, is_causal=bias is None
            )  # (B, H, T, D)
            x = x + layer.attn.out_proj(merge_heads(out))  # (B, T, C)
            x = x + layer.ff(layer.norm2(x))
        return self.unembed(self.norm(x))  # (B, T, V)


def needle_task(
    B: int, T: int, generator: torch.Generator, n_plain: int = 8, n_values: int = 8, distractors: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic long-range task: find the token that follows the marker, wherever it was.

    A sequence holds plain tokens ``0 .. n_plain - 1``, *value* tokens ``n_plain ..
    n_plain + n_values - 1`` scattered as distractors (each position with probability
    ``distractors``), and one marker (token ``n_plain + n_values``) at a uniformly random position
    ``p < T - 1``, followed by the *needle*, a value token. From position ``p + 1`` on, the target at
    every position is the needle; before it there is nothing to predict (``-100``). Solving it takes
    a relative position (the needle is the token *right after* the marker) and a retrieval over up
    to ``T - 2`` positions.

    Args:
        B, T: batch size and length, ``T >= 2``.
        generator: the source of all randomness.
        n_plain, n_values: sizes of the two vocabularies; the model needs ``n_plain + n_values + 1``.
        distractors: probability of a value token at any other position.

    Returns:
        ``(tokens, targets)``, both ``(B, T)`` int64.
    """
    if B < 1 or T < 2:
        raise ValueError(f"need B >= 1 and T >= 2, got B={B} and T={T}")
    tokens = torch.randint(0, n_plain, (B, T), generator=generator)
    values = torch.randint(n_plain, n_plain + n_values, (B, T), generator=generator)
    tokens = torch.where(torch.rand(B, T, generator=generator) < distractors, values, tokens)
    where = torch.randint(0, T - 1, (B,), generator=generator)  # (B,) marker positions
    needle = torch.randint(n_plain, n_plain + n_values, (B,), generator=generator)  # (B,)
    rows = torch.arange(B)
    tokens[rows, where] = n_plain + n_values  # the marker
    tokens[rows, where + 1] = needle
    scored = torch.arange(T)[None, :] > where[:, None]  # (B, T): from the needle on
    return tokens, torch.where(scored, needle[:, None].expand(B, T), torch.full_like(tokens, -100))


#: the vocabulary of :func:`needle_task` with its default sizes: 8 plain, 8 values, 1 marker
NEEDLE_VOCAB = 17


def train_context_model(
    position: str,
    T: int = 64,
    steps: int = 500,
    batch: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
    **model_kwargs,
) -> ContextLM:
    """Train a :class:`ContextLM` on :func:`needle_task` at length ``T`` with :func:`coursekit.train.train`.

    AdamW with a short warmup and cosine decay; ``model_kwargs`` go to :class:`ContextLM`
    (default width 48). Returns the model in eval mode.
    """
    torch.manual_seed(seed)
    model = ContextLM(NEEDLE_VOCAB, position, **{"d_model": 48, **model_kwargs})
    cfg = TrainConfig(
        max_steps=steps,
        batch_size=batch,
        lr=lr,
        warmup_steps=min(25, steps),
        weight_decay=0.0,
        eval_interval=steps,
        seed=seed,
    )
    train(model, lambda step, g: needle_task(batch, T, g), cfg, loss_fn=lm_loss, progress=False)
    return model.eval()


@torch.no_grad()
def needle_accuracy(model: ContextLM, T: int, n: int = 64, seed: int = 2) -> float:
    """Share of the scored positions of ``n`` fresh :func:`needle_task` sequences of length ``T``
    at which the model's most likely next token is the needle (chance: 1 in ``NEEDLE_VOCAB``)."""
    tokens, targets = needle_task(n, T, torch.Generator().manual_seed(seed))
    keep = targets != -100
    return (model(tokens).argmax(-1)[keep] == targets[keep]).double().mean().item()
