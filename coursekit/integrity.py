"""Academic-integrity signals for the class report: things an instructor may want to look at.

They are signals, never grades: the report lists them, and nothing is deducted. Five kinds:

* ``reference``: a student's code reaches the course's reference implementation of a part of
  this assignment (``from coursekit.attention import softmax``, ``coursekit.attention.softmax``,
  a module alias, ``importlib.import_module("coursekit.attention")``), read from the syntax tree
  of every code cell they ran. What the released notebook itself imports is given, not flagged.
* ``reference at run time``: the sandbox saw the student's code call the course's reference of a
  part while it was graded (the sandbox wraps each reference; calls from inside coursekit, such as a
  given model calling its own attention, do not count). It catches what the syntax tree hides
  (``getattr(__import__(...), name)``, ``exec`` of a string); a student who unwraps it is not seen.
* ``copy of the reference``: an answer whose body is the reference's, compared as normalised
  syntax trees (:mod:`coursekit.graded`: comments, blank lines and formatting do not count).
* ``ruled-out call``: an answer calls a library function the exercise's text rules out
  (``RULED_OUT`` of the assignment's grading module: attribute names such as ``softmax``, which
  catches ``torch.softmax``, ``F.softmax`` and ``x.softmax(...)`` alike).
* ``near-identical``: two students whose answers to a part have the same tokens once comments,
  white space and the names of local variables are set aside (similarity of at least
  :data:`SIMILAR`, in order or as pairs of neighbouring tokens whatever their order, so swapped
  branches or statements do not hide a shared answer; answers of at least :data:`MIN_TOKENS`
  tokens only: short answers look alike whoever writes them).
* ``reference's code at run time``: the sandbox saw an object with the compiled code of the
  reference of a part, however it arrived (``exec`` of its source or of an encoded string).
* ``prediction changed after its answer was shown``: the outputs handed in show a prediction's
  check printing the answer for another value than the one graded.

Example::

    >>> from coursekit.integrity import reference_uses
    >>> reference_uses("from coursekit.attention import softmax as s", {"coursekit.attention"}, {"softmax"})
    {'softmax'}
"""

from __future__ import annotations

import ast
import builtins
import collections
import difflib
import io
import keyword
import re
import tokenize
from dataclasses import dataclass

__all__ = [
    "MIN_TOKENS",
    "SIMILAR",
    "Signal",
    "near_identical",
    "reference_uses",
    "ruled_out_calls",
    "signals",
    "tokens",
]

#: least similarity (``difflib`` ratio of normalised tokens, or Dice's coefficient of their
#: neighbouring pairs) for two answers to be flagged
SIMILAR = 0.95
_RENAMED = re.compile(r"v\d+")  # a chosen name, as :func:`tokens` renames it
#: answers shorter than this (in tokens) are never compared
MIN_TOKENS = 40


@dataclass(frozen=True)
class Signal:
    """One finding: ``kind``, the students concerned, the part (its title) and what was seen."""

    kind: str
    students: tuple[str, ...]
    part: str
    detail: str


def reference_uses(source: str, modules: set[str], names: set[str]) -> set[str]:
    """The ``names`` that ``source`` takes from the reference ``modules`` (dotted, e.g.
    ``"coursekit.attention"``): imported, or read as attributes of the module or of an alias."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    aliases: dict[str, str] = {}  # local name -> reference module
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                if node.module in modules and a.name in names:
                    found.add(a.name)
                elif f"{node.module}.{a.name}" in modules:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            module = _imported_by_call(node.value)
            if module in modules:
                aliases.update({t.id: module for t in node.targets if isinstance(t, ast.Name)})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names:
            owner = _dotted(node.value)
            if owner in modules or aliases.get(owner or "") in modules:
                found.add(node.attr)
        elif isinstance(node, ast.Call) and _imported_by_call(node) in modules:
            parent_attrs = {
                n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.value is node
            }
            found |= parent_attrs & names
    return found


def ruled_out_calls(source: str, attributes: tuple[str, ...]) -> set[str]:
    """The calls in ``source`` of an attribute named in ``attributes`` (``torch.softmax(...)``,
    ``F.softmax(...)``, ``x.softmax(...)``), as written: ``{"F.softmax"}``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {
        f"{_dotted(n.func.value) or '...'}.{n.func.attr}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in attributes
    }


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _imported_by_call(call: ast.Call) -> str | None:
    """``"m"`` for ``importlib.import_module("m")``, ``import_module("m")`` or ``__import__("m")``."""
    name = _dotted(call.func) or ""
    if name.split(".")[-1] in ("import_module", "__import__") and call.args:
        first = call.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


_KEEP = set(keyword.kwlist) | set(dir(builtins))


def tokens(source: str) -> list[str]:
    """``source``'s tokens without comments and layout; the names a student chooses (any name not
    after a ``.`` and not a keyword or builtin) become ``v0``, ``v1``, ... in order of appearance."""
    out: list[str] = []
    renamed: dict[str, str] = {}
    previous = ""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (
                tokenize.COMMENT,
                tokenize.NL,
                tokenize.NEWLINE,
                tokenize.INDENT,
                tokenize.DEDENT,
            ):
                continue
            text = tok.string
            if tok.type == tokenize.NAME and previous != "." and text not in _KEEP:
                text = renamed.setdefault(text, f"v{len(renamed)}")
            if tok.type != tokenize.ENDMARKER:
                out.append(text)
            previous = tok.string
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    return out


