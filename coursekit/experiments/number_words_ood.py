"""Chapter 8's out-of-distribution experiment: number words whose *structure* was never trained on.

The chapter's test split is drawn from the same numbers as its training split, so it asks
whether the model learnt the structures it was shown. Here two structures are held out of
training altogether (:func:`held_out`), and the chapter's model and recipe
(:data:`~coursekit.experiments.number_words.SEQ2SEQ_NUMBERS`) are trained on the rest:

- ``"seven-hundred"`` (:func:`has_seven_hundred`): a 7 in a hundreds place, in either
  three-digit group (712, 700,005, 345,789). *sieben* is trained in every other slot (*sieben*,
  *siebenundzwanzig*, *siebentausend*), *hundert* after every other digit word; the pair
  *sieben hundert* is never seen.
- ``"seventy-x"`` (:func:`has_seventy_x`): a two-digit ending 71 to 79, in either group
  (73, 171,000, 5,078). *siebzig* is trained alone (70, 170) and every unit before *und*
  with every other tens word, but *und siebzig*, the German units-before-tens order with
  seventy, is never seen.

Three evaluation sets (:func:`eval_sets`, :data:`EVAL_N` numbers each, spread over their range):
``"in-distribution"`` from the chapter's test split without the held-out numbers, and one for
each held-out structure (numbers with that structure and not the other one; none of them is
in training). Each is scored (:func:`score`) by exact match, chrF (Popović, 2015) and BLEU
(Papineni et al., 2002) on whole words and on the model's morphemes. A wrong output is put in
one of :data:`CATEGORIES` by :func:`classify_error`.

``python -m coursekit.experiments.number_words_ood`` trains one model per seed of :data:`SEEDS`
(the chapter's 500 steps, one to two minutes each on one thread) and rewrites
:data:`RESULTS`: the metrics per seed and set, and every wrong output, from which the page
rebuilds any prediction (a right one is the reference).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import torch

from coursekit.experiments import number_words as num
from coursekit.experiments._results import CommittedResults
from coursekit.seq2seq import Seq2Seq, bleu, greedy_decode

__all__ = [
    "CATEGORIES",
    "EVAL_N",
    "FAMILIES",
    "RESULTS",
    "SEEDS",
    "SETS",
    "classify_error",
    "eval_sets",
    "has_seven_hundred",
    "has_seventy_x",
    "held_out",
    "load_results",
    "ood_splits",
    "parse_german",
    "recipe",
    "run_seed",
    "score",
    "settings",
    "train_model",
    "translate_morphemes",
]

FAMILIES = ("seven-hundred", "seventy-x")  #: the held-out structures
SETS = ("in-distribution",) + FAMILIES  #: the evaluation sets
EVAL_N = 1000  #: numbers per evaluation set
SEEDS = (0, 1, 2)
RESULTS = Path(__file__).with_name("number_words_ood_results.json")
_COMMITTED = CommittedResults(
    module="coursekit.experiments.number_words_ood",
    path=RESULTS,
    fmt="coursekit-number-words-ood",
    version=1,
    what="stored out-of-distribution number-word experiment",
    seeds=SEEDS,
)


# --------------------------------------------------------------------------- the held-out structures


def _groups(numbers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return numbers // 1000, numbers % 1000  # (N,), (N,): thousands and last three digits


def has_seven_hundred(numbers: torch.Tensor) -> torch.Tensor:
    """Whether a 7 stands in a hundreds place (of the thousands or of the last three digits).

    Example: ``[712, 700005, 345789, 7000, 77] -> [True, True, True, False, False]``.

    Args:
        numbers: ``(N,)`` integers in ``0 .. MAX_NUMBER``.

    Returns:
        ``(N,)`` boolean.
    """
    high, low = _groups(numbers)
    return (high // 100 == 7) | (low // 100 == 7)


def has_seventy_x(numbers: torch.Tensor) -> torch.Tensor:
    """Whether a three-digit group ends in 71 .. 79 (German *...undsiebzig*).

    Example: ``[73, 171000, 5078, 70, 170, 717] -> [True, True, True, False, False, False]``.

    Args:
        numbers: ``(N,)`` integers in ``0 .. MAX_NUMBER``.

    Returns:
        ``(N,)`` boolean.
    """
    high, low = _groups(numbers)
    return ((high % 100 > 70) & (high % 100 < 80)) | ((low % 100 > 70) & (low % 100 < 80))


def held_out(numbers: torch.Tensor) -> torch.Tensor:
    """``(N,)`` boolean: the number has a held-out structure (:func:`has_seven_hundred` or :func:`has_seventy_x`)."""
    return has_seven_hundred(numbers) | has_seventy_x(numbers)


def ood_splits() -> num.NumberSplits:
    """The chapter's split (:func:`~coursekit.experiments.number_words.number_splits`) without the held-out numbers."""
    splits = num.number_splits()
    return num.NumberSplits(*(s[~held_out(s)] for s in (splits.train, splits.val, splits.test)))


