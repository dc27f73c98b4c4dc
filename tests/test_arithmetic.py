"""coursekit.arithmetic against real modules (ours and Hugging Face's, on the meta device),
torch's own FLOP counter and saved tensors, optimizers' real states, and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from coursekit import arithmetic as A
from coursekit import bert, gpt
from coursekit.layers import FeedForward, LayerNorm, count_params, gpt_params
from coursekit.multihead import MultiHeadAttention, kv_cache_bytes

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402 (after the skip: the module needs transformers)
    BertConfig as HFBertConfig,
)
from transformers import (  # noqa: E402
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

GIB = 2**30

#: Stated relative errors of the rules of thumb, one place (see the appendix's tables).
APPROX_PARAMS_RTOL = 0.011  # V C + 12 L C^2 against the exact count, all published shapes (BERT-base: 1.0%)
APPROX_PARAMS_RTOL_GPT3 = 3e-4  # ... and for GPT-3 alone
LAYER_NORM_STATS_RTOL = (
    0.01  # measured activations vs Korthikanti: LayerNorm's mean and rstd are not in the formula
)


# =========================================================================== parameters


def hf_on_meta(config):
    """Hugging Face's model of a published shape, built on the meta device (no weights, no download)."""
    with torch.device("meta"):
        if isinstance(config, gpt.GPTConfig):
            return GPT2LMHeadModel(GPT2Config(**gpt.hf_config_kwargs(config)))
        return BertModel(HFBertConfig(**config.hf_kwargs()))


def ours_on_meta(config):
    """Our model of a published shape on the meta device: GPT, or BERT with its pooler (a 1-class head
    minus its classifier)."""
    with torch.device("meta"):
        if isinstance(config, gpt.GPTConfig):
            return gpt.GPT(config)
        model = bert.BertClassifier(config, n_classes=1)
    model.head.classifier = nn.Identity()  # keep the pooler, as BertModel
    return model


@pytest.mark.parametrize("name", list(A.PUBLISHED))
def test_exact_counts_equal_our_modules_and_hf_on_meta(name):
    config = A.PUBLISHED[name]
    assert count_params(ours_on_meta(config)) == A.param_count(config) == count_params(hf_on_meta(config))


def test_published_counts_are_the_known_facts():
    assert A.param_count(A.PUBLISHED["gpt2"]) == 124_439_808
    assert A.param_count(A.PUBLISHED["bert-base"]) == 109_482_240
    assert abs(A.param_count(A.PUBLISHED["gpt3"]) / 175e9 - 1) < 0.003


@pytest.mark.parametrize("name", list(A.PUBLISHED))
def test_rule_of_thumb_is_a_slight_underestimate_within_the_stated_error(name):
    config = A.PUBLISHED[name]
    exact, approx = A.param_count(config), A.approx_param_count(config)
    assert approx < exact
    assert abs(approx / exact - 1) < (APPROX_PARAMS_RTOL_GPT3 if name == "gpt3" else APPROX_PARAMS_RTOL)


def test_rule_of_thumb_error_shrinks_with_size():
    errors = [
        1 - A.approx_param_count(c) / A.param_count(c) for n, c in A.PUBLISHED.items() if n.startswith("gpt")
    ]
    assert errors == sorted(errors, reverse=True)


def test_gpt2_paper_undercounts_its_own_models():
    """GPT-2's table says 117M; the released model has 124M (the reported numbers are about 5% low)."""
    for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"):
        ratio = A.REPORTED_PARAMS[name] / A.param_count(A.PUBLISHED[name])
        assert 0.93 < ratio < 1.0
    for name in ("gpt3", "bert-base", "bert-large"):
        assert abs(A.REPORTED_PARAMS[name] / A.param_count(A.PUBLISHED[name]) - 1) < 0.015


def test_non_embedding_count_of_gpt2_small():
    cfg = A.PUBLISHED["gpt2"]
    with torch.device("meta"):
        model = gpt.GPT(cfg)
    expected = count_params(model) - model.tok_emb.weight.numel() - model.pos_emb.weight.numel()
    assert A.non_embedding_param_count(cfg) == expected == 85_056_000


def gqa_decoder_on_meta(V, T, C, L, H, H_kv, d_ff, tied):
    """A GPT-2-style decoder with GQA, assembled from the course's modules on the meta device."""
    with torch.device("meta"):
        parts = {"tok": nn.Embedding(V, C), "pos": nn.Embedding(T, C), "norm": LayerNorm(C)}
        parts["layers"] = nn.ModuleList(
            nn.ModuleList([LayerNorm(C), MultiHeadAttention(C, H, H_kv), LayerNorm(C), FeedForward(C, d_ff)])
            for _ in range(L)
        )
        if not tied:
            parts["head"] = nn.Linear(C, V, bias=False)
        return nn.ModuleDict(parts)


@pytest.mark.parametrize(
    "V,T,C,L,H,H_kv,d_ff,tied",
    [
        (50257, 1024, 768, 12, 12, 12, 3072, True),
        (50257, 1024, 768, 12, 12, 4, 3072, True),
        (32000, 4096, 4096, 32, 32, 8, 11008, False),
        (1000, 64, 96, 3, 6, 1, 200, False),
    ],
)
def test_decoder_params_equal_modules_on_meta(V, T, C, L, H, H_kv, d_ff, tied):
    expected = count_params(gqa_decoder_on_meta(V, T, C, L, H, H_kv, d_ff, tied))
    assert A.decoder_params(V, T, C, L, H, H_kv, d_ff, tied) == expected


@pytest.mark.parametrize("tied", [True, False])
def test_decoder_params_equal_hf_gpt2_without_gqa(tied):
    kw = dict(
        vocab_size=5000,
        n_positions=256,
        n_embd=192,
        n_layer=4,
        n_head=6,
        n_inner=500,
        tie_word_embeddings=tied,
    )
    with torch.device("meta"):
        hf = GPT2LMHeadModel(GPT2Config(**kw))
    assert A.decoder_params(5000, 256, 192, 4, 6, None, 500, tied) == count_params(hf)


@pytest.mark.parametrize("name", ["gpt2", "gpt2-xl", "gpt3"])
def test_decoder_params_with_mha_is_chapter_4s_count(name):
    c = A.PUBLISHED[name]
    assert A.decoder_params(c.vocab_size, c.block_size, c.d_model, c.n_layers, c.n_heads) == gpt_params(
        c.vocab_size, c.block_size, c.d_model, c.n_layers
    )


def test_fewer_kv_heads_save_exactly_the_kv_projections():
    full = A.decoder_params(50257, 1024, 768, 12, 12, 12)
    for H_kv in (6, 4, 3, 2, 1):
        saved = 12 * 2 * (768 + 1) * (768 - H_kv * 64)  # k and v: (C + 1) x (C - H_kv D) fewer, per layer
        assert full - A.decoder_params(50257, 1024, 768, 12, 12, H_kv) == saved


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(n_heads=5), "n_heads"),
        (dict(n_kv_heads=5), "n_kv_heads"),
        (dict(d_model=0), "d_model must be a positive integer, got 0"),
        (dict(n_layers=2.5), "n_layers must be a positive integer"),
        (dict(vocab_size=True), "vocab_size"),
    ],
)
def test_decoder_params_bad_inputs(kwargs, match):
    args = dict(vocab_size=100, n_positions=16, d_model=64, n_layers=2, n_heads=8, n_kv_heads=4) | kwargs
    with pytest.raises(ValueError, match=match):
        A.decoder_params(**args)


