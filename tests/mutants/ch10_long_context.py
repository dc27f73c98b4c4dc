"""Wrong implementations for Exercise 10, each a mistake students really make.

Each part has a correct implementation written by hand, in a student's style rather than the
reference's (``*_BY_HAND``, scored in ``tests/test_grading_ch10_long_context.py``), and every mutant is that
code with one edit, so it differs from a correct answer in exactly the way its name says. The
sources may use the names the notebook's imports cell defines (``torch``, ``F``, ``math``,
``elu_feature_map``, ``check_attention_inputs``, ...). ``EQUIVALENT`` holds the automatically
generated mutants (``scripts/mutation.py``) that no input the text allows can tell from the answer.
"""

from coursekit import long_context
from tests.mutants import Mutant, edit, mutant

TILED_BY_HAND = """
def tiled_attention(q, k, v, causal=False, mask=None, block_q=64, block_k=64, scale=None):
    check_attention_inputs(q, k, v, mask)
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"the mask must be boolean, got {mask.dtype}")
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got {block_q} and {block_k}")
    T, S = q.shape[-2], k.shape[-2]
    if causal and S < T:
        raise ValueError(f"causal attention needs S >= T, got T={T} and S={S}")
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out = []
    for i0 in range(0, T, block_q):
        qi = q[..., i0:i0 + block_q, :] * scale
        rows = torch.arange(i0, min(i0 + block_q, T), device=q.device)[:, None] + S - T
        m = l = acc = None
        for j0 in range(0, S, block_k):
            s = qi @ k[..., j0:j0 + block_k, :].transpose(-1, -2)
            cols = torch.arange(j0, min(j0 + block_k, S), device=q.device)[None, :]
            if causal:
                s = s.masked_fill(cols > rows, -math.inf)
            if mask is not None:
                tile = mask.expand(*batch, T, S)[..., i0:i0 + block_q, j0:j0 + block_k]
                s = s.masked_fill(~tile, -math.inf)
            tile_max = s.amax(-1, keepdim=True)
            m_new = tile_max if m is None else torch.maximum(m, tile_max)
            safe = torch.nan_to_num(m_new, neginf=0.0)
            p = torch.exp(s - safe)
            if m is None:
                l, acc = p.sum(-1, keepdim=True), p @ v[..., j0:j0 + block_k, :]
            else:
                alpha = torch.exp(m - safe)
                l = alpha * l + p.sum(-1, keepdim=True)
                acc = alpha * acc + p @ v[..., j0:j0 + block_k, :]
            m = m_new
        out.append(acc / torch.where(l > 0, l, torch.ones_like(l)))
    return torch.cat(out, dim=-2)
"""

WINDOW_BY_HAND = """
def sliding_window_mask(T, window, S=None, device=None):
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    S = T if S is None else S
    if not 0 <= T <= S:
        raise ValueError(f"need 0 <= T <= S, got T={T} and S={S}")
    i = torch.arange(T, device=device)[:, None] + (S - T)
    j = torch.arange(S, device=device)[None, :]
    return (j <= i) & (j > i - window)
"""

LINEAR_BY_HAND = """
def causal_linear_attention(q, k, v, eps=1e-6):
    check_attention_inputs(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"need as many keys as queries, got {q.shape[-2]} and {k.shape[-2]}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    kv = torch.einsum("...td,...te->...tde", phi_k, v).cumsum(-3)
    z = phi_k.cumsum(-2)
    num = torch.einsum("...td,...tde->...te", phi_q, kv)
    den = torch.einsum("...td,...td->...t", phi_q, z).unsqueeze(-1)
    return num / (den + eps)
"""

KV_BY_HAND = """
def kv_cache_size(n_layers, n_heads, d_head, seq_len, n_kv_heads=None, batch=1, dtype=torch.float16, window=None):
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if min(n_layers, n_heads, d_head, n_kv_heads, batch) < 1 or seq_len < 0 or n_heads % n_kv_heads:
        raise ValueError(f"bad cache shape: {n_layers=} {n_heads=} {n_kv_heads=} {d_head=} {seq_len=} {batch=}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    tokens = seq_len if window is None else min(seq_len, window)
    bytes_per_value = torch.tensor([], dtype=dtype).element_size()
    return 2 * n_layers * batch * tokens * n_kv_heads * d_head * bytes_per_value
"""

