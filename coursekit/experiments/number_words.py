"""Chapter 8's experiment: translating English number words into German with :class:`~coursekit.seq2seq.Seq2Seq`.

**The task.** Every integer from 0 to 999,999 in English words (American style, no "and":
``forty-two``, ``one hundred one``) and in German (``zweiundvierzig``, ``einhunderteins``):
German names the units before the tens (``zwei-und-vierzig`` for forty-two), uses ``eins``
only at the very end of a number and ``ein`` inside it (``einundzwanzig``, ``eintausend``),
and writes the number as one word. Tokens are English words (the hyphen is a token of its
own) and German *morphemes* (``zwei und vierzig``), so the word-order change is visible
in the cross-attention. We write ``einhundert`` and ``eintausend`` (not the equally correct
``hundert``, ``tausend``), as cheques and num2words do.

Here are the vocabularies (:data:`EN_VOCAB`, :data:`DE_VOCAB`, with the model's special ids
:data:`~coursekit.seq2seq.PAD`, ``BOS``, ``EOS``), the fixed split of the numbers, balanced
batches, :func:`scheduled_sampling`, the training recipe (:func:`train_seq2seq`), the scores
(exact match and chrF) and :func:`pretrain_seq2seq_numbers`, the recipe of the committed
checkpoint ``seq2seq-numbers`` (see :mod:`coursekit.checkpoints`).

Over 500 lines: the number-word task is one experiment: the words in two languages, their
vocabularies, the splits, batching, training, decoding and chrF evaluation of Chapter 8.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field, replace

import torch

from coursekit import train
from coursekit.seq2seq import (
    BOS,
    EOS,
    PAD,
    SEQ2SEQ_PRESETS,
    Seq2Seq,
    Seq2SeqConfig,
    beam_decode,
    greedy_decode,
    label_smoothed_loss,
    shift_right,
)

__all__ = [
    "heldout_loss",
    "MAX_NUMBER",
    "PAD",
    "BOS",
    "EOS",
    "Vocab",
    "EN_VOCAB",
    "DE_VOCAB",
    "english_tokens",
    "english",
    "german_tokens",
    "german",
    "NumberSplits",
    "number_splits",
    "number_shape",
    "sample_numbers",
    "make_batch",
    "scheduled_sampling",
    "Seq2SeqRecipe",
    "SEQ2SEQ_NUMBERS",
    "METRICS",
    "train_seq2seq",
    "translate",
    "chrf",
    "evaluate_translation",
    "pretrain_seq2seq_numbers",
]

# --------------------------------------------------------------------------- number words

#: The largest number of the task: every integer in ``0 .. MAX_NUMBER`` has a translation.
MAX_NUMBER = 999_999

_EN_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
_EN_TENS = (None, None, "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_DE_ONES = (
    "null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn vierzehn "
    "fünfzehn sechzehn siebzehn achtzehn neunzehn"
).split()
_DE_TENS = (
    None,
    None,
    "zwanzig",
    "dreißig",
    "vierzig",
    "fünfzig",
    "sechzig",
    "siebzig",
    "achtzig",
    "neunzig",
)


def _check_number(n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_NUMBER:
        raise ValueError(f"expected an integer in 0 .. {MAX_NUMBER:,}, got {n!r}")


def _english_below_1000(n: int) -> list[str]:
    """``1 <= n <= 999`` in English words: ``[hundreds "hundred"] [tens ["-" unit] | 1..19]``."""
    hundreds, rest = divmod(n, 100)
    out = [_EN_ONES[hundreds], "hundred"] if hundreds else []
    if rest >= 20:
        tens, unit = divmod(rest, 10)
        out += [_EN_TENS[tens]] + (["-", _EN_ONES[unit]] if unit else [])
    elif rest:
        out.append(_EN_ONES[rest])
    return out


def english_tokens(n: int) -> list[str]:
    """The English words of ``n`` (American style: no "and"), the hyphen as a token of its own.

    Example: ``english_tokens(1042) -> ["one", "thousand", "forty", "-", "two"]``.
    """
    _check_number(n)
    if n == 0:
        return ["zero"]
    thousands, rest = divmod(n, 1000)
    out = _english_below_1000(thousands) + ["thousand"] if thousands else []
    return out + (_english_below_1000(rest) if rest else [])


def english(n: int) -> str:
    """``n`` in English words. Example: ``english(101042) -> "one hundred one thousand forty-two"``."""
    return " ".join(english_tokens(n)).replace(" - ", "-")


def _german_one(u: int, last: bool) -> str:
    """The German word of ``1 <= u <= 19``; 1 is ``eins`` only where the number ends, else ``ein``."""
    if u == 1:
        return "eins" if last else "ein"
    return _DE_ONES[u]


def _german_below_1000(n: int, last: bool) -> list[str]:
    """``1 <= n <= 999`` as German morphemes: ``[h "hundert"] [[unit "und"] tens | 1..19]``."""
    hundreds, rest = divmod(n, 100)
    out = [_german_one(hundreds, last=False), "hundert"] if hundreds else []
    if rest >= 20:
        tens, unit = divmod(rest, 10)
        out += ([_german_one(unit, last=False), "und"] if unit else []) + [_DE_TENS[tens]]
    elif rest:
        out.append(_german_one(rest, last))
    return out


def german_tokens(n: int) -> list[str]:
    """The German morphemes of ``n``: units before tens, ``eins`` only at the very end.

    Example: ``german_tokens(21042) -> ["ein", "und", "zwanzig", "tausend", "zwei", "und", "vierzig"]``.
    """
    _check_number(n)
    if n == 0:
        return ["null"]
    thousands, rest = divmod(n, 1000)
    out = _german_below_1000(thousands, last=False) + ["tausend"] if thousands else []
    return out + (_german_below_1000(rest, last=True) if rest else [])


def german(n: int) -> str:
    """``n`` in German, one word. Example: ``german(42) -> "zweiundvierzig"``, ``german(101) -> "einhunderteins"``."""
    return "".join(german_tokens(n))


# --------------------------------------------------------------------------- vocabularies

_SPECIALS = ("<pad>", "<bos>", "<eos>")


class Vocab:
    """A closed word vocabulary: the three special tokens (ids 0, 1, 2), then ``tokens`` in order.

    Example: ``Vocab(["a", "b"]).encode(["b", "a"]) -> [4, 3, 2]`` (``EOS`` appended).
    """

    def __init__(self, tokens):
        self.itos: tuple[str, ...] = _SPECIALS + tuple(tokens)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("vocabulary tokens must be distinct and must not repeat the special tokens")

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: list[str], eos: bool = True) -> list[int]:
        """Ids of ``tokens``, then ``EOS`` (if ``eos``); an unknown token is a ValueError."""
        try:
            ids = [self.stoi[t] for t in tokens]
        except KeyError as e:
            raise ValueError(f"{e.args[0]!r} is not in the vocabulary of {len(self)} tokens") from None
        return ids + [EOS] if eos else ids

    def decode(self, ids) -> list[str]:
        """Tokens of ``ids`` (a list or a 1-D tensor) up to the first ``EOS``, which is dropped."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        if EOS in ids:
            ids = ids[: ids.index(EOS)]
        try:
            return [self.itos[i] for i in ids]
        except IndexError:
            raise ValueError(f"token ids must be in [0, {len(self)}), got {ids}") from None


