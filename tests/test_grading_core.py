"""The grading toolkit itself (``coursekit.grading.core``): the helpers every grader shares."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from coursekit.grading.core import (
    Grader,
    GradingFailure,
    close,
    expect_value_error,
    first_difference,
    first_match,
    generator,
    load_weights,
    names_hint,
    rand,
    random_weights,
    same,
    student_side,
)


def hints(run) -> list[tuple[str, str]]:
    """Run ``run(g)`` inside one check and return the failures the grader recorded."""
    g = Grader("part")
    with g.check("the check"):
        run(g)
    return g.failures


def test_inputs_are_seeded_by_name():
    assert torch.equal(rand("a", 3, 4), rand("a", 3, 4))
    assert not torch.equal(rand("a", 3, 4), rand("b", 3, 4))
    assert rand("a", 2, dtype=torch.float32).dtype == torch.float32
    assert torch.equal(rand("a", 5, scale=3.0), 3.0 * rand("a", 5))
    assert torch.equal(torch.randn(4, generator=generator("x")), torch.randn(4, generator=generator("x")))


def test_random_weights_keep_the_names_and_centre_norm_scales_on_one():
    module = nn.Sequential()
    module.add_module("linear", nn.Linear(64, 64))
    module.add_module("norm1", nn.LayerNorm(4096))
    w = random_weights(module, "w")
    assert set(w) == set(module.state_dict())
    assert all(v.dtype == torch.float64 for v in w.values())
    assert abs(w["norm1.weight"].mean().item() - 1.0) < 0.05  # scales around 1
    assert abs(w["norm1.bias"].mean().item()) < 0.05  # shifts around 0
    assert abs(w["linear.weight"].mean().item()) < 0.05
    assert 0.45 < w["linear.weight"].std().item() < 0.55
    assert torch.equal(w["linear.weight"], random_weights(module, "w")["linear.weight"])


def test_same_is_exact_for_integers_and_tolerant_for_floats():
    ids = torch.tensor([1, 2, 3])
    assert same(ids.clone(), ids)
    assert not same(torch.tensor([1, 2, 4]), ids)
    assert not same(ids.to(torch.int32), ids)  # another dtype is another answer
    assert not same([1, 2, 3], ids)
    x = rand("x", 4)
    assert same(x + 1e-12, x) and not same(x + 1e-3, x)
    assert not same(x.float(), x)
    assert close(x, x) and not close(torch.full((4,), float("nan"), dtype=torch.float64), x)


def test_first_match_names_the_mistake_the_output_equals():
    right, wrong_a, wrong_b = torch.zeros(3), torch.ones(3), torch.full((3,), 2.0)
    candidates = [(wrong_a, "mistake A"), (wrong_b, "mistake B")]
    assert hints(lambda g: first_match(g, wrong_b.clone(), candidates)) == [("the check", "mistake B")]
    assert hints(lambda g: first_match(g, right.clone(), candidates)) == []
    assert hints(lambda g: first_match(g, "not a tensor", candidates)) == []


def test_first_match_never_blames_a_right_answer():
    right = torch.zeros(3)
    # on this input the modelled mistake happens to give the right answer: no hint for it
    candidates = [
        (right.clone(), "a mistake that is harmless here"),
        (None, "not computable here"),
        (torch.zeros(4), "another shape"),
    ]
    assert hints(lambda g: first_match(g, right.clone(), candidates, right)) == []
    assert hints(lambda g: first_match(g, right.clone(), candidates)) == [
        ("the check", "a mistake that is harmless here")
    ]


def test_expect_value_error_accepts_only_a_value_error():
    def raises(exc):
        def call():
            raise exc

        return call

    assert hints(lambda g: expect_value_error(g, raises(ValueError("bad shape")), "a bad shape")) == []
    [(_, hint)] = hints(
        lambda g: expect_value_error(g, raises(IndexError("out of range")), "T=0", "say T must be >= 1")
    )
    assert (
        hint
        == "with T=0 your code raised IndexError (out of range); raise a ValueError instead (say T must be >= 1)"
    )
    [(_, hint)] = hints(lambda g: expect_value_error(g, lambda: torch.zeros(2), "T=0"))
    assert hint.startswith("with T=0 your code returned tensor float32 (2,); raise a ValueError instead")


def test_not_implemented_reaches_the_grader_as_such():
    g = Grader("part")
    with g.check("rejects bad input"):
        expect_value_error(g, lambda: (_ for _ in ()).throw(NotImplementedError()), "T=0")
    assert g.failures == [
        ("rejects bad input", "not implemented yet (the cell still raises NotImplementedError)")
    ]
    with pytest.raises(GradingFailure, match="1 of 1 checks failed"):
        g.finish()


def test_load_weights_explains_misnamed_parameters():
    reference = nn.Sequential()
    reference.add_module("proj", nn.Linear(2, 2))
    weights = random_weights(reference, "w")
    theirs = nn.Sequential()
    theirs.add_module("linear", nn.Linear(2, 2))
    [(_, hint)] = hints(lambda g: load_weights(g, theirs, weights, "MyLayer"))
    assert (
        hint == "MyLayer's parameters must be named as in the instructions "
        "(missing ['proj.bias', 'proj.weight']; unexpected ['linear.bias', 'linear.weight'])"
    )
    mine = nn.Sequential()
    mine.add_module("proj", nn.Linear(2, 2))
    mine.double()
    assert hints(lambda g: load_weights(g, mine, weights, "MyLayer")) == []
    assert torch.equal(mine.proj.weight, weights["proj.weight"])
    assert (
        names_hint("X", {"a"}, {"a", "b"})
        == "X's parameters must be named as in the instructions (missing ['b'])"
    )


def test_student_side_is_local_outside_the_autograder():
    assert student_side("torch", torch) is torch


def test_a_course_secret_changes_every_input_and_keeps_runs_identical():
    """Hidden inputs cannot be computed from the (public) grading source once a secret is mixed in."""
    from coursekit.grading import core
    from coursekit.grading.core import SECRET, seed

    plain = core.rand("softmax.values", 4, 7)
    token = SECRET.set(b"a" * 64)
    try:
        secret = core.rand("softmax.values", 4, 7)
        assert torch.equal(secret, core.rand("softmax.values", 4, 7))  # a re-run sees the same inputs
        assert not torch.allclose(secret, plain)
        assert 0 <= seed("x") < 2**63 and seed("x") != seed("y")
    finally:
        SECRET.reset(token)
    other = SECRET.set(b"b" * 64)
    try:
        assert not torch.allclose(core.rand("softmax.values", 4, 7), secret)  # another course, other inputs
    finally:
        SECRET.reset(other)
    assert torch.equal(core.rand("softmax.values", 4, 7), plain)  # outside the autograder: as before


def test_a_second_process_starting_while_the_first_writes_the_secret_reads_the_same_one(
    tmp_path, monkeypatch
):
    """Two test workers (or two terminals) create the course secret at once: the second never reads
    a half-written file, and both grade with the secret that won."""
    import secrets
    import subprocess
    import sys

    from coursekit.autograde import plan

    other = []
    draw = secrets.token_hex

    def slow_draw(n):
        # The other process starts while this one is between creating its secret and writing it.
        code = "import sys; from pathlib import Path; from coursekit.autograde.plan import course_secret; "
        code += "sys.stdout.write(course_secret(Path(sys.argv[1])).decode())"
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
        other.append(done)
        return draw(n)

    monkeypatch.setattr(plan.secrets, "token_hex", slow_draw)
    mine = plan.course_secret(tmp_path).decode()
    assert other[0].returncode == 0, other[0].stderr
    assert other[0].stdout == mine
    assert len(mine) == 64
    assert (tmp_path / ".coursekit" / "secret").stat().st_mode & 0o077 == 0  # its owner's only
    assert [p.name for p in (tmp_path / ".coursekit").iterdir()] == ["secret"]  # no drafts left


def test_for_all_shrinks_to_the_smallest_failing_example_and_repeats_itself():
    from hypothesis import strategies as st

    from coursekit.grading.core import for_all

    def grade():
        seen = []

        def run(g):
            def test(n):
                seen.append(n)
                g.expect(n < 37, f"fails from n = {n}")

            for_all("core.shrink", st.integers(0, 1000), test, max_examples=50)

        return hints(run), seen

    failures, seen = grade()
    assert failures == [
        ("the check", "fails from n = 37")
    ]  # the smallest failing input, whatever was drawn first
    assert grade()[1] == seen  # derandomized: the same examples in the same order


def test_for_all_tries_the_first_example_before_drawing():
    from hypothesis import strategies as st

    from coursekit.grading.core import for_all

    calls = []

    def stub(n):
        calls.append(n)
        raise NotImplementedError()

    failures = hints(lambda g: for_all("core.first", st.integers(0, 9), stub, first=3))
    assert failures == [("the check", "not implemented yet (the cell still raises NotImplementedError)")]
    assert calls == [3]  # no shrinking of a part that is not there


def test_for_all_names_an_answer_that_changes_from_call_to_call():
    from hypothesis import strategies as st

    from coursekit.grading.core import for_all

    state = {"n": 0}

    def moody(g, x):
        state["n"] += 1
        g.expect(state["n"] % 2 == 1, "wrong")

    (failure,) = hints(lambda g: for_all("core.flaky", st.integers(0, 9), lambda x: moody(g, x)))
    assert "different answers" in failure[1] or failure[1] == "wrong"


def test_for_all_replays_a_passing_run_and_shrinks_a_failure_as_a_fresh_run_does(monkeypatch):
    from hypothesis import strategies as st

    from coursekit.grading import core

    monkeypatch.setattr(core, "_PASSED", {})
    strategy = st.tuples(st.integers(0, 50), st.sampled_from("abc"))

    def run(limit):
        seen = []

        def grade(g):
            def test(case):
                seen.append(case)
                g.expect(case[0] < limit, f"fails from {case[0]}")

            core.for_all("core.replay", strategy, test, max_examples=25, first=(0, "a"))

        return hints(grade), seen

    fresh = run(51)
    assert fresh[0] == [] and len(core._PASSED) == 1  # every example passed: kept
    assert run(51) == fresh  # replayed: the same examples, in the same order
    failures, seen = run(10)  # fails in the replay: Hypothesis runs and shrinks it
    assert failures == [("the check", "fails from 10")]  # the smallest failing example
    monkeypatch.setattr(core, "_PASSED", {})
    assert run(10)[0] == failures  # what a fresh run says


def test_for_all_replay_names_code_that_fails_only_the_first_time(monkeypatch):
    from hypothesis import strategies as st

    from coursekit.grading import core

    monkeypatch.setattr(core, "_PASSED", {})
    calls = {"n": 0}

    def grade(g, fail_at):
        def test(x):
            calls["n"] += 1
            g.expect(calls["n"] != fail_at, "wrong")

        core.for_all("core.once", st.integers(0, 9), test, max_examples=5)

    assert hints(lambda g: grade(g, -1)) == []
    calls["n"] = 0
    (failure,) = hints(lambda g: grade(g, 1))  # the replay's first call fails, the fresh run's do not
    assert "different answers" in failure[1]


@pytest.mark.slow  # not in the quick loop: runs every grader of the course twice
def test_every_graders_examples_are_fixed_by_what_keys_them(monkeypatch):
    """The replay's contract: one key, one list of examples. Every hidden test of every assignment
    runs with the replay off, for the reference and for a mutant of each part, and every key must
    have drawn the same examples each time (a strategy built from a value of the submission would
    not)."""
    import importlib

    from coursekit.chapters import CHAPTERS
    from coursekit.grading import core, harness

    drawn: dict = {}

    class Fresh(dict):
        def get(self, key, default=None):
            return None  # always a fresh Hypothesis run

        def __setitem__(self, key, examples):
            drawn.setdefault(key, []).append(examples)

    monkeypatch.setattr(core, "_PASSED", Fresh())
    for chapter in CHAPTERS:
        mutants = importlib.import_module(f"tests.mutants.{chapter.assignment}").MUTANTS
        for part in harness.parts(chapter.assignment):
            harness.run_tests(part, harness.namespace(chapter.assignment), hidden=True)
            mutant = next(m for m in mutants if m.part == part.name)
            ns = harness.namespace(chapter.assignment)
            exec(compile(mutant.source, f"<mutant {mutant.name}>", "exec"), ns)
            harness.run_tests(part, ns, hidden=True)
    assert len(drawn) > 100
    differ = [key[1][:80] for key, lists in drawn.items() if any(x != lists[0] for x in lists)]
    assert not differ, differ


def test_tolerances_scale_with_the_magnitude_of_the_inputs():
    from coursekit.grading.core import close, magnitude, tolerance

    x = torch.tensor([20000.0, 20000.5, 19999.0])
    exact = torch.softmax(x.double(), -1)
    shifted = torch.softmax(x, -1)  # max-shifted in float32
    lse = torch.exp(x - torch.logsumexp(x, -1))  # log-sum-exp: errs by about eps * 1000
    assert close(shifted, exact.float()) and not close(lse, exact.float())
    assert close(lse, exact.float(), magnitude=magnitude(x))
    assert tolerance(torch.float64, 0.01) == tolerance(torch.float64)  # never tighter than at magnitude 1
    assert not close(exact.float().double(), exact)  # a float32 step in a float64 computation is caught


def test_a_names_hint_names_the_bias_argument_when_only_biases_differ():
    """One cause per message: biases alone are the bias argument's clause, not the names'."""
    from coursekit.grading.core import names_hint

    w = {"lin.weight", "norm.weight"}
    b = w | {"lin.bias", "norm.bias"}
    extra = names_hint("Layer(8, bias=False)", b, w)  # bias=False not passed on
    assert "with bias=False no layer has a bias" in extra and "named as in the instructions" not in extra
    missing = names_hint("Layer(8)", w, b, bias=True)  # bias=True (the default) not passed on
    assert "with bias=True (the default)" in missing and "named as in the instructions" not in missing
    assert "keep the bias" in names_hint("Block", w, b)  # no bias argument: the biases themselves
    assert "should have no ['lin.bias', 'norm.bias']" in names_hint("Norm", b, w)
    renamed = names_hint("Layer(8, bias=False)", {"linear.weight", "norm.weight", "linear.bias"}, w)
    assert "named as in the instructions" in renamed and "bias=False no layer" not in renamed


def test_describe_shows_the_number_a_student_gave():
    from coursekit.grading.core import describe

    assert describe(0.375) == "float 0.375" and describe(3) == "int 3" and describe(None) == "None"
    assert describe(torch.zeros(2, 3)) == "tensor float32 (2, 3)" and describe([1]) == "list"


def test_a_value_difference_names_one_cause():
    """dtype alone says dtype; a tiny difference says float32 or an epsilon, never both; a difference
    as large as values near 0 is no rounding; advice on the values follows only a plain difference."""
    e = torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64)
    assert first_difference(e.float(), e, " (fix)") == "expected dtype float64, got float32"
    through_float32 = (e + 1e-7).float().double()
    said = first_difference(through_float32, e, " (fix)")
    assert "is part of the computation in float32?" in said and "epsilon" not in said and "(fix)" not in said
    plus_eps = e / (1 + 1e-5)
    said = first_difference(plus_eps, e)
    assert "an epsilon, added?" in said and "float32?" not in said
    tiny = torch.tensor([-1.5e-6], dtype=torch.float64)
    said = first_difference(torch.zeros(1, dtype=torch.float64), tiny, " (fix)")
    assert "float32" not in said and "epsilon" not in said and said.endswith("(fix)")


def test_hidden_inputs_do_not_depend_on_which_modules_are_loaded(tmp_path, monkeypatch):
    """Hypothesis draws constants from the source of loaded local modules now and then; the graders'
    draws must not change when the process has imported one more module (the autograder, the
    notebook and the tests import different ones)."""
    import importlib
    import sys

    from hypothesis import strategies as st

    from coursekit.grading.core import _hypothesis_run

    def draws() -> list:
        seen: list = []
        _hypothesis_run(
            "core.constants", st.lists(st.integers(0, 2**40), min_size=50, max_size=50), seen.append, 20, None
        )
        return seen

    before = draws()
    (tmp_path / "course_extra_constants.py").write_text(
        "".join(f"C{i} = {987_654_321 + 7919 * i}\n" for i in range(200))
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("course_extra_constants")
    try:
        assert draws() == before
    finally:
        sys.modules.pop("course_extra_constants", None)
