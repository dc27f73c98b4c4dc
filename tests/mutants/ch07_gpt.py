"""Wrong implementations for Exercise 7, each a mistake students really make.

The wrong beam searches are the reference with one edit each (see :func:`_beam`), so every
mutant differs from a correct answer in exactly the way its name says. The sources may use
the names the notebook's imports cell defines (``torch``, ``F``, ``math``, ``causal_mask``,
``merge_heads``, ``repeat_kv``, ...).
"""

import inspect
import textwrap

from coursekit import decoding
from tests.mutants import Mutant, edit

#: the graded part (the Grader's name) -> the grade_id of its hidden test cell

_BEAM = textwrap.dedent(inspect.getsource(decoding.beam_search))


def _beam(*edits: tuple[str, str]) -> str:
    """The reference ``beam_search`` source with each ``(old, new)`` edit applied once."""
    return edit(_BEAM, *edits)


# a by-hand attention step, correct but for the edits of the mutants that use it
_CSA_BY_HAND = '''
def causal_self_attention(attn, x, cache=None):
    q, k, v = attn.project(x)  # (B, H, T, D), (B, H_kv, T, D), (B, H_kv, T, D)
    if cache is not None:
        k, v = cache.update(k, v)  # (B, H_kv, S, D)
    n_rep = attn.n_heads // attn.n_kv_heads
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, D)
    T, S = q.shape[2], k.shape[2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    scores = scores.masked_fill(~causal_mask(T, S), float("-inf"))
    weights = F.dropout(torch.softmax(scores, dim=-1), attn.dropout, attn.training)
    return attn.out_proj(merge_heads(weights @ v))  # (B, T, C)
'''


def _csa(old: str, new: str) -> str:
    return edit(_CSA_BY_HAND, (old, new))


