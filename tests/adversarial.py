"""Hostile and broken submissions of Exercise 1, each with the score and reason it must get.

Every case starts from the reference solution (all the autograded points, :data:`FULL`) and
breaks, attacks or abuses something. ``expected`` is the score the case deserves, worked out
from what the submission really computes, in terms of the parts' points as the notebook sets
them (:data:`PARTS`): ``scaled_dot_product_attention`` uses the student's ``softmax``,
``SelfAttention`` uses their ``scaled_dot_product_attention``; ``causal_mask`` stands alone,
so the subversion cases pair their attack with a wrong ``causal_mask`` (:data:`WITHOUT_MASK`:
the attack must not rescue it). ``reason`` is text
the student (or the instructor) must see: in the autograder's notes, a check's
hint, or an output of their own cells.

``tests/test_adversarial.py`` grades all of them in one batch;
``scripts/compare_nbgrader.py`` runs the same catalogue through plain nbgrader.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat

from coursekit.grading import harness
from tests.submissions import ROOT, filled, load, replace_definition

ASSIGNMENT = "ch01_attention"
#: each graded part's points (public and hidden test cells), and its hidden cell's, from the notebook
PARTS = {p.name: p.points for p in harness.parts(ASSIGNMENT)}
HIDDEN = {p.name: sum(t.points for t in p.tests if t.hidden) for p in harness.parts(ASSIGNMENT)}
FULL = sum(PARTS.values())  # every autograded point (the written answer is graded by hand)
WITHOUT_MASK = FULL - PARTS["causal_mask"]  # the subversion cases pair their attack with a wrong mask

#: a causal mask that lets every query see the future (the hidden checks call it transposed)
WRONG_CAUSAL = """
def causal_mask(T, S=None, device=None):
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool, device=device).triu(S - T)
"""


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


def daemon_seconds(ctx: Context) -> str:
    """The argument of the daemon case's ``sleep``: unique to this run (the listener's port), so a
    test can look for exactly this process and never mistake another run's for it."""
    return f"4242.{ctx.port}"


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
    Case(
        "no_cells",
        "structure",
        0,
        "every cell was deleted",
        lambda ctx: json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode(),
    ),
    Case(
        "untouched_release",
        "structure",
        0,
        f"Part 1: a stable softmax 0 / {PARTS['softmax']:g} not answered",
        lambda ctx: load(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"),
    ),
    Case(
        "hidden_test_deleted",
        "structure",
        FULL,
        "'softmax_hidden' was deleted; it was restored and run",
        lambda ctx: without(reference(), "softmax_hidden"),
    ),
    Case(
        "every_test_deleted",
        "structure",
        FULL,
        "'self_attention_public' was deleted",
        lambda ctx: _drop_tests(reference()),
    ),
    Case(
        "answer_deleted",
        "structure",
        WITHOUT_MASK,
        "your answer cell 'causal_mask' was deleted",
        lambda ctx: without(reference(), "causal_mask"),
    ),
    Case(
        "answer_duplicated",
        "structure",
        FULL,
        "appears more than once",
        lambda ctx: duplicated(reference(), "causal_mask"),
    ),
    Case(
        "wrong_second_copy",
        "structure",
        WITHOUT_MASK,
        "appears more than once",
        lambda ctx: duplicated(reference(), "causal_mask", WRONG_CAUSAL),
        "a later copy of an answer cell runs where it stands, as it would in the student's kernel",
    ),
    Case(
        "test_cell_duplicated",
        "structure",
        FULL,
        "'softmax_hidden' appears more than once",
        lambda ctx: duplicated(reference(), "softmax_hidden"),
    ),
    Case(
        "answer_retyped_markdown",
        "structure",
        FULL,
        "changed from code to markdown",
        lambda ctx: retyped(reference(), "causal_mask", "markdown"),
    ),
    Case(
        "test_cell_retyped_raw",
        "structure",
        FULL,
        "'softmax_public' was changed; the original was restored",
        lambda ctx: retyped(reference(), "softmax_public", "raw"),
    ),
    Case(
        "locked_cell_edited",
        "structure",
        FULL,
        "'imports' was changed; the original was restored",
        lambda ctx: edited(
            reference(), "imports", lambda nb, c: setattr(c, "source", "import numpy as torch")
        ),
    ),
    Case(
        "forged_grade_metadata",
        "structure",
        FULL,
        "grading metadata on a cell you added was ignored",
        lambda ctx: _forged(reference()),
    ),
    Case(
        "old_format_no_cell_ids",
        "structure",
        FULL,
        "Part 3: scaled dot-product attention {0:g} / {0:g} passed".format(
            PARTS["scaled_dot_product_attention"]
        ),
        lambda ctx: _old_format(reference()),
    ),
    Case(
        "shadow_numpy_file",
        "structure",
        FULL,
        "other files in your submission were not used: numpy.py",
        lambda ctx: {
            f"{ASSIGNMENT}.ipynb": _json(reference()),
            "numpy.py": b"raise ImportError('shadowed')\nallclose = lambda *a, **k: True\n",
        },
    ),
]


