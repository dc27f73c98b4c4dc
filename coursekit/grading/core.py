"""The grading toolkit every exercise uses.

A hidden test is one call, ``grade_<part>(student_object)``. Inside, a
:class:`Grader` runs named checks; each check compares the student's code with the
``coursekit`` reference on fresh inputs (seeded from the check's name, so every run
sees the same inputs) or tests a property. A failed check records a specific hint.
At the end, :meth:`Grader.finish` prints one line per check and raises
:class:`GradingFailure` (an ``AssertionError``, so nbgrader marks the cell wrong) if
anything failed.
"""

from __future__ import annotations

import contextlib
import traceback
import zlib
from collections.abc import Iterator

import torch

__all__ = [
    "TOLERANCES",
    "GradingFailure",
    "Grader",
    "close",
    "describe",
    "generator",
]

#: One table of tolerances for every comparison a grader makes: (rtol, atol).
#: float64 is tight; float32 follows torch.testing's defaults.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1.3e-6, 1e-5),
}


class GradingFailure(AssertionError):
    """Raised by :meth:`Grader.finish` when a part has failed checks."""

    def __init__(self, part: str, failures: list[tuple[str, str]], total: int):
        self.part = part
        self.failures = failures
        lines = [f"{part}: {len(failures)} of {total} checks failed"]
        lines += [f"  - {name}: {hint}" for name, hint in failures]
        super().__init__("\n".join(lines))


class _Failed(Exception):
    def __init__(self, hint: str):
        super().__init__(hint)
        self.hint = hint


def generator(name: str) -> torch.Generator:
    """A CPU generator seeded from ``name``: the same check always sees the same inputs."""
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def close(actual: object, expected: torch.Tensor) -> bool:
    """True when ``actual`` is a tensor of ``expected``'s shape and dtype whose
    values agree within :data:`TOLERANCES` (NaN never agrees)."""
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
        return False
    if actual.dtype != expected.dtype:
        return False
    rtol, atol = TOLERANCES.get(expected.dtype, TOLERANCES[torch.float32])
    return torch.allclose(actual.detach(), expected, rtol=rtol, atol=atol, equal_nan=False)


def describe(x: object) -> str:
    """Short description of a value for a hint: ``tensor float32 (2, 3)``."""
    if isinstance(x, torch.Tensor):
        return f"tensor {str(x.dtype).removeprefix('torch.')} {tuple(x.shape)}"
    return type(x).__name__


class Grader:
    """Runs the named checks of one graded part and collects their hints.

    Example::

        g = Grader("softmax")
        with g.check("matches torch.softmax"):
            g.expect(close(student(x), torch.softmax(x, -1)), "values differ from torch.softmax")
        g.finish()
    """

    def __init__(self, part: str):
        self.part = part
        self.results: list[tuple[str, str | None]] = []

    def expect(self, ok: bool, hint: str) -> None:
        """Fail the current check with ``hint`` unless ``ok``."""
        if not ok:
            raise _Failed(hint)

    def fail(self, hint: str) -> None:
        """Fail the current check with ``hint``."""
        raise _Failed(hint)

    @contextlib.contextmanager
    def check(self, name: str) -> Iterator[None]:
        """Run one check; an exception from the student's code fails it with a hint."""
        try:
            yield
        except _Failed as f:
            self.results.append((name, f.hint))
        except NotImplementedError:
            self.results.append((name, "not implemented yet (the cell still raises NotImplementedError)"))
        except Exception as e:  # the student's code raised: report where, not our internals
            where = _student_frame(e)
            self.results.append((name, f"your code raised {type(e).__name__}: {e}{where}"))
        else:
            self.results.append((name, None))

    @property
    def failures(self) -> list[tuple[str, str]]:
        return [(n, h) for n, h in self.results if h is not None]

    def finish(self) -> None:
        """Print a line per check; raise :class:`GradingFailure` if any failed."""
        for name, hint in self.results:
            print(f"[{'pass' if hint is None else 'FAIL'}] {self.part}: {name}")
        if self.failures:
            raise GradingFailure(self.part, self.failures, len(self.results))
        print(f"{self.part}: all {len(self.results)} checks passed")


def _student_frame(e: BaseException) -> str:
    """' (line N of your cell)' for the innermost frame outside coursekit and torch."""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        f = frame.filename
        if "coursekit" not in f and "site-packages" not in f and "/torch/" not in f:
            return f" (at line {frame.lineno} of your code: {frame.line})"
    return ""
