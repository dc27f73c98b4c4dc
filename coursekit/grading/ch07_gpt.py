"""Checks for Exercise 7 (GPT decoding).

Each part has two entry points, both called from the notebook with the student's
object. ``check_*`` holds the *public* checks: small, fixed examples. ``grade_*``
holds the *hidden* checks: the student's function against independent facts (the
loss on explicitly shifted tensors, Hugging Face's logits warpers, the best
sequence of a toy model worked out by hand, the log-probability of the returned
sequence, Chapter 2's attention over the whole sequence) and against
:mod:`coursekit.decoding` / :mod:`coursekit.gpt` on fresh seeded inputs.

**Models cross no wire.** Under the autograder the student's functions run in a
sandboxed process and only data (tensors, numbers, containers) crosses to it; a
model, an attention module or a KV cache built here could not be passed in. So the
graders of parts 4 and 5 also take the *classes* they need, from the names the
notebook imports (``TableLM``, ``GPT``, ``GPTConfig``, ``MultiHeadAttention``,
``LayerCache``): they build the objects with them in the student's process, push
weights with ``load_state_dict``, and build the same objects from coursekit here to
compute the expected answers. Called in-process (a notebook, the tests) the classes
are simply local.

:class:`TableLM`, the toy language model of part 4, lives here so that the notebook
(and so the sandbox) can import it: students get it to test their beam search on
examples they can work out by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from coursekit import attention as att
from coursekit import decoding as dec
from coursekit import gpt as ref
from coursekit import multihead as mh
from coursekit.grading.core import (
    Grader,
    close,
    describe,
    first_match,
    generator,
    is_tensor,
    probe,
    raise_unless_student_error,
    rand,
    random_weights,
    seeded,
)

__all__ = [
    "TableLM",
    "check_causal_lm_loss", "check_top_k_filter", "check_top_p_filter", "check_beam_search",
    "check_causal_self_attention",
    "grade_causal_lm_loss", "grade_top_k_filter", "grade_top_p_filter", "grade_beam_search",
    "grade_causal_self_attention",
]


def _ids(name: str, *shape: int, V: int) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=generator(name))


# =========================================================================== the toy model


@dataclass(frozen=True)
class TableLMConfig:
    vocab_size: int
    block_size: int


class TableCache:
    """The cache of a :class:`TableLM`: it stores nothing, but checks that it is used as a
    KV cache must be: each call feeds one row per cached sequence (``reorder`` changes which
    and how many), and at most ``max_len`` positions fit."""

    def __init__(self, batch_size: int, max_len: int):
        self.batch_size, self.max_len, self.length = batch_size, max_len, 0

    def reorder(self, index) -> None:
        """Keep rows ``index`` (a 1-D integer tensor or list), as :meth:`coursekit.gpt.KVCache.reorder`."""
        index = torch.as_tensor(index)
        if index.dim() != 1 or index.dtype not in (torch.int64, torch.int32) or index.numel() == 0:
            raise ValueError(f"reorder takes a non-empty 1-D tensor of row indices, got {index.dtype} {tuple(index.shape)}")
        if int(index.min()) < 0 or int(index.max()) >= self.batch_size:
            raise ValueError(f"reorder index {index.tolist()} is out of range for a cache of {self.batch_size} rows")
        self.batch_size = index.numel()

    def extend(self, batch_size: int, T: int) -> None:
        if batch_size != self.batch_size:
            raise ValueError(f"the cache holds {self.batch_size} sequences but the model got {batch_size}: "
                             "reorder the cache (cache.reorder(index)) whenever the beams change")
        if self.length + T > self.max_len:
            raise ValueError(f"the cache holds {self.max_len} positions; {self.length} are used and {T} more do not fit")
        self.length += T


class TableLM(nn.Module):
    """A toy language model for testing decoders: the next token depends on the last token only.

    Row ``a`` of the ``(V, V)`` table ``logp`` holds ``log p(next token | last token = a)``,
    so a sequence's probability is a product of table entries and the best continuation
    can be worked out by hand. It follows the language-model protocol of
    :mod:`coursekit.decoding`, like :class:`~coursekit.gpt.GPT`: ``model(idx, cache=cache)``
    returns ``logp[idx]`` ``(B, T, V)``, and ``init_cache(batch_size, max_len)`` an empty
    cache with ``length`` and ``reorder(index)``. The cache stores nothing but complains as a
    KV cache would: the number of rows fed must follow ``reorder``.

    Args:
        logp: ``(V, V)`` log-probabilities (each row's ``exp`` sums to 1).
        block_size: the longest sequence, ``cfg.block_size``.

    Example: ``TableLM.from_probs(p)`` with ``p[0, 1] = 0.6, p[0, 2] = 0.4, p[1, 3] = 0.4,
    p[2, 3] = 0.9`` (and small numbers elsewhere): from token 0 greedy decoding picks
    ``1, 3`` (probability 0.24) but ``2, 3`` (0.36) is likelier.
    """

    def __init__(self, logp: torch.Tensor, block_size: int = 64):
        super().__init__()
        if logp.dim() != 2 or logp.shape[0] != logp.shape[1]:
            raise ValueError(f"logp must be a (V, V) table, got {tuple(logp.shape)}")
        self.cfg = TableLMConfig(vocab_size=logp.shape[0], block_size=block_size)
        self.register_buffer("logp", logp.clone())  # (V, V): row = last token

    @classmethod
    def from_probs(cls, probs: torch.Tensor, block_size: int = 64) -> TableLM:
        """A table model from ``(V, V)`` probabilities (zeros become 1e-9; rows are renormalised)."""
        return cls(_table_logp(probs), block_size)

    def init_cache(self, batch_size: int, max_len: int | None = None) -> TableCache:
        return TableCache(batch_size, self.cfg.block_size if max_len is None else max_len)

    def forward(self, idx: torch.Tensor, cache: TableCache | None = None) -> torch.Tensor:
        """``(B, T)`` token ids -> ``(B, T, V)`` next-token logits (the table's rows)."""
        if idx.dim() != 2 or idx.dtype != torch.long:
            raise ValueError(f"idx must be (B, T) torch.long token ids, got {idx.dtype} {tuple(idx.shape)}")
        if cache is not None:
            cache.extend(idx.shape[0], idx.shape[1])
        return self.logp[idx]  # (B, T, V)


def _table(V: int, entries: dict[tuple[int, int], float]) -> torch.Tensor:
    """``(V, V)`` probabilities: the given entries, 0 elsewhere (1e-9 in the model, see :func:`_table_logp`)."""
    p = torch.full((V, V), 0.0, dtype=torch.float64)
    for (a, b), value in entries.items():
        p[a, b] = value
    return p


def _greedy_trap() -> torch.Tensor:
    """From 0: token 1 (0.6) beats 2 (0.4), but then the best is 0.4 after 1 and 0.9 after 2:
    greedy gives 1, 3 (0.24), the likeliest pair is 2, 3 (0.36)."""
    return _table(5, {(0, 1): 0.6, (0, 2): 0.4, (1, 3): 0.4, (1, 4): 0.3, (1, 0): 0.3,
                      (2, 3): 0.9, (2, 4): 0.1, (3, 4): 1.0, (4, 4): 1.0})


#: the EOS token of the tables below
_EOS_LEN, _EOS_STOP, _EOS_KEEP = 3, 3, 8


def _length_table() -> torch.Tensor:
    """EOS right away has 0.4; the path 1, 2, EOS has 0.6 at each step: a lower total (0.216)
    but a higher mean log-probability. Raw sums pick the short one, normalised scores the long one."""
    e = _EOS_LEN
    return _table(4, {(0, e): 0.4, (0, 1): 0.6, (1, 2): 0.6, (1, e): 0.4, (2, 2): 0.4, (2, e): 0.6,
                      (e, 0): 0.25, (e, 1): 0.25, (e, 2): 0.25, (e, e): 0.25})


def _stop_table() -> torch.Tensor:
    """0 -> 1 (0.9) -> EOS (0.8) is the best hypothesis; after EOS the table repeats EOS with
    probability 1, so a search that ignores EOS loses nothing by going on (and gains from
    the length normalisation)."""
    e = _EOS_STOP
    return _table(4, {(0, 1): 0.9, (0, 2): 0.1, (1, e): 0.8, (1, 2): 0.2, (2, 2): 0.5, (2, e): 0.5, (e, e): 1.0})


def _eos_beam_table() -> torch.Tensor:
    """From 0: EOS 0.45, A=1 0.35, B=2 0.2. After A four tokens 4..7 of 0.25 each, then EOS;
    after B: C=3 then EOS, both certain. With beam width 2 and length_penalty 1 the best is
    0, B, C, EOS (log 0.2 / 3 = -0.54) over 0, EOS (-0.80) and 0, A, x, EOS (-0.81), but only
    if B stays a live beam next to A after EOS finished a hypothesis."""
    e = _EOS_KEEP
    entries = {(0, e): 0.45, (0, 1): 0.35, (0, 2): 0.2, (2, 3): 1.0, (3, e): 1.0, (e, e): 1.0}
    for x in range(4, 8):
        entries[(1, x)] = 0.25
        entries[(x, e)] = 1.0
    return _table(9, entries)


def _table_logp(p: torch.Tensor) -> torch.Tensor:
    """Float32 log-probabilities of ``(V, V)`` probabilities (zeros become 1e-9, rows renormalised)."""
    q = p.double().clamp_min(1e-9)
    return (q / q.sum(-1, keepdim=True)).log().float()


def _path_logprob(logp: torch.Tensor, tokens: list[int]) -> float:
    return float(sum(logp[a, b].double() for a, b in zip(tokens, tokens[1:])))


# =========================================================================== part 1: causal_lm_loss


def _shifted_ce(logits, ids, ignore_index=-100, **kwargs):
    """The expected loss, by explicit shifting: logits 0 .. T-2 against tokens 1 .. T-1."""
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1), ignore_index=ignore_index, **kwargs)


