"""The sandbox's wire format and both kinds of sandbox (bubblewrap, and rlimit: named only, confined)."""

from __future__ import annotations

import io
import math
import re
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from coursekit.sandbox import Limits, RemoteTimeout, StudentRaised, Worker, bubblewrap_works, protocol


def roundtrip(value):
    arrays: dict = {}
    header = protocol.encode(value, arrays)
    a, b = socket.socketpair()
    with a, b:
        protocol.send(a, {"v": header}, arrays)
        got, out, _ = protocol.recv(b, time.monotonic() + 5)
    return protocol.decode(got["v"], out)


def test_values_cross_as_data_and_come_back_equal():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    value = {
        "tensor": x,
        "bool": torch.tensor([True, False]),
        "bf16": torch.ones(2, dtype=torch.bfloat16),
        "array": np.arange(6).reshape(2, 3),
        "scalar": np.float32(1.5),
        (1, "a"): [None, True, 3, 2**70, -math.inf, "s", b"\x00\xff"],
        "set": {1, 2},
        "size": torch.Size([2, 3]),
        "dtype": torch.float16,
        "slice": slice(1, None, 2),
    }
    back = roundtrip(value)
    assert (
        torch.equal(back["tensor"], x.detach())
        and back["tensor"].dtype == torch.float64
        and back["tensor"].requires_grad
    )
    assert type(back["tensor"]) is torch.Tensor
    assert back["bool"].dtype == torch.bool and back["bf16"].dtype == torch.bfloat16
    assert np.array_equal(back["array"], value["array"]) and back["scalar"] == np.float32(1.5)
    assert back[(1, "a")] == value[(1, "a")]
    assert back["set"] == {1, 2} and back["size"] == torch.Size([2, 3]) and back["dtype"] is torch.float16
    assert back["slice"] == slice(1, None, 2)


def test_dict_subclasses_arrive_as_plain_dicts_of_their_real_items():
    from collections import Counter, OrderedDict, defaultdict

    class Liar(dict):
        def items(self):
            return iter([("forged", 1)])

    for value in (
        Counter({(1, 2): 3}),
        defaultdict(int, {(1, 2): 3}),
        OrderedDict({(1, 2): 3}),
        Liar({(1, 2): 3}),
    ):
        back = roundtrip(value)
        assert type(back) is dict and back == {(1, 2): 3}


@pytest.mark.parametrize(
    "name, base", [("KeyError", KeyError), ("UnicodeDecodeError", UnicodeDecodeError), ("OSError", OSError)]
)
def test_a_student_exception_can_be_caught_as_its_builtin_type(name, base):
    from coursekit.sandbox.host import StudentRaised, _raised_class

    error = _raised_class(name)(name, "message", "line 3")
    assert isinstance(error, base) and isinstance(error, StudentRaised)
    assert str(error) == f"your code raised {name}: message (at line 3)"


def test_objects_that_are_not_data_need_a_handle():
    class Liar(torch.Tensor):
        pass

    with pytest.raises(TypeError, match="cannot send"):
        protocol.encode(torch.zeros(2).as_subclass(Liar), {})
    assert protocol.encode(torch.nn.Linear(2, 2), {}, handle=lambda obj: {"$h": 1}) == {"$h": 1}


@pytest.mark.parametrize(
    "header, arrays, match",
    [
        ({"$t": "a0", "dtype": "float32"}, {"a0": np.zeros(2, dtype=np.float64)}, "claims dtype"),
        ({"$t": "a9", "dtype": "float32"}, {}, "missing array"),
        ({"$evil": 1}, {}, "unknown tag"),
        ({"$t": "a0", "dtype": "object"}, {"a0": np.zeros(1)}, "unknown dtype"),
        ({"$f": "1e999"}, {}, "bad float"),
    ],
)
def test_malformed_values_are_rejected(header, arrays, match):
    with pytest.raises(protocol.ProtocolError, match=match):
        protocol.decode(header, arrays)


def test_deep_nesting_is_rejected():
    value = []
    for _ in range(protocol.MAX_DEPTH + 5):
        value = [value]
    with pytest.raises(protocol.ProtocolError, match="nested"):
        protocol.decode(value, {})


def test_frames_are_checked_before_they_are_trusted():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"EVIL" + bytes(12))
        with pytest.raises(protocol.ProtocolError, match="not a coursekit frame"):
            protocol.recv(b, time.monotonic() + 5)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">4sIQ", b"CKIT", 2, 10**12))
        with pytest.raises(protocol.ProtocolError, match="exceeds the limit"):
            protocol.recv(b, time.monotonic() + 5)
    a, b = socket.socketpair()
    with a, b:  # a pickled object array is refused: allow_pickle=False
        buf = io.BytesIO()
        np.savez(buf, a0=np.array([object()], dtype=object))
        blob, head = buf.getvalue(), b"{}"
        a.sendall(struct.pack(">4sIQ", b"CKIT", len(head), len(blob)) + head + blob)
        with pytest.raises(protocol.ProtocolError, match="malformed array archive"):
            protocol.recv(b, time.monotonic() + 5)
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(protocol.TimedOut):
            protocol.recv(b, time.monotonic() + 0.2)
        a.close()
        with pytest.raises(protocol.Closed):
            protocol.recv(b, time.monotonic() + 1)


