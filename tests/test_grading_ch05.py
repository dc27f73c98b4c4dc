"""The Exercise 5 graders, tested like code: the reference passes, every mutant is caught."""

from __future__ import annotations


from coursekit import bpe as ref
from coursekit.grading import ch05_bpe as grader

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
