"""The course's chapters, one row per graded assignment: the single table that the tests, the
mutation reports and the tools read instead of keeping lists of their own.

Each row names the assignment (the folder in ``solutions/`` and ``exercises/``), its book page,
the ``coursekit`` modules its answer cells reproduce, its grader module and the committed
checkpoint its chapter loads. The graded parts themselves are read from the instructor's
notebook (:func:`coursekit.grading.harness.parts`), where their points and test cells live.

Example::

    >>> chapter("ch01_attention").grader
    'coursekit.grading.ch01_attention'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["CHAPTERS", "Chapter", "chapter", "course_root"]


@dataclass(frozen=True)
class Chapter:
    """One graded assignment.

    Attributes:
        assignment: folder name in ``solutions/`` and ``exercises/`` (``"ch01_attention"``).
        title: the chapter's title.
        page: the book page, relative to the course root.
        modules: the ``coursekit`` modules whose code the answer cells hold (a definition is
            looked up in the first module that has it).
        checkpoint: the committed checkpoint the chapter's page loads, if any (a name in
            :data:`coursekit.checkpoints.REGISTRY`).
    """

    assignment: str
    title: str
    page: str
    modules: tuple[str, ...]
    checkpoint: str | None = None

    @property
    def grader(self) -> str:
        """The module of its checks: ``coursekit.grading.<assignment>``."""
        return f"coursekit.grading.{self.assignment}"

    @property
    def notebook(self) -> str:
        """The notebook's file name in ``solutions/<assignment>/`` and ``exercises/<assignment>/``."""
        return f"{self.assignment}.ipynb"


CHAPTERS: tuple[Chapter, ...] = (
    Chapter("ch01_attention", "Attention", "book/ch01_attention.md", ("attention",)),
    Chapter("ch02_multihead", "Multi-head attention", "book/ch02_multihead.md", ("multihead",)),
    Chapter("ch03_positional", "Positional encodings", "book/ch03_positional.md", ("positional",)),
    Chapter("ch04_layers", "Transformer layers", "book/ch04_layers.md", ("layers",)),
    Chapter("ch05_bpe", "Byte-pair encoding", "book/ch05_bpe.md", ("bpe",)),
    Chapter("ch06_bert", "BERT pretraining", "book/ch06_bert.md", ("bert",), checkpoint="bert-small"),
    Chapter("ch07_gpt", "GPT decoding", "book/ch07_gpt.md", ("gpt", "decoding"), checkpoint="gpt-char"),
    Chapter(
        "ch08_seq2seq",
        "Cross-attention translation",
        "book/ch08_seq2seq.md",
        ("seq2seq", "experiments.number_words"),  # the experiment part's reference is in the latter
        checkpoint="seq2seq-numbers",
    ),
    Chapter("ch09_vit", "The vision transformer", "book/ch09_vit.md", ("vit",)),
    Chapter("ch10_long_context", "Long context", "book/ch10_long_context.md", ("long_context",)),
    Chapter("appendix_arithmetic", "Transformer arithmetic", "book/appendix_arithmetic.md", ("arithmetic",)),
)


def chapter(assignment: str) -> Chapter:
    """The row of ``assignment``; ``ValueError`` naming the known ones if there is none."""
    for row in CHAPTERS:
        if row.assignment == assignment:
            return row
    raise ValueError(
        f"no chapter for assignment {assignment!r}; the course has {[c.assignment for c in CHAPTERS]}"
    )


def course_root() -> Path:
    """The repository this package was installed from (it holds ``solutions/`` and ``exercises/``)."""
    return Path(__file__).resolve().parents[1]
