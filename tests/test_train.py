"""coursekit.train: the schedule's formula, AdamW's groups, clipping checked by hand, a model that
learns, evaluation mode, silence without a progress bar, and exact resume from a checkpoint."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import data, train
from coursekit.train import History, TrainConfig, lr_at
from tests.conftest import assert_close

V, T, B = 8, 6, 4


class TinyLM(nn.Module):
    """A bigram language model with dropout: ``x (B, T) -> logits (B, T, V)``."""

    def __init__(self, vocab_size: int = V, width: int = 16, dropout: float = 0.0, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(vocab_size, width)
        self.drop = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, x):
        return self.head(self.norm(self.drop(self.emb(x))))  # (B, T, V)


def random_tokens(n: int = 400, seed: int = 0) -> torch.Tensor:
    return torch.randint(V, (n,), generator=torch.Generator().manual_seed(seed))


def batches_of(tokens: torch.Tensor):
    return lambda step, g: data.lm_batch(tokens, T, B, g)


def cfg(**kw) -> TrainConfig:
    base = dict(
        max_steps=8, batch_size=B, lr=1e-2, warmup_steps=2, eval_interval=3, eval_batches=2, log_interval=2
    )
    return TrainConfig(**{**base, **kw})


def params_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# --------------------------------------------------------------------------- config and schedule


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(max_steps=0), "max_steps must be an integer >= 1, got 0"),
        (dict(batch_size=2.5), "batch_size must be an integer >= 1, got 2.5"),
        (dict(eval_interval=-1), "eval_interval must be an integer >= 1"),
        (dict(warmup_steps=1.5), "warmup_steps must be an integer >= 0, got 1.5"),
        (dict(seed=-1), "seed must be an integer >= 0, got -1"),
        (dict(warmup_steps=9), r"warmup_steps must be in \[0, max_steps=8\], got 9"),
        (dict(lr=0.0), "lr must be a positive finite number, got 0.0"),
        (dict(lr=math.inf), "lr must be a positive finite number, got inf"),
        (dict(min_lr_ratio=1.5), r"min_lr_ratio must be in \[0, 1\], got 1.5"),
        (dict(weight_decay=-0.1), "weight_decay must be >= 0"),
        (dict(betas=(0.9, 1.0)), r"betas must be two numbers in \[0, 1\)"),
        (dict(grad_clip=0.0), "grad_clip must be positive or None"),
    ],
)
def test_config_rejects_bad_values_by_name(kw, message):
    with pytest.raises(ValueError, match=message):
        cfg(**kw)


def test_config_is_frozen_and_presets_are_valid():
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg().lr = 1.0
    assert set(train.TRAIN_PRESETS) >= {"nano", "small"}
    assert cfg(betas=[0.9, 0.99]).betas == (0.9, 0.99)  # a list from JSON becomes the tuple
    assert cfg(lr=2.0, min_lr_ratio=0.25).min_lr == 0.5


def test_lr_warms_up_linearly_then_follows_the_cosine_to_min_lr():
    c = cfg(max_steps=110, warmup_steps=10, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(0, c) == pytest.approx(0.1)  # step 0 already learns, at lr / warmup
    assert lr_at(9, c) == lr_at(10, c) == 1.0
    assert lr_at(60, c) == pytest.approx(0.55)  # halfway through the cosine: (lr + min_lr) / 2
    assert lr_at(35, c) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))
    assert lr_at(110, c) == pytest.approx(0.1) and lr_at(500, c) == pytest.approx(0.1)
    rates = [lr_at(s, c) for s in range(111)]
    assert all(a < b for a, b in zip(rates[:10], rates[1:10]))  # strictly up during warmup
    assert all(a > b for a, b in zip(rates[10:], rates[11:]))  # strictly down after
    assert all(0.1 - 1e-12 <= r <= 1.0 for r in rates)


def test_lr_docstring_example_and_edge_cases():
    c = cfg(lr=1.0, min_lr_ratio=0.0, warmup_steps=2, max_steps=6)
    assert [lr_at(s, c) for s in (0, 1, 2, 4, 6)] == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0])
    assert lr_at(0, cfg(warmup_steps=0, lr=0.3)) == pytest.approx(0.3)  # no warmup: start at the peak
    flat = cfg(warmup_steps=0, lr=0.3, min_lr_ratio=1.0)
    assert {lr_at(s, flat) for s in range(10)} == {0.3}
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        lr_at(-1, c)


# --------------------------------------------------------------------------- optimizer


def test_weight_decay_goes_to_matrices_only():
    model = nn.ModuleDict(
        dict(
            emb=nn.Embedding(5, 4),
            lin=nn.Linear(4, 3),
            norm=nn.LayerNorm(3),
            head=nn.Linear(4, 5, bias=False),
            frozen=nn.Linear(2, 2),
        )
    )
    model["head"].weight = model["emb"].weight  # tied: must appear once
    model["frozen"].requires_grad_(False)
    opt = train.make_optimizer(model, cfg(weight_decay=0.2))
    decay, no_decay = ({id(p) for p in g["params"]} for g in opt.param_groups)
    assert decay == {id(model["emb"].weight), id(model["lin"].weight)}
    assert no_decay == {id(model["lin"].bias), id(model["norm"].weight), id(model["norm"].bias)}
    assert [g["weight_decay"] for g in opt.param_groups] == [0.2, 0.0]
    assert all(g["betas"] == (0.9, 0.95) for g in opt.param_groups)
    with pytest.raises(ValueError, match="no trainable parameters"):
        train.make_optimizer(nn.Linear(2, 2).requires_grad_(False), cfg())


def test_fused_adamw_matches_the_reference_loop():
    """make_optimizer picks the fused kernel; it must compute torch's single-tensor AdamW update."""
    a = TinyLM().double()
    b = TinyLM().double()
    opt_a = train.make_optimizer(a, cfg(weight_decay=0.1))
    assert opt_a.defaults["fused"]
    groups = [
        {"params": [p for p in b.parameters() if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in b.parameters() if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt_b = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), foreach=False)
    x = random_tokens(24).view(4, 6)
    for _step in range(5):
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            F.cross_entropy(model(x).flatten(0, 1), x.roll(1).flatten()).backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert_close(p, q)


# --------------------------------------------------------------------------- losses


def test_lm_loss_is_the_mean_cross_entropy_over_kept_targets():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    y = torch.tensor([[1, -100, 4], [0, 2, -100]])
    loss = train.lm_loss(lambda x: logits, (None, y))
    logp = torch.log_softmax(logits, dim=-1)
    kept = [(0, 0), (0, 2), (1, 0), (1, 1)]
    expected = -sum(logp[b, t, y[b, t]] for b, t in kept) / len(kept)
    assert_close(loss, expected)
    labels = torch.tensor([4, 1])  # classification: logits (B, K) against labels (B,)
    expected = -(logp[0, 0, 4] + logp[1, 0, 1]) / 2
    assert_close(train.lm_loss(lambda x: logits[:, 0], (None, labels)), expected)
    with pytest.raises(ValueError, match=r"targets' shape \(2, 3\) plus a vocabulary axis, got \(2, 5\)"):
        train.lm_loss(lambda x: logits[:, 0], (None, y))


def test_evaluate_averages_without_gradients_and_restores_the_mode():
    model = TinyLM(dropout=0.5)
    batches = data.eval_batches(random_tokens(), T, B, 3, seed=0)
    seen = []

    def loss_fn(m, batch):
        seen.append((m.training, torch.is_grad_enabled()))
        return train.lm_loss(m, batch)

    value = train.evaluate(model, batches, loss_fn)
    model.eval()
    with torch.no_grad():
        expected = sum(train.lm_loss(model, b).item() for b in batches) / 3
    assert value == pytest.approx(expected, rel=1e-12)
    assert seen == [(False, False)] * 3
    model.train()
    train.evaluate(model, batches, train.lm_loss)
    assert model.training
    with pytest.raises(ValueError, match="at least one batch"):
        train.evaluate(model, [], train.lm_loss)


# --------------------------------------------------------------------------- the loop


def test_evaluate_over_a_whole_split_is_the_token_mean():
    """A short last batch counts for its tokens: the result is the loss over all tokens at once."""
    model = TinyLM().eval()
    tokens = random_tokens()
    batches = data.split_batches(tokens, T, 4)  # 66 windows: the last batch holds 2
    assert len({len(x) for x, _ in batches}) > 1, "the test needs a short last batch"
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    with torch.no_grad():
        expected = train.lm_loss(model, (x, y)).item()
    assert train.evaluate(model, batches, train.lm_loss) == pytest.approx(expected, rel=1e-6)


def test_a_tiny_model_learns_a_fixed_pattern():
    tokens = torch.arange(4).repeat(100)  # 0 1 2 3 0 1 ...: each token determines the next
    val = data.eval_batches(tokens, T, B, 2, seed=0)
    model = TinyLM(vocab_size=4)
    hist = train.train(
        model,
        batches_of(tokens),
        cfg(max_steps=60, lr=3e-2, eval_interval=20),
        loss_fn=train.lm_loss,
        eval_fn=lambda m: {"val_loss": train.evaluate(m, val, train.lm_loss)},
        progress=False,
    )
    first, last = hist.evals[0]["val_loss"], hist.evals[-1]["val_loss"]
    assert first > 1.0  # about ln 4 before training
    assert last < 0.1 * first
    assert sum(hist.train_loss[-5:]) / 5 < 0.1 * hist.train_loss[0]


def test_history_records_every_step_and_the_evaluation_schedule():
    c = cfg(max_steps=8, eval_interval=3)
    hist = train.train(
        TinyLM(),
        batches_of(random_tokens()),
        c,
        loss_fn=train.lm_loss,
        eval_fn=lambda m: {"val_loss": 1.0, "accuracy": 0.5},
        progress=False,
    )
    assert hist.steps == list(range(8)) and len(hist.train_loss) == len(hist.grad_norm) == 8
    assert hist.lr == [lr_at(s, c) for s in range(8)]
    assert [e["step"] for e in hist.evals] == [0, 3, 6, 8]
    assert hist.evals[1] == {"step": 3, "val_loss": 1.0, "accuracy": 0.5}
    assert hist.tokens == 8 * B * T
    assert hist.wall_time >= hist.eval_time >= 0 and hist.steps_per_s > 0 and hist.tokens_per_s > 0


def test_the_optimizer_uses_the_scheduled_rate_at_every_step():
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=123.0)
    used = []

    def loss_fn(m, batch):
        used.append(opt.param_groups[0]["lr"])
        return train.lm_loss(m, batch)

    c = cfg(max_steps=7, warmup_steps=3)
    train.train(model, batches_of(random_tokens()), c, loss_fn=loss_fn, optimizer=opt, progress=False)
    assert used == [lr_at(s, c) for s in range(7)]