def _drop_tests(nb):
    nb = copy.deepcopy(nb)
    nb.cells = [
        c
        for c in nb.cells
        if not (c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution"))
    ]
    return nb


def _forged(nb):
    nb = added(nb, "bonus = 'I deserve it'", after="outro")
    nb.cells[-1].metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "locked": False,
        "points": 100,
        "grade_id": "bonus",
        "schema_version": 3,
    }
    return nb


def _old_format(nb):
    data = json.loads(nbformat.writes(nb))
    data["nbformat_minor"] = 4
    for cell in data["cells"]:
        cell.pop("id", None)
        cell["source"] = (
            cell["source"].splitlines(keepends=True) if isinstance(cell["source"], str) else cell["source"]
        )
    return json.dumps(data).encode()


RESOURCES = [
    Case(
        "endless_loop_cell",
        "resources",
        FULL,
        "was stopped: did not finish within",
        lambda ctx: added(reference(), "while True:\n    pass", after="outro"),
    ),
    Case(
        "loop_swallows_interrupts",
        "resources",
        FULL,
        "was stopped: did not finish within",
        lambda ctx: added(
            reference(),
            (
                "import signal, time\n"
                "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):\n    signal.signal(s, signal.SIG_IGN)\n"
                "while True:\n    try:\n        time.sleep(0.1)\n    except BaseException:\n        pass"
            ),
            after="outro",
        ),
    ),
    Case(
        "memory_bomb_cell",
        "resources",
        FULL,
        "of memory",
        lambda ctx: added(
            reference(),
            "def hog():\n    chunks = []\n    while True:\n        chunks.append(bytearray(256 * 2**20))\n\nhog()",
            after="outro",
        ),
        "stopped either by the address-space limit (MemoryError) or by the sandbox's memory watch",
    ),
    Case(
        "memory_bomb_in_answer",
        "resources",
        WITHOUT_MASK,
        "your code raised",
        lambda ctx: function(
            reference(),
            "causal_mask",
            "def causal_mask(T, S=None, device=None):\n    hog = torch.ones(2**16, 2**16)\n    return hog[:T, :T] > 0",
        ),
    ),
    Case(
        "fork_bomb",
        "resources",
        FULL,
        "more than",
        lambda ctx: added(
            reference(),
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
            after="outro",
        ),
    ),
    Case(
        "daemon_process",
        "resources",
        FULL,
        f"Part 4: a self-attention module {PARTS['SelfAttention']:g} / {PARTS['SelfAttention']:g} passed",
        lambda ctx: added(
            reference(),
            f"import subprocess\nsubprocess.Popen(['sleep', '{daemon_seconds(ctx)}'], start_new_session=True)",
            after="outro",
        ),
        "a process that outlives the notebook is killed before the next submission",
    ),
    Case(
        "disk_bomb",
        "resources",
        FULL,
        "File too large",
        lambda ctx: added(
            reference(),
            "with open('big.bin', 'wb') as f:\n    while True:\n        f.write(bytes(2**20))",
            after="outro",
        ),
    ),
    Case(
        "huge_output",
        "resources",
        FULL,
        "more characters of output were dropped",
        lambda ctx: added(reference(), "for i in range(200_000):\n    print('spam ' * 20)", after="outro"),
    ),
    Case(
        "os_exit_in_cell",
        "resources",
        FULL,
        "process ended",
        lambda ctx: added(reference(), "import os\nos._exit(3)", after="outro"),
    ),
    Case(
        "os_exit_in_answer",
        "resources",
        WITHOUT_MASK,
        "process running your code ended",
        lambda ctx: function(
            reference(),
            "causal_mask",
            "def causal_mask(T, S=None, device=None):\n    import os\n    os._exit(0)",
        ),
    ),
    Case(
        "segfault_in_answer",
        "resources",
        WITHOUT_MASK,
        "process running your code ended",
        lambda ctx: function(
            reference(),
            "causal_mask",
            "def causal_mask(T, S=None, device=None):\n    import ctypes\n    ctypes.string_at(0)",
        ),
    ),
    Case(
        "sleeps_forever_in_answer",
        "resources",
        WITHOUT_MASK,
        "s (a sleep, or waiting for something that never comes?)",  # a sleep is no endless loop
        lambda ctx: function(
            reference(),
            "causal_mask",
            "def causal_mask(T, S=None, device=None):\n    import time\n    time.sleep(10**6)",
        ),
    ),
    Case(
        "endless_recursion",
        "resources",
        FULL,
        "RecursionError",
        lambda ctx: added(reference(), "def f(n):\n    return f(n + 1)\nf(0)", after="outro"),
    ),
    Case(
        "system_exit_in_cell",
        "resources",
        FULL,
        "SystemExit",
        lambda ctx: added(reference(), "raise SystemExit(1)", after="outro"),
    ),
]

