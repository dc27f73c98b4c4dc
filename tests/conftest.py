"""Shared test configuration.

Tolerances for comparisons with independent references live here, in one place:
float64 comparisons are tight, float32 ones use torch.testing's defaults.
"""

from __future__ import annotations

import os

# Every process of the suite computes on one intra-op thread: two test workers, the background book
# build, notebook kernels and sandboxes already share the machine's cores, where a second thread only
# spins (the ch07 solution notebook ran 8x slower beside two busy processes on two threads than on
# one). Set before torch is imported here, so the workers and every subprocess inherit it; a test
# that needs more threads sets them itself.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

# Hugging Face models in tests are built from tiny random configs; never reach the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: (rtol, atol) per dtype, for every comparison with a reference in tests/.
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-12), torch.float32: dict(rtol=1.3e-6, atol=1e-5)}


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, **TOL[expected.dtype])


def randomise(module: nn.Module, seed: int = 0, scale: float = 0.3, offset_1d: float = 0.0) -> nn.Module:
    """Give every parameter (biases and norm scales too) normal values times ``scale``, so no
    mapping or loading error hides behind an initialisation; ``offset_1d`` shifts the 1-D ones
    (biases, norm scales). Returns ``module``, changed in place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(
                torch.randn(p.shape, generator=g, dtype=p.dtype) * scale
                + (offset_1d if p.dim() == 1 else 0.0)
            )
    return module


#: The longest files first, longest first (their seconds in a fresh-clone run, 2 workers), then the rest
#: by their number of tests, as pytest-xdist orders files by default: each worker takes whole files
#: (``--dist loadfile``) and the next file when it is nearly done, so a long file that started last
#: was the run's tail (in xdist's own order by number of tests, the one-test Dask class of
#: ``test_cluster.py``, 7 minutes, started after 30 and ran alone). The book's tests wait for the
#: background build (about 8 minutes): a worker that takes them early sits beside it. Only the order
#: depends on this list; a stale entry costs time.
FIRST = [
    "test_adversarial.py",  # 556 s, batches with --jobs 2
    "test_graders.py",  # 508 s
    "test_benchmarks.py",  # 364 s, one test
    "test_autograde_chapters.py",  # 424 s
    "test_book.py",  # 546 s, 325 of them waiting for the build
    # a Dask scheduler, two workers and a one-process run (137 s alone, one test): not beside the hostile
    # batch, whose fork bomb the sandbox must end within its time while every core is taken (beside
    # both, once in two fresh-clone runs, the end took so long that the student was told the
    # sandbox's own process stopped answering; the score was right)
    "test_cluster.py",
    "test_load.py",  # 198 s
    "test_exercises.py",  # 193 s
    "test_autograde.py",  # 158 s
    "test_sandbox.py",  # 138 s
    "test_postgres_gradebook.py",  # 108 s
]


def _order(items: list) -> None:
    """Sort ``items`` in place by :data:`FIRST`, then by their file's number of tests (stable: each
    file's tests keep their order)."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item.path.name] = counts.get(item.path.name, 0) + 1
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(
        key=lambda item: (rank.get(item.path.name, len(FIRST)), -counts[item.path.name], str(item.path))
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "bubblewrap: grades through `coursekit autograde`, which refuses to grade without a working "
        "bubblewrap; skipped, with the reason, where there is none",
    )


def pytest_collection_modifyitems(session, config, items):
    _order(items)
    needs = [item for item in items if item.get_closest_marker("bubblewrap")]
    if needs:
        from coursekit.sandbox import bubblewrap_works

        if not bubblewrap_works():
            skip = pytest.mark.skip(
                reason="bubblewrap is missing or cannot create namespaces here, and `coursekit autograde` "
                "refuses to grade without it (sudo apt-get install bubblewrap)"
            )
            for item in needs:
                item.add_marker(skip)


def pytest_collection_finish(session):
    """Start the book build in the background if a collected test reads the built book
    (``tests/book_build.py``): the rest of the suite runs beside it."""
    if not session.config.option.collectonly and any(
        "book" in getattr(item, "fixturenames", ()) for item in session.items
    ):
        from tests import book_build

        book_build.start()


def pytest_terminal_summary(terminalreporter):
    """The files that took longest (setup, call and teardown of their tests added up; with xdist,
    each file runs whole in one process): what to split or trim when the suite grows."""
    seconds: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                path = report.nodeid.split("::", 1)[0]
                seconds[path] = seconds.get(path, 0.0) + report.duration
    if seconds:
        terminalreporter.write_sep("=", "slowest 12 files")
        for path, total in sorted(seconds.items(), key=lambda kv: -kv[1])[:12]:
            terminalreporter.write_line(f"{total:8.1f}s {path}")


def pytest_sessionfinish(session, exitstatus):
    from tests import book_build

    stopped = bool(session.shouldstop or session.shouldfail) or exitstatus == pytest.ExitCode.INTERRUPTED
    book_build.finish(interrupted=stopped)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module's tests. Graders run many tiny ops (a GPT decoding token
    by token), where extra threads only spin on a busy machine; the sandbox runs student code on
    one thread too. Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
