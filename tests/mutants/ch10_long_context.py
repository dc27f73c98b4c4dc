"""Wrong implementations for Exercise 10, each a mistake students really make.

Each part has a correct implementation written by hand, in a student's style rather than the
reference's (``*_BY_HAND``, scored in ``tests/test_grading_ch10.py``), and every mutant is that
code with one edit, so it differs from a correct answer in exactly the way its name says. The
sources may use the names the notebook's imports cell defines (``torch``, ``F``, ``math``,
``elu_feature_map``, ``check_attention_inputs``, ...).
"""

from tests.mutants import Mutant, edit

#: the graded part (the Grader's name) -> the grade_id of its hidden test cell

TILED_BY_HAND = '''
def tiled_attention(q, k, v, causal=False, mask=None, block_q=64, block_k=64, scale=None):
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got {block_q} and {block_k}")
    T, S = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = []
    for i0 in range(0, T, block_q):
        qi = q[..., i0:i0 + block_q, :] * scale
        rows = torch.arange(i0, min(i0 + block_q, T))[:, None] + S - T
        m = l = acc = None
        for j0 in range(0, S, block_k):
            s = qi @ k[..., j0:j0 + block_k, :].transpose(-1, -2)
            cols = torch.arange(j0, min(j0 + block_k, S))[None, :]
            if causal:
                s = s.masked_fill(cols > rows, -math.inf)
            if mask is not None:
                tile = mask.expand(*s.shape[:-2], T, S)[..., i0:i0 + block_q, j0:j0 + block_k]
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
'''

WINDOW_BY_HAND = '''
def sliding_window_mask(T, window, S=None, device=None):
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    S = T if S is None else S
    i = torch.arange(T, device=device)[:, None] + (S - T)
    j = torch.arange(S, device=device)[None, :]
    return (j <= i) & (j > i - window)
'''

LINEAR_BY_HAND = '''
def causal_linear_attention(q, k, v, eps=1e-6):
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"need as many keys as queries, got {q.shape[-2]} and {k.shape[-2]}")
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    kv = torch.einsum("...td,...te->...tde", phi_k, v).cumsum(-3)
    z = phi_k.cumsum(-2)
    num = torch.einsum("...td,...tde->...te", phi_q, kv)
    den = torch.einsum("...td,...td->...t", phi_q, z).unsqueeze(-1)
    return num / (den + eps)
'''

KV_BY_HAND = '''
def kv_cache_size(n_layers, n_heads, d_head, seq_len, n_kv_heads=None, batch=1, dtype=torch.float16, window=None):
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if min(n_layers, n_heads, d_head, n_kv_heads, batch) < 1 or seq_len < 0 or n_heads % n_kv_heads:
        raise ValueError(f"bad cache shape: {n_layers=} {n_heads=} {n_kv_heads=} {d_head=} {seq_len=} {batch=}")
    tokens = seq_len if window is None else min(seq_len, window)
    bytes_per_value = torch.tensor([], dtype=dtype).element_size()
    return 2 * n_layers * batch * tokens * n_kv_heads * d_head * bytes_per_value
'''

