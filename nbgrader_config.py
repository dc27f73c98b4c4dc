"""nbgrader configuration: the course root is this folder.

nbgrader's "source" is `solutions/` (instructor notebooks with full solutions and
hidden tests) and its "release" is `exercises/` (what students get, committed and
regenerated with `coursekit release`). Gradebook, submissions and feedback stay
out of git (see .gitignore).
"""

c = get_config()  # noqa: F821 (provided by nbgrader)

c.CourseDirectory.root = "."
c.CourseDirectory.course_id = "transformers-course"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
# Only notebooks and small data files belong to an assignment (not hidden folders such as a
# .hypothesis database that running a notebook leaves beside it).
c.CourseDirectory.ignore = [".*", ".ipynb_checkpoints", "*.pyc", "__pycache__", "*.egg-info"]

# Students see these two lines in place of each solution region.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# A cell that runs for longer than this is stopped; the submission is still graded.
c.ExecutePreprocessor.timeout = 120

# Partial credit (coursekit): a test cell scores its points in proportion to the weight of the
# checks (clauses) it passed, rounded down to this many points; a cell with a failed check never
# reaches full marks. Set all_or_nothing to True for a cell to score all its points or none.
c.CourseKit.partial_credit_step = 0.5
c.CourseKit.all_or_nothing = False

# `coursekit formgrader` names its grading page here (nbgrader's page, with MathJax from the
# course's own copy instead of a CDN, so that it works offline); unset otherwise.
import os  # noqa: E402

if os.environ.get("COURSEKIT_FORMGRADER_TEMPLATES"):
    c.HTMLExporter.extra_template_basedirs = os.environ["COURSEKIT_FORMGRADER_TEMPLATES"].split(os.pathsep)
