"""A pytest plugin that writes the CPU seconds of every test: where the suite's time goes.

    COURSEKIT_CPU_OUT=/tmp/cpu PYTHONPATH=scripts PYTEST_ADDOPTS="-p cpu_per_test" .ci/run
    COURSEKIT_CPU_CGROUP=/sys/fs/cgroup/cpuacct ... (the same, exact: see below)
    python scripts/cpu_per_test.py /tmp/cpu          # the files that used the most CPU

Each test process (each pytest-xdist worker, or the one process without xdist) appends one line per
test to ``<out>/<worker>.tsv``: the test's id, its wall seconds, the CPU seconds of its own process
and of the child processes it waited for in that time (``getrusage``), and when it ended. The suite
is bound by CPU on a 2-core machine, so CPU seconds, not wall seconds, say what a change saves.

A lower bound: a process that was killed rather than waited for (a sandbox ended with its process
group, a Dask worker) is counted nowhere, and a child's CPU counts for the test that was running when
it was waited for (the background book build: the test that waits for it).

Exact, where the machine has cgroup v1's ``cpuacct`` controller and lets this user create groups
(``COURSEKIT_CPU_CGROUP=/sys/fs/cgroup/cpuacct``): each test process moves itself into a group of its
own for each test, so every process a test starts (a sandbox, a Chromium, a Dask worker, however it
ends) is counted for that test, also the CPU it uses after the test. What the process does before its
first test (collection, and the background book build it starts) is its ``(session start)`` row.
The groups are read and removed when the process ends, and the sixth column holds the count; a group
a leftover process keeps alive is left in place and named in ``<worker>.left``.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

_started: tuple[float, float, float] | None = None
_out = None


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


_active = False


def pytest_configure(config):
    """Record in the processes that run the tests: not in pytest-xdist's controller (its workers run
    them and report to it), and not in a pytest that a test starts (its CPU is that test's already)."""
    global _active
    controller = bool(config.getoption("numprocesses", None)) and not hasattr(config, "workerinput")
    nested = os.environ.get("COURSEKIT_CPU_PID") not in (None, str(os.getpid()))
    _active = not controller and not nested
    if _active:
        os.environ["COURSEKIT_CPU_PID"] = str(os.getpid())
        _start_groups()


#: cgroup mode: this process's group folder, and (nodeid, group) in the order the tests ran
_groups: Path | None = None
_tests: list[tuple[str, Path]] = []
_before = 0.0  # the process's CPU seconds when it entered its first group


def _enter(name: str) -> None:
    """Move this process (all its threads) into a new group ``name``; its children start there."""
    group = _groups / f"{len(_tests):05d}"
    group.mkdir()
    (group / "cgroup.procs").write_text(str(os.getpid()))
    _tests.append((name, group))


def _start_groups() -> None:
    global _groups
    root = os.environ.get("COURSEKIT_CPU_CGROUP")
    if not root:
        return
    global _before
    _before = sum(_cpu())
    for stale in Path(root).glob("coursekit-cpu-*"):  # an earlier run's, whose process is gone: remove
        if not Path(f"/proc/{stale.name.rsplit('-', 1)[1]}").exists():  # what is empty of it
            for group in [*stale.glob("[0-9]*"), stale]:
                try:
                    group.rmdir()
                except OSError:
                    pass
    _groups = Path(root) / f"coursekit-cpu-{os.getpid()}"
    _groups.mkdir()
    _enter("(session start)")


def _finish_groups() -> None:
    """Leave the groups, read each one's CPU seconds into the .tsv, remove the groups."""
    if _groups is None:
        return
    (_groups.parent / "cgroup.procs").write_text(str(os.getpid()))
    folder = Path(os.environ.get("COURSEKIT_CPU_OUT", "cpu-per-test"))
    folder.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    left = []
    with open(folder / f"{worker}.cgroup.tsv", "a") as out:
        out.write(f"(before the plugin started: conftest's imports)\t{_before:.2f}\n")
        for name, group in _tests:
            out.write(f"{name}\t{int((group / 'cpuacct.usage').read_text()) / 1e9:.2f}\n")
            for _ in range(50):  # a process it started may take a moment to exit
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                left.append(f"{name}: {(group / 'cgroup.procs').read_text().split()}")
    if left:
        (folder / f"{worker}.left").write_text("\n".join(left) + "\n")
    else:
        _groups.rmdir()


def pytest_unconfigure(config):
    if _active:
        _finish_groups()


def pytest_runtest_logstart(nodeid, location):
    global _started
    if _groups is not None and _active:
        _enter(nodeid)
    _started = (time.perf_counter(), *_cpu())


def pytest_runtest_logfinish(nodeid, location):
    global _out
    if _started is None or not _active:
        return
    if _out is None:
        folder = Path(os.environ.get("COURSEKIT_CPU_OUT", "cpu-per-test"))
        folder.mkdir(parents=True, exist_ok=True)
        _out = open(folder / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.tsv", "a")
    wall, own, children = _started
    own_now, children_now = _cpu()
    _out.write(
        f"{nodeid}\t{time.perf_counter() - wall:.2f}\t{own_now - own:.2f}\t{children_now - children:.2f}"
        f"\t{time.time():.1f}\n"
    )
    _out.flush()


def summary(folder: Path, top: int = 25) -> str:
    """The files whose tests used the most CPU seconds, from the ``.tsv`` files in ``folder`` (the
    exact ``.cgroup.tsv`` ones where there are any)."""
    cpu: dict[str, float] = {}
    count: dict[str, int] = {}
    exact = sorted(folder.glob("*.cgroup.tsv"))
    for path in exact or [p for p in folder.glob("*.tsv") if not p.name.endswith(".cgroup.tsv")]:
        for line in path.read_text().splitlines():
            if exact:
                nodeid, seconds = line.split("\t")
            else:
                nodeid, _wall, own, children, _end = line.split("\t")
                seconds = float(own) + float(children)
            name = nodeid.split("::", 1)[0]
            cpu[name] = cpu.get(name, 0.0) + float(seconds)
            count[name] = count.get(name, 0) + 1
    rows = [f"{'CPU s':>8}  {'tests':>5}  file"]
    rows += [f"{cpu[n]:8.1f}  {count[n]:5d}  {n}" for n in sorted(cpu, key=cpu.get, reverse=True)[:top]]
    rows.append(f"{sum(cpu.values()):8.1f}  {sum(count.values()):5d}  (all)")
    return "\n".join(rows)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1] if len(sys.argv) > 1 else "cpu-per-test")))
