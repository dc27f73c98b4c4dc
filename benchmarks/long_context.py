"""Peak memory and time of one attention call at long sequence lengths: naive vs tiled vs torch.

    .venv/bin/python benchmarks/long_context.py [--quick] [--T 4096 8192 16384] [--json out.json]

Each measurement runs in a fresh Python process on one thread (``coursekit.experiments.
long_context.attention_peak_memory``): ``q, k, v`` of shape ``(1, 1, T, 64)`` in float32, one head, not
causal. The process resets its resident-set high-water mark (``/proc/self/clear_refs``), makes
the call, and reports how far the mark rose, so the number is the most memory the call held at
any moment, its ``(T, 64)`` output included. The methods:

* ``naive``: Chapter 1's ``scaled_dot_product_attention``, which materialises the ``(T, T)``
  scores and their softmax;
* ``tiled``: ``coursekit.long_context.tiled_attention`` with square tiles of ``--block`` (512);
* ``torch``: ``torch.nn.functional.scaled_dot_product_attention`` (on CPU a fused,
  FlashAttention-style kernel).

``scores_bytes`` is the size of one float32 ``(T, T)`` matrix, for reference. The chapter's page
reads the committed ``benchmarks/results/attention_memory.json`` (written by ``benchmarks/run.py``)
and repeats a smaller measurement live.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from coursekit.experiments.long_context import attention_peak_memory  # noqa: E402

METHODS = ("naive", "tiled", "torch")


def run(lengths: list[int], block: int, D: int = 64) -> dict:
    rows = []
    for T in lengths:
        for method in METHODS:
            r = attention_peak_memory(method, T, D=D, block_size=block)
            if not r["finite"]:
                raise AssertionError(f"{method} at T={T} gave a non-finite output")
            rows.append(
                dict(
                    T=T,
                    method=method,
                    peak_bytes=r["peak_bytes"],
                    seconds=r["seconds"],
                    scores_bytes=T * T * 4,
                    measure=r["measure"],
                )
            )
    return {
        "machine": f"{platform.machine()}, 1 thread, torch {torch.__version__}",
        "shape": dict(batch=1, heads=1, D=D, dtype="float32", causal=False),
        "block": block,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--T", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--block", type=int, default=512)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="T = 1024 only: checks that it runs (each measurement is a fresh process)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out = run([1024] if args.quick else args.T, args.block)
    print(f"# {out['machine']}; {out['shape']}, tiles of {out['block']}")
    print("| T | method | peak MiB | seconds | one (T, T) float32 matrix, MiB |")
    print("|---|---|---|---|---|")
    for r in out["rows"]:
        print(
            f"| {r['T']} | {r['method']} | {r['peak_bytes'] / 2**20:.1f} | {r['seconds']:.2f} | "
            f"{r['scores_bytes'] / 2**20:.0f} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