_NOT_SHIFTED = ("targets are not shifted: the logits at position t predict token t + 1, so score "
                "logits[:, :-1] against input_ids[:, 1:] (the last position has no target, the first token is never predicted)")


def _loss_mistakes(logits, ids, ignore_index=-100):
    V = logits.shape[-1]

    def ce(lg, t, **kw):
        try:
            return F.cross_entropy(lg.reshape(-1, V), t.reshape(-1), **kw)
        except Exception:  # e.g. a target of -100 without ignore_index
            return None

    scored = ids[:, 1:] != ignore_index
    per = ce(logits[:, :-1], ids[:, 1:], ignore_index=ignore_index, reduction="none")
    out = [
        (ce(logits, ids, ignore_index=ignore_index), _NOT_SHIFTED),
        (ce(logits[:, 1:], ids[:, :-1], ignore_index=ignore_index),
         "the shift goes the wrong way: the logits at position t predict token t + 1, so drop the *last* logits and "
         "the *first* token (logits[:, :-1] against input_ids[:, 1:])"),
        (ce(logits[:, :-1], ids[:, 1:], ignore_index=ignore_index, reduction="sum"),
         "the loss is summed: return the mean over the scored positions"),
    ]
    if bool((~scored).any()) and per is not None:
        out.append((per.mean(),
                    "the loss averages over ignored positions: an ignored position must not count in the mean either, "
                    "divide by the number of scored positions (F.cross_entropy(..., ignore_index=ignore_index) does this)"))
    if ignore_index != -100:
        out.append((ce(logits[:, :-1], ids[:, 1:]),
                    f"the ignore_index argument was not used (here ignore_index={ignore_index}, but -100 was skipped): "
                    "pass ignore_index=ignore_index to F.cross_entropy"))
    return out


def _scalar_loss(g: Grader, out, dtype) -> None:
    g.expect(
        is_tensor(out) and out.dim() == 0 and out.dtype == dtype,
        f"the loss should be a scalar (0-dimensional) tensor of the logits' dtype {dtype}, got {describe(out)}",
    )


def _loss_call(g: Grader, fn, logits, ids, what: str, **kwargs):
    try:
        return fn(logits, ids, **kwargs)
    except Exception as e:
        raise_unless_student_error(e)
        g.fail(f"with {what} your code raised {type(e).__name__.removeprefix('Student')}: {e}. Positions whose token is "
               "ignore_index must be skipped, not looked up: pass ignore_index=ignore_index to F.cross_entropy")


def grade_causal_lm_loss(causal_lm_loss) -> None:
    """Grade a student's ``causal_lm_loss(logits, input_ids, ignore_index=-100)``."""
    g = Grader("causal_lm_loss")

    with g.check("returns a scalar tensor of the logits' dtype"):
        for dtype in (torch.float64, torch.float32):
            logits = rand("loss.shape", 2, 5, 7, dtype=dtype)
            out = causal_lm_loss(logits, _ids("loss.shape.ids", 2, 5, V=7))
            _scalar_loss(g, out, dtype)

    with g.check("the logits at position t are scored against token t + 1"):
        for B, T, V in ((3, 6, 11), (1, 2, 5), (4, 9, 3)):
            logits = rand(f"loss.shift.{T}", B, T, V, scale=2.0)
            ids = _ids(f"loss.shift.{T}.ids", B, T, V=V)
            out = causal_lm_loss(logits, ids)
            _scalar_loss(g, out, torch.float64)
            first_match(g, out, _loss_mistakes(logits, ids), _shifted_ce(logits, ids))
            g.expect(close(out, _shifted_ce(logits, ids)),
                     f"for (B, T, V) = {(B, T, V)} the loss differs from the mean cross-entropy of logits[:, :-1] "
                     "against input_ids[:, 1:]")

    with g.check("closed forms: uniform logits give log V, confident right predictions give almost 0"):
        B, T, V = 2, 5, 6
        ids = _ids("loss.closed.ids", B, T, V=V)
        out = causal_lm_loss(torch.zeros(B, T, V, dtype=torch.float64), ids)
        _scalar_loss(g, out, torch.float64)
        g.expect(close(out, torch.tensor(math.log(V), dtype=torch.float64)),
                 f"with all logits 0 (a uniform prediction) the loss must be log V = {math.log(V):.6f}, got {float(out):.6f}")
        logits = torch.full((B, T, V), -20.0, dtype=torch.float64)
        logits.scatter_(-1, torch.cat([ids[:, 1:], ids[:, :1]], 1)[..., None], 20.0)  # position t favours token t + 1
        out = causal_lm_loss(logits, ids)
        expected = torch.tensor(math.log1p((V - 1) * math.exp(-40.0)), dtype=torch.float64)
        if is_tensor(out) and out.dim() == 0 and float(out) > 1.0:
            g.fail(f"logits that put +20 on the next token at every position gave a loss of {float(out):.2f}, not about 0: "
                   "the logits at position t must be scored against token t + 1 (logits[:, :-1] against input_ids[:, 1:])")
        g.expect(close(out, expected), f"confident right predictions should give log(1 + (V-1) e^-40) = {float(expected):.3g}, "
                                       f"got {describe(out) if not is_tensor(out) else float(out)}")

    with g.check("positions whose target is ignore_index (-100) are not scored"):
        B, T, V = 3, 7, 9
        logits = rand("loss.ignore", B, T, V, scale=2.0)
        ids = _ids("loss.ignore.ids", B, T, V=V)
        ids[0, 3], ids[1, 5:], ids[2, 1] = -100, -100, -100  # padding at the end of row 1, holes elsewhere
        ids[2, 0] = -100  # the first token is never a target, so this changes nothing
        out = _loss_call(g, causal_lm_loss, logits, ids, "-100 in input_ids")
        _scalar_loss(g, out, torch.float64)
        first_match(g, out, _loss_mistakes(logits, ids), _shifted_ce(logits, ids))
        g.expect(close(out, _shifted_ce(logits, ids)),
                 "with -100 in input_ids the loss differs from F.cross_entropy(logits[:, :-1], input_ids[:, 1:], ignore_index=-100) "
                 "(the mean over the scored positions only)")

    with g.check("a custom ignore_index (a padding id) is honoured"):
        B, T, V = 2, 6, 5
        logits = rand("loss.pad", B, T, V, scale=2.0)
        ids = _ids("loss.pad.ids", B, T, V=V - 1) + 1  # tokens 1 .. V-1; 0 is the padding id
        ids[0, 4:], ids[1, 2] = 0, 0
        out = _loss_call(g, causal_lm_loss, logits, ids, "ignore_index=0", ignore_index=0)
        _scalar_loss(g, out, torch.float64)
        first_match(g, out, _loss_mistakes(logits, ids, ignore_index=0), _shifted_ce(logits, ids, ignore_index=0))
        g.expect(close(out, _shifted_ce(logits, ids, ignore_index=0)),
                 "with ignore_index=0 the loss differs from F.cross_entropy(..., ignore_index=0) on the shifted tensors")

    with g.check("gradients: the last position's logits get none, the others the reference's"):
        B, T, V = 2, 5, 6
        logits = rand("loss.grad", B, T, V)
        ids = _ids("loss.grad.ids", B, T, V=V)
        ids[1, 2] = -100
        p = probe(causal_lm_loss, logits.clone().requires_grad_(), ids, backward=(None, torch.tensor(1.0, dtype=torch.float64)))
        g.expect(is_tensor(p.result) and p.result.requires_grad,
                 "the loss does not depend on the logits through autograd: avoid .item(), .detach(), .numpy() or torch.tensor(...)")
        grad = p.grads[0] if p.grads else None
        lr = logits.clone().requires_grad_()
        _shifted_ce(lr, ids).backward()
        g.expect(is_tensor(grad) and grad.shape == logits.shape, f"expected a gradient of shape {tuple(logits.shape)}, got {describe(grad)}")
        if bool(grad[:, -1].abs().max() > 0):
            g.fail("the last position's logits got a gradient: they predict a token after the end of the sequence and must "
                   "not be scored (use logits[:, :-1] against input_ids[:, 1:])")
        g.expect(close(grad, lr.grad), "the gradient with respect to the logits differs from that of the shifted cross-entropy")

    with g.check("a sequence of one token raises ValueError (it has no next-token target)"):
        try:
            out = causal_lm_loss(rand("loss.short", 2, 1, 5), torch.zeros(2, 1, dtype=torch.long))
        except ValueError:
            pass
        except Exception as e:
            raise_unless_student_error(e)
            g.fail(f"with T = 1 your code raised {type(e).__name__.removeprefix('Student')}; raise a ValueError that says a "
                   "sequence needs at least 2 tokens")
        else:
            g.fail(f"with T = 1 your code returned {float(out) if is_tensor(out) and out.numel() == 1 else describe(out)} "
                   "(a mean over no positions is NaN): raise a ValueError instead")

    g.finish()