SUBVERSION = [
    Case(
        "patch_torch_checkers",
        "subversion",
        WITHOUT_MASK,
        "transposed",
        lambda ctx: added(
            wrong_causal(),
            "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
            "torch.testing.assert_close = lambda *a, **k: None",
        ),
    ),
    Case(
        "patch_numpy_checkers",
        "subversion",
        WITHOUT_MASK,
        "transposed",
        lambda ctx: added(
            wrong_causal(),
            "import numpy as np\nnp.allclose = lambda *a, **k: True\n"
            "np.testing.assert_allclose = lambda *a, **k: None",
        ),
    ),
    Case(
        "patch_coursekit_reference",
        "subversion",
        WITHOUT_MASK,
        "transposed",
        lambda ctx: added(
            wrong_causal(),
            "import coursekit.attention as ca\nca.causal_mask = causal_mask",
            after="causal_mask",
        ),
    ),
    Case(
        "patch_grading_toolkit",
        "subversion",
        WITHOUT_MASK,
        "transposed",
        lambda ctx: added(
            wrong_causal(),
            (
                "import coursekit.grading.core as core\n"
                "core.close = lambda *a, **k: True\n"
                "core.Grader.expect = lambda self, ok, hint: None\n"
                "core.Grader.fail = lambda self, hint: None\n"
                "core.Grader.finish = lambda self: None"
            ),
        ),
    ),
    Case(
        "input_transformer_blanks_tests",
        "subversion",
        WITHOUT_MASK,
        "transposed",
        lambda ctx: added(
            wrong_causal(),
            (
                "def blank(lines):\n    text = ''.join(lines)\n"
                "    return [] if ('checks.' in text or 'grader.' in text) else lines\n"
                "get_ipython().input_transformers_cleanup.append(blank)"
            ),
        ),
    ),
    Case(
        "pre_run_hook_steals_tests",
        "subversion",
        FULL,
        f"Part 4: a self-attention module {PARTS['SelfAttention']:g} / {PARTS['SelfAttention']:g} passed",
        lambda ctx: added(
            reference(),
            (
                "def steal(info):\n    print('STOLEN:', info.raw_cell)\n"
                "    open('stolen.txt', 'a').write(info.raw_cell)\n"
                "get_ipython().events.register('pre_run_cell', steal)"
            ),
        ),
        "hidden tests never reach the sandbox, so there is nothing to steal",
    ),
    Case(
        "shadow_module_at_runtime",
        "subversion",
        WITHOUT_MASK,
        "transposed",
        lambda ctx: added(
            wrong_causal(),
            (
                "import sys, types\nfake = types.ModuleType('numpy')\nfake.allclose = lambda *a, **k: True\n"
                "sys.modules['numpy'] = fake\nopen('numpy.py', 'w').write('allclose = lambda *a, **k: True')"
            ),
        ),
    ),
    Case(
        "lying_tensor_subclass",
        "subversion",
        WITHOUT_MASK,
        "got Liar",
        lambda ctx: function(
            reference(),
            "causal_mask",
            (
                "class Liar(torch.Tensor):\n"
                "    def __eq__(self, other):\n        return True\n"
                "    @classmethod\n    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
                "        if func in (torch.equal, torch.allclose):\n            return True\n"
                "        return super().__torch_function__(func, types, args, kwargs or {})\n\n"
                "def causal_mask(T, S=None, device=None):\n"
                "    S = T if S is None else S\n"
                "    return torch.zeros(T, S, dtype=torch.bool).as_subclass(Liar)"
            ),
        ),
    ),
    Case(
        "nan_output",
        "subversion",
        FULL - PARTS["scaled_dot_product_attention"] - PARTS["SelfAttention"],
        "differs",
        lambda ctx: function(
            reference(),
            "scaled_dot_product_attention",
            (
                "def scaled_dot_product_attention(q, k, v, mask=None, scale=None):\n"
                "    w = torch.full((*q.shape[:-1], k.shape[-2]), float('nan'), dtype=q.dtype)\n"
                "    return torch.full((*q.shape[:-1], v.shape[-1]), float('nan'), dtype=q.dtype), w"
            ),
        ),
    ),
    Case(
        "hard_coded_public_answers",
        "subversion",
        WITHOUT_MASK,
        "a query can see a future key",
        lambda ctx: function(
            reference(),
            "causal_mask",
            (
                "def causal_mask(T, S=None, device=None):\n"
                "    if (T, S) == (3, None):\n"
                "        return torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)\n"
                "    if (T, S) == (2, 4):\n        return torch.ones(2, 4, dtype=torch.bool)\n"
                "    return torch.ones(T, T if S is None else S, dtype=torch.bool)"
            ),
        ),
    ),
    Case(
        "rng_abuse",
        "subversion",
        FULL - PARTS["score_variance"],  # the student's own experiment draws from their broken torch.randn
        f"Part 1: a stable softmax {PARTS['softmax']:g} / {PARTS['softmax']:g} passed",
        lambda ctx: added(
            reference(),
            "torch.randn = lambda *a, **k: torch.zeros(*a)\ntorch.manual_seed = lambda *a, **k: None\n"
            "torch.rand = lambda *a, **k: torch.ones(*a)",
        ),
        "inputs are made on the trusted side, so a student's RNG cannot shape them",
    ),
]

