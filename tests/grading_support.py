"""What the per-chapter grader tests (``tests/test_grading_<assignment>.py``) share: a correct answer
graded as the notebook grades it, the public checks of an assignment read from its grader module,
and the globals of a student's notebook built by hand from the reference."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import ModuleType

from coursekit.grading import harness


def part_named(assignment: str, part_name: str) -> harness.Part:
    """The part of ``assignment`` whose graded object is ``part_name`` (its answer cell's grade id
    too, in every assignment of the course)."""
    return next(p for p in harness.parts(assignment) if p.name == part_name)


def full_marks(assignment: str, part_name: str, source: str) -> list[harness.Outcome]:
    """``source`` replaces the part's answer in the instructor's notebook and passes every test cell
    of the part, public and hidden. Returns the outcomes, one per test cell."""
    part = part_named(assignment, part_name)
    outcomes = harness.run_tests(part, harness.namespace(assignment, {part.grade_id: source}))
    failed = [(o.test.grade_id, o.failure) for o in outcomes if o.failure is not None]
    assert not failed, failed
    return outcomes


def public_checks(module: ModuleType, only: Iterable[str] | None = None) -> dict[str, Callable]:
    """``{part name: check function}`` of a grader module: every ``check_<name>`` it declares, by the
    part its ``Spec`` (``.spec.part``) or its prediction (``.prediction.name``) grades; with ``only``,
    just those parts, in that order."""
    checks: dict[str, Callable] = {}
    for attr, fn in vars(module).items():
        if not attr.startswith("check_") or not callable(fn):
            continue
        spec, prediction = getattr(fn, "spec", None), getattr(fn, "prediction", None)
        part = spec.part if spec is not None else prediction.name if prediction is not None else None
        if part is None:
            continue
        if part in checks and checks[part] is not fn:
            raise ValueError(f"{module.__name__}: two public checks of the part {part!r}")
        checks[part] = fn
    if only is None:
        return checks
    only = list(only)
    missing = [p for p in only if p not in checks]
    if missing:
        raise KeyError(f"{module.__name__} has no public check of {missing}")
    return {p: checks[p] for p in only}


def namespace(
    imports: Mapping[str, object], reference: ModuleType, names: Iterable[str], **overrides
) -> dict:
    """What a student's notebook holds: ``imports`` (the imports cell) plus the reference definitions
    ``names`` from ``reference``, then ``overrides``."""
    ns = dict(imports)
    ns.update({name: getattr(reference, name) for name in names})
    ns.update(overrides)
    return ns
