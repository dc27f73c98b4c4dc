"""Wrong implementations for the appendix exercise (transformer arithmetic), each a mistake students really make."""

from coursekit import arithmetic as ref
from tests.mutants import Mutant, mutant, mutate

MUTANTS = [
    # ----------------------------------------------------------------- part 1: decoder_params
    Mutant(
        "params_rule_of_thumb",
        "decoder_params",
        "decoder_params",
        "that is the rule of thumb V C + 12 L C^2",
        """
def decoder_params(vocab_size, n_positions, d_model, n_layers, n_heads, n_kv_heads=None, d_ff=None, tied=True):
    return vocab_size * d_model + 12 * n_layers * d_model * d_model
""",
    ),
    Mutant(
        "params_no_biases_or_norms",
        "decoder_params",
        "decoder_params",
        "the biases and the layer norms are missing",
        """
def decoder_params(vocab_size, n_positions, d_model, n_layers, n_heads, n_kv_heads=None, d_ff=None, tied=True):
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    d_ff = 4 * d_model if d_ff is None else d_ff
    kv = n_kv_heads * (d_model // n_heads)
    layer = d_model * (d_model + 2 * kv) + d_model * d_model + 2 * d_model * d_ff
    head = 0 if tied else vocab_size * d_model
    return (vocab_size + n_positions) * d_model + n_layers * layer + head
""",
    ),
    Mutant(
        "params_norm_one_vector",
        "decoder_params",
        "decoder_params",
        "a scale and a shift: 2 d_model, not d_model",
        """
def decoder_params(vocab_size, n_positions, d_model, n_layers, n_heads, n_kv_heads=None, d_ff=None, tied=True):
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    d_ff = 4 * d_model if d_ff is None else d_ff
    kv = n_kv_heads * (d_model // n_heads)
    attention = (d_model + 1) * (d_model + 2 * kv) + (d_model + 1) * d_model
    feedforward = (d_model + 1) * d_ff + (d_ff + 1) * d_model
    layer = attention + feedforward + 2 * d_model  # two norms of d_model each
    head = 0 if tied else vocab_size * d_model
    return (vocab_size + n_positions) * d_model + n_layers * layer + d_model + head
""",
    ),
    Mutant(
        "params_ignore_gqa",
        "decoder_params",
        "decoder_params",
        "with grouped-query attention only the query and output",
        """
def decoder_params(vocab_size, n_positions, d_model, n_layers, n_heads, n_kv_heads=None, d_ff=None, tied=True):
    d_ff = 4 * d_model if d_ff is None else d_ff
    attention = 4 * d_model * d_model + 4 * d_model
    feedforward = 2 * d_model * d_ff + d_ff + d_model
    layer = attention + feedforward + 4 * d_model
    head = 0 if tied else vocab_size * d_model
    return (vocab_size + n_positions) * d_model + n_layers * layer + 2 * d_model + head
""",
    ),
    Mutant(
        "params_no_positions",
        "decoder_params",
        "decoder_params",
        "position embeddings (n_positions x d_model) are missing",
        """
def decoder_params(vocab_size, n_positions, d_model, n_layers, n_heads, n_kv_heads=None, d_ff=None, tied=True):
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    d_ff = 4 * d_model if d_ff is None else d_ff
    kv = n_kv_heads * (d_model // n_heads)
    attention = (d_model + 1) * (d_model + 2 * kv) + (d_model + 1) * d_model
    feedforward = (d_model + 1) * d_ff + (d_ff + 1) * d_model
    head = 0 if tied else vocab_size * d_model
    return vocab_size * d_model + n_layers * (attention + feedforward + 4 * d_model) + 2 * d_model + head
""",
    ),
    Mutant(
        "params_head_always_counted",
        "decoder_params",
        "decoder_params",
        "with tied=True the output layer reuses",
        """
def decoder_params(vocab_size, n_positions, d_model, n_layers, n_heads, n_kv_heads=None, d_ff=None, tied=True):
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    d_ff = 4 * d_model if d_ff is None else d_ff
    kv = n_kv_heads * (d_model // n_heads)
    attention = (d_model + 1) * (d_model + 2 * kv) + (d_model + 1) * d_model
    feedforward = (d_model + 1) * d_ff + (d_ff + 1) * d_model
    layer = attention + feedforward + 4 * d_model
    return (vocab_size + n_positions) * d_model + n_layers * layer + 2 * d_model + vocab_size * d_model
""",
    ),
    Mutant(
        "params_ignore_d_ff",
        "decoder_params",
        "decoder_params",
        "use d_ff for the feed-forward width",
        """
def decoder_params(vocab_size, n_positions, d_model, n_layers, n_heads, n_kv_heads=None, d_ff=None, tied=True):
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    kv = n_kv_heads * (d_model // n_heads)
    attention = (d_model + 1) * (d_model + 2 * kv) + (d_model + 1) * d_model
    feedforward = 8 * d_model * d_model + 5 * d_model
    head = 0 if tied else vocab_size * d_model
    layers = n_layers * (attention + feedforward + 4 * d_model)
    return (vocab_size + n_positions) * d_model + layers + 2 * d_model + head
""",
    ),
    # ----------------------------------------------------------------- part 2: training memory
    Mutant(
        "memory_gb",
        "training_memory_gib",
        "training_memory_gib",
        "you divided by 10**9, which is a GB",
        """
def training_memory_gib(n_params, precision="fp32", optimizer="adam"):
    return n_params * sum(memory_per_param(precision, optimizer).values()) / 1e9
""",
    ),
    Mutant(
        "memory_no_master",
        "memory_per_param",
        "training_memory_gib",
        "the float32 master weights are missing",
        """
def memory_per_param(precision="fp32", optimizer="adam", fp32_grads=False):
    value_bytes = {"fp32": 4, "fp16": 2, "bf16": 2}
    state_bytes = {"sgd": 0, "momentum": 4, "adam": 8, "adam8bit": 2}
    if precision not in value_bytes or optimizer not in state_bytes:
        raise ValueError(f"unknown precision {precision!r} or optimizer {optimizer!r}")
    return {"weights": value_bytes[precision], "gradients": 4 if fp32_grads else value_bytes[precision],
            "master weights": 0, "optimizer states": state_bytes[optimizer]}
""",
    ),
    Mutant(
        "memory_fp32_grads",
        "training_memory_gib",
        "training_memory_gib",
        "the 18-byte convention",
        """
def training_memory_gib(n_params, precision="fp32", optimizer="adam"):
    return n_params * sum(memory_per_param(precision, optimizer, fp32_grads=True).values()) / 2**30
""",
    ),
    Mutant(
        "memory_one_adam_moment",
        "memory_per_param",
        "training_memory_gib",
        "Adam keeps two moments per parameter",
        """
def memory_per_param(precision="fp32", optimizer="adam", fp32_grads=False):
    value_bytes = {"fp32": 4, "fp16": 2, "bf16": 2}
    state_bytes = {"sgd": 0, "momentum": 4, "adam": 4, "adam8bit": 2}
    if precision not in value_bytes or optimizer not in state_bytes:
        raise ValueError(f"unknown precision {precision!r} or optimizer {optimizer!r}")
    mixed = precision != "fp32"
    return {"weights": value_bytes[precision], "gradients": 4 if fp32_grads else value_bytes[precision],
            "master weights": 4 if mixed else 0, "optimizer states": state_bytes[optimizer]}
""",
    ),
    Mutant(
        "memory_8bit_as_8_bytes",
        "memory_per_param",
        "training_memory_gib",
        "in 8 bits = 1 byte",
        """
def memory_per_param(precision="fp32", optimizer="adam", fp32_grads=False):
    value_bytes = {"fp32": 4, "fp16": 2, "bf16": 2}
    state_bytes = {"sgd": 0, "momentum": 4, "adam": 8, "adam8bit": 2 * 8}
    if precision not in value_bytes or optimizer not in state_bytes:
        raise ValueError(f"unknown precision {precision!r} or optimizer {optimizer!r}")
    mixed = precision != "fp32"
    return {"weights": value_bytes[precision], "gradients": 4 if fp32_grads else value_bytes[precision],
            "master weights": 4 if mixed else 0, "optimizer states": state_bytes[optimizer]}
""",
    ),
    Mutant(
        "memory_no_gradients",
        "memory_per_param",
        "training_memory_gib",
        "the gradients are missing",
        """
def memory_per_param(precision="fp32", optimizer="adam", fp32_grads=False):
    value_bytes = {"fp32": 4, "fp16": 2, "bf16": 2}
    state_bytes = {"sgd": 0, "momentum": 4, "adam": 8, "adam8bit": 2}
    if precision not in value_bytes or optimizer not in state_bytes:
        raise ValueError(f"unknown precision {precision!r} or optimizer {optimizer!r}")
    mixed = precision != "fp32"
    return {"weights": value_bytes[precision], "gradients": 0,
            "master weights": 4 if mixed else 0, "optimizer states": state_bytes[optimizer]}
""",
    ),
    Mutant(
        "memory_unknown_names_default",
        "memory_per_param",
        "training_memory_gib",
        "raise a ValueError instead (list the accepted",
        """
def memory_per_param(precision="fp32", optimizer="adam", fp32_grads=False):
    value = {"fp32": 4, "fp16": 2, "bf16": 2}.get(precision, 4)
    mixed = value < 4
    return {"weights": value, "gradients": 4 if fp32_grads else value, "master weights": 4 if mixed else 0,
            "optimizer states": {"sgd": 0, "momentum": 4, "adam8bit": 2}.get(optimizer, 8)}
""",
    ),
    # ----------------------------------------------------------------- part 3: KV cache
    Mutant(
        "kv_no_factor_2",
        "kv_cache_gib",
        "kv_cache_gib",
        "every layer caches a key AND a value",
        """
def kv_cache_gib(n_layers, n_heads, n_kv_heads, d_model, seq_len, batch=1, bits=16):
    return n_layers * n_kv_heads * (d_model // n_heads) * seq_len * batch * bits / 8 / 2**30
""",
    ),
    Mutant(
        "kv_query_heads",
        "kv_cache_gib",
        "kv_cache_gib",
        "only the n_kv_heads key/value heads are cached",
        """
def kv_cache_gib(n_layers, n_heads, n_kv_heads, d_model, seq_len, batch=1, bits=16):
    return 2 * n_layers * d_model * seq_len * batch * bits / 8 / 2**30
""",
    ),
    Mutant(
        "kv_bits_as_bytes",
        "kv_cache_gib",
        "kv_cache_gib",
        "divide by 8 to get bytes",
        """
def kv_cache_gib(n_layers, n_heads, n_kv_heads, d_model, seq_len, batch=1, bits=16):
    return 2 * n_layers * n_kv_heads * (d_model // n_heads) * seq_len * batch * bits / 2**30
""",
    ),
    Mutant(
        "kv_gb",
        "kv_cache_gib",
        "kv_cache_gib",
        "you divided by 10**9, which is a GB",
        """
def kv_cache_gib(n_layers, n_heads, n_kv_heads, d_model, seq_len, batch=1, bits=16):
    return 2 * n_layers * n_kv_heads * (d_model // n_heads) * seq_len * batch * bits / 8 / 1e9
""",
    ),
    Mutant(
        "kv_head_width_d_model",
        "kv_cache_gib",
        "kv_cache_gib",
        "d_head = d_model // n_heads, not d_model",
        """
def kv_cache_gib(n_layers, n_heads, n_kv_heads, d_model, seq_len, batch=1, bits=16):
    return 2 * n_layers * n_kv_heads * d_model * seq_len * batch * bits / 8 / 2**30
""",
    ),
    Mutant(
        "kv_fixed_two_bytes",
        "kv_cache_gib",
        "kv_cache_gib",
        "use the bits argument",
        """
def kv_cache_gib(n_layers, n_heads, n_kv_heads, d_model, seq_len, batch=1, bits=16):
    return 2 * n_layers * n_kv_heads * (d_model // n_heads) * seq_len * batch * 2 / 2**30
""",
    ),
    # ----------------------------------------------------------------- part 4: training days
    Mutant(
        "days_2nd",
        "training_days",
        "training_days",
        "2 N D is the forward pass alone",
        """
def training_days(n_params, n_tokens, n_gpus, gpu_tflops, mfu):
    return 2 * n_params * n_tokens / (n_gpus * gpu_tflops * 1e12 * mfu) / 86400
""",
    ),
    Mutant(
        "days_mfu_ignored",
        "training_days",
        "training_days",
        "divide by the MFU as well",
        """
def training_days(n_params, n_tokens, n_gpus, gpu_tflops, mfu):
    return 6 * n_params * n_tokens / (n_gpus * gpu_tflops * 1e12) / 86400
""",
    ),
    Mutant(
        "days_mfu_multiplied",
        "training_days",
        "training_days",
        "you multiplied by mfu",
        """
def training_days(n_params, n_tokens, n_gpus, gpu_tflops, mfu):
    return 6 * n_params * n_tokens * mfu / (n_gpus * gpu_tflops * 1e12) / 86400
""",
    ),
    Mutant(
        "days_hours",
        "training_days",
        "training_days",
        "you returned hours",
        """
def training_days(n_params, n_tokens, n_gpus, gpu_tflops, mfu):
    return 6 * n_params * n_tokens / (n_gpus * gpu_tflops * 1e12 * mfu) / 3600
""",
    ),
    Mutant(
        "days_tflops_not_scaled",
        "training_days",
        "training_days",
        "multiply by 10**12 to get FLOP/s",
        """
def training_days(n_params, n_tokens, n_gpus, gpu_tflops, mfu):
    return 6 * n_params * n_tokens / (n_gpus * gpu_tflops * mfu) / 86400
""",
    ),
    Mutant(
        "days_one_gpu",
        "training_days",
        "training_days",
        "divide by the number of GPUs",
        """
def training_days(n_params, n_tokens, n_gpus, gpu_tflops, mfu):
    return 6 * n_params * n_tokens / (gpu_tflops * 1e12 * mfu) / 86400
""",
    ),
    # ----------------------------------------------------------------- clauses the graders did not check before
    mutant(
        "params_float_count",
        ref.decoder_params,
        "return an int",
        ("kv_width = n_kv_heads * (d_model // n_heads)", "kv_width = n_kv_heads * (d_model / n_heads)"),
    ),
    mutant(
        "params_no_divisibility_check",
        ref.decoder_params,
        "raise a ValueError instead (say which of d_model",
        ("    if d_model % n_heads or n_heads % n_kv_heads:\n        raise", "    if False:\n        raise"),
    ),
    mutant(
        "params_no_positive_check",
        ref.decoder_params,
        "must be a positive integer: use require_positive",
        (
            "    require_positive(\n"
            "        integer=True,\n"
            "        vocab_size=vocab_size,\n"
            "        n_positions=n_positions,\n"
            "        d_model=d_model,\n"
            "        n_layers=n_layers,\n"
            "        n_heads=n_heads,\n"
            "        n_kv_heads=n_kv_heads,\n"
            "        d_ff=d_ff,\n"
            "    )\n",
            "",
        ),
    ),
    Mutant(
        "memory_ignores_fp32_grads",
        "memory_per_param",
        "training_memory_gib",
        "with fp32_grads=True the gradients are float32",
        mutate(
            ref.memory_per_param,
            (
                '"gradients": 4 if fp32_grads else value_bytes[precision]',
                '"gradients": value_bytes[precision]',
            ),
        ),
    ),
    Mutant(
        "memory_wrong_keys",
        "memory_per_param",
        "training_memory_gib",
        "should return a dict with the keys",
        mutate(
            ref.memory_per_param,
            ('"optimizer states": state_bytes[optimizer]', '"optimizer": state_bytes[optimizer]'),
        ),
    ),
    mutant(
        "memory_no_n_params_check",
        ref.training_memory_gib,
        "n_params must be a positive number",
        ("    require_positive(n_params=n_params)\n", ""),
    ),
    mutant(
        "kv_rounds_to_whole_bytes",
        ref.kv_cache_gib,
        "do not round",
        ("return values * bits / 8 / 2**30", "return values * bits // 8 / 2**30"),
    ),
    mutant(
        "kv_no_divisibility_check",
        ref.kv_cache_gib,
        "raise a ValueError instead (say which of d_model",
        ("    if d_model % n_heads or n_heads % n_kv_heads:\n        raise", "    if False:\n        raise"),
    ),
    mutant(
        "kv_no_positive_check",
        ref.kv_cache_gib,
        "must be a positive integer: use require_positive",
        (
            "    require_positive(\n"
            "        integer=True,\n"
            "        n_layers=n_layers,\n"
            "        n_heads=n_heads,\n"
            "        n_kv_heads=n_kv_heads,\n"
            "        d_model=d_model,\n"
            "        seq_len=seq_len,\n"
            "        batch=batch,\n"
            "        bits=bits,\n"
            "    )\n",
            "",
        ),
    ),
    mutant(
        "days_rejects_mfu_1", ref.training_days, "raised ValueError", ("    if mfu > 1:", "    if mfu >= 1:")
    ),
    mutant(
        "days_mfu_unchecked",
        ref.training_days,
        "mfu is a fraction of the peak, in (0, 1]",
        ("    if mfu > 1:", "    if False:"),
    ),
    mutant(
        "days_no_positive_check",
        ref.training_days,
        "must be a positive number: use require_positive",
        (
            "    require_positive(n_params=n_params, n_tokens=n_tokens, n_gpus=n_gpus, gpu_tflops=gpu_tflops, "
            "mfu=mfu)\n",
            "",
        ),
    ),
    # ------------------------------------------------------------------ part 5: predictions
    Mutant(
        "adam_zero_convention",
        "predict_adam_bytes",
        "predict_adam_bytes",
        "the experiment gives 8",
        "predict_adam_bytes = 16\n",
    ),
    Mutant(
        "adam_fp32_moments",
        "predict_adam_bytes",
        "predict_adam_bytes",
        "you predicted 12",
        "predict_adam_bytes = 12\n",
    ),
    Mutant(
        "adam_no_state",
        "predict_adam_bytes",
        "predict_adam_bytes",
        "you predicted 4",
        "predict_adam_bytes = 4\n",
    ),
    Mutant(
        "adam_not_a_number",
        "predict_adam_bytes",
        "predict_adam_bytes",
        "should be a finite number",
        'predict_adam_bytes = "8 bytes"\n',
    ),
    Mutant(
        "xl_kv_no_values",
        "predict_gpt2_xl_kv_mib",
        "predict_gpt2_xl_kv_mib",
        "the experiment gives 300",
        "predict_gpt2_xl_kv_mib = 150\n",
    ),
    Mutant(
        "xl_kv_float32",
        "predict_gpt2_xl_kv_mib",
        "predict_gpt2_xl_kv_mib",
        "you predicted 600",
        "predict_gpt2_xl_kv_mib = 600\n",
    ),
    Mutant(
        "xl_kv_as_text",
        "predict_gpt2_xl_kv_mib",
        "predict_gpt2_xl_kv_mib",
        "should be a finite number",
        'predict_gpt2_xl_kv_mib = "6.25"\n',
    ),
    Mutant(
        "decode_gqa_saves_no_traffic",
        "predict_batched_decode",
        "predict_batched_decode",
        "you predicted (a) about 20",
        'predict_batched_decode = "a"\n',
    ),
    Mutant(
        "decode_gqa_four_times",
        "predict_batched_decode",
        "predict_batched_decode",
        "the experiment gives (b) about 40",
        'predict_batched_decode = "c"\n',
    ),
    Mutant(
        "decode_compute_bound",
        "predict_batched_decode",
        "predict_batched_decode",
        "you predicted (d) about 300",
        'predict_batched_decode = "d"\n',
    ),
    Mutant(
        "decode_not_a_letter",
        "predict_batched_decode",
        "predict_batched_decode",
        "one of the letters",
        "predict_batched_decode = 38.5\n",
    ),
    # ----------------------------------------------------------------- part 6: flops_ratio (experiment)
    mutant(
        "flops_fused_kernel",
        ref.flops_ratio,
        "the count misses attention",
        ('with torch.device("meta"):', 'with torch.device("cpu"):  # real weights: the fused kernel runs'),
        (
            "flops = counted_flops(model, idx)",
            "counter = torch.utils.flop_counter.FlopCounterMode(display=False)\n"
            "        with counter:\n"
            "            model(idx)\n"
            "        flops = counter.get_total_flops()",
        ),
    ),
    mutant(
        "flops_non_embedding_n",
        ref.flops_ratio,
        "embeddings included",
        (
            "n_params = sum(p.numel() for p in model.parameters())",
            "n_params = sum(p.numel() for p in model.parameters()) - (vocab_size + seq_len) * d_model",
        ),
    ),
    mutant(
        "flops_forgets_batch",
        ref.flops_ratio,
        "not seq_len alone",
        ("return flops / (2 * n_params * batch * seq_len)", "return flops / (2 * n_params * seq_len)"),
    ),
    mutant(
        "flops_six_n",
        ref.flops_ratio,
        "not 6 N",
        (
            "return flops / (2 * n_params * batch * seq_len)",
            "return flops / (6 * n_params * batch * seq_len)",
        ),
    ),
    mutant(
        "flops_fixed_block_size",
        ref.flops_ratio,
        "block_size=seq_len",
        ("vocab_size=vocab_size, block_size=seq_len", "vocab_size=vocab_size, block_size=max(seq_len, 1024)"),
    ),
    # a procedure whose ratio lands inside the band: only the exact count tells it
    mutant(
        "flops_rounded",
        ref.flops_ratio,
        "no rounding",
        (
            "return flops / (2 * n_params * batch * seq_len)",
            "return round(flops / (2 * n_params * batch * seq_len), 3)  # three decimals, as the table prints",
        ),
    ),
    # ----------------------------------------------------------------- part 8: chinchilla_optimal (stretch)
    mutant(
        "chinchilla_swapped_exponents",
        ref.chinchilla_optimal,
        "the exponents are swapped",
        ("n_params = G * (flops / 6) ** (beta / s)", "n_params = G * (flops / 6) ** (alpha / s)"),
        ("n_tokens = (flops / 6) ** (alpha / s) / G", "n_tokens = (flops / 6) ** (beta / s) / G"),
    ),
    mutant(
        "chinchilla_budget_not_over_6",
        ref.chinchilla_optimal,
        "use C / 6 = N D",
        ("n_params = G * (flops / 6) ** (beta / s)", "n_params = G * flops ** (beta / s)"),
        ("n_tokens = (flops / 6) ** (alpha / s) / G", "n_tokens = flops ** (alpha / s) / G"),
    ),
    mutant(
        "chinchilla_g_without_power",
        ref.chinchilla_optimal,
        "to the power 1 / (alpha + beta)",
        ("G = (alpha * A / (beta * B)) ** (1 / s)", "G = alpha * A / (beta * B)"),
    ),
    mutant(
        "chinchilla_returns_d_n",
        ref.chinchilla_optimal,
        "return (N, D)",
        ("return float(n_params), float(n_tokens)", "return float(n_tokens), float(n_params)"),
    ),
    mutant(
        "chinchilla_no_validation",
        ref.chinchilla_optimal,
        "must be a positive number",
        ("require_positive(flops=flops, A=A, B=B, alpha=alpha, beta=beta)", "pass"),
    ),
]