CONFIDENTIALITY = [
    Case(
        "read_solutions",
        "confidentiality",
        FULL,
        "No such file",
        lambda ctx: added(
            reference(),
            (
                f"for p in ['{ctx.course}/solutions/{ASSIGNMENT}/{ASSIGNMENT}.ipynb', '../../solutions', '/work/solutions']:\n"  # noqa: E501
                "    try:\n        print('SOLUTIONS READ:', 'BEGIN SOLUTION' in open(p).read())\n    except OSError as e:\n        print(e)"  # noqa: E501
            ),
            after="outro",
        ),
    ),
    Case(
        "read_gradebook",
        "confidentiality",
        FULL,
        "No such file",
        lambda ctx: added(
            reference(), f"print(open('{ctx.course}/gradebook.db', 'rb').read(100))", after="outro"
        ),
    ),
    Case(
        "network",
        "confidentiality",
        FULL,
        "Errno",
        lambda ctx: added(
            reference(),
            (
                "import socket\ntry:\n"
                f"    socket.create_connection(('127.0.0.1', {ctx.port}), timeout=2).sendall(b'leak')\n"
                "except OSError as e:\n    print('no network:', e)"
            ),
            after="outro",
        ),
    ),
    Case(
        "environment",
        "confidentiality",
        FULL,
        "PATH",
        lambda ctx: added(reference(), "import os\nprint(sorted(os.environ.items()))", after="outro"),
    ),
    Case(
        "write_outside",
        "confidentiality",
        FULL,
        "Read-only file system",
        lambda ctx: added(
            reference(),
            (
                "import sys\nfor p in [sys.prefix + '/pwned.txt', '/usr/pwned.txt', "
                f"'{ctx.course}/pwned.txt']:\n"
                "    try:\n        open(p, 'w').write('pwned')\n    except OSError as e:\n        print(e)"
            ),
            after="outro",
        ),
    ),
    Case(
        "list_processes",
        "confidentiality",
        FULL,
        "PIDS",
        lambda ctx: added(
            reference(),
            "import os\nprint('PIDS', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
            after="outro",
        ),
    ),
]