def check_causal_lm_loss(causal_lm_loss) -> None:
    """Public checks of ``causal_lm_loss`` on two small examples."""
    g = Grader("causal_lm_loss (public)")
    with g.check("tokens [2, 3, 1]: logits_0 scores token 3 and logits_1 token 1; confident right logits give a loss near 0"):
        ids = torch.tensor([[2, 3, 1]])
        logits = torch.full((1, 3, 4), -20.0)
        logits[0, 0, 3] = logits[0, 1, 1] = logits[0, 2, 0] = 20.0  # position 2's prediction has no target
        out = causal_lm_loss(logits, ids)
        g.expect(is_tensor(out) and out.dim() == 0, f"the loss should be a scalar (0-dimensional) tensor, got {describe(out)}")
        g.expect(float(out) < 1e-6, _NOT_SHIFTED + f" (got a loss of {float(out):.3g}, expected about 0)")
    with g.check("equals F.cross_entropy(logits[:, :-1], input_ids[:, 1:]) with -100 positions skipped"):
        logits = rand("public.loss", 2, 4, 5, dtype=torch.float32)
        ids = torch.tensor([[1, 4, 0, 2], [3, 3, -100, -100]])
        out = _loss_call(g, causal_lm_loss, logits, ids, "-100 in input_ids")
        expected = _shifted_ce(logits, ids)
        g.expect(is_tensor(out) and out.shape == () and torch.allclose(out, expected, atol=1e-6),
                 f"expected {float(expected):.6f} (the mean over the 4 scored positions), got "
                 f"{float(out) if is_tensor(out) and out.numel() == 1 else describe(out)}")
    g.finish()


# =========================================================================== parts 2 and 3: the filters


def _warped(kind: str, value, logits: torch.Tensor) -> torch.Tensor:
    """``logits`` after Hugging Face's ``TopKLogitsWarper(value)`` / ``TopPLogitsWarper(value)``.

    transformers is optional for grading; without it coursekit's filters stand in (they equal
    the warpers, see ``tests/test_decoding.py``)."""
    try:
        from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper
    except ImportError:
        return (dec.top_k_filter if kind == "k" else dec.top_p_filter)(logits, value)
    warper = TopKLogitsWarper(value) if kind == "k" else TopPLogitsWarper(value)
    flat = logits.reshape(-1, logits.shape[-1]).clone()  # the warpers take (B, V)
    return warper(None, flat).view(logits.shape)


def _in_place_hint(name: str) -> str:
    return (f"{name} changed its input in place: return a new tensor (logits.masked_fill(...), not masked_fill_ "
            "or item assignment), the caller may still need the original logits")


def _filter_basics(g: Grader, fn, name: str, x: torch.Tensor, arg, mistakes=(), right=None):
    """Call ``fn(x, arg)``; check type, shape, dtype, no in-place change and -inf at dropped entries
    (after trying the ``mistakes`` against the ``right`` answer)."""
    p = probe(fn, x.clone(), arg)
    out = p.result
    g.expect(is_tensor(out) and out.shape == x.shape and out.dtype == x.dtype,
             f"{name}(logits {describe(x)}, {arg}) should return a tensor of the same shape and dtype, got {describe(out)}")
    if p.args and is_tensor(p.args[0]) and not torch.equal(p.args[0], x):
        g.fail(_in_place_hint(name))
    if right is not None:
        first_match(g, out, mistakes, right)
    changed = out != x
    g.expect(bool(torch.isneginf(out[changed]).all()),
             f"{name} must leave kept logits unchanged and set dropped ones to float('-inf') (not a large negative "
             "number), so that softmax gives them probability exactly 0")
    return out


def _count_hint(name: str, out: torch.Tensor, expected: torch.Tensor, arg) -> str:
    got = out.isfinite().sum(-1).tolist()
    want = expected.isfinite().sum(-1).tolist()
    return f"{name}(logits, {arg}) kept {got} tokens per row, expected {want}"


# --------------------------------------------------------------------------- top-k

_TIES_HINT = ("ties with the k-th largest must be kept: drop only the logits smaller than the k-th largest value "
              "(logits < kth), do not keep exactly the k indices that torch.topk returns")


def _top_k_mistakes(x: torch.Tensor, k: int):
    V = x.shape[-1]
    out = []
    if k < V:
        kth1 = torch.topk(x, k + 1, dim=-1).values[..., -1:]
        out.append((x.masked_fill(x < kth1, float("-inf")),
                    "kept k + 1 tokens: the k-th largest is torch.topk(logits, k).values[..., -1] (index k - 1, not k)"))
    if k > 1:
        kth = torch.topk(x, k, dim=-1).values[..., -1:]
        out.append((x.masked_fill(x <= kth, float("-inf")),
                    "kept only k - 1 tokens: keep the logits >= the k-th largest (drop logits < kth, not <= kth)"))
    idx = torch.topk(x, min(k, V), dim=-1).indices
    exact = torch.full_like(x, float("-inf")).scatter(-1, idx, x.gather(-1, idx))
    if not torch.equal(exact, _warped("k", min(k, V), x)):
        out.append((exact, _TIES_HINT))
    return out