KINDS = ["rlimit"] + (["bwrap"] if bubblewrap_works() else [])


@pytest.fixture(scope="module")
def sandbox():
    """``sandbox(kind)``: one sandbox of each kind for the tests of this file that neither harm its
    template nor read totals of its whole life. Each test's notebook is a fresh process forked from the
    template with the test's own limits, as each student of a class is (starting a sandbox costs about
    3.5 CPU-seconds: the suite started 21 of them here). One a test left unhealthy is replaced."""
    started: dict[str, Worker] = {}

    def get(kind: str) -> Worker:
        if kind == "bwrap" and not bubblewrap_works():
            pytest.skip("bubblewrap is not available here")
        worker = started.get(kind)
        if worker is None:
            worker = started[kind] = Worker(kind, Limits(), preload=("coursekit.attention",))
        elif not worker.healthy():
            worker.restart()
        return worker

    yield get
    for worker in started.values():
        worker.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_worker_runs_cells_and_checks(kind, sandbox):
    worker = sandbox(kind)
    limits = Limits(cell_seconds=3, check_seconds=2)
    session = worker.session(limits=limits)
    deadline = time.monotonic() + 60
    reply = session.run_cell(
        "import os, torch\nprint(sorted(os.environ))\ndef double(x):\n    return 2 * x", "setup", deadline
    )
    assert (
        reply["ok"]
        and "HOME" in reply["outputs"][0]["text"]
        and "COURSEKIT" not in reply["outputs"][0]["text"]
    )
    session.begin_check("double")
    assert torch.equal(session.remote("double")(torch.ones(3)), torch.full((3,), 2.0))
    with pytest.raises(StudentRaised, match="NameError"):
        session.remote("missing")(1)
    session.end_check()
    session.run_cell("def spin(x):\n    while True:\n        pass", "spin", deadline)
    session.begin_check("spin")
    with pytest.raises(RemoteTimeout, match="did not finish within 2 s"):
        session.remote("spin")(1)
    session.end_check()
    session.begin_check("after a timeout, the next check still works")
    assert session.remote("double")(21) == 42
    session.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_counts_the_cpu_seconds_of_its_processes(kind):
    """What the class benchmark adds to its own CPU time: a notebook's cell and a check process
    forked from it, both computing. Where bubblewrap hides them (a PID namespace), the host's usage
    of its children never sees those seconds."""
    import resource

    def children() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    spin = (
        "import time\ndef spin(s):\n    t = time.process_time()\n"
        "    while time.process_time() - t < s:\n        pass"
    )
    reaped = children()
    with Worker(kind, Limits(cell_seconds=5, check_seconds=5)) as worker:
        session = worker.session()
        before = worker.cpu_seconds()
        session.run_cell(spin + "\nspin(0.6)", "spin", time.monotonic() + 30)
        session.begin_check("spin")
        session.remote("spin")(0.6)
        session.end_check()
        used = worker.cpu_seconds() - before
        assert 1.1 <= used < 3.0, used  # 1.2 s, in clock ticks
        session.close()
    assert worker.cpu_seconds() == 0.0  # stopped: nothing left to read
    if kind == "bwrap":  # stopped and reaped, and still none of it reached this process
        assert children() - reaped < 0.5
    else:  # the template was this process's own child: its seconds arrive when it is reaped
        assert children() - reaped >= 1.2


@pytest.mark.slow
def test_bubblewrap_hides_the_course_and_the_network(sandbox):
    if not bubblewrap_works():
        pytest.skip("bubblewrap is not available here")
    worker = sandbox("bwrap")
    limits = Limits(cell_seconds=5)
    session = worker.session(limits=limits)
    code = (
        "import os, socket, coursekit\n"
        "print(sorted(os.listdir('/')), os.path.exists(" + repr(str(Path_root())) + "), coursekit.__file__)\n"
        "try:\n    socket.create_connection(('1.1.1.1', 80), timeout=1)\nexcept OSError as e:\n    print('offline', e.errno)"  # noqa: E501
    )
    out = session.run_cell(code, "probe", time.monotonic() + 30)["outputs"][0]["text"]
    assert "False" in out and "/opt/coursekit/coursekit" in out and "offline" in out
    assert "work" not in out.split("]")[0]
    session.close()


@pytest.mark.slow  # starts a bubblewrap sandbox
def test_bubblewrap_shows_the_committed_checkpoints_read_only(sandbox):
    """The notebooks' experiment tables load the committed checkpoints (ch07's gpt-char, ch08's
    seq2seq-numbers) inside the sandbox: there, and only to read."""
    if not bubblewrap_works():
        pytest.skip("bubblewrap is not available here")
    from coursekit import checkpoints

    name = sorted(checkpoints.REGISTRY)[0]
    (weights, *_) = checkpoints.files(name)
    worker = sandbox("bwrap")
    out = _probe_file(worker, f"from coursekit import checkpoints\npath = checkpoints.files({name!r})[0]")
    assert f"/opt/coursekit/checkpoints/{weights.name} {weights.stat().st_size}" in out
    assert "read-only" in out


