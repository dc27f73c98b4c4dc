"""The vocabulary of exercise notebooks: nbgrader's cell metadata and *thin calls*.

By convention every test cell of an exercise is a thin call into ``coursekit.grading``
(``checks.grade_softmax(softmax)``); :func:`thin_calls` reads one from the *instructor's*
notebook (and refuses anything else), so that the autograder can run that call on the
trusted side against the student's objects in the sandbox.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

__all__ = ["Call", "thin_calls", "is_test_cell", "nbgrader_meta", "heading", "part_label"]


def nbgrader_meta(cell) -> dict:
    meta = cell.get("metadata") if isinstance(cell, dict) else None
    nbg = meta.get("nbgrader") if isinstance(meta, dict) else None
    return nbg if isinstance(nbg, dict) else {}


#: the heading of a graded part in an exercise notebook: "## Part 6: the experiment", "### Question 5a"
_PART_HEADING = re.compile(r"(?:part|question)\s+(\d+[a-z]?)\b", re.IGNORECASE)


def heading(source: str) -> str | None:
    """The first markdown heading of a cell's ``source``, without its ``#`` marks (``None`` if none)."""
    return next((line.lstrip("#").strip() for line in source.splitlines() if line.startswith("#")), None)


def part_label(title: str | None) -> str | None:
    """The part's number as the notebook's headings give it, the one numbering that the feedback,
    the class report, the integrity table and the hints use: ``"Part 6: the experiment" -> "6"``,
    ``"Question 5a" -> "5a"``; ``None`` for a heading that names no part."""
    found = _PART_HEADING.match(title or "")
    return found[1] if found else None


def is_test_cell(cell) -> bool:
    """An autograded test cell: graded, not an answer, code."""
    m = nbgrader_meta(cell)
    return cell.get("cell_type") == "code" and bool(m.get("grade")) and not m.get("solution")


@dataclass(frozen=True)
class Call:
    """``module.function(*names, **constants)`` where ``names`` are globals of the notebook."""

    module: str
    function: str
    args: tuple[str, ...]
    kwargs: tuple[tuple[str, object], ...] = ()


def thin_calls(source: str, where: str = "a test cell") -> list[Call]:
    """Parse a test cell that must consist of imports from ``coursekit.grading`` and calls
    ``alias.function(name, ...)``; raise ``ValueError`` naming what else it found."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"{where} is not valid Python: {e}") from None
    modules: dict[str, str] = {}  # alias -> module
    functions: dict[str, tuple[str, str]] = {}  # alias -> (module, function)
    calls: list[Call] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full.startswith("coursekit.grading.") and node.module == "coursekit.grading":
                    modules[alias.asname or alias.name] = full
                elif node.module.startswith("coursekit.grading."):
                    functions[alias.asname or alias.name] = (node.module, alias.name)
                else:
                    raise ValueError(
                        f"{where} imports {full}; test cells may only import from coursekit.grading"
                    )
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("coursekit.grading.") or not alias.asname:
                    raise ValueError(f"{where}: use `import coursekit.grading.<module> as <alias>`")
                modules[alias.asname] = alias.name
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            call = node.value
            if (
                isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id in modules
            ):
                module, function = modules[call.func.value.id], call.func.attr
            elif isinstance(call.func, ast.Name) and call.func.id in functions:
                module, function = functions[call.func.id]
            else:
                raise ValueError(
                    f"{where} calls {ast.unparse(call.func)}, which is not imported from coursekit.grading"
                )
            if not all(isinstance(a, ast.Name) for a in call.args):
                raise ValueError(
                    f"{where}: the arguments of {ast.unparse(call)} must be names defined by the notebook"
                )
            try:
                kwargs = tuple((k.arg, ast.literal_eval(k.value)) for k in call.keywords)
            except ValueError:
                raise ValueError(
                    f"{where}: keyword arguments of {ast.unparse(call)} must be constants"
                ) from None
            if any(k is None for k, _ in kwargs):
                raise ValueError(f"{where}: ** arguments are not allowed in {ast.unparse(call)}")
            calls.append(Call(module, function, tuple(a.id for a in call.args), kwargs))
        else:
            raise ValueError(
                f"{where} holds `{ast.unparse(node)[:80]}`; a test cell must only import from coursekit.grading "
                "and call its functions with the student's objects"
            )
    if not calls:
        raise ValueError(f"{where} calls no grading function")
    return calls