BY_HAND = {
    "tiled_attention": TILED_BY_HAND,
    "sliding_window_mask": WINDOW_BY_HAND,
    "causal_linear_attention": LINEAR_BY_HAND,
    "kv_cache_size": KV_BY_HAND,
}


def _tiled(*edits):
    return edit(TILED_BY_HAND, *edits)


def _window(*edits):
    return edit(WINDOW_BY_HAND, *edits)


def _linear(*edits):
    return edit(LINEAR_BY_HAND, *edits)


def _kv(*edits):
    return edit(KV_BY_HAND, *edits)


MUTANTS = [
    # ------------------------------------------------------------------ part 1: tiled attention
    Mutant(
        "tiled_no_rescale_acc",
        "tiled_attention",
        "tiled_attention",
        "the accumulator is not rescaled",
        _tiled(("acc = alpha * acc + p", "acc = acc + p")),
    ),
    Mutant(
        "tiled_max_not_updated",
        "tiled_attention",
        "tiled_attention",
        "subtract the running maximum",
        _tiled(
            (
                "m_new = tile_max if m is None else torch.maximum(m, tile_max)",
                "m_new = tile_max if m is None else m",
            )
        ),
    ),
    Mutant(
        "tiled_divide_early",
        "tiled_attention",
        "tiled_attention",
        "each tile is normalised by its own sum",
        _tiled(
            (
                "p = torch.exp(s - safe)\n",
                "p = torch.exp(s - safe)\n            p = p / p.sum(-1, keepdim=True)\n",
            )
        ),
    ),
    Mutant(
        "tiled_causal_top_left",
        "tiled_attention",
        "tiled_attention",
        "the causal mask is aligned to the top left",
        _tiled(("[:, None] + S - T", "[:, None]")),
    ),
    Mutant(
        "tiled_ignores_causal",
        "tiled_attention",
        "tiled_attention",
        "causal=True is ignored",
        _tiled(("            if causal:\n                s = s.masked_fill(cols > rows, -math.inf)\n", "")),
    ),
    Mutant(  # the keys of every tile counted from 0: right with one tile, wrong across tiles
        "tiled_causal_tile_offset",
        "tiled_attention",
        "tiled_attention",
        "the causal mask is right in one tile but not across tiles",
        _tiled(
            (
                "cols = torch.arange(j0, min(j0 + block_k, S), device=q.device)[None, :]",
                "cols = torch.arange(0, min(j0 + block_k, S) - j0, device=q.device)[None, :]",
            )
        ),
    ),
    Mutant(
        "tiled_masked_rows_nan",
        "tiled_attention",
        "tiled_attention",
        "must get a zero output, not NaN",
        _tiled(("safe = torch.nan_to_num(m_new, neginf=0.0)", "safe = m_new")),
    ),
    Mutant(
        "tiled_no_scale",
        "tiled_attention",
        "tiled_attention",
        "the scores are not scaled",
        _tiled(("qi = q[..., i0:i0 + block_q, :] * scale", "qi = q[..., i0:i0 + block_q, :]")),
    ),
    # the optional arguments at other values than their defaults
    Mutant(
        "tiled_scale_zero_is_default",
        "tiled_attention",
        "tiled_attention",
        "scale=0.0",
        _tiled(
            (
                "scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale",
                "scale = scale or 1 / math.sqrt(q.shape[-1])",
            )
        ),
    ),
    Mutant(
        "tiled_scale_ignored",
        "tiled_attention",
        "tiled_attention",
        "the scale argument is ignored",
        _tiled(
            (
                "scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale",
                "scale = 1 / math.sqrt(q.shape[-1])",
            )
        ),
    ),
    Mutant(
        "tiled_mask_ignored_when_causal",
        "tiled_attention",
        "tiled_attention",
        "the mask is ignored",
        _tiled(("            if mask is not None:\n", "            if mask is not None and not causal:\n")),
    ),
    Mutant(
        "tiled_mask_inverted",
        "tiled_attention",
        "tiled_attention",
        "the mask is inverted",
        _tiled(("s = s.masked_fill(~tile, -math.inf)", "s = s.masked_fill(tile, -math.inf)")),
    ),
    # shapes: a mask over the keys only, (S,), cannot be sliced as (T, S) without expanding it
    Mutant(
        "tiled_mask_not_expanded",
        "tiled_attention",
        "tiled_attention",
        "a boolean mask (",
        _tiled(
            (
                "tile = mask.expand(*batch, T, S)[..., i0:i0 + block_q, j0:j0 + block_k]",
                "tile = mask[..., i0:i0 + block_q, j0:j0 + block_k]",
            )
        ),
    ),
    # stability: one maximum for all the rows underflows the rows whose scores are much smaller
    Mutant(
        "tiled_one_maximum_for_all_rows",
        "tiled_attention",
        "tiled_attention",
        "rows of very different sizes",
        _tiled(("tile_max = s.amax(-1, keepdim=True)", "tile_max = s.amax().expand(*s.shape[:-1], 1)")),
    ),
    # dtype: accumulators in torch's default dtype turn half precision into float32
    Mutant(
        "tiled_float32_accumulators",
        "tiled_attention",
        "tiled_attention",
        "float16 tensor",
        _tiled(
            (
                "l, acc = p.sum(-1, keepdim=True), p @ v[..., j0:j0 + block_k, :]",
                "l = torch.zeros(*p.shape[:-1], 1, device=q.device) + p.sum(-1, keepdim=True)\n"
                "                acc = p @ v[..., j0:j0 + block_k, :]",
            )
        ),
    ),
    # device: positions made on torch's default device
    Mutant(
        "tiled_positions_on_default_device",
        "tiled_attention",
        "tiled_attention",
        "make every tensor on q's device",
        _tiled(
            (
                "rows = torch.arange(i0, min(i0 + block_q, T), device=q.device)",
                "rows = torch.arange(i0, min(i0 + block_q, T))",
            )
        ),
    ),
    # in place: scaling the caller's q
    Mutant(
        "tiled_scales_q_in_place",
        "tiled_attention",
        "tiled_attention",
        "changed its argument q in place",
        _tiled(
            (
                "        qi = q[..., i0:i0 + block_q, :] * scale\n",
                "        qi = q[..., i0:i0 + block_q, :]\n        qi *= scale\n",
            )
        ),
    ),
    # promised errors
    Mutant(
        "tiled_negative_block_k_accepted",
        "tiled_attention",
        "tiled_attention",
        "block_k=-1",
        _tiled(("if block_q < 1 or block_k < 1:", "if block_q < 1 or block_k == 0:")),
    ),
    Mutant(
        "tiled_causal_short_keys_accepted",
        "tiled_attention",
        "tiled_attention",
        "causal=True with T=4 queries and S=3",
        _tiled(("    if causal and S < T:\n", "    if causal and S < 0:\n")),
    ),
    Mutant(
        "tiled_shapes_not_checked",
        "tiled_attention",
        "tiled_attention",
        "call check_attention_inputs",
        _tiled(("    check_attention_inputs(q, k, v, mask)\n", "")),
    ),
    # ------------------------------------------------------------------ part 2: sliding-window mask
    Mutant(
        "window_off_by_one",
        "sliding_window_mask",
        "sliding_window_mask",
        "the window is off by one",
        _window(("(j > i - window)", "(j >= i - window)")),
    ),
    Mutant(
        "window_not_causal",
        "sliding_window_mask",
        "sliding_window_mask",
        "the window is not causal",
        _window(("(j <= i) & (j > i - window)", "(i - j).abs() < window")),
    ),
    Mutant(
        "window_top_left",
        "sliding_window_mask",
        "sliding_window_mask",
        "the mask is aligned to the top left",
        _window(("[:, None] + (S - T)", "[:, None]")),
    ),
    Mutant(
        "window_without_itself",
        "sliding_window_mask",
        "sliding_window_mask",
        "leaves out the query itself",
        _window(("(j <= i) & (j > i - window)", "(j < i) & (j >= i - window)")),
    ),
    Mutant(
        "window_ignores_device",
        "sliding_window_mask",
        "sliding_window_mask",
        "device='meta'",
        _window(
            ("i = torch.arange(T, device=device)", "i = torch.arange(T)"),
            ("j = torch.arange(S, device=device)", "j = torch.arange(S)"),
        ),
    ),
    Mutant(
        "window_float_accepted",
        "sliding_window_mask",
        "sliding_window_mask",
        "sliding_window_mask(4, 2.5)",
        _window(("if not isinstance(window, int) or window < 1:", "if window < 1:")),
    ),
    Mutant(
        "window_more_queries_than_keys",
        "sliding_window_mask",
        "sliding_window_mask",
        "more queries than keys",
        _window(("    if not 0 <= T <= S:\n", "    if T < 0:\n")),
    ),
    # ------------------------------------------------------------------ part 3: causal linear attention
    Mutant(
        "linear_not_causal",
        "causal_linear_attention",
        "causal_linear_attention",
        "the result is not causal",
        """
def causal_linear_attention(q, k, v, eps=1e-6):
    check_attention_inputs(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"need as many keys as queries, got {q.shape[-2]} and {k.shape[-2]}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    kv = phi_k.transpose(-2, -1) @ v
    z = phi_k.sum(-2, keepdim=True)
    return (phi_q @ kv) / ((phi_q * z).sum(-1, keepdim=True) + eps)
""",
    ),
    Mutant(
        "linear_no_normaliser",
        "causal_linear_attention",
        "causal_linear_attention",
        "the normaliser is missing",
        _linear(("return num / (den + eps)", "return num")),
    ),
    Mutant(
        "linear_feature_not_positive",
        "causal_linear_attention",
        "causal_linear_attention",
        "the feature map is not positive",
        _linear(("elu_feature_map(q), elu_feature_map(k)", "F.elu(q), F.elu(k)")),
    ),
    Mutant(
        "linear_excludes_the_diagonal",
        "causal_linear_attention",
        "causal_linear_attention",
        "query i does not see key i",
        _linear(
            (".cumsum(-3)", '.cumsum(-3) - torch.einsum("...td,...te->...tde", phi_k, v)'),
            ("z = phi_k.cumsum(-2)", "z = phi_k.cumsum(-2) - phi_k"),
        ),
    ),
    Mutant(
        "linear_quadratic_matrix",
        "causal_linear_attention",
        "causal_linear_attention",
        "a (T, T) matrix",
        """
def causal_linear_attention(q, k, v, eps=1e-6):
    check_attention_inputs(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"need as many keys as queries, got {q.shape[-2]} and {k.shape[-2]}")
    A = (elu_feature_map(q) @ elu_feature_map(k).transpose(-2, -1)).tril()
    return (A @ v) / (A.sum(-1, keepdim=True) + eps)
""",
    ),
    Mutant(
        "linear_eps_ignored",
        "causal_linear_attention",
        "causal_linear_attention",
        "eps",
        _linear(("return num / (den + eps)", "return num / (den + 1e-6)")),
    ),
    Mutant(
        "linear_negative_eps_accepted",
        "causal_linear_attention",
        "causal_linear_attention",
        "eps=-0.001",
        _linear(("    if eps < 0:\n", "    if eps < -1:\n")),
    ),
    Mutant(
        "linear_three_dims_only",
        "causal_linear_attention",
        "causal_linear_attention",
        "for q",
        _linear(
            ('"...td,...te->...tde"', '"btd,bte->btde"'),
            ('"...td,...tde->...te"', '"btd,btde->bte"'),
            ('"...td,...td->...t"', '"btd,btd->bt"'),
        ),
    ),
    Mutant(
        "linear_in_place_feature_map",
        "causal_linear_attention",
        "causal_linear_attention",
        "in place",
        _linear(
            (
                "phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)",
                "phi_q, phi_k = q.copy_(elu_feature_map(q)), elu_feature_map(k)",
            )
        ),
    ),
    # ------------------------------------------------------------------ part 4: KV-cache size
    Mutant(
        "kv_no_factor_two",
        "kv_cache_size",
        "kv_cache_size",
        "the factor 2 is missing",
        _kv(("return 2 * n_layers", "return n_layers")),
    ),
    Mutant(
        "kv_query_heads",
        "kv_cache_size",
        "kv_cache_size",
        "the size counts the query heads",
        _kv(("tokens * n_kv_heads * d_head", "tokens * n_heads * d_head")),
    ),
    Mutant(
        "kv_dtype_ignored",
        "kv_cache_size",
        "kv_cache_size",
        "the size does not follow dtype",
        _kv(("bytes_per_value = torch.tensor([], dtype=dtype).element_size()", "bytes_per_value = 2")),
    ),
    Mutant(
        "kv_in_bits",
        "kv_cache_size",
        "kv_cache_size",
        "the size is in bits",
        _kv(
            (
                "bytes_per_value = torch.tensor([], dtype=dtype).element_size()",
                "bytes_per_value = torch.finfo(dtype).bits",
            )
        ),
    ),
    Mutant(
        "kv_window_ignored",
        "kv_cache_size",
        "kv_cache_size",
        "the window is ignored",
        _kv(("tokens = seq_len if window is None else min(seq_len, window)", "tokens = seq_len")),
    ),
    Mutant(
        "kv_window_replaces_seq_len",
        "kv_cache_size",
        "kv_cache_size",
        "min(seq_len, window)",
        _kv(
            (
                "tokens = seq_len if window is None else min(seq_len, window)",
                "tokens = seq_len if window is None else window",
            )
        ),
    ),
    Mutant(
        "kv_batch_ignored",
        "kv_cache_size",
        "kv_cache_size",
        "the batch is ignored",
        _kv(("return 2 * n_layers * batch * tokens", "return 2 * n_layers * tokens")),
    ),
    Mutant(
        "kv_float_bytes",
        "kv_cache_size",
        "kv_cache_size",
        "should return an int",
        _kv(
            (
                "bytes_per_value = torch.tensor([], dtype=dtype).element_size()",
                "bytes_per_value = torch.finfo(dtype).bits / 8",
            )
        ),
    ),
    # a float on the way: exact below 2**53 bytes, rounded above (the text promises the size in bytes, an int)
    Mutant(
        "kv_float_rounding",
        "kv_cache_size",
        "kv_cache_size",
        "the size went through a float",
        _kv(
            (
                "return 2 * n_layers * batch * tokens * n_kv_heads * d_head * bytes_per_value",
                "bits = torch.finfo(dtype).bits if dtype.is_floating_point else torch.iinfo(dtype).bits\n"
                "    return int(2 * n_layers * batch * tokens * n_kv_heads * d_head * bits / 8)",
            )
        ),
    ),
    Mutant(
        "kv_zero_window_accepted",
        "kv_cache_size",
        "kv_cache_size",
        "window=0",
        _kv(("    if window is not None and window < 1:\n", "    if window is not None and window < 0:\n")),
    ),
    # ------------------------------------------------------------------ part 5: predictions
    Mutant(
        "pairs_T_times_W",
        "predict_window_pairs",
        "predict_window_pairs",
        "the experiment gives 58",
        "predict_window_pairs = 64\n",
    ),
    Mutant(
        "pairs_full_causal",
        "predict_window_pairs",
        "predict_window_pairs",
        "you predicted 136",
        "predict_window_pairs = 136\n",
    ),
    Mutant(
        "pairs_as_text",
        "predict_window_pairs",
        "predict_window_pairs",
        "should be a finite number",
        'predict_window_pairs = "58"\n',
    ),
    Mutant(
        "kv_forgets_values",
        "predict_kv_cache_gib",
        "predict_kv_cache_gib",
        "the experiment gives 3.125",
        "predict_kv_cache_gib = 1.5625\n",
    ),
    Mutant(
        "kv_forgets_layers",
        "predict_kv_cache_gib",
        "predict_kv_cache_gib",
        "you predicted 0.078125",
        "predict_kv_cache_gib = 0.078125\n",
    ),
    Mutant(
        "kv_float32",
        "predict_kv_cache_gib",
        "predict_kv_cache_gib",
        "you predicted 6.25",
        "predict_kv_cache_gib = 6.25\n",
    ),
    Mutant(
        "kv_7b_shape",
        "predict_kv_cache_gib",
        "predict_kv_cache_gib",
        "the experiment gives 3.125",
        "predict_kv_cache_gib = 2\n",
    ),
    Mutant(
        "kv_not_a_number",
        "predict_kv_cache_gib",
        "predict_kv_cache_gib",
        "should be a finite number",
        'predict_kv_cache_gib = "3.125 GiB"\n',
    ),
    Mutant(
        "saved_max_and_sum",
        "predict_saved_per_row",
        "predict_saved_per_row",
        "you predicted (c) 512 KiB",
        'predict_saved_per_row = "c"\n',
    ),
    Mutant(
        "saved_nothing",
        "predict_saved_per_row",
        "predict_saved_per_row",
        "the experiment gives (b) 256 KiB",
        'predict_saved_per_row = "a"\n',
    ),
    Mutant(
        "saved_weights",
        "predict_saved_per_row",
        "predict_saved_per_row",
        "you predicted (d) 1 GiB",
        'predict_saved_per_row = "d"\n',
    ),
    Mutant(
        "saved_not_a_letter",
        "predict_saved_per_row",
        "predict_saved_per_row",
        "one of the letters",
        "predict_saved_per_row = 1\n",
    ),
    # ------------------------------------------------------------------ part 6: the experiment
    mutant(
        "mass_window_off_by_one",
        long_context.window_mass,
        "weights[:, T - window:]",
        ("weights[:, T - window :]", "weights[:, T - window - 1 :]"),
    ),
    mutant(
        "mass_softmax_over_trials",
        long_context.window_mass,
        "not over the trials",
        ("weights = torch.softmax(scores, dim=-1)", "weights = torch.softmax(scores, dim=0)"),
    ),
    mutant(
        "mass_no_normaliser",
        long_context.window_mass,
        "the keys are exchangeable",
        ("weights = torch.softmax(scores, dim=-1)", "weights = torch.exp(scores)"),
    ),
    mutant(
        "mass_sums_trials",
        long_context.window_mass,
        "average the sums",
        (".sum(dim=-1).mean().item()", ".sum().item()"),
    ),
    mutant(
        "mass_global_rng",
        long_context.window_mass,
        "not from torch's global random state",
        (
            "q = torch.randn(n, D, generator=generator, dtype=torch.float64)",
            "q = torch.randn(n, D, dtype=torch.float64)",
        ),
        (
            "k = torch.randn(n, T, D, generator=generator, dtype=torch.float64)",
            "k = torch.randn(n, T, D, dtype=torch.float64)",
        ),
    ),
    mutant(
        "mass_ignores_D",
        long_context.window_mass,
        "D must change what is drawn",
        ("q = torch.randn(n, D, generator", "q = torch.randn(n, 16, generator"),
        ("k = torch.randn(n, T, D, generator", "k = torch.randn(n, T, 16, generator"),
        ("/ math.sqrt(D)", "/ 4.0"),
    ),
    # another procedure, still a correct measurement inside the band: only the seeded result tells
    mutant(
        "mass_keys_drawn_first",
        long_context.window_mass,
        "draw all queries (n, D) first",
        (
            "    q = torch.randn(n, D, generator=generator, dtype=torch.float64)  # (n, D)\n"
            "    k = torch.randn(n, T, D, generator=generator, dtype=torch.float64)  # (n, T, D)\n",
            "    k = torch.randn(n, T, D, generator=generator, dtype=torch.float64)  # (n, T, D)\n"
            "    q = torch.randn(n, D, generator=generator, dtype=torch.float64)  # (n, D)\n",
        ),
    ),
    mutant(
        "mass_returns_tensor",
        long_context.window_mass,
        "should return a Python float",
        (".mean().item()", ".mean()"),
    ),
    mutant(
        "mass_no_validation",
        long_context.window_mass,
        "raise a ValueError",
        ("if isinstance(value, bool) or not isinstance(value, int) or value < 1:", "if False:"),
        ("if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= T:", "if False:"),
    ),
    # ------------------------------------------------------------------ part 8: the stretch
    mutant(
        "sink_not_causal",
        long_context.sink_window_mask,
        "keep j <= p for the sinks too",
        ("| ((j < n_sink) & (j <= p))", "| (j < n_sink)"),
    ),
    mutant(
        "sink_off_by_one",
        long_context.sink_window_mask,
        "the sinks are off by one",
        ("(j < n_sink) & (j <= p)", "(j <= n_sink) & (j <= p)"),
    ),
    mutant(
        "sink_missing",
        long_context.sink_window_mask,
        "the sink tokens are missing",
        ("return window_part | ((j < n_sink) & (j <= p))", "return window_part"),
    ),
    mutant(
        "sink_no_validation",
        long_context.sink_window_mask,
        "raise a ValueError",
        ("if isinstance(n_sink, bool) or not isinstance(n_sink, int) or n_sink < 0:", "if False:"),
    ),
]

