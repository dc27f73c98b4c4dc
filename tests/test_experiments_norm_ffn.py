"""coursekit.experiments.norm_ffn: Chapter 4's LayerNorm + GELU versus RMSNorm + SwiGLU experiment.

The task is checked against its definition, the variants against what they claim to contain
(the chapter's layers with only their norms and feed-forwards replaced, parameter counts
matched), the model against causality, and the committed results (which the page loads) against
the code's settings and a fresh run.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from coursekit.experiments import norm_ffn as ex
from coursekit.layers import EncoderLayer, FeedForward, LayerNorm, RMSNorm, SwiGLU, count_params


def test_copy_batch_repeats_its_first_half():
    seq = ex.copy_batch(torch.Generator().manual_seed(0), B=5)
    assert seq.shape == (5, 2 * ex.HALF)
    assert torch.equal(seq[:, : ex.HALF], seq[:, ex.HALF :])
    assert 0 <= seq.min() and seq.max() < ex.V


def test_copy_loss_scores_the_second_half_from_the_past():
    """Brute force: the cross-entropy of each second-half token given the logits one step before it."""
    torch.manual_seed(0)
    model = ex.CopyLM("layernorm+gelu").eval()
    seq = ex.copy_batch(torch.Generator().manual_seed(1), B=3)
    with torch.no_grad():
        logits = model(seq[:, :-1])  # (B, 2 HALF - 1, V)
        expected = torch.stack(
            [
                F.cross_entropy(logits[b, t - 1][None], seq[b, t][None])
                for b in range(3)
                for t in range(ex.HALF, 2 * ex.HALF)
            ]
        ).mean()
        torch.testing.assert_close(ex.copy_loss(model, seq), expected)


@pytest.mark.parametrize("variant", ex.VARIANTS)
def test_each_variant_replaces_only_the_norms_and_the_feed_forwards(variant):
    norm, ffn = variant.split("+")
    model = ex.CopyLM(variant)
    norm_cls = RMSNorm if norm == "rmsnorm" else LayerNorm
    ffn_cls = SwiGLU if ffn == "swiglu" else FeedForward
    assert type(model.blocks.norm) is norm_cls
    assert len(model.blocks.layers) == ex.N_LAYERS
    for layer in model.blocks.layers:
        assert type(layer) is EncoderLayer and layer.norm_first
        assert type(layer.norm1) is norm_cls and type(layer.norm2) is norm_cls
        assert type(layer.ff) is ffn_cls
        if ffn == "gelu":
            assert isinstance(layer.ff.act, torch.nn.GELU) and layer.ff.linear1.out_features == 4 * ex.C
        else:
            assert layer.ff.d_ff == ex.D_FF_SWIGLU and layer.ff.gate.bias is None


def test_the_two_main_variants_have_the_same_parameter_count_to_half_a_percent():
    base, llama = (count_params(ex.CopyLM(v)) for v in ("layernorm+gelu", "rmsnorm+swiglu"))
    assert abs(llama - base) / base < 0.005
    assert ex.settings()["params"] == {v: count_params(ex.CopyLM(v)) for v in ex.VARIANTS}


@pytest.mark.parametrize("variant", ex.VARIANTS)
def test_copy_lm_is_causal(variant):
    torch.manual_seed(0)
    model = ex.CopyLM(variant).eval()
    a = ex.copy_batch(torch.Generator().manual_seed(0), B=2)
    b = a.clone()
    b[:, 9:] = (b[:, 9:] + 1) % ex.V
    with torch.no_grad():
        torch.testing.assert_close(model(a)[:, :9], model(b)[:, :9])
        assert not torch.allclose(model(a)[:, 9:], model(b)[:, 9:])


def test_copy_lm_rejects_an_unknown_variant():
    with pytest.raises(ValueError, match="variant must be one of .*, got 'batchnorm\\+relu'"):
        ex.CopyLM("batchnorm+relu")


def test_the_committed_results_hold_every_rate_variant_and_seed_of_the_code():
    """load_results refuses a file written with other settings, so this is the file being current."""
    stored = ex.load_results()
    assert stored["settings"] == ex.settings()
    assert list(stored["runs"]) == [ex.lr_key(lr) for lr in ex.LRS]
    for per_variant in stored["runs"].values():
        assert list(per_variant) == list(ex.VARIANTS)
        for runs in per_variant.values():
            assert len(runs) == len(stored["seeds"]) >= 3
            assert all(len(run["train_loss"]) == ex.STEPS and run["held_out_loss"] > 0 for run in runs)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["settings"].update(steps=100),
        lambda d: d["settings"]["params"].update({"rmsnorm+swiglu": 1}),
        lambda d: d["runs"].pop(ex.lr_key(ex.LRS[0])),
    ],
)
def test_load_results_refuses_a_file_of_another_experiment(tmp_path, change):
    data = json.loads(ex.RESULTS.read_text())
    change(data)
    (tmp_path / "other.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="another experiment"):
        ex.load_results(tmp_path / "other.json")


@pytest.mark.slow  # one training run of 200 steps, several seconds
def test_the_committed_results_are_those_a_fresh_run_gives():
    """Regenerate with: python -m coursekit.experiments.norm_ffn (all seeds, one thread per run)."""
    stored = ex.load_results()
    seed, lr = stored["seeds"][-1], ex.LRS[-1]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fresh = ex.train_run("rmsnorm+swiglu", lr, seed)
    finally:
        torch.set_num_threads(threads)
    run = stored["runs"][ex.lr_key(lr)]["rmsnorm+swiglu"][stored["seeds"].index(seed)]
    assert fresh["train_loss"] == pytest.approx(run["train_loss"], abs=1e-5)
    assert fresh["held_out_loss"] == pytest.approx(run["held_out_loss"], abs=1e-5)