def near_identical(answers: dict[str, str], released: str) -> list[tuple[str, str, float]]:
    """Pairs of students whose answers (``student -> source``) are near-identical, with their
    similarity; answers still as released, or shorter than :data:`MIN_TOKENS`, are left out."""
    stub = tokens(released)
    seqs = {
        s: t
        for s, t in ((s, tokens(src)) for s, src in answers.items())
        if len(t) >= MIN_TOKENS and t != stub
    }
    names = sorted(seqs)
    bags = {s: _bigrams(t) for s, t in seqs.items()}
    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            m = difflib.SequenceMatcher(None, seqs[a], seqs[b], autojunk=False)
            in_order = (
                m.ratio()
                if m.real_quick_ratio() >= SIMILAR and m.quick_ratio() >= SIMILAR
                else 0.0  # (an upper bound below the bar: the exact ratio is not needed)
            )
            ratio = max(in_order, _dice(bags[a], bags[b]))
            if ratio >= SIMILAR:
                pairs.append((a, b, ratio))
    return pairs


def _bigrams(toks: list[str]) -> collections.Counter:
    """Pairs of neighbouring tokens with every chosen name as one ``v``: blind to the order of
    statements and to which name was chosen first, so a shared answer whose branches were swapped
    (``if a: X else: Y`` as ``if not a: Y else: X``) keeps nearly all its pairs."""
    flat = ["v" if _RENAMED.fullmatch(t) else t for t in toks]
    return collections.Counter(zip(flat, flat[1:]))


def _dice(a: collections.Counter, b: collections.Counter) -> float:
    """Dice's coefficient of two multisets: 2 |a & b| / (|a| + |b|)."""
    total = sum(a.values()) + sum(b.values())
    return 2 * sum((a & b).values()) / total if total else 0.0


def signals(
    assignment: str,
    notebooks: dict[str, object],
    release: object,
    runtime: dict[str, list[str]] | None = None,
    changed: dict[str, list[tuple[str, str, str]]] | None = None,
) -> list[Signal]:
    """The signals of a class: ``notebooks`` maps each student to the notebook they submitted
    (as graded, an ``nbformat`` node), ``release`` is the student release of ``assignment``;
    ``runtime`` maps a student to the references (``module.name``) the sandbox saw their code call
    while it was graded (``reference_calls`` of the verdict); ``changed`` maps a student to the
    predictions changed after their check showed the answer (``(answer cell, value the check saw,
    value graded)``, ``prediction_changes`` of the verdict)."""
    import importlib

    from coursekit.cells import is_test_cell, nbgrader_meta
    from coursekit.chapters import chapter
    from coursekit.graded import bodies_in
    from coursekit.grading import harness
    from coursekit.sandbox.worker import CODE_COPY

    parts = harness.parts(assignment)
    ruled_out = tuple(getattr(importlib.import_module(chapter(assignment).grader), "RULED_OUT", ()))
    title = {p.grade_id: f"part {p.number} ({p.name})" for p in parts}
    part_of_name = {name: p for p in parts for name in p.names}
    modules = {f"coursekit.{m}" for m in chapter(assignment).modules}

    def code(nb) -> list:
        return [c for c in nb.cells if c.cell_type == "code" and not is_test_cell(c)]

    given = set().union(*(reference_uses(c.source, modules, set(part_of_name)) for c in code(release)))
    stubs = {
        nbgrader_meta(c).get("grade_id"): c.source for c in code(release) if nbgrader_meta(c).get("solution")
    }
    found: list[Signal] = []
    answers: dict[str, dict[str, str]] = {p.grade_id: {} for p in parts}  # copies of the reference left out
    for student, nb in sorted(notebooks.items()):
        used: set[str] = set()
        for cell in code(nb):
            used |= reference_uses(cell.source, modules, set(part_of_name)) - given
            gid = nbgrader_meta(cell).get("grade_id")
            if gid in answers and ruled_out:
                calls = ruled_out_calls(cell.source, ruled_out)
                if calls:
                    found.append(
                        Signal("ruled-out call", (student,), title[gid], f"calls {', '.join(sorted(calls))}")
                    )
            if gid in answers:
                copied = {g.name for g in bodies_in(cell.source).values() if g.assignment == assignment}
                if not copied:  # two copies of the reference are alike because of it: one signal each
                    answers[gid][student] = cell.source
                if copied:
                    found.append(
                        Signal(
                            "copy of the reference",
                            (student,),
                            title[gid],
                            f"the body of {', '.join(sorted(copied))} is the reference's (as syntax trees)",
                        )
                    )
        for name in sorted(used):
            part = part_of_name[name]
            found.append(
                Signal(
                    "reference",
                    (student,),
                    title[part.grade_id],
                    f"uses {name} from the course's reference ({', '.join(sorted(modules))})",
                )
            )
    for student, calls in sorted((runtime or {}).items()):
        for label in sorted(set(calls)):
            copy = label.startswith(CODE_COPY)  # the reference's compiled code, however it arrived
            module, _, name = label.removeprefix(CODE_COPY).rpartition(".")
            if module in modules and name in part_of_name and name not in given:
                found.append(
                    Signal(
                        "reference's code at run time" if copy else "reference at run time",
                        (student,),
                        title[part_of_name[name].grade_id],
                        f"defined an object with the compiled code of {module}.{name} (seen in the sandbox)"
                        if copy
                        else f"called {label} while being graded (seen in the sandbox)",
                    )
                )
    for student, rows in sorted((changed or {}).items()):
        for gid, seen, graded in rows:
            found.append(
                Signal(
                    "prediction changed after its answer was shown",
                    (student,),
                    title.get(gid, gid),
                    f"the check printed the answer for {seen}; handed in: {graded} (the point is your call)",
                )
            )
    for gid, by_student in answers.items():
        for a, b, ratio in near_identical(by_student, stubs.get(gid, "")):
            found.append(Signal("near-identical", (a, b), title[gid], f"{ratio:.0%} of tokens in common"))
    return found
