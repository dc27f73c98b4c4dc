"""Chapter 7: turning next-token logits into text: greedy, sampling (temperature, top-k, top-p), beam search.

Every decoder here drives a *language model*: a module called as ``model(idx, cache=cache)``
that returns logits ``(B, T, V)`` and has ``init_cache(batch_size, max_len)`` returning a
cache with ``length`` and ``reorder(index)`` (:class:`coursekit.gpt.GPT` is one). With
``use_cache=True`` the prompt is run once and each step feeds only the newest token; with
``use_cache=False`` every step re-runs the whole (cropped) context. Both give the same
tokens (a test checks it), the cache only saves work.

The filters act on logits and return logits, so they compose:
``sample_next`` divides by the temperature, applies top-k, then top-p, and samples from the
softmax of what is left. Randomness is explicit: every sampler takes a ``torch.Generator``.

- **top-k** (Fan et al., 2018) keeps the ``k`` largest logits (ties with the ``k``-th are kept).
- **top-p** or nucleus sampling (Holtzman et al., 2020) keeps the smallest set of most
  likely tokens whose probabilities sum to at least ``p``: the token whose probability
  *crosses* ``p`` is kept, so at least one token always survives.
- **min-p** (Nguyen et al., 2024) keeps the tokens whose probability is at least ``p_base``
  times the top token's: the cut-off follows the model's confidence.
- **repetition penalty** (Keskar et al., 2019, CTRL) and **no-repeat n-gram blocking** (Paulus
  et al., 2018) are *logits processors*: they also read the ids so far ``(B, T)``, and
  :func:`generate` applies them (``logits_processors``) before the temperature.
- **beam search** keeps the ``W`` best partial sequences by total log-probability; finished
  ones (ending in EOS) are ranked by ``log p / length ** alpha``, the length normalisation of
  Hugging Face's ``generate`` (``alpha = 0`` is the raw sum, which favours short outputs); Wu et
  al. (2016) divide by ``((5 + length) / 6) ** alpha`` instead.
- **batched generation** of prompts of different lengths (:func:`generate_batch`) left-pads them
  (:func:`left_pad`) and passes the model an ``attention_mask``; each row comes out exactly as
  :func:`generate` would return it for that prompt alone.

Over 500 lines: every decoding strategy of Chapter 7 is one reader's page, in the order the
chapter teaches them; splitting samplers from searches would send readers between two files for
one ``generate`` loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "top_k_filter",
    "top_p_filter",
    "min_p_filter",
    "repetition_penalty",
    "no_repeat_ngram_filter",
    "LogitsProcessor",
    "sample_next",
    "generate",
    "left_pad",
    "generate_batch",
    "beam_search",
    "sequence_logprob",
]


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits of each row, set the rest to ``-inf``.

    Example: ``top_k_filter([1., 3., 2.], 2) -> [-inf, 3., 2.]``. Values tied with the
    ``k``-th largest are all kept (as in Hugging Face's ``TopKLogitsWarper``).

    Args:
        logits: ``(..., V)``.
        k: how many to keep, ``1 <= k``; ``k >= V`` keeps everything.

    Returns:
        ``(..., V)`` of ``logits``' dtype; ``logits`` is not changed.

    Raises:
        ValueError: if ``k`` is not a positive integer.
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1): the k-th largest
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability sums to at least ``p``.

    Sort by probability; a token is kept if the probability of the tokens ranked *before*
    it is still below ``p``. So the token that crosses ``p`` is kept, and the most likely
    token always is. Example: probabilities ``[0.5, 0.3, 0.2]`` with ``p = 0.6`` keep
    the first two (0.5 < 0.6, so the 0.3 that crosses it stays).

    Args:
        logits: ``(..., V)``.
        p: in ``(0, 1]``; ``1`` keeps every token with non-zero probability.

    Returns:
        ``(..., V)`` of ``logits``' dtype, with ``-inf`` at dropped tokens; ``logits`` is not changed.

    Raises:
        ValueError: unless ``0 < p <= 1``.
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V)
    probs = F.softmax(sorted_logits, dim=-1)  # (..., V)
    before = probs.cumsum(dim=-1) - probs  # (..., V): mass ranked strictly above each token
    drop_sorted = before >= p  # the first token has before = 0 < p: never dropped
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def min_p_filter(logits: torch.Tensor, p_base: float) -> torch.Tensor:
    """Keep the tokens whose probability is at least ``p_base`` times the most likely token's.

    Min-p sampling (Nguyen et al., 2024), as Hugging Face's ``MinPLogitsWarper`` defines it:
    with probabilities ``probs = softmax(logits)``, a token is dropped when
    ``probs < p_base * probs.max()``. A confident model (one token near 1) keeps few tokens, an
    unsure one (a flat distribution) keeps many. The most likely token is always kept.
    Example: probabilities ``[0.5, 0.3, 0.15, 0.05]`` with ``p_base = 0.2`` keep the first three
    (the threshold is ``0.2 * 0.5 = 0.1``).

    Args:
        logits: ``(..., V)``.
        p_base: in ``[0, 1]``; ``0`` keeps every token with non-zero probability, ``1`` only the
            tokens tied with the most likely.

    Returns:
        ``(..., V)`` of ``logits``' dtype, with ``-inf`` at dropped tokens; ``logits`` is not changed.

    Raises:
        ValueError: unless ``0 <= p_base <= 1``.
    """
    if not 0.0 <= p_base <= 1.0:
        raise ValueError(f"p_base must be in [0, 1], got {p_base}")
    probs = F.softmax(logits, dim=-1)  # (..., V)
    threshold = p_base * probs.amax(dim=-1, keepdim=True)  # (..., 1)
    return logits.masked_fill(probs < threshold, float("-inf"))


#: A logits processor: ``(logits (B, V), ids so far (B, T)) -> logits (B, V)``; bind extra arguments
#: with ``functools.partial``, e.g. ``partial(repetition_penalty, penalty=1.3)``.
LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _check_processor_inputs(logits: torch.Tensor, prev_ids: torch.Tensor) -> None:
    if logits.dim() != 2 or prev_ids.dim() != 2 or logits.shape[0] != prev_ids.shape[0]:
        raise ValueError(
            f"expected logits (B, V) and prev_ids (B, T) with the same B, "
            f"got {tuple(logits.shape)} and {tuple(prev_ids.shape)}"
        )
    if prev_ids.dtype != torch.long:
        raise ValueError(f"prev_ids must be torch.long token ids, got {prev_ids.dtype}")


def repetition_penalty(logits: torch.Tensor, prev_ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """Make every token that already occurs in ``prev_ids`` less likely, by a factor on its logit.

    The repetition penalty of CTRL (Keskar et al., 2019) with the sign rule of Hugging Face's
    ``RepetitionPenaltyLogitsProcessor``: a seen token's logit ``z`` becomes ``z / penalty`` if
    ``z > 0`` and ``z * penalty`` if ``z < 0``, so ``penalty > 1`` always lowers it (dividing a
    negative logit, as the paper's formula does, would raise it). A token is penalised once, however
    often it occurs; ``penalty < 1`` rewards repeats instead. Example: logits ``[2., -1., 0.5]``,
    ``prev_ids [[0, 1, 0]]``, ``penalty 2`` -> ``[1., -2., 0.5]``.

    Args:
        logits: ``(B, V)`` next-token logits.
        prev_ids: ``(B, T)`` ``torch.long`` ids of the text so far (prompt included), ``T >= 0``.
        penalty: ``> 0``; ``1`` changes nothing.

    Returns:
        ``(B, V)`` of ``logits``' dtype; ``logits`` is not changed.

    Raises:
        ValueError: for shapes that do not match, non-long ids, or ``penalty <= 0``.
    """
    _check_processor_inputs(logits, prev_ids)
    if not penalty > 0 or not math.isfinite(penalty):
        raise ValueError(f"penalty must be a finite number > 0, got {penalty}")
    seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, prev_ids, True)  # (B, V)
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)  # (B, V)
    return torch.where(seen, penalised, logits)


def no_repeat_ngram_filter(logits: torch.Tensor, prev_ids: torch.Tensor, n: int) -> torch.Tensor:
    """Forbid every token that would complete an ``n``-gram already present in ``prev_ids``.

    The ``n - 1`` last ids are the start of the ``n``-gram the next token would complete; wherever
    the same ``n - 1`` ids occur earlier, the token that followed them there is set to ``-inf``
    (the n-gram blocking of Paulus et al., 2018, as Hugging Face's ``NoRepeatNGramLogitsProcessor``
    does it; ``n = 1`` forbids every token seen). Example with ``n = 2`` and ``prev_ids
    [[5, 7, 5]]``: the last id is ``5``, which was followed by ``7`` before, so ``7`` is forbidden.

    Args:
        logits: ``(B, V)`` next-token logits.
        prev_ids: ``(B, T)`` ``torch.long`` ids of the text so far (prompt included).
        n: the n-gram length, a positive integer; with ``T < n`` nothing is forbidden.

    Returns:
        ``(B, V)`` of ``logits``' dtype with ``-inf`` at forbidden tokens; ``logits`` is not changed.

    Raises:
        ValueError: for shapes that do not match, non-long ids, or ``n`` not a positive integer.
    """
    _check_processor_inputs(logits, prev_ids)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    B, T = prev_ids.shape
    if T < n:
        return logits.clone()
    grams = prev_ids.unfold(1, n, 1)  # (B, T - n + 1, n): every n-gram so far
    last = prev_ids[:, T - n + 1 :]  # (B, n - 1): what the next token would extend
    match = (grams[..., :-1] == last[:, None, :]).all(dim=-1)  # (B, T - n + 1)
    banned = torch.zeros(B, logits.shape[1] + 1, dtype=torch.bool, device=logits.device)  # (B, V + 1)
    # a gram that does not match writes into the spare last column instead of banning its last token
    banned.scatter_(1, torch.where(match, grams[..., -1], logits.shape[1]), True)
    return logits.masked_fill(banned[:, :-1], float("-inf"))


def sample_next(
    logits: torch.Tensor,
    generator: torch.Generator | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Choose the next token of each row from its logits.

    Args:
        logits: ``(B, V)``.
        generator: the source of randomness; required unless ``temperature == 0``.
        temperature: divides the logits; ``0`` means greedy (the argmax, no randomness).
        top_k: apply :func:`top_k_filter` (after the temperature).
        top_p: apply :func:`top_p_filter` (after top-k).

    Returns:
        ``(B,)`` token ids, ``torch.long``.
    """
    if logits.dim() != 2:
        raise ValueError(f"expected logits (B, V), got {tuple(logits.shape)}")
    if temperature < 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1)  # (B,)
    if generator is None:
        raise ValueError("sampling needs an explicit torch.Generator (or temperature=0 for greedy decoding)")
    logits = logits / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = F.softmax(logits.float(), dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    use_cache: bool = True,
    logits_processors: Sequence[LogitsProcessor] = (),
) -> torch.Tensor:
    """Extend ``prompt`` by up to ``max_new_tokens`` tokens, one at a time.

    Greedy by default (``temperature=0``); a positive temperature samples with
    :func:`sample_next`. After a row emits ``eos_id`` it is padded with ``eos_id``, and
    decoding stops when every row has finished. The model is put in eval mode and its
    mode restored.

    Args:
        model: a language model (see the module docstring) with ``cfg.block_size``.
        prompt: ``(B, T0)`` token ids, ``T0 >= 1``.
        max_new_tokens: at most this many new tokens per row.
        temperature, top_k, top_p, generator: as :func:`sample_next`.
        eos_id: the end-of-sequence token, or ``None`` to always generate ``max_new_tokens``.
        use_cache: keep a KV cache (needs ``T0 + max_new_tokens <= block_size``); without it
            each step re-reads the last ``block_size`` tokens.
        logits_processors: applied in order to each step's logits with the ids so far ``(B, t)``,
            before the temperature (e.g. :func:`repetition_penalty`, :func:`no_repeat_ngram_filter`).

    Returns:
        ``(B, T0 + n)`` with ``n <= max_new_tokens`` new tokens.
    """
    if prompt.dim() != 2 or prompt.shape[1] < 1 or prompt.dtype != torch.long:
        raise ValueError(
            f"prompt must be (B, T0) torch.long token ids with T0 >= 1, got {prompt.dtype} {tuple(prompt.shape)}"
        )
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    block = model.cfg.block_size
    B, T0 = prompt.shape
    if use_cache and T0 + max_new_tokens > block:
        raise ValueError(
            f"prompt ({T0}) + max_new_tokens ({max_new_tokens}) exceed block_size={block}: "
            "use_cache=False crops the context instead"
        )
    was_training = model.training
    model.eval()
    try:
        out = prompt
        done = torch.zeros(B, dtype=torch.bool, device=prompt.device)
        cache = model.init_cache(B, T0 + max_new_tokens) if use_cache else None
        step_input = prompt
        for _ in range(max_new_tokens):
            logits = model(step_input if use_cache else out[:, -block:], cache=cache)[:, -1]  # (B, V)
            for process in logits_processors:
                logits = process(logits, out)
            nxt = sample_next(logits, generator, temperature, top_k, top_p)  # (B,)
            if eos_id is not None:
                nxt = nxt.masked_fill(done, eos_id)
                done = done | (nxt == eos_id)
            out = torch.cat([out, nxt[:, None]], dim=1)  # (B, t + 1)
            step_input = nxt[:, None]  # (B, 1)
            if eos_id is not None and bool(done.all()):
                break
        return out
    finally:
        model.train(was_training)


