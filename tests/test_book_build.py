"""The background book build tells why it failed, in the lines a CI log's tail shows."""

from tests import book_build

LOG = """Running Jupyter-Book v1.0.4.post1
Executing: book/ch07_gpt.md in: /repo/book
/repo/book/ch07_gpt.md: WARNING: Executing notebook failed: CellExecutionError [mystnb.exec]
/r/book/ch07_gpt.md: WARNING: Notebook exception traceback saved in: /r/_build/html/reports/book/ch07_gpt.err.log
/repo/book/ch07_gpt.md: WARNING: Executing notebook failed: CellExecutionError [mystnb.exec]
build finished with problems, 2 warnings.
Traceback (most recent call last):
RuntimeError: There was an error in building your book. Look above for the cause.
"""


def test_causes_lists_each_warning_once_and_the_failing_cell(tmp_path):
    report = tmp_path / "book" / "ch07_gpt.err.log"
    report.parent.mkdir()
    report.write_text("Traceback\n" + "frame\n" * 20 + "AssertionError: speedup above tokens per pass\n")
    text = book_build.causes(LOG, tmp_path)
    assert text.count("Executing notebook failed") == 1
    assert "traceback saved in" in text
    assert "There was an error in building" not in text
    assert "book/ch07_gpt.err.log" in text
    assert text.rstrip().endswith("AssertionError: speedup above tokens per pass")


def test_causes_without_reports_or_warnings(tmp_path):
    text = book_build.causes("all fine\n", tmp_path / "absent")
    assert text.splitlines() == ["--- warnings and errors in the build log ---"]


def test_causes_are_capped(tmp_path):
    log = "\n".join(f"WARNING: number {i}" for i in range(100))
    text = book_build.causes(log, tmp_path, limit=5)
    assert "WARNING: number 4" in text and "WARNING: number 5" not in text
    assert "and 95 more" in text


class FakeBuild:
    """Stands in for a Build: "builds" for ``seconds`` and ends with ``code``."""

    made = 0

    def __init__(self, seconds: float = 0.3, code: int = 3) -> None:
        import threading

        FakeBuild.made += 1
        self.done, self.code, self.stopped, self.closed = threading.Event(), code, False, False
        threading.Timer(seconds, self.done.set).start()

    def wait(self, timeout: float = 1800):
        self.done.wait(timeout)
        return self.code, "" if self.code == 0 else f"failed with {self.code}"

    def stop(self):
        self.stopped = True
        self.done.set()

    def close(self):
        self.closed = True


def test_the_workers_of_one_run_share_one_build(tmp_path):
    """Under xdist every worker asks for the build: one runs it, the others read its outcome; the
    builder waits for it at the end (another worker may still need it) and removes the run's files."""
    FakeBuild.made = 0
    first = book_build.Shared("run-a", FakeBuild, tmp_path)
    second = book_build.Shared("run-a", FakeBuild, tmp_path)
    other_run = book_build.Shared("run-b", FakeBuild, tmp_path)
    assert FakeBuild.made == 2 and first.build is not None and second.build is None and other_run.build
    assert second.wait(timeout=10) == (3, "failed with 3") == first.wait(timeout=10)
    second.close(interrupted=False)  # not the builder: nothing to do
    assert first.claim.exists() and first.result.exists()
    first.close(interrupted=False)
    assert first.build.closed and not first.build.stopped
    assert not first.claim.exists() and not first.result.exists()
    other_run.close(interrupted=True)
    assert other_run.build.stopped and other_run.build.closed


def test_a_worker_waiting_for_a_build_nobody_finishes_gives_up_with_a_reason(tmp_path):
    (tmp_path / "coursekit-book-build-run-c.claim").touch()  # claimed by a worker that died
    waiting = book_build.Shared("run-c", FakeBuild, tmp_path)
    code, output = waiting.wait(timeout=1)
    assert code == -1 and "no book build result after 1 s" in output
