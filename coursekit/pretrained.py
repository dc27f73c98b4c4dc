"""The course's committed checkpoints: their recipes, the one command that regenerates them, loading.

``checkpoints/<name>.pt`` holds float16 weights (a few MB) and ``checkpoints/<name>.json``
the metrics measured *with those rounded weights*, the recipe and the command. A fast test
re-evaluates each checkpoint and requires the recorded validation loss; retraining is an
opt-in slow test. Regenerate with::

    coursekit pretrain gpt-char        # 10 minutes, whatever the machine (time-budgeted)

(The Chapter 6 BERT has its own command, recorded in ``checkpoints/bert-small.json``.)

Recipes:

- :data:`GPT_CHAR` (``gpt-char``): the Chapter 7 model, character level on the Python
  reference manual, trained for at most 10 minutes.
- :data:`GPT_CHAR_FAST`: the recipe that ``benchmarks/gpt_char.py`` races against
  nanoGPT's CPU recipe in the same wall-clock time (its step count is set there).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from coursekit import data, train
from coursekit._files import read_json, write_json
from coursekit.gpt import GPT, GPTConfig
from coursekit.seq2seq import pretrain_seq2seq_numbers

__all__ = ["Recipe", "GPT_CHAR", "GPT_CHAR_FAST", "CHECKPOINTS", "train_gpt", "gpt_val_loss",
           "calibrate_steps", "fit_to_budget", "pretrain_gpt_char", "load_gpt_char", "checkpoint_dir"]

_FORMAT = "coursekit-pretrained"
_VERSION = 1
#: Windows per batch when a GPT is measured on the whole validation split.
VAL_BATCH_SIZE = 32


@dataclass(frozen=True)
class Recipe:
    """A model configuration and how to train it (``model.vocab_size`` is set from the data).

    With ``minutes`` set, the recipe is *time-budgeted*: a short calibration run measures
    this machine's steps per second, and if ``train.max_steps`` would not fit in ``minutes``
    the schedule is shortened to the steps that do (warmup and evaluation intervals scale
    with it). A fast machine runs ``train.max_steps`` and finishes early.
    """

    model: GPTConfig
    train: train.TrainConfig
    minutes: float | None = None


GPT_CHAR_FAST = Recipe(
    model=GPTConfig(vocab_size=1, block_size=64, n_layers=4, n_heads=4, d_model=128, bias=False),
    train=train.TrainConfig(max_steps=2000, batch_size=12, lr=3e-3, min_lr_ratio=0.1, warmup_steps=100,
                            weight_decay=0.1, betas=(0.9, 0.99), grad_clip=1.0, eval_interval=2000, eval_batches=10),
)

#: 3,000 steps of 12 x 128 characters are 4.6M characters, 11 passes over the training text: longer
#: schedules overfit (measured on the whole validation split: 3,300 steps end at 1.189 nats/char,
#: 4,295 steps at 1.207). Dropout would help against overfitting but halves the steps per second
#: on a CPU (measured: 0.1 everywhere, 2.4 instead of 4.3 steps/s on one thread).
GPT_CHAR = Recipe(
    model=GPTConfig(vocab_size=1, block_size=128, n_layers=6, n_heads=4, d_model=128, bias=False),
    train=train.TrainConfig(max_steps=3000, batch_size=12, lr=3e-3, min_lr_ratio=0.1, warmup_steps=100,
                            weight_decay=0.1, betas=(0.9, 0.99), grad_clip=1.0, eval_interval=500, eval_batches=10),
    minutes=9.5,
)


def checkpoint_dir() -> Path:
    """``checkpoints/`` of the repository (``COURSEKIT_CHECKPOINTS`` overrides it)."""
    return Path(os.environ.get("COURSEKIT_CHECKPOINTS", Path(__file__).resolve().parents[1] / "checkpoints"))


def gpt_val_loss(model: GPT, d: data.TokenData) -> float:
    """Mean next-token cross-entropy (nats per token) over the whole validation split.

    The split is cut into consecutive ``block_size`` windows (:func:`coursekit.data.split_batches`),
    so nothing is sampled: a few hundred sampled windows vary by several hundredths of a nat
    from one seed to the next on this text (measured: 1.204 to 1.238 for one model).
    """
    batches = data.split_batches(d.val, model.cfg.block_size, VAL_BATCH_SIZE)
    return train.evaluate(model, batches, train.lm_loss)


def train_gpt(model: GPT, d: data.TokenData, cfg: train.TrainConfig, *, checkpoint_path=None,
              resume: bool = False, progress: bool = True) -> train.History:
    """Train ``model`` on ``d.train`` with :func:`coursekit.train.train`, evaluating on all of ``d.val``
    (:func:`gpt_val_loss`) every ``cfg.eval_interval`` steps (``cfg.eval_batches`` is not used)."""
    T = model.cfg.block_size
    return train.train(
        model, lambda step, g: data.lm_batch(d.train, T, cfg.batch_size, g), cfg,
        loss_fn=train.lm_loss, eval_fn=lambda m: {"val_loss": gpt_val_loss(m, d)},
        checkpoint_path=checkpoint_path, resume=resume, progress=progress,
    )


def fit_to_budget(cfg: train.TrainConfig, steps_per_s: float, seconds: float, margin: float = 0.9) -> train.TrainConfig:
    """``cfg`` with as many steps as fit in ``margin * seconds``; warmup and evaluations scale along.

    The margin absorbs the difference between a short calibration and a long run (measured:
    a long run was up to 10% slower per step than its calibration).
    """
    steps = max(10, int(seconds * steps_per_s * margin))
    warmup = min(cfg.warmup_steps, steps // 10)
    return replace(cfg, max_steps=steps, warmup_steps=warmup, eval_interval=max(1, steps // 6))


def calibrate_steps(model_cfg: GPTConfig, cfg: train.TrainConfig, d: data.TokenData, steps: int = 30) -> float:
    """Training steps per second of this recipe on this machine, from a short throwaway run.

    The first 5 steps (first-call overheads) are run and discarded; the rate is measured
    over the next ``steps``.
    """
    model = GPT(model_cfg)
    T, B = model_cfg.block_size, cfg.batch_size
    short = replace(cfg, max_steps=steps + 5, warmup_steps=0, eval_interval=steps + 5)
    optimizer = train.make_optimizer(model, short)
    batch_fn = lambda step, g: data.lm_batch(d.train, T, B, g)  # noqa: E731
    train.train(model, batch_fn, short, loss_fn=train.lm_loss, optimizer=optimizer, progress=False, stop_at=5)
    start = time.perf_counter()
    train.train(model, batch_fn, replace(short, max_steps=steps, eval_interval=steps), loss_fn=train.lm_loss,
                optimizer=optimizer, progress=False)
    return steps / (time.perf_counter() - start)


# --------------------------------------------------------------------------- gpt-char


def _save(model: GPT, tok: data.CharTokenizer, recipe: Recipe, metrics: dict, out_dir: Path, name: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {k: v.to(torch.float16) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    torch.save(weights, out_dir / f"{name}.pt")
    tok.save(out_dir / f"{name}.tokenizer.json")
    return write_json(out_dir / f"{name}.json", {
        "format": _FORMAT, "version": _VERSION, "name": name,
        "model": asdict(recipe.model), "train": asdict(recipe.train), "metrics": metrics,
        "command": f"coursekit pretrain {name}",
    })


def load_gpt_char(directory: str | os.PathLike | None = None, name: str = "gpt-char") -> tuple[GPT, data.CharTokenizer, dict]:
    """The committed character-level GPT (float32, eval mode), its tokenizer and its record."""
    directory = Path(directory) if directory is not None else checkpoint_dir()
    record = read_json(directory / f"{name}.json", _FORMAT, _VERSION, "coursekit pretrained-model record")
    model = GPT(GPTConfig(**record["model"]))
    weights = torch.load(directory / f"{name}.pt", map_location="cpu", weights_only=True)
    weights["lm_head.weight"] = weights["tok_emb.weight"]
    model.load_state_dict({k: v.float() for k, v in weights.items()})
    return model.eval(), data.CharTokenizer.load(directory / f"{name}.tokenizer.json"), record


def pretrain_gpt_char(out_dir: str | os.PathLike | None = None, recipe: Recipe = GPT_CHAR,
                      name: str = "gpt-char", progress: bool = True) -> dict:
    """Train :data:`GPT_CHAR` from scratch, round to float16, measure and write ``<name>.{pt,json}``.

    A time-budgeted recipe is first fitted to this machine (see :class:`Recipe`); the record
    stores the steps actually run.

    Returns:
        The recorded metrics.
    """
    out_dir = Path(out_dir) if out_dir is not None else checkpoint_dir()
    d = data.prepare("python-docs")
    recipe = replace(recipe, model=replace(recipe.model, vocab_size=d.vocab_size))
    if recipe.minutes is not None:
        rate = calibrate_steps(recipe.model, recipe.train, d)
        fitted = fit_to_budget(recipe.train, rate, recipe.minutes * 60)
        recipe = replace(recipe, train=fitted if fitted.max_steps < recipe.train.max_steps else recipe.train, minutes=None)
    torch.manual_seed(recipe.train.seed)
    model = GPT(recipe.model)
    history = train_gpt(model, d, recipe.train, progress=progress)
    model.load_state_dict({k: v.half().float() for k, v in model.state_dict().items()})  # what is stored
    metrics = {
        "val_loss": gpt_val_loss(model, d),
        "val_protocol": "the whole validation split in consecutive block_size windows (data.split_batches)",
        "val_loss_during_training": history.evals,
        "train_seconds": round(history.train_time, 1),
        "tokens_per_s": round(history.tokens_per_s),
        "steps": len(history.steps),
        "parameters": sum(p.numel() for p in model.parameters()),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
    }
    _save(model, d.tokenizer, recipe, metrics, out_dir, name)
    return metrics


#: Checkpoint name -> the function that regenerates it (``coursekit pretrain <name>``).
CHECKPOINTS = {"gpt-char": pretrain_gpt_char, "seq2seq-numbers": pretrain_seq2seq_numbers}
