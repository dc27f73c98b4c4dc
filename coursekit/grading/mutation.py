"""Mutation testing of the graders: small wrong versions of each answer, graded here.

A grader is code, and the question "does it catch wrong answers?" has a measurable answer:
change the solution of a part in one small way (a *mutant*), grade it, and see whether the
part loses points (the mutant is *killed*). Hand-written catalogues (``tests/mutants/``) hold
the classic mistakes with their hints; this module makes the mistakes nobody thought of, with
the standard operators of mutation testing (as mutmut and cosmic-ray define them), applied to
the statements between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` and to the defaults of
the part's signatures:

=================  ==========================================================================
``binop``          ``+ - * / // % ** @`` swapped for a near operator (``+`` <-> ``-``, ...)
``augassign``      the same inside ``x += ...``
``compare``        ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``is``, ``in`` negated
``boolop``         ``and`` <-> ``or``
``unary``          ``-x`` -> ``x``, ``not x`` -> ``x``
``number``         a number -> 0, 1, -1, n + 1, n - 1 (those that differ)
``bool``           ``True`` <-> ``False``
``slice``          a slice bound moved by one
``keyword``        a keyword argument dropped
``argument``       a positional argument dropped
``delete``         a statement replaced by ``pass``
``condition``      an ``if``/``while`` condition negated
``attribute``      a method swapped for its twin (``amax`` <-> ``amin``, ``tril`` <-> ``triu``, ...)
``default``        a default value of the signature changed (numbers and booleans)
=================  ==========================================================================

Each mutant has a stable id, ``part | source line | operator | k``, so that a one-line reason
for an *equivalent* mutant (one that computes the same thing, so no grader can kill it) stays
attached to it from run to run. :func:`run` grades mutants in forked processes with a time
limit (a mutant that loops forever is killed by the limit, as it would be by the autograder).
``scripts/mutation.py`` writes the committed reports; ``tests/test_mutation.py`` checks them.

Over 500 lines: the mutation engine: its operators, the AST walk that applies them, the forked
runner and the report fingerprint.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
import re
import select
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from coursekit.grading import harness

__all__ = ["Mutant", "Result", "mutants", "run", "fingerprint", "VERSION"]

#: Bumped whenever the operators change, so that reports made with others are stale.
VERSION = 1

_BINOP_SWAPS = {
    ast.Add: (ast.Sub,),
    ast.Sub: (ast.Add,),
    ast.Mult: (ast.Div, ast.Add),
    ast.Div: (ast.Mult, ast.FloorDiv),
    ast.FloorDiv: (ast.Div, ast.Mult),
    ast.Mod: (ast.FloorDiv,),
    ast.Pow: (ast.Mult,),
    ast.MatMult: (ast.Mult,),
}
_COMPARE_SWAPS = {
    ast.Lt: (ast.LtE, ast.Gt),
    ast.LtE: (ast.Lt, ast.GtE),
    ast.Gt: (ast.GtE, ast.Lt),
    ast.GtE: (ast.Gt, ast.LtE),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
#: Method and function names that students swap for each other.
_TWINS = {
    "amax": "amin",
    "amin": "amax",
    "max": "min",
    "min": "max",
    "argmax": "argmin",
    "argmin": "argmax",
    "sum": "mean",
    "mean": "sum",
    "tril": "triu",
    "triu": "tril",
    "softmax": "log_softmax",
    "log_softmax": "softmax",
    "exp": "log",
    "log": "exp",
    "cumsum": "cumprod",
    "topk": "sort",
    "unsqueeze": "squeeze",
    "rsqrt": "sqrt",
    "sqrt": "rsqrt",
    "ceil": "floor",
    "floor": "ceil",
    "logsumexp": "amax",
    "var": "std",
    "std": "var",
    "view": "reshape",
    "all": "any",
    "any": "all",
    "append": "extend",
    "items": "keys",
    "sin": "cos",
    "cos": "sin",
    "flip": "clone",
}


@dataclass(frozen=True)
class Mutant:
    """One changed version of a part's answer cell."""

    id: str  # "<part> | <line, whitespace squeezed> | <operator> | <k>"
    part: str  # the answer cell's grade id
    operator: str
    line: int  # 1-based line of the answer cell
    description: str  # what changed, e.g. "`<` -> `<=`"
    source: str  # the whole answer cell, changed (comments are gone: it is unparsed)