@pytest.mark.parametrize("clip", [0.05, 1e6, None])
def test_gradient_clipping_scales_the_update_to_the_max_norm(clip):
    """With SGD at a constant rate, the update is -lr * g * min(1, clip / (|g| + 1e-6)).

    The 1e-6 is clip_grad_norm_'s documented guard against a zero norm."""
    torch.manual_seed(0)
    model = TinyLM().double()
    x, y = data.lm_batch(random_tokens(), T, B, torch.Generator().manual_seed(0))
    before = params_of(model)
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    norm = torch.sqrt(sum((g * g).sum() for g in grads))  # the global norm, by hand
    model.zero_grad()

    c = cfg(max_steps=1, warmup_steps=0, min_lr_ratio=1.0, lr=0.5, grad_clip=clip)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    hist = train.train(model, lambda step, g: (x, y), c, loss_fn=train.lm_loss, optimizer=opt, progress=False)
    scale = 1.0 if clip is None else min(1.0, clip / (norm.item() + 1e-6))
    assert hist.grad_norm[0] == pytest.approx(norm.item(), rel=1e-9)
    for p, p0, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(p.detach(), p0 - 0.5 * scale * g, rtol=1e-9, atol=1e-12)
    if clip == 0.05:
        assert norm.item() > 0.05  # the clipping branch really ran


