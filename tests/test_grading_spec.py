"""The spec form of a graded part (``coursekit.grading.spec``) and its generic kinds of clause: each
kind passes a right answer and fails the wrong answer it exists for, with its hint; a Spec's public
and hidden graders run the same clauses; budgets come from one table; a prediction's band separates
its named mistakes."""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import strategies as st

from coursekit.chapters import CHAPTERS
from coursekit.grading import GradingFailure, core, harness, questions
from coursekit.grading.core import REPORT, Grader, call_student, close, first_difference, tensor
from coursekit.grading.spec import (
    BUDGETS,
    Call,
    Clause,
    Spec,
    budget,
    dtype_kept,
    excludes,
    matches,
    new_tensor,
    order_free,
    procedure,
    raises,
    returns,
    scaled_budgets,
    ties,
    unchanged,
)

SHAPES = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
SEEDS = st.integers(0, 1000)


def _relu_call(case) -> Call:
    shape, seed = case
    return Call(f"relu(x {shape})", (tensor(seed, *shape),))


def _relu_values(g: Grader, relu, case) -> None:
    c = _relu_call(case)
    out = call_student(g, c.where, relu, *c.args)
    expected = c.args[0].clamp(min=0)
    g.expect(close(out, expected), f"{c.where}: {first_difference(out, expected)}")


RELU = Spec(
    "relu",
    [
        Clause(
            "equals max(x, 0)",
            _relu_values,
            st.tuples(SHAPES, SEEDS),
            key="spec.relu.values",
            examples=[((2, 3), 0)],
        ),
        unchanged(_relu_call, st.tuples(SHAPES, SEEDS), key="spec.relu.inplace", examples=[((3,), 0)]),
        raises(
            lambda case: Call(f"relu({case!r})", (case,)),
            text="raises ValueError for a non-tensor",
            fix="say that x must be a tensor",
            examples=["x", 3],
        ),
    ],
)
check_relu, grade_relu = RELU.graders()


def right_relu(x):
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a tensor, got {type(x).__name__}")
    return x.clamp(min=0)


def inplace_relu(x):
    if not isinstance(x, torch.Tensor):
        raise ValueError("x must be a tensor")
    return x.clamp_(min=0)


def lines_of(grader, answer) -> tuple[list[str], str | None]:
    lines: list[str] = []
    token = REPORT.set(lines)
    try:
        grader(answer)
        failure = None
    except GradingFailure as e:
        failure = str(e)
    finally:
        REPORT.reset(token)
    return lines, failure


def test_a_spec_grades_a_right_answer_in_public_and_hidden_with_the_same_clauses():
    public, failure = lines_of(check_relu, right_relu)
    assert failure is None, failure
    hidden, failure = lines_of(grade_relu, right_relu)
    assert failure is None, failure
    strip = lambda lines, part: [x.split(f"{part}: ", 1)[1] for x in lines if x.startswith("[pass]")]  # noqa: E731
    assert strip(public, "relu (public)") == strip(hidden, "relu") == [c.text for c in RELU.clauses]
    assert check_relu.__name__ == "check_relu" and grade_relu.__name__ == "grade_relu"
    assert grade_relu.spec is RELU


def test_a_spec_fails_a_wrong_answer_with_the_clauses_hint_in_both_graders():
    for grader in (check_relu, grade_relu):
        _, failure = lines_of(grader, inplace_relu)
        assert failure is not None and "modified its input in place" in failure, failure
        assert "1 of 3 checks failed" in failure


def test_a_part_stops_at_the_check_whose_hint_a_test_waits_for_and_only_then():
    """``STOP_WHEN`` (the graders' tests only): the part ends at the first failed check whose hint it
    accepts, reporting the checks so far; a hint it does not accept, or no predicate, runs them all."""
    ran = []

    def check(name: str, hint: str | None):
        def test(g, student, case):
            ran.append(name)
            if hint:
                g.fail(hint)

        return Clause(name, test, examples=[0])

    spec = Spec(
        "stops", [check("a", None), check("b", "wrong sign"), check("c", "wrong shape"), check("d", None)]
    )
    for wanted, expected in (("shape", "abc"), ("sign", "ab"), ("size", "abcd"), (None, "abcd")):
        ran.clear()
        token = core.STOP_WHEN.set(None if wanted is None else lambda hint, w=wanted: w in hint)
        try:
            _, failure = lines_of(spec.graders()[1], None)
        finally:
            core.STOP_WHEN.reset(token)
        assert "".join(ran) == expected and "wrong sign" in failure
        assert f"{expected.count('b') + expected.count('c')} of {len(expected)} checks failed" in failure