@dataclass(frozen=True)
class Result:
    """What grading a mutant gave: ``killed`` with the first failing test cell and hint,
    ``survived``, or ``timeout`` (killed by the time limit)."""

    id: str
    status: str  # "killed", "survived" or "timeout"
    test: str = ""
    hint: str = ""
    seconds: float = 0.0


# --------------------------------------------------------------------------- making mutants


def _regions(source: str) -> list[tuple[int, int]]:
    """1-based inclusive line ranges between BEGIN and END SOLUTION markers."""
    regions, start = [], None
    for i, line in enumerate(source.splitlines(), start=1):
        if "### BEGIN SOLUTION" in line:
            start = i
        elif "### END SOLUTION" in line and start is not None:
            regions.append((start, i))
            start = None
    return regions


def _number_variants(value) -> list:
    """0, 1, -1, value + 1 and value - 1, of the value's type, without repeats or the value itself."""
    out = []
    for v in (0, 1, -1, value + 1, value - 1):
        v = float(v) if isinstance(value, float) else v
        if v != value and v not in out:
            out.append(v)
    return out


class _Sites(ast.NodeVisitor):
    """Finds every mutation site: (node path, operator, description, replacement maker)."""

    def __init__(self, regions: list[tuple[int, int]]):
        self.regions = regions
        self.sites: list[tuple[int, str, str, object]] = []  # (line, operator, description, (node, change))

    def inside(self, node) -> bool:
        line = getattr(node, "lineno", None)
        return line is not None and any(a <= line <= b for a, b in self.regions)

    def add(self, node, operator: str, description: str, change):
        self.sites.append((node.lineno, operator, description, (node, change)))

    # ---- expressions

    def visit_BinOp(self, node):
        if self.inside(node):
            for new in _BINOP_SWAPS.get(type(node.op), ()):
                self.add(
                    node,
                    "binop",
                    f"`{_op(node.op)}` -> `{_op(new())}`",
                    lambda n, new=new: setattr(n, "op", new()),
                )
        self.generic_visit(node)

    def visit_Compare(self, node):
        if self.inside(node):
            for i, op in enumerate(node.ops):
                for new in _COMPARE_SWAPS.get(type(op), ()):

                    def change(n, i=i, new=new):
                        n.ops[i] = new()

                    self.add(node, "compare", f"`{_op(op)}` -> `{_op(new())}`", change)
        self.generic_visit(node)

    def visit_BoolOp(self, node):
        if self.inside(node):
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            self.add(
                node,
                "boolop",
                f"`{_op(node.op)}` -> `{_op(new())}`",
                lambda n, new=new: setattr(n, "op", new()),
            )
        self.generic_visit(node)

    def visit_UnaryOp(self, node):
        if self.inside(node) and isinstance(node.op, (ast.USub, ast.Not)):
            self.add(node, "unary", f"`{_op(node.op)}x` -> `x`", _Replace(lambda n: n.operand))
        self.generic_visit(node)

    def visit_Constant(self, node):
        if self.inside(node):
            self._constant(node, "number")
        self.generic_visit(node)

    def _constant(self, node, operator: str):
        value = node.value
        if isinstance(value, bool):
            self.add(
                node,
                "bool" if operator == "number" else operator,
                f"`{value}` -> `{not value}`",
                lambda n: setattr(n, "value", not n.value),
            )
        elif isinstance(value, (int, float)) and not isinstance(value, complex):
            for v in _number_variants(value):
                self.add(node, operator, f"`{value!r}` -> `{v!r}`", lambda n, v=v: setattr(n, "value", v))

    def visit_Slice(self, node):
        if self.inside(node):
            for bound in ("lower", "upper"):
                if getattr(node, bound) is not None:
                    for delta in (1, -1):

                        def change(n, bound=bound, delta=delta):
                            old = getattr(n, bound)
                            op = ast.Add() if delta > 0 else ast.Sub()
                            setattr(n, bound, ast.BinOp(left=old, op=op, right=ast.Constant(1)))

                        self.add(node, "slice", f"{bound} bound {'+' if delta > 0 else '-'} 1", change)
        self.generic_visit(node)

    def visit_Call(self, node):
        if self.inside(node):
            for i, kw in enumerate(node.keywords):
                if kw.arg is not None:

                    def change(n, i=i):
                        del n.keywords[i]

                    self.add(node, "keyword", f"drop `{kw.arg}=`", change)
            if len(node.args) > 1:
                for i in range(len(node.args)):

                    def change(n, i=i):
                        del n.args[i]

                    self.add(node, "argument", f"drop argument {i + 1}", change)
        self.generic_visit(node)

    def visit_Attribute(self, node):
        if self.inside(node) and node.attr in _TWINS:
            twin = _TWINS[node.attr]
            self.add(
                node,
                "attribute",
                f"`.{node.attr}` -> `.{twin}`",
                lambda n, twin=twin: setattr(n, "attr", twin),
            )
        self.generic_visit(node)

    def visit_Name(self, node):
        if (
            self.inside(node)
            and node.id in _TWINS
            and isinstance(node.ctx, ast.Load)
            and node.id in ("max", "min", "sum")
        ):
            twin = _TWINS[node.id]
            self.add(
                node, "attribute", f"`{node.id}` -> `{twin}`", lambda n, twin=twin: setattr(n, "id", twin)
            )
        self.generic_visit(node)

    # ---- statements

    def _statement(self, node):
        if self.inside(node):
            self.add(node, "delete", "statement removed", _Replace(lambda n: ast.Pass()))
        self.generic_visit(node)

    visit_Assign = visit_AugAssign = visit_AnnAssign = visit_Expr = visit_Raise = visit_Assert = _statement
    visit_For = visit_With = _statement

    def visit_AugAssign(self, node):  # noqa: F811 (both: a statement, and its operator)
        if self.inside(node):
            for new in _BINOP_SWAPS.get(type(node.op), ()):
                self.add(
                    node,
                    "augassign",
                    f"`{_op(node.op)}=` -> `{_op(new())}=`",
                    lambda n, new=new: setattr(n, "op", new()),
                )
        self._statement(node)

    def visit_If(self, node):
        if self.inside(node):
            self.add(
                node,
                "condition",
                "condition negated",
                lambda n: setattr(n, "test", ast.UnaryOp(op=ast.Not(), operand=n.test)),
            )
            self.add(node, "delete", "statement removed", _Replace(lambda n: ast.Pass()))
        self.generic_visit(node)

    def visit_While(self, node):
        if self.inside(node):
            self.add(
                node,
                "condition",
                "condition negated",
                lambda n: setattr(n, "test", ast.UnaryOp(op=ast.Not(), operand=n.test)),
            )
        self.generic_visit(node)

    def visit_IfExp(self, node):
        if self.inside(node):
            self.add(
                node,
                "condition",
                "condition negated",
                lambda n: setattr(n, "test", ast.UnaryOp(op=ast.Not(), operand=n.test)),
            )
        self.generic_visit(node)

    # ---- signatures (outside the solution regions: students may still change a default)

    def visit_FunctionDef(self, node):
        args = node.args
        for default in [*args.defaults, *[d for d in args.kw_defaults if d is not None]]:
            if isinstance(default, ast.Constant):
                self._constant(default, "default")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef


