"""The shared command line and writer of the experiments whose results are committed."""

import importlib
import json
from pathlib import Path

import pytest
import torch

from coursekit.experiments._results import CommittedResults, experiment_parser, read_results, run_and_write

MODULES = [
    "recurrence",
    "bert_labels",
    "bert_pairs",
    "data_scale",
    "norm_ffn",
    "nsp_negatives",
    "number_words_ood",
    "positional",
    "scrambled_pixels",
]


def test_every_experiment_with_committed_results_is_listed():
    folder = Path(importlib.import_module("coursekit.experiments").__file__).parent
    assert sorted(MODULES) == sorted(
        f.name.removesuffix("_results.json") for f in folder.glob("*_results.json")
    )


def test_run_and_write_puts_the_header_and_timings_before_what_the_run_returns(tmp_path, capsys):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # not the suite's one thread: run_and_write must set it
    seen = {}

    def run():
        seen["threads"] = torch.get_num_threads()
        return {"settings": {"steps": 3}, "runs": [[1.0, 2.0]]}

    try:
        data = run_and_write(tmp_path / "r.json", fmt="demo", version=2, seeds=(4, 5), run=run)
    finally:
        torch.set_num_threads(threads)
    assert seen["threads"] == 1
    stored = json.loads((tmp_path / "r.json").read_text())
    assert stored == data
    assert list(stored) == ["format", "version", "seeds", "seconds", "cpu_seconds", "settings", "runs"]
    assert (stored["format"], stored["version"], stored["seeds"]) == ("demo", 2, [4, 5])
    assert isinstance(stored["seconds"], int) and isinstance(stored["cpu_seconds"], int)
    assert f"wrote {tmp_path / 'r.json'} (2 seeds)" in capsys.readouterr().out
    # what it wrote reads back with the settings it was written with, and not with others
    assert read_results(
        tmp_path / "r.json", fmt="demo", version=2, what="demo", module="m", settings={"steps": 3}
    )
    with pytest.raises(ValueError, match="settings that differ: steps.*rerun python -m m"):
        read_results(
            tmp_path / "r.json", fmt="demo", version=2, what="demo", module="m", settings={"steps": 4}
        )


def test_experiment_parser_defaults_and_overrides(tmp_path):
    parser = experiment_parser(
        "coursekit.experiments.demo", "A demo.", (0, 1, 2), tmp_path / "committed.json"
    )
    assert parser.prog == "python -m coursekit.experiments.demo"
    args = parser.parse_args([])
    assert args.seeds == [0, 1, 2] and args.out == tmp_path / "committed.json"
    args = parser.parse_args(["--seeds", "7", "--out", str(tmp_path / "x.json")])
    assert args.seeds == [7] and args.out == tmp_path / "x.json"
    with pytest.raises(SystemExit):
        parser.parse_args(["--seeds", "one"])


@pytest.mark.parametrize("name", MODULES)
def test_each_experiment_command_names_itself_and_its_committed_file(name, capsys):
    module = importlib.import_module(f"coursekit.experiments.{name}")
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert f"python -m coursekit.experiments.{name}" in out and "--seeds" in out and "--out" in out
    assert module.RESULTS.is_file() and module.RESULTS.parent == Path(module.__file__).parent


def test_committed_results_read_and_write_through_one_description(tmp_path, capsys):
    """What an experiment module declares once: its command line (with options of its own), the
    file it writes and the reader that refuses another experiment's file."""
    committed = CommittedResults(
        module="coursekit.experiments.demo",
        path=tmp_path / "demo.json",
        fmt="demo",
        version=3,
        what="demo",
        seeds=(7,),
    )

    def options(parser):
        parser.add_argument("--steps", type=int, default=2)

    def run(args):
        return {"settings": {"steps": args.steps}, "runs": [args.seeds]}

    wrote = committed.main(["--steps", "5"], "A demo.", run, options=options)
    assert (wrote["format"], wrote["version"], wrote["seeds"], wrote["runs"]) == ("demo", 3, [7], [[7]])
    assert committed.read(settings={"steps": 5}) == wrote
    with pytest.raises(
        ValueError, match=r"settings that differ: steps\); rerun python -m coursekit.experiments.demo"
    ):
        committed.read(settings={"steps": 2})
    elsewhere = tmp_path / "elsewhere.json"
    committed.main(
        ["--out", str(elsewhere), "--seeds", "1", "2"], "A demo.", lambda args: {"runs": args.seeds}
    )
    assert committed.read(elsewhere)["runs"] == [1, 2]
    assert "wrote" in capsys.readouterr().out