INTEGRITY = [
    Case(
        "warning_in_correct_code",
        "integrity",
        FULL,
        f"Part 1: a stable softmax {PARTS['softmax']:g} / {PARTS['softmax']:g} passed",
        lambda ctx: function(
            reference(),
            "causal_mask",
            (
                "def causal_mask(T, S=None, device=None):\n    import warnings\n"
                "    warnings.warn('a harmless warning')\n"
                "    S = T if S is None else S\n"
                "    if not 0 <= T <= S:\n        raise ValueError(f'causal_mask needs 0 <= T <= S, got T={T} and S={S}')\n"  # noqa: E501
                "    return torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)"
            ),
        ),
        "stock nbgrader gives 0 to a test cell that writes to stderr",
    ),
    Case(
        "stderr_in_correct_code",
        "integrity",
        FULL,
        f"Part 2: the causal mask {PARTS['causal_mask']:g} / {PARTS['causal_mask']:g} passed",
        lambda ctx: function(
            reference(),
            "causal_mask",
            (
                "def causal_mask(T, S=None, device=None):\n    import sys\n    print('debug', T, S, file=sys.stderr)\n"
                "    S = T if S is None else S\n"
                "    if not 0 <= T <= S:\n        raise ValueError(f'causal_mask needs 0 <= T <= S, got T={T} and S={S}')\n"  # noqa: E501
                "    return torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)"
            ),
        ),
    ),
    Case(
        "reseeds_inside_answer",
        "integrity",
        FULL,
        f"Part 2: the causal mask {PARTS['causal_mask']:g} / {PARTS['causal_mask']:g} passed",
        lambda ctx: function(
            reference(),
            "causal_mask",
            (
                "def causal_mask(T, S=None, device=None):\n    torch.manual_seed(1234)\n    torch.randn(100)\n"
                "    S = T if S is None else S\n"
                "    if not 0 <= T <= S:\n        raise ValueError(f'causal_mask needs 0 <= T <= S, got T={T} and S={S}')\n"  # noqa: E501
                "    return torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)"
            ),
        ),
    ),
    Case(
        "global_state_changed",
        "integrity",
        FULL,
        f"Part 4: a self-attention module {PARTS['SelfAttention']:g} / {PARTS['SelfAttention']:g} passed",
        lambda ctx: added(
            reference(), "torch.set_num_threads(8)\ntorch.set_printoptions(precision=1)", after="outro"
        ),
    ),
]