def grade_top_k_filter(top_k_filter) -> None:
    """Grade a student's ``top_k_filter(logits, k)``."""
    g = Grader("top_k_filter")

    with g.check("returns a new tensor of the input's shape and dtype, -inf where dropped"):
        for dtype in (torch.float64, torch.float32):
            x = rand("topk.basic", 3, 20, dtype=dtype, scale=2.0)
            out = _filter_basics(g, top_k_filter, "top_k_filter", x, 5, _top_k_mistakes(x, 5), _warped("k", 5, x))
            g.expect(out.isfinite().sum(-1).tolist() == [5, 5, 5], _count_hint("top_k_filter", out, _warped("k", 5, x), 5))

    with g.check("equals Hugging Face's TopKLogitsWarper for k = 1, 2, 7, 39"):
        x = rand("topk.hf", 4, 40, scale=2.0)
        for k in (1, 2, 7, 39):
            out = top_k_filter(x, k)
            expected = _warped("k", k, x)
            first_match(g, out, _top_k_mistakes(x, k), expected)
            g.expect(is_tensor(out) and out.shape == x.shape and torch.equal(out, expected),
                     _count_hint("top_k_filter", out, expected, k) if is_tensor(out) and out.shape == x.shape
                     else f"top_k_filter(logits (4, 40), {k}) should be (4, 40), got {describe(out)}")

    with g.check("ties with the k-th largest logit are all kept"):
        x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, 5.0, 1.0, 1.0]], dtype=torch.float64)
        for k in (1, 2):
            out = top_k_filter(x, k)
            expected = _warped("k", k, x)
            first_match(g, out, _top_k_mistakes(x, k), expected)
            g.expect(is_tensor(out) and out.shape == x.shape and torch.equal(out, expected),
                     _TIES_HINT + f" (top_k_filter({x.tolist()}, {k}) should keep {expected.isfinite().tolist()}, "
                                  f"got {out.isfinite().tolist() if is_tensor(out) and out.shape == x.shape else describe(out)})")
        x = torch.randint(0, 4, (5, 12), generator=generator("topk.ties")).double()
        out = top_k_filter(x, 3)
        expected = _warped("k", 3, x)
        first_match(g, out, _top_k_mistakes(x, 3), expected)
        g.expect(is_tensor(out) and out.shape == x.shape and torch.equal(out, expected), _TIES_HINT)

    with g.check("k >= V keeps every logit"):
        x = rand("topk.all", 2, 6)
        for k in (6, 10):
            try:
                out = top_k_filter(x, k)
            except Exception as e:
                raise_unless_student_error(e)
                g.fail(f"top_k_filter(logits with V=6, {k}) raised {type(e).__name__.removeprefix('Student')}: {e}. "
                       "With k >= V every token is kept: clamp k to min(k, V) before torch.topk")
            g.expect(is_tensor(out) and out.shape == x.shape and torch.equal(out, x),
                     f"top_k_filter(logits with V=6, {k}) must return the logits unchanged (every token is kept)")

    with g.check("works on any leading shape (..., V)"):
        for shape in ((2, 3, 15), (15,)):
            x = rand(f"topk.shape.{len(shape)}", *shape, scale=2.0)
            out = top_k_filter(x, 4)
            first_match(g, out, _top_k_mistakes(x, 4), _warped("k", 4, x))
            g.expect(is_tensor(out) and out.shape == x.shape and torch.equal(out, _warped("k", 4, x)),
                     f"for logits of shape {shape} the result differs: filter along the last axis only "
                     "(torch.topk(..., dim=-1), keepdim-style [..., -1:] indexing)")

    with g.check("k < 1 raises ValueError"):
        for k in (0, -2):
            try:
                out = top_k_filter(rand("topk.bad", 2, 5), k)
            except ValueError:
                continue
            except Exception as e:
                raise_unless_student_error(e)
                g.fail(f"top_k_filter(logits, {k}) raised {type(e).__name__.removeprefix('Student')}; raise a ValueError that names k")
            g.fail(f"top_k_filter(logits, {k}) returned {describe(out)}: k must be a positive integer, raise a ValueError")

    g.finish()


def check_top_k_filter(top_k_filter) -> None:
    """Public checks of ``top_k_filter`` on two rows of four logits."""
    g = Grader("top_k_filter (public)")
    inf = float("-inf")
    with g.check("top_k_filter([[1, 3, 2]], 2) is [[-inf, 3, 2]]"):
        out = top_k_filter(torch.tensor([[1.0, 3.0, 2.0]]), 2)
        g.expect(is_tensor(out) and out.shape == (1, 3) and out.tolist() == [[inf, 3.0, 2.0]],
                 f"expected [[-inf, 3.0, 2.0]], got {out.tolist() if is_tensor(out) else describe(out)}")
    with g.check("top_k_filter([[1, 3, 3, 2]], 1) keeps both 3s (ties with the k-th are kept)"):
        out = top_k_filter(torch.tensor([[1.0, 3.0, 3.0, 2.0]]), 1)
        g.expect(is_tensor(out) and out.shape == (1, 4) and out.tolist() == [[inf, 3.0, 3.0, inf]],
                 _TIES_HINT + f" (expected [[-inf, 3.0, 3.0, -inf]], got {out.tolist() if is_tensor(out) else describe(out)})")
    g.finish()


# --------------------------------------------------------------------------- top-p

_CROSS_HINT = ("top-p dropped the token that crosses p: keep a token while the probability of the tokens ranked "
               "*before* it is still below p (cumsum - probs < p), so the smallest set reaching p is kept and the most "
               "likely token always survives")
_SORT_HINT = ("top-p must accumulate probabilities from the most likely token down: sort the logits in decreasing "
              "order first (torch.sort(..., descending=True)), then scatter the mask back to the vocabulary order")
_ORDER_HINT = ("the result is in sorted order: the mask was computed on sorted logits, scatter it back to the "
               "vocabulary order (mask.scatter(-1, order, mask)) before applying it to the original logits")


def _top_p_mistakes(x: torch.Tensor, p: float):
    inf = float("-inf")
    s, order = torch.sort(x, dim=-1, descending=True)
    probs = F.softmax(s, dim=-1)
    cum = probs.cumsum(-1)
    before = cum - probs
    out = []
    for drop in (cum > p, cum >= p):
        out.append((x.masked_fill(drop.scatter(-1, order, drop), inf), _CROSS_HINT))
    vocab = F.softmax(x, dim=-1)
    out.append((x.masked_fill(vocab.cumsum(-1) - vocab >= p, inf), _SORT_HINT))
    out.append((x.masked_fill(vocab.cumsum(-1) > p, inf), _SORT_HINT))
    sorted_result = s.masked_fill(before >= p, inf)
    if not torch.equal(sorted_result, _warped("p", p, x)):
        out.append((sorted_result, _ORDER_HINT))
    return out


def _p_logits(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64).log()