#: Generated mutants (``scripts/mutation.py``) that no input the text allows tells apart from the answer.
_TERA = (
    "changes every result by one part in 10**12, far inside the float64 tolerance (relative 1e-9) the text "
    "promises so that rounding does not matter"
)
EQUIVALENT = {
    "decoder_params | norms = 2 * 2 * d_model | binop | 4": "(2 + 2) * d_model is (2 * 2) * d_model",
    "training_memory_gib | mixed = value_bytes[precision] < 4 | number | 5": (
        "a precision takes 4 or 2 bytes, so `< 3` and `< 4` split them alike"
    ),
    "kv_cache_gib | d_head = d_model // n_heads | binop | 1": "n_heads divides d_model (checked just above), so d_model / n_heads is the same whole number, as a float; "  # noqa: E501
    "the result is a float either way",
    "training_days | seconds = flops / (n_gpus * gpu_tflops * 1e12 * mfu) | number | 4": "1e12 -> 1e12 + 1 "
    + _TERA,
    "training_days | seconds = flops / (n_gpus * gpu_tflops * 1e12 * mfu) | number | 5": "1e12 -> 1e12 - 1 "
    + _TERA,
    "predict_gpt2_xl_kv_mib | predict_gpt2_xl_kv_mib = 300 | number | 4": (
        "301 is within the 5% band the question states (the truth is 300 MiB)"
    ),
    "predict_gpt2_xl_kv_mib | predict_gpt2_xl_kv_mib = 300 | number | 5": (
        "299 is within the 5% band the question states (the truth is 300 MiB)"
    ),
    "flops_ratio | vocab_size: int, d_model: int, n_layers: int, n_heads: int, seq_len: int, batch: int = 1 | default | 3": (  # noqa: E501
        "the ratio does not depend on the batch (FLOPs and tokens both scale with it): no default is observable"
    ),
    "flops_ratio | require_positive( | keyword | 2": (
        "GPTConfig raises the same ValueError naming vocab_size (check_transformer_config)"
    ),
    "flops_ratio | require_positive( | keyword | 3": "GPTConfig raises the same ValueError naming d_model",
    "flops_ratio | require_positive( | keyword | 4": "GPTConfig raises the same ValueError naming n_layers",
    "flops_ratio | if d_model % n_heads: | delete | 1": (
        "GPTConfig raises a ValueError giving both values (n_heads=5 must divide d_model=48)"
    ),
    'flops_ratio | raise ValueError(f"n_heads must divide d_model, got d_model={d_model} and n_heads={n_heads}") | delete | 1': (  # noqa: E501
        "GPTConfig raises a ValueError giving both values (n_heads=5 must divide d_model=48)"
    ),
}