def test_param_count_rejects_other_objects():
    with pytest.raises(ValueError, match="GPTConfig or a BertConfig, got dict"):
        A.param_count({"d_model": 3})
    with pytest.raises(ValueError, match="GPTConfig or a BertConfig"):
        A.approx_param_count(None)
    with pytest.raises(ValueError, match="expected a GPTConfig"):
        A.non_embedding_param_count(A.PUBLISHED["bert-base"])


# =========================================================================== training memory


def test_memory_per_param_conventions():
    total = lambda *a, **k: sum(A.memory_per_param(*a, **k).values())  # noqa: E731
    assert total("fp32", "adam") == 16  # 4 + 4 + 8
    assert total("bf16", "adam") == total("fp16", "adam") == 16  # ZeRO: 2 + 2 + (4 + 4 + 4)
    assert total("bf16", "adam", fp32_grads=True) == 18  # the other convention: float32 gradients
    assert A.memory_per_param("fp16", "adam") == {
        "weights": 2,
        "gradients": 2,
        "master weights": 4,
        "optimizer states": 8,
    }
    assert total("fp32", "sgd") == 8 and total("fp32", "momentum") == 12 and total("fp32", "adam8bit") == 10
    assert total("bf16", "sgd") == 8 and total("bf16", "momentum") == 12 and total("bf16", "adam8bit") == 10


@pytest.mark.parametrize(
    "optimizer,make",
    [
        ("sgd", lambda p: torch.optim.SGD(p, lr=0.1)),
        ("momentum", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
        ("adam", lambda p: torch.optim.Adam(p)),
        ("adam", lambda p: torch.optim.AdamW(p)),
    ],
)
def test_fp32_bytes_per_param_equal_torch_optimizers_real_state(optimizer, make):
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
    opt = make(model.parameters())
    model(torch.randn(4, 32)).square().sum().backward()
    opt.step()
    n = count_params(model)
    held = sum(p.nbytes + p.grad.nbytes for p in model.parameters())
    held += sum(
        t.nbytes for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.numel() > 1
    )
    assert held / n == sum(A.memory_per_param("fp32", optimizer).values())


def test_training_memory_gib_is_gib():
    assert A.training_memory_gib(1e9, "fp32", "adam") == pytest.approx(16e9 / GIB, rel=1e-12)
    assert A.training_memory_gib(GIB, "fp32", "sgd") == 8.0
    assert A.training_memory_gib(2 * GIB, "bf16", "adam8bit") == 20.0


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: A.memory_per_param("fp8", "adam"), "precision must be one of .*'fp8'"),
        (lambda: A.memory_per_param("fp32", "lion"), "optimizer must be one of .*'lion'"),
        (lambda: A.training_memory_gib(0), "n_params must be a positive number, got 0"),
        (lambda: A.training_memory_gib(float("nan")), "n_params"),
    ],
)
def test_memory_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# =========================================================================== activations


def gpt_block(s, h, a, dropout, dtype=torch.float32):
    """A GPT-2 layer (our Block without the dropout on the MLP's hidden units, which GPT-2 does not have)."""
    cfg = gpt.GPTConfig(vocab_size=8, block_size=s, n_layers=1, n_heads=a, d_model=h, dropout=dropout)
    torch.manual_seed(0)
    block = gpt.Block(cfg).to(dtype).train()
    block.ff.dropout = nn.Identity()
    return block


def measured(block, x, backend=SDPBackend.MATH):
    with sdpa_kernel(backend):
        return A.saved_tensor_bytes(block, x, exclude=list(block.parameters()))


# b >= 2: with b = 1 the math kernel saves v as a view of the packed q|k|v output, which keeps
# the whole buffer alive (2 s b h p more than the formula's separate copy of v).
@pytest.mark.parametrize("s,b,h,a", [(128, 2, 64, 4), (64, 3, 96, 6), (200, 2, 32, 2)])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_activation_formula_matches_saved_tensors(s, b, h, a, dropout):
    """Korthikanti et al.'s count against what autograd really keeps, float32 on CPU
    (where a dropout mask is stored in the activations' dtype, so m = p = 4)."""
    block = gpt_block(s, h, a, dropout)
    x = torch.randn(b, s, h, requires_grad=True)
    got = measured(block, x)
    expected = A.activation_bytes(s, b, h, a, bytes_per_value=4, mask_bytes=4, dropout=dropout > 0)
    assert got >= expected
    assert got / expected - 1 < LAYER_NORM_STATS_RTOL
    assert got - expected == 2 * 2 * s * b * 4  # exactly the two norms' float32 mean and 1/std per token


def test_full_recomputation_keeps_only_the_layer_input():
    s, b, h, a = 64, 2, 32, 4
    block = gpt_block(s, h, a, 0.1)
    x = torch.randn(b, s, h, requires_grad=True)
    with sdpa_kernel(SDPBackend.MATH):
        got = A.saved_tensor_bytes(
            lambda t: checkpoint(block, t, use_reentrant=True), x, exclude=list(block.parameters())
        )
    assert got == A.activation_bytes(s, b, h, a, bytes_per_value=4, recompute="full") == 4 * s * b * h


def test_fused_attention_keeps_no_attention_matrix():
    """The fused CPU kernel (flash attention) saves out and log-sum-exp, not the (a, s, s) weights."""
    s, b, h, a = 128, 2, 64, 4
    block = gpt_block(s, h, a, 0.0)
    x = torch.randn(b, s, h, requires_grad=True)
    fused = measured(block, x, SDPBackend.FLASH_ATTENTION)
    assert (
        fused < measured(block, x) - 4 * a * s * s * b + 4 * s * b * h
    )  # the s^2 term is gone (an output copy may remain)
    assert fused < A.activation_bytes(s, b, h, a, 4, dropout=False, recompute="selective") * 1.2


def test_activation_formula_closed_forms():
    s, b, h, a = 2048, 1, 12288, 96  # GPT-3
    assert A.activation_bytes(s, b, h, a) == 34 * s * b * h + 5 * a * s * s * b
    assert A.activation_bytes(s, b, h, a, recompute="selective") == 34 * s * b * h
    assert A.activation_bytes(s, b, h, a, recompute="full", n_layers=96) == 96 * 2 * s * b * h
    assert A.activation_bytes(s, b, h, a, dropout=False) == 32 * s * b * h + 2 * a * s * s * b
    assert A.activation_bytes(2 * s, b, h, a) > 2 * A.activation_bytes(s, b, h, a)  # quadratic in s
    assert A.activation_bytes(s, 3, h, a) == 3 * A.activation_bytes(s, 1, h, a)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(recompute="some"), "recompute must be"),
        (dict(seq_len=0), "seq_len must be a positive integer"),
        (dict(bytes_per_value=-2), "bytes_per_value must be a positive number"),
    ],
)
def test_activation_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        A.activation_bytes(**(dict(seq_len=8, batch=1, d_model=16, n_heads=2) | kwargs))