def grade_top_p_filter(top_p_filter) -> None:
    """Grade a student's ``top_p_filter(logits, p)``."""
    g = Grader("top_p_filter")

    with g.check("returns a new tensor of the input's shape and dtype, -inf where dropped"):
        for dtype in (torch.float64, torch.float32):
            x = rand("topp.basic", 3, 20, dtype=dtype, scale=2.0)
            _filter_basics(g, top_p_filter, "top_p_filter", x, 0.7, _top_p_mistakes(x, 0.7), _warped("p", 0.7, x))

    with g.check("equals Hugging Face's TopPLogitsWarper for p = 0.05 .. 0.97"):
        for dtype in (torch.float64, torch.float32):
            x = rand("topp.hf", 6, 40, dtype=dtype, scale=2.0)
            for p in (0.05, 0.3, 0.5, 0.8, 0.9, 0.97):
                out = top_p_filter(x, p)
                expected = _warped("p", p, x)
                first_match(g, out, _top_p_mistakes(x, p), expected)
                g.expect(is_tensor(out) and out.shape == x.shape and torch.equal(out, expected),
                         _count_hint("top_p_filter", out, expected, p) + " (the smallest set of most likely tokens whose "
                         "probabilities sum to at least p)" if is_tensor(out) and out.shape == x.shape
                         else f"top_p_filter(logits (6, 40), {p}) should be (6, 40), got {describe(out)}")

    with g.check("the token whose probability crosses p is kept"):
        cases = [  # probabilities in vocabulary order, p, which tokens survive
            ([0.2, 0.5, 0.3], 0.6, [False, True, True]),
            ([0.2, 0.5, 0.3], 0.45, [False, True, False]),
            ([0.1, 0.25, 0.15, 0.5], 0.7, [False, True, False, True]),
            ([0.1, 0.25, 0.15, 0.5], 0.8, [False, True, True, True]),
        ]
        for probs, p, kept in cases:
            out = top_p_filter(_p_logits(probs), p)
            first_match(g, out, _top_p_mistakes(_p_logits(probs), p), _warped("p", p, _p_logits(probs)))
            got = out.isfinite()[0].tolist() if is_tensor(out) and out.shape == (1, len(probs)) else describe(out)
            g.expect(got == kept, _CROSS_HINT + f" (probabilities {probs} with p = {p} should keep {kept}, got {got})")

    with g.check("the most likely token always survives; p = 1 keeps every token"):
        x = _p_logits([0.05, 0.9, 0.05], [0.6, 0.3, 0.1])
        out = top_p_filter(x, 0.5)
        first_match(g, out, _top_p_mistakes(x, 0.5), _warped("p", 0.5, x))
        g.expect(is_tensor(out) and out.shape == x.shape and out.isfinite().tolist() == [[False, True, False], [True, False, False]],
                 _CROSS_HINT + " (a token of probability 0.9 with p = 0.5 must be kept alone, a row is never emptied)")
        x = rand("topp.one", 3, 12)
        out = top_p_filter(x, 1.0)
        g.expect(is_tensor(out) and out.shape == x.shape and torch.equal(out, x),
                 "with p = 1 every token (of non-zero probability) must be kept")

    with g.check("probabilities are accumulated from the most likely token down"):
        x = _p_logits([0.05, 0.1, 0.15, 0.7], [0.3, 0.05, 0.45, 0.2])
        out = top_p_filter(x, 0.5)
        first_match(g, out, _top_p_mistakes(x, 0.5), _warped("p", 0.5, x))
        g.expect(is_tensor(out) and out.shape == x.shape and out.isfinite().tolist() == [[False, False, False, True], [True, False, True, False]],
                 _SORT_HINT + f" (with p = 0.5, {[0.05, 0.1, 0.15, 0.7]} must keep only the 0.7 and "
                              f"{[0.3, 0.05, 0.45, 0.2]} the 0.45 and the 0.3)")

    with g.check("the result is in vocabulary order"):
        x = rand("topp.order", 4, 16, scale=2.0)
        out = top_p_filter(x, 0.6)
        first_match(g, out, _top_p_mistakes(x, 0.6), _warped("p", 0.6, x))
        g.expect(is_tensor(out) and out.shape == x.shape and torch.equal(out, _warped("p", 0.6, x)),
                 "kept logits must stay at their vocabulary positions, unchanged")

    with g.check("composes with top-k: logits already at -inf stay -inf"):
        x = _warped("k", 6, rand("topp.compose", 3, 20, scale=2.0))
        for p in (0.5, 0.95):
            out = top_p_filter(x, p)
            first_match(g, out, _top_p_mistakes(x, p), _warped("p", p, x))
            g.expect(is_tensor(out) and out.shape == x.shape and torch.equal(out, _warped("p", p, x)),
                     f"after top-k (6 of 20 tokens left) top_p_filter(..., {p}) differs from TopPLogitsWarper: the "
                     "softmax of the filtered logits gives the removed tokens probability 0, they must stay -inf")

    with g.check("works on any leading shape (..., V)"):
        for shape in ((2, 3, 15), (15,)):
            x = rand(f"topp.shape.{len(shape)}", *shape, scale=2.0)
            out = top_p_filter(x, 0.7)
            first_match(g, out, _top_p_mistakes(x, 0.7), _warped("p", 0.7, x))
            g.expect(is_tensor(out) and out.shape == x.shape and torch.equal(out, _warped("p", 0.7, x)),
                     f"for logits of shape {shape} the result differs: sort, softmax and cumsum along the last axis "
                     "(dim=-1), and scatter back along it")

    with g.check("p outside (0, 1] raises ValueError"):
        for p in (0.0, 1.5, -0.1):
            try:
                out = top_p_filter(rand("topp.bad", 2, 5), p)
            except ValueError:
                continue
            except Exception as e:
                raise_unless_student_error(e)
                g.fail(f"top_p_filter(logits, {p}) raised {type(e).__name__.removeprefix('Student')}; raise a ValueError that names p")
            g.fail(f"top_p_filter(logits, {p}) returned {describe(out)}: p must be in (0, 1], raise a ValueError")

    g.finish()


def check_top_p_filter(top_p_filter) -> None:
    """Public checks of ``top_p_filter`` on probabilities that can be added up by hand."""
    g = Grader("top_p_filter (public)")
    with g.check("probabilities [0.2, 0.5, 0.3] with p = 0.6 keep the 0.5 and the 0.3 that crosses 0.6"):
        out = top_p_filter(torch.tensor([[0.2, 0.5, 0.3]]).log(), 0.6)
        got = out.isfinite().tolist() if is_tensor(out) and out.shape == (1, 3) else describe(out)
        g.expect(got == [[False, True, True]], _CROSS_HINT + f" (expected kept [[False, True, True]], got {got})")
        g.expect(torch.equal(out[0, 1:], torch.tensor([0.5, 0.3]).log()), "kept logits must be returned unchanged")
    with g.check("probabilities [0.05, 0.9, 0.05] with p = 0.5 keep the 0.9 alone"):
        out = top_p_filter(torch.tensor([[0.05, 0.9, 0.05]]).log(), 0.5)
        got = out.isfinite().tolist() if is_tensor(out) and out.shape == (1, 3) else describe(out)
        g.expect(got == [[False, True, False]], _CROSS_HINT + f" (expected kept [[False, True, False]], got {got})")
    g.finish()


# =========================================================================== part 4: beam_search

_REORDER_HINT = ("the KV cache was not reordered: after choosing the new beams call cache.reorder(index) with the "
                 "parent beam of each new beam, so that row i of the cache belongs to beam i")
_NORM_HINT = ("beam scores are not length-normalised: rank finished hypotheses by logprob / n ** length_penalty, "
              "with n the number of generated tokens (EOS included)")
_RAW_HINT = "with length_penalty=0 hypotheses are ranked by their raw total log-probability (n ** 0 = 1)"
_EOS_HINT = ("the sequence goes on after EOS: a candidate that ends in eos_id must become a finished hypothesis, "
             "not a live beam that is extended further")
_EOS_BEAM_HINT = ("an EOS candidate took the place of a live beam: take the best 2W candidates; those ending in EOS "
                  "among the best W finish a hypothesis, and the best W that do not end in EOS stay live")
_GREEDY_HINT = ("your beam search returned the greedy sequence: at each step rank the candidates of all beams together "
                "(the (N, V) table of beam score + log-probability, flattened) and keep the best W, not the best token of each beam")


def _beam_call(g: Grader, fn, *args, **kwargs):
    """Call the student's beam search; returns ``(tokens list, score)``."""
    try:
        result = fn(*args, **kwargs)
    except Exception as e:
        raise_unless_student_error(e)
        text = str(e)
        if "expected k and v of shape" in text or "reorder the cache" in text:
            g.fail(_REORDER_HINT + f" (the model raised: {text[:200]})")
        raise
    g.expect(isinstance(result, (tuple, list)) and len(result) == 2,
             f"beam_search must return a tuple (tokens, score), got {describe(result)}")
    tokens, score = result
    prompt = args[1]
    g.expect(is_tensor(tokens) and tokens.dtype == torch.long and tokens.dim() == 2 and tokens.shape[0] == 1,
             f"tokens must be a (1, T0 + n) torch.long tensor, got {describe(tokens)}")
    T0 = prompt.shape[1]
    g.expect(tokens.shape[1] > T0 and torch.equal(tokens[:, :T0], prompt),
             f"tokens must start with the prompt {prompt[0].tolist()} and add at least one token, got {tokens[0].tolist()}")
    if is_tensor(score) and score.numel() == 1:
        score = float(score)
    g.expect(isinstance(score, (float, int)) and not isinstance(score, bool) and math.isfinite(score),
             f"score must be a finite float (the best hypothesis's normalised log-probability), got {describe(score)}")
    return tokens[0].tolist(), float(score)


def _expect_path(g: Grader, got, score, expected, expected_score, hint: str, atol: float = 1e-4) -> None:
    g.expect(got == expected, f"{hint} (expected {expected}, got {got})")
    g.expect(abs(score - expected_score) <= atol,
             f"the tokens are right but the score is {score:.6f}, expected {expected_score:.6f}: return the best "
             "hypothesis's total log-probability of its new tokens divided by n ** length_penalty")


def _greedy_trap_check(g: Grader, beam_search, TableLM) -> None:
    logp = _table_logp(_greedy_trap())
    model = TableLM(logp)
    got, score = _beam_call(g, beam_search, model, torch.tensor([[0]]), 2, 2, length_penalty=0.0)
    best = max(([0, a, b] for a in range(5) for b in range(5)), key=lambda s: _path_logprob(logp, s))  # brute force
    if got == [0, 1, 3]:
        g.fail(_GREEDY_HINT)
    _expect_path(g, got, score, best, _path_logprob(logp, best),
                 "beam_search(model, [[0]], 2, beam_width=2) must find the likeliest pair")


