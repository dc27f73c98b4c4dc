"""One training loop for every model of the course: AdamW, warmup and cosine decay, clipping,
periodic evaluation, a progress bar, seeding and exact checkpoint/resume.

Conventions, stated once and tested:

- **Steps.** Step ``i`` (``0 <= i < max_steps``) is the ``i``-th optimizer update. It uses
  the learning rate :func:`lr_at` ``(i)`` and the batch ``batch_fn(i, generator)``; its
  loss is recorded as ``History.train_loss[i]``. An evaluation "at step ``s``" sees the
  model after ``s`` updates: at ``s = 0`` (before training), every ``eval_interval``
  steps, and at ``max_steps``.
- **The model interface** is one function, ``loss_fn(model, batch) -> scalar loss``. The
  default calls ``model(*batch)`` and expects the loss back; :func:`lm_loss` suits a
  model that returns logits ``(B, T, V)`` from ``x`` (a GPT's next-token targets, or a
  BERT's masked-token labels with ``-100`` where nothing is predicted).
- **Randomness.** A fresh run seeds the global generator (dropout) with ``seed`` and the
  batch generator with ``seed + 1``; a checkpoint stores both states, so that training
  ``N`` steps in one go and in two resumed pieces gives bit-identical parameters.
- **Evaluation** runs under ``torch.no_grad()`` with ``model.eval()``, then the model goes
  back to training mode.

Over 500 lines: the one training loop every chapter uses (schedules, clipping, accumulation,
evaluation, checkpoints and resumption) reads best as one file.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from coursekit._files import atomic_write

__all__ = [
    "History",
    "TrainConfig",
    "TRAIN_PRESETS",
    "evaluate",
    "lm_loss",
    "load_checkpoint",
    "lr_at",
    "make_optimizer",
    "save_checkpoint",
    "train",
]

logger = logging.getLogger(__name__)
_FORMAT = "coursekit-checkpoint"
_VERSION = 1
Batch = Any
LossFn = Callable[[nn.Module, Batch], torch.Tensor]


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of :func:`train`.

    Args:
        max_steps: number of optimizer updates; the schedule ends here.
        batch_size: ``B``, for the caller's ``batch_fn`` (the loop never reads it).
        lr: peak learning rate, reached at the end of the warmup.
        min_lr_ratio: the cosine decays to ``min_lr = min_lr_ratio * lr``.
        warmup_steps: linear warmup length (``0`` for none), at most ``max_steps``.
        weight_decay: AdamW's decoupled decay, on matrices only (see :func:`make_optimizer`).
        betas: AdamW's ``(beta1, beta2)``.
        grad_clip: clip the global gradient norm to this; ``None`` for no clipping.
        eval_interval: evaluate (and save a checkpoint) every this many steps.
        eval_batches: how many validation batches the caller's ``eval_fn`` uses.
        seed: seeds the dropout and batch generators of a fresh run.
        log_interval: refresh the progress bar's postfix every this many steps.
    """

    max_steps: int = 2000
    batch_size: int = 32
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0
    eval_interval: int = 250
    eval_batches: int = 20
    seed: int = 0
    log_interval: int = 10

    def __post_init__(self):
        object.__setattr__(self, "betas", tuple(self.betas))
        for name in (
            "max_steps",
            "batch_size",
            "eval_interval",
            "eval_batches",
            "log_interval",
            "warmup_steps",
            "seed",
        ):
            value, least = getattr(self, name), 0 if name in ("warmup_steps", "seed") else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if not 0 <= self.warmup_steps <= self.max_steps:
            raise ValueError(
                f"warmup_steps must be in [0, max_steps={self.max_steps}], got {self.warmup_steps}"
            )
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive finite number, got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be positive or None (no clipping), got {self.grad_clip}")

    @property
    def min_lr(self) -> float:
        return self.lr * self.min_lr_ratio


