"""Chapter 7: speculative decoding, a small draft model proposes and the large target model checks.

Decoding one token at a time is slow because each step is a full forward pass of the large model
for a single token, and a pass over a few more tokens costs little more (the weights are read
once either way). Speculative decoding (Leviathan et al., 2023; Chen et al., 2023, who call it
speculative sampling) lets a cheap *draft* model write ``k`` tokens ``x_1 .. x_k`` one at a time,
then runs the *target* once over all of them, which gives the target's distributions ``p_1 ..
p_{k+1}`` at every drafted position and one beyond.

**The accept/reject rule.** Drafted token ``x_i``, drawn from the draft's ``q_i``, is accepted
with probability ``min(1, p_i(x_i) / q_i(x_i))``, in order, until the first rejection. At a
rejected position the token is drawn from the *residual* ``norm(max(0, p_i - q_i))``; when all
``k`` are accepted, one more comes from ``p_{k+1}`` for free. Each emitted token then has exactly
the target's distribution: ``x`` is emitted at a position either as an accepted draft, with
probability ``q(x) min(1, p(x) / q(x)) = min(p(x), q(x))``, or through a rejection, with
probability ``(1 - sum_y min(p(y), q(y))) * norm(max(0, p - q))(x) = p(x) - min(p(x), q(x))``; the
two add up to ``p(x)``. So the output is as if the target had sampled alone, only faster. Greedy
decoding (``temperature = 0``) is the same rule with one-hot ``p`` and ``q``: a drafted token is
kept if it is the target's argmax, and the first one that is not is replaced by the argmax.

**Bookkeeping.** Every target pass emits the accepted drafts plus one token of its own, so ``n``
new tokens take ``n - accepted`` target passes. With a per-token acceptance probability ``a``
(the same at every position), a pass emits ``(1 - a ** (k + 1)) / (1 - a)`` tokens on average
(Leviathan et al., 2023).

**A draft for free.** Any cheaper model with the same vocabulary can draft; :func:`first_layers`
makes one from the target itself, its first layers under its own final norm and output layer.

**The KV caches.** Both models keep a :class:`~coursekit.gpt.KVCache`; after a round, the entries
of rejected tokens are dropped by shortening the cache (the next write overwrites them). The
last emitted token is never in the caches yet: the next round feeds it first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.gpt import GPT, KVCache

__all__ = [
    "SpeculativeStats",
    "expected_tokens_per_pass",
    "first_layers",
    "speculative_verify",
    "speculative_generate",
]


@dataclass
class SpeculativeStats:
    """What a :func:`speculative_generate` run did.

    Attributes:
        target_passes: forward passes of the target (one per round).
        draft_passes: forward passes of the draft.
        drafted: tokens the draft proposed.
        checked: drafted tokens the target judged (accepted ones plus at most one rejection a round;
            the drafts after a rejection are never looked at).
        accepted: drafted tokens accepted.
        new_tokens: tokens emitted, ``accepted + target_passes``.
    """

    target_passes: int = 0
    draft_passes: int = 0
    drafted: int = 0
    checked: int = 0
    accepted: int = 0
    new_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        """The share of judged drafts that were accepted: an estimate of ``a`` (``nan`` if none)."""
        return self.accepted / self.checked if self.checked else math.nan

    @property
    def tokens_per_target_pass(self) -> float:
        """New tokens per target forward pass (``1`` for ordinary decoding; ``nan`` if no pass)."""
        return self.new_tokens / self.target_passes if self.target_passes else math.nan


def expected_tokens_per_pass(a: float, k: int) -> float:
    """Mean tokens per target pass with ``k`` drafts, each accepted with probability ``a``.

    ``1 + a + a^2 + ... + a^k = (1 - a ** (k + 1)) / (1 - a)`` (``k + 1`` at ``a = 1``).
    Example: ``a = 0.5, k = 3 -> 1.875``.

    Args:
        a: the acceptance probability, in ``[0, 1]``.
        k: drafted tokens per round, ``>= 0``.

    Returns:
        The expected number of emitted tokens per target pass, a float in ``[1, k + 1]``.
    """
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"a must be in [0, 1], got {a}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return float(k + 1) if a == 1.0 else (1 - a ** (k + 1)) / (1 - a)


def first_layers(model: GPT, n_layers: int) -> GPT:
    """A draft model made of ``model``'s first ``n_layers`` blocks, read out by its final norm and output layer.

    The embeddings, blocks, final norm and output layer are ``model``'s own modules, shared and not
    copied, so the draft costs no memory and no training; its predictions are what the residual
    stream after ``n_layers`` blocks already says about the next token. The draft starts in
    ``model``'s train or eval mode (the modules are shared, so a mode change affects both).

    Args:
        model: a :class:`~coursekit.gpt.GPT`.
        n_layers: how many of its blocks to keep, ``1 <= n_layers <= model.cfg.n_layers``.

    Returns:
        A :class:`~coursekit.gpt.GPT` whose config differs from ``model``'s only in ``n_layers``.

    Raises:
        ValueError: for ``n_layers`` out of range.
    """
    if not isinstance(n_layers, int) or not 1 <= n_layers <= model.cfg.n_layers:
        raise ValueError(f"n_layers must be an integer in [1, {model.cfg.n_layers}], got {n_layers!r}")
    draft = GPT(replace(model.cfg, n_layers=n_layers))  # its fresh weights are replaced right away
    draft.tok_emb, draft.pos_emb, draft.drop = model.tok_emb, model.pos_emb, model.drop
    draft.blocks = nn.ModuleList(model.blocks[:n_layers])
    draft.norm, draft.lm_head = model.norm, model.lm_head
    return draft.train(model.training)


def speculative_verify(
    p: torch.Tensor, q: torch.Tensor, drafted: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The accept/reject step of speculative sampling, for each row of a batch.

    Drafted token ``i`` is accepted if ``u_i < p_i(x_i) / q_i(x_i)`` for a uniform ``u_i``
    (probability ``min(1, p / q)``), in order until the first rejection. The token that follows
    the ``n`` accepted ones is drawn from ``norm(max(0, p_n - q_n))`` if draft ``n`` was rejected,
    and from ``p_k`` if all ``k`` were accepted. (If the residual is zero in floating point, which
    needs ``p_n`` and ``q_n`` equal to rounding, the token is drawn from ``p_n``.)

    Args:
        p: ``(B, k + 1, V)`` the target's probabilities at the ``k`` drafted positions and one more.
        q: ``(B, k, V)`` the draft's probabilities the drafted tokens were drawn from.
        drafted: ``(B, k)`` ``torch.long``, the drafted tokens.
        generator: the source of the uniforms and of the resampled token.

    Returns:
        ``(n_accepted (B,), next_token (B,))``, both ``torch.long``: row ``b`` emits
        ``drafted[b, :n_accepted[b]]`` followed by ``next_token[b]``.

    Raises:
        ValueError: if the shapes do not fit together.
    """
    B, K1, V = p.shape
    if q.shape != (B, K1 - 1, V) or drafted.shape != (B, K1 - 1):
        raise ValueError(
            f"expected p (B, k + 1, V), q (B, k, V) and drafted (B, k), "
            f"got {tuple(p.shape)}, {tuple(q.shape)} and {tuple(drafted.shape)}"
        )
    px = p[:, :-1].gather(-1, drafted[..., None]).squeeze(-1)  # (B, k): p_i(x_i)
    qx = q.gather(-1, drafted[..., None]).squeeze(-1)  # (B, k): q_i(x_i)
    u = torch.rand(qx.shape, generator=generator, dtype=p.dtype, device=p.device)  # (B, k)
    accepted = u * qx < px  # u < p / q without dividing by a zero q
    n = accepted.long().cumprod(dim=-1).sum(dim=-1)  # (B,): accepted before the first rejection
    q_next = torch.cat([q, q.new_zeros(B, 1, V)], dim=1)  # (B, k + 1, V): q = 0 after the last draft
    rows = torch.arange(B, device=p.device)
    residual = (p[rows, n] - q_next[rows, n]).clamp(min=0)  # (B, V): p_k itself when all were accepted
    empty = residual.sum(dim=-1, keepdim=True) <= 0  # (B, 1)
    residual = torch.where(empty, p[rows, n], residual)
    next_token = torch.multinomial(residual, 1, generator=generator).squeeze(-1)  # (B,), normalises itself
    return n, next_token