def _spread(pool: torch.Tensor, n: int) -> list[int]:
    """``n`` numbers of the sorted ``pool``, evenly spaced (so every size and structure is represented)."""
    if len(pool) < n:
        raise ValueError(f"the pool holds {len(pool)} numbers, fewer than {n}")
    index = torch.arange(n) * len(pool) // n  # (n,)
    return pool[index].tolist()


def eval_sets(n: int = EVAL_N) -> dict[str, list[int]]:
    """The evaluation sets of :data:`SETS`, ``n`` sorted numbers each, evenly spread over their pools.

    ``"in-distribution"``: the chapter's test split without the held-out numbers (never trained on,
    structures that were). ``"seven-hundred"`` / ``"seventy-x"``: every number with that structure
    and not the other one (held out of training, like every number of its kind).
    """
    everything = torch.arange(num.MAX_NUMBER + 1)
    a, b = has_seven_hundred(everything), has_seventy_x(everything)
    return {
        "in-distribution": _spread(ood_splits().test, n),
        "seven-hundred": _spread(everything[a & ~b], n),
        "seventy-x": _spread(everything[b & ~a], n),
    }


# --------------------------------------------------------------------------- training and scoring


def recipe(seed: int = 0) -> num.Seq2SeqRecipe:
    """The chapter's recipe with training seed ``seed`` and one evaluation at the end (evaluations do
    not change training; :data:`~coursekit.experiments.number_words.SEQ2SEQ_NUMBERS` has the rest)."""
    base = num.SEQ2SEQ_NUMBERS
    return replace(
        base, train=replace(base.train, seed=seed, eval_interval=base.train.max_steps), val_numbers=200
    )


def train_model(seed: int, progress: bool = False) -> tuple[Seq2Seq, float]:
    """The chapter's model trained by :func:`recipe` on :func:`ood_splits`.

    Returns:
        ``(model in eval mode, training seconds)``.
    """
    r = recipe(seed)
    torch.manual_seed(seed)  # the initial weights, as pretrain_seq2seq_numbers does
    model = Seq2Seq(r.model)
    history = num.train_seq2seq(model, ood_splits(), r, progress=progress)
    return model.eval(), history.train_time


def translate_morphemes(model: Seq2Seq, numbers: list[int], batch_size: int = 500) -> list[str]:
    """Greedy translations of ``numbers`` as the model writes them: German morphemes joined by spaces.

    Example: a right translation of 42 is ``"zwei und vierzig"``; ``"".join(s.split())`` is the German word.
    """
    out = []
    for i in range(0, len(numbers), batch_size):
        src, _ = num.make_batch(numbers[i : i + batch_size])
        out += [" ".join(num.DE_VOCAB.decode(row)) for row in greedy_decode(model, src)]
    return out


def score(numbers: list[int], hypotheses: list[str]) -> dict[str, float]:
    """Exact match, chrF and three BLEUs of morpheme ``hypotheses`` (as :func:`translate_morphemes` writes them).

    Returns:
        ``{"exact_match": fraction, "chrf": chrF of the German words, "bleu_words": BLEU of the
        words (4-grams, sacrebleu's defaults), "bleu_words_effective": the same with effective
        order, "bleu_morphemes": BLEU of the space-separated morphemes}``; the scores 0-100,
        rounded to 4 decimals.
    """
    if len(numbers) != len(hypotheses):
        raise ValueError(f"need one hypothesis per number, got {len(numbers)} and {len(hypotheses)}")
    ref_morphemes = [" ".join(num.german_tokens(n)) for n in numbers]
    words = ["".join(h.split()) for h in hypotheses]
    ref_words = [num.german(n) for n in numbers]
    metrics = {
        "exact_match": sum(h == r for h, r in zip(words, ref_words)) / len(numbers),
        "chrf": num.chrf(words, ref_words),
        "bleu_words": bleu(words, ref_words),
        "bleu_words_effective": bleu(words, ref_words, effective_order=True),
        "bleu_morphemes": bleu(hypotheses, ref_morphemes),
    }
    return {k: round(v, 4) for k, v in metrics.items()}