#: Named configurations: ``nano`` for tests, ``small`` for the book's demos on a 2-core CPU.
TRAIN_PRESETS = {
    "nano": TrainConfig(
        max_steps=20, batch_size=4, warmup_steps=2, eval_interval=10, eval_batches=2, log_interval=5
    ),
    "small": TrainConfig(max_steps=2000, batch_size=32, warmup_steps=100, eval_interval=250, eval_batches=20),
}


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The learning rate of update ``step``: linear warmup, then cosine decay to ``min_lr``.

    With ``W = warmup_steps``, ``M = max_steps``, ``peak = lr``:

    - ``step < W``: ``peak * (step + 1) / W`` (step 0 already learns, at ``peak / W``;
      step ``W - 1`` reaches ``peak``);
    - ``W <= step < M``: ``min_lr + (peak - min_lr) * (1 + cos(pi * (step - W) / (M - W))) / 2``,
      which is ``peak`` at ``W`` and ``(peak + min_lr) / 2`` halfway;
    - ``step >= M``: ``min_lr``.

    Example: ``lr=1, min_lr_ratio=0, W=2, M=6`` gives ``0.5, 1, 1, 0.5, 0`` ... at steps 0, 1, 2, 4, 6.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if step >= cfg.max_steps:
        return cfg.min_lr
    progress = (step - cfg.warmup_steps) / (cfg.max_steps - cfg.warmup_steps)  # in [0, 1)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only.

    Group 0 holds the parameters with ``dim >= 2`` (linear and embedding weights) and
    decays them by ``cfg.weight_decay``; group 1 holds the rest (biases, norm gains)
    with no decay, since shrinking a bias or a LayerNorm gain towards 0 is not a useful
    prior. Frozen parameters (``requires_grad=False``) are left out; a tied weight
    appears once. The fused CPU/CUDA kernel is used when every parameter allows it (it
    computes the same update as the reference loop; its step is about 5x faster on CPU).

    Returns:
        The optimizer, with its ``lr`` at ``cfg.lr`` (:func:`train` sets it every step).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=fused or None)


def lm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the logits ``model(x)`` against the targets ``y``; targets ``-100`` are ignored.

    Serves next-token prediction (logits ``(B, T, V)``, targets ``(B, T)``), masked
    language modelling (the same, with ``-100`` at unmasked positions) and
    classification (logits ``(B, K)``, labels ``(B,)``).

    Args:
        model: maps ``x`` to logits of shape ``y.shape + (V,)``.
        batch: ``(x, y)``.

    Returns:
        A scalar tensor.
    """
    x, y = batch
    logits = model(x)  # (*y.shape, V)
    if logits.shape[:-1] != y.shape:
        raise ValueError(
            f"logits must have the targets' shape {tuple(y.shape)} plus a vocabulary axis, "
            f"got {tuple(logits.shape)}"
        )
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100
    )  # (N, V), (N,)


def _default_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(*batch)


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[Batch], loss_fn: LossFn | None = None) -> float:
    """The mean loss over ``batches`` in eval mode without gradients; the mode is restored.

    Each batch's loss is weighted by its number of input ids, so a short last batch (as
    :func:`coursekit.data.split_batches` makes) counts for what it holds; batches of one
    size get the plain mean.

    Example: ``eval_fn = lambda m: {"val_loss": evaluate(m, val_batches, lm_loss)}``.
    """
    if not batches:
        raise ValueError("evaluate needs at least one batch, got none")
    loss_fn = loss_fn or _default_loss
    sizes = [_n_tokens(b) for b in batches]
    weights = sizes if all(sizes) else [1] * len(batches)
    was_training = model.training
    model.eval()
    try:
        total = sum(w * float(loss_fn(model, b)) for w, b in zip(weights, batches))
    finally:
        model.train(was_training)
    return total / sum(weights)


@dataclass
class History:
    """What :func:`train` measured; one entry per step in ``steps, train_loss, lr, grad_norm``.

    ``evals`` holds one dict per evaluation, ``{"step": s, **eval_fn(model)}``; ``tokens``
    counts the elements of each batch's input ids (its first tensor); times are in
    seconds, summed over resumed pieces.
    """

    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    tokens: int = 0
    wall_time: float = 0.0
    eval_time: float = 0.0

    @property
    def train_time(self) -> float:
        return self.wall_time - self.eval_time

    @property
    def steps_per_s(self) -> float:
        return len(self.steps) / self.train_time if self.train_time > 0 else math.nan

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.train_time if self.train_time > 0 else math.nan


def _n_tokens(batch: Batch) -> int:
    """Elements of the batch's input ids: the batch itself, its first entry or its first value; else 0."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), None)
    elif isinstance(batch, (tuple, list)):
        batch = batch[0] if batch else None
    return batch.numel() if isinstance(batch, torch.Tensor) else 0


# --------------------------------------------------------------------------- checkpoints