def test_eval_runs_without_gradients_in_eval_mode_and_training_resumes_in_train_mode():
    class Probe(TinyLM):
        def forward(self, x):
            modes.append(("eval" if not self.training else "train", torch.is_grad_enabled()))
            return super().forward(x)

    modes: list = []
    model = Probe(dropout=0.1)
    model.eval()  # the caller's mode is restored at the end
    val = data.eval_batches(random_tokens(), T, B, 1, seed=0)
    x, y = val[0]

    def eval_fn(m):  # no help from evaluate(): the loop itself must set the mode and disable gradients
        return {"val_loss": train.lm_loss(m, (x, y)).item()}

    train.train(
        model,
        batches_of(random_tokens()),
        cfg(max_steps=4, eval_interval=2),
        loss_fn=train.lm_loss,
        eval_fn=eval_fn,
        progress=False,
    )
    # evals at 0, 2, 4 and train steps 0..3: e t t e t t e
    expected = (
        [("eval", False)]
        + [("train", True)] * 2
        + [("eval", False)]
        + [("train", True)] * 2
        + [("eval", False)]
    )
    assert modes == expected
    assert not model.training


def test_without_progress_nothing_is_printed_and_with_it_the_bar_shows_the_loss(capfd):
    train.train(
        TinyLM(),
        batches_of(random_tokens()),
        cfg(),
        loss_fn=train.lm_loss,
        eval_fn=lambda m: {"val_loss": 2.0},
        progress=False,
    )
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    train.train(
        TinyLM(),
        batches_of(random_tokens()),
        cfg(),
        loss_fn=train.lm_loss,
        eval_fn=lambda m: {"val_loss": 2.0},
        progress=True,
    )
    out, err = capfd.readouterr()
    assert out == "" and "8/8" in err and "loss=" in err and "val_loss=2.0000" in err