def _length_check(g: Grader, beam_search, TableLM) -> bool:
    """The length-normalisation case; returns True when it passed (the caller's later hints rely on it)."""
    logp = _table_logp(_length_table())
    model, e = TableLM(logp), _EOS_LEN
    short, long = [0, e], [0, 1, 2, e]
    got, score = _beam_call(g, beam_search, model, torch.tensor([[0]]), 6, 2, eos_id=e, length_penalty=1.0)
    if got == short:
        g.fail(_NORM_HINT)
    if got == long and abs(score - _path_logprob(logp, long) / 4) < 1e-4:
        g.fail("n counts the generated tokens (EOS included), not the prompt: divide by (T - T0) ** length_penalty")
    if got == long and abs(score - _path_logprob(logp, long)) < 1e-4:
        g.fail(_NORM_HINT + " (the returned score is the raw total)")
    _expect_path(g, got, score, long, _path_logprob(logp, long) / 3,
                 "with length_penalty=1 the hypothesis 0, 1, 2, EOS (mean log-probability log 0.6) beats 0, EOS (log 0.4)")
    got, score = _beam_call(g, beam_search, model, torch.tensor([[0]]), 6, 2, eos_id=e, length_penalty=0.0)
    _expect_path(g, got, score, short, _path_logprob(logp, short),
                 _RAW_HINT + ": 0, EOS (probability 0.4) beats 0, 1, 2, EOS (0.216)")
    return True


def _gpt_pair(GPT, GPTConfig, seed: int, dropout: float = 0.0):
    """The same small GPT twice: built with the student's classes (in their process) and with coursekit's."""
    kwargs = dict(vocab_size=23, block_size=48, n_layers=2, n_heads=2, d_model=16, dropout=dropout)
    with seeded(f"gpt.pair.{seed}"):  # weights a table cannot anticipate (the course's secret is in the seed)
        local = ref.GPT(ref.GPTConfig(**kwargs))
    with torch.no_grad():
        for p in local.parameters():
            p.mul_(20)  # peaky predictions: sequences differ and near-ties are rare
    local.eval()
    theirs = GPT(GPTConfig(**kwargs))
    theirs.load_state_dict(local.state_dict())
    theirs.eval()
    return theirs, local


def _prompt(name: str, T0: int = 5) -> torch.Tensor:
    return _ids(name, 1, T0, V=23)


def grade_beam_search(beam_search, TableLM, GPT, GPTConfig) -> None:
    """Grade a student's ``beam_search(model, prompt, max_new_tokens, beam_width=4, *, eos_id=None, length_penalty=1.0)``.

    ``TableLM``, ``GPT`` and ``GPTConfig`` are the notebook's names for the toy model and
    coursekit's GPT: the models are built with them, where the student's code runs.
    """
    g = Grader("beam_search")

    with g.check("finds the likeliest pair that greedy decoding misses (a table model)"):
        _greedy_trap_check(g, beam_search, TableLM)

    with g.check("beam_width=1 is greedy decoding (a GPT, without and with EOS)"):
        model, local = _gpt_pair(GPT, GPTConfig, seed=3)
        for i in range(3):
            prompt = _prompt(f"beam.greedy.{i}")
            greedy = dec.generate(local, prompt, 20)
            got, _ = _beam_call(g, beam_search, model, prompt, 20, 1)
            g.expect(got == greedy[0].tolist(),
                     f"with beam_width=1 and no EOS, 20 new tokens must be the greedy ones {greedy[0, 5:].tolist()}, got {got[5:]}")
            eos = int(greedy[0, 12])
            expected = dec.generate(local, prompt, 20, eos_id=eos)[0].tolist()
            got, _ = _beam_call(g, beam_search, model, prompt, 20, 1, eos_id=eos, length_penalty=0.0)
            if len(got) > len(expected) and got[:len(expected)] == expected:
                g.fail(_EOS_HINT)
            g.expect(got == expected,
                     f"with beam_width=1, eos_id={eos} and length_penalty=0 the result must be greedy decoding up to "
                     f"its first EOS, {expected[5:]}, got {got[5:]}")

    normalises = False
    with g.check("length normalisation: length_penalty=1 prefers the better mean, 0 the better total"):
        normalises = _length_check(g, beam_search, TableLM)

    with g.check("a hypothesis ends at its EOS"):
        logp, e = _table_logp(_stop_table()), _EOS_STOP
        model = TableLM(logp)
        for alpha in (1.0, 0.0):
            got, score = _beam_call(g, beam_search, model, torch.tensor([[0]]), 6, 2, eos_id=e, length_penalty=alpha)
            if e in got[:-1]:
                g.fail(_EOS_HINT + f" (got {got})")
            _expect_path(g, got, score, [0, 1, e], _path_logprob(logp, [0, 1, e]) / 2 ** alpha,
                         f"with eos_id={e}, length_penalty={alpha} the best hypothesis is 0, 1, EOS")

    with g.check("an EOS candidate does not take the place of a live beam"):
        logp, e = _table_logp(_eos_beam_table()), _EOS_KEEP
        got, score = _beam_call(g, beam_search, TableLM(logp), torch.tensor([[0]]), 5, 2, eos_id=e, length_penalty=1.0)
        if got == [0, e]:
            g.fail(_EOS_BEAM_HINT if normalises else "0, EOS won: with length_penalty=1 the hypothesis 0, 2, 3, EOS should "
                   "(its mean log-probability is higher); first make the length-normalisation check pass")
        _expect_path(g, got, score, [0, 2, 3, e], _path_logprob(logp, [0, 2, 3, e]) / 3,
                     "with beam_width=2: after 0, EOS finishes at step 1, both 0, 1 and 0, 2 must stay live; "
                     "0, 2, 3, EOS is the best hypothesis")

    with g.check("matches the reference on a GPT (the beams' KV cache must follow them)"):
        model, local = _gpt_pair(GPT, GPTConfig, seed=4)
        for i, (W, n, alpha, eos_at) in enumerate(((3, 12, 1.0, None), (4, 10, 0.7, 3), (2, 8, 0.0, 2))):
            prompt = _prompt(f"beam.gpt.{i}", T0=4)
            eos = None
            if eos_at is not None:
                eos = int(dec.beam_search(local, prompt, n, W)[0][0, 4 + eos_at])  # a token the search meets
            tokens, expected_score = dec.beam_search(local, prompt, n, W, eos_id=eos, length_penalty=alpha)
            got, score = _beam_call(g, beam_search, model, prompt, n, W, eos_id=eos, length_penalty=alpha)
            g.expect(got == tokens[0].tolist(),
                     f"beam_search(gpt, prompt, {n}, beam_width={W}, eos_id={eos}, length_penalty={alpha}) should give "
                     f"{tokens[0, 4:].tolist()} after the prompt, got {got[4:]}. If the table-model checks pass, look at "
                     "the cache: reorder it with cache.reorder(index) whenever the beams change, and feed only the new "
                     "tokens (N, 1) with it")
            g.expect(abs(score - expected_score) <= 1e-4, f"the tokens are right but the score is {score:.6f}, expected {expected_score:.6f}")

    with g.check("the score is the returned sequence's log-probability / n ** length_penalty"):
        model, local = _gpt_pair(GPT, GPTConfig, seed=5)
        for i, (W, alpha) in enumerate(((3, 1.0), (2, 0.5), (3, 0.0))):
            prompt = _prompt(f"beam.score.{i}", T0=3)
            eos = int(dec.generate(local, prompt, 6)[0, -1])
            got, score = _beam_call(g, beam_search, model, prompt, 10, W, eos_id=eos, length_penalty=alpha)
            n = len(got) - 3
            lp = float(dec.sequence_logprob(local, prompt, torch.tensor([got[3:]])))
            g.expect(abs(score - lp / n ** alpha) <= 1e-4,
                     f"for {got[3:]} (n = {n}, length_penalty={alpha}) the score should be log p / n ** {alpha} = "
                     f"{lp / n ** alpha:.6f}, got {score:.6f}")

    with g.check("decodes in eval mode and restores the model's mode"):
        model, local = _gpt_pair(GPT, GPTConfig, seed=6, dropout=0.3)
        model.train()
        prompt = _prompt("beam.mode", T0=4)
        tokens, _ = dec.beam_search(local, prompt, 10, 3)
        got, _ = _beam_call(g, beam_search, model, prompt, 10, 3)
        g.expect(got == tokens[0].tolist(),
                 "on a GPT with dropout in training mode the result differs from the reference: call model.eval() "
                 "before decoding (dropout off)")
        g.expect(model.training is True,
                 "the model was left in eval mode: remember was_training = model.training and restore it with "
                 "model.train(was_training) in a finally block")

    with g.check("bad arguments raise ValueError"):
        model = TableLM(_table_logp(_greedy_trap()))
        for args, what in (((torch.zeros(2, 3, dtype=torch.long), 4, 2), "two prompts at once (beam_search takes one (1, T0) prompt)"),
                           ((torch.zeros(1, 3, dtype=torch.long), 4, 0), "beam_width=0")):
            try:
                out = beam_search(model, *args)
            except ValueError:
                continue
            except Exception as e:
                raise_unless_student_error(e)
                g.fail(f"with {what} your code raised {type(e).__name__.removeprefix('Student')}; raise a ValueError that says what is wrong")
            g.fail(f"with {what} your code returned {describe(out)}: raise a ValueError")

    g.finish()


