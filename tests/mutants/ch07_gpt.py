"""Wrong implementations for Exercise 7, each a mistake students really make.

The wrong beam searches are the reference with one edit each (see :func:`_beam`), so every
mutant differs from a correct answer in exactly the way its name says. The sources may use
the names the notebook's imports cell defines (``torch``, ``F``, ``math``, ``causal_mask``,
``merge_heads``, ``repeat_kv``, ...).
"""

import inspect
import textwrap

from coursekit import decoding, gpt
from tests.mutants import Mutant, edit, mutant

#: the graded part (the Grader's name) -> the grade_id of its hidden test cell

_BEAM = textwrap.dedent(inspect.getsource(decoding.beam_search))


def _beam(*edits: tuple[str, str]) -> str:
    """The reference ``beam_search`` source with each ``(old, new)`` edit applied once."""
    return edit(_BEAM, *edits)


# a by-hand attention step, correct but for the edits of the mutants that use it
_CSA_BY_HAND = """
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
"""


def _csa(old: str, new: str) -> str:
    return edit(_CSA_BY_HAND, (old, new))


MUTANTS = [
    # ------------------------------------------------------------------ part 1: causal_lm_loss
    Mutant(
        "loss_not_shifted",
        "causal_lm_loss",
        "causal_lm_loss",
        "targets are not shifted",
        """
def causal_lm_loss(logits, input_ids, ignore_index=-100):
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2] or logits.shape[1] < 2:
        raise ValueError(f"expected logits (B, T, V) and input_ids (B, T) with T >= 2, got {tuple(logits.shape)}")
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), input_ids.reshape(-1), ignore_index=ignore_index)
""",
    ),
    Mutant(
        "loss_shift_wrong_way",
        "causal_lm_loss",
        "causal_lm_loss",
        "the shift goes the wrong way",
        """
def causal_lm_loss(logits, input_ids, ignore_index=-100):
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2] or logits.shape[1] < 2:
        raise ValueError(f"expected logits (B, T, V) and input_ids (B, T) with T >= 2, got {tuple(logits.shape)}")
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, 1:].reshape(-1, V), input_ids[:, :-1].reshape(-1), ignore_index=ignore_index)
""",
    ),
    Mutant(
        "loss_mean_over_ignored",
        "causal_lm_loss",
        "causal_lm_loss",
        "the loss averages over ignored positions",
        """
def causal_lm_loss(logits, input_ids, ignore_index=-100):
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2] or logits.shape[1] < 2:
        raise ValueError(f"expected logits (B, T, V) and input_ids (B, T) with T >= 2, got {tuple(logits.shape)}")
    V = logits.shape[-1]
    losses = F.cross_entropy(logits[:, :-1].reshape(-1, V), input_ids[:, 1:].reshape(-1),
                             ignore_index=ignore_index, reduction="none")
    return losses.mean()  # the ignored positions (loss 0) still count in the mean
""",
    ),
    Mutant(
        "loss_fixed_ignore_index",
        "causal_lm_loss",
        "causal_lm_loss",
        "the ignore_index argument was not used",
        """
def causal_lm_loss(logits, input_ids, ignore_index=-100):
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2] or logits.shape[1] < 2:
        raise ValueError(f"expected logits (B, T, V) and input_ids (B, T) with T >= 2, got {tuple(logits.shape)}")
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), input_ids[:, 1:].reshape(-1), ignore_index=-100)
""",
    ),
    Mutant(
        "loss_log_of_softmax",
        "causal_lm_loss",
        "causal_lm_loss",
        "the loss is inf or NaN for large logits",
        """
def causal_lm_loss(logits, input_ids, ignore_index=-100):
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2] or logits.shape[1] < 2:
        raise ValueError(f"expected logits (B, T, V) and input_ids (B, T) with T >= 2, got {tuple(logits.shape)}")
    V = logits.shape[-1]
    logp = torch.log(torch.softmax(logits[:, :-1], dim=-1))  # log(0) = -inf once exp underflows
    return F.nll_loss(logp.reshape(-1, V), input_ids[:, 1:].reshape(-1), ignore_index=ignore_index)
""",
    ),
    Mutant(
        "loss_no_value_error",
        "causal_lm_loss",
        "causal_lm_loss",
        "raise a ValueError instead",
        """
def causal_lm_loss(logits, input_ids, ignore_index=-100):
    V = logits.shape[-1]  # no checks: T = 1 gives NaN, mismatched shapes whatever cross_entropy says
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), input_ids[:, 1:].reshape(-1), ignore_index=ignore_index)
""",
    ),
    Mutant(
        "loss_changes_input_ids",
        "causal_lm_loss",
        "causal_lm_loss",
        "changed input_ids in place",
        """
def causal_lm_loss(logits, input_ids, ignore_index=-100):
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2] or logits.shape[1] < 2:
        raise ValueError(f"expected logits (B, T, V) and input_ids (B, T) with T >= 2, got {tuple(logits.shape)}")
    V = logits.shape[-1]
    target = input_ids[:, 1:]
    target[target == ignore_index] = -100  # writes into input_ids: a view
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), target.reshape(-1))
""",
    ),
    Mutant(
        "loss_mean_per_row",
        "causal_lm_loss",
        "causal_lm_loss",
        "count neither in the sum nor in the mean",
        """
def causal_lm_loss(logits, input_ids, ignore_index=-100):
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2] or logits.shape[1] < 2:
        raise ValueError(f"expected logits (B, T, V) and input_ids (B, T) with T >= 2, got {tuple(logits.shape)}")
    rows = [F.cross_entropy(logits[b, :-1], input_ids[b, 1:], ignore_index=ignore_index) for b in range(len(logits))]
    return torch.stack(rows).nanmean()  # the mean of the rows' means: rows with more padding weigh more
""",
    ),
    # ------------------------------------------------------------------ part 2: top_k_filter
    Mutant(
        "top_k_drops_ties",
        "top_k_filter",
        "top_k_filter",
        "ties with the k-th largest must be kept",
        """
def top_k_filter(logits, k):
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    idx = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).indices
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, idx, True)
    return logits.masked_fill(~keep, float("-inf"))
""",
    ),
    Mutant(
        "top_k_keeps_k_plus_one",
        "top_k_filter",
        "top_k_filter",
        "kept k + 1 tokens",
        """
def top_k_filter(logits, k):
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    V = logits.shape[-1]
    if k >= V:
        return logits.clone()
    kth = torch.sort(logits, dim=-1, descending=True).values[..., k:k + 1]  # index k: the (k+1)-th largest
    return logits.masked_fill(logits < kth, float("-inf"))
""",
    ),
    Mutant(
        "top_k_in_place",
        "top_k_filter",
        "top_k_filter",
        "changed its input in place",
        """
def top_k_filter(logits, k):
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill_(logits < kth, float("-inf"))
""",
    ),
    Mutant(
        "top_k_only_rejects_k_below_1",
        "top_k_filter",
        "top_k_filter",
        "raise a ValueError instead",
        """
def top_k_filter(logits, k):
    if k < 1:  # 2.5 gets through
        raise ValueError(f"k must be a positive integer, got {k!r}")
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))
""",
    ),
    Mutant(
        "top_k_rows_of_a_matrix",
        "top_k_filter",
        "top_k_filter",
        "top_k_filter(logits (6,) float64, 2)",
        """
def top_k_filter(logits, k):
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    k = min(k, logits.shape[1])  # assumes (B, V)
    kth = torch.topk(logits, k, dim=1).values[:, -1:]
    return logits.masked_fill(logits < kth, float("-inf"))
""",
    ),
    Mutant(
        "top_k_no_clamp",
        "top_k_filter",
        "top_k_filter",
        "k >= V keeps every logit",
        """
def top_k_filter(logits, k):
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # k > V: torch.topk raises
    return logits.masked_fill(logits < kth, float("-inf"))
""",
    ),
    Mutant(
        "top_k_returns_the_input_when_k_covers_v",
        "top_k_filter",
        "top_k_filter",
        "your result shares memory with an input",
        """
def top_k_filter(logits, k):
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if k >= logits.shape[-1]:
        return logits  # nothing to drop: the caller's tensor itself
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))
""",
    ),
    # ------------------------------------------------------------------ part 3: top_p_filter
    Mutant(
        "top_p_drops_the_crossing_token",
        "top_p_filter",
        "top_p_filter",
        "top-p dropped the token that crosses p",
        """
def top_p_filter(logits, p):
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = F.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    drop_sorted = cum > p  # drops the token whose probability crosses p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))
""",
    ),
    Mutant(
        "top_p_unsorted",
        "top_p_filter",
        "top_p_filter",
        "sort the logits in decreasing order first",
        """
def top_p_filter(logits, p):
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    probs = F.softmax(logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # accumulated in vocabulary order
    return logits.masked_fill(before >= p, float("-inf"))
""",
    ),
    Mutant(
        "top_p_sorted_result",
        "top_p_filter",
        "top_p_filter",
        "the result is in sorted order",
        """
def top_p_filter(logits, p):
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = F.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs
    return sorted_logits.masked_fill(before >= p, float("-inf"))  # never scattered back
""",
    ),
    Mutant(
        "top_p_in_place",
        "top_p_filter",
        "top_p_filter",
        "changed its input in place",
        """
def top_p_filter(logits, p):
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = F.softmax(sorted_logits, dim=-1)
    drop_sorted = probs.cumsum(dim=-1) - probs >= p
    return logits.masked_fill_(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
""",
    ),
    Mutant(
        "top_p_no_value_error",
        "top_p_filter",
        "top_p_filter",
        "raise a ValueError instead",
        """
def top_p_filter(logits, p):
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = F.softmax(sorted_logits, dim=-1)
    drop_sorted = probs.cumsum(dim=-1) - probs >= p
    return logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
""",
    ),
    Mutant(
        "top_p_rows_of_a_matrix",
        "top_p_filter",
        "top_p_filter",
        "top_p_filter(logits (6,) float64",
        """
def top_p_filter(logits, p):
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    sorted_logits, order = torch.sort(logits, dim=1, descending=True)  # assumes (B, V)
    probs = F.softmax(sorted_logits, dim=1)
    drop_sorted = probs.cumsum(dim=1) - probs >= p
    return logits.masked_fill(drop_sorted.scatter(1, order, drop_sorted), float("-inf"))
""",
    ),
    Mutant(
        "top_p_returns_the_input_at_p_1",
        "top_p_filter",
        "top_p_filter",
        "your result shares memory with an input",
        """
def top_p_filter(logits, p):
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    if p == 1.0:
        return logits  # every token kept: the caller's tensor itself
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = F.softmax(sorted_logits, dim=-1)
    drop_sorted = probs.cumsum(dim=-1) - probs >= p
    return logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
""",
    ),
    # ------------------------------------------------------------------ part 4: beam_search
    Mutant(
        "beam_not_normalised",
        "beam_search",
        "beam_search",
        "beam scores are not length-normalised",
        _beam(("            return total / n**length_penalty\n", "            return total\n")),
    ),
    Mutant(
        "beam_ignores_eos",
        "beam_search",
        "beam_search",
        "the sequence goes on after EOS",
        _beam(("                if eos_id is not None and tok == eos_id:\n", "                if False:\n")),
    ),
    Mutant(
        "beam_eos_takes_a_live_beam",
        "beam_search",
        "beam_search",
        "an EOS candidate took the place of a live beam",
        _beam(("cand.topk(min(2 * W, cand.numel()))", "cand.topk(min(W, cand.numel()))")),
    ),
    Mutant(
        "beam_cache_not_reordered",
        "beam_search",
        "beam_search",
        "the KV cache was not reordered",
        _beam(("            cache.reorder(index)\n", "")),
    ),
    Mutant(
        "beam_greedy_per_beam",
        "beam_search",
        "beam_search",
        "your beam search returned the greedy sequence",
        _beam(
            (
                "            top_scores, top_idx = cand.topk(min(2 * W, cand.numel()))  # best first\n",
                "            best = logp.topk(min(2, V), dim=-1).indices  # each beam keeps only its own best tokens\n"
                "            top_idx = (torch.arange(logp.shape[0])[:, None] * V + best).view(-1)\n"
                "            top_scores = cand[top_idx]\n",
            )
        ),
    ),
    Mutant(
        "beam_eos_rank_ignored",
        "beam_search",
        "beam_search",
        "an EOS candidate ranked below the best W",
        _beam(
            (
                "                    if r < W:  # only an ending among the W best candidates finishes a hypothesis\n",
                "                    if True:\n",
            )
        ),
    ),
    Mutant(
        "beam_live_beams_forgotten",
        "beam_search",
        "beam_search",
        "the live beams were not counted",
        _beam(
            (
                "            for beam, tok, s in zip(keep_beam, keep_tok, keep_score):\n"
                "                finished.append((rank(s, t), torch.cat([beams[beam], beams.new_tensor([tok])])))\n",
                "            if not finished:  # only when nothing ended in EOS\n"
                "                for beam, tok, s in zip(keep_beam, keep_tok, keep_score):\n"
                "                    finished.append((rank(s, t), "
                "torch.cat([beams[beam], beams.new_tensor([tok])])))\n",
            )
        ),
    ),
    Mutant(
        "beam_too_few_candidates",
        "beam_search",
        "beam_search",
        "the third (ranked 5th) is dropped",
        _beam(("cand.topk(min(2 * W, cand.numel()))", "cand.topk(min(W + 2, cand.numel()))")),
    ),
    Mutant(
        "beam_stops_when_w_finished",
        "beam_search",
        "beam_search",
        "the search stopped too early",
        _beam(("            return best <= worst_kept\n", "            return True\n")),
    ),
    Mutant(
        "beam_left_in_eval_mode",
        "beam_search",
        "beam_search",
        "left in eval mode",
        _beam(("        model.train(was_training)\n", "        pass\n")),
    ),
    Mutant(
        "beam_mode_restored_without_finally",
        "beam_search",
        "beam_search",
        "restore its mode in a finally block",
        _beam(
            ("    finally:\n        model.train(was_training)\n", "    finally:\n        pass\n"),
            (
                "        return best[None], best_score\n",
                "        model.train(was_training)\n        return best[None], best_score\n",
            ),
        ),
    ),
    Mutant(
        "beam_always_back_to_training",
        "beam_search",
        "beam_search",
        "restore the mode it had",
        _beam(("        model.train(was_training)\n", "        model.train()\n")),
    ),
    Mutant(
        "beam_score_as_tensor",
        "beam_search",
        "beam_search",
        "score must be a finite Python float",
        _beam(
            (
                "        return best[None], best_score\n",
                "        return best[None], torch.tensor(best_score)\n",
            )
        ),
    ),
    Mutant(
        "beam_default_width_3",
        "beam_search",
        "beam_search",
        "the default beam_width is 4",
        _beam(("    beam_width: int = 4,\n", "    beam_width: int = 3,\n")),
    ),
    Mutant(
        "beam_no_value_errors",
        "beam_search",
        "beam_search",
        "raise a ValueError instead",
        _beam(
            ("    if max_new_tokens < 1:\n", "    if False:\n"),
            ("    if not isinstance(beam_width, int) or beam_width < 1:\n", "    if False:\n"),
            (
                "    if prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.dtype != torch.long:\n",
                "    if False:\n",
            ),
        ),
    ),
    # ------------------------------------------------------------------ part 5: causal_self_attention
    Mutant(
        "csa_top_left_mask",
        "causal_self_attention",
        "causal_self_attention",
        "the causal mask is aligned top-left",
        """
def causal_self_attention(attn, x, cache=None):
    q, k, v = attn.project(x)
    if cache is not None:
        k, v = cache.update(k, v)
    dropout_p = attn.dropout if attn.training else 0.0
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                         enable_gqa=attn.n_kv_heads != attn.n_heads)
    return attn.out_proj(merge_heads(out))
""",
    ),
    Mutant(
        "csa_cache_written_at_zero",
        "causal_self_attention",
        "causal_self_attention",
        "the cache is written at position 0",
        """
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
""",
    ),
    Mutant(
        "csa_cache_not_extended",
        "causal_self_attention",
        "causal_self_attention",
        "the cache was not extended",
        """
def causal_self_attention(attn, x, cache=None):
    q, k, v = attn.project(x)  # the cache is ignored: new tokens see only each other
    dropout_p = attn.dropout if attn.training else 0.0
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                         enable_gqa=attn.n_kv_heads != attn.n_heads)
    return attn.out_proj(merge_heads(out))
""",
    ),
    Mutant(
        "csa_no_scale",
        "causal_self_attention",
        "causal_self_attention",
        "multiply q k^T by 1/sqrt(D)",
        _csa(" / math.sqrt(q.shape[-1])", ""),
    ),
    Mutant(
        "csa_no_out_proj",
        "causal_self_attention",
        "causal_self_attention",
        "the output projection is missing",
        _csa("return attn.out_proj(merge_heads(weights @ v))", "return merge_heads(weights @ v)"),
    ),
    Mutant(
        "csa_gqa_tiled",
        "causal_self_attention",
        "causal_self_attention",
        "the groups are wrong",
        _csa(
            "k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)",
            "k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)",
        ),
    ),
    Mutant(
        "csa_dropout_always",
        "causal_self_attention",
        "causal_self_attention",
        "apply dropout only when attn.training",
        _csa(
            "F.dropout(torch.softmax(scores, dim=-1), attn.dropout, attn.training)",
            "F.dropout(torch.softmax(scores, dim=-1), attn.dropout)",
        ),
    ),
    Mutant(
        "csa_no_dropout",
        "causal_self_attention",
        "causal_self_attention",
        "apply dropout with probability attn.dropout to the attention weights",
        _csa(
            "F.dropout(torch.softmax(scores, dim=-1), attn.dropout, attn.training)",
            "torch.softmax(scores, dim=-1)",
        ),
    ),
    Mutant(
        "csa_dropout_on_the_output",
        "causal_self_attention",
        "causal_self_attention",
        "dropout belongs on the attention",
        _csa(
            "weights = F.dropout(torch.softmax(scores, dim=-1), attn.dropout, attn.training)\n"
            "    return attn.out_proj(merge_heads(weights @ v))",
            "weights = torch.softmax(scores, dim=-1)\n"
            "    return attn.out_proj(F.dropout(merge_heads(weights @ v), attn.dropout, attn.training))",
        ),
    ),
    Mutant(
        "csa_dropout_fixed_p",
        "causal_self_attention",
        "causal_self_attention",
        "with every attention weight dropped",
        _csa(
            "F.dropout(torch.softmax(scores, dim=-1), attn.dropout, attn.training)",
            "F.dropout(torch.softmax(scores, dim=-1), 0.1, attn.training)",
        ),
    ),
    Mutant(
        "csa_caches_repeated_heads",
        "causal_self_attention",
        "causal_self_attention",
        "cache.update received keys/values",
        _csa(
            "    if cache is not None:\n        k, v = cache.update(k, v)  # (B, H_kv, S, D)\n"
            "    n_rep = attn.n_heads // attn.n_kv_heads\n    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, "
            "H, S, D)\n",
            "    n_rep = attn.n_heads // attn.n_kv_heads\n    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, "
            "H, S, D)\n"
            "    if cache is not None:\n        k, v = cache.update(k, v)\n",
        ),
    ),
    Mutant(
        "nucleus_stops_before_crossing",
        "predict_nucleus_size",
        "predict_nucleus_size",
        "the experiment gives 3",
        "predict_nucleus_size = 2\n",
    ),
    Mutant(
        "nucleus_keeps_all",
        "predict_nucleus_size",
        "predict_nucleus_size",
        "you predicted 4",
        "predict_nucleus_size = 4\n",
    ),
    Mutant(
        "nucleus_as_list",
        "predict_nucleus_size",
        "predict_nucleus_size",
        "should be a finite number",
        "predict_nucleus_size = [0.4, 0.3, 0.2]\n",
    ),
    Mutant(
        "perplexity_per_character",
        "predict_perplexity",
        "predict_perplexity",
        "the experiment gives (c) about 36",
        'predict_perplexity = "a"\n',
    ),
    Mutant(
        "perplexities_added",
        "predict_perplexity",
        "predict_perplexity",
        "you predicted (b) about 10",
        'predict_perplexity = "b"\n',
    ),
    Mutant(
        "perplexity_not_a_letter",
        "predict_perplexity",
        "predict_perplexity",
        "one of the letters",
        "predict_perplexity = 36\n",
    ),
    Mutant(
        "speculative_each_draft_alone",
        "predict_speculative_tokens",
        "predict_speculative_tokens",
        "you predicted (c) about 4.2",
        'predict_speculative_tokens = "c"\n',
    ),
    Mutant(
        "speculative_discards_the_whole_guess",
        "predict_speculative_tokens",
        "predict_speculative_tokens",
        "the experiment gives (b) about 3.4",
        'predict_speculative_tokens = "a"\n',
    ),
    Mutant(
        "speculative_as_a_number",
        "predict_speculative_tokens",
        "predict_speculative_tokens",
        "one of the letters",
        "predict_speculative_tokens = 3.36\n",
    ),
    mutant(
        "bpc_in_nats",
        gpt.bits_per_char,
        "natural log to bits",
        ("return total / (ids.numel() - 1) / math.log(2)", "return total / (ids.numel() - 1)"),
    ),
    mutant(
        "bpc_log10",
        gpt.bits_per_char,
        "natural log to bits",
        ("return total / (ids.numel() - 1) / math.log(2)", "return total / (ids.numel() - 1) / math.log(10)"),
    ),
    mutant(
        "bpc_unshifted",
        gpt.bits_per_char,
        "shift",
        (
            'total += F.cross_entropy(logits[0].double(), window[1:], reduction="sum").item()',
            'total += F.cross_entropy(logits[0].double(), window[:-1], reduction="sum").item()',
        ),
    ),
    mutant(
        "bpc_divides_by_windows",
        gpt.bits_per_char,
        "divide by their number",
        (
            "return total / (ids.numel() - 1) / math.log(2)",
            "return total / len(range(0, ids.numel() - 1, block_size)) / math.log(2)",
        ),
    ),
    mutant(
        "bpc_returns_tensor",
        gpt.bits_per_char,
        "should return a Python float",
        (
            "return total / (ids.numel() - 1) / math.log(2)",
            "return torch.tensor(total / (ids.numel() - 1) / math.log(2))",
        ),
    ),
    mutant(
        "bpc_no_validation",
        gpt.bits_per_char,
        "raise a ValueError",
        ("    if ids.dim() != 1 or ids.numel() < 2:\n", "    if False:\n"),
    ),
    # ------------------------------------------------------------------ stretch: min_p_filter
    mutant(
        "min_p_absolute_threshold",
        decoding.min_p_filter,
        "not with p_base itself",
        ("threshold = p_base * probs.amax(dim=-1, keepdim=True)  # (..., 1)", "threshold = p_base"),
    ),
    mutant(
        "min_p_on_logits",
        decoding.min_p_filter,
        "not the logits themselves",
        ("probs = F.softmax(logits, dim=-1)  # (..., V)", "probs = logits"),
    ),
    mutant(
        "min_p_drops_ties",
        decoding.min_p_filter,
        "not <=",
        ("masked_fill(probs < threshold,", "masked_fill(probs <= threshold,"),
    ),
    mutant(
        "min_p_global_max",
        decoding.min_p_filter,
        "of each row",
        (
            "threshold = p_base * probs.amax(dim=-1, keepdim=True)  # (..., 1)",
            "threshold = p_base * probs.amax()",
        ),
    ),
    mutant(
        "min_p_in_place",
        decoding.min_p_filter,
        "in place",
        ("return logits.masked_fill(probs < threshold", "return logits.masked_fill_(probs < threshold"),
    ),
    mutant(
        "min_p_returns_the_input_at_zero",
        decoding.min_p_filter,
        "your result shares memory with an input",
        (
            "    probs = F.softmax(logits, dim=-1)  # (..., V)\n",
            "    if p_base == 0.0:\n        return logits  # every token kept: the caller's tensor itself\n"
            "    probs = F.softmax(logits, dim=-1)  # (..., V)\n",
        ),
    ),
    mutant(
        "min_p_no_validation",
        decoding.min_p_filter,
        "raise a ValueError",
        ("    if not 0.0 <= p_base <= 1.0:\n", "    if False:\n"),
    ),
]

