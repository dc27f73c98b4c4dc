"""Appendix (transformer arithmetic): the roofline of the machine the book is built on, measured.

The roofline model (Williams et al., 2009) needs two numbers for a processor, its peak
arithmetic rate and its memory bandwidth; :mod:`coursekit.arithmetic` turns them into bounds on
a step's time. Here they are measured with PyTorch, on a fixed number of CPU threads:

- :func:`measure_peak_flops`: float32 square matrix products, the fastest thing a CPU does, as
  FLOP/s (``2 n^3`` FLOPs per product), the median of a few repeats at each size;
- :func:`measure_bandwidth`: a copy of a float32 tensor larger than the caches, as bytes
  read plus bytes written per second (the convention of the STREAM benchmark's "copy");
- :func:`decode_flops_per_second`: what one decoding step of a :class:`~coursekit.gpt.GPT` with
  its KV cache reaches, in the FLOPs :func:`~coursekit.arithmetic.decode_step_cost` counts.

Timings vary with the machine and its load: the book's page measures them when it is built and
glues what it measured; the tests check only what does not depend on the clock. All three take
about two seconds at their defaults on one thread.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from time import perf_counter

import torch

from coursekit.arithmetic import decode_step_cost, require_positive
from coursekit.gpt import GPT

__all__ = ["num_threads", "measure_peak_flops", "measure_bandwidth", "decode_flops_per_second"]


@contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(n)``, then restore the previous setting.

    Raises:
        ValueError: ``n`` is not a positive whole number.
    """
    require_positive(integer=True, num_threads=n)
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _median_seconds(fn, repeats: int) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``fn``, after one call that is not timed."""
    fn()
    times = []
    for _ in range(repeats):
        start = perf_counter()
        fn()
        times.append(perf_counter() - start)
    return statistics.median(times)


def measure_peak_flops(sizes: Sequence[int] = (512, 1024), repeats: int = 5, threads: int = 1) -> float:
    """The fastest float32 matrix-product rate measured: ``max over n of 2 n^3 / median time``.

    Args:
        sizes: the ``n`` of the ``n x n`` products; each is timed ``repeats`` times after a warm-up.
        repeats: timed products per size.
        threads: PyTorch's intra-op threads during the measurement (restored afterwards).

    Returns:
        FLOP/s, a float.

    Raises:
        ValueError: ``sizes`` is empty or holds a size that is not a positive whole number, or
            ``repeats`` or ``threads`` is not one (the message names it).
    """
    if not sizes:
        raise ValueError("sizes must hold at least one matrix size, got none")
    for n in sizes:
        require_positive(integer=True, size=n)
    require_positive(integer=True, repeats=repeats)
    generator = torch.Generator().manual_seed(0)
    best = 0.0
    with num_threads(threads):
        for n in sizes:
            a = torch.randn(n, n, generator=generator)  # (n, n)
            b = torch.randn(n, n, generator=generator)  # (n, n)
            out = torch.empty(n, n)
            seconds = _median_seconds(lambda: torch.mm(a, b, out=out), repeats)
            best = max(best, 2 * n**3 / seconds)
    return best


def measure_bandwidth(n_bytes: int = 512 * 2**20, repeats: int = 5, threads: int = 1) -> float:
    """Memory bandwidth from copying a float32 tensor of ``n_bytes``: ``2 n_bytes / median time``.

    The copy reads ``n_bytes`` and writes ``n_bytes``; at the default 512 MiB both tensors are
    larger than a CPU's caches, so the data comes from memory. (Most CPUs also read
    the destination before writing it, traffic the convention does not count.)

    Args:
        n_bytes: the size of the source tensor (rounded down to whole float32 values).
        repeats: timed copies, after one untimed copy that also maps the destination's pages.
        threads: PyTorch's intra-op threads during the measurement (restored afterwards).

    Returns:
        Bytes per second, a float.

    Raises:
        ValueError: ``n_bytes`` is below 4 bytes, or ``repeats`` or ``threads`` is not a
            positive whole number (the message names it).
    """
    require_positive(integer=True, n_bytes=n_bytes, repeats=repeats)
    if n_bytes < 4:
        raise ValueError(f"n_bytes must hold at least one float32 value (4 bytes), got {n_bytes}")
    with num_threads(threads):
        src = torch.ones(n_bytes // 4)
        dst = torch.empty_like(src)
        seconds = _median_seconds(lambda: dst.copy_(src), repeats)
    return 2 * src.nbytes / seconds


def decode_flops_per_second(
    model: GPT, batch: int, steps: int = 3, generator: torch.Generator | None = None, threads: int = 1
) -> float:
    """The FLOP/s that decoding steps of ``model`` reach, with its KV cache, from an empty cache.

    Runs ``steps + 1`` steps of one token per sequence (the first, from the empty cache, is not
    timed), so the timed steps attend to ``2 .. steps + 1`` positions; each step's FLOPs are
    :func:`~coursekit.arithmetic.decode_step_cost`'s, and the result is the median over the
    steps of FLOPs over seconds.

    Args:
        model: a :class:`~coursekit.gpt.GPT` (put in ``eval`` mode here; its weights' values do
            not matter to the time).
        batch: ``B``, the sequences decoded together.
        steps: timed steps, at most ``block_size - 1``.
        generator: draws the token ids (a fixed seed when ``None``).
        threads: PyTorch's intra-op threads during the measurement (restored afterwards).

    Returns:
        FLOP/s, a float.

    Raises:
        ValueError: ``model`` is not a ``GPT``, ``batch``, ``steps`` or ``threads`` is not a
            positive whole number, or ``steps + 1`` exceeds ``block_size`` (the message gives both).
    """
    if not isinstance(model, GPT):
        raise ValueError(f"expected a coursekit.gpt.GPT, got {type(model).__name__}")
    require_positive(integer=True, batch=batch, steps=steps)
    cfg = model.cfg
    if steps + 1 > cfg.block_size:
        raise ValueError(f"steps + 1 = {steps + 1} positions exceed the model's block_size={cfg.block_size}")
    generator = torch.Generator().manual_seed(0) if generator is None else generator
    tokens = torch.randint(0, cfg.vocab_size, (batch, steps + 1), generator=generator)  # (B, steps + 1)
    model.eval()
    rates = []
    with num_threads(threads), torch.no_grad():
        cache = model.init_cache(batch, steps + 1)
        model(tokens[:, :1], cache)  # (B, 1) from the empty cache: warms up, not timed
        for t in range(1, steps + 1):
            start = perf_counter()
            model(tokens[:, t : t + 1], cache)  # (B, 1), attends to t + 1 positions
            seconds = perf_counter() - start
            rates.append(decode_step_cost(cfg, batch, t + 1).flops / seconds)
    return statistics.median(rates)