def tensor_parallel_shard(s, h, a, t, dropout, generator):
    """One GPU's share of a Megatron-LM layer, by hand: q, k, v, output projection and the
    feed-forward cut into t pieces (a / t heads, 4h / t hidden units); the all-reduces of the
    row-split outputs move no saved tensor and are left out. Returns (function, parameters)."""

    def weight(n_out, n_in):
        return torch.randn(n_out, n_in, generator=generator, requires_grad=True)

    hs, heads, d = h // t, a // t, h // a
    wq, wk, wv, wo = weight(hs, h), weight(hs, h), weight(hs, h), weight(h, hs)
    w1, w2 = weight(4 * h // t, h), weight(h, 4 * h // t)
    return lambda x: shard_forward(x, s, h, heads, d, dropout, wq, wk, wv, wo, w1, w2), [
        wq,
        wk,
        wv,
        wo,
        w1,
        w2,
    ]


def shard_forward(x, s, h, heads, d, dropout, wq, wk, wv, wo, w1, w2):
    b, hs = x.shape[0], heads * d

    def heads_of(y):  # (b, s, h / t) -> (b, a / t, s, d)
        return y.view(b, s, heads, d).transpose(1, 2).contiguous()

    n1 = torch.nn.functional.layer_norm(x, (h,))
    q, k, v = heads_of(n1 @ wq.T), heads_of(n1 @ wk.T), heads_of(n1 @ wv.T)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1)  # (b, a / t, s, s)
    weights = torch.nn.functional.dropout(weights, dropout, training=dropout > 0)
    y = (weights @ v).transpose(1, 2).reshape(b, s, hs)  # (b, s, h / t)
    x2 = x + torch.nn.functional.dropout(y @ wo.T, dropout, training=dropout > 0)  # all-reduce here
    n2 = torch.nn.functional.layer_norm(x2, (h,))
    f = torch.nn.functional.gelu(n2 @ w1.T) @ w2.T  # all-reduce here
    return x2 + torch.nn.functional.dropout(f, dropout, training=dropout > 0)


@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_tensor_parallel_activations_match_a_measured_shard(t, dropout):
    """What autograd keeps on one GPU of a tensor-parallel layer, float32 on CPU (m = p = 4)."""
    s, b, h, a = 64, 2, 32, 4
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(b, s, h, generator=generator, requires_grad=True)
    shard, params = tensor_parallel_shard(s, h, a, t, dropout, generator)
    got = A.saved_tensor_bytes(shard, x, exclude=params)
    expected = A.activation_bytes(
        s, b, h, a, bytes_per_value=4, mask_bytes=4, dropout=dropout > 0, tensor_parallel=t
    )
    assert got - expected == 2 * 2 * s * b * 4  # the two norms' float32 mean and 1/std per token


def test_tensor_and_sequence_parallel_closed_forms():
    """Korthikanti et al. (2022), Table 2, at p = 2 bytes and m = 1."""
    s, b, h, a, L = 2048, 1, 12288, 96, 96  # GPT-3
    sbh = s * b * h
    for t in (1, 2, 8):
        tp = A.activation_bytes(s, b, h, a, tensor_parallel=t)
        assert tp == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
        sp = A.activation_bytes(s, b, h, a, tensor_parallel=t, sequence_parallel=True)
        assert sp == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)), rel=1e-12)
        assert sp == pytest.approx(A.activation_bytes(s, b, h, a) / t, rel=1e-12)
        sel = A.activation_bytes(s, b, h, a, recompute="selective", tensor_parallel=t)
        assert sel == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)
        full = A.activation_bytes(s, b, h, a, L, recompute="full", tensor_parallel=t)
        assert full == L * 2 * sbh  # the layer input stays whole on every GPU
        full_sp = A.activation_bytes(
            s, b, h, a, L, recompute="full", tensor_parallel=t, sequence_parallel=True
        )
        assert full_sp == pytest.approx(L * 2 * sbh / t, rel=1e-12)
    assert A.activation_bytes(s, b, h, a, tensor_parallel=8) == 23 * sbh  # 10 + 3 + 10
    with pytest.raises(
        ValueError, match="tensor_parallel must divide n_heads, got tensor_parallel=5, n_heads=96"
    ):
        A.activation_bytes(s, b, h, a, tensor_parallel=5)
    with pytest.raises(ValueError, match="tensor_parallel must be a positive integer, got 0"):
        A.activation_bytes(s, b, h, a, tensor_parallel=0)


# =========================================================================== KV cache


@pytest.mark.parametrize(
    "L,H,H_kv,C,T,B", [(32, 32, 8, 4096, 8192, 1), (12, 12, 12, 768, 1024, 4), (80, 64, 1, 8192, 100, 3)]
)
def test_kv_cache_equals_real_cache_buffers(L, H, H_kv, C, T, B):
    D = C // H
    cache = gpt.KVCache([gpt.LayerCache(B, H_kv, T, D, torch.float16, "meta") for _ in range(L)])
    assert (
        A.kv_cache_gib(L, H, H_kv, C, T, B) == cache.nbytes() / GIB == kv_cache_bytes(L, H_kv, D, T, B) / GIB
    )


def test_kv_cache_equals_hf_llama_gqa_cache():
    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 50, (2, 11)), use_cache=True).past_key_values
    held = sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values))
    assert A.kv_cache_gib(3, 6, 2, 48, 11, 2, bits=16) * GIB == held


def test_kv_cache_scales():
    base = A.kv_cache_gib(32, 32, 8, 4096, 8192)
    assert base == 1.0
    assert A.kv_cache_gib(32, 32, 32, 4096, 8192) == 4 * base  # MHA
    assert A.kv_cache_gib(32, 32, 1, 4096, 8192) == base / 8  # MQA
    assert A.kv_cache_gib(32, 32, 8, 4096, 8192, bits=8) == base / 2
    assert A.kv_cache_gib(32, 32, 8, 4096, 8192, bits=4) == base / 4
    assert A.kv_cache_gib(32, 32, 8, 4096, 1024, batch=8) == base


@pytest.mark.parametrize(
    "args,match",
    [
        ((32, 32, 5, 4096, 10), "n_kv_heads | n_heads"),
        ((32, 30, 5, 4096, 10), "n_heads | d_model"),
        ((32, 32, 8, 4096, 0), "seq_len must be a positive integer, got 0"),
        ((32, 32, 8, 4096, 10, 1, 16.5), "bits"),
    ],
)
def test_kv_cache_bad_inputs(args, match):
    with pytest.raises(ValueError, match=match):
        A.kv_cache_gib(*args)


# =========================================================================== FLOPs

SMALL = [
    gpt.GPT_PRESETS["nano"],
    gpt.GPTConfig(vocab_size=97, block_size=48, n_layers=3, n_heads=4, d_model=48, d_ff=100),
    gpt.GPTConfig(vocab_size=50, block_size=64, n_layers=1, n_heads=1, d_model=16, bias=False),
]


def model_and_tokens(cfg, B, T):
    torch.manual_seed(0)
    return gpt.GPT(cfg).eval(), torch.randint(0, cfg.vocab_size, (B, T))


