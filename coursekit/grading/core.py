"""The grading toolkit every exercise uses.

A hidden test is one call, ``grade_<part>(student_object)``. Inside, a
:class:`Grader` runs named checks; each check compares the student's code with the
``coursekit`` reference on fresh inputs (seeded from the check's name, so every run
sees the same inputs; under the autograder the seed also mixes in a secret of the course,
so the hidden inputs cannot be computed from this source) or tests a property. A failed check records a specific hint.
At the end, :meth:`Grader.finish` prints one line per check and raises
:class:`GradingFailure` (an ``AssertionError``, so nbgrader marks the cell wrong) if
anything failed.

Over 500 lines: the grading toolkit every grader imports: the check runner, tolerances, inputs,
probes and the sandbox-aware helpers.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import hashlib
import threading
import traceback
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from coursekit.sandbox.protocol import shares_memory

__all__ = [
    "CLAUSES",
    "Grader",
    "GradingFailure",
    "Probe",
    "TOLERANCES",
    "call_student",
    "close",
    "default_device",
    "describe",
    "dtype_name",
    "expect_close",
    "expect_value_error",
    "first_difference",
    "first_match",
    "for_all",
    "generator",
    "is_a",
    "is_tensor",
    "load_weights",
    "magnitude",
    "meta_copy_refused",
    "names_hint",
    "probe",
    "raise_unless_student_error",
    "raised",
    "rand",
    "random_weights",
    "said",
    "same",
    "seed",
    "seeded",
    "set_attr",
    "shares_memory",
    "show",
    "student_side",
    "tensor",
    "tiny_difference",
    "tolerance",
    "value_diff",
]

#: The sandbox session the student's objects live in while the autograder runs
#: (``None`` when a grader is called in-process, as in a notebook or a unit test).
#: Each :meth:`Grader.check` then runs in a fresh process forked from the notebook.
SESSION: contextvars.ContextVar = contextvars.ContextVar("coursekit_grading_session", default=None)
#: Where :meth:`Grader.finish` writes its lines: a list to append to, or ``None`` to print.
REPORT: contextvars.ContextVar = contextvars.ContextVar("coursekit_grading_report", default=None)
#: Where :meth:`Grader.finish` records its clauses for partial credit: a list to append
#: ``(check, weight, passed)`` to, or ``None`` (in a notebook, where only the lines matter).
CLAUSES: contextvars.ContextVar = contextvars.ContextVar("coursekit_grading_clauses", default=None)
#: The course's secret (bytes) while the autograder grades; empty in notebooks and unit tests.
#: Mixed into every seed, so that inputs stay the same from run to run of one course but cannot
#: be computed from the grading source, which students can read.
SECRET: contextvars.ContextVar = contextvars.ContextVar("coursekit_grading_secret", default=b"")
#: For the graders' own tests only, never set while grading: a predicate on the hint of a failed
#: check. Once a failed check's hint satisfies it, the part stops there, as if that check were its
#: last (:meth:`Grader.check` finishes the part). A test that only asks whether a wrong answer fails
#: with its hint need not run the checks after that one: what it reads is a prefix of the full run.
STOP_WHEN: contextvars.ContextVar = contextvars.ContextVar("coursekit_grading_stop_when", default=None)

#: One table of tolerances for every comparison a grader makes: ``(rtol, atol)`` per dtype for
#: inputs of magnitude 1. A sound floating-point computation errs by a modest multiple of the
#: dtype's epsilon times the magnitude of what it combines (Higham, *Accuracy and Stability of
#: Numerical Algorithms*, 2002: a dot product of n terms errs by at most n eps sum |x_i y_i|), so
#: :func:`close` scales both by ``magnitude``, the largest absolute input. float64 allows about
#: 4.5e6 eps (any order of summation over the graders' sizes) and still catches a computation that
#: went through float32 (1e-7); float32 allows about 84 eps. Graders compare values in float64 and
#: use float32 for what the text promises about float32 (dtype, stability). No grader writes a
#: tolerance of its own.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-9, 1e-12),
    torch.float32: (1e-5, 1e-6),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
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


def seed(name: str) -> int:
    """The seed of the inputs called ``name``: a hash of the course's secret and ``name``
    under the autograder (see :data:`SECRET`), else the CRC-32 of ``name``."""
    secret = SECRET.get()
    if not secret:
        return zlib.crc32(name.encode())
    return int.from_bytes(hashlib.sha256(secret + b"\0" + name.encode()).digest()[:8], "little") >> 1


_GLOBAL_RNG = threading.Lock()


@contextlib.contextmanager
def seeded(name: str) -> Iterator[None]:
    """Seed torch's global generator with :func:`seed` of ``name`` for code that draws from it
    (a module's default initialisation, say), and restore its state afterwards. Grading threads
    share that generator, so one of them holds it at a time: results do not depend on ``--jobs``."""
    with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed(name))
        yield


def generator(name: str) -> torch.Generator:
    """A CPU generator seeded from ``name``: the same check always sees the same inputs."""
    return torch.Generator().manual_seed(seed(name))


def rand(name: str, *shape: int, dtype: torch.dtype = torch.float64, scale: float = 1.0) -> torch.Tensor:
    """Standard normal values of ``shape`` (times ``scale``), seeded from ``name``."""
    return torch.randn(*shape, generator=generator(name), dtype=dtype) * scale


def tensor(
    seed_value: int, *shape: int, dtype: torch.dtype = torch.float64, scale: float = 1.0
) -> torch.Tensor:
    """Standard normal values of ``shape`` (times ``scale``) from the integer ``seed_value``: for
    property-based checks, where Hypothesis draws the sizes and an integer seed (and shrinks both)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(int(seed_value)), dtype=dtype) * scale


