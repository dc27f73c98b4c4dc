"""coursekit in layers: model files read like a model.py, and the import graph has no cycle.

The graph is read from the source (every ``import`` statement, those inside functions included),
so a lazy import cannot hide a cycle or a model file reaching into training code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.submissions import ROOT

PACKAGE = ROOT / "coursekit"

#: the chapters' model files in the order the course teaches them: each may import the ones
#: before it (and the small helpers of :data:`HELPERS`), nothing that trains, loads data or
#: runs experiments
MODEL_FILES = [
    "attention",
    "multihead",
    "positional",
    "layers",
    "bpe",
    "bert",
    "gpt",
    "decoding",
    "seq2seq",
    "vit",
    "long_context",
    "arithmetic",
]
HELPERS = {"coursekit", "coursekit._config", "coursekit._files", "coursekit.hf_names"}
#: what a model file never imports
TRAINING = ("coursekit.train", "coursekit.data", "coursekit.experiments", "coursekit.checkpoints")
#: the line count above which a module's docstring must say why it is longer
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(name: str) -> str | None:
    """The coursekit module ``name`` refers to (a submodule, or the package that defines it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """The coursekit modules ``module`` imports, anywhere in its source."""
    tree = ast.parse(MODULES[module].read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from .y import z
                package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".rstrip(".")
            names = [f"{base}.{a.name}" for a in node.names]  # a submodule, or a name defined in base
        else:
            continue
        found |= {m for m in map(resolve, names) if m and m.startswith("coursekit") and m != module}
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_the_graph_is_read():
    assert GRAPH["coursekit.multihead"] >= {"coursekit.attention"}
    assert (
        "coursekit.sandbox.protocol" in GRAPH["coursekit.sandbox.host"]
    )  # from coursekit.sandbox import protocol


def test_the_import_graph_has_no_cycle():
    """Depth-first search; a cycle is reported as the modules along it."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = "open"
        path.append(m)
        for n in sorted(GRAPH[m]):
            # a submodule naming its own package (``from coursekit.sandbox import protocol``) resolves
            # to the package only for names the package itself defines; importing the package from
            # its submodule is how Python runs it anyway (the package first), so it is not a cycle
            if m.startswith(n + "."):
                continue
            if state.get(n) == "open":
                return path[path.index(n) :] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        state[m] = "done"
        path.pop()
        return None

    for m in sorted(GRAPH):
        if m not in state and (cycle := visit(m)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


@pytest.mark.parametrize("name", MODEL_FILES)
def test_a_model_file_imports_only_earlier_chapters(name):
    module = f"coursekit.{name}"
    allowed = HELPERS | {f"coursekit.{m}" for m in MODEL_FILES[: MODEL_FILES.index(name)]}
    found = GRAPH[module]
    assert not {m for m in found if m.startswith(TRAINING)}, f"{module} imports training or experiment code"
    assert found <= allowed, f"{module} imports {sorted(found - allowed)}, which are not earlier chapters"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_long_module_says_why(module):
    path = MODULES[module]
    lines = len(path.read_text().splitlines())
    if lines <= MAX_LINES:
        return
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert f"Over {MAX_LINES} lines" in doc, (
        f"{path.relative_to(ROOT)} has {lines} lines: split it, or say why in its docstring ('Over {MAX_LINES} "
        "lines: ...')"
    )


def test_the_checkpoint_registry_names_its_recipes_without_importing_them():
    """The experiments save what they train through ``coursekit.checkpoints``; the registry names
    their recipes by module (``Entry.experiment``) and imports them only when asked, so the two
    never import each other."""
    assert not {m for m in GRAPH["coursekit.checkpoints"] if m.startswith("coursekit.experiments")}
    from coursekit import checkpoints
    from coursekit.experiments import number_words

    entry = checkpoints.REGISTRY["seq2seq-numbers"]
    assert entry.recipe is number_words.pretrain_seq2seq_numbers
    assert entry.default is number_words.SEQ2SEQ_NUMBERS and entry.metrics == tuple(number_words.METRICS)
