"""Character-level GPT on the Python reference manual: our recipe against nanoGPT's CPU recipe
in the same wall-clock time, measured side by side in one run.

    .venv/bin/python benchmarks/gpt_char.py [--quick] [--json out.json] [--threads 2]

1. **Peak.** The ``torch.matmul`` throughput of this machine (float32, square matrices,
   the best of a few sizes): the denominator of "achieved FLOP/s as a fraction of peak".
2. **Baseline.** nanoGPT's well-known CPU recipe (Karpathy's ``train_shakespeare_char``
   run with ``--device=cpu --block_size=64 --batch_size=12 --n_layer=4 --n_head=4
   --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0``), re-implemented
   here from its description: GPT-2 layout without biases, exact GELU, AdamW (0.9, 0.99),
   lr 1e-3 with 100 warmup steps and a cosine to 1e-4, weight decay 0.1, clipping at 1.
   Its training time ``W`` (evaluations excluded) is the budget.
3. **Ours.** :data:`coursekit.experiments.gpt_char.GPT_CHAR_FAST` through ``coursekit.train.train``:
   a short calibration measures our steps/s, the schedule gets the number of steps that
   fits in ``W``, and the run is timed.

Both are evaluated identically: mean cross-entropy (nats/char) over the whole validation
split cut into consecutive windows (``data.split_batches``, as the committed checkpoint is
scored), each model at its own context length. FLOPs per trained token are counted as
``6 N + 6 L T C`` (Kaplan et al., 2020:
``N`` the weights used in matmuls, the output layer included; the second term the
attention scores and weighted sums, forward and backward).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coursekit import data, train  # noqa: E402
from coursekit.experiments import gpt_char  # noqa: E402
from coursekit.gpt import GPT  # noqa: E402

# --------------------------------------------------------------------------- peak


def matmul_peak(seconds: float = 1.0) -> float:
    """The best float32 ``torch.matmul`` FLOP/s over a few square sizes."""
    best = 0.0
    for n in (256, 512, 1024):
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.matmul(a, b)
        reps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 3:
            torch.matmul(a, b)
            reps += 1
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - start))
    return best


# --------------------------------------------------------------------------- nanoGPT's recipe


class _NanoBlock(nn.Module):
    def __init__(self, C: int, H: int):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C, bias=False)
        self.c_attn = nn.Linear(C, 3 * C, bias=False)
        self.attn_proj = nn.Linear(C, C, bias=False)
        self.ln_2 = nn.LayerNorm(C, bias=False)
        self.c_fc = nn.Linear(C, 4 * C, bias=False)
        self.mlp_proj = nn.Linear(4 * C, C, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    """nanoGPT's model at the recipe's settings (no biases, no dropout, tied output layer)."""

    def __init__(self, V: int, block_size: int, L: int, H: int, C: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(block_size, C)
        self.h = nn.ModuleList(_NanoBlock(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, bias=False)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        for name, p in self.named_parameters():
            if name.endswith(("attn_proj.weight", "mlp_proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * L))

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))  # (B, T, C)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, V)


NANO = dict(block_size=64, batch_size=12, L=4, H=4, C=128, iters=2000, lr=1e-3, min_lr=1e-4, warmup=100)


def train_nanogpt(d: data.TokenData, iters: int) -> tuple[nn.Module, float, int]:
    """Train the recipe for ``iters`` steps; returns the model, training seconds and tokens seen."""
    torch.manual_seed(1337)
    n = NANO
    model = NanoGPT(d.vocab_size, n["block_size"], n["L"], n["H"], n["C"])
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=n["lr"],
        betas=(0.9, 0.99),
    )

    def lr_at(it):
        if it < n["warmup"]:
            return n["lr"] * (it + 1) / (n["warmup"] + 1)
        ratio = (it - n["warmup"]) / (n["iters"] - n["warmup"])
        return n["min_lr"] + 0.5 * (1 + math.cos(math.pi * ratio)) * (n["lr"] - n["min_lr"])

    g = torch.Generator().manual_seed(1337)
    start = time.perf_counter()
    for it in range(iters):
        for group in opt.param_groups:
            group["lr"] = lr_at(it)
        x, y = data.lm_batch(d.train, n["block_size"], n["batch_size"], g)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return model, time.perf_counter() - start, iters * n["block_size"] * n["batch_size"]


# --------------------------------------------------------------------------- shared measures


def val_loss(model: nn.Module, d: data.TokenData, block_size: int) -> float:
    """Nats/char over all of ``d.val``: every character predicted once, nothing sampled."""
    return train.evaluate(model, data.split_batches(d.val, block_size, 32), train.lm_loss)


def matmul_weights(model: nn.Module) -> int:
    """Weights used in matrix products: every matrix except the position table (the tied output layer counts once)."""
    seen, n = set(), 0
    for name, p in model.named_parameters():
        if p.dim() == 2 and id(p) not in seen and "pos" not in name and "wpe" not in name:
            seen.add(id(p))
            n += p.numel()
    return n


def flops_per_token(model: nn.Module, L: int, T: int, C: int) -> float:
    return 6 * matmul_weights(model) + 6 * L * T * C


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    d = data.prepare("python-docs")
    peak = matmul_peak()
    iters = 20 if args.quick else NANO["iters"]

    nano, nano_time, nano_tokens = train_nanogpt(d, iters)
    nano_loss = val_loss(nano, d, NANO["block_size"])
    fpt_nano = flops_per_token(nano, NANO["L"], NANO["block_size"], NANO["C"])

    recipe = gpt_char.GPT_CHAR_FAST
    model_cfg = replace(recipe.model, vocab_size=d.vocab_size)
    budget = nano_time
    calib = gpt_char.calibrate_steps(model_cfg, recipe.train, d, steps=5 if args.quick else 30)
    cfg = gpt_char.fit_to_budget(recipe.train, calib, budget)
    cfg = replace(cfg, eval_interval=cfg.max_steps)  # evaluate once, at the end
    steps = cfg.max_steps
    torch.manual_seed(cfg.seed)
    ours = GPT(model_cfg)
    history = gpt_char.train_gpt(ours, d, cfg, progress=False)
    ours_loss = val_loss(ours, d, model_cfg.block_size)
    fpt_ours = flops_per_token(ours, model_cfg.n_layers, model_cfg.block_size, model_cfg.d_model)

    rows = {
        "nanoGPT recipe": dict(
            val_loss=nano_loss,
            train_s=nano_time,
            steps=iters,
            tokens=nano_tokens,
            tokens_per_s=nano_tokens / nano_time,
        ),
        "coursekit": dict(
            val_loss=ours_loss,
            train_s=history.train_time,
            steps=steps,
            tokens=history.tokens,
            tokens_per_s=history.tokens_per_s,
        ),
    }
    for row, fpt in ((rows["nanoGPT recipe"], fpt_nano), (rows["coursekit"], fpt_ours)):
        row["flops_per_s"] = fpt * row["tokens_per_s"]
        row["fraction_of_peak"] = row["flops_per_s"] / peak
    return {
        "machine": (
            f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
            f"{torch.__version__}"
        ),
        "matmul_peak_flops": peak,
        "quick": args.quick,
        "ours_model": asdict(model_cfg),
        "ours_train": asdict(cfg),
        "rows": rows,
        "ours_beats_baseline": ours_loss < nano_loss and history.train_time <= nano_time * 1.05,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="20 baseline steps: checks that the benchmark runs"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    out = run(args)
    print(f"# {out['machine']}; matmul peak {out['matmul_peak_flops'] / 1e9:.1f} GFLOP/s")
    print("| recipe | val loss (nats/char) | train s | steps | tokens/s | GFLOP/s | of peak |")
    print("|---|---|---|---|---|---|---|")
    for name, r in out["rows"].items():
        print(
            f"| {name} | {r['val_loss']:.4f} | {r['train_s']:.1f} | {r['steps']} | {r['tokens_per_s']:,.0f} | "
            f"{r['flops_per_s'] / 1e9:.1f} | {r['fraction_of_peak']:.2f} |"
        )
    print(f"coursekit lower in the same time: {out['ours_beats_baseline']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
