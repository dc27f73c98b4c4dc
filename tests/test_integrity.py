"""Integrity signals (coursekit.integrity): who reaches the reference, who pasted it, who shares
an answer; and no signal for answers written independently."""

from __future__ import annotations

import inspect
import re

from coursekit import attention
from coursekit.integrity import reference_uses, signals
from tests.submissions import ROOT, load, replace_definition

ASSIGNMENT = "ch01_attention"
MODULES = {"coursekit.attention"}
NAMES = {"softmax", "causal_mask", "scaled_dot_product_attention", "SelfAttention"}


def test_calls_the_exercise_rules_out_are_seen_however_written():
    from coursekit.integrity import ruled_out_calls

    rules = ("softmax", "scaled_dot_product_attention")
    source = (
        "y = torch.softmax(x, -1)\nz = x.softmax(dim=0)\nF.scaled_dot_product_attention(q, k, v)\nsoftmax(x)"
    )
    assert ruled_out_calls(source, rules) == {"torch.softmax", "x.softmax", "F.scaled_dot_product_attention"}
    assert ruled_out_calls("w = my_softmax(x)\nx.exp()", rules) == set()


def test_every_way_of_reaching_the_reference_is_seen():
    reached = {
        "from coursekit.attention import softmax": {"softmax"},
        "from coursekit.attention import softmax as s": {"softmax"},
        "import coursekit.attention\ny = coursekit.attention.causal_mask(3)": {"causal_mask"},
        "import coursekit.attention as A\nA.scaled_dot_product_attention": {"scaled_dot_product_attention"},
        "from coursekit import attention\nattention.SelfAttention(4)": {"SelfAttention"},
        "import importlib\nm = importlib.import_module('coursekit.attention')\nm.softmax": {"softmax"},
        "import importlib\nimportlib.import_module('coursekit.attention').softmax(x)": {"softmax"},
        # not the reference: a tensor's method, a helper the release gives, another module
        "y = x.softmax(-1)": set(),
        "from coursekit.attention import check_attention_inputs": set(),
        "from coursekit.multihead import split_heads": set(),
    }
    for source, names in reached.items():
        assert reference_uses(source, MODULES, NAMES) == names, source


SOFTMAX_EINSUM_STYLE = '''def softmax(x, dim=-1):
    """Stable softmax."""
    top = x.amax(dim=dim, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    exps = torch.exp(x - top)
    total = exps.sum(dim=dim, keepdim=True)
    return torch.where(total > 0, exps / total.clamp_min(torch.finfo(x.dtype).tiny), torch.zeros_like(exps))
'''

SOFTMAX_LOGSUMEXP = """def softmax(x, dim=-1):
    lse = torch.logsumexp(x, dim=dim, keepdim=True)
    out = torch.exp(x - lse)
    return torch.nan_to_num(out, nan=0.0)
"""

MASK_LOOPS = """def causal_mask(T, S=None, device=None):
    S = T if S is None else S
    if not 0 <= T <= S:
        raise ValueError(f"need 0 <= T <= S, got T={T}, S={S}")
    mask = torch.zeros(T, S, dtype=torch.bool, device=device)
    for i in range(T):
        for j in range(S):
            mask[i, j] = j <= i + S - T
    return mask
"""

MASK_ARANGE = """def causal_mask(T, S=None, device=None):
    if S is None:
        S = T
    if T < 0 or S < T:
        raise ValueError(f"causal_mask needs 0 <= T <= S (T={T}, S={S})")
    rows = torch.arange(T, device=device)[:, None] + (S - T)
    return torch.arange(S, device=device)[None, :] <= rows
"""

SHARED = """def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    d = q.shape[-1]
    s = 1.0 / math.sqrt(d) if scale is None else scale
    logits = torch.matmul(q, k.transpose(-1, -2)) * s
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    w = softmax(logits, dim=-1)
    return torch.matmul(w, v), w
"""

EINSUM = """def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    factor = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("...td,...sd->...ts", q, k) * factor
    if mask is not None and mask.dtype == torch.bool:
        scores = torch.where(mask, scores, torch.full_like(scores, -math.inf))
    elif mask is not None:
        scores = scores + mask
    weights = softmax(scores, -1)
    return torch.einsum("...ts,...sd->...td", weights, v), weights
"""


def renamed(source: str) -> str:
    """The same answer with other local names and a comment, as a student who shares it would."""
    for a, b in (("logits", "att"), ("w", "probs"), ("s", "sc"), ("d", "dim_k")):
        source = re.sub(rf"\b{a}\b", b, source)
    return source.replace("    check_attention_inputs", "    # validate first\n    check_attention_inputs")


def swapped(source: str) -> str:
    """The same answer with its conditional's branches swapped, a light edit that moves tokens."""
    old = 'logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask'
    assert old in source
    new = 'logits + mask if mask.dtype != torch.bool else logits.masked_fill(~mask, float("-inf"))'
    return source.replace(old, new)


def student(**answers):
    nb = load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    for name, source in answers.items():
        nb = replace_definition(nb, name, source)
    return nb


