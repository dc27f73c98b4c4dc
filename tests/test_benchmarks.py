"""The benchmark report: the committed full run covers every benchmark and its markdown is current;
``benchmarks/run.py --quick`` runs every benchmark into one report (slow; CI budget: 3 minutes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import run as bench  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def test_committed_report_is_a_full_run_of_every_benchmark():
    report = json.loads((RESULTS / "report.json").read_text())
    assert report["quick"] is False, "commit a full run (python benchmarks/run.py), not a quick one"
    assert set(report["benchmarks"]) == set(bench.BENCHMARKS), "re-run the benchmarks that are missing"
    for name, b in report["benchmarks"].items():
        assert b["summary"], f"{name} has no summary rows"
        assert b["results"].get("quick") in (None, False), f"{name} was measured in quick mode"
        # each benchmark's own JSON is the one the report summarises (the chapters read those files)
        assert json.loads((RESULTS / f"{name}.json").read_text()) == b["results"], (
            f"{name}.json differs from report.json"
        )
        assert [list(row) for row in bench.BENCHMARKS[name][2](b["results"])] == b["summary"]


def test_committed_markdown_is_generated_from_the_json():
    report = json.loads((RESULTS / "report.json").read_text())
    assert (RESULTS / "report.md").read_text() == bench.markdown(report), (
        "regenerate with python benchmarks/run.py"
    )


def test_the_class_benchmark_fits_amdahls_law_and_leaves_one_core_alone():
    """Two runs give the serial fraction s of T(2) = T(1) (s + (1 - s) / 2) and projections made with
    it; one run on one core (``--quick``) gives neither, and its summary rows say so."""
    import class_scale

    def run(cores: int, wall: float, busy: float) -> dict:
        return {"cores": cores, "jobs": cores, "process_wall": wall, "busy": busy, "cpu": wall * cores * busy}

    two = class_scale.summarise([run(1, 100.0, 1.0), run(2, 60.0, 0.9)], 10)
    assert two["serial_fraction_walls"] == pytest.approx(0.2)  # 60 / 100 = 0.2 + 0.8 / 2
    assert two["serial_fraction_busy"] == pytest.approx(1 / 0.9 - 1)
    assert two["serial_fraction"] == pytest.approx(0.2)  # the larger of the two
    assert two["projected_seconds"]["1000 students on 16 cores"] == pytest.approx(
        1000 * 10 * (0.2 + 0.8 / 16)
    )
    one = class_scale.summarise([run(1, 100.0, 1.0)], 10)
    assert one == {
        "serial_fraction": None,
        "serial_fraction_walls": None,
        "serial_fraction_busy": None,
        "projected_seconds": {},
    }
    rows = bench._class_scale({"students": 10, "runs": [{**run(1, 100.0, 1.0), "as_expected": 10}], **one})
    assert [value for _, value in rows] == ["10/10 at --jobs 1", "10.00"]


@pytest.mark.slow
def test_quick_mode_runs_every_benchmark_into_one_report(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,  # a hang guard: about 3 min on a quiet 2-core machine, 6 beside other grading and builds
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["quick"] is True
    assert set(report["benchmarks"]) == set(bench.BENCHMARKS)
    for name, b in report["benchmarks"].items():
        assert b["summary"], f"{name} has no summary rows"
        assert (tmp_path / f"{name}.json").is_file()
    scale = report["benchmarks"]["class_scale"]["results"]
    assert set(scale["kinds"].values()) == {1}, "the quick class has one student of each kind"
    assert all(r["as_expected"] == scale["students"] for r in scale["runs"])
    md = (tmp_path / "report.md").read_text()
    assert report["machine"]["cpu"] in md and "quick mode" in md
    assert md.count("\n| ") == 1 + sum(len(b["summary"]) for b in report["benchmarks"].values())
