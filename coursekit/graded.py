"""The graded definitions of the course, recognised by their syntax trees.

Every function or class a student writes in an answer cell (read from the instructor's
notebooks by :func:`coursekit.grading.harness.parts`) is *graded*. Its body is the answer: the
student edition of the book shows its contract (signature and docstring, see :func:`contract`)
and never its body, and a test reads every built page and download for a body that slipped
through (:func:`bodies_in`).

Bodies are compared as normalised syntax trees: comments, blank lines, line breaks and the
docstring do not count, so reformatting the reference does not hide it.

Example::

    >>> from coursekit.graded import contract
    >>> print(contract("def f(x):\\n    '''Twice x.'''\\n    return 2 * x\\n", "f", "part 1 of Exercise 1"))
    def f(x):
        '''Twice x.'''
        ...  # the body is part 1 of Exercise 1
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

__all__ = ["Graded", "bodies_in", "contract", "find", "fingerprints", "graded", "graded_bodies"]

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Graded:
    """Where a definition is graded: ``name`` is part ``part`` (titled ``title``) of ``assignment``."""

    assignment: str
    exercise: str
    part: str  # the part's number in the exercise's headings ("6", "5a")
    name: str

    def where(self) -> str:
        """``"part 1 of Exercise 1 (Attention)"``: how the book names it."""
        return f"part {self.part} of {self.exercise}"


def _body(node: ast.AST) -> list[ast.stmt]:
    """A function's statements without its docstring."""
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        if isinstance(body[0].value.value, str):
            body = body[1:]
    return body


def _is_stub(statement: ast.stmt) -> bool:
    """``raise ...``, ``pass`` or ``...``."""
    if isinstance(statement, (ast.Raise, ast.Pass)):
        return True
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def _dump(statements: list[ast.stmt]) -> str:
    return "\n".join(ast.dump(s, annotate_fields=False, include_attributes=False) for s in statements)


def fingerprints(tree: ast.AST) -> dict[str, str]:
    """The normalised body of every function and method in ``tree``: fingerprint -> its name.
    Bodies of a single ``raise``/``pass``/``...`` (stubs) are left out: they give nothing away."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, _FUNCS):
            body = _body(node)
            if not body or (len(body) == 1 and _is_stub(body[0])):
                continue
            found[_dump(body)] = node.name
    return found


@functools.cache
def graded_bodies() -> dict[str, Graded]:
    """Fingerprint of every graded function and method body of the course -> where it is graded.

    A body is graded when the instructor's answer cell has it and the student's release of that
    cell does not: code the release gives (a constructor around the method to write, say) is not."""
    import nbformat

    from coursekit.cells import nbgrader_meta
    from coursekit.chapters import CHAPTERS, course_root
    from coursekit.grading import harness

    found: dict[str, Graded] = {}
    for number, chapter in enumerate(CHAPTERS, start=1):
        exercise = (
            f"Exercise {number} ({chapter.title})"
            if chapter.assignment.startswith("ch")
            else f"the appendix exercise ({chapter.title})"
        )
        release = nbformat.read(
            course_root() / "exercises" / chapter.assignment / chapter.notebook, as_version=4
        )
        given = {
            nbgrader_meta(c).get("grade_id"): c.source
            for c in release.cells
            if nbgrader_meta(c).get("solution")
        }
        for part in harness.parts(chapter.assignment):
            stub = given.get(part.grade_id, "")
            try:
                handed_out = set(fingerprints(ast.parse(stub)))
            except SyntaxError:
                handed_out = set()
            for node in ast.parse(part.source).body:
                if isinstance(node, _DEFS):
                    graded = Graded(chapter.assignment, exercise, part.number, node.name)
                    for key in fingerprints(node):
                        if key not in handed_out:
                            found.setdefault(key, graded)
    return found


def find(source: str, dotted: str) -> ast.AST:
    """The definition called ``dotted`` (``"name"`` or ``"Class.method"``) in ``source``."""
    scope: list[ast.stmt] = ast.parse(source).body
    node = None
    for name in dotted.split("."):
        node = next((n for n in scope if isinstance(n, _DEFS) and n.name == name), None)
        if node is None:
            raise LookupError(f"no definition {dotted!r}")
        scope = node.body
    return node


def graded(source: str, dotted: str) -> Graded | None:
    """Where the definition ``dotted`` of ``source`` is graded, if any of its bodies is."""
    table = graded_bodies()
    return next((table[k] for k in fingerprints(find(source, dotted)) if k in table), None)


def contract(source: str, dotted: str, where: str) -> str:
    """The definition ``dotted`` of ``source`` with every function body replaced by ``...``: its
    decorators, signature and docstring (and, for a class, its other statements) as written."""
    lines = source.splitlines()
    node = find(source, dotted)
    indent = " " * node.col_offset
    out = [
        line[node.col_offset :] if line.startswith(indent) else line for line in _contract(lines, node, where)
    ]
    return "\n".join(out) + "\n"


def _contract(lines: list[str], node: ast.AST, where: str) -> list[str]:
    start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
    body = _body(node)
    if len(body) < len(node.body):  # through the docstring
        head_end = node.body[0].end_lineno
    else:  # through the signature: up to the first statement, without the comments before it
        head_end = (body[0].lineno if body else node.end_lineno + 1) - 1
        while head_end > node.lineno and lines[head_end - 1].strip()[:1] in ("", "#"):
            head_end -= 1
    out = lines[start - 1 : head_end]
    if isinstance(node, ast.ClassDef):
        for statement in body:
            out.append("")
            if isinstance(statement, _FUNCS):
                out += _contract(lines, statement, where)
            else:
                out += lines[statement.lineno - 1 : statement.end_lineno]
        return out
    if body:
        pad = " " * (node.col_offset + 4)
        out.append(f"{pad}...  # the body is {where}")
    return out


def bodies_in(code: str) -> dict[str, Graded]:
    """The graded bodies that ``code`` contains: their fingerprint -> where they are graded.
    Code that does not parse (a shell line, a fragment) contains none."""
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(code))
    except (SyntaxError, ValueError):
        return {}
    table = graded_bodies()
    return {k: table[k] for k in fingerprints(tree) if k in table}