_SKIP = "tiled_attention | if causal and j0 > i1 - 1 + S - T: | "
_SKIP_WHY = (
    "skips fewer key tiles, never one a query of the block may see: a tile in the future adds "
    "exp(-inf) = 0 to l and acc, and the text makes the skip optional"
)
_TILE_WHY = (
    "another default tile size changes only how the sums are split, not their value: the result is exact "
    "attention for any block sizes >= 1"
)

EQUIVALENT = {
    "tiled_attention | block_q: int = 64, | default | 2": _TILE_WHY,
    "tiled_attention | block_q: int = 64, | default | 4": _TILE_WHY,
    "tiled_attention | block_q: int = 64, | default | 5": _TILE_WHY,
    "tiled_attention | block_k: int = 64, | default | 2": _TILE_WHY,
    "tiled_attention | block_k: int = 64, | default | 4": _TILE_WHY,
    "tiled_attention | block_k: int = 64, | default | 5": _TILE_WHY,
    "tiled_attention | if mask is not None and mask.dtype != torch.bool: | delete | 1": "a mask that is not boolean still raises TypeError: check_attention_inputs refuses integer masks and floating "  # noqa: E501
    "masks of another dtype than q, and ~mask refuses a floating one (T, S >= 1, so a tile is always cut)",
    'tiled_attention | raise TypeError(f"tiled_attention takes a boolean mask (True = may attend), '
    'got {mask.dtype}") | delete | 1': "a mask that is not boolean still raises TypeError: check_attention_inputs refuses integer masks and floating "  # noqa: E501
    "masks of another dtype than q, and ~mask refuses a floating one (T, S >= 1, so a tile is always cut)",
    "tiled_attention | if block_q < 1 or block_k < 1: | number | 1": (
        "block_q = 0, which this lets through, makes range(0, T, 0) raise the same ValueError"
    ),
    "tiled_attention | if block_q < 1 or block_k < 1: | number | 2": "block_q = 0 makes range() raise ValueError and block_q = -1 leaves no query tile, so torch.cat([]) raises "  # noqa: E501
    "ValueError (T >= 1): the same error",
    "tiled_attention | if block_q < 1 or block_k < 1: | number | 4": (
        "block_k = 0, which this lets through, makes range(0, S, 0) raise the same ValueError (T, S >= 1)"
    ),
    _SKIP + "delete | 1": _SKIP_WHY,
    _SKIP + "binop | 1": _SKIP_WHY,
    _SKIP + "binop | 3": _SKIP_WHY,
    _SKIP + "number | 1": _SKIP_WHY,
    _SKIP + "number | 2": _SKIP_WHY,
    "tiled_attention | outputs.append(acc / torch.where(l > 0, l, torch.ones_like(l))) # fully masked rows: 0 / 1 | "
    "number | 1": "l is 0 for a query that sees no key and at least 1 otherwise (its largest score adds exp(0) = 1, and "  # noqa: E501
    "rescaling never lowers that), so l > 1 and l > 0 pick the same divisor",
    "window_mass | weights = torch.softmax(scores, dim=-1) # (n, T) | unary | 1": (
        "the scores are (n, T): dim=1 is the same axis as dim=-1"
    ),
    "window_mass | weights = torch.softmax(scores, dim=-1) # (n, T) | number | 2": (
        "the scores are (n, T): dim=1 is the same axis as dim=-1"
    ),
    "window_mass | return weights[:, T - window :].sum(dim=-1).mean().item() | unary | 1": (
        "the kept weights are (n, window): dim=1 is the same axis as dim=-1"
    ),
    "window_mass | return weights[:, T - window :].sum(dim=-1).mean().item() | number | 2": (
        "the kept weights are (n, window): dim=1 is the same axis as dim=-1"
    ),
    "sink_window_mask | S = window_part.shape[-1] | unary | 1": "the mask is (T, S): shape[1] is shape[-1]",
    "sink_window_mask | S = window_part.shape[-1] | number | 2": "the mask is (T, S): shape[1] is shape[-1]",
    "sink_window_mask | return window_part | ((j < n_sink) & (j <= p)) # (T, S) | compare | 3": (
        "key j = p is always in the window part (window >= 1), so the sinks may stop at j < p: the union is the same"
    ),
}