def _probe_file(worker: Worker, setup: str) -> str:
    """What a cell prints that runs ``setup`` (which sets ``path``), then prints the path and the file's size
    and tries to open it for appending ("read-only" and the error number where it cannot)."""
    session = worker.session()
    code = (
        f"{setup}\n"
        "print(path, path.stat().st_size)\n"
        "try:\n    open(path, 'ab')\nexcept OSError as e:\n    print('read-only', e.errno)"
    )
    reply = session.run_cell(code, "probe", time.monotonic() + 60)
    session.close()
    return reply["outputs"][0]["text"]


@pytest.mark.slow  # starts a bubblewrap sandbox
def test_bubblewrap_reads_matplotlibs_font_list_instead_of_building_it(sandbox):
    """matplotlib ignores a font list in a folder it cannot write and scans every font file again
    (about 0.2 s of CPU in each sandbox): the host's list is read-only inside a writable folder."""
    if not bubblewrap_works():
        pytest.skip("bubblewrap is not available here")
    import matplotlib
    import matplotlib.font_manager  # noqa: F401  (writes the host's font list if it is missing)

    fontlist = next(Path(matplotlib.get_cachedir()).glob("fontlist-v*.json"))
    worker = sandbox("bwrap")
    setup = f"import matplotlib, pathlib\npath = pathlib.Path(matplotlib.get_cachedir(), {fontlist.name!r})"
    out = _probe_file(worker, setup)
    log = Path(worker._host_dir, "worker.log").read_text()
    assert f"/tmp/matplotlib/{fontlist.name} {fontlist.stat().st_size}" in out
    assert "read-only" in out
    assert "created a temporary cache directory" not in log, log[-2000:]


def Path_root():
    from tests.submissions import ROOT

    return ROOT


def test_compressed_or_oversized_arrays_are_refused_before_they_are_inflated():
    """A reply of a few kilobytes must not become gigabytes on the trusted side."""
    buf = io.BytesIO()
    np.savez_compressed(buf, a0=np.zeros((2048, 2048)))  # 32 MiB of zeros in about 30 KB
    assert len(buf.getvalue()) < 1 << 20
    with pytest.raises(protocol.ProtocolError, match="compressed arrays are not accepted"):
        protocol.read_arrays(buf.getvalue())
    # a header that claims more data than the member holds is refused before any allocation
    good = io.BytesIO()
    np.savez(good, a0=np.arange(4.0))
    forged = good.getvalue().replace(b"(4,)", b"(9999999999,)".ljust(4)[:4])  # same length: "(999"
    with pytest.raises(protocol.ProtocolError, match="malformed array archive"):
        protocol.read_arrays(forged)
    assert np.array_equal(protocol.read_arrays(good.getvalue())["a0"], np.arange(4.0))
    fortran = io.BytesIO()
    np.savez(fortran, a0=np.asfortranarray(np.arange(6.0).reshape(2, 3)))
    assert np.array_equal(protocol.read_arrays(fortran.getvalue())["a0"], np.arange(6.0).reshape(2, 3))
    a, b = socket.socketpair()
    with a, b:  # a frame over the cap is refused from its prefix, before it is read
        a.sendall(struct.pack(">4sIQ", b"CKIT", 2, protocol.REPLY_BLOB + 1))
        with pytest.raises(protocol.ProtocolError, match="exceeds the limit"):
            protocol.recv(b, time.monotonic() + 5, max_blob=protocol.REPLY_BLOB)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("signal_name", ["SIGSTOP", "SIGKILL"])
def test_a_template_stopped_or_killed_by_student_code_is_detected_and_replaced(kind, signal_name):
    """The cell that harmed the sandbox fails with a reason naming the student's code (its
    process sees its parent stopped or gone); the sandbox is replaced before it is used again."""
    from coursekit.sandbox import CellFailed
    from coursekit.sandbox.host import TEMPLATE_GONE

    with Worker(kind, Limits(cell_seconds=5, check_seconds=2)) as worker:
        worker.COMMAND_SECONDS = 2.0
        session = worker.session()
        code = f"import os, signal\nos.kill(os.getppid(), signal.{signal_name})"
        with pytest.raises(CellFailed) as failed:
            session.run_cell(code, "attack", time.monotonic() + 60)
        assert str(failed.value) == TEMPLATE_GONE and worker.broken
        assert worker.late_replies == 0  # a stopped template is not waited for longer
        assert not worker.healthy(timeout=1.0)
        assert worker.reset_after_student() == TEMPLATE_GONE
        session.close()
        worker.restart()
        assert worker.healthy()
        fresh = worker.session()
        assert fresh.run_cell("print(6 * 7)", "after", time.monotonic() + 30)["outputs"][0]["text"] == "42\n"
        fresh.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_template_late_to_end_a_fork_bomb_is_waited_for_not_blamed(kind, monkeypatch):
    """With every core taken, the template can take longer than a command's deadline to end a fork
    bomb's processes. It still runs, so it is waited for: the student reads the sandbox's reason (too
    many processes), not that their code stopped the sandbox, and the late answer is read as the
    reset's, so the next commands get their own. The load is made certain by a deadline of zero for
    the reset (this side only): no template answers before it."""
    from coursekit.sandbox import CellFailed

    with Worker(kind, Limits(cell_seconds=10, processes=16)) as worker:
        session = worker.session()
        monkeypatch.setattr(protocol, "KILL_SECONDS", 0.0)
        monkeypatch.setattr(worker, "COMMAND_SECONDS", 0.0)
        bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
        with pytest.raises(CellFailed) as failed:
            session.run_cell(bomb, "bomb", time.monotonic() + 60)
        # counted over the limit, or seen multiplying before they were (the memory watch, see below)
        from coursekit.sandbox.worker import PSS_PROCESSES

        assert str(failed.value) == "it started more than 16 processes" or str(failed.value).startswith(
            f"it started more than {PSS_PROCESSES} processes at once ("
        )
        assert worker.late_replies >= 1 and not worker.broken  # the reset, and any command while it ran
        monkeypatch.undo()
        assert worker.healthy()
        fresh = worker.session()
        assert fresh.run_cell("print(6 * 7)", "after", time.monotonic() + 30)["outputs"][0]["text"] == "42\n"
        fresh.close()