class _Replace:
    """A change that replaces the node itself (in its parent's field or list)."""

    def __init__(self, make):
        self.make = make


def _op(op) -> str:
    return {
        ast.Add: "+",
        ast.Sub: "-",
        ast.Mult: "*",
        ast.Div: "/",
        ast.FloorDiv: "//",
        ast.Mod: "%",
        ast.Pow: "**",
        ast.MatMult: "@",
        ast.Lt: "<",
        ast.LtE: "<=",
        ast.Gt: ">",
        ast.GtE: ">=",
        ast.Eq: "==",
        ast.NotEq: "!=",
        ast.Is: "is",
        ast.IsNot: "is not",
        ast.In: "in",
        ast.NotIn: "not in",
        ast.And: "and",
        ast.Or: "or",
        ast.USub: "-",
        ast.Not: "not ",
    }[type(op)]


def _paths(tree) -> dict[int, tuple]:
    """id(node) -> the path of (field, index) steps from the root to it."""
    out = {id(tree): ()}
    for parent in ast.walk(tree):
        base = out[id(parent)]
        for field, value in ast.iter_fields(parent):
            if isinstance(value, list):
                for i, child in enumerate(value):
                    if isinstance(child, ast.AST):
                        out[id(child)] = base + ((field, i),)
            elif isinstance(value, ast.AST):
                out[id(value)] = base + ((field, None),)
    return out