@pytest.mark.parametrize("cfg", SMALL)
@pytest.mark.parametrize("B,T", [(1, 7), (3, 16)])
def test_forward_flops_equal_flop_counter(cfg, B, T):
    model, x = model_and_tokens(cfg, B, T)
    with torch.no_grad():
        assert A.counted_flops(model, x) == A.forward_flops(cfg, T, B)


@pytest.mark.parametrize("cfg", SMALL[:2])
def test_training_step_is_three_forward_passes_and_the_palm_formula(cfg):
    B, T = 2, 12
    model, x = model_and_tokens(cfg, B, T)
    counted = A.counted_flops(lambda: model(x).square().mean().backward())
    assert counted == 3 * A.forward_flops(cfg, T, B)
    d_ff = 4 * cfg.d_model if cfg.d_ff is None else cfg.d_ff
    matmul_params = (
        cfg.n_layers * (4 * cfg.d_model**2 + 2 * cfg.d_model * d_ff) + cfg.vocab_size * cfg.d_model
    )
    assert A.training_flops(matmul_params, B * T, cfg.n_layers, T, cfg.d_model) == counted


@pytest.mark.parametrize("name,bound", [("gpt2", 0.20), ("gpt3", 0.03)])
def test_6nd_underestimates_by_the_attention_share(name, bound):
    """At their full context, 6 N D misses GPT-2 small's attention (about 15%), hardly GPT-3's."""
    cfg = A.PUBLISHED[name]
    T = cfg.block_size
    exact = 3 * A.forward_flops(cfg, T)
    rule = A.training_flops(A.param_count(cfg), T)
    assert 0 < 1 - rule / exact < bound
    assert abs(A.training_flops(A.param_count(cfg), T, cfg.n_layers, T, cfg.d_model) / exact - 1) < 0.01


def test_training_flops_and_days_closed_forms():
    assert A.training_flops(175e9, 300e9) == pytest.approx(
        3.15e23, rel=1e-9
    )  # GPT-3's 3.14e23 (Brown et al.)
    assert A.training_flops(1, 1, 2, 3, 4) == 6 + 12 * 2 * 3 * 4
    days = A.training_days(1e9, 20e9, 8, 312, 0.5)
    assert days == pytest.approx(6 * 1e9 * 20e9 / (8 * 312e12 * 0.5) / 86400, rel=1e-12)
    assert A.training_days(1e9, 20e9, 16, 312, 0.5) == pytest.approx(days / 2, rel=1e-12)
    assert A.training_days(1e9, 20e9, 8, 312, 0.25) == pytest.approx(days * 2, rel=1e-12)


@pytest.mark.parametrize(
    "call,match",
    [
        (
            lambda: A.training_days(1e9, 1e9, 8, 312, 1.5),
            r"mfu is a fraction of the peak, in \(0, 1\], got 1.5",
        ),
        (lambda: A.training_days(1e9, 1e9, 0, 312, 0.5), "n_gpus must be a positive number, got 0"),
        (lambda: A.training_flops(1e9, 1e9, 12, 0, 768), "seq_len must be a positive integer"),
        (lambda: A.forward_flops(gpt.GPT_PRESETS["nano"], 33), "exceeds the model's block_size=32"),
        (lambda: A.forward_flops(A.PUBLISHED["bert-base"], 8), "expected a GPTConfig"),
    ],
)
def test_flops_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# =========================================================================== scaling laws

BUDGETS = np.logspace(18, 26, 9)


@pytest.mark.parametrize("fit", [A.CHINCHILLA, A.CHINCHILLA_REFIT])
def test_chinchilla_optimum_minimises_the_loss_on_the_iso_flop_curve(fit):
    from scipy.optimize import minimize_scalar

    for C in (1e19, 5.76e23):
        N, D = fit.optimal(C)
        assert 6 * N * D == pytest.approx(C, rel=1e-12)
        res = minimize_scalar(
            lambda logn: fit.loss(math.exp(logn), C / (6 * math.exp(logn))),
            bounds=(math.log(1e5), math.log(1e14)),
            method="bounded",
            options={"xatol": 1e-10},
        )
        assert math.exp(res.x) == pytest.approx(N, rel=1e-4)


@pytest.mark.parametrize("fit", [A.CHINCHILLA, A.CHINCHILLA_REFIT])
def test_chinchilla_optimum_grows_with_compute(fit):
    N, D = fit.optimal(BUDGETS)
    assert np.all(np.diff(N) > 0) and np.all(np.diff(D) > 0)
    assert np.all(np.diff(fit.loss(N, D)) < 0)
    s = fit.alpha + fit.beta
    slope = np.polyfit(np.log(BUDGETS), np.log(N), 1)[0]
    assert slope == pytest.approx(fit.beta / s, rel=1e-9)


def test_tokens_per_parameter_at_the_fitted_constants():
    """About 20 with the refit; the published constants give several times more, growing with C."""
    N, D = A.CHINCHILLA_REFIT.optimal(BUDGETS)
    assert np.all((D / N > 15) & (D / N < 30))
    N, D = A.CHINCHILLA.optimal(BUDGETS)
    assert np.all(np.diff(D / N) > 0)  # alpha > beta: data grows faster than parameters
    N, D = A.CHINCHILLA.optimal(5.76e23)
    assert D / N > 60


def test_twenty_tokens_rule_recovers_chinchilla():
    N, D = A.tokens_per_param_rule(5.76e23)  # Gopher's and Chinchilla's budget
    assert D / N == pytest.approx(20) and 6 * N * D == pytest.approx(5.76e23)
    assert N == pytest.approx(70e9, rel=0.02) and D == pytest.approx(1.4e12, rel=0.02)


def test_kaplan_holds_the_joint_fit_and_its_limits():
    k = A.KAPLAN
    # Kaplan et al. (2020), Table 2, the fit of eq. 1.5 (not the single-variable fits of eqs. 1.1-1.2)
    assert (k.alpha_N, k.alpha_D, k.N_c, k.D_c) == (0.076, 0.103, 6.4e13, 1.8e13)
    assert k.loss(1e9) == pytest.approx((6.4e13 / 1e9) ** 0.076, rel=1e-12)
    assert k.loss(n_tokens=1e10) == pytest.approx((1.8e13 / 1e10) ** 0.103, rel=1e-12)
    n, d = 1e9, 1e10  # eq. 1.5 written out
    assert k.loss(n, d) == pytest.approx(((6.4e13 / n) ** (0.076 / 0.103) + 1.8e13 / d) ** 0.103, rel=1e-12)
    N = np.logspace(6, 11, 6)
    assert np.all(np.diff(k.loss(N, 1e10)) < 0) and np.all(k.loss(N, 1e10) > k.loss(N))


@pytest.mark.parametrize(
    "call",
    [
        lambda: A.CHINCHILLA.optimal(-1.0),
        lambda: A.CHINCHILLA.loss(0, 1e9),
        lambda: A.KAPLAN.loss(np.array([1e9, -1.0])),
        lambda: A.tokens_per_param_rule(1e20, 0),
    ],
)
def test_scaling_bad_inputs(call):
    with pytest.raises(ValueError, match="must be positive|positive number"):
        call()


