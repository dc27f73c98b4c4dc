"""Grading threads and CPython: what the threaded batch (``coursekit autograde --jobs N``) needs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

#: Three threads parse a large module while objects with finalizers that yield the GIL are freed:
#: the interleaving in which CPython 3.11/3.12 lose count of the AST's depth (python/cpython#106905).
STRESS = textwrap.dedent(
    """
    import ast, sys, threading, time
    from coursekit.autograde.batch import serialise_ast_parsing
    if len(sys.argv) > 1:
        serialise_ast_parsing()
    source = open("coursekit/grading/ch07_gpt.py").read()

    class Yields:
        def __del__(self):
            time.sleep(0)

    def parse(errors):
        try:
            for _ in range(8):
                ast.parse(source)
                for _ in range(200):
                    a, b = Yields(), Yields()
                    a.other, b.other = b, a
        except SystemError as e:
            errors.append(str(e))

    sys.setswitchinterval(1e-6)
    errors = []
    threads = [threading.Thread(target=parse, args=(errors,)) for _ in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(len(errors))
    """
)


@pytest.mark.slow  # not in the quick loop: grades in many threads at once
def test_grading_threads_parse_source_one_at_a_time():
    """With the batch's serialisation no thread ever fails to parse (without it, this very
    interleaving raises "AST constructor recursion depth mismatch" on 3.11; it once left a
    student ungraded with --jobs 2). Run in a process of its own: it replaces ``ast.parse``."""
    from coursekit.course import repo_root

    run = subprocess.run(
        [sys.executable, "-c", STRESS, "serialised"],
        cwd=repo_root(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "0", run.stdout