def random_weights(module: torch.nn.Module, name: str) -> dict[str, torch.Tensor]:
    """A state dict with ``module``'s names and random float64 values seeded from ``name``.

    Values are normal with standard deviation 0.5; the scales of normalisation layers (a
    ``weight`` whose module name starts with ``norm``) are centred on 1, as trained ones are.
    Load it into the student's module and coursekit's to compare the two on equal weights.
    """
    g = generator(name)
    out = {}
    for key, value in module.state_dict().items():
        noise = torch.randn(value.shape, generator=g, dtype=torch.float64) * 0.5
        is_norm_scale = key.endswith(".weight") and key.split(".")[-2].startswith("norm")
        out[key] = noise + 1.0 if is_norm_scale else noise
    return out


def student_side(name: str, local: Any) -> Any:
    """``local`` when the grader runs in-process; under the autograder, the notebook's own
    global ``name`` (a proxy into the sandbox), so objects are built where the student's code runs."""
    session = SESSION.get()
    return local if session is None else session.remote(name)


def said(e: BaseException) -> str:
    """The message of an exception the student's code raised: under the autograder without the line
    of code that raised it (which the sandbox appends, and which may quote the very names a check
    looks for)."""
    message = getattr(e, "message", None)
    return message if isinstance(message, str) else str(e)


@contextlib.contextmanager
def default_device(device: str = "meta") -> Iterator[Any]:
    """torch's default device set to ``device`` where the student's code runs, while the block runs.

    Under the autograder this is the check's own process (which ends with the check); in-process it
    is undone at the end. Build every input before entering the block: a tensor the student's code
    makes without ``device=`` then lands on ``device`` (``meta`` holds no data, so the call fails or
    its result comes back on the wrong device). Yields the student's ``torch``.
    """
    theirs = student_side("torch", torch)
    theirs.set_default_device(device)
    try:
        yield theirs
    finally:
        theirs.set_default_device(None)


def meta_copy_refused(e: BaseException) -> bool:
    """``e`` is torch refusing to copy a meta tensor's (absent) data: a result made on ``meta``."""
    return isinstance(e, NotImplementedError) and "meta tensor" in str(e)


