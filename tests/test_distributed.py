"""Data parallelism (``coursekit.distributed``): sharding, and two processes under torchrun
taking the same steps as one process with the same global batch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coursekit import distributed, train

ROOT = Path(__file__).resolve().parents[1]
#: Two ranks average their gradients in a different order than one process sums them: after
#: 20 AdamW steps the losses and weights differ by rounding only (measured: < 1e-6).
TOL = 1e-5


def test_shard_gives_each_rank_its_contiguous_slice():
    x, y = torch.arange(8).view(8, 1), torch.arange(8, 16).view(8, 1)
    parts = [distributed.shard((x, y), r, 2) for r in range(2)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x) and torch.equal(
        torch.cat([p[1] for p in parts]), y
    )
    assert parts[1][0].flatten().tolist() == [4, 5, 6, 7]
    assert distributed.shard({"ids": x}, 1, 4)["ids"].flatten().tolist() == [2, 3]


def test_shard_rejects_what_it_cannot_split():
    with pytest.raises(ValueError, match="divisible by the number of processes, got 6 rows for 4 processes"):
        distributed.shard(torch.zeros(6, 2), 0, 4)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\), got 2"):
        distributed.shard(torch.zeros(4), 2, 2)
    with pytest.raises(TypeError, match="got str"):
        distributed.shard("batch", 0, 1)


def test_outside_torchrun_the_error_says_how_to_start(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(RuntimeError, match="torchrun"):
        distributed.init()
    with pytest.raises(RuntimeError, match="initialised process group"):
        distributed.train_ddp(torch.nn.Linear(2, 2), lambda s, g: None, train.TRAIN_PRESETS["nano"])


def torchrun(n: int, out: Path) -> dict:
    exe = Path(sys.executable).parent / "torchrun"
    cmd = [
        str(exe if exe.exists() else shutil.which("torchrun")),
        "--standalone",
        "--nproc_per_node",
        str(n),
        "-m",
        "coursekit.distributed",
        "--steps",
        "20",
        "--batch-size",
        "8",
        "--layers",
        "2",
        "--width",
        "64",
        "--block-size",
        "32",
        "--json",
        str(out),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_two_processes_take_the_same_steps_as_one(tmp_path):
    one, two = torchrun(1, tmp_path / "one.json"), torchrun(2, tmp_path / "two.json")
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert two["rank0_tokens"] * 2 == one["rank0_tokens"]  # each rank trained on half of every batch
    assert one["train_loss"][-1] < one["train_loss"][0]  # it learned something
    assert max(abs(a - b) for a, b in zip(one["train_loss"], two["train_loss"])) < TOL
    assert two["val_loss"] == pytest.approx(one["val_loss"], abs=TOL)
    for name, w in one["weights"].items():
        assert max(abs(a - b) for a, b in zip(w, two["weights"][name])) < TOL, name
