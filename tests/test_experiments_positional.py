"""coursekit.experiments.positional: Chapter 3's train-short, test-long experiment.

The tasks are checked against their definitions by brute force, the model against causality,
and the committed five-seed results (which the page shows as bands) against a fresh run.
"""

from __future__ import annotations

import json

import pytest
import torch

from coursekit.experiments import positional as ex


def test_latest_marked_targets_the_most_recent_marked_token():
    tokens, targets = ex.latest_marked(6, 40, torch.Generator().manual_seed(0))
    for b in range(6):
        latest = -100
        for t in range(40):
            if tokens[b, t] >= ex.PLAIN:
                latest = int(tokens[b, t])
            assert targets[b, t] == latest


def test_three_back_targets_the_token_offset_positions_earlier():
    tokens, targets = ex.three_back(3, 20, torch.Generator().manual_seed(0))
    assert (targets[:, : ex.OFFSET] == -100).all()
    assert torch.equal(targets[:, ex.OFFSET :], tokens[:, : -ex.OFFSET])


@pytest.mark.parametrize("kind", ex.KINDS)
def test_tiny_lm_is_causal_for_every_position_kind(kind):
    torch.manual_seed(0)
    model = ex.TinyLM(kind, ex.V).eval()
    a = torch.randint(0, ex.V, (2, 24))
    b = a.clone()
    b[:, 15:] = (b[:, 15:] + 1) % ex.V
    with torch.no_grad():
        torch.testing.assert_close(model(a)[:, :15], model(b)[:, :15])


def test_load_results_refuses_a_file_of_another_experiment(tmp_path):
    data = json.loads(ex.RESULTS.read_text())
    data["test_t"] = [32, 64]
    (tmp_path / "other.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="another experiment"):
        ex.load_results(tmp_path / "other.json")


@pytest.mark.slow  # one training run of 300 steps, a few seconds
def test_the_committed_results_are_those_a_fresh_run_gives():
    """Regenerate with: python -m coursekit.experiments.positional (all seeds, one thread per run)."""
    stored = ex.load_results()
    seed = stored["seeds"][-1]  # not seed 0, which the page retrains on every build
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fresh = ex.train_and_test("alibi", ex.three_back, seed)
    finally:
        torch.set_num_threads(threads)
    assert fresh == pytest.approx(
        stored["accuracy"]["three back"]["alibi"][stored["seeds"].index(seed)], abs=1e-6
    )