def test_default_loss_is_what_the_model_returns():
    class ReturnsLoss(TinyLM):
        def forward(self, x, y):
            return F.cross_entropy(super().forward(x).flatten(0, 1), y.flatten())

    a, b = ReturnsLoss(), TinyLM()
    ha = train.train(a, batches_of(random_tokens()), cfg(), progress=False)
    hb = train.train(b, batches_of(random_tokens()), cfg(), loss_fn=train.lm_loss, progress=False)
    assert ha.train_loss == hb.train_loss


def test_bad_losses_raise_clear_errors():
    with pytest.raises(TypeError, match=r"scalar loss tensor, got shape \(4, 6, 8\).*loss_fn=lm_loss"):
        train.train(
            TinyLM(), batches_of(random_tokens()), cfg(), loss_fn=lambda m, b: m(b[0]), progress=False
        )
    with pytest.raises(FloatingPointError, match="the loss is nan at step 0"):
        train.train(
            TinyLM(),
            batches_of(random_tokens()),
            cfg(),
            loss_fn=lambda m, b: train.lm_loss(m, b) * math.nan,
            progress=False,
        )
    with pytest.raises(ValueError, match=r"stop_at must be in \[0, max_steps=8\], got 9"):
        train.train(TinyLM(), batches_of(random_tokens()), cfg(), stop_at=9, progress=False)
    with pytest.raises(ValueError, match="resume=True needs a checkpoint_path"):
        train.train(TinyLM(), batches_of(random_tokens()), cfg(), resume=True, progress=False)


# --------------------------------------------------------------------------- checkpoints


def run(model, c, **kw) -> History:
    val = data.eval_batches(random_tokens(seed=1), T, B, 2, seed=0)
    return train.train(
        model,
        batches_of(random_tokens()),
        c,
        loss_fn=train.lm_loss,
        eval_fn=lambda m: {"val_loss": train.evaluate(m, val, train.lm_loss)},
        progress=False,
        **kw,
    )


def assert_same_run(a: nn.Module, ha: History, b: nn.Module, hb: History):
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert ha.steps == hb.steps and ha.train_loss == hb.train_loss and ha.lr == hb.lr
    assert ha.grad_norm == hb.grad_norm and ha.evals == hb.evals and ha.tokens == hb.tokens