#: Student content that would run in the browser of whoever opens the feedback or the
#: formgrader: each attack sets ``window.pwned``, changes the title or fetches from the test's
#: listener if it ever runs (``tests/test_adversarial.py`` checks the pages in Chromium).
ATTACK = "document.title=`pwned`;window.pwned=1"  # no quotes: it nests in any string
MARKUP = [
    Case(
        "html_output_with_script",
        "markup",
        FULL,
        "kept text",
        lambda ctx: added(
            reference(),
            (
                "from IPython.display import HTML, display\n"
                f'display(HTML("<b>kept text</b><script>{ATTACK}</script><img src=x onerror=\\"{ATTACK}\\">"\n'
                f"             \"<iframe srcdoc='<script>parent.pwned=1</script>'></iframe>\"\n"
                f"             \"<img src='http://127.0.0.1:{ctx.port}/html-output'>\"))"
            ),
            after="outro",
        ),
    ),
    Case(
        "javascript_output",
        "markup",
        FULL,
        "application/javascript output of this cell was not shown",
        lambda ctx: added(
            reference(),
            f'from IPython.display import Javascript, display\ndisplay(Javascript("{ATTACK}"))',
            after="outro",
        ),
    ),
    Case(
        "svg_output",
        "markup",
        FULL,
        "image/svg+xml output of this cell was not shown",
        lambda ctx: added(
            reference(),
            (
                "from IPython.display import SVG, display\n"
                f"display(SVG(\"<svg xmlns='http://www.w3.org/2000/svg' onload=\\\"{ATTACK}\\\"><circle r='4'/></svg>\"))"  # noqa: E501
            ),
            after="outro",
        ),
    ),
    Case(
        "image_metadata_injection",
        "markup",
        FULL,
        "the picture ran",
        lambda ctx: added(
            reference(),
            (
                "from IPython.display import publish_display_data\nimport base64\n"
                "png = base64.b64encode(bytes.fromhex('89504e470d0a1a0a0000000d4948445200000001000000010806000000'\n"
                "    '1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082')).decode()\n"
                f"publish_display_data({{'image/png': png, 'text/plain': 'a picture'}}, metadata={{'image/png': "
                f"{{'width': '1 onerror=\\\"{ATTACK}\\\"'}}}})\nprint('the picture ran')"
            ),
            after="outro",
        ),
    ),
    Case(
        "markdown_cell_with_html",
        "markup",
        FULL,
        "held HTML or a remote image; it is shown as text",
        lambda ctx: _markdown_added(
            reference(),
            (
                f'My answer.<script>{ATTACK}</script>\n\n<img src=x onerror="{ATTACK}">\n\n'
                f'<iframe srcdoc="<script>parent.pwned=1</script>"></iframe>\n\n[click](javascript:{ATTACK})'
            ),
        ),
    ),
    Case(
        "markdown_remote_image",
        "markup",
        FULL,
        "held HTML or a remote image; it is shown as text",
        lambda ctx: _markdown_added(
            reference(), f"A beacon: ![beacon](http://127.0.0.1:{ctx.port}/markdown-image)"
        ),
    ),
    Case(
        "malformed_outputs",
        "markup",
        FULL,
        "was malformed and was not kept",
        lambda ctx: added(
            reference(),
            (
                "ip = get_ipython()\n"
                "ip._outputs.append({'output_type': 'stream', 'name': 'evil', 'text': 3})\n"
                "ip._outputs.append({'output_type': 'display_data', 'data': {'text/plain': ['a', 1]}, 'metadata': []})\n"  # noqa: E501
                "ip._outputs.append({'output_type': 'execute_result', 'execution_count': 'seven', 'data': {}, 'metadata': {}})\n"  # noqa: E501
                "ip._outputs.append('not even a dict')\nprint('still here')"
            ),
            after="outro",
        ),
        "stock nbgrader (and coursekit before) failed validating such a notebook: the student was left ungraded",
    ),
    Case(
        "markup_in_a_file_name",
        "markup",
        FULL,
        "other files in your submission were not used",
        lambda ctx: {f"{ASSIGNMENT}.ipynb": _json(reference()), f'<img src=x onerror="{ATTACK}">.txt': b"hi"},
        "the autograder's notes quote file names as literal text",
    ),
]


def _markdown_added(nb, text: str):
    nb = copy.deepcopy(nb)
    i = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "outro")
    nb.cells.insert(i + 1, nbformat.v4.new_markdown_cell(text))
    return nb