def test_the_hidden_grader_tries_the_first_example_then_draws_then_also():
    seen = []

    def record(g, student, case):
        seen.append(case)

    clause = Clause("records", record, st.integers(100, 200), key="spec.order", examples=[7], also=[-1])
    Spec("order", [clause]).grade(None)
    assert seen[0] == 7 and seen[-1] == -1
    assert all(100 <= c <= 200 for c in seen[1:-1]) and 1 < len(seen) - 2 <= budget("normal")
    seen.clear()
    Spec("order", [clause]).check(None)
    assert seen == [7]


def test_a_clause_or_spec_that_cannot_be_graded_is_refused_when_written():
    with pytest.raises(ValueError, match="need a key"):
        Clause("drawn", _relu_values, st.integers())
    with pytest.raises(ValueError, match="no inputs"):
        Clause("nothing", _relu_values)
    with pytest.raises(ValueError, match="unknown budget"):
        Clause("odd", _relu_values, examples=[1], budget="lots")
    with pytest.raises(ValueError, match="weight"):
        Clause("odd", _relu_values, examples=[1], weight=-1)
    with pytest.raises(ValueError, match="share the text"):
        Spec("p", [Clause("a", _relu_values, examples=[1]), Clause("a", _relu_values, examples=[2])])
    with pytest.raises(ValueError, match="same key"):
        Spec(
            "p",
            [
                Clause("a", _relu_values, st.integers(), key="k", examples=[1]),
                Clause("b", _relu_values, st.integers(), key="k", examples=[1]),
            ],
        )


def test_budgets_come_from_one_table_and_scale_together():
    assert budget("normal") == BUDGETS["normal"]
    with scaled_budgets(0.5):
        assert budget("normal") == round(BUDGETS["normal"] / 2)
        assert budget("tiny") >= 1
    assert budget("normal") == BUDGETS["normal"]
    with pytest.raises(ValueError):
        with scaled_budgets(0):
            pass


def _one(clause: Clause, answer) -> str | None:
    """The failure of ``answer`` under the hidden grader of a one-clause spec."""
    return lines_of(Spec("part", [clause]).graders()[1], answer)[1]


def _x(case) -> Call:
    p, seed = case
    return Call(f"dropout(x, p={p})", (tensor(seed, 3, 4),), {"p": p})


def test_new_tensor_catches_an_input_returned_at_the_edge():
    clause = new_tensor(_x, st.tuples(st.sampled_from([0.0, 0.5]), SEEDS), key="spec.alias", also=[(0.0, 1)])
    assert _one(clause, lambda x, p: x * (1 - p) + 0.0) is None
    failure = _one(clause, lambda x, p: x if p == 0 else x * (1 - p))
    assert failure is not None and "shares memory with an input" in failure
    assert _one(clause, lambda x, p: x[:, :2] * 1 if p else x.view(12)) is not None  # a view counts too


def test_returns_names_the_promised_shape_and_dtype():
    clause = returns(
        _relu_call,
        lambda case: torch.empty(case[0], dtype=torch.float64),
        text="returns x's shape, float64",
        examples=[((2, 3), 0)],
    )
    assert _one(clause, right_relu) is None
    failure = _one(clause, lambda x: x.float())
    assert failure is not None and "should be a tensor float64 (2, 3)" in failure


def test_matches_gives_the_named_mistake_before_the_difference():
    clause = matches(
        _relu_call,
        lambda case: _relu_call(case).args[0].clamp(min=0),
        text="equals max(x, 0)",
        mistakes=lambda case, where: [
            (_relu_call(case).args[0].abs(), f"{where}: that is |x|, not max(x, 0)")
        ],
        examples=[((4,), 3)],
    )
    assert _one(clause, right_relu) is None
    failure = _one(clause, torch.abs)
    assert failure is not None and "that is |x|" in failure


