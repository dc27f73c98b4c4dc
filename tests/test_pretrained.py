"""The committed GPT checkpoint: re-evaluated against its recorded metrics; retraining is opt-in."""

from __future__ import annotations

import os

import pytest
import torch

from coursekit import data, decoding, pretrained

RETRAIN = os.environ.get("COURSEKIT_RETRAIN") == "1"


@pytest.fixture(scope="module")
def gpt_char():
    return pretrained.load_gpt_char()


def test_checkpoint_reproduces_its_recorded_validation_loss(gpt_char):
    model, tok, record = gpt_char
    d = data.prepare("python-docs")
    assert tok.chars == d.tokenizer.chars  # the vocabulary of today's corpus
    torch.set_num_threads(max(1, torch.get_num_threads()))
    loss = pretrained.gpt_val_loss(model, d)
    assert loss == pytest.approx(record["metrics"]["val_loss"], abs=1e-4)
    assert record["metrics"]["train_seconds"] <= 600  # trained for at most 10 minutes
    assert loss <= 1.20  # the target for the 10-minute checkpoint, re-measured here


def test_checkpoint_is_small_and_records_its_command(gpt_char):
    model, _, record = gpt_char
    path = pretrained.checkpoint_dir() / "gpt-char.pt"
    assert path.stat().st_size < 8 * 2**20
    assert record["command"] == "coursekit pretrain gpt-char"
    assert record["metrics"]["parameters"] == sum(p.numel() for p in model.parameters())


def test_checkpoint_writes_python_docs_like_text(gpt_char):
    model, tok, _ = gpt_char
    prompt = torch.tensor([tok.encode("The ")])
    words = []  # four samples at temperature 0.8 (greedy tends to settle into runs of indentation)
    for seed in range(4):
        ids = decoding.generate(model, prompt, 120, temperature=0.8, generator=torch.Generator().manual_seed(seed))
        words += tok.decode(ids[0].tolist()).split()
    alphabetic = sum(w.strip(".,:;()\"'_").isalpha() for w in words)
    # measured: a random model writes about 17 "words", 5 of them alphabetic; the checkpoint 82 and 71
    assert len(words) >= 50 and alphabetic >= 0.6 * len(words), words


def test_loading_rejects_a_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError):
        pretrained.load_gpt_char(tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(not RETRAIN, reason="retraining takes minutes: set COURSEKIT_RETRAIN=1")
def test_retraining_a_short_recipe_writes_a_loadable_checkpoint(tmp_path):
    from dataclasses import replace

    recipe = replace(pretrained.GPT_CHAR, train=replace(pretrained.GPT_CHAR.train, max_steps=60, warmup_steps=10,
                                                        eval_interval=30))
    metrics = pretrained.pretrain_gpt_char(tmp_path, recipe, progress=False)
    model, _, record = pretrained.load_gpt_char(tmp_path)
    assert record["metrics"]["val_loss"] == pytest.approx(metrics["val_loss"])
    assert metrics["val_loss"] < metrics["val_loss_during_training"][0]["val_loss"]  # it learned
    assert pretrained.gpt_val_loss(model, data.prepare("python-docs")) == pytest.approx(metrics["val_loss"], abs=1e-4)