#: Mutants of the instructor's answers (scripts/mutation.py) that no input the text allows can tell apart
#: from the answer, each with the reason.
_TOPK = "top_k_filter | kth = torch.topk(logits, k, dim=-1).values[..., -1:] # (..., 1): the k-th largest"
_SORT = "top_p_filter | sorted_logits, order = torch.sort(logits, dim=-1, descending=True) # (..., V)"
_DROP = "top_p_filter | drop_sorted = before >= p # the first token has before = 0 < p: never dropped"
_ONE = "causal_self_attention | elif T == 1: # one new token sees every cached key"
_ONE_REASON = (
    "the T == 1 branch is a shortcut: for one new token the bottom-right causal mask of the general branch "
    "allows every key, so both branches compute the same"
)

_BOUND = "beam_search | best = max(max(rank(s, t + 1), rank(s, max_new_tokens)) for s in live_scores)"
_LOGP = "beam_search | logp = F.log_softmax(logits.float(), dim=-1) # (N, V)"
_TOPW = "beam_search | top_scores, top_idx = cand.topk(min(2 * W, cand.numel())) # best first"
_LATER = "it only stops the optional early stop later (the text: stopping early changes nothing but the time)"
_2D = "the tensor is 2-D, so dim 1 (or shape[1]) is the last axis"