def test_dtype_kept_catches_an_overflow_on_the_way():
    def call(case):
        (scale,) = case
        return Call(f"rms(x float16 * {scale})", (torch.full((4,), scale, dtype=torch.float16),))

    def reference(case):
        x = call(case).args[0].double()
        return (x / x.pow(2).mean().sqrt()).half()

    clause = dtype_kept(
        call, reference, st.tuples(st.sampled_from([300.0, 6e4])), key="spec.dtype", examples=[(6e4,)]
    )
    assert _one(clause, lambda x: (x.float() / x.float().pow(2).mean().sqrt()).half()) is None
    failure = _one(clause, lambda x: x / x.pow(2).mean().sqrt())  # x^2 overflows float16
    assert failure is not None and "overflowed" in failure


def test_ties_follow_the_texts_rule_at_a_threshold():
    probs = torch.tensor([0.5, 0.3, 0.2])
    clause = ties(
        lambda case: Call(f"top_p_keep(probs, p={case})", (probs, case)),
        lambda case: torch.tensor([True, True, False]),
        text="a token whose cumulative probability reaches p exactly is kept",
        rule="keep tokens until the cumulative probability reaches p, that token included",
        examples=[0.8],
    )
    assert _one(clause, lambda probs, p: torch.cat([torch.tensor([True]), probs.cumsum(0)[:-1] < p])) is None
    failure = _one(clause, lambda probs, p: probs.cumsum(0) < p)
    assert failure is not None and "exactly at the threshold" in failure


def test_order_free_catches_an_answer_that_follows_insertion_order():
    def call(case, backwards):
        items = sorted(case.items(), reverse=backwards)
        return Call(f"first_merge({case})", (dict(items),))

    clause = order_free(call, examples=[{"ab": 3, "cd": 3, "ef": 1}])
    assert _one(clause, lambda counts: max(sorted(counts), key=counts.get)) is None
    failure = _one(clause, lambda counts: max(counts, key=counts.get))
    assert failure is not None and "in another order" in failure


def test_excludes_catches_a_draw_of_a_forbidden_id():
    def call(case):
        return Call("random_ids(1000, generator)", (1000, torch.Generator().manual_seed(case)))

    clause = excludes(
        call,
        lambda case, out: sorted(set(out.tolist()) & {0, 1}),
        text="never draws a special id (0 or 1)",
        why="draw from the ordinary ids only",
        examples=[5],
    )
    assert _one(clause, lambda n, g: torch.randint(2, 10, (n,), generator=g)) is None
    failure = _one(clause, lambda n, g: torch.randint(0, 10, (n,), generator=g))
    assert failure is not None and "which a draw must exclude" in failure


def test_procedure_catches_another_procedure_that_lands_in_the_band():
    def reference(case):
        g = torch.Generator().manual_seed(case)
        return float(torch.randn(4000, generator=g, dtype=torch.float64).var())

    clause = procedure(
        lambda case: Call(f"variance(generator seeded {case})", (torch.Generator().manual_seed(case),)),
        reference,
        text="draws 4000 values from its generator and takes their unbiased variance",
        steps="draw torch.randn(4000, generator=generator, dtype=torch.float64), then .var()",
        examples=[3],
        band=lambda case: (0.9, 1.1),
    )
    assert _one(clause, lambda g: float(torch.randn(4000, generator=g, dtype=torch.float64).var())) is None
    failure = _one(
        clause, lambda g: float(torch.randn(4000, generator=g, dtype=torch.float64).var(unbiased=False))
    )
    assert failure is not None and "inside the band, so the procedure differs" in failure


def _fingerprint(x) -> object:
    """What identifies one call's arguments: a generator by its seed, a tensor by its bytes."""
    if isinstance(x, torch.Generator):
        return ("generator", x.initial_seed())
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), str(x.dtype), repr(x.detach().cpu().flatten().tolist()))
    if isinstance(x, dict):
        return ("dict", tuple(sorted((repr(k), _fingerprint(v)) for k, v in x.items())))
    if isinstance(x, (list, tuple, set, frozenset)):
        items = [_fingerprint(v) for v in x]
        return (
            type(x).__name__,
            tuple(sorted(items, key=repr) if isinstance(x, (set, frozenset)) else items),
        )
    return ("value", repr(x))


