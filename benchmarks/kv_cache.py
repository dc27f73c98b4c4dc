"""Decoding speed with and without a KV cache, ours against Hugging Face ``generate``, in one run.

    .venv/bin/python benchmarks/kv_cache.py [--quick] [--new 256 512] [--repeat 3] [--json out.json]

The model is a small GPT-2 shape (4 layers, 4 heads, 256 wide, a 1024-token context so
that 512 new tokens fit) with random weights: speed does
not depend on the values. The same weights are loaded into ``transformers.GPT2LMHeadModel``
through :func:`coursekit.gpt.to_hf_state_dict`. Greedy decoding of a 16-token prompt,
batch 1, float32, for each number of new tokens:

* ours with the cache (``coursekit.decoding.generate``) and without (each step re-runs
  the whole context);
* Hugging Face ``generate(do_sample=False)`` with and without ``use_cache``.

Every run must produce the same tokens (checked). Cached times are medians of ``--repeat``
runs (uncached runs take far longer and vary less: one each);
``speedup`` is uncached time / cached time, ``vs HF`` is our cached tokens/s / theirs.
Targets (issue 6): speedup >= 7 at 512 new tokens, and vs HF >= 1.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coursekit import decoding, gpt  # noqa: E402

SHAPE = gpt.GPTConfig(vocab_size=96, block_size=1024, n_layers=4, n_heads=4, d_model=256)


def median_time(repeats: int, fn):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def run(new_tokens: list[int], repeats: int, threads: int, cfg: gpt.GPTConfig = SHAPE) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    ours = gpt.GPT(cfg).eval()
    hf = GPT2LMHeadModel(GPT2Config(**gpt.hf_config_kwargs(cfg))).eval()
    hf.load_state_dict(gpt.to_hf_state_dict(ours.state_dict()))
    prompt = torch.randint(0, cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(prompt)
    rows = []
    for n in new_tokens:

        def hf_gen(use_cache):
            return lambda: hf.generate(
                prompt,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                use_cache=use_cache,
                pad_token_id=0,
            )

        with torch.no_grad():
            a, t_ours = median_time(repeats, lambda: decoding.generate(ours, prompt, n))
            b, t_ours_nc = median_time(1, lambda: decoding.generate(ours, prompt, n, use_cache=False))
            c, t_hf = median_time(repeats, hf_gen(True))
            d, t_hf_nc = median_time(1, hf_gen(False))
        if not (torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d)):
            raise AssertionError(f"decoders disagree at {n} new tokens")
        rows.append(
            dict(
                new_tokens=n,
                ours_cached_tok_s=n / t_ours,
                ours_uncached_tok_s=n / t_ours_nc,
                ours_speedup=t_ours_nc / t_ours,
                hf_cached_tok_s=n / t_hf,
                hf_uncached_tok_s=n / t_hf_nc,
                hf_speedup=t_hf_nc / t_hf,
                ours_vs_hf=t_hf / t_ours,
            )
        )
    return {
        "machine": f"{platform.machine()}, {threads} threads, torch {torch.__version__}",
        "shape": dict(
            n_layers=cfg.n_layers, n_heads=cfg.n_heads, d_model=cfg.d_model, block_size=cfg.block_size
        ),
        "prompt": 16,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--new", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--quick", action="store_true", help="16 and 32 new tokens, one repeat: checks that it runs"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    new, repeats = ([16, 32], 1) if args.quick else (args.new, args.repeat)
    out = run(new, repeats, args.threads)
    print(f"# {out['machine']}; GPT {out['shape']}, prompt {out['prompt']}, greedy, batch 1")
    print(
        "| new tokens | ours cached tok/s | ours uncached | speedup | HF cached tok/s | HF "
        "uncached | HF speedup | ours vs HF |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in out["rows"]:
        print(
            f"| {r['new_tokens']} | {r['ours_cached_tok_s']:.0f} | {r['ours_uncached_tok_s']:.0f} | "
            f"{r['ours_speedup']:.1f}x | {r['hf_cached_tok_s']:.0f} | {r['hf_uncached_tok_s']:.0f} | "
            f"{r['hf_speedup']:.1f}x | {r['ours_vs_hf']:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