def test_only_a_pid_namespace_of_its_own_lets_the_template_signal_every_process():
    """``kill(-1)`` ends every process the caller may signal: the sandbox uses it only where it has a
    PID namespace of its own, checked in the sandbox, not taken from its command line."""
    import os

    from coursekit.sandbox.worker import in_own_pid_namespace

    assert not in_own_pid_namespace(os.readlink("/proc/self/ns/pid"))
    assert in_own_pid_namespace("pid:[1]")


def test_host_folders_of_ended_runs_are_swept_and_no_other(tmp_path):
    """A run killed with SIGKILL cannot remove its worker's host folder; the next worker removes the
    folders whose owner process has ended, and only those: a live run's folder, one whose owner file
    is not written yet, and anything that is not such a folder stay."""
    import os
    import subprocess

    from coursekit.sandbox.host import HOST_DIR_PREFIX, OWNER_FILE, _process_start, sweep_stale_host_dirs

    def folder(name, owner=None):
        path = tmp_path / (HOST_DIR_PREFIX + name)
        path.mkdir()
        (path / "worker.log").write_text("log")
        if owner is not None:
            (path / OWNER_FILE).write_text(owner)
        return path

    ended = subprocess.Popen(["true"])
    ended.wait()  # reaped: its pid names no process now
    me = os.getpid()
    dead = folder("dead", f"{ended.pid} 12345\n")
    reused = folder("reused", f"{me} 0\n")  # our pid, but a process started at another time
    live = folder("live", f"{me} {_process_start(me)}\n")
    unowned = folder("unowned")
    garbled = folder("garbled", "not a pid\n")
    (tmp_path / (HOST_DIR_PREFIX + "file")).write_text("a file")
    (tmp_path / (HOST_DIR_PREFIX + "link")).symlink_to(dead)
    other = tmp_path / "other-dead"
    other.mkdir()
    (other / OWNER_FILE).write_text(f"{ended.pid} 12345\n")

    assert sorted(sweep_stale_host_dirs(str(tmp_path))) == sorted([str(dead), str(reused)])
    assert not dead.exists() and not reused.exists()
    assert all(p.exists() for p in (live, unowned, garbled, other, tmp_path / (HOST_DIR_PREFIX + "file")))
    assert sweep_stale_host_dirs(str(tmp_path)) == []


@pytest.mark.slow
def test_a_worker_owns_its_host_folder_until_it_closes():
    import os

    from coursekit.sandbox.host import OWNER_FILE, _process_start, sweep_stale_host_dirs

    with Worker("rlimit", Limits(cell_seconds=5)) as worker:
        host = Path(worker._host_dir)
        assert (host / OWNER_FILE).read_text().split() == [str(os.getpid()), _process_start(os.getpid())]
        assert str(host) not in sweep_stale_host_dirs(str(host.parent))
        assert host.exists()
    assert not host.exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_template_knows_whether_it_has_a_pid_namespace(kind, sandbox):
    worker = sandbox(kind)
    assert worker.pid_namespace == (kind == "bwrap")


@pytest.mark.slow
def test_a_cell_that_kills_every_process_it_can_is_reported_as_the_students():
    """``os.kill(-1, SIGKILL)`` ends the template, and with it the sandbox's PID namespace (tried
    under bubblewrap only: without a PID namespace it would reach every process of this user)."""
    if not bubblewrap_works():
        pytest.skip("bubblewrap is not available here")
    from coursekit.sandbox import CellFailed
    from coursekit.sandbox.host import TEMPLATE_GONE

    with Worker("bwrap", Limits(cell_seconds=5)) as worker:
        worker.COMMAND_SECONDS = 2.0
        session = worker.session()
        # Linux spares the caller, but the template's death ends the namespace: either way the cell is blamed
        with pytest.raises(CellFailed) as failed:
            session.run_cell(
                "import os, signal\nos.kill(-1, signal.SIGKILL)", "kill all", time.monotonic() + 30
            )
        assert str(failed.value) == TEMPLATE_GONE
        assert not worker.healthy(timeout=1.0)
        assert worker.reset_after_student() == TEMPLATE_GONE
        worker.restart()
        assert worker.session().run_cell("print('back')", "after", time.monotonic() + 30)["ok"]


