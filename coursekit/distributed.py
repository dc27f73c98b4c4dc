"""Data parallelism: the course's one training loop under ``torchrun`` with DistributedDataParallel.

Every process (a *rank*) holds a full copy of the model. At each step all ranks draw the
same *global* batch from identically seeded generators and each keeps its own contiguous
slice (:func:`shard`); after the backward pass DistributedDataParallel averages the
gradients over the ranks, so every rank applies the same update. With a loss that is a
mean over equally sized slices, the averaged gradient is the gradient of the global batch's
mean loss: ``W`` processes with a global batch ``B`` take the same steps as one process with
batch ``B``, up to the rounding of the sums (tested in ``tests/test_distributed.py``).

On CPU the ``gloo`` backend carries the all-reduce. Run, for example::

    torchrun --standalone --nproc_per_node 2 -m coursekit.distributed --steps 200 --batch-size 16

which trains the Chapter 7 character GPT (the benchmark's 4-layer shape) on the Python
reference manual and prints, from rank 0, the losses and the throughput of all ranks together.

What is shared and what is not:

- **Random numbers.** :func:`coursekit.train.train` seeds every rank identically, so the
  global batch is the same everywhere; dropout masks are then identical across ranks too
  (on different data). Use ``dropout=0`` when comparing with one process exactly.
- **Logging.** The loss recorded in the history is the global batch's mean (an all-reduce
  of the ranks' losses); ``History.tokens`` counts this rank's tokens only.
- **Checkpoints.** Only rank 0 writes; every rank reads the same file to resume.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from coursekit import train as train_mod

__all__ = ["init", "shard", "train_ddp", "main"]


def init(backend: str = "gloo") -> tuple[int, int]:
    """Join the process group ``torchrun`` describes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...).

    Returns:
        ``(rank, world_size)``.

    Raises:
        RuntimeError: not started by ``torchrun`` (no ``RANK``/``WORLD_SIZE`` in the environment).
    """
    if not dist.is_initialized():
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise RuntimeError(
                f"no process group to join: {', '.join(missing)} not set. Start the script with "
                "torchrun, e.g. `torchrun --standalone --nproc_per_node 2 -m coursekit.distributed`"
            )
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def shard(batch: Any, rank: int, world_size: int) -> Any:
    """This rank's contiguous slice of a global batch, along the first axis of every tensor.

    Example: a global ``x`` of 8 rows on 2 ranks gives rank 0 rows ``0..3`` and rank 1
    rows ``4..7``. Tuples, lists and dicts are sliced element by element.

    Args:
        batch: a tensor ``(B, ...)``, or a tuple/list/dict of such tensors.
        rank: this process, ``0 <= rank < world_size``.
        world_size: ``W``, which must divide ``B``.

    Returns:
        The same structure with tensors ``(B / W, ...)``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    if isinstance(batch, torch.Tensor):
        B = batch.shape[0]
        if B % world_size:
            raise ValueError(
                f"the global batch size must be divisible by the number of processes, "
                f"got {B} rows for {world_size} processes"
            )
        n = B // world_size
        return batch[rank * n : (rank + 1) * n]
    if isinstance(batch, (tuple, list)):
        return type(batch)(shard(b, rank, world_size) for b in batch)
    if isinstance(batch, dict):
        return {k: shard(v, rank, world_size) for k, v in batch.items()}
    raise TypeError(
        f"a batch must be a tensor or a tuple, list or dict of tensors, got {type(batch).__name__}"
    )