def tolerance(dtype: torch.dtype, magnitude: float = 1.0) -> tuple[float, float]:
    """``(rtol, atol)`` from :data:`TOLERANCES` for inputs of the given ``magnitude`` (at least 1)."""
    rtol, atol = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    scale = max(1.0, float(magnitude))
    return rtol * scale, atol * scale


def close(actual: object, expected: torch.Tensor, *, magnitude: float = 1.0) -> bool:
    """True when ``actual`` is a plain tensor (not a subclass) of ``expected``'s shape
    and dtype whose values agree within :func:`tolerance` of that dtype and ``magnitude``
    (the largest absolute value the computation combined); NaN never agrees, and infinities
    must match exactly."""
    if type(actual) not in (torch.Tensor, torch.nn.Parameter) or actual.shape != expected.shape:
        return False
    if actual.dtype != expected.dtype:
        return False
    rtol, atol = tolerance(expected.dtype, magnitude)
    return torch.allclose(actual.detach(), expected, rtol=rtol, atol=atol, equal_nan=False)


def magnitude(*tensors: torch.Tensor) -> float:
    """The largest finite absolute value in ``tensors`` (1 for none): what :func:`close` scales by."""
    largest = 1.0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel() and (t.is_floating_point() or t.is_complex()):
            finite = t.detach()[torch.isfinite(t.detach())]
            if finite.numel():
                largest = max(largest, float(finite.abs().max()))
    return largest


def same(actual: object, expected: torch.Tensor) -> bool:
    """:func:`close` for floating tensors; for integer and boolean ones, exact equality
    (plain tensors of one shape and dtype)."""
    if expected.is_floating_point() or expected.is_complex():
        return close(actual, expected)
    return (
        is_tensor(actual)
        and actual.shape == expected.shape
        and actual.dtype == expected.dtype
        and torch.equal(actual, expected)
    )


def describe(x: object) -> str:
    """Short description of a value for a hint: ``tensor float32 (2, 3)``; a number shows its value
    (``float 0.375``, ``int 3``), so that a hint says what the student's code gave, not only its type."""
    if type(x) in (torch.Tensor, torch.nn.Parameter):
        return f"tensor {str(x.dtype).removeprefix('torch.')} {tuple(x.shape)}"
    if x is None:
        return "None"
    if type(x) in (bool, int, float):
        return f"{type(x).__name__} {x!r}"
    name = getattr(x, "type_name", None)  # an object living in the sandbox
    return name if isinstance(name, str) else type(x).__name__


def is_tensor(x: object) -> bool:
    """A plain tensor (or parameter): a subclass could lie about its values."""
    return type(x) in (torch.Tensor, torch.nn.Parameter)


def is_a(obj: object, qualified: str) -> bool:
    """``isinstance`` by qualified class name, for local objects and sandbox objects alike:
    ``is_a(layer, "torch.nn.modules.linear.Linear")``."""
    check = getattr(type(obj), "is_a", None)
    if check is not None and getattr(obj, "type_name", None) is not None:
        return obj.is_a(qualified)
    return any(f"{c.__module__}.{c.__qualname__}" == qualified for c in type(obj).__mro__)


@dataclass
class Probe:
    """What one call of the student's code did: its result, its arguments afterwards
    (to detect in-place changes) and, if asked, the gradients of its arguments."""

    result: Any
    args: list
    kwargs: dict
    grads: list | None = None
    aliased: bool = False  # a result tensor shares memory with a tensor argument