#: The autograder itself as the target: the sandbox's template process, the replies, the seeds.
GRADER = [
    Case(
        "sigstop_the_sandbox",
        "grader",
        FULL,
        "did your code signal a process it did not start",
        lambda ctx: added(
            reference(), "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)", after="outro"
        ),
        "the stopped template is killed after its deadline and replaced: the next student is graded as usual",
    ),
    Case(
        "kill_the_sandbox",
        "grader",
        FULL,
        "did your code signal a process it did not start",
        lambda ctx: added(
            reference(), "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", after="outro"
        ),
        "the note names the student's code, not the sandbox; their cells run again in a fresh sandbox",
    ),
    Case(
        "compressed_reply_bomb",
        "grader",
        WITHOUT_MASK,
        "exceeds the limit",
        lambda ctx: function(
            added(reference(), "import numpy as np\nnp.savez = np.savez_compressed", after="imports"),
            "causal_mask",
            (
                "def causal_mask(T, S=None, device=None):\n"
                "    return torch.zeros(4096, 4096, dtype=torch.float64)  # 128 MiB that would compress to 130 KB"
            ),
        ),
        "swapping np.savez changes nothing (the sandbox holds its own reference); the answer is over the cap, "
        "which is checked before it is read",
    ),
    Case(
        "reply_channel_compressed",
        "grader",
        PARTS["predict_leaked_pairs"]
        + PARTS["predict_score_variance"]
        + PARTS["predict_sequential_steps"]
        + PARTS["score_variance"],
        "compressed arrays are not accepted",
        lambda ctx: added(
            reference(),
            "import numpy as np\nimport coursekit.sandbox.protocol as wire\n"
            "wire._savez = np.savez_compressed",
            after="imports",
        ),
        "every answer holding a tensor then arrives compressed and is refused unread: only the parts whose "
        "answers are plain numbers (the predictions, the experiment's variance) can be graded",
    ),
    Case(
        "zero_weights_ignore_the_input",
        "grader",
        FULL - PARTS["SelfAttention"],
        "with weights of ours: the attention weights differ",
        lambda ctx: function(reference(), "SelfAttention", ZERO_SELF_ATTENTION),
        "right only for its own all-zero weights: the graders load weights of their own",
    ),
    Case(
        "lookup_table_of_hidden_inputs",
        "grader",
        FULL - HIDDEN["softmax"],
        f"Part 1: a stable softmax {PARTS['softmax'] - HIDDEN['softmax']:g} / {PARTS['softmax']:g} failed",
        lambda ctx: function(
            function(reference(), "scaled_dot_product_attention", TORCH_SOFTMAX_ATTENTION),
            "softmax",
            LOOKUP_SOFTMAX,
        ),
        "right only on the inputs the grading source would make without the course's secret",
    ),
    Case(
        "timestamp_in_the_folder",
        "grader",
        FULL,
        "timestamp.txt",
        lambda ctx: {f"{ASSIGNMENT}.ipynb": _json(reference()), "timestamp.txt": b"2000-01-01 00:00:00"},
        "the submission time comes from the instructor's side, never from the student's folder",
    ),
    Case(
        "unparseable_timestamp",
        "grader",
        FULL,
        "timestamp.txt",
        lambda ctx: {
            f"{ASSIGNMENT}.ipynb": _json(reference()),
            "timestamp.txt": b"the day before the deadline",
        },
        "collect used to copy it, and nbgrader then failed for that student: an on-time correct notebook showed 0",
    ),
]

ZERO_SELF_ATTENTION = """
class SelfAttention(nn.Module):
    def __init__(self, d_model, d_head=None, bias=True):
        super().__init__()
        d_head = d_model if d_head is None else d_head
        self.q_proj = nn.Linear(d_model, d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, d_head, bias=bias)
        for p in self.parameters():
            nn.init.zeros_(p)

    def forward(self, x, mask=None):
        B, T, _ = x.shape
        allowed = torch.ones(T, T, dtype=torch.bool) if mask is None else mask.to(torch.bool).expand(B, T, T)
        w = allowed.to(x.dtype) / allowed.sum(-1, keepdim=True).clamp(min=1)
        w = w.expand(B, T, T)
        return torch.zeros(B, T, self.v_proj.out_features, dtype=x.dtype), w
"""

TORCH_SOFTMAX_ATTENTION = """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v, weights
"""

#: the inputs check_softmax and grade_softmax make without the course's secret, recorded by running
#: them in the notebook; right on those, uniform everywhere else
LOOKUP_SOFTMAX = """
from coursekit.attention import softmax as _answer
from coursekit.grading import ch01_attention as _graders

_TABLE = []

def _record(x, dim=-1):
    _TABLE.append((x.clone(), dim))
    return _answer(x, dim)

for _grader in (_graders.check_softmax, _graders.grade_softmax):
    try:
        _grader(_record)
    except AssertionError:
        pass

def softmax(x, dim=-1):
    for known, known_dim in _TABLE:
        if known_dim == dim and known.shape == x.shape and known.dtype == x.dtype and torch.equal(known, x):
            return _answer(x, dim)
    return torch.full_like(x, 1.0 / x.shape[dim])
"""

CASES = STRUCTURE + RESOURCES + SUBVERSION + CONFIDENTIALITY + INTEGRITY + MARKUP + GRADER


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


# --------------------------------------------------------------------------- the inbox and the instructor


@dataclass(frozen=True)
class InboxCase:
    """An entry of the inbox (written by students' tools, or by an instructor's mistake).

    ``expected`` is the score of ``student``, or ``None`` when the entry must not be collected;
    ``reason`` is text of the CLI's ``NOT COLLECTED`` line (for ``None``) or of the student's
    feedback.
    """

    name: str
    expected: float | None
    reason: str
    make: Callable[[Path, Path], None]  # (inbox, course folder) -> writes the entry
    student: str = ""
    doc: str = ""


