"""A throwaway Dask cluster for tests: a ``dask scheduler`` and ``coursekit worker`` processes on
127.0.0.1, each in a session of its own that the test ends (``tests/test_cluster.py``,
``tests/test_term.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def start(command: list[str], log: Path) -> subprocess.Popen:
    """``command`` (a console script of this venv) in a session of its own, its output in ``log``."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.Popen(
        command,
        stdout=open(log, "w"),  # noqa: SIM115 (the child holds it; closed when the test's process ends)
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def stop(process: subprocess.Popen) -> None:
    """End the process and everything it started (its own session)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextlib.contextmanager
def dask_cluster(folder: Path, workers: int = 2):
    """A scheduler on a free port of 127.0.0.1 and ``workers`` worker processes (one Dask nanny and
    its worker each, started by ``coursekit worker``), all connected when this yields
    ``(address, processes)``; ``folder`` holds the scheduler file and the logs. Everything is
    stopped on the way out."""
    scheduler_file = folder / "scheduler.json"
    scheduler = start(
        ["dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
         "--scheduler-file", str(scheduler_file)],
        folder / "scheduler.log",
    )  # fmt: skip
    processes = [scheduler]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            if scheduler.poll() is not None:
                raise RuntimeError(f"dask scheduler exited: {(folder / 'scheduler.log').read_text()[-2000:]}")
            time.sleep(0.2)
        address = json.loads(scheduler_file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:"), address
        for i in range(workers):
            processes.append(
                start(
                    ["coursekit", "worker", address, "--nworkers", "1",
                     f"--dask-args=--host 127.0.0.1 --no-dashboard --name w{i}"],
                    folder / f"worker{i}.log",
                )
            )  # fmt: skip
        from distributed import Client

        with Client(address, timeout="30s") as client:
            client.wait_for_workers(workers, timeout=120)
        yield address, processes
    finally:
        for process in reversed(processes):
            stop(process)
