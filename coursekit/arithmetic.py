"""Appendix: transformer arithmetic, the numbers to work out before training or serving a model.

Everything here is a closed form, checked against something real in the tests:

- **Parameters**: the exact counts of the published shapes come from the chapters' own
  counts (:func:`~coursekit.gpt.gpt_param_count`, :func:`~coursekit.bert.bert_params`),
  which the tests compare with our modules and Hugging Face's built on the ``meta`` device;
  :func:`approx_param_count` is the rule of thumb ``V C + 12 L C^2``;
  :func:`decoder_params` counts a GPT-2-style decoder with grouped-query attention.
- **Training memory** per parameter (:func:`memory_per_param`, :func:`training_memory_gib`)
  for fp32 or mixed precision and four optimizers, in the convention of ZeRO
  (Rajbhandari et al., 2020): mixed-precision Adam is ``2 + 2 + 12 = 16`` bytes.
- **Activations** per layer (:func:`activation_bytes`), the formula of Korthikanti et al.
  (2022), and :func:`saved_tensor_bytes`, which measures what autograd keeps.
- **Parallelism**: :func:`zero_memory_gib` (ZeRO's stages), :func:`pipeline_bubble` (plain and
  interleaved schedules) and :func:`ring_allreduce_seconds` (the alpha-beta cost of a ring
  all-reduce, Patarasuk and Yuan, 2009); for tensor, pipeline and data parallelism together,
  :func:`parallel_memory_gib` (a GPU's memory) and :func:`parallel_step_collectives` (its
  all-reduces per step).
- **KV cache** (:func:`kv_cache_gib`), for multi-, grouped- and multi-query attention.
- **FLOPs**: :func:`forward_flops` counts every matrix product of a :class:`~coursekit.gpt.GPT`
  exactly (the tests compare it with ``torch.utils.flop_counter.FlopCounterMode``, which
  :func:`counted_flops` runs); :func:`training_flops` is ``6 N D`` (Kaplan et al., 2020) plus
  the attention term ``12 L T C D`` (Chowdhery et al., 2022); :func:`training_days` turns
  FLOPs into days on a number of GPUs at a model-FLOPs utilisation (MFU).
- **Inference**: :func:`decode_step_cost` and :func:`prefill_cost` give the FLOPs and the bytes
  moved of a decoding step and of a prompt's prefill, :func:`arithmetic_intensity` their ratio;
  the roofline (Williams et al., 2009: :func:`roofline_time`, :func:`ridge_point`,
  :func:`attainable_flops`) turns them into a bound on time; :func:`decode_compute_bound_batch`
  is the batch at which decoding turns compute-bound, :func:`max_batch_for_kv_cache` the batch
  the memory left for the KV cache allows (:data:`GPT_7B`, a 7B-class shape).
  :mod:`coursekit.experiments.roofline` measures a machine's peak and bandwidth.
- **Scaling laws**: :class:`KaplanFit` (Kaplan et al., 2020) and :class:`ChinchillaFit`
  (Hoffmann et al., 2022) with their published constants, the compute-optimal ``N`` and
  ``D`` for a budget, and the "20 tokens per parameter" rule (:func:`tokens_per_param_rule`).

Units: bytes and FLOPs are plain numbers; ``GiB`` is ``2**30`` bytes (a ``GB`` is ``10**9``).
Shapes: ``V`` vocabulary, ``C`` model width, ``L`` layers, ``H`` heads, ``H_kv`` key/value
heads, ``D = C / H`` head width, ``T`` sequence length, ``B`` batch.

Over 500 lines: the appendix is one formula per quantity (parameters, memory, KV cache, FLOPs,
time), each with the docstring that derives it and the checks of its arguments; they read best
together.
"""

from __future__ import annotations

import math
import numbers
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from coursekit.bert import BERT_PRESETS, BertConfig, bert_params
from coursekit.gpt import GPT, GPT_PRESETS, GPTConfig, gpt_param_count
from coursekit.layers import approx_gpt_params

__all__ = [
    "PUBLISHED",
    "REPORTED_PARAMS",
    "GPU_PEAK_TFLOPS",
    "KAPLAN",
    "CHINCHILLA",
    "CHINCHILLA_REFIT",
    "KaplanFit",
    "ChinchillaFit",
    "require_positive",
    "param_count",
    "approx_param_count",
    "non_embedding_param_count",
    "decoder_params",
    "memory_per_param",
    "training_memory_gib",
    "zero_memory_gib",
    "pipeline_bubble",
    "ring_allreduce_seconds",
    "activation_bytes",
    "saved_tensor_bytes",
    "GPUMemory",
    "parallel_memory_gib",
    "Collective",
    "parallel_step_collectives",
    "kv_cache_gib",
    "forward_flops",
    "matmul_weights",
    "counted_flops",
    "flops_ratio",
    "training_flops",
    "training_days",
    "GPT_7B",
    "Cost",
    "Roofline",
    "arithmetic_intensity",
    "ridge_point",
    "attainable_flops",
    "roofline_time",
    "decode_step_cost",
    "prefill_cost",
    "decode_compute_bound_batch",
    "max_batch_for_kv_cache",
    "tokens_per_param_rule",
    "chinchilla_optimal",
]


def require_positive(integer: bool = False, **values) -> None:
    """Raise a ``ValueError`` naming the first value that is not a positive number.

    Args:
        integer: also require whole numbers (layer counts, widths, lengths).
        **values: ``name=value`` pairs, checked in order.

    Example: ``require_positive(n_layers=12, seq_len=0)`` raises
    ``ValueError("seq_len must be a positive number, got 0")``.
    """
    kind = numbers.Integral if integer else numbers.Real
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
            what = "a positive integer" if integer else "a positive number"
            raise ValueError(f"{name} must be {what}, got {value!r}")


# =========================================================================== parameters

