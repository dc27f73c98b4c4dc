"""Attention time: the course's reference implementation against PyTorch's fused kernel, in one run.

    .venv/bin/python benchmarks/attention.py [--quick] [--T 128 512 1024 2048] [--json out.json]

For each length ``T``: ``q, k, v`` of shape ``(B, H, T, D) = (8, 8, T, 64)`` in float32, causal,
one thread. Timed (median of ``--repeat`` calls after one warm-up call):

* ``coursekit``: Chapter 1's ``coursekit.attention.scaled_dot_product_attention``, which
  materialises the scores, masks them and applies a softmax (it also returns the weights);
* ``torch``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, the fused kernel;
* ``tiled``: Chapter 10's ``coursekit.long_context.tiled_attention`` (online softmax, tiles of 256),
  exact like the others but written in PyTorch operations.

The outputs are checked to agree (float32, within 1e-4). Peak memory at long lengths is
measured separately by ``benchmarks/long_context.py``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from coursekit import attention, long_context  # noqa: E402

B, H, D = 8, 8, 64


def median_time(fn, repeat: int) -> tuple[torch.Tensor, float]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def run(lengths: list[int], repeat: int) -> dict:
    torch.set_num_threads(1)
    rows = []
    for T in lengths:
        g = torch.Generator().manual_seed(T)
        q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
        mask = attention.causal_mask(T)
        ours, t_ours = median_time(
            lambda: attention.scaled_dot_product_attention(q, k, v, mask=mask)[0], repeat
        )
        fused, t_torch = median_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), repeat)
        tiled, t_tiled = median_time(
            lambda: long_context.tiled_attention(q, k, v, causal=True, block_q=256, block_k=256), repeat
        )
        for name, out in (("coursekit", ours), ("tiled", tiled)):
            err = (out - fused).abs().max().item()
            if err > 1e-4:
                raise AssertionError(f"{name} differs from torch by {err:.2e} at T={T}")
        rows.append(
            {
                "T": T,
                "coursekit_s": t_ours,
                "torch_s": t_torch,
                "tiled_s": t_tiled,
                "coursekit_over_torch": t_ours / t_torch,
                "tiled_over_torch": t_tiled / t_torch,
            }
        )
    return {
        "machine": f"{platform.machine()}, 1 thread, torch {torch.__version__}",
        "shape": {"B": B, "H": H, "D": D, "dtype": "float32", "causal": True},
        "repeat": repeat,
        "rows": rows,
    }


def main() -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--T", type=int, nargs="+", default=[128, 512, 1024, 2048])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--quick", action="store_true", help="T = 64 and 128, two repeats: checks that it runs"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out = run([64, 128] if args.quick else args.T, 2 if args.quick else args.repeat)
    print(f"# {out['machine']}; (B, H, D) = ({B}, {H}, {D}), causal, median of {out['repeat']}")
    print(
        f"{'T':>6} {'coursekit ms':>13} {'torch ms':>9} {'tiled ms':>9} {'coursekit/torch':>16} {'tiled/torch':>12}"
    )
    for r in out["rows"]:
        print(
            f"{r['T']:>6} {r['coursekit_s'] * 1e3:13.2f} {r['torch_s'] * 1e3:9.2f} {r['tiled_s'] * 1e3:9.2f} "
            f"{r['coursekit_over_torch']:15.1f}x {r['tiled_over_torch']:11.1f}x"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
