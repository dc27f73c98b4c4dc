"""BPE training and encoding speed: coursekit against a naive recount, Hugging Face
``tokenizers`` and ``tiktoken``, measured side by side in one run.

    .venv/bin/python benchmarks/bpe.py [--sizes 512 1024 4096] [--quick] [--json out.json]

Corpus: the Python reference manual that ships with CPython (``pydoc_data.topics``,
about 465 KB), GPT-4 split pattern. For each vocabulary size:

* ``coursekit.bpe.train`` (incremental pair counts);
* ``coursekit.bpe.train_naive`` (recounts every chunk after every merge; skipped above
  1024 unless ``--naive-all``, it grows linearly with the number of merges);
* ``tokenizers`` (Rust) with the same regex split and byte-level alphabet.

Encoding: coursekit (cold cache, then warm) against ``tiktoken`` built from the very same
merges, in MB/s of UTF-8 input; the token ids are checked to be identical.
Targets (issue 5): 1024 tokens in under 2 s, encoding at 2 MB/s or more.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coursekit import bpe  # noqa: E402


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def median_of(repeats: int, fn, *args, **kwargs):
    """``(result of the last call, median seconds)`` over ``repeats`` calls (this VM's timings are noisy)."""
    times = []
    for _ in range(repeats):
        out, seconds = timed(fn, *args, **kwargs)
        times.append(seconds)
    return out, statistics.median(times)


def hf_train(text: str, vocab_size: int) -> float:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(bpe.GPT4_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
    )
    _, seconds = timed(tok.train_from_iterator, [text], trainer=trainer)
    return seconds


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 4096])
    parser.add_argument("--naive-all", action="store_true", help="also time the naive loop above 1024 tokens")
    parser.add_argument(
        "--quick", action="store_true", help="a 50 KB corpus and sizes 300, 512: checks that it runs"
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="median of this many runs (the naive loop runs once)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    text = bpe.python_docs_text()
    sizes = args.sizes
    if args.quick:
        text, sizes = text[:50_000], [300, 512]
    mb = len(text.encode("utf-8")) / 1e6
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"corpus: pydoc_data.topics, {len(text):,} characters ({mb:.3f} MB), GPT-4 split pattern\n")

    rows = []
    print(
        f"{'vocab':>6} {'coursekit s':>12} {'naive s':>9} {'tokenizers s':>13} {'naive/ours':>11} "
        f"{'ours/tokenizers':>16}"
    )
    for size in sizes:
        tok, ours = median_of(args.repeat, bpe.train, text, size, "gpt4")
        naive = None
        if size <= 1024 or args.naive_all:
            merges, naive = timed(bpe.train_naive, text, size, "gpt4")
            assert merges == tok.merges, "the naive loop learnt different merges"
        hf = statistics.median(hf_train(text, size) for _ in range(args.repeat))
        rows.append({"vocab_size": size, "coursekit_s": ours, "naive_s": naive, "tokenizers_s": hf})
        naive_txt = f"{naive:9.2f}" if naive is not None else f"{'-':>9}"
        ratio = f"{naive / ours:10.1f}x" if naive is not None else f"{'-':>11}"
        print(f"{size:>6} {ours:12.3f} {naive_txt} {hf:13.3f} {ratio} {ours / hf:15.1f}x")

    import tiktoken

    tok = bpe.train(text, sizes[min(1, len(sizes) - 1)], "gpt4")
    twin = tiktoken.Encoding(
        "coursekit", pat_str=tok.pattern, mergeable_ranks=tok.mergeable_ranks(), special_tokens={}
    )
    cold_ids, cold = median_of(
        args.repeat, lambda: bpe.Tokenizer(tok.merges, tok.pattern).encode_ordinary(text)
    )  # empty cache
    warm_ids, warm = median_of(args.repeat, tok.encode_ordinary, text)  # the first run fills the cache
    twin_ids, tik = median_of(args.repeat, twin.encode_ordinary, text)
    assert cold_ids == warm_ids == twin_ids, "coursekit and tiktoken disagree"
    encoding = {
        "vocab_size": tok.vocab_size,
        "coursekit_cold_MBps": mb / cold,
        "coursekit_warm_MBps": mb / warm,
        "tiktoken_MBps": mb / tik,
        "identical_ids": True,
    }
    print(f"\nmedians of {args.repeat} runs (the naive loop: one run)")
    print(
        f"encoding ({tok.vocab_size} tokens, {len(cold_ids):,} ids, identical to tiktoken): "
        f"coursekit {mb / cold:.2f} MB/s cold, {mb / warm:.2f} MB/s warm cache; tiktoken {mb / tik:.2f} MB/s "
        f"({cold / tik:.1f}x faster than our cold run)"
    )
    result = {"corpus_chars": len(text), "training": rows, "encoding": encoding}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