def _check_plain(value: Any, where: str) -> None:
    """Raise unless ``value`` is plain data that ``torch.load(weights_only=True)`` reads back."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"{where} keys must be str or int, got {type(k).__name__}")
            _check_plain(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
    elif not (value is None or isinstance(value, (str, int, float, bool, torch.Tensor))):
        raise TypeError(
            f"{where} must be plain data (numbers, strings, lists, dicts, tensors), got "
            f"{type(value).__name__}: store e.g. dataclasses.asdict(config) instead"
        )


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    history: History,
    cfg: TrainConfig,
    extra: dict | None = None,
    generator: torch.Generator | None = None,
) -> Path:
    """Write everything needed to resume exactly, atomically (a temporary file, then ``os.replace``).

    Stored: the model's and optimizer's state dicts, ``step`` (updates done), the
    history, the config, the global CPU (and CUDA) random states and ``generator``'s state, and
    ``extra`` (plain data: numbers, strings, lists, dicts, tensors; e.g. the model's
    config and the tokenizer's vocabulary). Returns the path.
    """
    _check_plain(extra or {}, "extra")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "format": _FORMAT,
        "version": _VERSION,
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "config": asdict(cfg),
        "history": asdict(history),
        "extra": extra or {},
        "rng": {
            "torch": torch.get_rng_state(),
            "generator": None if generator is None else generator.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        },
    }
    return atomic_write(path, lambda tmp: torch.save(state, tmp))


def _read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's contents, with ``config`` and ``history`` as objects; nothing is loaded."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no checkpoint at {os.fspath(path)}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (torch raises several types for a file it cannot read)
        raise ValueError(f"{path} is not a coursekit checkpoint: {e}") from None
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise ValueError(f'{path} is not a coursekit checkpoint (no "format": "{_FORMAT}")')
    if state.get("version") != _VERSION:
        raise ValueError(
            f"{path} has checkpoint version {state.get('version')}; this coursekit reads {_VERSION}"
        )
    state["config"] = TrainConfig(**state["config"])
    state["history"] = History(**state["history"])
    return state


def _load_states(
    state: dict[str, Any], path, model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> None:
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise ValueError(
            f"the checkpoint {path} does not fit this model (was it saved with another shape?): {e}"
        ) from None
    if optimizer is not None:
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError) as e:
            raise ValueError(f"the checkpoint {path} does not fit this optimizer: {e}") from None


def load_checkpoint(
    path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, Any]:
    """Load a checkpoint's weights into ``model`` (and its state into ``optimizer``).

    Returns:
        The checkpoint: ``step``, ``config`` (a :class:`TrainConfig`), ``history`` (a
        :class:`History`), ``rng``, ``extra``, and the raw ``model`` and ``optimizer``
        state dicts. Random states are returned, not restored.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not a coursekit checkpoint, or it does not fit the
            model (names or shapes of parameters) or the optimizer.
    """
    state = _read_checkpoint(path)
    _load_states(state, path, model, optimizer)
    return state


# --------------------------------------------------------------------------- the loop


def train(
    model: nn.Module,
    batch_fn: Callable[[int, torch.Generator], Batch],
    cfg: TrainConfig,
    *,
    loss_fn: LossFn | None = None,
    eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    resume: bool = False,
    extra: dict | None = None,
    stop_at: int | None = None,
    progress: bool = True,
    write_checkpoints: bool = True,
) -> History:
    """Train ``model`` for ``cfg.max_steps`` updates (see the module's conventions).

    Each step: set the learning rate to :func:`lr_at`, draw ``batch_fn(step, generator)``,
    compute ``loss_fn(model, batch)``, backpropagate, clip the global gradient norm,
    update. Evaluations at steps ``0, eval_interval, 2 eval_interval, ..., max_steps``
    call ``eval_fn(model)`` under ``torch.no_grad()`` in eval mode.

    Args:
        model: any module; it is put in training mode, and its mode restored at the end.
        batch_fn: ``(step, generator) -> batch``; draw all randomness from ``generator``.
        cfg: the hyperparameters.
        loss_fn: ``(model, batch) -> scalar loss``; default ``model(*batch)``.
        eval_fn: ``model -> {name: value}``, e.g. ``{"val_loss": ...}``; ``None`` for none.
        optimizer: default :func:`make_optimizer` ``(model, cfg)``.
        checkpoint_path: where to save after each evaluation step and at the end.
        resume: continue from ``checkpoint_path`` (which must exist and have the same config).
        extra: plain data stored in every checkpoint (see :func:`save_checkpoint`).
        stop_at: stop after this many updates (to train in pieces); the schedule still
            runs to ``cfg.max_steps``.
        progress: show a ``tqdm`` bar with the loss on stderr; ``False`` prints nothing.
        write_checkpoints: ``False`` reads ``checkpoint_path`` to resume but never writes it
            (the other processes of a distributed run, see :mod:`coursekit.distributed`).

    Returns:
        The :class:`History` of the whole run (including resumed pieces).

    Raises:
        FloatingPointError: the loss became NaN or infinite.
    """
    loss_fn = loss_fn or _default_loss
    optimizer = optimizer if optimizer is not None else make_optimizer(model, cfg)
    stop = cfg.max_steps if stop_at is None else stop_at
    if not 0 <= stop <= cfg.max_steps:
        raise ValueError(f"stop_at must be in [0, max_steps={cfg.max_steps}], got {stop_at}")
    if resume and checkpoint_path is None:
        raise ValueError("resume=True needs a checkpoint_path")
    generator = torch.Generator()
    if resume:
        state = _read_checkpoint(checkpoint_path)
        if state["config"] != cfg:  # checked before anything is loaded into the model
            diff = [
                f"{f.name}: saved {getattr(state['config'], f.name)!r}, now {getattr(cfg, f.name)!r}"
                for f in fields(cfg)
                if getattr(state["config"], f.name) != getattr(cfg, f.name)
            ]
            raise ValueError(f"cannot resume {checkpoint_path} with a different config ({'; '.join(diff)})")
        _load_states(state, checkpoint_path, model, optimizer)
        start, history, rng = state["step"], state["history"], state["rng"]
        if rng["generator"] is None:
            raise ValueError(
                f"{checkpoint_path} holds no batch generator state: resume a checkpoint written by train()"
            )
        torch.set_rng_state(rng["torch"])
        generator.set_state(rng["generator"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
    else:
        start, history = 0, History()
        torch.manual_seed(cfg.seed)
        generator.manual_seed(cfg.seed + 1)
    if start > stop:
        raise ValueError(f"the checkpoint is at step {start}, past stop_at={stop}")

    was_training = model.training
    model.train()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    max_norm = cfg.grad_clip if cfg.grad_clip is not None else math.inf  # inf: measure the norm only
    t_start, eval_time = time.perf_counter(), 0.0
    bar = tqdm(total=stop, initial=start, desc="train", disable=not progress, dynamic_ncols=True)
    shown: dict[str, str] = {}  # the bar's postfix: latest loss, lr and evaluation

    def run_eval(step: int) -> None:
        nonlocal eval_time
        t = time.perf_counter()
        model.eval()
        with torch.no_grad():
            metrics = {k: float(v) for k, v in eval_fn(model).items()}
        model.train()
        eval_time += time.perf_counter() - t
        history.evals.append({"step": step, **metrics})
        shown.update({k: f"{v:.4f}" for k, v in metrics.items()})
        bar.set_postfix(shown, refresh=False)
        logger.info("step %d: %s", step, metrics)

    def save(step: int) -> None:
        elapsed = time.perf_counter() - t_start
        snapshot = replace(
            history, wall_time=history.wall_time + elapsed, eval_time=history.eval_time + eval_time
        )
        save_checkpoint(checkpoint_path, model, optimizer, step, snapshot, cfg, extra, generator)

    try:
        if eval_fn is not None and start == 0:
            run_eval(0)
        for step in range(start, stop):
            lr = lr_at(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = batch_fn(step, generator)
            loss = loss_fn(model, batch)
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                got = f"shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
                raise TypeError(
                    f"loss_fn must return a scalar loss tensor, got {got} (pass loss_fn=lm_loss "
                    "for a model that returns logits)"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            optimizer.step()

            value = loss.item()
            if not math.isfinite(value):
                raise FloatingPointError(
                    f"the loss is {value} at step {step} (lr {lr:.3g}): lower lr or check the data"
                )
            history.steps.append(step)
            history.train_loss.append(value)
            history.lr.append(lr)
            history.grad_norm.append(grad_norm.item())
            history.tokens += _n_tokens(batch)
            bar.update(1)
            done = step + 1
            if done % cfg.log_interval == 0 or done == stop:
                shown.update(loss=f"{value:.4f}", lr=f"{lr:.2e}")
                bar.set_postfix(shown, refresh=False)
            at_eval = done % cfg.eval_interval == 0 or done == cfg.max_steps
            if eval_fn is not None and at_eval:
                run_eval(done)
            if checkpoint_path is not None and write_checkpoints and (at_eval or done == stop):
                save(done)
    finally:
        bar.close()
        history.wall_time += time.perf_counter() - t_start
        history.eval_time += eval_time
        model.train(was_training)
    return history
