"""Grading on a Dask cluster, for real (README: "Large classes").

A ``dask scheduler`` and two ``coursekit worker`` processes (each a Dask nanny and its worker) on
127.0.0.1, a throwaway PostgreSQL gradebook, and a class of 8 students, one of each kind the class
benchmark draws (``benchmarks/class_scale.py``: full, one or two mistakes, half finished, untouched,
broken, renamed, hostile). ``coursekit autograde --scheduler`` grades them while one
worker is killed in the middle of a student: its nanny starts a new one and the scheduler hands the
lost student to a worker again. Then a one-process run grades the same inbox into SQLite, with the
same course secret: the gradebooks hold the same grades, and the feedback pages, the class report and
``grades.csv`` are the same.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from benchmarks.class_scale import draw_class, write_inbox
from coursekit import cli
from tests.dask_cluster import dask_cluster
from tests.postgres import postgres_course, postgres_server
from tests.submissions import course_folder

pytestmark = [pytest.mark.slow, pytest.mark.bubblewrap]

ASSIGNMENT = "ch01_attention"
STUDENTS = 8  # every kind once (a class of 40 drawn at random had no hostile student); each student
# is graded twice, on the cluster and in one process, so every kind twice cost about a minute more


def _grades(url: str) -> dict:
    with Gradebook(url) as gb:
        return {
            (s.student.id, nb.name, g.name): (g.auto_score, g.max_score)
            for s in gb.find_assignment(ASSIGNMENT).submissions
            for nb in s.notebooks
            for g in nb.grades
        }


def _pages(root: Path) -> dict[str, bytes]:
    """Every feedback page and every file of the class report, with the course folder's path taken out."""
    files = [
        *sorted((root / "feedback").rglob("*.html")),
        *sorted(p for p in (root / "reports").rglob("*") if p.is_file()),
    ]
    return {str(p.relative_to(root)): p.read_bytes().replace(str(root).encode(), b"<course>") for p in files}


def _csv(root: Path) -> list[dict]:
    with open(root / "grades.csv", newline="") as f:
        return sorted(csv.DictReader(f), key=lambda r: (r["student_id"], r["assignment"]))


def test_a_class_graded_on_dask_with_a_worker_killed_equals_a_one_process_run(tmp_path):
    with postgres_server() as pg:
        url = pg.create_database("cluster")
        cluster_root, inbox = postgres_course(tmp_path, url, "cluster")
        students = draw_class(STUDENTS, 1, cluster_root, ASSIGNMENT, scored=False, every_kind=True)
        write_inbox(students, inbox)
        local_root, local_inbox = course_folder(tmp_path, "local")
        (local_root / ".coursekit").mkdir()
        shutil.copy(cluster_root / ".coursekit" / "secret", local_root / ".coursekit" / "secret")

        from distributed import Client

        with dask_cluster(tmp_path, workers=2) as (address, _), Client(address, timeout="30s") as client:
            pids = client.run(os.getpid)  # worker address -> the pid of its process
            killed = {}

            def kill_one_mid_student():
                """Once two students are graded, SIGKILL a worker process busy with a student (an
                exception here fails the test below: nothing was killed)."""
                verdicts = cluster_root / ".coursekit" / "verdicts" / ASSIGNMENT
                end = time.monotonic() + 600
                while time.monotonic() < end and "pid" not in killed:
                    done = len(list(verdicts.glob("*/*.json"))) if verdicts.exists() else 0
                    busy = {w: tasks for w, tasks in client.processing().items() if tasks}
                    if done >= 2 and busy:
                        worker, tasks = next(iter(busy.items()))
                        pid = pids[worker]
                        os.kill(pid, signal.SIGKILL)
                        killed.update(pid=pid, worker=worker, task=tasks[0])
                    time.sleep(0.2)

            killer = threading.Thread(target=kill_one_mid_student, daemon=True)
            killer.start()
            argv = ["--course", str(cluster_root), "autograde", str(inbox), "--assignment", ASSIGNMENT,
                    "--scheduler", address]  # fmt: skip
            assert cli.main(argv) == 0
            killer.join(timeout=5)
            assert "pid" in killed, "no worker was killed mid-student: the test did not test recovery"
            client.wait_for_workers(2, timeout=120)  # the nanny replaced the killed worker
            assert killed["worker"] not in client.scheduler_info()["workers"]

        for entry in inbox.iterdir():
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, local_inbox / entry.name)
        argv = ["--course", str(local_root), "autograde", str(local_inbox), "--assignment", ASSIGNMENT]
        assert cli.main(argv) == 0

        cluster_grades = _grades(url)
        assert len({key[0] for key in cluster_grades}) == STUDENTS
        assert cluster_grades == _grades(f"sqlite:///{local_root}/gradebook.db")
        assert _csv(cluster_root) == _csv(local_root)
        cluster_pages, local_pages = _pages(cluster_root), _pages(local_root)
        assert sorted(cluster_pages) == sorted(local_pages) and len(cluster_pages) > STUDENTS // 2
        differ = [page for page in cluster_pages if cluster_pages[page] != local_pages[page]]
        assert not differ, f"{len(differ)} pages differ, e.g. {differ[0]}"
        assert re.search(r"s00\d\d_full", " ".join(cluster_pages))