def _follow(tree, path):
    node = tree
    for field, index in path:
        node = getattr(node, field) if index is None else getattr(node, field)[index]
    return node


def _apply(tree, path, change) -> ast.AST:
    tree = copy.deepcopy(tree)
    if isinstance(change, _Replace):
        *head, (field, index) = path
        parent = _follow(tree, head)
        old = getattr(parent, field) if index is None else getattr(parent, field)[index]
        new = ast.copy_location(change.make(old), old)
        if index is None:
            setattr(parent, field, new)
        else:
            getattr(parent, field)[index] = new
    else:
        change(_follow(tree, path))
    return ast.fix_missing_locations(tree)


def mutants(part: harness.Part) -> list[Mutant]:
    """Every mutant of ``part``'s answer cell, in a stable order with stable ids."""
    tree = ast.parse(part.source)
    finder = _Sites(_regions(part.source))
    finder.visit(tree)
    paths = _paths(tree)
    lines = part.source.splitlines()
    original = ast.unparse(tree)
    out, seen, counts = [], set(), {}
    for line, operator, description, (node, change) in finder.sites:
        mutated = ast.unparse(_apply(tree, paths[id(node)], change))
        if mutated == original or mutated in seen:  # no change, or the same program as another mutant
            continue
        seen.add(mutated)
        text = " ".join(lines[line - 1].split())
        key = (text, operator)
        counts[key] = counts.get(key, 0) + 1
        mid = f"{part.grade_id} | {text} | {operator} | {counts[key]}"
        out.append(Mutant(mid, part.grade_id, operator, line, description, mutated))
    return out


# --------------------------------------------------------------------------- grading mutants


def _grade(assignment: str, part: harness.Part, mutant: Mutant | None) -> tuple[str, str, str]:
    """Grade ``mutant`` (or the reference, for ``None``) in this process: (status, test, hint)."""
    ns = harness.namespace(assignment)
    if mutant is not None:
        for name in part.names:  # as in a notebook whose answer cell is the mutant: what it no longer
            ns.pop(name, None)  # defines is undefined (a deleted ``predict_x = 7`` leaves no predict_x)
        try:
            exec(compile(mutant.source, f"<mutant {mutant.id}>", "exec"), ns)  # noqa: S102
        except Exception as e:  # noqa: BLE001 (a mutant that cannot even be defined fails every check)
            return "killed", "(definition)", f"{type(e).__name__}: {e}"
    for outcome in harness.run_tests(part, ns):
        if outcome.failure is not None:
            hint = outcome.hints[0][1] if outcome.hints else outcome.failure.splitlines()[0]
            return "killed", outcome.test.grade_id, hint[:300]
    return "survived", "", ""