MUTANTS = [
    # ------------------------------------------------------------------ part 1: causal_lm_loss
    Mutant(
        "loss_not_shifted", "causal_lm_loss", "causal_lm_loss", "targets are not shifted",
        '''
def causal_lm_loss(logits, input_ids, ignore_index=-100):
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2] or logits.shape[1] < 2:
        raise ValueError(f"expected logits (B, T, V) and input_ids (B, T) with T >= 2, got {tuple(logits.shape)}")
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), input_ids.reshape(-1), ignore_index=ignore_index)
''',
    ),
    Mutant(
        "loss_shift_wrong_way", "causal_lm_loss", "causal_lm_loss", "the shift goes the wrong way",
        '''
def causal_lm_loss(logits, input_ids, ignore_index=-100):
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2] or logits.shape[1] < 2:
        raise ValueError(f"expected logits (B, T, V) and input_ids (B, T) with T >= 2, got {tuple(logits.shape)}")
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, 1:].reshape(-1, V), input_ids[:, :-1].reshape(-1), ignore_index=ignore_index)
''',
    ),
    Mutant(
        "loss_mean_over_ignored", "causal_lm_loss", "causal_lm_loss", "the loss averages over ignored positions",
        '''
def causal_lm_loss(logits, input_ids, ignore_index=-100):
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2] or logits.shape[1] < 2:
        raise ValueError(f"expected logits (B, T, V) and input_ids (B, T) with T >= 2, got {tuple(logits.shape)}")
    V = logits.shape[-1]
    losses = F.cross_entropy(logits[:, :-1].reshape(-1, V), input_ids[:, 1:].reshape(-1),
                             ignore_index=ignore_index, reduction="none")
    return losses.mean()  # the ignored positions (loss 0) still count in the mean
''',
    ),
    Mutant(
        "loss_fixed_ignore_index", "causal_lm_loss", "causal_lm_loss", "the ignore_index argument was not used",
        '''
def causal_lm_loss(logits, input_ids, ignore_index=-100):
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2] or logits.shape[1] < 2:
        raise ValueError(f"expected logits (B, T, V) and input_ids (B, T) with T >= 2, got {tuple(logits.shape)}")
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), input_ids[:, 1:].reshape(-1), ignore_index=-100)
''',
    ),
    # ------------------------------------------------------------------ part 2: top_k_filter
    Mutant(
        "top_k_drops_ties", "top_k_filter", "top_k_filter", "ties with the k-th largest must be kept",
        '''
def top_k_filter(logits, k):
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    idx = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).indices
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, idx, True)
    return logits.masked_fill(~keep, float("-inf"))
''',
    ),
    Mutant(
        "top_k_keeps_k_plus_one", "top_k_filter", "top_k_filter", "kept k + 1 tokens",
        '''
def top_k_filter(logits, k):
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    V = logits.shape[-1]
    if k >= V:
        return logits.clone()
    kth = torch.sort(logits, dim=-1, descending=True).values[..., k:k + 1]  # index k: the (k+1)-th largest
    return logits.masked_fill(logits < kth, float("-inf"))
''',
    ),
    Mutant(
        "top_k_in_place", "top_k_filter", "top_k_filter", "changed its input in place",
        '''
def top_k_filter(logits, k):
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill_(logits < kth, float("-inf"))
''',
    ),
    # ------------------------------------------------------------------ part 3: top_p_filter
    Mutant(
        "top_p_drops_the_crossing_token", "top_p_filter", "top_p_filter", "top-p dropped the token that crosses p",
        '''
def top_p_filter(logits, p):
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = F.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    drop_sorted = cum > p  # drops the token whose probability crosses p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))
''',
    ),
    Mutant(
        "top_p_unsorted", "top_p_filter", "top_p_filter", "sort the logits in decreasing order first",
        '''
def top_p_filter(logits, p):
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    probs = F.softmax(logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # accumulated in vocabulary order
    return logits.masked_fill(before >= p, float("-inf"))
''',
    ),
    Mutant(
        "top_p_sorted_result", "top_p_filter", "top_p_filter", "the result is in sorted order",
        '''
def top_p_filter(logits, p):
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = F.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs
    return sorted_logits.masked_fill(before >= p, float("-inf"))  # never scattered back
''',
    ),
    # ------------------------------------------------------------------ part 4: beam_search
    Mutant(
        "beam_not_normalised", "beam_search", "beam_search", "beam scores are not length-normalised",
        _beam(("            return total / n ** length_penalty\n", "            return total\n")),
    ),
    Mutant(
        "beam_ignores_eos", "beam_search", "beam_search", "the sequence goes on after EOS",
        _beam(("                if eos_id is not None and tok == eos_id:\n", "                if False:\n")),
    ),
    Mutant(
        "beam_eos_takes_a_live_beam", "beam_search", "beam_search", "an EOS candidate took the place of a live beam",
        _beam(("cand.topk(min(2 * W, cand.numel()))", "cand.topk(min(W, cand.numel()))")),
    ),
    Mutant(
        "beam_cache_not_reordered", "beam_search", "beam_search", "the KV cache was not reordered",
        _beam(("            cache.reorder(index)\n", "")),
    ),
    Mutant(
        "beam_greedy_per_beam", "beam_search", "beam_search", "your beam search returned the greedy sequence",
        _beam((
            "            top_scores, top_idx = cand.topk(min(2 * W, cand.numel()))  # best first\n",
            "            best = logp.topk(min(2, V), dim=-1).indices  # each beam keeps only its own best tokens\n"
            "            top_idx = (torch.arange(logp.shape[0])[:, None] * V + best).view(-1)\n"
            "            top_scores = cand[top_idx]\n",
        )),
    ),
    # ------------------------------------------------------------------ part 5: causal_self_attention
    Mutant(
        "csa_top_left_mask", "causal_self_attention", "causal_self_attention", "the causal mask is aligned top-left",
        '''
def causal_self_attention(attn, x, cache=None):
    q, k, v = attn.project(x)
    if cache is not None:
        k, v = cache.update(k, v)
    dropout_p = attn.dropout if attn.training else 0.0
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                         enable_gqa=attn.n_kv_heads != attn.n_heads)
    return attn.out_proj(merge_heads(out))
''',
    ),
    Mutant(
        "csa_cache_written_at_zero", "causal_self_attention", "causal_self_attention", "the cache is written at position 0",
        '''
def causal_self_attention(attn, x, cache=None):
    q, k, v = attn.project(x)
    if cache is not None:
        T = k.shape[2]
        cache.k[:, :, :T] = k  # forgets the P cached positions
        cache.v[:, :, :T] = v
        cache.length += T
        k, v = cache.k[:, :, :cache.length], cache.v[:, :, :cache.length]
    T, S = q.shape[2], k.shape[2]
    dropout_p = attn.dropout if attn.training else 0.0
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(T, S), dropout_p=dropout_p,
                                         enable_gqa=attn.n_kv_heads != attn.n_heads)
    return attn.out_proj(merge_heads(out))
''',
    ),
    Mutant(
        "csa_cache_not_extended", "causal_self_attention", "causal_self_attention", "the cache was not extended",
        '''
def causal_self_attention(attn, x, cache=None):
    q, k, v = attn.project(x)  # the cache is ignored: new tokens see only each other
    dropout_p = attn.dropout if attn.training else 0.0
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                         enable_gqa=attn.n_kv_heads != attn.n_heads)
    return attn.out_proj(merge_heads(out))
''',
    ),
    Mutant(
        "csa_no_scale", "causal_self_attention", "causal_self_attention", "multiply q k^T by 1/sqrt(D)",
        _csa(" / math.sqrt(q.shape[-1])", ""),
    ),
    Mutant(
        "csa_no_out_proj", "causal_self_attention", "causal_self_attention", "the output projection is missing",
        _csa("return attn.out_proj(merge_heads(weights @ v))", "return merge_heads(weights @ v)"),
    ),
    Mutant(
        "csa_gqa_tiled", "causal_self_attention", "causal_self_attention", "the groups are wrong",
        _csa("k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)", "k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)"),
    ),
    Mutant(
        "csa_dropout_always", "causal_self_attention", "causal_self_attention", "apply dropout only when attn.training",
        _csa("F.dropout(torch.softmax(scores, dim=-1), attn.dropout, attn.training)",
             "F.dropout(torch.softmax(scores, dim=-1), attn.dropout)"),
    ),
]