def train_ddp(
    model: nn.Module,
    batch_fn: Callable[[int, torch.Generator], Any],
    cfg: train_mod.TrainConfig,
    *,
    loss_fn: train_mod.LossFn | None = None,
    eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    resume: bool = False,
    progress: bool = True,
) -> train_mod.History:
    """:func:`coursekit.train.train` on every rank of an initialised process group (see :func:`init`).

    ``batch_fn`` returns the *global* batch (``cfg.batch_size`` rows); each rank trains on its
    :func:`shard`. The model is wrapped in ``DistributedDataParallel`` (which starts every
    rank from rank 0's weights); the optimizer, evaluation and checkpoints see the plain
    model, so a checkpoint loads into a single-process run unchanged.

    Returns:
        This rank's :class:`~coursekit.train.History` (identical on every rank except ``tokens``).
    """
    if not dist.is_initialized():
        raise RuntimeError(
            "train_ddp needs an initialised process group: call coursekit.distributed.init() first"
        )
    rank, world = dist.get_rank(), dist.get_world_size()
    if cfg.batch_size % world:
        raise ValueError(
            f"batch_size must be divisible by the number of processes, got {cfg.batch_size} for {world}"
        )
    loss_fn = loss_fn or train_mod._default_loss
    ddp = DistributedDataParallel(model)

    def local_loss(_, batch):
        loss = loss_fn(ddp, batch)  # this rank's mean; DDP averages its gradient over the ranks
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # sum over ranks
        return loss + (mean / world - loss.detach())  # the global mean's value, this rank's gradient

    return train_mod.train(
        model,
        lambda step, g: shard(batch_fn(step, g), rank, world),
        cfg,
        loss_fn=local_loss,
        eval_fn=eval_fn,
        checkpoint_path=checkpoint_path,
        resume=resume,
        progress=progress and rank == 0,
        write_checkpoints=rank == 0,
    )


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """Train the character GPT data-parallel; rank 0 prints (and ``--json`` writes) the history."""
    from coursekit import data
    from coursekit.experiments.gpt_char import GPT_CHAR_FAST, gpt_val_loss
    from coursekit.gpt import GPT

    p = argparse.ArgumentParser(prog="torchrun ... -m coursekit.distributed", description=main.__doc__)
    p.add_argument("--steps", type=int, default=200, help="optimizer updates (default 200)")
    p.add_argument("--batch-size", type=int, default=16, help="the GLOBAL batch, split over the processes")
    p.add_argument("--layers", type=int, default=GPT_CHAR_FAST.model.n_layers, help="GPT depth (default 4)")
    p.add_argument("--width", type=int, default=GPT_CHAR_FAST.model.d_model, help="GPT width (default 128)")
    p.add_argument(
        "--block-size", type=int, default=GPT_CHAR_FAST.model.block_size, help="context (default 64)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    p.add_argument("--json", help="rank 0 writes the history and the final validation loss here")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    rank, world = init()
    try:
        d = data.prepare("python-docs")
        model_cfg = replace(
            GPT_CHAR_FAST.model,
            vocab_size=d.vocab_size,
            n_layers=args.layers,
            d_model=args.width,
            block_size=args.block_size,
        )
        cfg = replace(
            GPT_CHAR_FAST.train,
            max_steps=args.steps,
            batch_size=args.batch_size,
            warmup_steps=min(GPT_CHAR_FAST.train.warmup_steps, args.steps // 10),
            eval_interval=args.steps,
        )
        torch.manual_seed(cfg.seed)
        model = GPT(model_cfg)
        T = model_cfg.block_size
        history = train_ddp(
            model,
            lambda step, g: data.lm_batch(d.train, T, cfg.batch_size, g),
            cfg,
            loss_fn=train_mod.lm_loss,
            progress=False,
        )
        val = gpt_val_loss(model, d)
        if rank == 0:
            tokens_per_s = world * history.tokens / history.train_time
            print(
                f"{world} process(es), global batch {cfg.batch_size}: train loss {history.train_loss[-1]:.4f}, "
                f"validation loss {val:.4f} nats/char, {tokens_per_s:,.0f} tokens/s in all"
            )
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(
                        {
                            "world_size": world,
                            "model": asdict(model_cfg),
                            "train": asdict(cfg),
                            "train_loss": history.train_loss,
                            "grad_norm": history.grad_norm,
                            "val_loss": val,
                            "tokens_per_s": tokens_per_s,
                            "rank0_tokens": history.tokens,
                            "weights": {k: v.flatten()[:64].tolist() for k, v in model.state_dict().items()},
                        },
                        f,
                    )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
