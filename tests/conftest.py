"""Shared test configuration.

Tolerances for comparisons with independent references live here, in one place:
float64 comparisons are tight, float32 ones use torch.testing's defaults.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

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


#: Modules that grade classes with ``--jobs 2`` (both cores), run after the rest of the suite; the
#: book's own tests last. The book build starts in the background at collection and takes one core
#: for about ten minutes: the single-threaded tests run beside it, the two-job batches after it,
#: so that neither core waits (in file order the batches came first, and the unit tests later ran
#: on one core while the other idled).
LATE = {
    "test_adversarial.py": 1,
    "test_autograde.py": 1,
    "test_autograde_chapters.py": 1,
    "test_load.py": 1,  # loads both cores on purpose: not beside the book build's page cells
    "test_term.py": 1,
    "test_cluster.py": 1,  # a Dask scheduler, two workers and a one-process run: both cores
    "test_book.py": 2,
    "test_accessibility.py": 2,  # reads the built book too: first in file order, it waited 5 min for the build
}


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "bubblewrap: grades through `coursekit autograde`, which refuses to grade without a working "
        "bubblewrap; skipped, with the reason, where there is none",
    )


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: LATE.get(item.path.name, 0))  # stable: file order within each group
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