def probe(fn, *args, backward: tuple[int | None, torch.Tensor] | None = None, **kwargs) -> Probe:
    """Call ``fn(*args, **kwargs)`` and report what it did.

    With ``backward=(i, upstream)``, ``sum(result[i] * upstream)`` is
    back-propagated (``i=None``: the result itself) and ``grads`` holds the
    gradient of each argument that requires one. Works the same whether ``fn`` is
    local or lives in the sandbox (where autograd cannot cross the process boundary).
    """
    remote = getattr(fn, "_probe", None)
    if remote is not None and getattr(fn, "type_name", None) is not None:
        answer = remote(args, kwargs, backward)
        return Probe(
            answer["result"],
            answer.get("args", list(args)),
            answer.get("kwargs", kwargs),
            answer.get("grads"),
            bool(answer.get("aliased", False)),
        )
    result = fn(*args, **kwargs)
    aliased = shares_memory(result, args, kwargs)
    grads = None
    if backward is not None:
        index, upstream = backward
        out = result if index is None else result[index]
        if isinstance(out, torch.Tensor) and out.requires_grad:
            (out * upstream).sum().backward()
        grads = [a.grad if isinstance(a, torch.Tensor) and a.requires_grad else None for a in args]
    return Probe(result, list(args), kwargs, grads, aliased)


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
        self.weights: dict[str, float] = {}  # check -> its weight in the part's partial credit
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        """A line the student reads whether the checks pass or fail (e.g. why a prediction was right)."""
        self.notes.append(text)

    def expect(self, ok: bool, hint: str) -> None:
        """Fail the current check with ``hint`` unless ``ok``."""
        if not ok:
            raise _Failed(hint)

    def fail(self, hint: str) -> None:
        """Fail the current check with ``hint``."""
        raise _Failed(hint)

    @contextlib.contextmanager
    def check(self, name: str, weight: float = 1.0) -> Iterator[None]:
        """Run one check; an exception from the student's code fails it with a hint.

        Under the autograder the check runs against a fresh, reseeded copy of the
        student's notebook process, so one check cannot disturb the next. ``weight``: the check's
        share of the part's points under partial credit (relative to the part's other checks); 0 for
        a check of code the release gives (an argument check kept from the stub), which a part
        still must pass but which earns nothing by itself.
        """
        if not weight >= 0:
            raise ValueError(f"a check's weight must be 0 or more, got {weight!r} for {name!r}")
        self.weights[name] = weight
        session = SESSION.get()
        cannot_start = None
        if session is not None:
            label = f"{self.part}: {name}"
            try:
                session.begin_check(label, seed(label))
            except Exception as e:  # the student's process is gone: this check fails with the reason
                cannot_start = e
        try:
            yield
            if cannot_start is not None:
                raise cannot_start
        except _Failed as f:
            self.results.append((name, f.hint))
        except NotImplementedError:
            self.results.append((name, _NOT_IMPLEMENTED))
        except Exception as e:  # the student's code raised: report where, not our internals
            self.results.append((name, _hint_for(e)))
        else:
            self.results.append((name, None))
        finally:
            if session is not None:
                session.end_check()
        stop, hint = STOP_WHEN.get(), self.results[-1][1]
        if stop is not None and hint is not None and stop(hint):
            self.finish()  # raises GradingFailure: the checks after this one do not run

    @property
    def failures(self) -> list[tuple[str, str]]:
        return [(n, h) for n, h in self.results if h is not None]

    def finish(self) -> None:
        """Report a line per check; raise :class:`GradingFailure` if any failed."""
        lines = [f"[{'pass' if hint is None else 'FAIL'}] {self.part}: {name}" for name, hint in self.results]
        lines += [f"{self.part}: {text}" for text in self.notes]
        if not self.failures:
            lines.append(f"{self.part}: all {len(self.results)} checks passed")
        sink = REPORT.get()
        if sink is None:
            print("\n".join(lines))
        else:
            sink.extend(lines)
        clauses = CLAUSES.get()
        if clauses is not None:
            clauses += [(f"{self.part}: {n}", self.weights.get(n, 1.0), h is None) for n, h in self.results]
        if self.failures:
            raise GradingFailure(self.part, self.failures, len(self.results))