def test_the_importer_the_paster_and_the_sharers_are_flagged_and_no_one_else():
    release = load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    pasted = "# from the book\n" + inspect.getsource(attention.scaled_dot_product_attention)
    notebooks = {
        "importer": student(
            softmax="from coursekit.attention import softmax as reference\n\n"
            "def softmax(x, dim=-1):\n    return reference(x, dim)\n",
        ),
        "paster": student(scaled_dot_product_attention=pasted),
        "sharer_a": student(scaled_dot_product_attention=SHARED, causal_mask=MASK_LOOPS),
        "sharer_b": student(scaled_dot_product_attention=renamed(SHARED), causal_mask=MASK_ARANGE),
        "sharer_c": student(scaled_dot_product_attention=renamed(swapped(SHARED))),  # branches swapped
        "independent_a": student(softmax=SOFTMAX_EINSUM_STYLE, scaled_dot_product_attention=EINSUM),
        "independent_b": student(
            softmax=SOFTMAX_LOGSUMEXP, causal_mask=MASK_LOOPS.replace("mask[i, j]", "mask[i][j]")
        ),
        "library": student(
            softmax="def softmax(x, dim=-1):\n    return torch.nn.functional.softmax(x, dim)\n"
        ),
        "untouched": release,
    }
    found = {(s.kind, s.students, s.part) for s in signals(ASSIGNMENT, notebooks, release)}
    assert found == {
        ("reference", ("importer",), "part 1 (softmax)"),
        ("copy of the reference", ("paster",), "part 3 (scaled_dot_product_attention)"),
        ("near-identical", ("sharer_a", "sharer_b"), "part 3 (scaled_dot_product_attention)"),
        ("near-identical", ("sharer_a", "sharer_c"), "part 3 (scaled_dot_product_attention)"),
        ("near-identical", ("sharer_b", "sharer_c"), "part 3 (scaled_dot_product_attention)"),
        ("ruled-out call", ("library",), "part 1 (softmax)"),
        # the loops with one index changed are the same code: a shared answer, not a coincidence
        ("near-identical", ("independent_b", "sharer_a"), "part 2 (causal_mask)"),
    }


def test_references_called_at_run_time_are_flagged_for_their_part_only():
    """What the sandbox reports (``reference_calls`` of a verdict): a call of the reference of a graded
    part of this assignment is a signal; a helper the release gives (``check_attention_inputs``), another
    chapter's code, or a name that is no part are not."""
    release = load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    runtime = {
        "hider": ["coursekit.attention.softmax", "coursekit.attention.check_attention_inputs"],
        "other": ["coursekit.multihead.split_heads", "coursekit.attention.padding_mask"],
        "modules": ["coursekit.attention.SelfAttention"],
    }
    notebooks = {name: release for name in runtime}
    found = {
        (s.kind, s.students, s.part)
        for s in signals(ASSIGNMENT, notebooks, release, runtime)
        if s.kind == "reference at run time"
    }
    assert found == {
        ("reference at run time", ("hider",), "part 1 (softmax)"),
        ("reference at run time", ("modules",), "part 4 (SelfAttention)"),
    }


def test_the_references_compiled_code_seen_at_run_time_is_flagged():
    """An answer that holds the reference's compiled code however it arrived (``exec`` of its source or
    of an encoded string: ``code:module.name`` from the sandbox) is a signal of its own kind."""
    release = load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    runtime = {
        "encoder": ["code:coursekit.attention.softmax"],
        "other": ["code:coursekit.multihead.split_heads"],
    }
    found = [
        (s.kind, s.students, s.part, s.detail)
        for s in signals(ASSIGNMENT, {n: release for n in runtime}, release, runtime)
        if "run time" in s.kind
    ]
    assert found == [
        (
            "reference's code at run time",
            ("encoder",),
            "part 1 (softmax)",
            "defined an object with the compiled code of coursekit.attention.softmax (seen in the sandbox)",
        )
    ]


def test_a_prediction_changed_after_its_check_showed_the_answer_is_reported():
    """The outputs a student hands in show what a prediction's check printed: the value it saw and
    the answer. A graded value that differs is reported to the instructor (never a deduction); a
    notebook whose outputs were cleared, or whose prediction did not change, reports nothing."""
    import json

    import nbformat

    from coursekit.autograde.grade import prediction_changes
    from coursekit.autograde.plan import plan_notebook

    assignment = ASSIGNMENT
    release = load(ROOT / "exercises" / assignment / f"{assignment}.ipynb")
    plan = plan_notebook(load(ROOT / "solutions" / assignment / f"{assignment}.ipynb"), release, assignment)
    submitted = json.loads(nbformat.writes(release))
    (public,) = [
        c
        for c in submitted["cells"]
        if c["metadata"].get("nbgrader", {}).get("grade_id") == "predict_leaked_pairs_public"
    ]
    public["outputs"] = [
        {
            "output_type": "stream",
            "name": "stdout",
            "text": [
                "[pass] x\n",
                "predict_leaked_pairs (public): How many? "
                "You predicted 9; the experiment gives 7. Because.\n",
            ],
        }
    ]
    raw = json.dumps(submitted).encode()
    hidden = {
        "predict_leaked_pairs_hidden": {
            "lines": ["predict_leaked_pairs: How many? You predicted 7; the experiment gives 7."]
        }
    }
    changed = prediction_changes(plan, raw, hidden)
    assert changed == [["predict_leaked_pairs", "9", "7"]]
    assert (
        prediction_changes(
            plan,
            raw,
            {
                "predict_leaked_pairs_hidden": {
                    "lines": [hidden["predict_leaked_pairs_hidden"]["lines"][0].replace("7;", "9;", 1)]
                }
            },
        )
        == []
    )
    assert prediction_changes(plan, nbformat.writes(release).encode(), hidden) == []  # outputs cleared
    (signal,) = signals(assignment, {"s": release}, release, {}, {"s": [tuple(c) for c in changed]})
    assert (signal.kind, signal.students, signal.part) == (
        "prediction changed after its answer was shown",
        ("s",),
        "part 5a (predict_leaked_pairs)",
    )
    assert "printed the answer for 9; handed in: 7" in signal.detail
