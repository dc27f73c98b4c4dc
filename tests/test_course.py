"""coursekit.course: what it changes in how nbgrader is driven still gives nbgrader's answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from nbgrader.dbutil import _temp_alembic_ini

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