def test_resuming_from_a_checkpoint_is_bit_identical_to_one_run(tmp_path):
    c = cfg(max_steps=10, eval_interval=3)  # evaluations at 0, 3, 6, 9, 10; the pieces meet at 5
    whole = TinyLM(dropout=0.5)
    h_whole = run(whole, c)

    path = tmp_path / "ckpt.pt"
    run(TinyLM(dropout=0.5), c, checkpoint_path=path, stop_at=5)
    assert not list(tmp_path.glob("*.tmp"))
    fresh = TinyLM(dropout=0.5, seed=99)  # other initial weights: everything must come from the file
    assert not torch.equal(fresh.emb.weight, whole.emb.weight)
    torch.manual_seed(12345)  # and the global random state must come from the file too
    h_resumed = run(fresh, c, checkpoint_path=path, resume=True)
    assert_same_run(whole, h_whole, fresh, h_resumed)
    assert h_resumed.steps == list(range(10))


def test_the_resume_test_can_fail_dropout_randomness_matters(tmp_path):
    """Resume from a checkpoint whose dropout random state was replaced: the run must differ."""
    c = cfg(max_steps=10, eval_interval=3)
    whole = TinyLM(dropout=0.5)
    h_whole = run(whole, c)
    path = tmp_path / "ckpt.pt"
    run(TinyLM(dropout=0.5), c, checkpoint_path=path, stop_at=5)
    state = torch.load(path, weights_only=True)
    state["rng"]["torch"] = torch.Generator().manual_seed(777).get_state()
    torch.save(state, path)
    fresh = TinyLM(dropout=0.5)
    h = run(fresh, c, checkpoint_path=path, resume=True)
    assert h.train_loss[:5] == h_whole.train_loss[:5] and h.train_loss[5:] != h_whole.train_loss[5:]


def test_checkpoints_hold_the_step_config_history_and_extra(tmp_path):
    path = tmp_path / "sub" / "ckpt.pt"
    c = cfg(max_steps=8, eval_interval=3)
    model = TinyLM()
    hist = run(
        model, c, checkpoint_path=path, extra={"model": {"vocab_size": V, "width": 16}, "chars": "abc"}
    )
    other = TinyLM(seed=5)
    state = train.load_checkpoint(path, other)
    assert state["step"] == 8 and state["config"] == c and state["extra"]["chars"] == "abc"
    assert state["history"].train_loss == hist.train_loss and state["history"].evals == hist.evals
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), other.parameters()))


def test_a_failed_save_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    model, c = TinyLM(), cfg()
    opt = train.make_optimizer(model, c)
    train.save_checkpoint(path, model, opt, 3, History(), c)
    good = path.read_bytes()

    def broken_save(obj, f):
        with open(f, "wb") as fh:
            fh.write(b"half a checkpoint")
        raise OSError("disk full")

    with pytest.raises(TypeError, match=r"extra\['model'\] must be plain data .* got TrainConfig"):
        train.save_checkpoint(path, model, opt, 4, History(), c, extra={"model": c})
    assert path.read_bytes() == good

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        train.save_checkpoint(path, model, opt, 4, History(), c)
    assert path.read_bytes() == good


def test_resuming_with_another_model_or_config_is_refused_clearly(tmp_path):
    path = tmp_path / "ckpt.pt"
    c = cfg(max_steps=8)
    run(TinyLM(), c, checkpoint_path=path, stop_at=4)
    with pytest.raises(ValueError, match=r"(?s)does not fit this model .*size mismatch for emb.weight"):
        run(TinyLM(width=32), c, checkpoint_path=path, resume=True)
    untouched = TinyLM(seed=3)
    before = params_of(untouched)
    with pytest.raises(ValueError, match=r"different config \(lr: saved 0.01, now 0.02\)"):
        run(untouched, cfg(max_steps=8, lr=0.02), checkpoint_path=path, resume=True)
    assert all(torch.equal(p, q) for p, q in zip(before, untouched.parameters()))  # refused before loading
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        run(TinyLM(), c, checkpoint_path=tmp_path / "missing.pt", resume=True)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="is not a coursekit checkpoint"):
        train.load_checkpoint(tmp_path / "junk.pt", TinyLM())
    model = TinyLM()
    train.save_checkpoint(tmp_path / "manual.pt", model, train.make_optimizer(model, c), 2, History(), c)
    with pytest.raises(ValueError, match="holds no batch generator state"):
        run(TinyLM(), c, checkpoint_path=tmp_path / "manual.pt", resume=True)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "plain.pt")
    with pytest.raises(ValueError, match="is not a coursekit checkpoint"):
        train.load_checkpoint(tmp_path / "plain.pt", TinyLM())