def test_a_procedure_clause_draws_hidden_inputs():
    clause = procedure(
        lambda case: Call(f"variance(generator seeded {case})", (torch.Generator().manual_seed(case),)),
        lambda case: float(torch.randn(50, generator=torch.Generator().manual_seed(case)).var()),
        text="the variance of 50 draws",
        steps="draw 50 values, then .var()",
        examples=[3, 4],
        inputs=st.integers(100, 10**6),
        key="spec.procedure.drawn",
    )
    assert (clause.budget, clause.also, clause.key) == ("tiny", (4,), "spec.procedure.drawn")
    seeds = []

    def answer(g):
        seeds.append(g.initial_seed())
        return float(torch.randn(50, generator=g).var())

    assert _one(clause, answer) is None
    assert seeds[0] == 3 and seeds[-1] == 4 and 1 <= len(set(seeds) - {3, 4}) <= BUDGETS["tiny"]


#: every experiment checked against its stated procedure: (assignment, part)
EXPERIMENTS = [
    ("ch01_attention", "score_variance"),
    ("ch02_multihead", "kv_pooling_error"),
    ("ch04_layers", "input_gradient_norm"),
    ("ch06_bert", "corrupted_fraction"),
    ("ch08_seq2seq", "heldout_loss"),
    ("ch09_vit", "blank_patch_share"),
    ("ch10_long_context", "window_mass"),
    ("appendix_arithmetic", "flops_ratio"),
]


@pytest.mark.parametrize("assignment, name", EXPERIMENTS)
def test_an_experiment_right_only_on_the_public_examples_fails_its_hidden_procedure_check(assignment, name):
    """A result looked up for the public examples' arguments, and off by 0.1% (inside every band) for
    any other: the public check passes, the hidden one names the stated procedure."""
    part = next(p for p in harness.parts(assignment) if p.name == name)
    ns = harness.namespace(assignment)
    right, public_calls = ns[name], set()

    def recorded(*args, **kwargs):
        public_calls.add(_fingerprint((args, kwargs)))
        return right(*args, **kwargs)

    def looked_up(*args, **kwargs):
        out = right(*args, **kwargs)
        return out if _fingerprint((args, kwargs)) in public_calls else out + 1e-3 * max(abs(out), 1e-3)

    ns[name] = recorded
    assert all(o.failure is None for o in harness.run_tests(part, ns, hidden=False)) and public_calls
    ns[name] = looked_up
    assert all(o.failure is None for o in harness.run_tests(part, ns, hidden=False))
    (hidden,) = harness.run_tests(part, ns, hidden=True)
    assert hidden.failure is not None and "the stated procedure gives" in hidden.failure, hidden.failure


def test_every_prediction_band_separates_its_named_mistakes():
    found = 0
    for chapter in CHAPTERS:
        module = importlib.import_module(f"coursekit.grading.{chapter.assignment}")
        for prediction in questions.predictions(module):
            if prediction.mistakes:
                found += 1
                assert prediction.unseparated() == [], (prediction.name, prediction.unseparated())
    assert found >= 2


def test_a_prediction_names_the_mistake_an_answer_looks_like():
    p = questions.Prediction(
        name="predict_cache_mib",
        question="How many MiB?",
        tests="units",
        measure=lambda: 300.0,
        explanation="it is {truth}",
        rel=0.02,
        mistakes=(("MB instead of MiB", lambda mib: mib * 2**20 / 1e6),),
    )
    _, failure = lines_of(p.graders()[1], 314.6)
    assert failure is not None and "(what MB instead of MiB gives)" in failure
    wide = questions.Prediction(**{**p.__dict__, "rel": 0.05, "_cache": {}})
    assert wide.unseparated() == ["MB instead of MiB"]


def test_unchanged_names_the_argument_and_sees_lists_and_dicts_too():
    clause = unchanged(
        lambda case: Call(f"count({case})", (list(case), {}), names=("ids", "counts")),
        examples=[[3, 1, 2]],
        advice="count into a new list",
    )
    assert _one(clause, lambda ids, counts: {i: ids.count(i) for i in ids}) is None
    failure = _one(clause, lambda ids, counts: ids.sort())
    assert failure is not None and "(ids was [3, 1, 2], afterwards [1, 2, 3])" in failure
    failure = _one(clause, lambda ids, counts: counts.update(a=1))
    assert failure is not None and "(counts was {}" in failure
