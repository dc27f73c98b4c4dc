"""``coursekit autograde``: nbgrader's gradebook and feedback, with student code sandboxed.

For every submission, the four steps of the README, one module each:

1. **Rebuild** (:mod:`~coursekit.autograde.rebuild`) the notebook on the release's structure:
   broken JSON, deleted, duplicated or retyped cells become plain notes, never a crash.
2. **Run** (:mod:`~coursekit.autograde.run`) its code cells (not its test cells) in a sandbox
   (:mod:`coursekit.sandbox`), one cell at a time with a wall-clock cap; a cell that hangs or
   kills its process is skipped and the notebook is run again without it.
3. **Grade** (:mod:`~coursekit.autograde.grade`) each test cell on the trusted side: the cell is
   a thin call into ``coursekit.grading``, whose checks send inputs to a fresh, reseeded copy of
   the notebook's process and read the answers back as data. Hidden tests never enter the
   sandbox.
4. **Record** (:mod:`~coursekit.autograde.record`) the result (a *verdict*) in
   ``.coursekit/verdicts/``; then nbgrader's own autograder runs on the rebuilt notebook with its
   ``Execute`` step replaced by :class:`~coursekit.autograde.record.ApplyVerdicts`, so the
   gradebook, manual grades, late penalties and feedback stay nbgrader's (the feedback page's
   template and preprocessors: :mod:`~coursekit.autograde.feedback`).

Around them: :mod:`~coursekit.autograde.plan` (what grading an assignment needs, read once from
trusted files), :mod:`~coursekit.autograde.batch` (a class graded in parallel sandboxes, verdicts
cached by content), :mod:`~coursekit.autograde.gradebook` (locks, backups, a damaged gradebook
refused) and :mod:`~coursekit.autograde.check` (``coursekit check`` for students).
"""

from coursekit.autograde.batch import Snapshot, autograde, grade_inbox, snapshot
from coursekit.autograde.check import CheckReport, check_notebook
from coursekit.autograde.grade import grade_notebook
from coursekit.autograde.gradebook import (
    backup_gradebook,
    check_gradebook,
    check_gradebook_readable,
    course_lock,
    gradebook_lock,
    gradebook_setup,
)
from coursekit.autograde.plan import course_secret, load_plan
from coursekit.autograde.record import Result

__all__ = [
    "CheckReport",
    "Result",
    "Snapshot",
    "autograde",
    "backup_gradebook",
    "check_gradebook",
    "check_gradebook_readable",
    "check_notebook",
    "course_lock",
    "course_secret",
    "grade_inbox",
    "grade_notebook",
    "gradebook_lock",
    "gradebook_setup",
    "load_plan",
    "snapshot",
]