def _check_models(target: GPT, draft: GPT, T0: int, max_new_tokens: int) -> None:
    for name, model in (("target", target), ("draft", draft)):
        if not hasattr(model, "init_cache") or not hasattr(model, "cfg"):
            raise ValueError(
                f"the {name} must be a coursekit GPT (with cfg and init_cache), got {type(model)}"
            )
        if T0 + max_new_tokens > model.cfg.block_size:
            raise ValueError(
                f"prompt ({T0}) + max_new_tokens ({max_new_tokens}) exceed the {name}'s "
                f"block_size={model.cfg.block_size}"
            )
    if target.cfg.vocab_size != draft.cfg.vocab_size:
        raise ValueError(
            f"target and draft must share a vocabulary, got sizes {target.cfg.vocab_size} and {draft.cfg.vocab_size}"
        )


def _shorten(cache: KVCache, length: int) -> None:
    """Forget the cached positions from ``length`` on (their buffers are overwritten later)."""
    for layer in cache.layers:
        layer.length = min(layer.length, length)


@torch.no_grad()
def speculative_generate(
    target: GPT,
    draft: GPT,
    prompt: torch.Tensor,
    max_new_tokens: int,
    k: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, SpeculativeStats]:
    """Extend one prompt by ``max_new_tokens`` tokens of ``target``, drafted ``k`` at a time by ``draft``.

    Each round the draft proposes ``k`` tokens (fewer near the end, so that exactly
    ``max_new_tokens`` come out), the target scores them in one cached forward pass, and
    :func:`speculative_verify` (or, at ``temperature = 0``, a comparison with the target's
    argmax) decides how many to keep and adds one token of the target's. The tokens are
    distributed exactly as ``decoding.generate(target, prompt, max_new_tokens,
    temperature=temperature)``; at ``temperature = 0`` they are the same tokens, up to
    floating-point differences between a cached pass over several tokens and over one.
    Both models are put in eval mode and their modes restored.

    Args:
        target: the model whose distribution is sampled, a :class:`~coursekit.gpt.GPT`.
        draft: a cheaper GPT with the same vocabulary.
        prompt: ``(1, T0)`` ``torch.long``, ``T0 >= 1`` (one sequence: rows of a batch would
            accept different numbers of tokens and fall out of step).
        max_new_tokens: exactly this many new tokens, ``>= 0``; ``T0 + max_new_tokens`` must fit
            both models' ``block_size``.
        k: tokens drafted per round, ``>= 1``.
        temperature: both models sample from ``softmax(logits / temperature)``; ``0`` is greedy.
        generator: required unless ``temperature == 0``.

    Returns:
        ``(tokens (1, T0 + max_new_tokens), stats)``: the prompt and its continuation, and a
        :class:`SpeculativeStats`.

    Raises:
        ValueError: for a prompt that is not ``(1, T0)`` ``torch.long``, a bad ``k``,
            ``max_new_tokens`` or temperature, a missing generator, models that do not share a
            vocabulary, or a length past a ``block_size``.
    """
    if prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.shape[1] < 1 or prompt.dtype != torch.long:
        raise ValueError(
            f"prompt must be one sequence (1, T0) of torch.long ids, T0 >= 1; got {prompt.dtype} {tuple(prompt.shape)}"
        )
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if temperature < 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    greedy = temperature == 0
    if not greedy and generator is None:
        raise ValueError("sampling needs an explicit torch.Generator (or temperature=0 for greedy decoding)")
    T0 = prompt.shape[1]
    _check_models(target, draft, T0, max_new_tokens)
    total = T0 + max_new_tokens
    stats = SpeculativeStats()
    if max_new_tokens == 0:
        return prompt.clone(), stats

    def probs(logits: torch.Tensor) -> torch.Tensor:
        return F.softmax(logits.double() / temperature, dim=-1)  # float64: the ratios p / q stay exact

    modes = target.training, draft.training
    target.eval()
    draft.eval()
    try:
        target_cache, draft_cache = target.init_cache(1, total), draft.init_cache(1, total)
        out = prompt
        while out.shape[1] < total:
            K = min(k, total - out.shape[1] - 1)  # the target adds one more: never overshoot
            proposal, q_rows = out, []
            for _ in range(K):  # the draft feeds what its cache lacks, then one token per step
                logits = draft(proposal[:, draft_cache.length :], cache=draft_cache)[:, -1]  # (1, V)
                stats.draft_passes += 1
                if greedy:
                    token = logits.argmax(dim=-1, keepdim=True)  # (1, 1)
                else:
                    q_rows.append(probs(logits))
                    token = torch.multinomial(q_rows[-1], 1, generator=generator)  # (1, 1)
                proposal = torch.cat([proposal, token], dim=1)  # (1, t + 1)
            drafted = proposal[:, out.shape[1] :]  # (1, K)
            # one target pass over the tokens its cache lacks: logits at the K drafts and one beyond
            logits = target(proposal[:, target_cache.length :], cache=target_cache)[
                :, -(K + 1) :
            ]  # (1, K + 1, V)
            stats.target_passes += 1
            if greedy:
                best = logits.argmax(dim=-1)  # (1, K + 1)
                n = int((best[:, :K] == drafted).long().cumprod(dim=-1).sum())
                next_token = best[:, n]  # (1,)
            else:
                q = (
                    torch.stack(q_rows, dim=1)
                    if q_rows
                    else logits.new_zeros(1, 0, logits.shape[-1]).double()
                )
                n_accepted, next_token = speculative_verify(
                    probs(logits), q, drafted, generator
                )  # (1,), (1,)
                n = int(n_accepted)
            stats.drafted += K
            stats.accepted += n
            stats.checked += min(n + 1, K)
            out = torch.cat([out, drafted[:, :n], next_token[:, None]], dim=1)  # (1, t + n + 1)
            # the caches keep only accepted tokens; the newest token is fed next round
            _shorten(target_cache, out.shape[1] - 1)
            _shorten(draft_cache, out.shape[1] - 1)
        stats.new_tokens = max_new_tokens
        return out, stats
    finally:  # the draft first: where it shares modules with the target, the target's mode wins
        draft.train(modes[1])
        target.train(modes[0])
