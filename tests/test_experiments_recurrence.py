"""coursekit.experiments.recurrence: Chapter 1's recall-at-distance-k experiment, GRU against attention.

The task is checked against its definition, each model against an independent reference built
from torch's own modules (a step-by-step ``nn.GRUCell`` loop, ``F.scaled_dot_product_attention``),
and the committed three-seed results (which the page loads) against the code's settings, the
format a tiny run of the same code writes, and a fresh run.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit.experiments import recurrence as ex
from coursekit.positional import sinusoidal_encoding

ATOL = 1e-12  # float64 comparisons against torch's own modules


def test_recall_batch_targets_the_first_token_k_steps_before_the_last():
    tokens, targets = ex.recall_batch(5, 7, torch.Generator().manual_seed(0))
    assert tokens.shape == (7, 6) and targets.shape == (7,)
    assert torch.equal(targets, tokens[:, 0]) and torch.equal(targets, tokens[:, -1 - 5])
    assert 0 <= tokens.min() and tokens.max() < ex.V
    assert len(set(tokens.flatten().tolist())) > 1  # random tokens, not a constant


def test_recall_batch_rejects_a_distance_below_one():
    with pytest.raises(ValueError, match="k must be at least 1, got 0"):
        ex.recall_batch(0, 2, torch.Generator())


def test_gru_reader_reads_the_state_after_a_step_by_step_gru_cell_loop():
    torch.manual_seed(0)
    model = ex.GRUReader().double()
    cell = nn.GRUCell(ex.C, ex.C).double()
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).copy_(getattr(model.gru, f"{name}_l0"))
        tokens, _ = ex.recall_batch(9, 3, torch.Generator().manual_seed(1))
        x = model.embed(tokens)  # (B, T, C)
        h = torch.zeros(3, ex.C, dtype=torch.float64)
        for t in range(tokens.shape[1]):  # the recurrence, one step at a time
            h = cell(x[:, t], h)
        torch.testing.assert_close(model(tokens), model.head(h), atol=ATOL, rtol=0)


def test_attention_reader_matches_torch_attention_at_the_last_position():
    torch.manual_seed(0)
    k = 11
    model = ex.AttentionReader(max_len=k + 1).double()
    tokens, _ = ex.recall_batch(k, 4, torch.Generator().manual_seed(2))
    with torch.no_grad():
        pe = sinusoidal_encoding(k + 1, ex.C).double()  # (T, C): the float32 table the model stores
        x = model.embed(tokens) + pe  # (B, T, C)
        a = model.attn
        out = F.scaled_dot_product_attention(a.q_proj(x), a.k_proj(x), a.v_proj(x), is_causal=True)
        expected = model.head(F.layer_norm(x + out, (ex.C,), model.ln.weight, model.ln.bias)[:, -1])
        torch.testing.assert_close(model(tokens), expected, atol=ATOL, rtol=0)


def test_make_model_builds_each_kind_and_rejects_an_unknown_one():
    assert isinstance(ex.make_model("gru", 4), ex.GRUReader)
    assert isinstance(ex.make_model("attention", 4), ex.AttentionReader)
    with pytest.raises(ValueError, match="kind must be one of .*, got 'lstm'"):
        ex.make_model("lstm", 4)


def test_the_committed_results_hold_every_model_seed_and_distance_of_the_code():
    """load_results refuses a file written with other settings, so this is the file being current."""
    stored = ex.load_results()
    assert stored["settings"] == ex.settings()
    assert stored["settings"]["train"]["max_steps"] == ex.STEPS == stored["settings"]["steps"]
    assert len(stored["seeds"]) >= 3
    assert list(stored["runs"]) == list(ex.MODELS)
    for per_seed in stored["runs"].values():
        assert len(per_seed) == len(stored["seeds"])
        for runs in per_seed:
            assert len(runs) == len(ex.DISTANCES)
            assert all(0.0 <= run["accuracy"] <= 1.0 and run["final_loss"] > 0 for run in runs)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["settings"].update(steps=100),
        lambda d: d["settings"]["train"].update(lr=1e-3),
        lambda d: d["settings"].update(distances=[2, 4]),
        lambda d: d["runs"].pop("gru"),
        lambda d: d["runs"]["attention"][0].pop(),
    ],
)
def test_load_results_refuses_a_file_of_another_experiment(tmp_path, change):
    data = json.loads(ex.RESULTS.read_text())
    change(data)
    (tmp_path / "other.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="another experiment"):
        ex.load_results(tmp_path / "other.json")


def test_a_tiny_run_of_the_command_writes_the_committed_format(tmp_path):
    """The regenerating command with 2 steps and two distances: same format, its own settings."""
    threads = torch.get_num_threads()
    try:
        ex.main(
            ["--seeds", "0", "--steps", "2", "--distances", "2", "3", "--out", str(tmp_path / "tiny.json")]
        )
    finally:
        torch.set_num_threads(threads)  # main runs on one thread
    tiny, stored = json.loads((tmp_path / "tiny.json").read_text()), json.loads(ex.RESULTS.read_text())
    assert list(tiny) == list(stored)
    assert (tiny["format"], tiny["version"]) == (stored["format"], stored["version"])
    assert tiny["seeds"] == [0] and tiny["settings"] == ex.settings(steps=2, distances=(2, 3))
    assert list(tiny["settings"]) == list(stored["settings"])
    assert list(tiny["runs"]) == list(stored["runs"]) == list(ex.MODELS)
    for per_seed in tiny["runs"].values():
        assert len(per_seed) == 1 and len(per_seed[0]) == 2
        assert all(list(run) == list(stored["runs"]["gru"][0][0]) for run in per_seed[0])
    with pytest.raises(ValueError, match="another experiment"):  # other settings than the code's
        ex.load_results(tmp_path / "tiny.json")


@pytest.mark.slow  # two training runs of 300 steps, several seconds
def test_the_committed_results_are_those_a_fresh_run_gives():
    """Regenerate with: python -m coursekit.experiments.recurrence (all seeds, one thread)."""
    stored = ex.load_results()
    seed = stored["seeds"][-1]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fresh = {kind: ex.train_run(kind, ex.DISTANCES[1], seed) for kind in ex.MODELS}
    finally:
        torch.set_num_threads(threads)
    for kind in ex.MODELS:
        run = stored["runs"][kind][stored["seeds"].index(seed)][1]
        assert fresh[kind]["accuracy"] == pytest.approx(run["accuracy"], abs=1e-6)
        assert fresh[kind]["final_loss"] == pytest.approx(run["final_loss"], abs=1e-5)
