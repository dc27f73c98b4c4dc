"""coursekit.course: what it changes in how nbgrader is driven still gives nbgrader's answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from nbgrader.dbutil import _temp_alembic_ini

from coursekit import course
from coursekit.course import alembic_head


@pytest.mark.slow  # not in the quick loop: starts nbgrader's alembic executable
def test_the_schema_revision_read_in_process_is_the_one_nbgrader_runs_alembic_for():
    """A new gradebook is stamped with the head of nbgrader's migrations. nbgrader asks the
    ``alembic`` executable (``nbgrader.api.get_alembic_version``); coursekit reads the same
    migration scripts in-process. Both must agree."""
    alembic = str(Path(sys.executable).parent / "alembic")
    with _temp_alembic_ini("sqlite:////nonexistent/gradebook.db") as ini:
        heads = subprocess.run([alembic, "-c", ini, "heads"], capture_output=True, text=True, check=True)
    assert heads.stdout.split()[0] == alembic_head()
    assert len(alembic_head()) == 12  # a revision id, not an empty answer


def test_feedback_links_the_published_book_or_says_there_is_none(monkeypatch):
    """The feedback's "Read again" names the chapter, linked at the book's published address
    (``html.baseurl``); without one it says so instead of linking the instructor's ``_build/``."""
    from coursekit.autograde import record

    monkeypatch.setattr(course, "book_url", lambda root: "https://example.org/course")
    assert (
        record._chapter_link("ch01_attention")["url"] == "https://example.org/course/book/ch01_attention.html"
    )
    monkeypatch.setattr(course, "book_url", lambda root: "")
    link = record._chapter_link("ch01_attention")
    assert link["url"] is None and link["title"]


def test_feedback_templates_are_compiled_once_per_process_and_again_when_edited(tmp_path, monkeypatch):
    """Each feedback page gets a new exporter from nbgrader; the compiled templates outlive it."""
    import jinja2
    import nbformat

    from coursekit.autograde import feedback

    folder = tmp_path / "templates" / "page"
    folder.mkdir(parents=True)
    (folder / "conf.json").write_text("{}")
    (folder / "index.html.j2").write_text("first {{ nb.cells | length }}")
    compiled = []
    compile_template = jinja2.Environment.compile

    def counted(self, *args, **kwargs):
        compiled.append(args)
        return compile_template(self, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "compile", counted)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("x")])

    def page() -> str:
        exporter = feedback._feedback_exporter()(
            extra_template_basedirs=[str(tmp_path / "templates")], template_name="page"
        )
        return exporter.from_notebook_node(nb)[0]

    assert page() == "first 1" and compiled
    compiled.clear()
    assert page() == "first 1" and not compiled, "a second exporter compiled the template again"
    (folder / "index.html.j2").write_text("second")
    assert page() == "second" and compiled
