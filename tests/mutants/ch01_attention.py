"""Wrong implementations for Exercise 1, each a mistake students really make."""

from coursekit import attention
from tests.mutants import Mutant, mutant

MUTANTS = [
    Mutant(
        "softmax_no_max_shift",
        "softmax",
        "softmax",
        "subtract the maximum",
        """
def softmax(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)
""",
    ),
    Mutant(
        "softmax_wrong_axis",
        "softmax",
        "softmax",
        "softmax over the wrong axis",
        """
def softmax(x, dim=-1):
    m = x.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(x - m)
    s = e.sum(dim=-1, keepdim=True)
    return e / torch.where(s > 0, s, torch.ones_like(s))
""",
    ),
    Mutant(
        "softmax_in_place",
        "softmax",
        "softmax",
        "modified its input in place",
        """
def softmax(x, dim=-1):
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    x -= m
    e = x.exp()
    s = e.sum(dim=dim, keepdim=True)
    return e / torch.where(s > 0, s, torch.ones_like(s))
""",
    ),
    Mutant(
        "softmax_nan_on_masked_row",
        "softmax",
        "softmax",
        "gave NaN",
        """
def softmax(x, dim=-1):
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)
""",
    ),
    Mutant(
        "causal_off_by_one",
        "causal_mask",
        "causal_mask",
        "may not attend to itself",
        """
def causal_mask(T, S=None, device=None):
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T - 1)
""",
    ),
    Mutant(
        "causal_transposed",
        "causal_mask",
        "causal_mask",
        "transposed",
        """
def causal_mask(T, S=None, device=None):
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool, device=device).triu()
""",
    ),
    Mutant(
        "causal_top_left",
        "causal_mask",
        "causal_mask",
        "misaligned",
        """
def causal_mask(T, S=None, device=None):
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool, device=device).tril()
""",
    ),
    Mutant(
        "softmax_changes_dtype",
        "softmax",
        "softmax",
        "should be a tensor float64",
        """
def softmax(x, dim=-1):
    x = x.float()
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(x - m)
    s = e.sum(dim=dim, keepdim=True)
    return e / torch.where(s > 0, s, torch.ones_like(s))
""",
    ),
    Mutant(
        "softmax_clamped_exponent",
        "softmax",
        "softmax",
        "subtract the maximum of each slice first",
        """
def softmax(x, dim=-1):
    e = torch.exp(x.clamp(min=-80.0, max=80.0))
    s = e.sum(dim=dim, keepdim=True)
    return e / torch.where(s > 0, s, torch.ones_like(s))
""",
    ),
    Mutant(
        "causal_ignores_device",
        "causal_mask",
        "causal_mask",
        "should be created on the meta device",
        """
def causal_mask(T, S=None, device=None):
    S = T if S is None else S
    if T < 0 or S < T:
        raise ValueError(f"causal_mask needs 0 <= T <= S, got T={T} and S={S}")
    return torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
""",
    ),
    Mutant(
        "causal_no_value_error",
        "causal_mask",
        "causal_mask",
        "raise a ValueError",
        """
def causal_mask(T, S=None, device=None):
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)
""",
    ),
    Mutant(
        "causal_empty_as_a_list",
        "causal_mask",
        "causal_mask",
        "causal_mask(0",
        """
def causal_mask(T, S=None, device=None):
    S = T if S is None else S
    if T < 0 or S < T:
        raise ValueError(f"causal_mask needs 0 <= T <= S, got T={T} and S={S}")
    return torch.tensor([[j <= i + S - T for j in range(S)] for i in range(T)], device=device)
""",
    ),
    Mutant(
        "attention_no_scaling",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "divide q k^T by sqrt(D)",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = softmax(scores, dim=-1)
    return weights @ v, weights
""",
    ),
    Mutant(
        "attention_scale_by_d",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "divided by D",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scale = 1.0 / q.shape[-1] if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = softmax(scores, dim=-1)
    return weights @ v, weights
""",
    ),
    Mutant(
        "attention_softmax_over_queries",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "softmax over the keys",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = softmax(scores, dim=-2)
    return weights @ v, weights
""",
    ),
    Mutant(
        "attention_mask_after_softmax",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "before the softmax",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    weights = softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
    if mask is not None:
        weights = weights * mask if mask.dtype == torch.bool else softmax(torch.log(weights) + mask, dim=-1)
    return weights @ v, weights
""",
    ),
    Mutant(
        "attention_mask_inverted",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "the mask is inverted",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = softmax(scores, dim=-1)
    return weights @ v, weights
""",
    ),
    Mutant(
        "attention_nan_on_masked_row",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "gave NaN",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights
""",
    ),
    Mutant(
        "attention_in_place_scale",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "was modified in place",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    q *= 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = softmax(scores, dim=-1)
    return weights @ v, weights
""",
    ),
    Mutant(
        "attention_detached",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "through autograd",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    q, k, v = q.detach(), k.detach(), v.detach()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = softmax(scores, dim=-1)
    return weights @ v, weights
""",
    ),
    Mutant(
        "attention_zero_scale_is_default",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "test `scale is None`",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scale = scale or 1.0 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = softmax(scores, dim=-1)
    return weights @ v, weights
""",
    ),
    Mutant(
        "attention_float_mask_before_scaling",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "added before scaling",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = softmax(scores * scale, dim=-1)
    return weights @ v, weights
""",
    ),
    Mutant(
        "attention_finite_mask_value",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "such as -1e9 is not -inf",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9) if mask.dtype == torch.bool else scores + mask
    weights = softmax(scores, dim=-1)
    return weights @ v, weights
""",
    ),
    Mutant(
        "attention_unstable_exp",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "use your stable softmax",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    e = torch.exp(scores)
    s = e.sum(-1, keepdim=True)
    weights = e / torch.where(s > 0, s, torch.ones_like(s))
    return weights @ v, weights
""",
    ),
    Mutant(
        "attention_batch_axis_assumed",
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "Dimension out of range",
        """
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    check_attention_inputs(q, k, v, mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(1, 2) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = softmax(scores, dim=-1)
    return weights @ v, weights
""",
    ),
    Mutant(
        "self_attention_unprojected_values",
        "SelfAttention",
        "SelfAttention",
        "the values must be v_proj(x)",
        """
class SelfAttention(nn.Module):
    def __init__(self, d_model, d_head=None, bias=True):
        super().__init__()
        d_head = d_model if d_head is None else d_head
        self.q_proj = nn.Linear(d_model, d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, d_head, bias=bias)

    def forward(self, x, mask=None):
        q, k = self.q_proj(x), self.k_proj(x)
        v = x[..., : q.shape[-1]]
        return scaled_dot_product_attention(q, k, v, mask=mask)
""",
    ),
    Mutant(
        "self_attention_ignores_mask",
        "SelfAttention",
        "SelfAttention",
        "is the mask passed on",
        """
class SelfAttention(nn.Module):
    def __init__(self, d_model, d_head=None, bias=True):
        super().__init__()
        d_head = d_model if d_head is None else d_head
        self.q_proj = nn.Linear(d_model, d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, d_head, bias=bias)

    def forward(self, x, mask=None):
        return scaled_dot_product_attention(self.q_proj(x), self.k_proj(x), self.v_proj(x))
""",
    ),
    Mutant(
        "self_attention_shared_qk",
        "SelfAttention",
        "SelfAttention",
        "queries come from q_proj(x)",
        """
class SelfAttention(nn.Module):
    def __init__(self, d_model, d_head=None, bias=True):
        super().__init__()
        d_head = d_model if d_head is None else d_head
        self.q_proj = nn.Linear(d_model, d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, d_head, bias=bias)

    def forward(self, x, mask=None):
        q = self.q_proj(x)
        return scaled_dot_product_attention(q, q, self.v_proj(x), mask=mask)
""",
    ),
    Mutant(
        "self_attention_always_biased",
        "SelfAttention",
        "SelfAttention",
        "pass bias=bias",
        """
class SelfAttention(nn.Module):
    def __init__(self, d_model, d_head=None, bias=True):
        super().__init__()
        d_head = d_model if d_head is None else d_head
        self.q_proj = nn.Linear(d_model, d_head)
        self.k_proj = nn.Linear(d_model, d_head)
        self.v_proj = nn.Linear(d_model, d_head)

    def forward(self, x, mask=None):
        if x.dim() != 3 or x.shape[-1] != self.q_proj.in_features:
            raise ValueError(f"expected x of shape (B, T, {self.q_proj.in_features}), got {tuple(x.shape)}")
        return scaled_dot_product_attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask=mask)
""",
    ),
    Mutant(
        "self_attention_no_shape_check",
        "SelfAttention",
        "SelfAttention",
        "raise a ValueError",
        """
class SelfAttention(nn.Module):
    def __init__(self, d_model, d_head=None, bias=True):
        super().__init__()
        d_head = d_model if d_head is None else d_head
        self.q_proj = nn.Linear(d_model, d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, d_head, bias=bias)

    def forward(self, x, mask=None):
        return scaled_dot_product_attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask=mask)
""",
    ),
    Mutant(
        "leak_counts_the_diagonal",
        "predict_leaked_pairs",
        "predict_leaked_pairs",
        "the experiment gives 7",
        "predict_leaked_pairs = 8\n",
    ),
    Mutant(
        "leak_counts_all_future",
        "predict_leaked_pairs",
        "predict_leaked_pairs",
        "you predicted 28",
        "predict_leaked_pairs = 28\n",
    ),
    Mutant(
        "leak_as_text",
        "predict_leaked_pairs",
        "predict_leaked_pairs",
        "should be a finite number",
        'predict_leaked_pairs = "7"\n',
    ),
    Mutant(
        "variance_ignores_entry_scales",
        "predict_score_variance",
        "predict_score_variance",
        "the experiment gives (c) 576",
        'predict_score_variance = "a"\n',
    ),
    Mutant(
        "variance_multiplies_stds",
        "predict_score_variance",
        "predict_score_variance",
        "you predicted (b) 96",
        'predict_score_variance = "b"\n',
    ),
    Mutant(
        "variance_adds_stds",
        "predict_score_variance",
        "predict_score_variance",
        "you predicted (d) 9216",
        'predict_score_variance = "d"\n',
    ),
    Mutant(
        "variance_not_a_letter",
        "predict_score_variance",
        "predict_score_variance",
        "one of the letters",
        "predict_score_variance = 576\n",
    ),
    Mutant(
        "steps_thinks_generation_parallel",
        "predict_sequential_steps",
        "predict_sequential_steps",
        "the experiment gives (d) it doubles for both",
        'predict_sequential_steps = "a"\n',
    ),
    Mutant(
        "steps_thinks_attention_quadratic",
        "predict_sequential_steps",
        "predict_sequential_steps",
        "you predicted (c) it doubles for the GRU and quadruples",
        'predict_sequential_steps = "c"\n',
    ),
    Mutant(
        "steps_not_a_letter",
        "predict_sequential_steps",
        "predict_sequential_steps",
        "one of the letters",
        "predict_sequential_steps = 2\n",
    ),
    mutant(
        "variance_divides_by_D",
        attention.score_variance,
        "dividing by D gives 1/D",
        ("scores = scores / math.sqrt(D)", "scores = scores / D"),
    ),
    mutant(
        "variance_averages_products",
        attention.score_variance,
        "not average them",
        ("scores = (q * k).sum(dim=-1)", "scores = (q * k).mean(dim=-1)"),
    ),
    mutant(
        "variance_global_rng",
        attention.score_variance,
        "not from torch's global random state",
        (
            "q = torch.randn(n, D, generator=generator, dtype=torch.float64)",
            "q = torch.randn(n, D, dtype=torch.float64)",
        ),
        (
            "k = torch.randn(n, D, generator=generator, dtype=torch.float64)",
            "k = torch.randn(n, D, dtype=torch.float64)",
        ),
    ),
    mutant(
        "variance_returns_tensor",
        attention.score_variance,
        "should return a Python float",
        ("return scores.var().item()", "return scores.var()"),
    ),
    mutant(
        "variance_scaled_by_default",
        attention.score_variance,
        "scaled defaults to False",
        ("scaled: bool = False", "scaled: bool = True"),
    ),
    mutant(
        "variance_no_validation",
        attention.score_variance,
        "raise a ValueError",
        ("if not isinstance(D, int) or D < 1 or not isinstance(n, int) or n < 2:", "if False:"),
    ),
    mutant(
        "variance_biased_estimate",
        attention.score_variance,
        "the stated procedure gives",
        ("return scores.var().item()", "return scores.var(correction=0).item()"),
    ),
    mutant(
        "online_no_rescale",
        attention.online_softmax,
        "multiply the sum so far by exp(m - m')",
        ("l = l * torch.exp(m - shift) + ", "l = l + "),
    ),
    mutant(
        "online_skips_last_block",
        attention.online_softmax,
        "equals softmax",
        (
            "for start in range(0, x.shape[-1], block):",
            "for start in range(0, x.shape[-1] - block + 1, block):",
        ),
    ),
    mutant(
        "online_nan_on_masked_rows",
        attention.online_softmax,
        "no NaN",
        (
            "shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))  # all -inf so far",
            "shift = m_new",
        ),
    ),
    mutant(
        "online_no_block_check",
        attention.online_softmax,
        "raise a ValueError",
        ("if not isinstance(block, int) or isinstance(block, bool) or block < 1:", "if block is None:"),
    ),
]

