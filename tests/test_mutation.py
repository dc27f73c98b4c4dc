"""The committed mutation reports (``docs/mutation/``) are current, and every part's graders kill
at least 95% of the mutants that do not compute the same thing as the answer.

Regenerate a report with ``.venv/bin/python scripts/mutation.py <assignment> [--part <name>]``;
an equivalent mutant gets its one-line reason in ``EQUIVALENT`` of ``tests/mutants/<assignment>.py``.
"""

from __future__ import annotations

import importlib
import json

import pytest

from coursekit.chapters import CHAPTERS
from coursekit.grading import harness, mutation
from tests.submissions import ROOT

THRESHOLD = 0.95
PARTS = [(c.assignment, p) for c in CHAPTERS for p in harness.parts(c.assignment)]


def equivalent(assignment: str) -> dict[str, str]:
    return dict(getattr(importlib.import_module(f"tests.mutants.{assignment}"), "EQUIVALENT", {}))


@pytest.mark.parametrize("assignment, part", PARTS, ids=lambda x: getattr(x, "name", x))
def test_the_report_is_current_and_the_graders_kill_enough_mutants(assignment, part):
    rerun = f"run: .venv/bin/python scripts/mutation.py {assignment} --part {part.name}"
    path = ROOT / "docs" / "mutation" / f"{assignment}.json"
    assert path.is_file(), f"no mutation report for {assignment}: {rerun}"
    entry = json.loads(path.read_text())["parts"].get(part.grade_id)
    assert entry is not None, f"the report of {assignment} has no {part.name}: {rerun}"
    equal = equivalent(assignment)
    assert entry["fingerprint"] == mutation.fingerprint(assignment, part, equal), (
        f"the report is stale: {rerun}"
    )
    ids = [m.id for m in mutation.mutants(part)]
    assert list(entry["results"]) == ids, f"the report covers other mutants than the answer now has: {rerun}"
    ours = [i for i in equal if i.startswith(f"{part.grade_id} | ")]
    unknown = [i for i in ours if i not in entry["results"]]
    assert not unknown, f"EQUIVALENT names mutants that no longer exist: {unknown}"
    killed = [i for i in ours if entry["results"][i][0] != "survived"]
    assert not killed, f"EQUIVALENT names mutants the graders kill (so they are not equivalent): {killed}"
    assert entry["kill_rate"] >= THRESHOLD, (
        f"{part.name}: the graders kill {entry['kill_rate']:.1%} of the non-equivalent mutants (at least "
        f"{THRESHOLD:.0%} needed); survivors:\n"
        + "\n".join(f"  line {s['line']}: {s['change']}  ({s['id']})" for s in entry["survivors"])
    )


def test_mutants_have_stable_distinct_ids_and_change_the_program():
    code = [(a, p) for a, p in PARTS if not p.name.startswith("predict_")]  # a prediction is one line
    for _assignment, part in code[:8]:
        made = mutation.mutants(part)
        assert len({m.id for m in made}) == len(made) == len({m.source for m in made}) > 10
        assert [m.id for m in mutation.mutants(part)] == [m.id for m in made]
        assert all(m.source != part.source for m in made)


@pytest.mark.slow  # not in the quick loop: generates the mutants of every part of the course
def test_the_operators_cover_the_standard_set():
    made = [m for _, p in PARTS for m in mutation.mutants(p)]
    operators = {m.operator for m in made}
    assert {
        "binop",
        "compare",
        "boolop",
        "number",
        "slice",
        "keyword",
        "argument",
        "delete",
        "condition",
        "attribute",
        "default",
        "unary",
        "bool",
    } <= operators, operators