@pytest.mark.slow
def test_a_grader_can_set_an_attribute_of_a_student_object(sandbox):
    from coursekit.grading.core import SESSION, set_attr

    worker = sandbox(KINDS[-1])
    limits = Limits(cell_seconds=5, check_seconds=5)
    session = worker.session(limits=limits)
    session.run_cell("import torch\nlayer = torch.nn.Dropout(0.1)", "setup", time.monotonic() + 30)
    token = SESSION.set(session)
    try:
        session.begin_check("p = 1 zeroes everything")
        layer = session.remote("layer")
        set_attr(layer, "p", 1.0)
        assert layer.p == 1.0 and torch.equal(layer(torch.ones(4)), torch.zeros(4))
    finally:
        SESSION.reset(token)
        session.end_check()
    session.begin_check("each check starts from the notebook's state")
    assert session.remote("layer").p == 0.1
    session.close()


def test_a_probe_tells_from_the_sandbox_whether_a_result_shares_an_arguments_memory(sandbox):
    from coursekit.grading.core import SESSION, probe

    worker = sandbox(KINDS[-1])
    limits = Limits(cell_seconds=5, check_seconds=5)
    session = worker.session(limits=limits)
    code = "def same(x):\n    return x\n\ndef view(x):\n    return x[1:]\n\ndef fresh(x):\n    return x * 1\n"
    session.run_cell(code, "setup", time.monotonic() + 30)
    token = SESSION.set(session)
    try:
        session.begin_check("aliasing")
        shared = {
            name: probe(session.remote(name), torch.ones(3)).aliased for name in ("same", "view", "fresh")
        }
    finally:
        SESSION.reset(token)
        session.end_check()
    session.close()
    assert shared == {"same": True, "view": True, "fresh": False}


@pytest.mark.slow
def test_the_sandbox_records_calls_of_watched_references_by_student_code_only(sandbox):
    """A student's call of a watched reference is reported, in a cell as in a check; coursekit calling
    its own code (attention calling the watched softmax) is not; a plain global reads back as data."""
    watch = [("coursekit.attention", "softmax"), ("coursekit.attention", "SelfAttention")]
    worker = sandbox(KINDS[-1])
    limits = Limits(cell_seconds=10, check_seconds=5)
    session = worker.session(watch=watch, limits=limits)
    deadline = time.monotonic() + 60
    session.run_cell(
        "import torch\nimport coursekit.attention as ca\nq = torch.ones(1, 2, 4)\n"
        "out, w = ca.scaled_dot_product_attention(q, q, q)\nprediction = 7",
        "setup",
        deadline,
    )
    assert session.reference_calls == set()  # attention's own call of softmax is coursekit's
    session.begin_check("read a global")
    assert session.remote("prediction")._value() == 7
    session.end_check()
    session.run_cell("def mine(x):\n    return getattr(ca, 'soft' + 'max')(x)", "answer", deadline)
    assert session.reference_calls == set()  # defined, not called yet
    session.begin_check("the student's function calls the reference")
    session.remote("mine")(torch.zeros(3))
    session.end_check()
    assert session.reference_calls == {"coursekit.attention.softmax"}
    session.run_cell("layer = ca.SelfAttention(4)", "module", deadline)
    assert session.reference_calls == {"coursekit.attention.softmax", "coursekit.attention.SelfAttention"}
    session.close()


@pytest.mark.slow  # starts a sandbox
def test_the_sandbox_sees_the_references_code_however_it_arrives(sandbox):
    """The reference's code run through ``exec`` (of its source, or of a base64 string) is the
    reference's compiled code: reported as ``code:module.name``; a student's own softmax, or the
    reference with its docstring and local names changed is, a softmax of the student's own is not."""
    import base64
    import inspect
    import re

    from coursekit import attention

    source = inspect.getsource(attention.softmax)
    hidden = base64.b64encode(source.encode()).decode()
    renamed = re.sub(r"\bx\b", "inputs", source).replace('"""', '"""Mine. ', 1)  # locals, docstring changed
    watch = [("coursekit.attention", "softmax"), ("coursekit.attention", "SelfAttention")]
    worker = sandbox(KINDS[-1])
    limits = Limits(cell_seconds=10, check_seconds=5)
    deadline = time.monotonic() + 60
    own = worker.session(watch=watch, limits=limits)
    own.run_cell(
        "import torch\ndef softmax(x, dim=-1):\n    e = torch.exp(x - x.amax(dim, keepdim=True))\n"
        "    return e / e.sum(dim, keepdim=True)",
        "answer",
        deadline,
    )
    assert own.reference_calls == set()
    own.close()
    for code in (
        f"import base64, torch\nexec(base64.b64decode({hidden!r}))",
        f"import torch\nexec({source!r})",
        f"import torch\nexec({renamed!r})",
    ):
        session = worker.session(watch=watch, limits=limits)
        assert session.run_cell(code, "answer", deadline)["ok"]
        assert session.reference_calls == {"code:coursekit.attention.softmax"}, code
        session.close()