def check_beam_search(beam_search, TableLM) -> None:
    """Public checks of ``beam_search`` on two table models worked out by hand."""
    g = Grader("beam_search (public)")
    with g.check("finds 0, 2, 3 (probability 0.36) where greedy decoding finds 0, 1, 3 (0.24)"):
        _greedy_trap_check(g, beam_search, TableLM)
    with g.check("with EOS: length_penalty=1 picks 0, 1, 2, EOS and length_penalty=0 picks 0, EOS"):
        _length_check(g, beam_search, TableLM)
    g.finish()


# =========================================================================== part 5: causal_self_attention

C, H = 12, 4  # D = 3: scaling by sqrt(C) and by sqrt(D) differ
D = C // H

_TOP_LEFT_HINT = ("the causal mask is aligned top-left: new tokens after a cache must see all cached keys, new token i "
                  "(at position P + i) sees keys 0 .. P + i: use the bottom-right aligned causal_mask(T, S), not is_causal=True "
                  "(which is only right when T == S)")
_NOT_EXTENDED_HINT = ("the cache was not extended: the new tokens attend only to themselves; call k, v = cache.update(k, v) "
                      "and attend to all the keys and values it returns")
_GROUPS_HINT = ("the groups are wrong: query head h reads key/value head h // (H / H_kv); use repeat_kv "
                "(repeat_interleave) or enable_gqa=True, not repeat")
_AT_ZERO_HINT = ("the cache is written at position 0 instead of after the cached tokens: new keys and values go to positions "
                 "P .. P + T - 1 (cache.update(k, v) does this and advances cache.length)")


def attention_pair(MultiHeadAttention, name: str, n_kv: int | None = None, dropout: float = 0.0):
    """A Chapter 2 attention module built with the student's class (in their process) and with coursekit's,
    holding the same random float64 weights, both in eval mode."""
    local = mh.MultiHeadAttention(C, H, n_kv, dropout=dropout).double()
    weights = random_weights(local, name)
    local.load_state_dict(weights)
    local.eval()
    theirs = MultiHeadAttention(C, H, n_kv, dropout=dropout)
    theirs.double()
    theirs.load_state_dict(weights)
    theirs.eval()
    return theirs, local


def _attend(r, x_new, k, v, mask=None, scale=None):
    """``r``'s attention of the new tokens' queries to keys ``k`` and values ``v`` (the common mistakes use this)."""
    q = r.project(x_new)[0]  # (B, H, T, D)
    n_rep = r.n_heads // k.shape[1]  # 1 if k already has H heads
    out, _ = att.scaled_dot_product_attention(q, mh.repeat_kv(k, n_rep), mh.repeat_kv(v, n_rep), mask=mask, scale=scale)
    return r.out_proj(mh.merge_heads(out))  # (B, T, C)


def _csa_mistakes(r, x_new, k_all, v_all, P: int):
    T, S = x_new.shape[1], k_all.shape[2]
    top_left = torch.ones(T, S, dtype=torch.bool).tril()
    bottom_right = att.causal_mask(T, S)
    q, _, _ = r.project(x_new)
    n_rep = r.n_heads // r.n_kv_heads
    heads = att.scaled_dot_product_attention(q, mh.repeat_kv(k_all, n_rep), mh.repeat_kv(v_all, n_rep), mask=bottom_right)[0]
    out = [
        (_attend(r, x_new, k_all, v_all, bottom_right, scale=1.0),
         "the scores are not scaled: multiply q k^T by 1/sqrt(D), D = attn.d_head (F.scaled_dot_product_attention does this)"),
        (_attend(r, x_new, k_all, v_all, bottom_right, scale=1 / math.sqrt(C)),
         f"the scores are scaled by 1/sqrt(C): divide by sqrt(D), the head width D = attn.d_head = {D}, not the model width"),
        (mh.merge_heads(heads), "the output projection is missing: return attn.out_proj(merge_heads(out))"),
        (_attend(r, x_new, k_all, v_all), "the attention is not causal: new token i may only see keys up to its own position P + i"),
    ]
    if 1 < r.n_kv_heads < r.n_heads:
        tiled = k_all.repeat(1, n_rep, 1, 1), v_all.repeat(1, n_rep, 1, 1)  # (B, H, S, D) in the wrong order
        out.append((_attend(r, x_new, *tiled, bottom_right), _GROUPS_HINT))
    if P > 0:
        out.insert(0, (_attend(r, x_new, k_all, v_all, top_left), _TOP_LEFT_HINT))
        k_new, v_new = k_all[:, :, P:], v_all[:, :, P:]
        out.insert(1, (_attend(r, x_new, k_new, v_new, att.causal_mask(T)), _NOT_EXTENDED_HINT))
        stale = torch.cat([k_new, k_all[:, :, T:P], torch.zeros_like(k_new)], 2), torch.cat([v_new, v_all[:, :, T:P], torch.zeros_like(v_new)], 2)
        if T <= P:
            out.insert(2, (_attend(r, x_new, *stale, bottom_right), _AT_ZERO_HINT))
            out.insert(3, (_attend(r, x_new, *stale, top_left), _AT_ZERO_HINT))
    return out


def _csa_call(g: Grader, fn, *args):
    try:
        return fn(*args)
    except Exception as e:
        raise_unless_student_error(e)
        if "expected k and v of shape" in str(e):
            g.fail("cache.update received keys/values of the wrong shape: store the H_kv key/value heads that "
                   f"attn.project returns, (B, H_kv, T, D), and repeat them for the query heads only after reading the cache ({e})")
        raise


def _prefilled(LayerCache, r, name: str, B: int, P: int, max_len: int):
    """A cache (of the student's class) holding the reference keys and values of ``P`` random tokens."""
    x_past = rand(name + ".past", B, P, C)
    _, k, v = r.project(x_past)  # (B, H_kv, P, D) each
    cache = LayerCache(B, r.n_kv_heads, max_len, D, torch.float64)
    if P:
        cache.update(k, v)
    return cache, x_past, k, v


def _cache_contents(g: Grader, cache, k_expected, v_expected, P: int) -> None:
    """After the call the cache holds ``k_expected``/``v_expected`` at positions 0 .. P + T - 1."""
    S = k_expected.shape[2]
    length = cache.length
    T = S - P
    if length == P:
        g.fail(f"cache.length is still {P} after {T} new tokens: the cache was not extended (use k, v = cache.update(k, v))")
    g.expect(length == S, f"after {P} cached and {T} new tokens cache.length should be {S}, got {length!r}")
    ck, cv = cache.k, cache.v
    g.expect(is_tensor(ck) and ck.dim() == 4 and ck.shape[2] >= S, f"cache.k should stay a (B, H_kv, max_len, D) buffer, got {describe(ck)}")
    if P and T <= P and close(ck[:, :, :T], k_expected[:, :, P:]):
        g.fail(_AT_ZERO_HINT)
    g.expect(close(ck[:, :, :S], k_expected) and close(cv[:, :, :S], v_expected),
             "the cache does not hold the keys and values of all tokens in order: new keys/values go to positions "
             "P .. P + T - 1, after the cached ones (cache.update)")


