"""The Exercise 5 graders, tested like code: the reference passes, every mutant is caught."""

from __future__ import annotations

import pytest

from coursekit import bpe as ref
from coursekit.grading import GradingFailure
from coursekit.grading import ch05_bpe as grader
from tests.mutants.ch05_bpe import HIDDEN_CELL, MUTANTS

#: graded part -> (hidden grader, public check, the reference definition's name)
PARTS = {
    "get_pair_counts": (grader.grade_get_pair_counts, grader.check_get_pair_counts, "get_pair_counts"),
    "merge": (grader.grade_merge, grader.check_merge, "merge"),
    "train_naive": (grader.grade_train, grader.check_train, "train_naive"),
    "encode_chunk": (grader.grade_encode_chunk, grader.check_encode_chunk, "encode_chunk"),
    "decode": (grader.grade_decode, grader.check_decode, "decode"),
}


def namespace():
    """What a student's notebook holds: the given helpers and the reference definitions."""
    ns = {"chunk_counts": ref.chunk_counts}
    ns.update({name: getattr(ref, name) for *_, name in PARTS.values()})
    return ns


def stub(*args, **kwargs):
    raise NotImplementedError()


@pytest.mark.parametrize("part", list(PARTS))
def test_reference_passes_hidden_and_public_checks(part, capsys):
    grade, check, name = PARTS[part]
    grade(getattr(ref, name))
    check(getattr(ref, name))
    assert capsys.readouterr().out.count("checks passed") == 2


@pytest.mark.parametrize("part", list(PARTS))
def test_unimplemented_part_fails_with_a_plain_reason(part):
    grade, check, _ = PARTS[part]
    for fn in (grade, check):
        with pytest.raises(GradingFailure, match="not implemented yet"):
            fn(stub)


def test_catalogue_is_large_and_covers_every_part():
    assert len(MUTANTS) >= 8 and len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert {m.part for m in MUTANTS} == set(PARTS) == set(HIDDEN_CELL)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_loses_points_with_its_hint(mutant):
    ns = namespace()
    exec(compile(mutant.source, f"<mutant {mutant.name}>", "exec"), ns)
    grade, _, _ = PARTS[mutant.part]
    with pytest.raises(GradingFailure) as info:
        grade(ns[mutant.target])
    assert mutant.hint in str(info.value), f"expected hint {mutant.hint!r}, got:\n{info.value}"


def test_a_counter_is_an_acceptable_answer():
    """Students often return collections.Counter; it is a dict and must pass (in-process and in the sandbox)."""
    from collections import Counter

    def get_pair_counts(ids, counts=None, weight=1):
        counts = Counter() if counts is None else counts
        for pair in zip(ids, ids[1:]):
            counts[pair] = counts.get(pair, 0) + weight
        return counts

    grader.grade_get_pair_counts(get_pair_counts)
    grader.check_get_pair_counts(get_pair_counts)