#: Mutants of the instructor's answers (``scripts/mutation.py``) that no input the exercise allows tells
#: apart from the answer, each with the reason.
EQUIVALENT = {
    "softmax | if not torch.is_floating_point(x): | delete | 1": (
        "the exercise takes float32 and float64 x only; the TypeError for other dtypes is not part of it"
    ),
    ('softmax | raise TypeError(f"softmax expects a floating tensor, got dtype {x.dtype}") | delete | 1'): (
        "the exercise takes float32 and float64 x only; the TypeError for other dtypes is not part of it"
    ),
    (
        "softmax | return e / torch.where(s > 0, s, torch.ones_like(s)) # an all -inf slice is 0 "
        "/ 1 | number | 1"
    ): "after subtracting the maximum a slice sums to at least 1 (its maximum gives exp(0)) unless it is all "
    "-inf (sum 0), so s > 1 and s > 0 pick the same divisor",
    "scaled_dot_product_attention | weights = softmax(scores, dim=-1) # (..., T, S), fully masked rows are 0 | "
    "keyword | 1": "softmax's documented default is dim=-1, so softmax(scores) is softmax(scores, dim=-1)",
    "score_variance | scores = (q * k).sum(dim=-1) # (n,) | unary | 1": (
        "the products are (n, D): dim=1 is the same axis as dim=-1"
    ),
    "score_variance | scores = (q * k).sum(dim=-1) # (n,) | number | 2": (
        "the products are (n, D): dim=1 is the same axis as dim=-1"
    ),
    "online_softmax | if not isinstance(block, int) or isinstance(block, bool) or block < 1: | number | 1": (
        "block = 0 then reaches range(0, S, 0), which raises the ValueError itself"
    ),
    "online_softmax | m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype) # (...) running maximum | keyword | 1": (
        "a float32 -inf start is promoted to x's dtype by the first torch.maximum with a block of x"
    ),
    "online_softmax | m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype) # (...) running maximum | slice | 1": (
        "a 0-dim start broadcasts against the first block's row maxima, so m has the rows' shape from then on"
    ),
    "online_softmax | m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype) # (...) running maximum | number | 1": (
        "a 0-dim start broadcasts against the first block's row maxima, so m has the rows' shape from then on"
    ),
    "online_softmax | l = torch.zeros(x.shape[:-1], dtype=x.dtype) # (...) running sum of exp(x - m) | keyword | 1": (
        "a float32 zero start is promoted to x's dtype when the first block's sum is added"
    ),
    "online_softmax | l = torch.zeros(x.shape[:-1], dtype=x.dtype) # (...) running sum of exp(x - m) | slice | 1": (
        "a 0-dim start broadcasts against the first block's sums, so l has the rows' shape from then on"
    ),
    "online_softmax | l = torch.zeros(x.shape[:-1], dtype=x.dtype) # (...) running sum of exp(x - m) | number | 1": (
        "a 0-dim start broadcasts against the first block's sums, so l has the rows' shape from then on"
    ),
    "online_softmax | shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m)) | delete | 1": (
        "the loop's last shift was computed the same way from m_new, which is the final m"
    ),
    "online_softmax | l = torch.where(l > 0, l, torch.ones_like(l)) # an all -inf row is 0 / 1 | number | 1": (
        "a row's sum is at least 1 (its maximum gives exp(0)) unless it is all -inf (sum 0): l > 1 and l > 0 "
        "pick the same divisor"
    ),
}