EN_VOCAB = Vocab(_EN_ONES + [t for t in _EN_TENS if t] + ["hundred", "thousand", "-"])
DE_VOCAB = Vocab(_DE_ONES + ["ein"] + [t for t in _DE_TENS if t] + ["und", "hundert", "tausend"])


# --------------------------------------------------------------------------- splits and batches


@dataclass(frozen=True)
class NumberSplits:
    """Disjoint sets of numbers, each a sorted 1-D ``torch.long`` tensor; together all of ``0 .. MAX_NUMBER``."""

    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor


def number_splits(n_val: int = 2000, n_test: int = 5000, seed: int = 0) -> NumberSplits:
    """The task's fixed split: a seeded permutation of ``0 .. MAX_NUMBER`` cut into test, validation, train.

    Every number is in exactly one split, so no test sentence (and no test source or target
    string, since the number words are one-to-one) is ever trained on. The test and
    validation sets are uniform samples: nine in ten of their numbers have six digits.
    """
    total = MAX_NUMBER + 1
    if n_val < 1 or n_test < 1 or n_val + n_test >= total:
        raise ValueError(f"need n_val, n_test >= 1 and n_val + n_test < {total}, got {n_val} and {n_test}")
    perm = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
    test, val, train_ = perm[:n_test], perm[n_test : n_test + n_val], perm[n_test + n_val :]
    return NumberSplits(train_.sort().values, val.sort().values, test.sort().values)


