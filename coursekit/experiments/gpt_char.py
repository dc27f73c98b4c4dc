"""Chapter 7's experiment: a character-level GPT on the Python reference manual, and its recipes.

- :data:`GPT_CHAR` is the recipe of the committed checkpoint ``gpt-char`` (``coursekit pretrain
  gpt-char``, see :mod:`coursekit.checkpoints`): the Chapter 7 model, character level on the
  Python reference manual, trained for at most 10 minutes.
- :data:`GPT_CHAR_FAST` is the recipe that ``benchmarks/gpt_char.py`` races against nanoGPT's
  CPU recipe in the same wall-clock time (its step count is set there).

The validation loss is measured on the whole validation split (:func:`gpt_val_loss`); a
time-budgeted recipe is fitted to the machine first (:func:`calibrate_steps`,
:func:`fit_to_budget`).
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, replace

import torch

from coursekit import data, train
from coursekit.gpt import GPT, GPTConfig

__all__ = [
    "Recipe",
    "GPT_CHAR",
    "GPT_CHAR_FAST",
    "METRICS",
    "VAL_BATCH_SIZE",
    "train_gpt",
    "gpt_val_loss",
    "calibrate_steps",
    "fit_to_budget",
    "pretrain_gpt_char",
]

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

    def shortened(self, steps: int) -> Recipe:
        """The same recipe with ``steps`` training steps and no time budget (warmup and evaluations
        scaled along; a smoke run)."""
        cfg = self.train
        return replace(
            self,
            minutes=None,
            train=replace(
                cfg,
                max_steps=steps,
                warmup_steps=min(cfg.warmup_steps, steps // 10),
                eval_interval=max(1, min(cfg.eval_interval, steps)),
            ),
        )


GPT_CHAR_FAST = Recipe(
    model=GPTConfig(vocab_size=1, block_size=64, n_layers=4, n_heads=4, d_model=128, bias=False),
    train=train.TrainConfig(
        max_steps=2000,
        batch_size=12,
        lr=3e-3,
        min_lr_ratio=0.1,
        warmup_steps=100,
        weight_decay=0.1,
        betas=(0.9, 0.99),
        grad_clip=1.0,
        eval_interval=2000,
        eval_batches=10,
    ),
)

#: 3,000 steps of 12 x 128 characters are 4.6M characters, 11 passes over the training text: longer
#: schedules overfit (measured on the whole validation split: 3,300 steps end at 1.189 nats/char,
#: 4,295 steps at 1.207). Dropout would help against overfitting but halves the steps per second
#: on a CPU (measured: 0.1 everywhere, 2.4 instead of 4.3 steps/s on one thread).
GPT_CHAR = Recipe(
    model=GPTConfig(vocab_size=1, block_size=128, n_layers=6, n_heads=4, d_model=128, bias=False),
    train=train.TrainConfig(
        max_steps=3000,
        batch_size=12,
        lr=3e-3,
        min_lr_ratio=0.1,
        warmup_steps=100,
        weight_decay=0.1,
        betas=(0.9, 0.99),
        grad_clip=1.0,
        eval_interval=500,
        eval_batches=10,
    ),
    minutes=9.5,
)


def gpt_val_loss(model: GPT, d: data.TokenData) -> float:
    """Mean next-token cross-entropy (nats per token) over the whole validation split.

    The split is cut into consecutive ``block_size`` windows (:func:`coursekit.data.split_batches`),
    so nothing is sampled: a few hundred sampled windows vary by several hundredths of a nat
    from one seed to the next on this text (measured: 1.204 to 1.238 for one model).
    """
    batches = data.split_batches(d.val, model.cfg.block_size, VAL_BATCH_SIZE)
    return train.evaluate(model, batches, train.lm_loss)


def train_gpt(
    model: GPT,
    d: data.TokenData,
    cfg: train.TrainConfig,
    *,
    checkpoint_path=None,
    resume: bool = False,
    progress: bool = True,
) -> train.History:
    """Train ``model`` on ``d.train`` with :func:`coursekit.train.train`, evaluating on all of ``d.val``
    (:func:`gpt_val_loss`) every ``cfg.eval_interval`` steps (``cfg.eval_batches`` is not used)."""
    T = model.cfg.block_size
    return train.train(
        model,
        lambda step, g: data.lm_batch(d.train, T, cfg.batch_size, g),
        cfg,
        loss_fn=train.lm_loss,
        eval_fn=lambda m: {"val_loss": gpt_val_loss(m, d)},
        checkpoint_path=checkpoint_path,
        resume=resume,
        progress=progress,
    )


def fit_to_budget(
    cfg: train.TrainConfig, steps_per_s: float, seconds: float, margin: float = 0.9
) -> train.TrainConfig:
    """``cfg`` with as many steps as fit in ``margin * seconds``; warmup and evaluations scale along.

    The margin absorbs the difference between a short calibration and a long run (measured:
    a long run was up to 10% slower per step than its calibration).
    """
    steps = max(10, int(seconds * steps_per_s * margin))
    warmup = min(cfg.warmup_steps, steps // 10)
    return replace(cfg, max_steps=steps, warmup_steps=warmup, eval_interval=max(1, steps // 6))


def calibrate_steps(
    model_cfg: GPTConfig, cfg: train.TrainConfig, d: data.TokenData, steps: int = 30
) -> float:
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
    train.train(
        model,
        batch_fn,
        replace(short, max_steps=steps, eval_interval=steps),
        loss_fn=train.lm_loss,
        optimizer=optimizer,
        progress=False,
    )
    return steps / (time.perf_counter() - start)


# --------------------------------------------------------------------------- the committed checkpoint

#: What :func:`pretrain_gpt_char` records.
METRICS = (
    "val_loss",
    "val_protocol",
    "val_loss_during_training",
    "train_seconds",
    "tokens_per_s",
    "steps",
    "parameters",
    "machine",
)


def pretrain_gpt_char(recipe: Recipe = GPT_CHAR, progress: bool = True):
    """Train :data:`GPT_CHAR` from scratch, round to float16 and measure.

    A time-budgeted recipe is first fitted to this machine (see :class:`Recipe`); the
    returned recipe is the one actually run (its steps, no budget).

    Returns:
        ``(model, tokenizer, recipe, metrics)``: the model (float32 holding the float16-rounded
        weights that are stored and measured), the character tokenizer, the recipe run and the
        metrics (:data:`METRICS`).
    """
    d = data.prepare("python-docs")
    recipe = replace(recipe, model=replace(recipe.model, vocab_size=d.vocab_size))
    if recipe.minutes is not None:
        rate = calibrate_steps(recipe.model, recipe.train, d)
        fitted = fit_to_budget(recipe.train, rate, recipe.minutes * 60)
        recipe = replace(
            recipe, train=fitted if fitted.max_steps < recipe.train.max_steps else recipe.train, minutes=None
        )
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
    return model, d.tokenizer, recipe, metrics
