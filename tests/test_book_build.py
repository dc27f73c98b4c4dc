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