def test_require_positive():
    A.require_positive(a=1, b=2.5, c=np.int64(3))
    A.require_positive(integer=True, a=np.int64(3))
    for bad in (0, -1, float("nan"), "3", None, True):
        with pytest.raises(ValueError, match="x must be a positive"):
            A.require_positive(x=bad)
    with pytest.raises(ValueError, match="x must be a positive integer, got 2.0"):
        A.require_positive(integer=True, x=2.0)


# --------------------------------------------------------------------------- ZeRO and pipelines


@pytest.mark.parametrize("stage,gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_memory_matches_the_papers_example(stage, gb):
    """Rajbhandari et al. (2020), Figure 1: 7.5B parameters, 64 GPUs, mixed-precision Adam."""
    assert A.zero_memory_gib(7.5e9, 64, stage, "fp16", "adam") * GIB / 1e9 == pytest.approx(gb, abs=0.05)


def test_zero_stages_interpolate_between_replication_and_full_sharding():
    full = A.training_memory_gib(1e9, "bf16", "adam")
    assert A.zero_memory_gib(1e9, 8, 0) == pytest.approx(full)
    assert A.zero_memory_gib(1e9, 8, 3) == pytest.approx(full / 8)
    assert A.zero_memory_gib(1e9, 1, 2) == pytest.approx(full)  # one GPU: nothing to shard
    stages = [A.zero_memory_gib(1e9, 8, s) for s in range(4)]
    assert stages == sorted(stages, reverse=True) and len(set(stages)) == 4
    with pytest.raises(ValueError, match="stage must be 0, 1, 2 or 3, got 4"):
        A.zero_memory_gib(1e9, 8, 4)
    with pytest.raises(ValueError, match="n_gpus must be a positive integer, got 0"):
        A.zero_memory_gib(1e9, 0, 1)


def test_pipeline_bubble_by_simulation():
    """Count idle slots of a GPipe forward schedule: stage s works on micro-batch j at slot s + j."""
    for p, m in [(1, 1), (2, 3), (4, 4), (4, 32), (8, 5)]:
        slots = m + p - 1
        busy = {(s, s + j) for s in range(p) for j in range(m)}
        idle = p * slots - len(busy)
        assert A.pipeline_bubble(p, m) == pytest.approx(idle / (p * slots))
    with pytest.raises(ValueError, match="n_microbatches must be a positive integer"):
        A.pipeline_bubble(4, 0)


def test_interleaved_pipeline_bubble_by_simulation():
    """Greedy forward schedule of Narayanan et al. (2021): GPU d holds chunks d, d + p, ...

    Each chunk takes one short slot; a GPU runs the ready task of lowest (group of p
    micro-batches, chunk, micro-batch), as Megatron-LM orders them; count the idle slots.
    """
    for p, m, v in [(2, 2, 2), (4, 4, 2), (4, 8, 3), (8, 16, 4), (3, 6, 1)]:
        done, t = {}, 0  # (micro-batch, virtual stage) -> slot at which it finished
        while len(done) < m * p * v:
            for d in range(p):
                ready = [
                    (j // p, k // p, j, k)
                    for j in range(m)
                    for k in range(d, p * v, p)
                    if (j, k) not in done and (k == 0 or done.get((j, k - 1), t + 1) <= t)
                ]
                if ready:
                    _, _, j, k = min(ready)
                    done[(j, k)] = t + 1
            t += 1
        idle = p * t - m * p * v
        assert t == v * m + p - 1
        assert A.pipeline_bubble(p, m, n_chunks=v) == pytest.approx(idle / (p * t))
    assert A.pipeline_bubble(8, 16, n_chunks=1) == A.pipeline_bubble(8, 16)
    with pytest.raises(ValueError, match="n_chunks must be a positive integer, got 0"):
        A.pipeline_bubble(4, 8, n_chunks=0)


def test_ring_allreduce_by_simulation():
    """Run a ring all-reduce on numpy buffers, count the bytes each worker sends and the steps."""
    rng = np.random.default_rng(0)
    bandwidth, latency = 10.0, 2e-6  # GB/s, s
    for w in (1, 2, 3, 8):
        buffers = [rng.standard_normal(4 * w) for _ in range(w)]
        total = sum(buffers)
        chunks = [list(np.split(b.copy(), w)) for b in buffers]
        sent, steps = [0] * w, 0
        for phase in ("reduce-scatter", "all-gather"):
            for s in range(w - 1):
                offset = -s if phase == "reduce-scatter" else 1 - s
                messages = [(i, (i + offset) % w, chunks[i][(i + offset) % w].copy()) for i in range(w)]
                for i, c, data in messages:  # all sends of a step happen at once
                    sent[i] += data.nbytes
                    receiver = chunks[(i + 1) % w]
                    receiver[c] = receiver[c] + data if phase == "reduce-scatter" else data
                steps += 1
        for worker in chunks:
            np.testing.assert_allclose(np.concatenate(worker), total, rtol=1e-12)
        n_bytes = buffers[0].nbytes
        assert sent == [2 * (w - 1) / w * n_bytes] * w
        expected = sent[0] / (bandwidth * 1e9) + steps * latency
        assert A.ring_allreduce_seconds(n_bytes, w, bandwidth, latency) == pytest.approx(expected)
    with pytest.raises(ValueError, match="n_workers must be a positive integer, got 0"):
        A.ring_allreduce_seconds(1e9, 0, 10.0)
    with pytest.raises(ValueError, match="latency_s must be zero or positive"):
        A.ring_allreduce_seconds(1e9, 4, 10.0, -1.0)


# --------------------------------------------------------------------------- 3D parallelism


def one_f_one_b(p, m):
    """Simulate the 1F1B schedule, every forward and backward one slot long.

    Stage s runs min(p - 1 - s, m) forward passes, then alternates one forward and one backward
    pass, then finishes the backward passes. Returns the slots the step takes and, per stage,
    the most micro-batches whose activations it held at once (forwards done - backwards done).
    """
    orders = []
    for s in range(p):
        w = min(p - 1 - s, m)
        ops = [("F", j) for j in range(w)]
        for j in range(m - w):
            ops += [("F", w + j), ("B", j)]
        ops += [("B", j) for j in range(m - w, m)]
        orders.append(ops)
    done, nxt, held, peak, t = {}, [0] * p, [0] * p, [0] * p, 0
    while any(n < 2 * m for n in nxt):
        finished = []
        for s in range(p):
            if nxt[s] == 2 * m:
                continue
            kind, j = orders[s][nxt[s]]
            if kind == "F":
                ready = s == 0 or done.get(("F", s - 1, j), t + 1) <= t
            else:
                ready = done.get(("B", s + 1, j) if s < p - 1 else ("F", s, j), t + 1) <= t
            if ready:
                finished.append((kind, s, j))
                nxt[s] += 1
                held[s] += 1 if kind == "F" else -1
                peak[s] = max(peak[s], held[s])
        for key in finished:
            done[key] = t + 1
        t += 1
        assert t < 10 * (m + p)  # no deadlock
    return t, peak


def test_one_f_one_b_holds_p_micro_batches_and_idles_as_gpipe():
    for p, m in [(1, 1), (1, 5), (2, 1), (4, 2), (4, 4), (4, 16), (8, 96)]:
        slots, peak = one_f_one_b(p, m)
        assert peak[0] == min(p, m) and peak == sorted(peak, reverse=True)
        assert (p * slots - 2 * p * m) / (p * slots) == pytest.approx(A.pipeline_bubble(p, m))


def test_parallel_memory_against_hand_counts():
    cfg = gpt.GPTConfig(vocab_size=100, block_size=32, n_layers=8, n_heads=4, d_model=64)
    n = A.param_count(cfg)
    one = A.parallel_memory_gib(cfg, 1, 1, 1, micro_batch=3, n_microbatches=5)
    assert one.states == pytest.approx(A.training_memory_gib(n, "bf16", "adam"))
    assert one.activations == pytest.approx(A.activation_bytes(32, 3, 64, 4, 8) / GIB)
    assert one.total == one.states + one.activations
    for t, p, d, m in [(2, 4, 3, 2), (4, 2, 8, 16), (2, 8, 1, 3)]:
        got = A.parallel_memory_gib(cfg, t, p, d, 1, m, zero_stage=1, recompute="selective")
        assert got.states == pytest.approx(n / (t * p) * (2 + 2 + 12 / d) / GIB)  # ZeRO-1: 12 bytes sharded
        _, peak = one_f_one_b(p, m)
        layer = A.activation_bytes(32, 1, 64, 4, recompute="selective", tensor_parallel=t)
        assert got.activations == pytest.approx(peak[0] * (8 // p) * layer / GIB)
    many = A.parallel_memory_gib(cfg, 2, 4, 2, 1, 64)  # m >= p: L layers' worth, whatever p
    assert many.activations == pytest.approx(A.parallel_memory_gib(cfg, 2, 1, 2, 1, 64).activations)
    with pytest.raises(ValueError, match="need pipeline | n_layers and tensor | n_heads, got pipeline=3"):
        A.parallel_memory_gib(cfg, 1, 3, 1, 1, 4)
    with pytest.raises(ValueError, match="tensor must be a positive integer, got 0"):
        A.parallel_memory_gib(cfg, 0, 1, 1, 1, 4)
    with pytest.raises(ValueError, match="recompute must be"):
        A.parallel_memory_gib(cfg, 1, 1, 1, 1, 4, recompute="most")
    with pytest.raises(ValueError, match="expected a GPTConfig"):
        A.parallel_memory_gib(A.PUBLISHED["bert-base"], 1, 1, 1, 1, 4)


def test_step_collectives_by_enumeration():
    """List every all-reduce of a step, buffer by buffer, and add up what a ring sends."""
    cfg = gpt.GPTConfig(vocab_size=100, block_size=32, n_layers=8, n_heads=4, d_model=64)
    bandwidth, latency = 20.0, 3e-6
    for t, p, d, b, m, recompute in [
        (2, 4, 3, 2, 5, "none"),
        (4, 2, 1, 1, 3, "full"),
        (1, 8, 2, 3, 2, "selective"),
    ]:
        buffers = []
        for _ in range(m):
            for _ in range(cfg.n_layers // p):
                passes = ["forward", "backward"] + (["recomputed forward"] if recompute == "full" else [])
                for _pass in passes:
                    for _block in ("attention", "feed-forward"):
                        buffers.append(np.zeros((b, cfg.block_size, cfg.d_model), dtype=np.float16).nbytes)
        got = A.parallel_step_collectives(cfg, t, p, d, b, m, recompute)
        assert got["tensor"].count == len(buffers) and got["tensor"].n_bytes == buffers[0]
        assert got["tensor"].bytes_sent == pytest.approx(sum(2 * (t - 1) / t * n for n in buffers))
        grads = np.zeros(A.param_count(cfg), dtype=np.float16).nbytes / (t * p)
        assert got["data"].bytes_sent == pytest.approx(2 * (d - 1) / d * grads)
        expected = sum(A.ring_allreduce_seconds(n, t, bandwidth, latency) for n in buffers)
        assert got["tensor"].seconds(bandwidth, latency) == pytest.approx(expected)
    alone = A.parallel_step_collectives(cfg, 1, 1, 1, 1, 1)
    assert alone["tensor"].bytes_sent == alone["data"].bytes_sent == 0
    assert alone["tensor"].seconds(bandwidth, latency) == alone["data"].seconds(bandwidth, latency) == 0
    with pytest.raises(ValueError, match="n_microbatches must be a positive integer"):
        A.parallel_step_collectives(cfg, 1, 1, 1, 1, 0)


# =========================================================================== inference

#: V=10, T_max=8, L=1, H=1, C=2, d_ff=8: the hand computations below use it.
TINY = gpt.GPTConfig(vocab_size=10, block_size=8, n_layers=1, n_heads=1, d_model=2)


def linear_weight_bytes(model):
    """Bytes of the weight matrices of every nn.Linear of ``model``, each storage once (tied weights)."""
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}
    return sum(w.nbytes for w in weights.values())


def meta_model(cfg, dtype=torch.float32):
    with torch.device("meta"):
        return gpt.GPT(cfg).to(dtype)


def meta_cache_bytes(cfg, tokens, batch, dtype):
    """Bytes of our real KVCache buffers for ``tokens`` positions of ``batch`` sequences."""
    layers = [
        gpt.LayerCache(batch, cfg.n_heads, tokens, cfg.d_head, dtype, "meta") for _ in range(cfg.n_layers)
    ]
    return gpt.KVCache(layers).nbytes()


@pytest.mark.parametrize("cfg", [*SMALL, TINY, A.PUBLISHED["gpt2"]])
def test_matmul_weights_are_the_models_linear_layers(cfg):
    assert linear_weight_bytes(meta_model(cfg)) == 4 * A.matmul_weights(cfg)


def test_decode_step_by_hand():
    """TINY: W = 1 (4 * 2^2 + 2 * 2 * 8) + 10 * 2 = 68 matrix weights. One sequence attending to S = 3
    positions: FLOPs 2 W + 4 L S C = 136 + 24 = 160; bytes in fp16 W p + 2 L C (S + 1) p = 136 + 32 = 168."""
    assert A.matmul_weights(TINY) == 68
    cost = A.decode_step_cost(TINY, 1, 3, dtype_bytes=2)
    assert cost == (160, 168)
    assert cost.intensity == pytest.approx(20 / 21, rel=1e-15)
    # four sequences: the FLOPs and the cache traffic grow four-fold, the weights are read once
    assert A.decode_step_cost(TINY, 4, 3, dtype_bytes=2) == (4 * 160, 136 + 4 * 32)


@pytest.mark.parametrize("context", [1, 128, 1024])
def test_decode_at_batch_one_does_about_one_flop_per_byte_in_fp16(context):
    """2 FLOPs per weight of 2 bytes, slightly less with the cache's traffic; half as much in fp32."""
    gpt2 = A.PUBLISHED["gpt2"]
    fp16 = A.decode_step_cost(gpt2, 1, context, 2).intensity
    assert 0.99 < fp16 < 1
    assert A.decode_step_cost(gpt2, 1, context, 4).intensity == pytest.approx(fp16 / 2, rel=1e-12)
    # batching reads the weights once for all sequences, but each sequence's cache for itself alone:
    # less than B times the intensity, and almost B times while the weights dominate (short contexts)
    batch8 = A.decode_step_cost(gpt2, 8, context, 2).intensity
    assert fp16 < batch8 < 8 * fp16
    if context == 1:
        assert batch8 > 7.9 * fp16


@pytest.mark.parametrize("cfg", SMALL)
@pytest.mark.parametrize("B", [1, 3])
def test_decode_flops_at_one_token_are_forward_flops(cfg, B):
    assert A.decode_step_cost(cfg, B, 1).flops == A.forward_flops(cfg, 1, B)


@pytest.mark.parametrize("cfg", SMALL)
@pytest.mark.parametrize("B,P", [(1, 0), (2, 5), (3, 11)])
def test_prefill_and_decode_flops_equal_the_flop_counter_on_a_cached_model(cfg, B, P):
    """Our GPT with its KV cache: a prefill of P + 1 tokens, then one cached step attending to P + 2 positions."""
    model, x = model_and_tokens(cfg, B, P + 2)
    cache = model.init_cache(B)
    with torch.no_grad():
        prefill = A.counted_flops(model, x[:, : P + 1], cache)
        step = A.counted_flops(model, x[:, P + 1 :], cache)
    assert prefill == A.prefill_cost(cfg, B, P + 1).flops
    assert step == A.decode_step_cost(cfg, B, P + 2).flops


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("cfg", [TINY, SMALL[1], A.PUBLISHED["gpt2"]])
def test_bytes_moved_equal_the_real_weights_and_cache_buffers(cfg, dtype):
    """Weights: the model's nn.Linear matrices in ``dtype``; cache: our KVCache's buffers."""
    p = torch.tensor([], dtype=dtype).element_size()
    weights = linear_weight_bytes(meta_model(cfg, dtype))
    B, S = 3, min(7, cfg.block_size - 1)
    decode = A.decode_step_cost(cfg, B, S, dtype_bytes=p)
    assert decode.bytes_moved == weights + meta_cache_bytes(cfg, S + 1, B, dtype)  # S read, one written
    assert A.prefill_cost(cfg, B, S, dtype_bytes=p).bytes_moved == weights + meta_cache_bytes(
        cfg, S, B, dtype
    )


def test_prefill_intensity_grows_with_the_prompt():
    gpt2 = A.PUBLISHED["gpt2"]
    lengths = [1, 2, 8, 64, 256, 512, 1024]
    intensity = [A.prefill_cost(gpt2, 1, T).intensity for T in lengths]
    assert intensity == sorted(intensity) and len(set(intensity)) == len(lengths)
    # at B = 1 in 2 bytes, exactly T: attention's 4 L T C FLOPs per token equal the cache's 4 L C T bytes
    assert intensity == pytest.approx(lengths, rel=1e-12)
    # a batch of prompts reads the weights once for all of them
    assert A.prefill_cost(gpt2, 8, 64).intensity > A.prefill_cost(gpt2, 1, 64).intensity
    # prefill of T tokens beats T decode steps: same FLOPs per token, the weights read once instead of T times
    assert A.prefill_cost(gpt2, 1, 64).intensity > 50 * A.decode_step_cost(gpt2, 1, 64).intensity


def test_roofline_picks_the_bound_on_both_sides_of_the_ridge():
    peak, bw = 100.0, 10.0  # ridge at 10 FLOPs per byte
    assert A.ridge_point(peak, bw) == 10
    assert A.roofline_time(1000, 50, peak, bw) == (10.0, "compute")  # intensity 20
    assert A.roofline_time(1000, 200, peak, bw) == (20.0, "memory")  # intensity 5
    assert A.roofline_time(1000, 100, peak, bw) == (10.0, "compute")  # on the ridge
    assert A.attainable_flops([1, 5, 10, 20, 1e6], peak, bw) == pytest.approx([10, 50, 100, 100, 100])
    # the time bound is the work over the attainable rate, at any intensity
    for flops, moved in [(1e9, 3e7), (1e9, 3e9), (5.0, 0.5)]:
        attainable = A.attainable_flops(A.arithmetic_intensity(flops, moved), 989e12, 3.35e12)
        assert A.roofline_time(flops, moved, 989e12, 3.35e12).seconds == pytest.approx(
            flops / attainable, rel=1e-12
        )
    assert A.arithmetic_intensity(2 * 1024**3, 3 * 4 * 1024**2) == pytest.approx(1024 / 6)


def first_compute_bound_batch(cfg, context, peak, bw, p, limit=5000):
    """The smallest B whose decode step roofline_time calls compute-bound, by trying them in turn."""
    for B in range(1, limit + 1):
        cost = A.decode_step_cost(cfg, B, context, p)
        if A.roofline_time(cost.flops, cost.bytes_moved, peak, bw).bound == "compute":
            return B
    return None


@pytest.mark.parametrize(
    "cfg,context,peak,bw,p",
    [
        (A.PUBLISHED["gpt2"], 1, 989e12, 3.35e12, 2),  # H100 SXM, bf16
        (A.PUBLISHED["gpt2"], 8, 989e12, 3.35e12, 2),
        (A.PUBLISHED["gpt2"], 128, 150e9, 12e9, 4),  # a CPU core, fp32
        (A.PUBLISHED["gpt2-xl"], 16, 150e9, 12e9, 4),
        (TINY, 2, 20.0, 10.0, 2),
    ],
)
def test_compute_bound_batch_is_the_first_batch_over_the_ridge(cfg, context, peak, bw, p):
    found = A.decode_compute_bound_batch(cfg, context, peak, bw, p)
    assert found is not None and found == first_compute_bound_batch(cfg, context, peak, bw, p)


def test_decode_with_a_long_mha_cache_never_becomes_compute_bound_on_an_h100():
    gpt2, ridge = A.PUBLISHED["gpt2"], A.ridge_point(989e12, 3.35e12)
    assert A.decode_compute_bound_batch(gpt2, 1, 989e12, 3.35e12) == 324
    assert A.decode_compute_bound_batch(gpt2, 1024, 989e12, 3.35e12) is None
    # the intensity saturates: FLOPs and cache bytes both grow with B
    assert A.decode_step_cost(gpt2, 10**7, 1024).intensity < 7.6 < ridge
    assert first_compute_bound_batch(gpt2, 1024, 989e12, 3.35e12, 2, limit=2000) is None


def test_max_batch_for_kv_cache_by_hand():
    """TINY: N = (10 + 8) 2 + (12 * 2^2 + 13 * 2) + 2 * 2 = 114 parameters, 228 bytes in fp16; a sequence
    of 8 tokens caches 2 L C T p = 2 * 1 * 2 * 8 * 2 = 64 bytes."""
    assert A.param_count(TINY) == 114 == count_params(gpt.GPT(TINY))
    assert A.max_batch_for_kv_cache(TINY, 1000, 8) == (1000 - 228) // 64 == 12
    assert A.max_batch_for_kv_cache(TINY, 228 + 12 * 64, 8) == 12
    assert A.max_batch_for_kv_cache(TINY, 228 + 12 * 64 - 1, 8) == 11
    assert A.max_batch_for_kv_cache(TINY, 228, 8) == 0
    assert A.max_batch_for_kv_cache(TINY, 1000, 4) == (1000 - 228) // 32
    assert A.max_batch_for_kv_cache(TINY, 1000, 8, dtype_bytes=4) == (1000 - 456) // 128


def test_max_batch_of_the_7b_shape_on_80_gb():
    weights = A.param_count(A.GPT_7B) * 2
    for context in (1024, 2048, 4096):
        per_sequence = A.kv_cache_gib(32, 32, 32, 4096, context) * GIB
        assert A.max_batch_for_kv_cache(A.GPT_7B, 80e9, context) == int((80e9 - weights) // per_sequence)
    assert A.max_batch_for_kv_cache(A.GPT_7B, 80e9, 4096) == 31
    assert A.max_batch_for_kv_cache(A.GPT_7B, 80e9, 1024) == 124
    # the docstring's example: a GPU sold as "80GB" holds 80 GiB; 12.3 GiB of weights, 2 GiB a sequence
    assert A.max_batch_for_kv_cache(A.GPT_7B, 80 * GIB, 4096) == int((80 * GIB - weights) // (2 * GIB)) == 33


def test_7b_shape_is_llama_2_7b_but_for_positions_and_the_untied_head():
    """Llama 2 7B (Touvron et al., 2023) built by Hugging Face on the meta device: 6,738,415,616 parameters.
    Its gated feed-forward's three C x 11008 matrices hold as many weights as our two C x 16512; the
    difference is its untied output layer (V C) minus our learned positions (T_max C)."""
    cfg = A.GPT_7B
    assert 3 * cfg.d_model * 11008 == 2 * cfg.d_model * cfg.d_ff
    llama = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=11008,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads,
        max_position_embeddings=cfg.block_size,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        theirs = count_params(LlamaForCausalLM(llama))
        ours = count_params(gpt.GPT(cfg))
    assert theirs == 6_738_415_616
    assert ours == A.param_count(cfg)
    assert theirs - ours == (cfg.vocab_size - cfg.block_size) * cfg.d_model


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: A.decode_step_cost(A.PUBLISHED["gpt2"], 0, 10), "batch must be a positive integer, got 0"),
        (
            lambda: A.decode_step_cost(gpt.GPT_PRESETS["nano"], 1, 33),
            "context=33 exceeds the model's block_size=32",
        ),
        (
            lambda: A.decode_step_cost(gpt.GPT_PRESETS["nano"], 1, 0),
            "context must be a positive integer, got 0",
        ),
        (
            lambda: A.prefill_cost(gpt.GPT_PRESETS["nano"], 1, 33),
            "seq_len=33 exceeds the model's block_size=32",
        ),
        (lambda: A.prefill_cost(A.PUBLISHED["bert-base"], 1, 8), "expected a GPTConfig, got BertConfig"),
        (lambda: A.decode_step_cost(TINY, 1, 4, dtype_bytes=0.3), "whole number of bits"),
        (
            lambda: A.decode_step_cost(TINY, 1, 4, dtype_bytes=0),
            "dtype_bytes must be a positive number, got 0",
        ),
        (lambda: A.arithmetic_intensity(1.0, 0), "bytes_moved must be a positive number, got 0"),
        (lambda: A.roofline_time(0, 1, 1, 1), "flops must be a positive number, got 0"),
        (lambda: A.ridge_point(1e12, -1), "bandwidth must be a positive number, got -1"),
        (lambda: A.attainable_flops([1.0, 0.0], 1, 1), "intensity must be positive"),
        (lambda: A.decode_compute_bound_batch(TINY, 2, 0, 1), "peak_flops must be a positive number, got 0"),
        (
            lambda: A.max_batch_for_kv_cache(TINY, 227, 8),
            "the weights alone need 228 bytes, more than memory_bytes=227",
        ),
        (lambda: A.max_batch_for_kv_cache(TINY, 1000, 9), "context=9 exceeds the model's block_size=8"),
        (lambda: A.max_batch_for_kv_cache(TINY, -5, 8), "memory_bytes must be a positive number, got -5"),
    ],
)
def test_inference_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------- the measurements (coursekit.experiments.roofline)
# No timing is asserted: a fake clock that advances one second per reading checks what is counted.


@pytest.fixture
def one_second_per_reading(monkeypatch):
    from coursekit.experiments import roofline

    clock = iter(range(10**6))
    monkeypatch.setattr(roofline, "perf_counter", lambda: float(next(clock)))
    return roofline


def test_measured_peak_counts_2n3_flops_per_product(one_second_per_reading):
    roofline = one_second_per_reading
    assert roofline.measure_peak_flops(sizes=(16, 48, 32), repeats=3) == 2 * 48**3


def test_measured_bandwidth_counts_the_read_and_the_write(one_second_per_reading):
    roofline = one_second_per_reading
    assert roofline.measure_bandwidth(n_bytes=4096 + 3, repeats=2) == 2 * 4096


def test_measured_decode_counts_decode_step_flops(one_second_per_reading):
    """Three timed steps attend to 2, 3 and 4 positions; at one second each the median is the middle one."""
    roofline = one_second_per_reading
    cfg = gpt.GPT_PRESETS["nano"]
    torch.manual_seed(0)
    rate = roofline.decode_flops_per_second(gpt.GPT(cfg), batch=2, steps=3)
    assert rate == A.decode_step_cost(cfg, 2, 3).flops


def test_measurements_run_and_restore_the_thread_count():
    from coursekit.experiments import roofline

    saved = torch.get_num_threads()
    torch.set_num_threads(2)  # not the one thread the suite runs on, so that a restore shows
    try:
        with roofline.num_threads(1):
            assert torch.get_num_threads() == 1
        with pytest.raises(RuntimeError), roofline.num_threads(1):
            raise RuntimeError("the setting is restored on the way out")
        assert torch.get_num_threads() == 2
        assert (
            math.isfinite(roofline.measure_peak_flops(sizes=(64,), repeats=2))
            and torch.get_num_threads() == 2
        )
    finally:
        torch.set_num_threads(saved)
    assert roofline.measure_bandwidth(n_bytes=2**20, repeats=2) > 0
    torch.manual_seed(0)
    assert roofline.decode_flops_per_second(gpt.GPT(gpt.GPT_PRESETS["nano"]), batch=1, steps=2) > 0


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda r: r.measure_peak_flops(sizes=()), "sizes must hold at least one matrix size, got none"),
        (lambda r: r.measure_peak_flops(sizes=(64, 0)), "size must be a positive integer, got 0"),
        (lambda r: r.measure_bandwidth(n_bytes=3), "n_bytes must hold at least one float32 value"),
        (
            lambda r: r.measure_bandwidth(n_bytes=1024, threads=0),
            "num_threads must be a positive integer, got 0",
        ),
        (lambda r: r.decode_flops_per_second(nn.Linear(2, 2), 1), "expected a coursekit.gpt.GPT, got Linear"),
        (
            lambda r: r.decode_flops_per_second(gpt.GPT(gpt.GPT_PRESETS["nano"]), 1, steps=32),
            "steps \\+ 1 = 33 positions exceed the model's block_size=32",
        ),
    ],
)
def test_measurement_bad_inputs(call, match):
    from coursekit.experiments import roofline

    with pytest.raises(ValueError, match=match):
        call(roofline)