def left_pad(prompts: Sequence[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack prompts of different lengths into one batch, padded on the left, and their mask.

    Example: ``[[5, 6, 7], [8]]`` with ``pad_id = 0`` -> ids ``[[5, 6, 7], [0, 0, 8]]`` and mask
    ``[[1, 1, 1], [0, 0, 1]]`` (as booleans): every row's last real token is in the last column.

    Args:
        prompts: ``B >= 1`` one-dimensional ``torch.long`` tensors of ``>= 1`` token ids each, on one device.
        pad_id: the id written into the padding (any id the model can embed; it is masked out).

    Returns:
        ``ids (B, T_max)`` ``torch.long`` and ``mask (B, T_max)`` boolean, ``True`` at real tokens.

    Raises:
        ValueError: for an empty list, or a prompt that is not 1-D ``torch.long`` with at least one token.
    """
    if isinstance(prompts, torch.Tensor) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of 1-D token id tensors")
    for i, p in enumerate(prompts):
        if not isinstance(p, torch.Tensor) or p.dim() != 1 or p.numel() < 1 or p.dtype != torch.long:
            got = f"{p.dtype} {tuple(p.shape)}" if isinstance(p, torch.Tensor) else type(p).__name__
            raise ValueError(f"prompt {i} must be a 1-D torch.long tensor of at least 1 token id, got {got}")
    B, T = len(prompts), max(p.numel() for p in prompts)
    device = prompts[0].device
    ids = torch.full((B, T), pad_id, dtype=torch.long, device=device)  # (B, T_max)
    mask = torch.zeros(B, T, dtype=torch.bool, device=device)  # (B, T_max)
    for i, p in enumerate(prompts):
        ids[i, T - p.numel() :] = p
        mask[i, T - p.numel() :] = True
    return ids, mask


@torch.no_grad()
def generate_batch(
    model: nn.Module,
    prompts: Sequence[torch.Tensor],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    eos_id: int | None = None,
    pad_id: int = 0,
    use_cache: bool = True,
    logits_processors: Sequence[LogitsProcessor] = (),
) -> list[torch.Tensor]:
    """Extend prompts of different lengths in one batch; row ``i`` is what :func:`generate` writes alone.

    The prompts are padded on the left (:func:`left_pad`) so that every row's newest token is in
    the last column, where each step reads the logits and appends the next token. The model gets an
    ``attention_mask`` (``True`` at real tokens) at every step, which masks the padding keys out and
    starts each row's positions at 0 at its first real token; with the KV cache the mask covers the
    cached positions too. A row that emits ``eos_id`` is finished: it is fed ``eos_id`` from then on
    (those tokens are cut from the result), and decoding stops when every row has finished.

    Which outputs equal one-by-one decoding, ``generate(model, prompts[i][None], ...)[0]``:

    - greedy (``temperature=0``): every row, with or without the cache;
    - sampling with a *list* of generators, one per row: row ``i`` draws from ``generator[i]`` exactly
      the numbers ``generate`` draws from a generator in the same state, and only while the row is
      unfinished, so its text (and the generator's final state) are the one-by-one run's;
    - sampling with one shared generator: a valid sample of every row, but not the one-by-one texts
      (the rows' draws interleave); for a single prompt it is ``generate``'s.

    "Equal" holds exactly in exact arithmetic; in floating point a padded row's logits differ from the
    unpadded row's by rounding (about ``1e-7`` in float32), so a token could differ only where two
    candidates tie to that precision.

    Args:
        model: a :class:`~coursekit.gpt.GPT`, or any language model (see the module docstring) whose
            ``forward`` also takes ``attention_mask (B, P + T)``.
        prompts: ``B`` one-dimensional ``torch.long`` tensors of token ids, each of length ``>= 1``.
        max_new_tokens: at most this many new tokens per row, ``>= 0``.
        temperature, top_k, top_p: as :func:`sample_next`.
        generator: one ``torch.Generator``, or a list of ``B`` (see above); required unless greedy.
        eos_id: the end-of-sequence token, or ``None`` to always generate ``max_new_tokens``.
        pad_id: the id in the padding, a valid token id; it never changes the result.
        use_cache: keep a KV cache (needs ``longest prompt + max_new_tokens <= block_size``, the padding
            counts); without it each step re-reads the last ``block_size`` columns.
        logits_processors: as in :func:`generate`; each row's processors see that row's ids without
            its padding.

    Returns:
        A list of ``B`` one-dimensional ``torch.long`` tensors: prompt ``i`` and its new tokens (up to and
        including its first ``eos_id``), no padding. The model's mode is restored.

    Raises:
        ValueError: for bad prompts (see :func:`left_pad`), ``max_new_tokens < 0``, a generator list whose
        length is not ``B``, or (with the cache) a padded length past ``block_size``.
    """
    ids, mask = left_pad(prompts, pad_id)  # (B, T0), (B, T0)
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    B, T0 = ids.shape
    per_row = generator is not None and not isinstance(generator, torch.Generator)
    if per_row and (len(generator) != B or not all(isinstance(g, torch.Generator) for g in generator)):
        raise ValueError(f"generator must be one torch.Generator or a list of {B} (one per prompt)")
    block = model.cfg.block_size
    if use_cache and T0 + max_new_tokens > block:
        raise ValueError(
            f"the longest prompt ({T0}) + max_new_tokens ({max_new_tokens}) exceed block_size={block}: "
            "use_cache=False crops the context instead"
        )
    lengths = [p.numel() for p in prompts]
    was_training = model.training
    model.eval()
    try:
        out, out_mask = ids, mask  # (B, t), (B, t): t = T0 + steps so far
        done = torch.zeros(B, dtype=torch.bool, device=ids.device)
        n_new = [max_new_tokens] * B  # a row's new tokens, EOS included; cut down when it finishes
        cache = model.init_cache(B, T0 + max_new_tokens) if use_cache else None
        step_input, steps = ids, 0
        for step in range(max_new_tokens):
            if use_cache:
                logits = model(step_input, cache=cache, attention_mask=out_mask)[:, -1]  # (B, V)
            else:
                logits = model(out[:, -block:], attention_mask=out_mask[:, -block:])[:, -1]  # (B, V)
            if logits_processors:  # row by row, on the row's own ids: padding must not count as text
                rows = []
                for i in range(B):
                    row_logits, row_ids = logits[i : i + 1], out[i][out_mask[i]][None]  # (1, V), (1, t_i)
                    for process in logits_processors:
                        row_logits = process(row_logits, row_ids)
                    rows.append(row_logits)
                logits = torch.cat(rows)  # (B, V)
            if per_row and temperature != 0:  # each row draws from its own generator, only while unfinished
                nxt = torch.full((B,), -1 if eos_id is None else eos_id, dtype=torch.long, device=ids.device)
                for i in range(B):
                    if not done[i]:
                        nxt[i] = sample_next(logits[i : i + 1], generator[i], temperature, top_k, top_p)[0]
            else:
                shared = None if per_row else generator
                nxt = sample_next(logits, shared, temperature, top_k, top_p)  # (B,)
            if eos_id is not None:
                nxt = nxt.masked_fill(done, eos_id)
                for i in (~done & (nxt == eos_id)).nonzero()[:, 0].tolist():
                    n_new[i] = step + 1
                done = done | (nxt == eos_id)
            out = torch.cat([out, nxt[:, None]], dim=1)  # (B, t + 1)
            out_mask = torch.cat([out_mask, torch.ones_like(done)[:, None]], dim=1)  # (B, t + 1)
            step_input, steps = nxt[:, None], step + 1  # (B, 1)
            if eos_id is not None and bool(done.all()):
                break
        return [out[i, T0 - lengths[i] : T0 + min(n_new[i], steps)] for i in range(B)]
    finally:
        model.train(was_training)


@torch.no_grad()
def sequence_logprob(model: nn.Module, prompt: torch.Tensor, continuation: torch.Tensor) -> torch.Tensor:
    """``log p(continuation | prompt)`` under ``model``, summed over the continuation's tokens.

    Args:
        prompt: ``(B, T0)``; continuation: ``(B, N)``.

    Returns:
        ``(B,)`` float tensor.
    """
    full = torch.cat([prompt, continuation], dim=1)  # (B, T0 + N)
    logp = F.log_softmax(model(full).float(), dim=-1)  # (B, T0 + N, V)
    T0 = prompt.shape[1]
    scored = logp[:, T0 - 1 : -1].gather(-1, continuation[..., None]).squeeze(-1)  # (B, N)
    return scored.sum(dim=-1)


@torch.no_grad()
def beam_search(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    beam_width: int = 4,
    *,
    eos_id: int | None = None,
    length_penalty: float = 1.0,
) -> tuple[torch.Tensor, float]:
    """The most likely continuation of one prompt found by beam search.

    Each step expands the ``W`` live beams with every token and ranks the candidates by
    total log-probability; an EOS candidate among the best ``W`` becomes a finished
    hypothesis, and the best ``W`` candidates that do not end in EOS stay live. It stops after
    ``max_new_tokens`` steps (the live beams then count as finished), or once ``W``
    hypotheses have finished and no live beam can still outrank the worst of them.
    Finished hypotheses are ranked by ``logprob / n ** length_penalty`` where ``n`` is the
    number of generated tokens (EOS included). ``beam_width=1`` is greedy decoding (with an
    EOS, only at ``length_penalty=0``: otherwise it may search past an early EOS for a
    better-normalised sequence).

    Args:
        model: a language model whose cache supports ``reorder`` (see the module docstring).
        prompt: ``(1, T0)`` token ids.
        max_new_tokens: the longest continuation, ``>= 1``.
        beam_width: ``W >= 1``.
        eos_id: the end-of-sequence token, or ``None``.
        length_penalty: ``alpha`` above (``0`` ranks by raw log-probability).

    Returns:
        ``(tokens (1, T0 + n), score)``: the best sequence (prompt included, ``torch.long``) and its
        length-normalised log-probability (a float). The model's mode is restored.

    Raises:
        ValueError: for a prompt that is not ``(1, T0)`` ``torch.long``, ``beam_width < 1`` or
        ``max_new_tokens < 1``.
    """
    if prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.dtype != torch.long:
        raise ValueError(
            f"beam_search takes one prompt of shape (1, T0), torch.long; got {prompt.dtype} {tuple(prompt.shape)}"
        )
    if not isinstance(beam_width, int) or beam_width < 1:
        raise ValueError(f"beam_width must be a positive integer, got {beam_width!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    W, T0 = beam_width, prompt.shape[1]
    was_training = model.training
    model.eval()
    try:
        cache = model.init_cache(1, T0 + max_new_tokens)
        logits = model(prompt, cache=cache)[:, -1]  # (1, V)
        beams = prompt  # (N, T0 + t): N live beams, N = 1 at first
        scores = torch.zeros(1)  # (N,) total log-probability of each live beam's new tokens
        finished: list[tuple[float, torch.Tensor]] = []

        def rank(total: float, n: int) -> float:
            return total / n**length_penalty

        def cannot_improve(live_scores: list[float], t: int) -> bool:
            """``W`` hypotheses have finished and no live beam can still beat the worst of them."""
            if len(finished) < W:
                return False
            worst_kept = sorted(f[0] for f in finished)[-W]
            # a live total only falls (log-probabilities are <= 0), so its best final rank is at
            # the shortest or the longest length it can still reach
            best = max(max(rank(s, t + 1), rank(s, max_new_tokens)) for s in live_scores)
            return best <= worst_kept

        for t in range(1, max_new_tokens + 1):
            logp = F.log_softmax(logits.float(), dim=-1)  # (N, V)
            V = logp.shape[-1]
            cand = (scores[:, None] + logp).view(-1)  # (N V,)
            top_scores, top_idx = cand.topk(min(2 * W, cand.numel()))  # best first
            keep_beam, keep_tok, keep_score = [], [], []
            for r, (s, i) in enumerate(zip(top_scores.tolist(), top_idx.tolist())):
                beam, tok = divmod(i, V)
                if eos_id is not None and tok == eos_id:
                    if r < W:  # only an ending among the W best candidates finishes a hypothesis
                        finished.append((rank(s, t), torch.cat([beams[beam], beams.new_tensor([tok])])))
                elif len(keep_beam) < W:
                    keep_beam.append(beam)
                    keep_tok.append(tok)
                    keep_score.append(s)
            if not keep_beam or t == max_new_tokens or cannot_improve(keep_score, t):
                break
            index = torch.tensor(keep_beam)
            cache.reorder(index)
            tokens = torch.tensor(keep_tok)[:, None]  # (N, 1)
            beams = torch.cat([beams[index], tokens], dim=1)  # (N, T0 + t)
            scores = torch.tensor(keep_score)
            logits = model(tokens, cache=cache)[:, -1]  # (N, V)
        if t == max_new_tokens:  # out of steps: the live beams count as finished hypotheses
            for beam, tok, s in zip(keep_beam, keep_tok, keep_score):
                finished.append((rank(s, t), torch.cat([beams[beam], beams.new_tensor([tok])])))
        best_score, best = max(finished, key=lambda f: f[0])
        return best[None], best_score
    finally:
        model.train(was_training)