def show(t: object, n: int = 6) -> str:
    """Up to ``n`` values of a tensor (or of a list or tuple of numbers or strings, or a small dict),
    for a hint: ``[0.25, 0.75, nan]``."""
    if isinstance(t, (list, tuple)) and all(type(v) in (int, float, bool, str) for v in t[: n + 1]):
        shown = ", ".join(
            repr(v) if isinstance(v, str) else f"{v:.4g}" if isinstance(v, float) else str(v) for v in t[:n]
        )
        return f"[{shown}{', ...' if len(t) > n else ''}]"
    if type(t) is dict:
        text = repr(dict(list(t.items())[:n]))
        return text if len(t) <= n and len(text) <= 80 else f"a dict of {len(t)} entries"
    if not is_tensor(t):
        return describe(t)
    flat = t.detach().reshape(-1)[:n].tolist()
    text = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in flat)
    return f"[{text}{', ...' if t.numel() > n else ''}]"


def first_difference(got, expected, advice: str = "") -> str:
    """'at index (i, j): expected a, got b' for the first entry where two same-shaped tensors differ;
    ``advice`` (how to fix a plain difference of values) follows only when no other cause shows: dtype,
    shape, or a tiny error."""
    if is_tensor(got) and got.shape == expected.shape and got.dtype != expected.dtype:  # the dtype alone
        return f"expected dtype {dtype_name(expected.dtype)}, got {dtype_name(got.dtype)}"
    if not (is_tensor(got) and got.shape == expected.shape):
        return f"expected {describe(expected)}, got {describe(got)}"
    g, e = got.detach().double(), expected.detach().double()
    diff = ((g - e).abs() > 0) | (g.isnan() != e.isnan())
    where = diff.nonzero()
    if not where.numel():
        return f"expected {show(expected)}, got {show(got)}{advice}"
    i = tuple(where[0].tolist())
    text = f"at index {i}: expected {e[i].item():.9g}, got {g[i].item():.9g}"
    error = (got.detach().double() - expected.detach().double()).abs().max().item()
    largest = expected.detach().abs().max().item()  # tiny next to the values themselves, not next to 1
    if expected.dtype == torch.float64 and 0 < error < 1e-4 * largest:
        return text + tiny_difference(got, error / largest)
    return text + advice


def tiny_difference(got: torch.Tensor, relative: float) -> str:
    """The one likely cause of a float64 result off by ``relative`` (below 1e-4): every value a float32
    number, or an error the size of float32 rounding (about 1e-7 per operation), means float32 on the
    way; a larger one, a small constant added."""
    if torch.equal(got.detach().float().double(), got.detach()) or relative < 2e-6:
        return " (a tiny difference, the size of float32 rounding: is part of the computation in float32?)"
    return " (a small difference, larger than float32 rounding: is a small constant, an epsilon, added?)"


def value_diff(out: object, expected: torch.Tensor, mag: float = 1.0) -> str:
    """Where ``out`` first leaves the tolerance around ``expected``: 'at [1, 2] expected 0.5403, got 0.8415'."""
    if not is_tensor(out):
        return f"got {describe(out)}"
    if out.shape == expected.shape and out.dtype != expected.dtype:  # the dtype alone
        return f"expected dtype {dtype_name(expected.dtype)}, got {dtype_name(out.dtype)}"
    if out.shape != expected.shape:
        return f"expected {describe(expected)}, got {describe(out)}"
    rtol, atol = tolerance(expected.dtype, mag)
    a, e = out.detach().double(), expected.double()
    finite = torch.isfinite(e)
    bad = torch.where(finite, (a - e).abs() > atol + rtol * e.abs(), a != e) | a.isnan()
    if not bool(bad.any()):
        return "the values differ"
    idx = tuple(int(i) for i in bad.nonzero()[0])
    want, got = float(e[idx]), float(a[idx])
    digits = next((d for d in (6, 9, 12, 17) if f"{want:.{d}g}" != f"{got:.{d}g}"), 17)
    return f"at {list(idx)} expected {want:.{digits}g}, got {got:.{digits}g}"