def grade_causal_self_attention(causal_self_attention, MultiHeadAttention, LayerCache) -> None:
    """Grade a student's ``causal_self_attention(attn, x, cache=None)``.

    ``MultiHeadAttention`` and ``LayerCache`` are the notebook's names for the coursekit
    classes: the module and the cache are built with them, where the student's code runs.
    """
    g = Grader("causal_self_attention")

    with g.check("without a cache: causal multi-head attention of x, (B, T, C)"):
        for n_kv in (None, 2):
            m, r = attention_pair(MultiHeadAttention, f"csa.nocache.{n_kv}", n_kv)
            x = rand(f"csa.nocache.{n_kv}.x", 2, 6, C)
            out = _csa_call(g, causal_self_attention, m, x)
            g.expect(is_tensor(out) and out.shape == x.shape and out.dtype == x.dtype,
                     f"for x {describe(x)} expected the same shape and dtype, got {describe(out)}")
            _, k, v = r.project(x)
            first_match(g, out, _csa_mistakes(r, x, k, v, 0), r(x, is_causal=True)[0])
            g.expect(close(out, r(x, is_causal=True)[0]),
                     "without a cache the output differs from Chapter 2's attn(x, is_causal=True)[0] with the same weights")

    with g.check("one new token after P cached ones sees every cached key"):
        m, r = attention_pair(MultiHeadAttention, "csa.step")
        B, P = 2, 5
        cache, x_past, k_past, v_past = _prefilled(LayerCache, r, "csa.step", B, P, max_len=8)
        x_new = rand("csa.step.new", B, 1, C)
        out = _csa_call(g, causal_self_attention, m, x_new, cache)
        g.expect(is_tensor(out) and out.shape == (B, 1, C), f"one new token: expected (B, 1, C) = {(B, 1, C)}, got {describe(out)}")
        _, k_new, v_new = r.project(x_new)
        k_all, v_all = torch.cat([k_past, k_new], 2), torch.cat([v_past, v_new], 2)
        full = r(torch.cat([x_past, x_new], 1), is_causal=True)[0]  # (B, P + 1, C)
        first_match(g, out, _csa_mistakes(r, x_new, k_all, v_all, P), full[:, P:])
        g.expect(close(out, full[:, P:]), "the new token's output differs from attention over the whole sequence at its position")
        _cache_contents(g, cache, k_all, v_all, P)

    with g.check("a chunk of new tokens after a cache: the causal mask is aligned bottom-right"):
        m, r = attention_pair(MultiHeadAttention, "csa.chunk")
        B, P, T = 2, 4, 3
        cache, x_past, k_past, v_past = _prefilled(LayerCache, r, "csa.chunk", B, P, max_len=10)
        x_new = rand("csa.chunk.new", B, T, C)
        out = _csa_call(g, causal_self_attention, m, x_new, cache)
        g.expect(is_tensor(out) and out.shape == (B, T, C), f"expected (B, T, C) = {(B, T, C)}, got {describe(out)}")
        _, k_new, v_new = r.project(x_new)
        k_all, v_all = torch.cat([k_past, k_new], 2), torch.cat([v_past, v_new], 2)
        full = r(torch.cat([x_past, x_new], 1), is_causal=True)[0]
        first_match(g, out, _csa_mistakes(r, x_new, k_all, v_all, P), full[:, P:])
        g.expect(close(out, full[:, P:]), "the chunk's outputs differ from attention over the whole sequence at their positions")
        _cache_contents(g, cache, k_all, v_all, P)

    with g.check("decoding piece by piece with the cache equals attention over the whole sequence"):
        m, r = attention_pair(MultiHeadAttention, "csa.chain")
        B, S = 2, 9
        x = rand("csa.chain.x", B, S, C)
        cache = LayerCache(B, H, S, D, torch.float64)
        outs = []
        for start, end in ((0, 4), (4, 5), (5, 8), (8, 9)):
            out = _csa_call(g, causal_self_attention, m, x[:, start:end], cache)
            g.expect(is_tensor(out) and out.shape == (B, end - start, C), f"expected {(B, end - start, C)}, got {describe(out)}")
            outs.append(out)
        full = r(x, is_causal=True)[0]
        ok = [close(o, full[:, a:b]) for o, (a, b) in zip(outs, ((0, 4), (4, 5), (5, 8), (8, 9)))]
        g.expect(ok[0], "the first call (empty cache, 4 tokens) differs from causal attention over those 4 tokens")
        g.expect(all(ok), f"feeding 4, 1, 3 and 1 tokens with one cache, the pieces {[i for i, o in enumerate(ok) if not o]} "
                          "differ from attention over the whole sequence: later pieces must see all earlier tokens through the cache")
        _, k, v = r.project(x)
        _cache_contents(g, cache, k, v, 8)

    with g.check("grouped-query attention: the cache holds H_kv heads (n_kv_heads = 2 and 1)"):
        for n_kv in (2, 1):
            m, r = attention_pair(MultiHeadAttention, f"csa.gqa.{n_kv}", n_kv)
            B, P, T = 2, 3, 2
            cache, x_past, k_past, v_past = _prefilled(LayerCache, r, f"csa.gqa.{n_kv}", B, P, max_len=6)
            x_new = rand(f"csa.gqa.{n_kv}.new", B, T, C)
            out = _csa_call(g, causal_self_attention, m, x_new, cache)
            _, k_new, v_new = r.project(x_new)
            k_all, v_all = torch.cat([k_past, k_new], 2), torch.cat([v_past, v_new], 2)
            full = r(torch.cat([x_past, x_new], 1), is_causal=True)[0]
            first_match(g, out, _csa_mistakes(r, x_new, k_all, v_all, P), full[:, P:])
            g.expect(close(out, full[:, P:]), f"with n_kv_heads={n_kv} the output differs from attention over the whole sequence")
            _cache_contents(g, cache, k_all, v_all, P)

    with g.check("dropout only in training mode"):
        m, r = attention_pair(MultiHeadAttention, "csa.dropout", dropout=0.5)
        x = rand("csa.dropout.x", 2, 6, C)
        out = _csa_call(g, causal_self_attention, m, x)
        again = _csa_call(g, causal_self_attention, m, x)
        g.expect(is_tensor(out) and is_tensor(again) and out.shape == x.shape and torch.equal(out, again),
                 "in eval mode with attn.dropout=0.5 two calls gave different outputs: apply dropout only when attn.training")
        first_match(g, out, _csa_mistakes(r, x, *r.project(x)[1:], 0), r(x, is_causal=True)[0])
        g.expect(close(out, r(x, is_causal=True)[0]), "in eval mode with attn.dropout=0.5 the output differs from the reference")
        m.train()
        out = _csa_call(g, causal_self_attention, m, x)
        g.expect(is_tensor(out) and out.shape == x.shape and not close(out, r(x, is_causal=True)[0]),
                 "in training mode with attn.dropout=0.5 nothing was dropped: pass dropout_p=attn.dropout (when attn.training) "
                 "to F.scaled_dot_product_attention")

    g.finish()


def check_causal_self_attention(causal_self_attention, MultiHeadAttention, LayerCache) -> None:
    """Public checks of ``causal_self_attention``: without a cache, then 3 cached tokens and one more."""
    g = Grader("causal_self_attention (public)")
    with g.check("without a cache it equals attn(x, is_causal=True)[0]"):
        m, r = attention_pair(MultiHeadAttention, "public.csa")
        x = rand("public.csa.x", 2, 4, C)
        out = _csa_call(g, causal_self_attention, m, x)
        g.expect(is_tensor(out) and out.shape == (2, 4, C), f"expected (B, T, C) = (2, 4, {C}), got {describe(out)}")
        g.expect(close(out, r(x, is_causal=True)[0]), "the output differs from Chapter 2's attention with is_causal=True")
    with g.check("3 tokens into an empty cache, then 1 more: the outputs equal those without a cache"):
        m, r = attention_pair(MultiHeadAttention, "public.csa")
        x = rand("public.csa.x", 2, 4, C)
        cache = LayerCache(2, H, 4, D, torch.float64)
        first = _csa_call(g, causal_self_attention, m, x[:, :3], cache)
        last = _csa_call(g, causal_self_attention, m, x[:, 3:], cache)
        full = r(x, is_causal=True)[0]
        g.expect(cache.length == 4, f"after 3 + 1 tokens cache.length should be 4, got {cache.length!r}: extend the cache with cache.update(k, v)")
        g.expect(close(first, full[:, :3]), "with an empty cache the output differs from causal attention over the same tokens")
        g.expect(close(last, full[:, 3:]), "the 4th token's output differs from attention over all 4 tokens: it must see the 3 cached keys")
    g.finish()