BY_HAND = {"tiled_attention": TILED_BY_HAND, "sliding_window_mask": WINDOW_BY_HAND,
           "causal_linear_attention": LINEAR_BY_HAND, "kv_cache_size": KV_BY_HAND}


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
    Mutant("tiled_no_rescale_acc", "tiled_attention", "tiled_attention", "the accumulator is not rescaled",
           _tiled(("acc = alpha * acc + p", "acc = acc + p"))),
    Mutant("tiled_max_not_updated", "tiled_attention", "tiled_attention", "the running maximum is not updated",
           _tiled(("m_new = tile_max if m is None else torch.maximum(m, tile_max)", "m_new = tile_max if m is None else m"))),
    Mutant("tiled_divide_early", "tiled_attention", "tiled_attention", "each tile is normalised by its own sum",
           _tiled(("p = torch.exp(s - safe)\n", "p = torch.exp(s - safe)\n            p = p / p.sum(-1, keepdim=True)\n"))),
    Mutant("tiled_causal_top_left", "tiled_attention", "tiled_attention", "the causal mask is aligned to the top left",
           _tiled(("[:, None] + S - T", "[:, None]"))),
    Mutant("tiled_masked_rows_nan", "tiled_attention", "tiled_attention", "must get a zero output, not NaN",
           _tiled(("safe = torch.nan_to_num(m_new, neginf=0.0)", "safe = m_new"))),
    Mutant("tiled_no_scale", "tiled_attention", "tiled_attention", "the scores are not scaled",
           _tiled(("qi = q[..., i0:i0 + block_q, :] * scale", "qi = q[..., i0:i0 + block_q, :]"))),
    # ------------------------------------------------------------------ part 2: sliding-window mask
    Mutant("window_off_by_one", "sliding_window_mask", "sliding_window_mask", "the window is off by one",
           _window(("(j > i - window)", "(j >= i - window)"))),
    Mutant("window_not_causal", "sliding_window_mask", "sliding_window_mask", "the window is not causal",
           _window(("(j <= i) & (j > i - window)", "(i - j).abs() < window"))),
    Mutant("window_top_left", "sliding_window_mask", "sliding_window_mask", "the mask is aligned to the top left",
           _window(("[:, None] + (S - T)", "[:, None]"))),
    # ------------------------------------------------------------------ part 3: causal linear attention
    Mutant("linear_not_causal", "causal_linear_attention", "causal_linear_attention", "the result is not causal", '''
def causal_linear_attention(q, k, v, eps=1e-6):
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"need as many keys as queries, got {q.shape[-2]} and {k.shape[-2]}")
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    kv = phi_k.transpose(-2, -1) @ v
    z = phi_k.sum(-2, keepdim=True)
    return (phi_q @ kv) / ((phi_q * z).sum(-1, keepdim=True) + eps)
'''),
    Mutant("linear_no_normaliser", "causal_linear_attention", "causal_linear_attention", "the normaliser is missing",
           _linear(("return num / (den + eps)", "return num"))),
    Mutant("linear_feature_not_positive", "causal_linear_attention", "causal_linear_attention", "the feature map is not positive",
           _linear(("elu_feature_map(q), elu_feature_map(k)", "F.elu(q), F.elu(k)"))),
    Mutant("linear_excludes_the_diagonal", "causal_linear_attention", "causal_linear_attention", "query i does not see key i",
           _linear(('.cumsum(-3)', '.cumsum(-3) - torch.einsum("...td,...te->...tde", phi_k, v)'),
                   ("z = phi_k.cumsum(-2)", "z = phi_k.cumsum(-2) - phi_k"))),
    Mutant("linear_quadratic_matrix", "causal_linear_attention", "causal_linear_attention", "a (T, T) matrix", '''
def causal_linear_attention(q, k, v, eps=1e-6):
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"need as many keys as queries, got {q.shape[-2]} and {k.shape[-2]}")
    A = (elu_feature_map(q) @ elu_feature_map(k).transpose(-2, -1)).tril()
    return (A @ v) / (A.sum(-1, keepdim=True) + eps)
'''),
    # ------------------------------------------------------------------ part 4: KV-cache size
    Mutant("kv_no_factor_two", "kv_cache_size", "kv_cache_size", "the factor 2 is missing",
           _kv(("return 2 * n_layers", "return n_layers"))),
    Mutant("kv_query_heads", "kv_cache_size", "kv_cache_size", "the size counts the query heads",
           _kv(("tokens * n_kv_heads * d_head", "tokens * n_heads * d_head"))),
    Mutant("kv_dtype_ignored", "kv_cache_size", "kv_cache_size", "the size does not follow dtype",
           _kv(("bytes_per_value = torch.tensor([], dtype=dtype).element_size()", "bytes_per_value = 2"))),
    Mutant("kv_in_bits", "kv_cache_size", "kv_cache_size", "the size is in bits",
           _kv(("bytes_per_value = torch.tensor([], dtype=dtype).element_size()", "bytes_per_value = torch.finfo(dtype).bits"))),
    Mutant("kv_window_ignored", "kv_cache_size", "kv_cache_size", "the window is ignored",
           _kv(("tokens = seq_len if window is None else min(seq_len, window)", "tokens = seq_len"))),
]
