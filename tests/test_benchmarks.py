"""``benchmarks/run.py --quick``: every benchmark runs and lands in one report (CI budget: 3 minutes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import run as bench  # noqa: E402

pytestmark = pytest.mark.slow


def test_quick_mode_runs_every_benchmark_into_one_report(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["quick"] is True
    assert set(report["benchmarks"]) == set(bench.BENCHMARKS)
    for name, b in report["benchmarks"].items():
        assert b["summary"], f"{name} has no summary rows"
        assert (tmp_path / f"{name}.json").is_file()
    md = (tmp_path / "report.md").read_text()
    assert report["machine"]["cpu"] in md and "quick mode" in md
    assert md.count("\n| ") == 1 + sum(len(b["summary"]) for b in report["benchmarks"].values())

