"""The course's committed checkpoints: one registry, one file format, one command.

Small trained models that the book pages load, so that no page trains for minutes. Each is
an entry of :data:`REGISTRY`: the model class, the recipe that trains it (a function in
:mod:`coursekit.experiments`), the names of the metrics that recipe records, and how its
tokenizer is kept. Regenerate one with ``coursekit pretrain NAME`` (``coursekit pretrain``
alone lists them); load one with :func:`load`::

    model, tokenizer, record = checkpoints.load("gpt-char")

**Format**, version 1, in ``checkpoints/`` (``COURSEKIT_CHECKPOINTS`` overrides the folder):

- ``NAME.pt``: the model's state dict in float16, without the tied weights (``torch.save`` of
  a dict of tensors; it loads with ``weights_only=True``);
- ``NAME.json``::

      {"format": "coursekit-checkpoint", "version": 1, "name": NAME,
       "model": "GPT",                     # the class, from the registry
       "config": {...},                    # its config's fields (the constructor's keywords)
       "tokenizer": {"kind": "char", "file": "NAME.tokenizer.json"} | ...,
       "recipe": {...},                    # the recipe actually run, less the model config
       "command": "coursekit pretrain NAME",
       "metrics": {...},                   # measured with the stored (float16) weights
       "environment": {"python": ..., "torch": ..., "threads": ..., "machine": ...}}

- ``NAME.tokenizer.json``: the tokenizer, when it is learned from data (``"char"``, or
  ``"bpe"``, whose record also holds BERT's special token ids); a closed vocabulary
  (``"words"``) is stored in the record itself.

A fast test reloads each checkpoint and re-measures its recorded metrics; retraining is an
opt-in slow test.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from coursekit import bpe, data
from coursekit._files import atomic_write, read_json
from coursekit.bert import BertConfig, BertForMaskedLM, SpecialTokens
from coursekit.gpt import GPT, GPTConfig
from coursekit.seq2seq import Seq2Seq, Seq2SeqConfig

__all__ = [
    "FORMAT",
    "VERSION",
    "Entry",
    "REGISTRY",
    "Checkpoint",
    "checkpoint_dir",
    "entry",
    "files",
    "load",
    "save",
    "pretrain",
]

FORMAT, VERSION = "coursekit-checkpoint", 1


@dataclass(frozen=True)
class Entry:
    """One committed checkpoint.

    Attributes:
        name: the file stem in ``checkpoints/`` and the argument of ``coursekit pretrain``.
        chapter: the assignment id of the chapter whose page loads it (:mod:`coursekit.chapters`).
        model, config: the model class and its config dataclass (``model(config(**record["config"]))``).
        experiment: the module of :mod:`coursekit.experiments` that trains it, named, not imported:
            the experiments import this registry (to save what they train), so the registry reads
            their recipes only when asked (:attr:`recipe`, :attr:`default`, :attr:`metrics`).
        recipe_name, default_name: the names, in that module, of the recipe function
            (``recipe(default_recipe, progress=...) -> (model, tokenizer, recipe run, metrics)``)
            and of the committed checkpoint's recipe (a frozen dataclass with ``shortened(steps)``).
        tokenizer: ``"char"``, ``"bpe"`` (BERT's four special tokens follow its vocabulary) or
            ``"words"`` (the closed vocabularies of :mod:`coursekit.experiments.number_words`).
        tied: ``(weight, the weight it is)`` pairs that are not stored twice.
        about: one line for ``coursekit pretrain --list``.
    """

    name: str
    chapter: str
    model: type[nn.Module]
    config: type
    experiment: str
    recipe_name: str
    default_name: str
    tokenizer: str
    tied: tuple[tuple[str, str], ...] = ()
    about: str = ""

    def _module(self):
        return importlib.import_module(f"coursekit.experiments.{self.experiment}")

    @property
    def recipe(self) -> Callable[..., tuple]:
        """Trains the checkpoint (see the class's attributes)."""
        return getattr(self._module(), self.recipe_name)

    @property
    def default(self) -> Any:
        """The recipe of the committed checkpoint."""
        return getattr(self._module(), self.default_name)

    @property
    def metrics(self) -> tuple[str, ...]:
        """The names of the metrics :attr:`recipe` records (its module's ``METRICS``)."""
        return tuple(self._module().METRICS)


#: Checkpoint name -> :class:`Entry`.
REGISTRY: dict[str, Entry] = {
    e.name: e
    for e in (
        Entry(
            "bert-small",
            "ch06_bert",
            BertForMaskedLM,
            BertConfig,
            "bert_mlm",
            "pretrain_bert_small",
            "BERT_SMALL",
            tokenizer="bpe",
            about="Chapter 6: BERT pretrained by MLM on python-docs, then fine-tuned on topics (about 7 minutes)",
        ),
        Entry(
            "gpt-char",
            "ch07_gpt",
            GPT,
            GPTConfig,
            "gpt_char",
            "pretrain_gpt_char",
            "GPT_CHAR",
            tokenizer="char",
            tied=(("lm_head.weight", "tok_emb.weight"),),
            about="Chapter 7: a character-level GPT on python-docs (at most 10 minutes, time-budgeted)",
        ),
        Entry(
            "seq2seq-numbers",
            "ch08_seq2seq",
            Seq2Seq,
            Seq2SeqConfig,
            "number_words",
            "pretrain_seq2seq_numbers",
            "SEQ2SEQ_NUMBERS",
            tokenizer="words",
            tied=(("lm_head.weight", "tgt_emb.weight"),),
            about="Chapter 8: English to German number words (500 steps, a few minutes)",
        ),
    )
}


class Checkpoint(NamedTuple):
    """What :func:`load` returns: the model (float32, eval mode), its tokenizer and its record.

    The tokenizer is a :class:`coursekit.data.CharTokenizer`, a :class:`coursekit.bpe.Tokenizer`
    or, for ``"words"``, the pair ``(EN_VOCAB, DE_VOCAB)``.
    """

    model: nn.Module
    tokenizer: Any
    record: dict

    @property
    def metrics(self) -> dict:
        """``record["metrics"]``."""
        return self.record["metrics"]

    @property
    def special(self) -> SpecialTokens | None:
        """BERT's special token ids (a ``"bpe"`` checkpoint), else ``None``."""
        special = self.record["tokenizer"].get("special")
        return SpecialTokens(**special) if special is not None else None


def checkpoint_dir() -> Path:
    """``checkpoints/`` of the repository (``COURSEKIT_CHECKPOINTS`` overrides it)."""
    return Path(os.environ.get("COURSEKIT_CHECKPOINTS", Path(__file__).resolve().parents[1] / "checkpoints"))


def entry(name: str) -> Entry:
    """The registry entry ``name``; ``ValueError`` naming the known ones if there is none."""
    if name not in REGISTRY:
        raise ValueError(f"no checkpoint called {name!r}; the course has {sorted(REGISTRY)}")
    return REGISTRY[name]


def _folder(directory) -> Path:
    return Path(directory) if directory is not None else checkpoint_dir()


def files(name: str, directory: str | os.PathLike | None = None) -> list[Path]:
    """The files of checkpoint ``name``: weights, record and (if learned) tokenizer."""
    folder, e = _folder(directory), entry(name)
    out = [folder / f"{name}.pt", folder / f"{name}.json"]
    return out + ([folder / f"{name}.tokenizer.json"] if e.tokenizer in ("char", "bpe") else [])


def _words(e: Entry) -> dict:
    """The two closed vocabularies of a ``"words"`` checkpoint, as its record stores them."""
    vocabularies = e._module()
    return {"en": list(vocabularies.EN_VOCAB.itos), "de": list(vocabularies.DE_VOCAB.itos)}


def load(name: str, directory: str | os.PathLike | None = None) -> Checkpoint:
    """Load checkpoint ``name`` from ``directory`` (default :func:`checkpoint_dir`).

    Raises:
        FileNotFoundError: a file is missing (the message says how to regenerate it).
        ValueError: the record is not of this format or version, or is of another model or vocabulary.
    """
    e = entry(name)
    paths = files(name, directory)
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"no {p}: run `coursekit pretrain {name}`")
    record = read_json(paths[1], FORMAT, VERSION, "coursekit checkpoint record")
    if record.get("name") != name or record.get("model") != e.model.__name__:
        raise ValueError(
            f"{paths[1]} records {record.get('model')} {record.get('name')!r}, "
            f"expected {e.model.__name__} {name!r}"
        )
    if e.tokenizer == "char":
        tokenizer = data.CharTokenizer.load(paths[2])
    elif e.tokenizer == "bpe":
        tokenizer = bpe.Tokenizer.load(paths[2])
    else:
        if {k: v for k, v in record["tokenizer"].items() if k != "kind"} != _words(e):
            raise ValueError(f"{paths[1]} was trained with other vocabularies than this coursekit's")
        vocabularies = e._module()
        tokenizer = (vocabularies.EN_VOCAB, vocabularies.DE_VOCAB)
    model = e.model(e.config(**record["config"]))
    weights = torch.load(paths[0], map_location="cpu", weights_only=True)
    for tied, source in e.tied:
        weights[tied] = weights[source]
    model.load_state_dict({k: v.float() for k, v in weights.items()})
    return Checkpoint(model.eval(), tokenizer, record)


def _config_of(model: nn.Module):
    return model.config if hasattr(model, "config") else model.cfg


def save(
    name: str,
    model: nn.Module,
    tokenizer,
    recipe,
    metrics: dict,
    directory: str | os.PathLike | None = None,
    command: str | None = None,
    environment: dict | None = None,
) -> Path:
    """Write checkpoint ``name``: float16 weights, the tokenizer (if learned) and the record.

    Args:
        name: a registry name.
        model, tokenizer, recipe, metrics: as the entry's recipe returns them (``recipe``
            is a dataclass or an already serialised dict).
        directory: default :func:`checkpoint_dir`.
        command: recorded as the command that regenerates it (default ``coursekit pretrain NAME``).
        environment: default: this Python, torch, thread count and machine.

    Returns:
        The record's path.
    """
    e = entry(name)
    if not isinstance(model, e.model):
        raise ValueError(f"checkpoint {name!r} holds a {e.model.__name__}, got a {type(model).__name__}")
    if set(metrics) != set(e.metrics):
        raise ValueError(
            f"checkpoint {name!r} records the metrics {sorted(e.metrics)}, got {sorted(metrics)}"
        )
    paths = files(name, directory)
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    tied = {t for t, _ in e.tied}
    weights = {k: v.detach().to(torch.float16) for k, v in model.state_dict().items() if k not in tied}
    atomic_write(paths[0], lambda tmp: torch.save(weights, tmp))
    if e.tokenizer == "words":
        tok_record = {"kind": "words", **_words(e)}
    else:
        tokenizer.save(paths[2])
        tok_record = {"kind": e.tokenizer, "file": paths[2].name}
        if e.tokenizer == "bpe":
            tok_record["special"] = asdict(SpecialTokens.after(_config_of(model).vocab_size - 4))
    recipe = asdict(recipe) if not isinstance(recipe, dict) else recipe
    record = {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "model": e.model.__name__,
        "config": asdict(_config_of(model)),
        "tokenizer": tok_record,
        "recipe": {k: v for k, v in recipe.items() if k != "model"},
        "command": command or f"coursekit pretrain {name}",
        "metrics": metrics,
        "environment": environment
        or {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "machine": platform.machine(),
        },
    }
    text = json.dumps(record, ensure_ascii=False, indent=1) + "\n"
    return atomic_write(paths[1], lambda tmp: tmp.write_text(text, encoding="utf-8"))


def pretrain(
    name: str,
    directory: str | os.PathLike | None = None,
    recipe=None,
    *,
    steps: int | None = None,
    progress: bool = True,
) -> dict:
    """Train checkpoint ``name`` from scratch with its recipe, measure it and :func:`save` it.

    Args:
        name: a registry name.
        directory: where to write (default :func:`checkpoint_dir`).
        recipe: default the entry's (the committed checkpoint's).
        steps: a shortened run of this many steps (a smoke test; recorded in the command).
        progress: show a progress bar.

    Returns:
        The record written.
    """
    e = entry(name)
    recipe = e.default if recipe is None else recipe
    if steps is not None:
        recipe = recipe.shortened(steps)
    model, tokenizer, run, metrics = e.recipe(recipe, progress=progress)
    command = f"coursekit pretrain {name}" + (f" --steps {steps}" if steps is not None else "")
    path = save(name, model, tokenizer, run, metrics, directory, command=command)
    return json.loads(path.read_text(encoding="utf-8"))