def expect_close(
    g: Grader, what: str, out: object, expected: torch.Tensor, mag: float = 1.0, advice: str = ""
) -> None:
    """Fail with '<what>: at [i, j] expected ..., got ...<advice>' unless ``out`` is close to ``expected``;
    ``advice`` (the fix of wrong values) only where the type, shape and dtype are right (else the hint
    names that alone)."""
    if not close(out, expected, magnitude=mag):
        values_only = is_tensor(out) and out.shape == expected.shape and out.dtype == expected.dtype
        g.fail(f"{what}: {value_diff(out, expected, mag)}{advice if values_only else ''}")


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as a hint names it: ``float32``, not ``torch.float32``."""
    return str(dtype).removeprefix("torch.")


def raise_unless_student_error(e: Exception) -> None:
    """Re-raise "not implemented yet" so that :meth:`Grader.check` reports it as such; return
    for any other exception, which the caller turns into a specific hint."""
    if isinstance(e, NotImplementedError) or getattr(e, "type_name", None) == "NotImplementedError":
        raise e


def first_match(g: Grader, out: object, candidates, right: torch.Tensor | None = None) -> None:
    """Fail with the hint of the first wrong implementation whose output ``out`` equals.

    ``candidates`` are ``(wrong_output, hint)`` pairs, computed on the same input; a
    candidate that is not a tensor is skipped. With ``right`` (the correct output), a
    candidate of another shape, or one that happens to equal the right answer on this
    input, is skipped too, so a correct answer never gets a mistake's hint.
    """
    if not is_tensor(out):
        return
    for wrong, hint in candidates:
        if not is_tensor(wrong):
            continue
        if right is not None and (wrong.shape != right.shape or same(wrong, right)):
            continue
        if same(out, wrong):
            g.fail(hint)


def expect_value_error(g: Grader, call, what: str, fix: str = "say what was expected and what came") -> None:
    """``call()`` must raise a ``ValueError``: fail with a hint naming the bad input ``what``
    and, in ``fix``, what a good message would tell the caller."""
    try:
        out = call()
    except ValueError:
        return
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        raise_unless_student_error(e)
        g.fail(
            f"with {what} your code raised {type(e).__name__.removeprefix('Student')} ({e}); "
            f"raise a ValueError instead ({fix})"
        )
    g.fail(f"with {what} your code returned {describe(out)}; raise a ValueError instead ({fix})")


def set_attr(obj: object, name: str, value: object) -> None:
    """``setattr(obj, name, value)`` for local objects and sandbox objects alike (``value`` must be
    data, or an object of the same sandbox): e.g. ``set_attr(layer.attn_dropout, "p", 1.0)`` to check
    one dropout in isolation."""
    remote = getattr(type(obj), "_set", None)
    if remote is not None and getattr(obj, "type_name", None) is not None:
        obj._set(name, value)
    else:
        setattr(obj, name, value)


def _no_local_constants() -> None:
    """Draw hidden inputs from the strategy and the seed only.

    Hypothesis (from 6.131) now and then draws a constant it found in the source of the "local"
    modules loaded in the process. Which modules those are depends on what the process imported and
    on whether coursekit is installed editable, so one seed gave other hidden inputs in the
    autograder, in ``coursekit check``, in the tests and on another install. Its cache of those
    constants goes too, in case a draw happened before this module was imported.
    """
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:  # another Hypothesis: nothing of the kind to turn off
        return
    if hasattr(providers, "_get_local_constants"):
        empty = Constants()
        providers._get_local_constants = lambda: empty
        cache = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
        if cache is not None:  # as Hypothesis itself empties it when new local constants appear
            cache.clear()


_no_local_constants()


#: The examples of ``for_all`` runs that passed, by everything that determines them: replayed
#: without Hypothesis's machinery (see :func:`for_all`).
_PASSED: dict[tuple, list] = {}
_PASSED_LOCK = threading.Lock()


def for_all(name: str, strategy, test, *, max_examples: int = 20, first: object = None) -> None:
    """Call ``test(example)`` on examples of the Hypothesis ``strategy``, drawn deterministically
    from :func:`seed` of ``name`` (re-runs see the same examples; other courses other ones).

    On the first failure Hypothesis shrinks the example to the smallest one that still fails, and
    that example's failure is raised: a hint written with the example's sizes then names the
    smallest input that shows the bug. ``first`` is tried before anything else (give the simplest
    canonical input: a part that is not implemented fails there at once, without shrinking).

    Use inside ``with g.check(...)``: the check fails with the raised hint.

    Hypothesis's *explain* phase is left out: after shrinking it re-runs the test many more times
    to report which parts of the example do not matter, which graders do not print (they write
    their own hint). Under the autograder every run is a round trip to the sandbox, so that phase
    multiplied the time of a failed check by ten or more, past the time limit per check.

    With a fixed seed, the examples of a run in which every example passes depend only on the
    seed, the strategy, ``first`` and ``max_examples``; they are kept (by the seed, the repr of the
    strategy and of ``first``, ``max_examples`` and the test's code, so build a strategy from
    constants, never from values of the submission) and, for the next submission,
    replayed by a plain loop (Hypothesis's own bookkeeping cost more than a cheap test). Only when
    a replayed example fails does Hypothesis run, to shrink it: it draws the same examples in the
    same order, so the grade is the one a fresh run gives. An example that failed in the replay
    and passes in that run is code that answers differently when called again: it fails.
    """
    from hypothesis.internal.entropy import deterministic_PRNG  # what Hypothesis wraps each example in

    key = (seed(name), repr(strategy), repr(first), max_examples, getattr(test, "__code__", test))
    with _PASSED_LOCK:
        replay = _PASSED.get(key)
    if replay is not None:
        try:
            for case in replay:
                with deterministic_PRNG():
                    test(copy.deepcopy(case))
            return
        except Exception:  # noqa: BLE001 (a failed check, or the student's code raising): shrink it
            pass
    seen: list = []  # the examples that passed (one that an `assume` rejected is not replayed)

    def recorded(case):
        kept = copy.deepcopy(case)
        test(case)
        seen.append(kept)

    _hypothesis_run(name, strategy, recorded, max_examples, first)
    if replay is not None:  # the replay failed, and the very same examples all passed now
        raise _Failed(
            "your code gave different answers when called again with the same input: "
            "does it depend on global state or unseeded randomness?"
        )
    with _PASSED_LOCK:
        _PASSED[key] = seen


def _hypothesis_run(name: str, strategy, test, max_examples: int, first: object) -> None:
    from hypothesis import HealthCheck, Phase, Verbosity, example, given, settings
    from hypothesis import seed as hypothesis_seed

    @settings(
        max_examples=max_examples,
        database=None,
        deadline=None,
        derandomize=False,
        print_blob=False,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
    )
    @hypothesis_seed(seed(name))
    @given(strategy)
    def run(case):
        test(case)

    if first is not None:
        run = example(first)(run)
    try:
        run()
    except BaseExceptionGroup as group:  # Hypothesis's FlakyFailure: the failure did not happen again
        if not group.exceptions or not isinstance(group.exceptions[0], _Failed):
            raise _Failed(
                "your code gave different answers when called again with the same input: "
                "does it depend on global state or unseeded randomness?"
            ) from None
        raise group.exceptions[0] from None


def _biases(keys: list[str]) -> bool:
    return bool(keys) and all(key.rsplit(".", 1)[-1] == "bias" for key in keys)


def names_hint(what: str, got: set[str], expected: set[str], bias: bool | None = None) -> str:
    """The hint for a module whose parameter names are not the instructed ones (up to six of each kind).

    ``bias``: the module's bias argument, where it takes one (``"bias=False"`` in ``what``, the call
    that built it, says False too). When the only difference is biases, the cause is that argument,
    not the names, and the hint names that clause: with ``bias=False`` every bias is one too many;
    with ``bias=True`` (or no such argument) every missing bias is one the module was built without.
    """
    missing, extra = sorted(expected - got), sorted(got - expected)
    bias = False if "bias=False" in what else bias
    if not missing and _biases(extra) and bias is False:
        return (
            f"{what} has biases {extra[:6]}: with bias=False no layer has a bias; pass bias on to every "
            "layer that takes one"
        )
    if not extra and _biases(missing) and bias is True:
        return (
            f"{what} has no {missing[:6]}: with bias=True (the default) every layer that takes a bias has "
            "one; pass bias on to every such layer"
        )
    if not extra and _biases(missing) and bias is None:
        return f"{what} has no {missing[:6]}: keep the bias of every nn.Linear and nn.LayerNorm"
    if not missing and _biases(extra) and bias is None:
        return f"{what} should have no {extra[:6]}: the instructions give it no bias there"
    parts = ([f"missing {missing[:6]}"] if missing else []) + ([f"unexpected {extra[:6]}"] if extra else [])
    return f"{what}'s parameters must be named as in the instructions ({'; '.join(parts)})"


def load_weights(
    g: Grader, module, weights: dict[str, torch.Tensor], what: str, bias: bool | None = None
) -> None:
    """Load ``weights`` into the student's ``module``, after checking its parameter names fit
    (``bias``: the module's bias argument, where it takes one; see :func:`names_hint`)."""
    sd = module.state_dict()
    got = set(sd) if isinstance(sd, dict) else set()
    g.expect(got == set(weights), names_hint(what, got, set(weights), bias))
    module.load_state_dict(weights)


_NOT_IMPLEMENTED = "not implemented yet (the cell still raises NotImplementedError)"


def _hint_for(e: Exception) -> str:
    if getattr(e, "type_name", None) == "NotImplementedError":  # raised in the sandbox
        return _NOT_IMPLEMENTED
    return raised(e)


#: the hint for torch's "view size is not compatible with input tensor's size and stride", whose
#: cause students rarely guess
VIEW_HINT = (
    "view() failed because its input is not contiguous (the result of a transpose): "
    "use .reshape(...) or .contiguous().view(...) after transposing"
)


def raised(e: BaseException) -> str:
    """The hint for an exception of the student's code: ``your code raised KeyError: 'x' (at line 3
    of your code: ...)``. A message the sandbox already phrased (raised, timed out or crashed in
    the student's process: it starts with "your code") is returned as it is; ``view()`` on a
    transposed tensor gets :data:`VIEW_HINT`, which names the cause."""
    text = str(e)
    if "view size is not compatible" in text:
        return VIEW_HINT
    if text.startswith("your code ") or type(e).__module__ == "coursekit.sandbox.host":
        return text
    return f"your code raised {type(e).__name__.removeprefix('Student')}: {text}{_student_frame(e)}"


def call_student(g: Grader, where: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with a copy of every tensor argument, so the grader's inputs stay
    intact (a change in place is the business of the clause that checks for it, which calls the
    student itself). A tensor that requires a gradient is passed as it is: the clause reads its
    ``.grad`` after the call, and autograd already refuses to change it in place. An exception of
    the student's code fails the check with the hint ``"<where>: your code raised ..."``
    (:func:`raised`); ``where`` names the input, so that a shrunk example names the smallest one.
    "Not implemented yet" is reported as such."""

    def copy(a):
        return a.clone() if type(a) is torch.Tensor and not a.requires_grad else a

    try:
        return fn(*map(copy, args), **{key: copy(value) for key, value in kwargs.items()})
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        raise_unless_student_error(e)
        g.fail(f"{where}: {raised(e)}")


def _student_frame(e: BaseException) -> str:
    """' (line N of your cell)' for the innermost frame outside coursekit and torch."""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        f = frame.filename
        if "coursekit" not in f and "site-packages" not in f and "/torch/" not in f:
            return f" (at line {frame.lineno} of your code: {frame.line})"
    return ""