#: The published shapes: GPT-2 (Radford et al., 2019), GPT-3 175B (Brown et al., 2020),
#: BERT (Devlin et al., 2019).
PUBLISHED: dict[str, GPTConfig | BertConfig] = {
    **{name: GPT_PRESETS[name] for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3")},
    "bert-base": BERT_PRESETS["bert-base"],
    "bert-large": BERT_PRESETS["bert-large"],
}

#: The counts the papers report for :data:`PUBLISHED` (GPT-2's table gives 117M, 345M, 762M and
#: 1542M: the released models have more, see the appendix).
REPORTED_PARAMS: dict[str, float] = {
    "gpt2": 117e6,
    "gpt2-medium": 345e6,
    "gpt2-large": 762e6,
    "gpt2-xl": 1542e6,
    "gpt3": 175e9,
    "bert-base": 110e6,
    "bert-large": 340e6,
}


def param_count(config: GPTConfig | BertConfig) -> int:
    """Exact parameter count of a published shape.

    A :class:`~coursekit.gpt.GPTConfig` counts :class:`~coursekit.gpt.GPT` (tied output layer,
    as GPT-2's ``GPT2LMHeadModel``); a :class:`~coursekit.bert.BertConfig` counts the encoder
    with its pooler, as Hugging Face's ``BertModel`` and the BERT paper.

    Example: ``param_count(PUBLISHED["gpt2"])`` is 124,439,808.
    """
    if isinstance(config, GPTConfig):
        return gpt_param_count(config)
    if isinstance(config, BertConfig):
        return bert_params(config, "pooler")
    raise ValueError(f"expected a GPTConfig or a BertConfig, got {type(config).__name__}")


def approx_param_count(config: GPTConfig | BertConfig) -> int:
    """The rule of thumb ``V C + 12 L C^2``: embeddings and the layers' weight matrices only."""
    if not isinstance(config, (GPTConfig, BertConfig)):
        raise ValueError(f"expected a GPTConfig or a BertConfig, got {type(config).__name__}")
    return approx_gpt_params(config.vocab_size, config.d_model, config.n_layers)


def non_embedding_param_count(config: GPTConfig) -> int:
    """Kaplan et al.'s ``N``: the parameters of a :class:`~coursekit.gpt.GPT` without its token
    and position embeddings (the tied output layer goes with the embedding)."""
    if not isinstance(config, GPTConfig):
        raise ValueError(f"expected a GPTConfig, got {type(config).__name__}")
    return gpt_param_count(config) - (config.vocab_size + config.block_size) * config.d_model


def decoder_params(
    vocab_size: int,
    n_positions: int,
    d_model: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int | None = None,
    d_ff: int | None = None,
    tied: bool = True,
) -> int:
    """Exact parameter count of a GPT-2-style decoder with grouped-query attention.

    Token embedding ``V C`` and learned positions ``T_max C``; per layer, a query projection
    ``C -> C``, key and value projections ``C -> H_kv D`` each (``D = C / H``), an output
    projection ``C -> C``, a feed-forward ``C -> d_ff -> C``, every one with a bias, and two
    layer norms of ``2 C`` (scale and shift); a final layer norm; and an output layer that
    reuses the token embedding (``tied=True``) or adds a bias-free ``V C``.

    Args:
        vocab_size: ``V``.
        n_positions: ``T_max``, the number of learned positions.
        d_model: ``C``.
        n_layers: ``L``.
        n_heads: query heads ``H``; must divide ``C``.
        n_kv_heads: key/value heads ``H_kv``; must divide ``H``; ``None`` for ``H`` (MHA).
        d_ff: feed-forward width; ``None`` for ``4 C``.
        tied: whether the output layer is the token embedding.

    Returns:
        The number of parameters, an ``int``.

    Raises:
        ValueError: a size is not a positive whole number (the message names it), or ``n_heads``
            does not divide ``d_model`` or ``n_kv_heads`` does not divide ``n_heads`` (the message
            gives the values).

    Example: ``decoder_params(50257, 1024, 768, 12, 12)`` is 124,439,808 (GPT-2 small);
    with ``n_kv_heads=4`` the key and value projections shrink to a third: 114,990,336.
    """
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    d_ff = 4 * d_model if d_ff is None else d_ff
    require_positive(
        integer=True,
        vocab_size=vocab_size,
        n_positions=n_positions,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_ff=d_ff,
    )
    if d_model % n_heads or n_heads % n_kv_heads:
        raise ValueError(
            f"need n_heads | d_model and n_kv_heads | n_heads, got d_model={d_model}, "
            f"n_heads={n_heads}, n_kv_heads={n_kv_heads}"
        )
    kv_width = n_kv_heads * (d_model // n_heads)
    attention = (d_model + 1) * (d_model + 2 * kv_width) + (
        d_model + 1
    ) * d_model  # q, k, v and output, with biases
    feedforward = (d_model + 1) * d_ff + (d_ff + 1) * d_model
    norms = 2 * 2 * d_model
    embeddings = (vocab_size + n_positions) * d_model
    head = 0 if tied else vocab_size * d_model
    return embeddings + n_layers * (attention + feedforward + norms) + 2 * d_model + head


# =========================================================================== training memory


def memory_per_param(
    precision: str = "fp32", optimizer: str = "adam", fp32_grads: bool = False
) -> dict[str, int]:
    """Bytes per parameter that training keeps, by what they hold (activations excluded).

    ``precision="fp32"``: weights and gradients in float32. ``"fp16"`` or ``"bf16"``: mixed
    precision, weights and gradients in 16 bits plus a float32 *master* copy of the weights
    that the optimizer updates. The optimizer's states are float32: none for ``"sgd"``, one
    momentum buffer for ``"momentum"``, two moments for ``"adam"`` (AdamW too); ``"adam8bit"``
    keeps both moments in 8 bits (Dettmers et al., 2022; their per-block scales, 8 bytes per
    2048 values, are left out).

    Args:
        precision: ``"fp32"``, ``"fp16"`` or ``"bf16"``.
        optimizer: ``"sgd"``, ``"momentum"``, ``"adam"`` or ``"adam8bit"``.
        fp32_grads: mixed precision with float32 gradients (4 bytes instead of 2): the
            convention that gives 18 bytes for mixed-precision Adam; ZeRO's gives 16.

    Returns:
        ``{"weights", "gradients", "master weights", "optimizer states"}`` in bytes.

    Raises:
        ValueError: a name is not one of the accepted ones (the message lists them).

    Example: ``memory_per_param("bf16", "adam")`` is ``{"weights": 2, "gradients": 2,
    "master weights": 4, "optimizer states": 8}``: 16 bytes, as fp32 Adam.
    """
    value_bytes = {"fp32": 4, "fp16": 2, "bf16": 2}
    state_bytes = {"sgd": 0, "momentum": 4, "adam": 8, "adam8bit": 2}
    if precision not in value_bytes:
        raise ValueError(f"precision must be one of {sorted(value_bytes)}, got {precision!r}")
    if optimizer not in state_bytes:
        raise ValueError(f"optimizer must be one of {sorted(state_bytes)}, got {optimizer!r}")
    mixed = value_bytes[precision] < 4
    return {
        "weights": value_bytes[precision],
        "gradients": 4 if fp32_grads else value_bytes[precision],
        "master weights": 4 if mixed else 0,
        "optimizer states": state_bytes[optimizer],
    }


def training_memory_gib(n_params: float, precision: str = "fp32", optimizer: str = "adam") -> float:
    """GiB of weights, gradients and optimizer states to train ``n_params`` parameters.

    Args:
        n_params: number of parameters ``N``.
        precision, optimizer: as :func:`memory_per_param` (16-bit gradients in mixed precision).

    Returns:
        GiB (``2**30`` bytes); activations, buffers and fragmentation come on top.

    Raises:
        ValueError: ``n_params`` is not a positive number, or a name is not one of the accepted
            ones (the message lists them).

    Example: 1 billion parameters with fp32 Adam need ``16e9 / 2**30 = 14.9`` GiB.
    """
    require_positive(n_params=n_params)
    return n_params * sum(memory_per_param(precision, optimizer).values()) / 2**30


def zero_memory_gib(
    n_params: float, n_gpus: int, stage: int, precision: str = "bf16", optimizer: str = "adam"
) -> float:
    """GiB of model states per GPU when ``n_gpus`` data-parallel GPUs shard them with ZeRO.

    ZeRO (Rajbhandari et al., 2020) removes the replication of plain data parallelism in
    three stages: stage 1 shards the optimizer states (the float32 master weights
    included), stage 2 also the gradients, stage 3 also the weights. Stage 0 is plain data
    parallelism, every GPU holding :func:`training_memory_gib`.

    Args:
        n_params: ``N``.
        n_gpus: the data-parallel degree ``N_d``.
        stage: 0, 1, 2 or 3.
        precision, optimizer: as :func:`memory_per_param`.

    Returns:
        GiB per GPU; activations come on top.

    Example: the paper's 7.5B model on 64 GPUs with mixed-precision Adam needs 120, 31.4,
    16.6 and 1.9 GB per GPU at stages 0-3 (in ``10**9`` bytes).
    """
    require_positive(integer=True, n_gpus=n_gpus)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    b = memory_per_param(precision, optimizer)
    sharded = {
        1: ("master weights", "optimizer states"),
        2: ("master weights", "optimizer states", "gradients"),
        3: ("master weights", "optimizer states", "gradients", "weights"),
    }.get(stage, ())
    per_param = sum(v / n_gpus if k in sharded else v for k, v in b.items())
    return training_memory_gib(n_params, precision, optimizer) * per_param / sum(b.values())


def pipeline_bubble(n_stages: int, n_microbatches: int, n_chunks: int = 1) -> float:
    """Fraction of time a pipeline stands idle: ``(p - 1) / (v m + p - 1)``.

    With ``p`` stages and ``m`` micro-batches per batch, a step takes ``m + p - 1`` slots of
    one micro-batch's stage time, of which each stage is busy for ``m`` (Huang et al., 2019);
    1F1B schedules (Narayanan et al., 2019) idle as long. The interleaved schedule (Narayanan
    et al., 2021) gives each GPU ``v`` chunks of layers: a slot is then ``1/v`` as long, so
    the fill and drain cost ``p - 1`` short slots out of ``v m + p - 1``.

    Args:
        n_stages: the pipeline degree ``p`` (GPUs in the pipeline).
        n_microbatches: ``m``; the interleaved schedule wants a multiple of ``p``.
        n_chunks: ``v``, chunks of layers per GPU (1: the plain schedule).

    Returns:
        The idle fraction of a step; the bubble relative to the ideal time is
        ``(p - 1) / (v m)``.

    Example: 4 stages and 4 micro-batches idle 3/7 = 43% of the time; 32 micro-batches, 8.6%;
    4 micro-batches with 2 chunks per GPU, 3/11 = 27%.
    """
    require_positive(integer=True, n_stages=n_stages, n_microbatches=n_microbatches, n_chunks=n_chunks)
    return (n_stages - 1) / (n_chunks * n_microbatches + n_stages - 1)


def ring_allreduce_seconds(
    n_bytes: float, n_workers: int, bandwidth_gb_s: float, latency_s: float = 0.0
) -> float:
    """Seconds a ring all-reduce of ``n_bytes`` takes on ``W`` workers (Patarasuk and Yuan, 2009).

    The buffer is cut into ``W`` chunks. In the reduce-scatter half, ``W - 1`` steps pass
    chunks around the ring, each worker adding what it receives, until each worker holds the
    sum of one chunk; the all-gather half passes the summed chunks around in ``W - 1`` more
    steps. Each worker sends (and receives) ``2 (W - 1) / W`` times ``n_bytes``:

        time = 2 (W - 1) / W * n_bytes / bandwidth + 2 (W - 1) * latency

    Args:
        n_bytes: size of the buffer every worker holds (e.g. the gradients), in bytes.
        n_workers: ``W``; one worker needs no communication (0 s).
        bandwidth_gb_s: each worker's link, per direction, in GB/s (``10**9`` bytes/s).
        latency_s: the fixed cost of one step, in seconds.

    Returns:
        Seconds, in the alpha-beta model (no congestion, no overlap with computation).

    Example: 1 GB over 4 workers at 100 GB/s without latency: 1.5 GB each way, 0.015 s.
    """
    require_positive(n_bytes=n_bytes, bandwidth_gb_s=bandwidth_gb_s)
    require_positive(integer=True, n_workers=n_workers)
    if latency_s < 0:
        raise ValueError(f"latency_s must be zero or positive, got {latency_s!r}")
    steps = 2 * (n_workers - 1)
    return steps / n_workers * n_bytes / (bandwidth_gb_s * 1e9) + steps * latency_s


def activation_bytes(
    seq_len: int,
    batch: int,
    d_model: int,
    n_heads: int,
    n_layers: int = 1,
    bytes_per_value: float = 2,
    mask_bytes: float = 1,
    dropout: bool = True,
    recompute: str = "none",
    tensor_parallel: int = 1,
    sequence_parallel: bool = False,
) -> float:
    """Activations a transformer layer keeps for the backward pass (Korthikanti et al., 2022).

    With ``s`` tokens, batch ``b``, width ``h``, ``a`` heads, ``p`` bytes per value and ``m``
    bytes per dropout-mask entry, one GPT layer stores ``s b h (16 p + 2 m) + a s^2 b (2 p + m)``
    bytes: ``34 s b h + 5 a s^2 b`` at ``p = 2, m = 1``. Without dropout: ``16 p s b h + p a s^2 b``.
    ``recompute="selective"`` recomputes the attention core (the ``s^2`` terms) in the
    backward pass; ``"full"`` keeps only each layer's input, ``p s b h``.

    With tensor parallelism of degree ``t`` (Megatron-LM), each GPU keeps ``1/t`` of what lies
    between a column-split and a row-split matrix: ``q``, ``k``, ``v``, the output projection's
    input, the two ``4h``-wide feed-forward tensors (``12 p s b h`` in all) and the attention
    core. The rest is whole on every GPU: the two norms' inputs, the inputs of the ``q k v`` and
    first feed-forward projections, the two residual dropout masks, ``s b h (4 p + 2 m)``. At
    ``p = 2, m = 1`` that is Korthikanti et al.'s ``s b h (10 + 24 / t + 5 a s / (h t))``.
    Sequence parallelism splits the rest along the sequence: everything is divided by ``t``,
    ``s b h (34 / t + 5 a s / (h t))``, and under full recomputation the kept layer input is
    split too (``p s b h / t``).

    Args:
        seq_len, batch, d_model, n_heads: ``s, b, h, a``.
        n_layers: layers ``L`` (the result is ``L`` times one layer's).
        bytes_per_value: ``p``: 2 for 16-bit activations, 4 for float32.
        mask_bytes: ``m``: 1 for the boolean masks of GPU kernels; torch on CPU stores a
            mask of the activations' dtype (``m = p``).
        dropout: whether the layer has dropout (on the attention weights and both residual branches).
        recompute: ``"none"``, ``"selective"`` or ``"full"``.
        tensor_parallel: ``t``, the GPUs one layer is split over; must divide ``n_heads``.
        sequence_parallel: whether the norms and dropouts are split along the sequence too.

    Returns:
        Bytes for ``n_layers`` layers on one GPU (embeddings, output layer and loss not included).

    Raises:
        ValueError: a size is not a positive whole number or a byte count not a positive number
            (the message names it), ``recompute`` is not one of the three names, or
            ``tensor_parallel`` does not divide ``n_heads`` (the message gives both).

    Example: GPT-3's layer (``s, h, a = 2048, 12288, 96``) at ``b = 1`` keeps ``34 s b h +
    5 a s^2 b`` = 2.87e9 bytes; split over ``t = 8`` GPUs, ``23 s b h`` = 5.79e8 bytes on each.
    """
    require_positive(
        integer=True, seq_len=seq_len, batch=batch, d_model=d_model, n_heads=n_heads, n_layers=n_layers
    )
    require_positive(bytes_per_value=bytes_per_value, mask_bytes=mask_bytes)
    require_positive(integer=True, tensor_parallel=tensor_parallel)
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")
    if n_heads % tensor_parallel:
        raise ValueError(
            f"tensor_parallel must divide n_heads, got tensor_parallel={tensor_parallel}, n_heads={n_heads}"
        )
    t = tensor_parallel
    p, m = bytes_per_value, (mask_bytes if dropout else 0)
    sbh, as2b = seq_len * batch * d_model, n_heads * seq_len**2 * batch
    whole = sbh * (4 * p + 2 * m)  # norms' inputs, q k v and first feed-forward inputs, residual masks
    split = sbh * 12 * p  # q, k, v, output projection's input, GELU in and out
    core = (
        as2b * (2 * p + m) if dropout else as2b * p
    )  # softmax output (with dropout: its mask and the dropped copy)
    s_split = t if sequence_parallel else 1  # sequence parallelism splits what tensor parallelism keeps whole
    linear = whole / s_split + split / t
    per_layer = {"none": linear + core / t, "selective": linear, "full": p * sbh / s_split}[recompute]
    return n_layers * per_layer


def saved_tensor_bytes(fn, *args, exclude=(), **kwargs) -> int:
    """Bytes of the tensors autograd saves for the backward pass while ``fn(*args, **kwargs)`` runs.

    Counts each storage once, only those still held when ``fn`` returns (a branch whose
    graph was dropped does not count), and skips the storages of ``exclude`` (pass the
    model's parameters: they are saved by reference, not copied). Use
    ``torch.nn.attention.sdpa_kernel`` around the call to choose the attention kernel.

    Returns:
        The number of bytes.
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    saved = []

    def pack(t):
        saved.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args, **kwargs)
    storages = {}
    for ref in saved:
        t = ref()
        if t is not None and t.untyped_storage().data_ptr() not in skip:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    del out
    return sum(storages.values())


# =========================================================================== 3D parallelism


class GPUMemory(NamedTuple):
    """Memory of one GPU in a parallel training run, in GiB (``2**30`` bytes)."""

    states: float  # weights, gradients, master weights and optimizer states
    activations: float

    @property
    def total(self) -> float:
        """``states + activations``."""
        return self.states + self.activations


def _check_3d(config, tensor, pipeline, data, micro_batch, n_microbatches, recompute) -> None:
    if not isinstance(config, GPTConfig):
        raise ValueError(f"expected a GPTConfig, got {type(config).__name__}")
    require_positive(
        integer=True,
        tensor=tensor,
        pipeline=pipeline,
        data=data,
        micro_batch=micro_batch,
        n_microbatches=n_microbatches,
    )
    if config.n_layers % pipeline or config.n_heads % tensor:
        raise ValueError(
            f"need pipeline | n_layers and tensor | n_heads, got pipeline={pipeline}, "
            f"n_layers={config.n_layers}, tensor={tensor}, n_heads={config.n_heads}"
        )
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")


def parallel_memory_gib(
    config: GPTConfig,
    tensor: int,
    pipeline: int,
    data: int,
    micro_batch: int,
    n_microbatches: int,
    zero_stage: int = 0,
    recompute: str = "none",
    sequence_parallel: bool = False,
) -> GPUMemory:
    """Memory of a GPU of the first pipeline stage when ``GPT(config)`` trains on ``t p d`` GPUs.

    3D parallelism (Narayanan et al., 2021): tensor parallelism of degree ``t`` splits every
    layer, pipeline parallelism of degree ``p`` gives each stage ``L / p`` consecutive layers,
    and ``d`` data-parallel copies of that ``t x p`` grid each run ``m`` micro-batches of ``b``
    sequences of ``T = block_size`` tokens per step, mixed-precision Adam.

    Model states: the :func:`param_count` ``N``, split evenly over the ``t p`` GPUs of a copy,
    16 bytes per parameter, the master weights and Adam's moments (``zero_stage=1``) or more
    sharded over the ``d`` copies as :func:`zero_memory_gib` does. The even split leaves out
    that the first stage also holds the embeddings and the last the output layer.

    Activations: in the 1F1B schedule the first stage starts the forward passes of
    ``min(p, m)`` micro-batches before the first backward pass frees one, each keeping
    :func:`activation_bytes` (16-bit values, 1-byte dropout masks) for its ``L / p`` layers
    split ``t`` ways: with ``m >= p``, ``L`` layers' worth of one micro-batch, whatever ``p``.
    Later stages hold fewer. Left out: the embeddings' and the loss's activations, and under
    full recomputation the one layer rebuilt during its backward pass.

    Args:
        config: the model's shape.
        tensor, pipeline, data: the degrees ``t`` (divides ``n_heads``), ``p`` (divides
            ``n_layers``) and ``d``.
        micro_batch: ``b``, sequences per micro-batch.
        n_microbatches: ``m``, micro-batches per copy and step.
        zero_stage: 0 (no ZeRO) to 3, over the ``d`` copies.
        recompute: ``"none"``, ``"selective"`` or ``"full"``, as :func:`activation_bytes`.
        sequence_parallel: split the norms and dropouts along the sequence too.

    Returns:
        ``GPUMemory(states, activations)`` in GiB; ``.total`` adds them.

    Raises:
        ValueError: ``config`` is not a :class:`~coursekit.gpt.GPTConfig`, a degree or size is
            not a positive whole number (the message names it), ``p`` does not divide the
            layers or ``t`` the heads (the message gives them), or a stage or ``recompute`` is
            not one of the accepted values.

    Example: on one GPU (``t = p = d = 1``) the states are :func:`training_memory_gib` and the
    activations :func:`activation_bytes` of all ``L`` layers for ``b`` sequences.
    """
    _check_3d(config, tensor, pipeline, data, micro_batch, n_microbatches, recompute)
    states = zero_memory_gib(param_count(config) / (tensor * pipeline), data, zero_stage, "bf16", "adam")
    in_flight = min(pipeline, n_microbatches)
    one = activation_bytes(
        config.block_size,
        micro_batch,
        config.d_model,
        config.n_heads,
        config.n_layers // pipeline,
        recompute=recompute,
        tensor_parallel=tensor,
        sequence_parallel=sequence_parallel,
    )
    return GPUMemory(states, in_flight * one / 2**30)


class Collective(NamedTuple):
    """``count`` ring all-reduces per step, each of an ``n_bytes`` buffer over ``n_workers`` GPUs."""

    count: int
    n_bytes: float
    n_workers: int

    @property
    def bytes_sent(self) -> float:
        """Bytes each GPU sends per step (and receives): ``count * 2 (W - 1) / W * n_bytes``."""
        return self.count * 2 * (self.n_workers - 1) / self.n_workers * self.n_bytes

    def seconds(self, bandwidth_gb_s: float, latency_s: float = 0.0) -> float:
        """``count`` times :func:`ring_allreduce_seconds`: the time if none of it overlaps."""
        return self.count * ring_allreduce_seconds(self.n_bytes, self.n_workers, bandwidth_gb_s, latency_s)


def parallel_step_collectives(
    config: GPTConfig,
    tensor: int,
    pipeline: int,
    data: int,
    micro_batch: int,
    n_microbatches: int,
    recompute: str = "none",
) -> dict[str, Collective]:
    """The all-reduces each GPU takes part in during one training step of 3D parallelism.

    ``"tensor"``: every layer sums its ``(b, T, C)`` outputs over the ``t`` GPUs of its group
    after the attention and after the feed-forward block, and the gradients of the two blocks'
    inputs in the backward pass (Shoeybi et al., 2019): 4 all-reduces per layer and
    micro-batch, 6 with full recomputation, which runs the forward pass again. A GPU holds
    ``L / p`` layers and runs ``m`` micro-batches. With sequence parallelism each all-reduce
    becomes an all-gather and a reduce-scatter: the same bytes.

    ``"data"``: once per step, the 16-bit gradients of the GPU's ``N / (t p)`` parameters over
    the ``d`` copies (ZeRO's reduce-scatter and all-gather send the same bytes).

    The pipeline's point-to-point sends (a ``(b, T, C)`` tensor per micro-batch and stage
    boundary, each way) are left out.

    Args:
        config, tensor, pipeline, data, micro_batch, n_microbatches, recompute: as
            :func:`parallel_memory_gib`; activations and gradients in 16 bits.

    Returns:
        ``{"tensor": Collective, "data": Collective}``; ``.bytes_sent`` and ``.seconds(...)``
        give each GPU's bytes and, in the alpha-beta model, time per step.

    Raises:
        ValueError: as :func:`parallel_memory_gib`.

    Example: GPT-3 with ``t = p = 8``, ``d = 16``, ``b = 1``, ``m = 96``: ``12 * 96 * 4 =
    4,608`` all-reduces of 48 MiB inside each server, one of 5.08 GiB across servers.
    """
    _check_3d(config, tensor, pipeline, data, micro_batch, n_microbatches, recompute)
    per_layer = 6 if recompute == "full" else 4
    count = config.n_layers // pipeline * n_microbatches * per_layer
    activation = 2 * micro_batch * config.block_size * config.d_model
    gradients = 2 * param_count(config) / (tensor * pipeline)
    return {"tensor": Collective(count, activation, tensor), "data": Collective(1, gradients, data)}


# =========================================================================== KV cache


def kv_cache_gib(
    n_layers: int, n_heads: int, n_kv_heads: int, d_model: int, seq_len: int, batch: int = 1, bits: int = 16
) -> float:
    """GiB of a KV cache: a key and a value vector per layer, key/value head, token and sequence.

    Args:
        n_layers: ``L``.
        n_heads: query heads ``H`` (they set the head width ``D = C / H``).
        n_kv_heads: key/value heads ``H_kv``: ``H`` for MHA, fewer for GQA, 1 for MQA.
        d_model: ``C``.
        seq_len: cached tokens ``T`` per sequence.
        batch: sequences ``B``.
        bits: bits per cached value (16 for float16/bfloat16, 8 or 4 when quantized; any
            positive whole number).

    Returns:
        The size of the cache in GiB (``2**30`` bytes), not rounded.

    Raises:
        ValueError: an argument is not a positive whole number (the message names it), or
            ``n_heads`` does not divide ``d_model`` or ``n_kv_heads`` does not divide ``n_heads``
            (the message gives the values).

    Example: a Llama-3-8B shape (``L=32, H=32, H_kv=8, C=4096``) at 8192 tokens in 16 bits
    holds ``kv_cache_gib(32, 32, 8, 4096, 8192)`` = 1.0 GiB per sequence.
    """
    require_positive(
        integer=True,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_model=d_model,
        seq_len=seq_len,
        batch=batch,
        bits=bits,
    )
    if d_model % n_heads or n_heads % n_kv_heads:
        raise ValueError(
            f"need n_heads | d_model and n_kv_heads | n_heads, got d_model={d_model}, "
            f"n_heads={n_heads}, n_kv_heads={n_kv_heads}"
        )
    d_head = d_model // n_heads
    values = 2 * n_layers * n_kv_heads * d_head * seq_len * batch  # keys and values
    return values * bits / 8 / 2**30


# =========================================================================== FLOPs


def forward_flops(config: GPTConfig, seq_len: int, batch: int = 1) -> int:
    """FLOPs of the matrix products of ``GPT(config)`` on ``batch`` sequences of ``seq_len`` tokens.

    Each multiply-add is 2 FLOPs. Per token: every weight matrix once, ``L (4 C^2 + 2 C d_ff)``
    in the layers plus ``V C`` in the (tied) output layer; the attention scores ``q k^T`` and
    the weighted values, ``2 T C`` each per layer, over all ``T`` keys (the causal mask
    removes half of them, but the usual kernels compute the full square). Embedding lookups,
    biases, norms and softmax are not matrix products and are not counted, as
    ``torch.utils.flop_counter`` does not count them.

    Returns:
        ``B T (2 (L (4 C^2 + 2 C d_ff) + V C) + 4 L T C)``.
    """
    if not isinstance(config, GPTConfig):
        raise ValueError(f"expected a GPTConfig, got {type(config).__name__}")
    require_positive(integer=True, seq_len=seq_len, batch=batch)
    if seq_len > config.block_size:
        raise ValueError(f"seq_len={seq_len} exceeds the model's block_size={config.block_size}")
    return batch * seq_len * (2 * matmul_weights(config) + 4 * config.n_layers * seq_len * config.d_model)


def matmul_weights(config: GPTConfig) -> int:
    """The entries of the weight matrices that every token of ``GPT(config)`` is multiplied by.

    Per layer the query, key, value and output projections, ``4 C^2``, and the feed-forward's two
    matrices, ``2 C d_ff``; then the (tied) output layer, ``V C``. Biases, norms and the position
    embeddings are left out: they are not matrix products.

    Args:
        config: the model's shape.

    Returns:
        ``L (4 C^2 + 2 C d_ff) + V C``, an ``int``.

    Example: GPT-2 small has 123,532,032 of its 124,439,808 parameters in such matrices.
    """
    if not isinstance(config, GPTConfig):
        raise ValueError(f"expected a GPTConfig, got {type(config).__name__}")
    C = config.d_model
    d_ff = 4 * C if config.d_ff is None else config.d_ff
    return config.n_layers * (4 * C * C + 2 * C * d_ff) + config.vocab_size * C


def counted_flops(fn, *args, **kwargs) -> int:
    """FLOPs that ``torch.utils.flop_counter.FlopCounterMode`` counts while ``fn(*args, **kwargs)`` runs.

    Attention runs through torch's math kernel, a matrix product torch can count: the
    counter has no formula for the fused CPU kernel, whose work would be missed.
    """
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        fn(*args, **kwargs)
    return counter.get_total_flops()


def flops_ratio(
    vocab_size: int, d_model: int, n_layers: int, n_heads: int, seq_len: int, batch: int = 1
) -> float:
    """Measure how far the rule "2 N FLOPs per token" is from a GPT's forward pass.

    Builds ``GPT(GPTConfig(vocab_size, block_size=seq_len, n_layers, n_heads, d_model))`` on
    the ``meta`` device (shapes without values: no memory, no arithmetic), counts the FLOPs of
    one forward pass over ``batch`` sequences of ``seq_len`` tokens with :func:`counted_flops`,
    and divides by ``2 N`` per token, ``N`` the model's parameters (all of them, embeddings
    included).

    Args:
        vocab_size, d_model, n_layers, n_heads: ``V, C, L, H``; ``H`` must divide ``C``.
        seq_len: ``T``, the tokens per sequence (also the model's ``block_size``).
        batch: ``B``, the sequences.

    Returns:
        ``counted FLOPs / (2 N B T)``, a Python ``float``: above 1 where attention's ``4 L T C``
        per token outweighs the parameters that are never multiplied (positions, biases, norms).

    Raises:
        ValueError: a size is not a positive whole number (the message names it), or ``n_heads``
            does not divide ``d_model`` (the message gives both).

    Example: ``flops_ratio(97, 48, 3, 4, 64)`` is 1.1446 (27,144,192 FLOPs for 2 sequences,
    92,640 parameters); ``flops_ratio(50257, 768, 12, 12, 1024)`` (GPT-2 small) is 1.1444.
    """
    require_positive(
        integer=True,
        vocab_size=vocab_size,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        seq_len=seq_len,
        batch=batch,
    )
    if d_model % n_heads:
        raise ValueError(f"n_heads must divide d_model, got d_model={d_model} and n_heads={n_heads}")
    config = GPTConfig(
        vocab_size=vocab_size, block_size=seq_len, n_layers=n_layers, n_heads=n_heads, d_model=d_model
    )
    with torch.device("meta"):
        model = GPT(config)
        idx = torch.zeros(batch, seq_len, dtype=torch.long)  # (B, T)
    n_params = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        flops = counted_flops(model, idx)
    return flops / (2 * n_params * batch * seq_len)


def training_flops(
    n_params: float, n_tokens: float, n_layers: int = 0, seq_len: int = 0, d_model: int = 0
) -> float:
    """Training FLOPs: ``6 N D`` plus, if the shape is given, the attention term ``12 L T C D``.

    The forward pass costs ``2 N`` FLOPs per token (a multiply-add per parameter) and the
    backward pass twice that (gradients for the inputs and for the weights): ``6 N D`` for
    ``D`` tokens (Kaplan et al., 2020). Attention adds ``4 L T C`` per token forward, so
    ``12 L T C`` for training (Chowdhery et al., 2022, appendix B), with ``T`` the context.

    Args:
        n_params: ``N``.
        n_tokens: ``D``.
        n_layers, seq_len, d_model: ``L, T, C`` for the attention term; all 0 to leave it out.

    Returns:
        FLOPs, a float.
    """
    require_positive(n_params=n_params, n_tokens=n_tokens)
    shape = (n_layers, seq_len, d_model)
    if any(shape):
        require_positive(integer=True, n_layers=n_layers, seq_len=seq_len, d_model=d_model)
    return 6 * n_params * n_tokens + 12 * n_layers * seq_len * d_model * n_tokens


#: Peak dense tensor-core throughput, TFLOP/s, in the precision each is named with.
GPU_PEAK_TFLOPS: dict[str, float] = {"V100 (fp16)": 125.0, "A100 (bf16)": 312.0, "H100 SXM (bf16)": 989.0}


def training_days(n_params: float, n_tokens: float, n_gpus: int, gpu_tflops: float, mfu: float) -> float:
    """Days to train ``n_params`` parameters on ``n_tokens`` tokens with ``6 N D`` FLOPs.

    Args:
        n_params: ``N``.
        n_tokens: ``D``.
        n_gpus: number of GPUs.
        gpu_tflops: peak throughput of one GPU in TFLOP/s (``10**12`` FLOP per second).
        mfu: model FLOPs utilisation, the fraction of the peak the training achieves, in ``(0, 1]``.

    Returns:
        The training time in days.

    Raises:
        ValueError: an argument is not a positive number (the message names it), or ``mfu > 1``
            (the message gives it).

    Example: 1 billion parameters on 20 billion tokens, 8 GPUs of 312 TFLOP/s at 50% MFU:
    1.11 days.
    """
    require_positive(n_params=n_params, n_tokens=n_tokens, n_gpus=n_gpus, gpu_tflops=gpu_tflops, mfu=mfu)
    if mfu > 1:
        raise ValueError(f"mfu is a fraction of the peak, in (0, 1], got {mfu}")
    flops = 6 * n_params * n_tokens
    seconds = flops / (n_gpus * gpu_tflops * 1e12 * mfu)
    return seconds / 86400


# =========================================================================== inference

#: A 7B-class decoder for serving arithmetic: the depth, width, heads, vocabulary and context of
#: Llama 2 7B (Touvron et al., 2023) in our GPT's layout, without biases. Its gated feed-forward
#: network holds three ``C x 11008`` matrices, as many weights as our two ``C x 16512``; the
#: learned positions and the tied output layer make 6.62B parameters where Llama 2 7B has 6.74B.
GPT_7B = GPTConfig(
    vocab_size=32000, block_size=4096, n_layers=32, n_heads=32, d_model=4096, d_ff=16512, bias=False
)


class Cost(NamedTuple):
    """What one step of a model costs: FLOPs, and bytes moved between memory and the processor."""

    flops: float
    bytes_moved: float

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved, :func:`arithmetic_intensity` of the two."""
        return arithmetic_intensity(self.flops, self.bytes_moved)


class Roofline(NamedTuple):
    """The roofline's lower bound on a step's time and which resource sets it."""

    seconds: float
    bound: str  # "compute" or "memory"


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte moved: ``flops / bytes_moved``.

    Args:
        flops: the work, in FLOPs.
        bytes_moved: the bytes read from and written to memory to do it.

    Returns:
        FLOPs per byte, a float.

    Raises:
        ValueError: an argument is not a positive number (the message names it).

    Example: a float32 ``n x n`` matrix product does ``2 n^3`` FLOPs on ``3 * 4 n^2`` bytes
    (two inputs read, one output written): at ``n = 1024``, 170.7 FLOPs per byte.
    """
    require_positive(flops=flops, bytes_moved=bytes_moved)
    return flops / bytes_moved


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity at which a processor's two limits meet: ``peak_flops / bandwidth``.

    A step of lower intensity waits for memory (memory-bound), of higher intensity for the
    arithmetic units (compute-bound) (Williams et al., 2009).

    Args:
        peak_flops: the processor's peak, FLOP/s.
        bandwidth: its memory bandwidth, bytes/s.

    Returns:
        FLOPs per byte.

    Example: NVIDIA's H100 SXM, 989e12 FLOP/s dense bf16 and 3.35e12 bytes/s: 295 FLOPs per byte.
    """
    require_positive(peak_flops=peak_flops, bandwidth=bandwidth)
    return peak_flops / bandwidth


def attainable_flops(intensity, peak_flops: float, bandwidth: float):
    """The roofline: ``min(peak_flops, intensity * bandwidth)``, the most FLOP/s a step of that
    intensity can reach.

    Args:
        intensity: FLOPs per byte, a number or an array (arrays broadcast).
        peak_flops: FLOP/s.
        bandwidth: bytes/s.

    Returns:
        FLOP/s, of ``intensity``'s shape (a NumPy float for a number).

    Example: at the H100's ridge of 295 FLOPs per byte and beyond, 989e12; at 1 FLOP per
    byte, 3.35e12.
    """
    require_positive(peak_flops=peak_flops, bandwidth=bandwidth)
    i = np.asarray(intensity, dtype=float)
    if np.any(~(i > 0)):
        raise ValueError(f"intensity must be positive, got {intensity!r}")
    return np.minimum(peak_flops, i * bandwidth)


def roofline_time(flops: float, bytes_moved: float, peak_flops: float, bandwidth: float) -> Roofline:
    """The least time a step can take: ``max(flops / peak_flops, bytes_moved / bandwidth)``.

    The roofline model (Williams et al., 2009) assumes that computing and moving data overlap
    perfectly, so the slower of the two sets the time. ``bound`` names it: ``"compute"`` when
    the step's intensity is at or above the :func:`ridge_point`, else ``"memory"``.

    Args:
        flops: the step's FLOPs.
        bytes_moved: the bytes it moves.
        peak_flops: FLOP/s.
        bandwidth: bytes/s.

    Returns:
        ``Roofline(seconds, bound)``.

    Raises:
        ValueError: an argument is not a positive number (the message names it).

    Example: ``roofline_time(1000, 50, 100, 10)`` is ``Roofline(10.0, "compute")`` (intensity 20
    above the ridge at 10); ``roofline_time(1000, 200, 100, 10)`` is ``Roofline(20.0, "memory")``.
    """
    require_positive(flops=flops, bytes_moved=bytes_moved, peak_flops=peak_flops, bandwidth=bandwidth)
    compute, memory = flops / peak_flops, bytes_moved / bandwidth
    return Roofline(max(compute, memory), "compute" if compute >= memory else "memory")


def _kv_bytes(config: GPTConfig, tokens: int, batch: int, dtype_bytes: float) -> float:
    """Bytes of the keys and values of ``tokens`` positions of ``batch`` sequences, by :func:`kv_cache_gib`."""
    bits = 8 * dtype_bytes
    if not float(bits).is_integer():
        raise ValueError(
            f"dtype_bytes must be a whole number of bits over 8 (4, 2, 1, 0.5, ...), got {dtype_bytes!r}"
        )
    L, H, C = config.n_layers, config.n_heads, config.d_model
    return kv_cache_gib(L, H, H, C, tokens, batch, int(bits)) * 2**30


def _check_inference_args(config, batch, tokens, dtype_bytes, name) -> None:
    if not isinstance(config, GPTConfig):
        raise ValueError(f"expected a GPTConfig, got {type(config).__name__}")
    require_positive(integer=True, batch=batch, **{name: tokens})
    require_positive(dtype_bytes=dtype_bytes)
    if tokens > config.block_size:
        raise ValueError(f"{name}={tokens} exceeds the model's block_size={config.block_size}")


def decode_step_cost(config: GPTConfig, batch: int, context: int, dtype_bytes: float = 2) -> Cost:
    """FLOPs and bytes moved by one decoding step of ``GPT(config)`` with a KV cache.

    The model: each of ``B`` sequences adds one token, which attends to ``S = context``
    positions (the ``S - 1`` cached ones and itself). FLOPs are :func:`forward_flops` of one
    token per sequence at ``S`` keys, ``B (2 W + 4 L S C)`` with ``W`` the
    :func:`matmul_weights`. Bytes: every weight matrix is read once per step, whatever ``B``
    (``W p`` for ``p = dtype_bytes``); each sequence writes its new key and value and reads
    the ``S`` cached ones, new included (``2 L C (S + 1) B p``, multi-head attention). Left
    out: biases, norms and embedding rows (a fraction of a percent of the weights), and the
    activations, which are ``B C`` numbers per layer and can stay in the processor's caches.

    Args:
        config: the model's shape.
        batch: ``B``, the sequences decoded together.
        context: ``S``, the positions the new token attends to, ``1 .. block_size``.
        dtype_bytes: ``p``, bytes per weight and per cached value (2 for fp16/bf16, 4 for fp32).

    Returns:
        ``Cost(flops, bytes_moved)``; ``cost.intensity`` is FLOPs per byte.

    Raises:
        ValueError: ``config`` is not a :class:`~coursekit.gpt.GPTConfig`, ``batch`` or
            ``context`` is not a positive whole number or ``context`` exceeds ``block_size``
            (the message gives both), or ``dtype_bytes`` is not a positive number of whole bits.

    Example: at ``context=1`` the FLOPs are ``forward_flops(config, 1, batch)``. GPT-2 small at
    ``B = 1`` in fp16 does 2 FLOPs per weight of 2 bytes: an intensity of about 1.
    """
    _check_inference_args(config, batch, context, dtype_bytes, "context")
    L, C = config.n_layers, config.d_model
    flops = batch * (2 * matmul_weights(config) + 4 * L * context * C)
    moved = matmul_weights(config) * dtype_bytes + _kv_bytes(config, context + 1, batch, dtype_bytes)
    return Cost(flops, moved)


def prefill_cost(config: GPTConfig, batch: int, seq_len: int, dtype_bytes: float = 2) -> Cost:
    """FLOPs and bytes moved by the prefill of ``batch`` prompts of ``seq_len`` tokens.

    The model: one forward pass over all ``B T`` prompt tokens, :func:`forward_flops`
    ``B T (2 W + 4 L T C)``; every weight matrix is read once (``W p``) and the keys and values
    of every prompt token are written to the cache (``2 L C T B p``). Activations are left out,
    as in :func:`decode_step_cost`; they make the real intensity somewhat lower.

    Args:
        config: the model's shape.
        batch: ``B``, the prompts.
        seq_len: ``T``, the tokens per prompt, ``1 .. block_size``.
        dtype_bytes: ``p``, bytes per weight and per cached value.

    Returns:
        ``Cost(flops, bytes_moved)``.

    Raises:
        ValueError: as :func:`decode_step_cost`, with ``seq_len`` for ``context``.

    Example: the intensity grows with ``B T`` while the weights dominate the bytes. At ``B = 1``
    in 2 bytes it is exactly ``T``: the bytes are ``2 W + 4 L C T``, the FLOPs ``T`` times that
    (the attention's ``4 L T C`` FLOPs per token equal the cache's ``4 L C T`` bytes). GPT-2 small
    at ``T = 512``: 512 FLOPs per byte.
    """
    _check_inference_args(config, batch, seq_len, dtype_bytes, "seq_len")
    flops = forward_flops(config, seq_len, batch)
    moved = matmul_weights(config) * dtype_bytes + _kv_bytes(config, seq_len, batch, dtype_bytes)
    return Cost(flops, moved)


def decode_compute_bound_batch(
    config: GPTConfig, context: int, peak_flops: float, bandwidth: float, dtype_bytes: float = 2
) -> int | None:
    """The smallest batch at which a decoding step reaches the :func:`ridge_point`, or ``None``.

    In :func:`decode_step_cost` the FLOPs grow as ``a B`` and the bytes as ``w + b B``: the
    weights ``w`` are read once, the cache ``b`` once per sequence. The intensity
    ``a B / (w + b B)`` rises with ``B`` towards ``a / b`` and reaches the ridge ``R`` at
    ``B = R w / (a - R b)`` when ``a > R b``; otherwise the step stays memory-bound at every
    batch, because each sequence's cache is read for its own token only (Pope et al., 2022).

    Args:
        config: the model's shape.
        context: ``S``, as :func:`decode_step_cost`.
        peak_flops: FLOP/s.
        bandwidth: bytes/s.
        dtype_bytes: ``p``.

    Returns:
        The smallest ``B`` whose step is compute-bound (:func:`roofline_time`), or ``None``.

    Raises:
        ValueError: as :func:`decode_step_cost` and :func:`ridge_point`.

    Example: GPT-2 small in bf16 on an H100 SXM (ridge 295 FLOPs per byte) needs a batch of 324
    at ``context=1``; at ``context=1024`` its intensity stays below 7.6 FLOPs per byte: ``None``.
    """
    ridge = ridge_point(peak_flops, bandwidth)
    one, two = (
        decode_step_cost(config, 1, context, dtype_bytes),
        decode_step_cost(config, 2, context, dtype_bytes),
    )
    a, b = one.flops, two.bytes_moved - one.bytes_moved
    w = one.bytes_moved - b
    if a <= ridge * b:
        return None
    batch = max(1, math.ceil(ridge * w / (a - ridge * b)))
    while batch > 1 and a * (batch - 1) >= ridge * (w + b * (batch - 1)):  # guard the float rounding
        batch -= 1
    while a * batch < ridge * (w + b * batch):
        batch += 1
    return batch


def max_batch_for_kv_cache(
    config: GPTConfig, memory_bytes: float, context: int, dtype_bytes: float = 2
) -> int:
    """How many sequences of ``context`` tokens fit in the KV cache once the weights are loaded.

    ``(memory_bytes - N p) // (2 L C S p)``: :func:`param_count` ``N`` weights of ``p`` bytes,
    then :func:`kv_cache_gib` per sequence (multi-head attention). Activations, the allocator's
    slack and the framework's own buffers are left out, so a real server fits fewer.

    Args:
        config: the model's shape.
        memory_bytes: the accelerator's memory in bytes (a GPU sold as "80GB": ``80 * 2**30``,
            as the notation page says).
        context: ``S``, the tokens cached per sequence, ``1 .. block_size``.
        dtype_bytes: ``p``, bytes per weight and per cached value.

    Returns:
        The number of sequences, an ``int`` (0 if the weights fit but no sequence does).

    Raises:
        ValueError: the weights alone need more than ``memory_bytes`` (the message gives both),
            or an argument is invalid as in :func:`decode_step_cost`.

    Example: :data:`GPT_7B` in bf16 on ``80 * 2**30`` bytes, at ``context=4096``: the weights take
    12.3 GiB, a sequence's cache 2.0 GiB, and 33 sequences fit.
    """
    _check_inference_args(config, 1, context, dtype_bytes, "context")
    require_positive(memory_bytes=memory_bytes)
    weights = param_count(config) * dtype_bytes
    if weights > memory_bytes:
        raise ValueError(
            f"the weights alone need {weights:.4g} bytes, more than memory_bytes={memory_bytes:.4g}"
        )
    return int((memory_bytes - weights) // _kv_bytes(config, context, 1, dtype_bytes))


# =========================================================================== scaling laws


@dataclass(frozen=True)
class KaplanFit:
    """``L(N, D) = ((N_c / N)^(alpha_N / alpha_D) + D_c / D)^alpha_D`` (Kaplan et al., 2020, eq. 1.5).

    ``N`` counts non-embedding parameters, ``D`` tokens, the loss is in nats per token on
    their WebText2 test set. With ``D`` infinite it is ``(N_c / N)^alpha_N``, with ``N``
    infinite ``(D_c / D)^alpha_D``: the forms of eqs. 1.1 and 1.2, with the constants of this
    joint fit, which differ from those of the paper's separate fits of ``L(N)`` and ``L(D)``.
    """

    alpha_N: float
    N_c: float
    alpha_D: float
    D_c: float

    def loss(self, n_params=math.inf, n_tokens=math.inf):
        """The loss of ``n_params`` non-embedding parameters trained on ``n_tokens`` tokens (arrays broadcast)."""
        n, d = np.asarray(n_params, dtype=float), np.asarray(n_tokens, dtype=float)
        if np.any(n <= 0) or np.any(d <= 0):
            raise ValueError(f"n_params and n_tokens must be positive, got {n_params!r} and {n_tokens!r}")
        return ((self.N_c / n) ** (self.alpha_N / self.alpha_D) + self.D_c / d) ** self.alpha_D


@dataclass(frozen=True)
class ChinchillaFit:
    """``L(N, D) = E + A / N^alpha + B / D^beta`` (Hoffmann et al., 2022, approach 3).

    ``N`` counts all parameters, ``D`` training tokens, the loss is in nats per token on
    their MassiveText data. :meth:`optimal` minimises it under the budget ``C = 6 N D``.
    """

    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def loss(self, n_params, n_tokens):
        """The fitted loss (arrays broadcast)."""
        n, d = np.asarray(n_params, dtype=float), np.asarray(n_tokens, dtype=float)
        if np.any(n <= 0) or np.any(d <= 0):
            raise ValueError(f"n_params and n_tokens must be positive, got {n_params!r} and {n_tokens!r}")
        return self.E + self.A / n**self.alpha + self.B / d**self.beta

    def optimal(self, flops):
        """The compute-optimal ``(N, D)`` for a budget of ``flops = 6 N D`` FLOPs.

        Setting the derivative of ``L(N, C / (6 N))`` to zero gives
        ``N = G (C / 6)^a`` and ``D = (C / 6)^b / G`` with ``a = beta / (alpha + beta)``,
        ``b = alpha / (alpha + beta)`` and ``G = (alpha A / (beta B))^(1 / (alpha + beta))``.
        """
        c = np.asarray(flops, dtype=float)
        if np.any(c <= 0):
            raise ValueError(f"flops must be positive, got {flops!r}")
        s = self.alpha + self.beta
        G = (self.alpha * self.A / (self.beta * self.B)) ** (1 / s)
        return G * (c / 6) ** (self.beta / s), (c / 6) ** (self.alpha / s) / G


#: Kaplan et al. (2020), eq. 1.5 with its fitted constants (their Table 2, "Fits to L(N, D)").
#: The separate fits of L(N) and L(D) alone (eqs. 1.1 and 1.2) give N_c = 8.8e13, alpha_D = 0.095
#: and D_c = 5.4e13 instead; they are not the constants of eq. 1.5.
KAPLAN = KaplanFit(alpha_N=0.076, N_c=6.4e13, alpha_D=0.103, D_c=1.8e13)
#: Hoffmann et al. (2022), the published constants of approach 3.
CHINCHILLA = ChinchillaFit(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
#: Besiroglu et al. (2024), approach 3 refitted to data read off Hoffmann et al.'s figures.
CHINCHILLA_REFIT = ChinchillaFit(E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)


def tokens_per_param_rule(flops, tokens_per_param: float = 20.0):
    """The allocation ``D = r N`` under ``6 N D = C``: ``N = sqrt(C / (6 r))``, ``D = r N``.

    ``r = 20`` is Chinchilla's own ratio (70B parameters on 1.4T tokens, Hoffmann et al., 2022).
    Returns ``(N, D)`` (arrays broadcast).
    """
    c = np.asarray(flops, dtype=float)
    if np.any(c <= 0):
        raise ValueError(f"flops must be positive, got {flops!r}")
    require_positive(tokens_per_param=tokens_per_param)
    n = np.sqrt(c / (6 * tokens_per_param))
    return n, tokens_per_param * n


def chinchilla_optimal(
    flops: float, A: float = 406.4, B: float = 410.7, alpha: float = 0.34, beta: float = 0.28
) -> tuple[float, float]:
    """The compute-optimal parameters and tokens for a budget of ``flops = 6 N D`` FLOPs.

    Minimises Hoffmann et al.'s (2022) fit ``L(N, D) = E + A / N^alpha + B / D^beta`` (``E``
    does not move the minimum) along ``D = flops / (6 N)``: setting the derivative in ``N`` to
    zero gives ``alpha A / N^alpha = beta B / D^beta``, whence ``N = G (flops / 6)^(beta / (alpha + beta))``
    and ``D = (flops / 6)^(alpha / (alpha + beta)) / G`` with ``G = (alpha A / (beta B))^(1 / (alpha + beta))``.
    The defaults are the paper's published constants of approach 3.

    Args:
        flops: the budget ``C`` in FLOPs.
        A, B, alpha, beta: the fit's constants.

    Returns:
        ``(N, D)``, two Python floats with ``6 N D == flops``.

    Raises:
        ValueError: an argument is not a positive number (the message names it).

    Example: ``chinchilla_optimal(5.76e23)``, Gopher's budget, gives about 32B parameters on
    3.0T tokens (Chinchilla itself, trained with that budget, had 70B on 1.4T).
    """
    require_positive(flops=flops, A=A, B=B, alpha=alpha, beta=beta)
    s = alpha + beta
    G = (alpha * A / (beta * B)) ** (1 / s)
    n_params = G * (flops / 6) ** (beta / s)
    n_tokens = (flops / 6) ** (alpha / s) / G
    return float(n_params), float(n_tokens)
