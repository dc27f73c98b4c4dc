"""Grading a class on a Dask cluster: one task per student, on whichever worker is free.

``coursekit autograde INBOX --assignment A --scheduler tcp://HOST:8786`` collects the inbox and
plans the assignment on the instructor's machine, under the course's locks, then submits one task
per student (:func:`coursekit.autograde.batch.grade_and_record`: grade in the worker's sandbox,
record in the gradebook, write the feedback page) to the Dask scheduler, which hands each task to
one worker: students, not assignments, are claimed, so every machine shares the one assignment.

A worker that dies mid-student is replaced by the scheduler, which gives that student's task to
another worker (up to Dask's ``distributed.scheduler.allowed-failures``, 3 by default). Recording a
student replaces whatever an interrupted attempt wrote (nbgrader's autograde with ``force``), and
the student's inputs are seeded by the course's secret, not by the machine, so the scores equal a
one-machine run's: nothing is lost and nothing is counted twice.

What the workers need: the course's virtual environment and bubblewrap (``coursekit worker`` starts
``dask worker`` with this module as its preload, which refuses to start a worker that cannot sandbox),
the course folder at the same path as on the instructor's machine (a shared filesystem, as on every
SLURM cluster) and a gradebook every worker reaches: PostgreSQL (README: "Large classes").
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from coursekit.autograde.gradebook import is_server

log = logging.getLogger(__name__)

__all__ = ["dask_setup", "run_tasks", "start_worker"]


def run_tasks(scheduler: str, run, tasks: list, task: Callable) -> Iterator:
    """Submit ``task(run, student, key, cached)`` for each ``(student, key, cached)`` of ``tasks`` to
    the Dask ``scheduler`` and yield each student's :class:`~coursekit.autograde.record.Result` as it
    finishes (``task``: :func:`coursekit.autograde.batch.grade_and_record`)."""
    from distributed import Client, as_completed

    from coursekit.autograde.record import not_graded

    if not is_server(run.db_url):
        raise ValueError(
            "grading on a Dask cluster needs a gradebook every worker can write to at once: set "
            "CourseDirectory.db_url in nbgrader_config.py to a PostgreSQL URL (README: Large classes)"
        )
    with Client(scheduler, timeout="30s") as client:
        try:
            client.wait_for_workers(1, timeout=60)
        except TimeoutError:
            raise RuntimeError(
                f"no Dask worker joined {scheduler} within 60 s: start workers with `coursekit worker {scheduler}`"
            ) from None
        futures = {
            client.submit(
                task,
                run,
                student,
                key,
                cached,
                key=f"coursekit-{run.plan.assignment}-{student}-{key[:16]}",
                pure=False,
            ): student
            for student, key, cached in tasks
        }
        for future in as_completed(futures):
            student = futures[future]
            try:
                yield future.result()
            except Exception as e:  # noqa: BLE001 (e.g. KilledWorker: its workers kept dying)
                log.error("grading %s on the cluster failed: %s", student, e)
                yield not_graded(run.plan, student, f"{type(e).__name__}: {e}")


def dask_setup(worker) -> None:
    """Dask's preload hook (``dask worker --preload coursekit.autograde.cluster``): a worker that
    cannot isolate student code refuses to start, and the grading modules are imported once."""
    from coursekit.sandbox import choose_kind

    kind = choose_kind("auto")  # raises without bubblewrap: better no worker than an unsandboxed one
    import coursekit.autograde.record  # noqa: F401  (nbgrader: imported before the first student)

    log.info("coursekit worker ready: sandbox %s", kind)


def start_worker(scheduler: str, nworkers: int = 1, extra: list[str] | None = None) -> int:
    """Run ``dask worker`` for ``scheduler`` with ``nworkers`` processes of one thread each (one
    student at a time per process), with :func:`dask_setup` as its preload; returns its exit status."""
    dask = shutil.which("dask", path=str(Path(sys.executable).parent)) or shutil.which("dask")
    if dask is None:
        raise FileNotFoundError("the dask command is not installed: pip install -r requirements.txt")
    command = [dask, "worker", scheduler, "--nthreads", "1", "--nworkers", str(nworkers), *(extra or [])]
    command += ["--preload", "coursekit.autograde.cluster"]  # last: what follows it would be its arguments
    return subprocess.call(command)
