"""The coursekit command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from coursekit import cli
from tests.submissions import ROOT


def test_release_rejects_unknown_assignment(capsys):
    assert cli.main(["--course", str(ROOT), "release", "ch99_nothing"]) == 2
    assert "no such assignment in solutions/: ch99_nothing" in capsys.readouterr().err


def test_autograde_rejects_missing_folder(tmp_path, capsys):
    assert cli.main(["--course", str(ROOT), "autograde", str(tmp_path / "nope"), "--assignment", "ch01_attention"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_outside_a_course_folder_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["release", "--check"]) == 2
    assert "no nbgrader_config.py" in capsys.readouterr().err


@pytest.mark.slow
def test_doctor_finds_everything_in_a_set_up_environment():
    subprocess.run([str(ROOT / "scripts" / "install_mathjax.sh")], check=True, cwd=ROOT)
    run = subprocess.run([sys.executable, "-m", "coursekit.cli", "doctor"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[ok] python3 kernel" in run.stdout and "FAIL" not in run.stdout