@pytest.mark.slow
def test_an_oversized_answer_loses_its_check_only():
    """A check's 256 MiB answer is refused where it is made, before it is written out, and the
    check fails with the limit named. A notebook that raises that limit on its side (the wire's code
    runs in its process) gets its answers refused unread by the trusted side, and each such check
    process killed; the kill is answered only once the process has released its memory, so ten of
    them in a row under a 1 GiB limit never add up to a kill of the whole notebook. A notebook's
    ``torch.set_num_threads(8)`` does not reach its checks: they run with the sandbox's one thread."""
    from coursekit.sandbox import RemoteCrash, StudentError

    with Worker("rlimit", Limits(cell_seconds=10, check_seconds=10, memory=1 << 30)) as worker:
        session = worker.session()
        session.run_cell(
            "import torch\ntorch.set_num_threads(8)\n"
            "def big():\n    return torch.zeros(8192, 4096, dtype=torch.float64)\n"
            "def threads():\n    return torch.get_num_threads()",
            "setup",
            time.monotonic() + 60,
        )
        session.begin_check("big, refused at the source")
        with pytest.raises(StudentError, match="exceeds the limit of 134,217,728 bytes") as refused:
            session.remote("big")()
        assert not isinstance(refused.value, RemoteCrash)
        assert session.remote("threads")() == 1  # the check process lives on
        session.end_check()
        session.run_cell(
            "import coursekit.sandbox.protocol as wire\nwire.REPLY_BLOB = 1 << 40",
            "raise",
            time.monotonic() + 60,
        )
        for i in range(10):
            session.begin_check(f"big {i}")
            pid = session.channel.pid
            with pytest.raises(RemoteCrash, match="exceeds the limit"):
                session.remote("big")()
            try:  # gone, or a zombie: either way its memory is free
                stat = Path(f"/proc/{pid}/stat").read_text()
            except FileNotFoundError:
                stat = "(gone) X"
            assert stat[stat.rindex(")") + 2] in "ZX", f"check {i}'s process is still running: {stat}"
            session.end_check()
        session.begin_check("threads")
        assert session.remote("threads")() == 1
        session.end_check()
        assert worker.reset() is None  # the sandbox never had to kill the notebook for its memory
        session.close()


@pytest.mark.slow
def test_a_check_over_the_memory_limit_is_killed_and_the_notebook_kept():
    """The memory limit holds for a submission's processes together. When a check takes the
    total over it (here with processes it starts, each under the per-process limit), the sandbox
    ends that check with what it started and keeps the notebook, whose later checks run as usual."""
    from coursekit.sandbox import RemoteCrash

    with Worker("rlimit", Limits(cell_seconds=20, check_seconds=20, memory=1 << 30)) as worker:
        session = worker.session()
        session.run_cell(
            "import os, time, torch\n"
            "kept = torch.ones(300 << 20, dtype=torch.uint8)  # the notebook's own 300 MiB\n"
            "def hog():\n"
            "    for _ in range(3):  # 3 x 300 MiB in processes of its own\n"
            "        if os.fork() == 0:\n"
            "            x = torch.ones(300 << 20, dtype=torch.uint8)\n"
            "            time.sleep(10)\n"
            "            os._exit(0)\n"
            "    time.sleep(10)\n"
            "    return 1\n"
            "def fine():\n    return int(kept[-1]) * (kept.numel() >> 20)",
            "setup",
            time.monotonic() + 60,
        )
        session.begin_check("hog")
        started = time.monotonic()
        with pytest.raises(RemoteCrash, match="used more than 1.0 GiB of memory"):
            session.remote("hog")()
        assert time.monotonic() - started < 8  # killed by the watch, not at the check's deadline
        session.end_check()
        session.begin_check("fine")
        assert session.remote("fine")() == 300
        session.end_check()
        assert worker.command({"op": "status"})[0]["killed_because"] is None  # the notebook never was
        session.close()


def _watch_over(sets: list[list[int]], monkeypatch, root=lambda pid, alive: pid, last=()) -> list:
    """Run the memory watch of a template (none started: its state only) over readings of the
    submission's processes ``sets``, 100 bytes allowed: while a set is new, each process counts 80
    bytes (its RSS, the pages it shares counted once per process), once a set is the same as at
    the last reading, 20 (its share). ``root``: the tree each process belongs to (its own, by
    default); ``last``: the processes of the reading before the first. Returns what the watch killed."""
    from coursekit.sandbox import worker

    t = worker.Template.__new__(worker.Template)
    t.limits, t.baseline, t.killed_because, t.checks_killed = {"processes": 16, "memory": 100}, 0, None, {}
    t.last_pids, t.deferrals = set(last), 0
    readings, killed = iter(sets), []
    monkeypatch.setattr(t, "members", lambda: next(readings, []), raising=False)  # then: all gone
    monkeypatch.setattr(
        worker, "_memory", lambda pids, allowed: {p: 80 if allowed is None else 20 for p in pids}
    )
    monkeypatch.setattr(t, "tree_root", root, raising=False)
    monkeypatch.setattr(t, "kill_tree", lambda root: killed.append(root) or {root}, raising=False)
    monkeypatch.setattr(t, "kill_all", lambda: killed.append("all"), raising=False)
    for _ in sets:
        t.last_memory_check = 0.0  # the next reading is due
        t.watch()
    return killed


