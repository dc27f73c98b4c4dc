"""Hostile and broken submissions of Exercise 1, each with the score and reason it must get.

Every case starts from the reference solution (12 points) and breaks, attacks or
abuses something. ``expected`` is the score the case deserves, worked out from
what the submission really computes: Exercise 1 has four parts of 3 points (public
check 1, hidden checks 2), and ``scaled_dot_product_attention`` uses the student's
``softmax``, ``SelfAttention`` uses their ``scaled_dot_product_attention``;
``causal_mask`` stands alone, so the subversion cases pair their attack with a
wrong ``causal_mask`` (9 points: the attack must not rescue it). ``reason`` is text
the student (or the instructor) must see: in the autograder's notes, a check's
hint, or an output of their own cells.

``tests/test_adversarial.py`` grades all of them in one batch;
``scripts/compare_nbgrader.py`` runs the same catalogue through plain nbgrader.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Callable

import nbformat

from tests.submissions import ROOT, filled, load, replace_definition

ASSIGNMENT = "ch01_attention"
FULL = 12.0

#: a causal mask that lets every query see the future (the hidden checks call it transposed)
WRONG_CAUSAL = '''
def causal_mask(T, S=None, device=None):
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool, device=device).triu(S - T)
'''


@dataclass(frozen=True)
class Context:
    """What an attack may know about the machine (as a real student could guess it)."""

    course: str  # absolute path of the instructor's course folder
    port: int  # a TCP port on the host's loopback where the test listens
    secret: str  # a value in the grading process's environment


@dataclass(frozen=True)
class Case:
    name: str
    category: str
    expected: float
    reason: str
    make: Callable[[Context], object]  # -> notebook, bytes, or {filename: bytes} for a folder
    doc: str = ""


# --------------------------------------------------------------------------- building blocks


def reference():
    return filled(ASSIGNMENT)


def wrong_causal(nb=None):
    return replace_definition(nb or reference(), "causal_mask", WRONG_CAUSAL)


def added(nb, source: str, after: str = "imports"):
    """A new code cell (no grading metadata) after the cell with grade id ``after``."""
    nb = copy.deepcopy(nb)
    i = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == after)
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(source))
    return nb


def edited(nb, grade_id: str, change: Callable):
    nb = copy.deepcopy(nb)
    cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    change(nb, cells[0])
    return nb


def without(nb, grade_id: str):
    return edited(nb, grade_id, lambda nb, c: nb.cells.remove(c))


def duplicated(nb, grade_id: str, source: str | None = None):
    def dup(nb, c):
        twin = copy.deepcopy(c)
        twin.id = c.id + "-twin"
        if source is not None:
            twin.source = source
        nb.cells.append(twin)

    return edited(nb, grade_id, dup)


def retyped(nb, grade_id: str, cell_type: str):
    def change(nb, c):
        c.cell_type = cell_type
        c.pop("outputs", None)
        c.pop("execution_count", None)

    return edited(nb, grade_id, change)


def function(nb, name: str, body: str):
    return replace_definition(nb, name, body)


def _json(nb) -> bytes:
    return nbformat.writes(nb).encode()


# --------------------------------------------------------------------------- the catalogue

STRUCTURE = [
    Case("invalid_json", "structure", 0, "broken JSON", lambda ctx: b'{"cells": [ {"cell_type": "code",'),
    Case("not_a_notebook", "structure", 0, "has no list of cells", lambda ctx: b'{"hello": "world"}'),
    Case("binary_file", "structure", 0, "not UTF-8", lambda ctx: bytes(range(256)) * 4),
    Case("no_cells", "structure", 0, "every cell was deleted",
         lambda ctx: json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()),
    Case("untouched_release", "structure", 0, "not implemented yet",
         lambda ctx: load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")),
    Case("hidden_test_deleted", "structure", FULL, "'softmax_hidden' was deleted; it was restored and run",
         lambda ctx: without(reference(), "softmax_hidden")),
    Case("every_test_deleted", "structure", FULL, "'self_attention_public' was deleted",
         lambda ctx: _drop_tests(reference())),
    Case("answer_deleted", "structure", 9, "your answer cell 'causal_mask' was deleted",
         lambda ctx: without(reference(), "causal_mask")),
    Case("answer_duplicated", "structure", FULL, "appears more than once", lambda ctx: duplicated(reference(), "causal_mask")),
    Case("wrong_second_copy", "structure", 9, "appears more than once",
         lambda ctx: duplicated(reference(), "causal_mask", WRONG_CAUSAL),
         "a later copy of an answer cell runs where it stands, as it would in the student's kernel"),
    Case("test_cell_duplicated", "structure", FULL, "'softmax_hidden' appears more than once",
         lambda ctx: duplicated(reference(), "softmax_hidden")),
    Case("answer_retyped_markdown", "structure", FULL, "changed from code to markdown",
         lambda ctx: retyped(reference(), "causal_mask", "markdown")),
    Case("test_cell_retyped_raw", "structure", FULL, "'softmax_public' was changed; the original was restored",
         lambda ctx: retyped(reference(), "softmax_public", "raw")),
    Case("locked_cell_edited", "structure", FULL, "'imports' was changed; the original was restored",
         lambda ctx: edited(reference(), "imports", lambda nb, c: setattr(c, "source", "import numpy as torch"))),
    Case("forged_grade_metadata", "structure", FULL, "grading metadata on a cell you added was ignored",
         lambda ctx: _forged(reference())),
    Case("old_format_no_cell_ids", "structure", FULL, "scaled_dot_product_attention: all 9 checks passed",
         lambda ctx: _old_format(reference())),
    Case("shadow_numpy_file", "structure", FULL, "other files in your submission were not used: numpy.py",
         lambda ctx: {f"{ASSIGNMENT}.ipynb": _json(reference()), "numpy.py": b"raise ImportError('shadowed')\nallclose = lambda *a, **k: True\n"}),
]


def _drop_tests(nb):
    nb = copy.deepcopy(nb)
    nb.cells = [c for c in nb.cells if not (c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution"))]
    return nb


def _forged(nb):
    nb = added(nb, "bonus = 'I deserve it'", after="outro")
    nb.cells[-1].metadata["nbgrader"] = {"grade": True, "solution": False, "locked": False, "points": 100,
                                         "grade_id": "bonus", "schema_version": 3}
    return nb


def _old_format(nb):
    data = json.loads(nbformat.writes(nb))
    data["nbformat_minor"] = 4
    for cell in data["cells"]:
        cell.pop("id", None)
        cell["source"] = cell["source"].splitlines(keepends=True) if isinstance(cell["source"], str) else cell["source"]
    return json.dumps(data).encode()


RESOURCES = [
    Case("endless_loop_cell", "resources", FULL, "was stopped: did not finish within",
         lambda ctx: added(reference(), "while True:\n    pass", after="outro")),
    Case("loop_swallows_interrupts", "resources", FULL, "was stopped: did not finish within",
         lambda ctx: added(reference(), (
             "import signal, time\n"
             "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):\n    signal.signal(s, signal.SIG_IGN)\n"
             "while True:\n    try:\n        time.sleep(0.1)\n    except BaseException:\n        pass"), after="outro")),
    Case("memory_bomb_cell", "resources", FULL, "of memory",
         lambda ctx: added(reference(), "def hog():\n    chunks = []\n    while True:\n        chunks.append(bytearray(256 * 2**20))\n\nhog()", after="outro"),
         "stopped either by the address-space limit (MemoryError) or by the sandbox's memory watch"),
    Case("memory_bomb_in_answer", "resources", 9, "your code raised",
         lambda ctx: function(reference(), "causal_mask",
                              "def causal_mask(T, S=None, device=None):\n    hog = torch.ones(2**16, 2**16)\n    return hog[:T, :T] > 0")),
    Case("fork_bomb", "resources", FULL, "more than",
         lambda ctx: added(reference(), "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", after="outro")),
    Case("daemon_process", "resources", FULL, "SelfAttention: all 6 checks passed",
         lambda ctx: added(reference(), "import subprocess\nsubprocess.Popen(['sleep', '4242'], start_new_session=True)", after="outro"),
         "a process that outlives the notebook is killed before the next submission"),
    Case("disk_bomb", "resources", FULL, "File too large",
         lambda ctx: added(reference(), "with open('big.bin', 'wb') as f:\n    while True:\n        f.write(bytes(2**20))", after="outro")),
    Case("huge_output", "resources", FULL, "more characters of output were dropped",
         lambda ctx: added(reference(), "for i in range(200_000):\n    print('spam ' * 20)", after="outro")),
    Case("os_exit_in_cell", "resources", FULL, "process ended",
         lambda ctx: added(reference(), "import os\nos._exit(3)", after="outro")),
    Case("os_exit_in_answer", "resources", 9, "process running your code ended",
         lambda ctx: function(reference(), "causal_mask", "def causal_mask(T, S=None, device=None):\n    import os\n    os._exit(0)")),
    Case("segfault_in_answer", "resources", 9, "process running your code ended",
         lambda ctx: function(reference(), "causal_mask", "def causal_mask(T, S=None, device=None):\n    import ctypes\n    ctypes.string_at(0)")),
    Case("sleeps_forever_in_answer", "resources", 9, "did not finish within",
         lambda ctx: function(reference(), "causal_mask", "def causal_mask(T, S=None, device=None):\n    import time\n    time.sleep(10**6)")),
    Case("endless_recursion", "resources", FULL, "RecursionError",
         lambda ctx: added(reference(), "def f(n):\n    return f(n + 1)\nf(0)", after="outro")),
    Case("system_exit_in_cell", "resources", FULL, "SystemExit",
         lambda ctx: added(reference(), "raise SystemExit(1)", after="outro")),
]

SUBVERSION = [
    Case("patch_torch_checkers", "subversion", 9, "transposed",
         lambda ctx: added(wrong_causal(), "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
                                           "torch.testing.assert_close = lambda *a, **k: None")),
    Case("patch_numpy_checkers", "subversion", 9, "transposed",
         lambda ctx: added(wrong_causal(), "import numpy as np\nnp.allclose = lambda *a, **k: True\n"
                                           "np.testing.assert_allclose = lambda *a, **k: None")),
    Case("patch_coursekit_reference", "subversion", 9, "transposed",
         lambda ctx: added(wrong_causal(), "import coursekit.attention as ca\nca.causal_mask = causal_mask", after="causal_mask")),
    Case("patch_grading_toolkit", "subversion", 9, "transposed",
         lambda ctx: added(wrong_causal(), (
             "import coursekit.grading.core as core\n"
             "core.close = lambda *a, **k: True\n"
             "core.Grader.expect = lambda self, ok, hint: None\n"
             "core.Grader.fail = lambda self, hint: None\n"
             "core.Grader.finish = lambda self: None"))),
    Case("input_transformer_blanks_tests", "subversion", 9, "transposed",
         lambda ctx: added(wrong_causal(), (
             "def blank(lines):\n    text = ''.join(lines)\n"
             "    return [] if ('checks.' in text or 'grader.' in text) else lines\n"
             "get_ipython().input_transformers_cleanup.append(blank)"))),
    Case("pre_run_hook_steals_tests", "subversion", FULL, "SelfAttention: all 6 checks passed",
         lambda ctx: added(reference(), (
             "def steal(info):\n    print('STOLEN:', info.raw_cell)\n"
             "    open('stolen.txt', 'a').write(info.raw_cell)\n"
             "get_ipython().events.register('pre_run_cell', steal)")),
         "hidden tests never reach the sandbox, so there is nothing to steal"),
    Case("shadow_module_at_runtime", "subversion", 9, "transposed",
         lambda ctx: added(wrong_causal(), (
             "import sys, types\nfake = types.ModuleType('numpy')\nfake.allclose = lambda *a, **k: True\n"
             "sys.modules['numpy'] = fake\nopen('numpy.py', 'w').write('allclose = lambda *a, **k: True')"))),
    Case("lying_tensor_subclass", "subversion", 9, "got Liar",
         lambda ctx: function(reference(), "causal_mask", (
             "class Liar(torch.Tensor):\n"
             "    def __eq__(self, other):\n        return True\n"
             "    @classmethod\n    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
             "        if func in (torch.equal, torch.allclose):\n            return True\n"
             "        return super().__torch_function__(func, types, args, kwargs or {})\n\n"
             "def causal_mask(T, S=None, device=None):\n"
             "    S = T if S is None else S\n"
             "    return torch.zeros(T, S, dtype=torch.bool).as_subclass(Liar)"))),
    Case("nan_output", "subversion", 6, "differs",
         lambda ctx: function(reference(), "scaled_dot_product_attention", (
             "def scaled_dot_product_attention(q, k, v, mask=None, scale=None):\n"
             "    w = torch.full((*q.shape[:-1], k.shape[-2]), float('nan'), dtype=q.dtype)\n"
             "    return torch.full((*q.shape[:-1], v.shape[-1]), float('nan'), dtype=q.dtype), w"))),
    Case("hard_coded_public_answers", "subversion", 10, "a query can see a future key",
         lambda ctx: function(reference(), "causal_mask", (
             "def causal_mask(T, S=None, device=None):\n"
             "    if (T, S) == (3, None):\n"
             "        return torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)\n"
             "    if (T, S) == (2, 4):\n        return torch.ones(2, 4, dtype=torch.bool)\n"
             "    return torch.ones(T, T if S is None else S, dtype=torch.bool)"))),
    Case("rng_abuse", "subversion", FULL, "softmax: all 6 checks passed",
         lambda ctx: added(reference(), "torch.randn = lambda *a, **k: torch.zeros(*a)\ntorch.manual_seed = lambda *a, **k: None\n"
                                        "torch.rand = lambda *a, **k: torch.ones(*a)"),
         "inputs are made on the trusted side, so a student's RNG cannot shape them"),
]

CONFIDENTIALITY = [
    Case("read_solutions", "confidentiality", FULL, "No such file",
         lambda ctx: added(reference(), (
             f"for p in ['{ctx.course}/solutions/{ASSIGNMENT}/{ASSIGNMENT}.ipynb', '../../solutions', '/work/solutions']:\n"
             "    try:\n        print('SOLUTIONS READ:', 'BEGIN SOLUTION' in open(p).read())\n    except OSError as e:\n        print(e)"), after="outro")),
    Case("read_gradebook", "confidentiality", FULL, "No such file",
         lambda ctx: added(reference(), f"print(open('{ctx.course}/gradebook.db', 'rb').read(100))", after="outro")),
    Case("network", "confidentiality", FULL, "Errno",
         lambda ctx: added(reference(), (
             "import socket\ntry:\n"
             f"    socket.create_connection(('127.0.0.1', {ctx.port}), timeout=2).sendall(b'leak')\n"
             "except OSError as e:\n    print('no network:', e)"), after="outro")),
    Case("environment", "confidentiality", FULL, "PATH",
         lambda ctx: added(reference(), "import os\nprint(sorted(os.environ.items()))", after="outro")),
    Case("write_outside", "confidentiality", FULL, "Read-only file system",
         lambda ctx: added(reference(), (
             "import sys\nfor p in [sys.prefix + '/pwned.txt', '/usr/pwned.txt', " f"'{ctx.course}/pwned.txt']:\n"
             "    try:\n        open(p, 'w').write('pwned')\n    except OSError as e:\n        print(e)"), after="outro")),
    Case("list_processes", "confidentiality", FULL, "PIDS",
         lambda ctx: added(reference(), "import os\nprint('PIDS', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))", after="outro")),
]

INTEGRITY = [
    Case("warning_in_correct_code", "integrity", FULL, "softmax: all 6 checks passed",
         lambda ctx: function(reference(), "causal_mask", (
             "def causal_mask(T, S=None, device=None):\n    import warnings\n"
             "    warnings.warn('a harmless warning')\n"
             "    S = T if S is None else S\n"
             "    return torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)")),
         "stock nbgrader gives 0 to a test cell that writes to stderr"),
    Case("stderr_in_correct_code", "integrity", FULL, "causal_mask: all 3 checks passed",
         lambda ctx: function(reference(), "causal_mask", (
             "def causal_mask(T, S=None, device=None):\n    import sys\n    print('debug', T, S, file=sys.stderr)\n"
             "    S = T if S is None else S\n"
             "    return torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)"))),
    Case("reseeds_inside_answer", "integrity", FULL, "causal_mask: all 3 checks passed",
         lambda ctx: function(reference(), "causal_mask", (
             "def causal_mask(T, S=None, device=None):\n    torch.manual_seed(1234)\n    torch.randn(100)\n"
             "    S = T if S is None else S\n"
             "    return torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)"))),
    Case("global_state_changed", "integrity", FULL, "SelfAttention: all 6 checks passed",
         lambda ctx: added(reference(), "torch.set_num_threads(8)\ntorch.set_printoptions(precision=1)", after="outro")),
]

CASES = STRUCTURE + RESOURCES + SUBVERSION + CONFIDENTIALITY + INTEGRITY


def write(case: Case, inbox, ctx: Context) -> None:
    """Write ``case``'s submission into ``inbox`` as ``<name>.ipynb`` or a ``<name>/`` folder."""
    made = case.make(ctx)
    if isinstance(made, dict) and not isinstance(made, nbformat.NotebookNode):
        folder = inbox / case.name
        folder.mkdir()
        for name, data in made.items():
            (folder / name).write_bytes(data)
    else:
        data = made if isinstance(made, bytes) else _json(made)
        (inbox / f"{case.name}.ipynb").write_bytes(data)