def run(
    assignment: str,
    part: harness.Part,
    candidates: list[Mutant],
    *,
    jobs: int = 2,
    timeout: float | None = None,
    progress=None,
) -> list[Result]:
    """Grade each mutant in a process of its own (forked from this one), ``jobs`` at a time.

    A mutant still running after ``timeout`` seconds (default: 20 times the reference's
    grading time, and at least 10 s) is stopped and counts as killed, as it would be by the
    autograder's time limits. ``progress(done, total)`` is called as results arrive.

    Raises:
        RuntimeError: if the reference answer does not pass its own tests.
    """
    import torch

    torch.set_num_threads(1)  # one thread per process: forked children must not inherit a thread pool
    started = time.monotonic()
    status, test, hint = _grade(assignment, part, None)
    if status != "survived":
        raise RuntimeError(f"{assignment}: the reference answer of {part.grade_id} fails {test}: {hint}")
    limit = timeout or max(10.0, 20 * (time.monotonic() - started))
    results: dict[str, Result] = {}
    todo = list(candidates)
    running: dict[int, tuple[Mutant, int, float]] = {}  # pid -> (mutant, read end, start)
    while todo or running:
        while todo and len(running) < jobs:
            mutant = todo.pop(0)
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child grades one mutant and reports as one JSON line
                os.close(read)
                try:
                    os.setpgid(0, 0)
                    answer = _grade(assignment, part, mutant)
                except BaseException as e:  # noqa: BLE001 (anything the mutant did is a kill)
                    answer = ("killed", "(crash)", f"{type(e).__name__}: {e}"[:300])
                os.write(write, json.dumps(answer).encode() + b"\n")
                os._exit(0)
            os.close(write)
            running[pid] = (mutant, read, time.monotonic())
        ready, _, _ = select.select([r for _, r, _ in running.values()], [], [], 0.05)
        for pid, (mutant, read, t0) in list(running.items()):
            elapsed = time.monotonic() - t0
            if read in ready or elapsed > limit:
                if read in ready:
                    data = _read_all(read)
                    try:
                        s, t, h = json.loads(data.decode() or '["killed", "(crash)", "the process ended"]')
                    except ValueError:
                        s, t, h = "killed", "(crash)", "the process ended without an answer"
                    result = Result(mutant.id, s, t, h, round(elapsed, 2))
                else:
                    result = Result(
                        mutant.id, "timeout", "", f"still running after {limit:.0f} s", round(elapsed, 2)
                    )
                _stop(pid)
                os.close(read)
                del running[pid]
                results[mutant.id] = result
                if progress:
                    progress(len(results), len(candidates))
    return [results[m.id] for m in candidates]


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _stop(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


# --------------------------------------------------------------------------- staleness


def fingerprint(assignment: str, part: harness.Part, equivalent: dict[str, str]) -> str:
    """Changes when anything that decides this part's mutation results changes: the answer, its
    test cells, the grader module, the grading toolkit (core, spec, questions, harness), this module,
    and the equivalent list."""
    from coursekit.chapters import chapter

    package = Path(__file__).resolve().parent
    digest = hashlib.sha256(f"v{VERSION}".encode())
    digest.update(part.source.encode())
    digest.update(json.dumps([asdict(t) for t in part.tests], sort_keys=True, default=str).encode())
    for path in (
        package / f"{chapter(assignment).assignment}.py",
        package / "core.py",
        package / "spec.py",
        package / "questions.py",
        package / "harness.py",
        Path(__file__).resolve(),
    ):
        digest.update(path.name.encode() + path.read_bytes())
    ours = {k: v for k, v in sorted(equivalent.items()) if k.startswith(f"{part.grade_id} | ")}
    digest.update(json.dumps(ours).encode())
    return digest.hexdigest()


def squeeze(text: str) -> str:
    """Whitespace squeezed to single spaces (how mutant ids quote a line)."""
    return re.sub(r"\s+", " ", text).strip()


def iter_parts(assignment: str, only: list[str] | None = None) -> Iterator[harness.Part]:
    for part in harness.parts(assignment):
        if not only or part.grade_id in only or part.name in only:
            yield part