def run_seed(seed: int, sets: dict[str, list[int]] | None = None) -> dict:
    """Train with ``seed`` and score every evaluation set.

    Returns:
        ``{"train_seconds": s, "sets": {name: {"metrics": score(...), "errors": [[number,
        hypothesis morphemes], ...]}}}``: every wrong output, in the set's order.
    """
    sets = eval_sets() if sets is None else sets
    model, seconds = train_model(seed)
    out = {}
    for name, numbers in sets.items():
        hyps = translate_morphemes(model, numbers)
        errors = [[n, h] for n, h in zip(numbers, hyps) if h.split() != num.german_tokens(n)]
        out[name] = {"metrics": score(numbers, hyps), "errors": errors}
    return {"train_seconds": round(seconds, 1), "sets": out}


# --------------------------------------------------------------------------- error analysis

_UNITS = {"ein", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"}
_TENS = {"zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig"}
_TEENS = {
    "zehn",
    "elf",
    "zwölf",
    "dreizehn",
    "vierzehn",
    "fünfzehn",
    "sechzehn",
    "siebzehn",
    "achtzehn",
    "neunzehn",
}
_DIGIT_WORDS = _UNITS | _TENS | _TEENS
_INNER = {tuple(num.german_tokens(g * 1000)[:-1]): g for g in range(1, 1000)}  # a thousands group
_LAST = {tuple(num.german_tokens(g)): g for g in range(1, 1000)}  # the last three digits

#: The error categories of :func:`classify_error`, in the order they are tested.
CATEGORIES = (
    "repeated words",
    "tens before unit",
    "missing und",
    "hundert left out",
    "unit left out",
    "other part left out",
    "unit moved later",
    "one wrong digit word",
    "other",
)


def parse_german(tokens: list[str]) -> int | None:
    """The number whose German morphemes are exactly ``tokens``, or ``None`` if there is none.

    The inverse of :func:`~coursekit.experiments.number_words.german_tokens`: spelling slips
    (``eins`` inside a number, ``ein`` at its end, a missing ``und``) are not numbers.
    Example: ``["sieben", "und", "dreißig"] -> 37``, ``["dreißig", "sieben"] -> None``.
    """
    if tokens == ["null"]:
        return 0
    key = tuple(tokens)
    if "tausend" not in key:
        return _LAST.get(key)
    cut = key.index("tausend")
    high, low = _INNER.get(key[:cut]), key[cut + 1 :]
    if high is None:
        return None
    if not low:
        return high * 1000
    return None if _LAST.get(low) is None else high * 1000 + _LAST[low]


def _is_subsequence(short: list[str], long: list[str]) -> bool:
    it = iter(long)
    return all(t in it for t in short)


def _repeats(tokens: list[str]) -> bool:
    """Whether a morpheme or a pair of morphemes comes twice in a row (``sieben und sieben und``)."""
    return any(
        tokens[i : i + k] == tokens[i + k : i + 2 * k] for k in (1, 2) for i in range(len(tokens) - 2 * k + 1)
    )


def _unit_moved(reference: list[str], hypothesis: list[str]) -> bool:
    """Whether ``hypothesis`` is ``reference`` with a unit and its *und* taken out and that unit written
    in place of one later digit word (``siebzig tausend ein und neunzig`` for 71,097)."""
    same = {"eins": "ein"}.get  # the unit is "ein" inside a number and "eins" at its end
    for i in range(len(reference) - 1):
        if reference[i] in _UNITS and reference[i + 1] == "und":
            rest = reference[:i] + reference[i + 2 :]
            if len(rest) != len(hypothesis):
                continue
            diff = [j for j, (a, b) in enumerate(zip(rest, hypothesis)) if a != b]
            unit = same(reference[i], reference[i])
            if len(diff) == 1 and diff[0] >= i and same(hypothesis[diff[0]], hypothesis[diff[0]]) == unit:
                return True
    return False


def classify_error(number: int, hypothesis: list[str]) -> str:
    """The kind of a wrong translation of ``number``: the first of :data:`CATEGORIES` that applies.

    With the reference ``german_tokens(number)``, e.g. ``sieben hundert drei und dreißig`` for 733:

    - ``"repeated words"``: a morpheme or a pair comes twice in a row, which no German number
      does (``sieben und sieben und``);
    - ``"tens before unit"``: a tens word directly followed by a unit word or by *und*, the English
      order (``dreißig drei``, ``dreißig und drei`` for 33);
    - ``"missing und"``: a unit word directly followed by a tens word (``drei dreißig``);
    - ``"hundert left out"``: the reference with some morphemes left out, *hundert* among them
      (``sieben und dreißig``: 733 written as 37);
    - ``"unit left out"``: the reference with only unit words and *und* left out (``siebzig`` for 73);
    - ``"other part left out"``: the reference with other morphemes left out (``sieben hundert`` for 733);
    - ``"unit moved later"``: a unit and its *und* left out, and the unit written in place of a
      later digit word (``siebzig tausend ein und neunzig`` for 71,097);
    - ``"one wrong digit word"``: the reference with one digit word replaced by another
      (``sieben hundert drei und vierzig``);
    - ``"other"``: anything else (several changes, or words added).

    Args:
        number: the source number.
        hypothesis: the model's German morphemes (``translate_morphemes(...)[i].split()``).

    Raises:
        ValueError: if ``hypothesis`` is the right translation (it is no error).
    """
    reference = num.german_tokens(number)
    if hypothesis == reference:
        raise ValueError(
            f"{' '.join(hypothesis)!r} is the right translation of {number}: no error to classify"
        )
    pairs = list(zip(hypothesis, hypothesis[1:]))
    if _repeats(hypothesis):
        return "repeated words"
    if any(a in _TENS and (b in _UNITS or b == "und") for a, b in pairs):
        return "tens before unit"
    if any(a in _UNITS and b in _TENS for a, b in pairs):
        return "missing und"
    if _is_subsequence(hypothesis, reference):
        left_out = set(Counter(reference) - Counter(hypothesis))
        if "hundert" in left_out:
            return "hundert left out"
        return (
            "unit left out" if "und" in left_out and left_out <= _UNITS | {"und"} else "other part left out"
        )
    if _unit_moved(reference, hypothesis):
        return "unit moved later"
    changed = [(a, b) for a, b in zip(reference, hypothesis) if a != b]
    if len(hypothesis) == len(reference) and len(changed) == 1 and set(changed[0]) <= _DIGIT_WORDS:
        return "one wrong digit word"
    return "other"


# --------------------------------------------------------------------------- committed results


def settings() -> dict:
    """What the stored runs depend on besides the code: the recipe, the held-out structures, the sets."""
    r = recipe(0)
    stored = {
        "model": asdict(r.model),
        "train": {k: v for k, v in asdict(r.train).items() if k != "seed"},
        "smoothing": r.smoothing,
        "sampling_rate": r.sampling_rate,
        "families": list(FAMILIES),
        "sets": list(SETS),
        "eval_n": EVAL_N,
        "train_size": len(ood_splits().train),
    }
    return json.loads(json.dumps(stored))  # as the file holds it: lists, not tuples


def load_results(path: str | Path = RESULTS) -> dict:
    """The stored runs: ``{"seeds": [...], "settings": settings(), "runs": [run_seed(s) for s in seeds]}``.

    Raises:
        ValueError: if the file was written with other settings than the code's (rerun
            ``python -m coursekit.experiments.number_words_ood``).
    """
    return _COMMITTED.read(
        path,
        settings=settings(),
        layout_ok=lambda data: (
            len(data["runs"]) == len(data["seeds"])
            and all(list(run["sets"]) == list(SETS) for run in data["runs"])
        ),
    )


def main(argv: list[str] | None = None) -> None:

    def run(args) -> dict:
        start, sets, runs = time.perf_counter(), eval_sets(), []
        for seed in args.seeds:
            runs.append(run_seed(seed, sets))
            summary = {name: s["metrics"]["exact_match"] for name, s in runs[-1]["sets"].items()}
            print(f"seed {seed}: exact match {summary} ({time.perf_counter() - start:.0f} s)")
        return {"settings": settings(), "runs": runs}

    _COMMITTED.main(
        argv,
        "Rerun Chapter 8's out-of-distribution experiment (held-out number structures) for several seeds.",
        run,
    )


if __name__ == "__main__":
    main()
