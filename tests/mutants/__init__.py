"""Catalogues of wrong implementations ("mutants"), one module per exercise.

Each mutant replaces one definition of the reference solution. The graders must
fail the mutant's part and show the intended hint; ``tests/test_grading_*.py``
checks this in-process and ``tests/test_autograde.py`` through nbgrader.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str  # short id, used as the fake student's id
    target: str  # the top-level def/class it replaces
    part: str  # the graded part that must lose its points
    hint: str  # a substring of the hint the student must see
    source: str  # the wrong definition


def edit(source: str, *edits: tuple[str, str]) -> str:
    """``source`` with each ``(old, new)`` edit applied; each ``old`` must occur exactly once,
    so a mutant stops building (rather than silently equalling the reference) when the
    reference changes under it."""
    for old, new in edits:
        if source.count(old) != 1:
            raise ValueError(f"mutant edit does not match exactly once ({source.count(old)} times): {old!r}")
        source = source.replace(old, new)
    return source


def mutate(obj, *edits: tuple[str, str]) -> str:
    """The source of the reference definition ``obj`` with each ``(old, new)`` edit applied once."""
    return edit(textwrap.dedent(inspect.getsource(obj)), *edits)


def mutant(name: str, obj, hint: str, *edits: tuple[str, str]) -> Mutant:
    """A mutant that replaces ``obj`` (graded in the part of the same name) by its edited source."""
    return Mutant(name, obj.__name__, obj.__name__, hint, mutate(obj, *edits))


def failures(assignment: str, name: str, hidden: bool | None = None) -> str:
    """What a student who wrote the catalogued mutant ``name`` of ``assignment`` reads: the failure
    messages of its part's test cells (``hidden``: only the hidden ones, or only the public ones),
    joined, run in this process as ``tests/test_graders.py`` runs them."""
    import importlib

    from coursekit.grading import harness

    mutant = next(m for m in importlib.import_module(f"tests.mutants.{assignment}").MUTANTS if m.name == name)
    ns = harness.namespace(assignment)
    exec(compile(mutant.source, f"<mutant {mutant.name}>", "exec"), ns)  # as a student replaces it
    part = next(p for p in harness.parts(assignment) if p.name == mutant.part)
    return "\n".join(o.failure or "" for o in harness.run_tests(part, ns, hidden=hidden))
