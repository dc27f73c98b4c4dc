"""coursekit: the reference code of the Transformers course.

One module per chapter (``coursekit.attention`` for Chapter 1, ...), the graders
behind every exercise (``coursekit.grading``) and the command line (``coursekit``).
"""

__version__ = "0.1.0"