def _group_shape(g: torch.Tensor) -> torch.Tensor:
    """The shape of 3-digit groups ``g`` (``0 .. 999``): hundreds or not (x 6), then the last two
    digits: none, 1, 2-19, round tens, tens and 1, tens and 2-9. Example: 342 -> 6 + 5 = 11."""
    r = g % 100
    rest = torch.where(
        r == 0,
        0,
        torch.where(
            r == 1, 1, torch.where(r < 20, 2, torch.where(r % 10 == 0, 3, torch.where(r % 10 == 1, 4, 5)))
        ),
    )
    return (g >= 100).long() * 6 + rest


def number_shape(numbers: torch.Tensor) -> torch.Tensor:
    """The structural class (``0 .. 143``) of each number: the shape of its thousands, then of its last three digits.

    Numbers of one class are spelled alike in both languages (the same words in the same
    order, up to which digit); e.g. 342,671 and 567,821 share a class, 342,000 (no last three
    digits) and 342,601 (*...hundertein-s*) each have another. Numbers below 1,000 have empty
    thousands (shape 0).
    """
    return _group_shape(numbers // 1000) * 12 + _group_shape(numbers % 1000)  # (N,)


def _shape_groups(pool: torch.Tensor) -> list[torch.Tensor]:
    """``pool`` split by :func:`number_shape`; only the classes ``pool`` has."""
    shapes = number_shape(pool)  # (N,)
    return [pool[shapes == c] for c in shapes.unique().tolist()]


def sample_numbers(
    pool: torch.Tensor, batch_size: int, generator: torch.Generator, groups: list[torch.Tensor] | None = None
) -> torch.Tensor:
    """``batch_size`` numbers from ``pool``: a structural class (:func:`number_shape`) uniformly, then
    a uniform number of that class.

    Uniform sampling would hardly ever show a rare structure: nine in ten numbers have six
    digits, and one in a thousand of those is a round thousand (342,000), whose German ends
    in *tausend*. Balancing the classes shows each of them as often as any other.

    Args:
        pool: ``(N,)`` numbers, e.g. ``number_splits().train``.
        batch_size: ``B``.
        generator: the source of randomness.
        groups: ``pool`` grouped by class, precomputed with ``_shape_groups`` (optional, for speed).

    Returns:
        ``(B,)`` ``torch.long``.
    """
    groups = _shape_groups(pool) if groups is None else groups
    if not groups:
        raise ValueError("the pool of numbers is empty")
    classes = torch.randint(len(groups), (batch_size,), generator=generator)  # (B,)
    u = torch.rand(batch_size, generator=generator, dtype=torch.float64)  # (B,)
    return torch.stack([groups[c][int(x * len(groups[c]))] for c, x in zip(classes.tolist(), u.tolist())])


def _pad(rows: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out


def make_batch(numbers) -> tuple[torch.Tensor, torch.Tensor]:
    """Source and target token ids of ``numbers`` (a list or a 1-D tensor of ints).

    Returns:
        ``(src (B, S), tgt (B, T))``, ``torch.long``, padded with ``PAD``; the source is the
        English words, the target the German morphemes followed by ``EOS``.
    """
    numbers = numbers.tolist() if isinstance(numbers, torch.Tensor) else list(numbers)
    if not numbers:
        raise ValueError("make_batch needs at least one number")
    src = _pad([EN_VOCAB.encode(english_tokens(n), eos=False) for n in numbers])
    tgt = _pad([DE_VOCAB.encode(german_tokens(n)) for n in numbers])
    return src, tgt


# --------------------------------------------------------------------------- training


def scheduled_sampling(
    model: Seq2Seq, src: torch.Tensor, tgt_in: torch.Tensor, rate: float, generator: torch.Generator
) -> torch.Tensor:
    """Decoder inputs in which each prefix token is, with probability ``rate``, the model's own guess.

    Two passes (Mihaylova & Martins, 2019): a teacher-forced pass without gradients predicts
    every target; shifted right, these guesses are what the decoder would have read had it
    generated the prefix itself. Each token after ``BOS`` is replaced by the guess with
    probability ``rate``; ``BOS`` and padding stay. Train on the result (second pass) to
    expose the model to its own mistakes (Bengio et al., 2015).

    Args:
        model: the model being trained.
        src: ``(B, S)`` source ids.
        tgt_in: ``(B, T)`` teacher-forcing inputs, ``shift_right(targets)``.
        rate: in ``[0, 1]``; 0 returns ``tgt_in`` unchanged.
        generator: which tokens are replaced.

    Returns:
        ``(B, T)`` decoder inputs.
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    if rate == 0.0:
        return tgt_in
    with torch.no_grad():
        guesses = model(src, tgt_in).argmax(dim=-1)  # (B, T): the guess for target t
    own = shift_right(guesses, BOS, PAD)  # (B, T): what the decoder would read
    replace_ = torch.rand(tgt_in.shape, generator=generator) < rate  # (B, T)
    replace_ &= (tgt_in != PAD) & (tgt_in != BOS)
    return torch.where(replace_, own, tgt_in)


@dataclass(frozen=True)
class Seq2SeqRecipe:
    """A model, its training schedule, and the loss's options.

    Args:
        model: the :class:`Seq2SeqConfig`.
        train: :class:`coursekit.train.TrainConfig` (``batch_size`` examples per step).
        smoothing: label smoothing of :func:`label_smoothed_loss`.
        sampling_rate: the final :func:`scheduled_sampling` rate, reached linearly at the
            last step (0: pure teacher forcing).
        val_numbers: how many validation numbers each evaluation translates.
    """

    model: Seq2SeqConfig = field(default_factory=lambda: SEQ2SEQ_PRESETS["small"])
    train: train.TrainConfig = field(
        default_factory=lambda: train.TrainConfig(
            max_steps=500,
            batch_size=128,
            lr=3e-3,
            warmup_steps=50,
            weight_decay=0.01,
            betas=(0.9, 0.98),
            eval_interval=100,
            eval_batches=4,
        )
    )
    smoothing: float = 0.1
    sampling_rate: float = 0.0
    val_numbers: int = 500

    def shortened(self, steps: int) -> Seq2SeqRecipe:
        """The same recipe with ``steps`` training steps (warmup and evaluations scaled along; a smoke run)."""
        cfg = self.train
        return replace(
            self,
            train=replace(
                cfg,
                max_steps=steps,
                warmup_steps=min(cfg.warmup_steps, steps // 10),
                eval_interval=max(1, min(cfg.eval_interval, steps)),
            ),
        )


#: The committed checkpoint's recipe (``coursekit pretrain seq2seq-numbers``).
SEQ2SEQ_NUMBERS = Seq2SeqRecipe()


def _loss_fn(smoothing: float):
    def loss_fn(model, batch):
        src, tgt_in, tgt = batch
        return label_smoothed_loss(model(src, tgt_in), tgt, smoothing)

    return loss_fn


def train_seq2seq(
    model: Seq2Seq, splits: NumberSplits, recipe: Seq2SeqRecipe, *, progress: bool = True
) -> train.History:
    """Train ``model`` on ``splits.train`` with :func:`coursekit.train.train`.

    Each step draws :func:`sample_numbers` from the training split, builds the batch with
    :func:`make_batch` and :func:`shift_right` (and :func:`scheduled_sampling` at the step's
    rate), and minimises :func:`label_smoothed_loss`. Evaluations record ``val_loss`` (on
    ``eval_batches`` fixed validation batches) and ``val_exact`` (greedy exact match on
    ``recipe.val_numbers`` validation numbers, every k-th of the sorted split, so all sizes).
    """
    cfg = recipe.train
    groups = _shape_groups(splits.train)
    loss_fn = _loss_fn(recipe.smoothing)
    ss_gen = torch.Generator().manual_seed(cfg.seed + 2)

    def batch_fn(step, g):
        src, tgt = make_batch(sample_numbers(splits.train, cfg.batch_size, g, groups))
        tgt_in = shift_right(tgt, BOS, PAD)
        if recipe.sampling_rate > 0:
            tgt_in = scheduled_sampling(
                model, src, tgt_in, recipe.sampling_rate * step / cfg.max_steps, ss_gen
            )
        return src, tgt_in, tgt

    val_gen = torch.Generator().manual_seed(1234)
    val_batches = []
    for _ in range(cfg.eval_batches):
        src, tgt = make_batch(sample_numbers(splits.val, cfg.batch_size, val_gen))
        val_batches.append((src, shift_right(tgt, BOS, PAD), tgt))
    val_numbers = splits.val[:: max(1, len(splits.val) // recipe.val_numbers)][
        : recipe.val_numbers
    ]  # spread out

    def eval_fn(m):
        return {
            "val_loss": train.evaluate(m, val_batches, loss_fn),
            "val_exact": evaluate_translation(m, val_numbers)["exact_match"],
        }

    return train.train(model, batch_fn, cfg, loss_fn=loss_fn, eval_fn=eval_fn, progress=progress)


# --------------------------------------------------------------------------- scores


def translate(model: Seq2Seq, numbers, beam_width: int = 1, batch_size: int = 500) -> list[str]:
    """German translations of ``numbers`` (ints or a 1-D tensor), greedy or by beam search."""
    numbers = numbers.tolist() if isinstance(numbers, torch.Tensor) else list(numbers)
    out = []
    for i in range(0, len(numbers), batch_size):
        src, _ = make_batch(numbers[i : i + batch_size])
        if beam_width == 1:
            rows = greedy_decode(model, src)
        else:
            rows = [beam_decode(model, src[j : j + 1], beam_width)[0] for j in range(src.shape[0])]
        out += ["".join(DE_VOCAB.decode(r)) for r in rows]
    return out


def chrf(hypotheses: list[str], references: list[str]) -> float:
    """Corpus chrF (Popović, 2015) of ``hypotheses`` against one reference each, sacrebleu's defaults (0-100)."""
    from sacrebleu.metrics import CHRF

    if len(hypotheses) != len(references):
        raise ValueError(f"need one reference per hypothesis, got {len(hypotheses)} and {len(references)}")
    return CHRF().corpus_score(hypotheses, [references]).score


def evaluate_translation(model: Seq2Seq, numbers, beam_width: int = 1) -> dict:
    """Translate ``numbers`` and score them against :func:`german`.

    Returns:
        ``{"exact_match": fraction, "chrf": 0-100, "n": count, "errors": [(number, reference, output), ...]}``.
    """
    numbers = numbers.tolist() if isinstance(numbers, torch.Tensor) else list(numbers)
    hyps = translate(model, numbers, beam_width)
    refs = [german(n) for n in numbers]
    errors = [(n, r, h) for n, r, h in zip(numbers, refs, hyps) if r != h]
    return {
        "exact_match": 1 - len(errors) / len(numbers),
        "chrf": chrf(hyps, refs),
        "n": len(numbers),
        "errors": errors,
    }


# --------------------------------------------------------------------------- the committed checkpoint

#: What :func:`pretrain_seq2seq_numbers` records.
METRICS = (
    "test_exact_match",
    "test_chrf",
    "test_size",
    "test_errors",
    "eval_seconds",
    "val_during_training",
    "train_seconds",
    "steps",
    "parameters",
    "machine",
)


def pretrain_seq2seq_numbers(recipe: Seq2SeqRecipe = SEQ2SEQ_NUMBERS, progress: bool = True):
    """Train :data:`SEQ2SEQ_NUMBERS` from scratch, round to float16 and measure on the test split.

    Returns:
        ``(model, (EN_VOCAB, DE_VOCAB), recipe, metrics)``: the model (float32 holding the
        float16-rounded weights that are stored and measured), its vocabularies, ``recipe``
        and the metrics (:data:`METRICS`: exact match and chrF on the test split, the first
        errors, training time and steps).
    """
    splits = number_splits()
    torch.manual_seed(recipe.train.seed)
    model = Seq2Seq(recipe.model)
    history = train_seq2seq(model, splits, recipe, progress=progress)
    model.load_state_dict({k: v.half().float() for k, v in model.state_dict().items()})  # what is stored
    started = time.perf_counter()
    result = evaluate_translation(model, splits.test)
    metrics = {
        "test_exact_match": result["exact_match"],
        "test_chrf": result["chrf"],
        "test_size": result["n"],
        "test_errors": [list(e) for e in result["errors"][:50]],
        "eval_seconds": round(time.perf_counter() - started, 1),
        "val_during_training": history.evals,
        "train_seconds": round(history.train_time, 1),
        "steps": len(history.steps),
        "parameters": sum(p.numel() for p in model.parameters()),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
    }
    return model, (EN_VOCAB, DE_VOCAB), recipe, metrics


# --------------------------------------------------------------------------- Exercise 8's experiment


def heldout_loss(
    weights: dict[str, torch.Tensor], n: int, generator: torch.Generator, smoothing: float = 0.1
) -> float:
    """A trained translation model's teacher-forced, label-smoothed loss on held-out numbers.

    Builds ``Seq2Seq(SEQ2SEQ_PRESETS["small"])`` with ``weights`` (e.g. the committed checkpoint's,
    ``checkpoints.load("seq2seq-numbers")[0].state_dict()``), in eval mode; draws ``n`` numbers
    uniformly, with replacement, from the test split (``number_splits().test``: numbers never
    trained on; the indices from ``generator``); builds their source and target ids with
    ``make_batch``; feeds the decoder ``shift_right(targets, BOS, PAD)``; and scores the logits
    (no gradients) with :func:`label_smoothed_loss` at ``smoothing``. The committed model was
    trained with smoothing 0.1, so with 0.1 its loss sits near the floor, the entropy of the
    smoothed target.

    Args:
        weights: a state dict of ``Seq2Seq(SEQ2SEQ_PRESETS["small"])``.
        n: how many numbers to draw, at least 1.
        generator: the source of randomness (the same seed gives the same result).
        smoothing: the loss's label smoothing, in ``[0, 1]``.

    Returns:
        The loss as a Python ``float``.

    Example:
        ``heldout_loss(weights, 256, torch.Generator().manual_seed(0))`` is about 0.66 for the
        committed checkpoint's weights.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing must be in [0, 1], got {smoothing!r}")
    model = Seq2Seq(SEQ2SEQ_PRESETS["small"])
    model.load_state_dict(weights)
    model.eval()
    test = number_splits().test  # (5000,)
    numbers = test[torch.randint(len(test), (n,), generator=generator)]  # (n,)
    src, tgt = make_batch(numbers)  # (n, S), (n, T)
    with torch.no_grad():
        logits = model(src, shift_right(tgt, BOS, PAD))  # (n, T, V)
        return label_smoothed_loss(logits, tgt, smoothing).item()