def test_the_memory_watch_waits_for_starting_processes_to_settle_before_counting_them_by_rss(monkeypatch):
    """A check starts, then the spare process of the next one, a reading apart (a busy machine):
    their shares are read once the set settles, and nothing is killed. Processes that keep
    starting are counted by RSS after a few readings, and killed over the limit."""
    from coursekit.sandbox.worker import DEFERRALS

    assert _watch_over([[1, 2], [1, 2, 3], [1, 2, 3], [1, 2, 3]], monkeypatch) == []
    churning = [list(range(1, n + 3)) for n in range(DEFERRALS + 1)]  # one more process each reading
    assert _watch_over(churning, monkeypatch) != []


def test_processes_multiplying_past_what_the_watch_measures_are_ended_at_once(monkeypatch):
    """12 processes in one tree, over the limit by RSS: new since the last reading (a fork bomb's
    first ones), they are all ended at once; the same 12 as at the last reading (their shares read),
    only their tree is (a check with what it started). Tree by tree, each waited for on cores the
    bomb kept busy, a fork bomb multiplied for up to 40 s before its count passed the limit."""
    processes = list(range(1, 13))
    one_tree = lambda pid, alive: 1  # noqa: E731
    assert _watch_over([processes], monkeypatch, root=one_tree) == ["all"]
    assert _watch_over([processes], monkeypatch, root=one_tree, last=processes) == [1]


@pytest.mark.slow  # starts a sandbox
@pytest.mark.parametrize("kind", KINDS)
def test_memory_shared_by_a_submissions_processes_counts_once(kind, sandbox):
    """The memory watch counts each process's proportional share (PSS) of the pages it shares. The
    notebook and each check are forked from the template and share its imported torch (a few
    hundred MiB): counted per process (RSS), a notebook with a check open would go over a 150 MiB
    limit without allocating anything. The watch must be able to read that share: processes forked
    from the template, which no student code may read (checked here too), are readable again."""
    worker = sandbox(kind)
    limits = Limits(cell_seconds=20, check_seconds=20, memory=150 << 20)
    session = worker.session(limits=limits)
    session.run_cell(
        "import time\ndef wait():\n    time.sleep(1.5)\n    return 7", "setup", time.monotonic() + 60
    )
    peek = session.run_cell(
        "import os\nfor name in ('mem', 'smaps_rollup', 'environ'):\n"
        "    try:\n        open(f'/proc/{os.getppid()}/{name}', 'rb').read(1)\n        print('read', name)\n"
        "    except OSError as e:\n        print(type(e).__name__, name)",
        "peek at the template",
        time.monotonic() + 60,
    )
    assert peek["outputs"][0]["text"].split("\n")[:3] == [
        "PermissionError mem",
        "PermissionError smaps_rollup",
        "PermissionError environ",
    ]
    for name in ("first", "second"):
        session.begin_check(name)
        assert session.remote("wait")() == 7
        session.end_check()
    assert worker.command({"op": "status"})[0]["killed_because"] is None
    session.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_exited_processes_not_yet_reaped_do_not_count_against_the_process_limit(kind, sandbox):
    """A zombie runs nothing: 80 children that exited (their parent has not reaped them yet) do not
    make a cell "start more than 64 processes". A fork bomb's killed processes linger as zombies on
    a loaded machine until the sandbox's init reaps them; counted, they cost the notebook started
    after the bomb its first cell."""
    worker = sandbox(kind)
    limits = Limits(cell_seconds=20)
    session = worker.session(limits=limits)
    out = session.run_cell(
        "import os, time\n"
        "for _ in range(80):\n"
        "    if os.fork() == 0:\n"
        "        os._exit(0)\n"
        "time.sleep(1)  # the watch looks every 20 ms\n"
        "print('still here')",
        "zombies",
        time.monotonic() + 60,
    )
    assert "still here" in str(out)
    session.close()


@pytest.mark.slow  # starts a sandbox
@pytest.mark.parametrize("kind", KINDS)
def test_a_cell_is_timed_by_the_cpu_time_of_its_process(kind, sandbox):
    """A cell that spins through its CPU budget is "an endless loop?"; one that sleeps as long is
    told it waited, never that it looped; a cell that computes before it sleeps is timed from its
    own start, not by what earlier cells computed."""
    from coursekit.sandbox import CellFailed

    worker = sandbox(kind)
    limits = Limits(cell_seconds=1, check_seconds=1)
    deadline = time.monotonic() + 60
    session = worker.session(limits=limits)
    work = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}:\n    pass\n"
    for _ in range(3):  # 3 cells of 0.6 s of CPU: 1.8 s in all, within 1 s each
        assert session.run_cell(work.format(0.6), "work", deadline)["ok"]
    started = time.monotonic()
    with pytest.raises(CellFailed, match=r"did not finish within 1 s of CPU time \(an endless loop\?\)"):
        session.run_cell("while True:\n    pass", "spin", deadline)
    assert time.monotonic() - started < 5
    session = worker.session(limits=limits)
    with pytest.raises(CellFailed, match=r"did not finish within 1 s: it waited \d+ s while computing") as e:
        session.run_cell("import time\ntime.sleep(1000)", "sleep", deadline)
    assert "endless loop" not in str(e.value)
    assert (
        worker.session(limits=limits).run_cell("print(6 * 7)", "after", deadline)["outputs"][0]["text"]
        == "42\n"
    )