def _nb(path: Path, nb) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_json(nb))


NB = f"{ASSIGNMENT}.ipynb"
INBOX = [
    InboxCase(
        "link_to_the_solutions",
        None,
        "symbolic link",
        lambda inbox, root: (inbox / "mallory.ipynb").symlink_to(root / "solutions" / ASSIGNMENT / NB),
        student="mallory",
        doc="followed, it scored 12/12 and showed the solution in the feedback",
    ),
    InboxCase(
        "link_to_a_classmate",
        None,
        "symbolic link",
        lambda inbox, root: (inbox / "trudy").symlink_to(inbox / "victim"),
        student="trudy",
    ),
    InboxCase(
        "the_classmate",
        FULL,
        "",
        lambda inbox, root: _nb(inbox / "victim" / NB, reference()),
        student="victim",
    ),
    InboxCase(
        "link_inside_a_folder",
        0,
        "links are not followed",
        lambda inbox, root: (
            (inbox / "oscar").mkdir()
            or (inbox / "oscar" / NB).symlink_to(root / "solutions" / ASSIGNMENT / NB)
        ),
        student="oscar",
        doc="the link is not followed: the folder holds no notebook",
    ),
    InboxCase(
        "an_old_copy_in_a_subfolder",
        FULL,
        "also in your folder, not graded",
        lambda inbox, root: (
            _nb(inbox / "alice" / NB, reference()),
            _nb(inbox / "alice" / "old" / NB, wrong_causal()),
        ),
        student="alice",
        doc="the notebook at the top of the folder wins, with a note; it used to be the nested one",
    ),
    InboxCase(
        "notebook_and_folder",
        None,
        "bob",
        lambda inbox, root: (_nb(inbox / "bob.ipynb", reference()), _nb(inbox / "bob" / NB, reference())),
        student="bob",
    ),
    InboxCase(
        "renamed_next_to_clutter",
        FULL,
        "was graded as",
        lambda inbox, root: (
            _nb(inbox / "carol" / "my attempt.ipynb", reference()),
            _nb(inbox / "carol" / ".ipynb_checkpoints" / "my attempt-checkpoint.ipynb", wrong_causal()),
            (inbox / "carol" / "._my attempt.ipynb").write_bytes(b"\x00\x05\x16\x07 AppleDouble"),
        ),
        student="carol",
        doc="it scored 0 as not submitted",
    ),
    InboxCase(
        "two_candidates",
        None,
        "keep one",
        lambda inbox, root: (
            _nb(inbox / "dave" / "a.ipynb", reference()),
            _nb(inbox / "dave" / "b.ipynb", reference()),
        ),
        student="dave",
    ),
    InboxCase(
        "system_entries_at_the_top",
        FULL,
        "",
        lambda inbox, root: (
            (inbox / ".DS_Store").write_bytes(b"\x00"),
            _nb(inbox / "__MACOSX" / "._x.ipynb", reference()),
            _nb(inbox / ".ipynb_checkpoints" / "erin-checkpoint.ipynb", reference()),
            _nb(inbox / "erin.ipynb", reference()),
        ),
        student="erin",
        doc="each of these refused the whole batch",
    ),
    InboxCase(
        "a_space_in_the_name",
        None,
        "student ids are",
        lambda inbox, root: _nb(inbox / "Alice Smith.ipynb", reference()),
    ),
    InboxCase(
        "an_accent_in_the_name",
        None,
        "student ids are",
        lambda inbox, root: _nb(inbox / "élodie.ipynb", reference()),
    ),
    InboxCase(
        "a_very_long_name",
        None,
        "student ids are",
        lambda inbox, root: _nb(inbox / f"{'x' * 120}.ipynb", reference()),
    ),
    InboxCase(
        "escape_sequence_in_the_name",
        None,
        "\\x1b[31m",
        lambda inbox, root: _nb(inbox / "eve\x1b[31mred.ipynb", reference()),
        doc="the raw sequence reached the terminal; it is printed escaped",
    ),
    InboxCase(
        "an_archive",
        None,
        "unzip",
        lambda inbox, root: (inbox / "frank.zip").write_bytes(b"PK\x05\x06" + bytes(18)),
    ),
]