EQUIVALENT: dict[str, str] = {
    "beam_search | if not isinstance(beam_width, int) or beam_width < 1: | number | 1": (
        "beam_width=0 still raises a ValueError: no candidate is kept, no hypothesis finishes, and max() of no "
        "hypotheses raises ValueError; negative widths are refused by the changed check"
    ),
    "beam_search | W, T0 = beam_width, prompt.shape[1] | number | 2": (
        "the prompt is 2-D (checked above): shape[-1] is shape[1]"
    ),
    "beam_search | cache = model.init_cache(1, T0 + max_new_tokens) | argument | 2": (
        "init_cache's max_len defaults to the model's block_size, which bounds the prompt plus max_new_tokens of "
        "every model the text allows (a GPT refuses longer sequences): the cache is larger, never too small"
    ),
    (
        'beam_search | """``W`` hypotheses have finished and no live beam can still beat the worst of them.""" | '
        "delete | 1"
    ): "removes the inner function's docstring, which does nothing",
    "beam_search | if len(finished) < W: | compare | 1": _LATER,
    "beam_search | return best <= worst_kept | compare | 1": _LATER + " (on an exact tie)",
    f"{_BOUND} | number | 1": (
        "the bound rank(s, t) is looser than rank(s, t + 1) for length_penalty < 0 and never "
        "the maximum for length_penalty >= 0: " + _LATER
    ),
    f"{_BOUND} | number | 3": (
        "for length_penalty >= 0 both bounds are rank(s, max_new_tokens); for length_penalty "
        "< 0 no input tells them apart (a live beam's rank only falls as it grows, and a search "
        "of 3,000 random tables found no difference)"
    ),
    "beam_search | for t in range(1, max_new_tokens + 1): | number | 6": (
        "the loop always breaks at t == max_new_tokens, so the extra step never runs"
    ),
    f"{_LOGP} | keyword | 1": "logits are (N, V): log_softmax's implicit dim for a 2-D input is 1, the last axis",
    f"{_LOGP} | unary | 1": _2D,
    f"{_LOGP} | number | 2": _2D,
    "beam_search | V = logp.shape[-1] | unary | 1": _2D,
    "beam_search | V = logp.shape[-1] | number | 2": _2D,
    "beam_search | cand = (scores[:, None] + logp).view(-1) # (N V,) | attribute | 1": (
        "the (N, V) sum is contiguous: reshape(-1) is view(-1)"
    ),
    f"{_TOPW} | number | 4": (
        "ranking more than the best 2W candidates changes nothing: at most N <= W of them end in "
        "EOS, so the W live beams fill from the best 2W, and an EOS ranked below W is dropped "
        "either way"
    ),
    "beam_search | beams = torch.cat([beams[index], tokens], dim=1) # (N, T0 + t) | number | 2": _2D,
    "beam_search | logits = model(tokens, cache=cache)[:, -1] # (N, V) | number | 1": (
        "the step feeds tokens (N, 1): position 0 is the last position"
    ),
    "beam_search | best_score, best = max(finished, key=lambda f: f[0]) | keyword | 1": (
        "the (score, tokens) pairs compare by score first; only an exact tie between the two best hypotheses, where "
        "the text names no winner (the graders avoid ties), would compare the tokens"
    ),
    ("causal_lm_loss | if logits.dim() != 3 or input_ids.shape != logits.shape[:2]: | number | 8"): (
        "the same condition first requires logits.dim() == 3, and for 3-D logits shape[:-1] is shape[:2]"
    ),
    f"{_TOPK} | keyword | 1": "torch.topk's dim defaults to the last axis, as documented",
    f"{_SORT} | keyword | 1": "torch.sort's dim defaults to the last axis, as documented",
    f"{_DROP} | compare | 1": (
        "differs only when the probability ranked before a token equals p exactly, a tie "
        "that the float rounding of a correct softmax decides either way"
    ),
    f"{_ONE} | number | 1": _ONE_REASON,
    f"{_ONE} | number | 2": _ONE_REASON,
    "causal_self_attention | mask = causal_mask(T, S, device=x.device) # (T, S), bottom-right aligned | keyword | 1": (
        "x is a CPU tensor for every input the autograder can send (no accelerator, and a meta tensor cannot be sent "
        "into the sandbox), and causal_mask builds its mask on the CPU by default"
    ),
    (
        "bits_per_char | if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1: "
        "| number | 1"
    ): ("block_size = 0 then reaches range(0, N - 1, 0), which raises the ValueError itself"),
    "bits_per_char | for start in range(0, ids.numel() - 1, block_size): | binop | 1": (
        "the extra windows start at N - 1 or later and hold at most one token, which predicts nothing "
        "(the cross-entropy sum over no targets is 0)"
    ),
    "bits_per_char | for start in range(0, ids.numel() - 1, block_size): | number | 3": (
        "the extra window starts at N - 1 and holds one token, which predicts nothing"
    ),
    "bits_per_char | for start in range(0, ids.numel() - 1, block_size): | number | 4": (
        "the extra window starts at N - 1 or N and holds at most one token, which predicts nothing"
    ),
    'bits_per_char | total += F.cross_entropy(logits[0].double(), window[1:], reduction="sum").item() | number | 2': (
        "the batch holds one window: logits[-1] is logits[0]"
    ),
}