def _imports_inside_functions(path: Path, skip: set[str]) -> set[str]:
    """The modules that the functions of ``path`` (but those named in ``skip``) import when they run."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in skip:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import):
                    names.update(alias.name for alias in inner.names)
                elif isinstance(inner, ast.ImportFrom) and inner.level == 0:
                    names.add(inner.module)
    return names


def test_every_module_the_sandbox_imports_at_run_time_is_restored_before_a_check():
    """A cell may swap a module in ``sys.modules``; before each check the notebook's process puts
    back the ones its own code, the check process's and the wire format's import when they run
    (``worker.RUNTIME_IMPORTS``). Only the template runs ``_preload`` and ``_make_shell``, before any
    student code."""
    from coursekit.sandbox import worker

    folder = Path(worker.__file__).parent
    imported = _imports_inside_functions(folder / "worker.py", {"_preload", "_make_shell"})
    imported |= _imports_inside_functions(folder / "protocol.py", set())
    assert imported and imported <= set(worker.RUNTIME_IMPORTS), sorted(
        imported - set(worker.RUNTIME_IMPORTS)
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_check_works_after_a_cell_swapped_the_modules_the_sandbox_uses(kind, sandbox):
    swap = (
        "import sys, types\n"
        "for name in ('torch', 'numpy', 'io'):\n"
        "    sys.modules[name] = types.ModuleType(name)\n"
        "def double(x):\n"
        "    return 2 * x"
    )
    worker = sandbox(kind)
    limits = Limits(cell_seconds=3, check_seconds=5)
    session = worker.session(limits=limits)
    assert session.run_cell("import torch", "setup", time.monotonic() + 60)["ok"]
    assert session.run_cell(swap, "swap", time.monotonic() + 60)["ok"]
    for name in ("first", "second"):
        session.begin_check(name)
        assert torch.equal(session.remote("double")(torch.ones(3)), torch.full((3,), 2.0))
    session.close()


def _huge_pages_possible() -> bool:
    """MADV_COLLAPSE came with Linux 6.1; transparent huge pages may also be switched off."""
    import platform

    release = tuple(int(x) for x in re.findall(r"\d+", platform.release())[:2])
    try:
        enabled = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return release >= (6, 1) and "[never]" not in enabled


@pytest.mark.skipif(not _huge_pages_possible(), reason="the kernel cannot collapse memory into huge pages")
def test_the_template_holds_its_memory_in_huge_pages():
    """The template's private memory in 2 MiB pages, where the kernel allows: forking it (every
    notebook and every check) then copies one page-table entry per 512 pages."""
    script = (
        "import torch, coursekit.attention\n"
        "from coursekit.sandbox import worker\n"
        "def sizes():\n"
        "    rows = dict(line.split(':') for line in open('/proc/self/smaps_rollup') if ':' in line)\n"
        "    return int(rows['Anonymous'].split()[0]), int(rows['AnonHugePages'].split()[0])\n"
        "before = sizes()\n"
        "worker._collapse_to_huge_pages()\n"
        "print(*before, *sizes())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    anon_before, huge_before, anon, huge = map(int, out.stdout.split())
    assert huge_before < anon_before / 4, "the kernel already gave huge pages: this test would show nothing"
    assert huge > anon / 2, f"{huge} of {anon} KiB of private memory in huge pages"


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_each_check_starts_every_generator_from_its_seed(kind, sandbox):
    """Python's, numpy's and torch's global generators, seeded as ``random.seed``,
    ``numpy.random.seed`` and ``torch.manual_seed`` seed them, whatever the notebook drew before."""
    import random

    cell = (
        "import random, numpy, torch\n"
        "torch.manual_seed(123); [torch.rand(5), numpy.random.rand(5), random.random()]\n"
        "def draws():\n"
        "    return [random.random(), float(numpy.random.rand()), float(torch.rand(()))]"
    )
    worker = sandbox(kind)
    limits = Limits(cell_seconds=5, check_seconds=5)
    session = worker.session(limits=limits)
    assert session.run_cell(cell, "draws", time.monotonic() + 60)["ok"]
    got = []
    for seed in (7, 7, 8):
        session.begin_check("draws", seed)
        got.append(session.remote("draws")())
    session.close()
    expected = [
        random.Random(7).random(),
        float(np.random.RandomState(7).rand()),
        float(torch.rand((), generator=torch.Generator().manual_seed(7))),
    ]
    assert got[0] == got[1] == expected and all(a != b for a, b in zip(got[2], expected))
