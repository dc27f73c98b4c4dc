"""Run every benchmark and write one report (markdown and JSON) of ratios measured side by side.

    .venv/bin/python benchmarks/run.py            # full: about 17 minutes on a quiet 2-core machine
    .venv/bin/python benchmarks/run.py --quick    # every benchmark at toy size: checks that each runs
    .venv/bin/python benchmarks/run.py --only attention decoding

Each benchmark is its own script (``benchmarks/<name>.py``) run in a fresh process with
``--json``; within a script, the things compared are measured in the same run on the same
machine, so their *ratios* are meaningful even where absolute times move with the load.
The report goes to ``benchmarks/results/report.{md,json}`` (``--out`` elsewhere), with the
machine described at the top; each script's raw JSON lands beside it. The book's
Performance appendix is generated from ``report.json``. Quick runs write to a temporary
folder unless ``--out`` is given, so they never overwrite the committed results.

Run the full mode on a quiet machine: other processes on the same cores distort every
timing (the ratios less than the absolute numbers, but still).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _attention(r: dict) -> list[tuple[str, str]]:
    last = r["rows"][-1]
    return [
        (
            f"coursekit reference / torch fused attention time, T={last['T']}",
            f"{last['coursekit_over_torch']:.1f}x",
        ),
        (
            f"tiled (online softmax) / torch fused attention time, T={last['T']}",
            f"{last['tiled_over_torch']:.1f}x",
        ),
    ]


def _memory(r: dict) -> list[tuple[str, str]]:
    rows = {(x["T"], x["method"]): x for x in r["rows"]}
    out = []
    for T in sorted({x["T"] for x in r["rows"]}):
        naive, tiled = rows[(T, "naive")], rows[(T, "tiled")]
        out.append(
            (
                f"peak memory naive / tiled attention, T={T}",
                f"{naive['peak_bytes'] / 2**20:,.0f} MiB / {tiled['peak_bytes'] / 2**20:,.1f} MiB = "
                f"{naive['peak_bytes'] / max(tiled['peak_bytes'], 1):.0f}x",
            )
        )
        out.append((f"time naive / tiled attention, T={T}", f"{naive['seconds'] / tiled['seconds']:.2f}x"))
    return out


def _decoding(r: dict) -> list[tuple[str, str]]:
    last = r["rows"][-1]
    return [
        (f"KV cache speedup at {last['new_tokens']} new tokens (ours)", f"{last['ours_speedup']:.1f}x"),
        (f"KV cache speedup at {last['new_tokens']} new tokens (HF generate)", f"{last['hf_speedup']:.1f}x"),
        (
            f"our cached tokens/s / HF generate's, {last['new_tokens']} new tokens",
            f"{last['ours_vs_hf']:.2f}x",
        ),
    ]


def _bpe(r: dict) -> list[tuple[str, str]]:
    out = []
    for row in r["training"]:
        if row["naive_s"] is not None:
            out.append(
                (
                    f"BPE training, {row['vocab_size']} tokens: recount / coursekit time",
                    f"{row['naive_s'] / row['coursekit_s']:.1f}x",
                )
            )
        out.append(
            (
                f"BPE training, {row['vocab_size']} tokens: coursekit / HF tokenizers time",
                f"{row['coursekit_s'] / row['tokenizers_s']:.1f}x",
            )
        )
    e = r["encoding"]
    out.append(
        (
            "BPE encoding MB/s, coursekit (warm cache) / tiktoken on the same merges",
            (
                f"{e['coursekit_warm_MBps']:.2f} / {e['tiktoken_MBps']:.2f} = "
                f"{e['coursekit_warm_MBps'] / e['tiktoken_MBps']:.2f}x"
            ),
        )
    )
    return out


def _training(r: dict) -> list[tuple[str, str]]:
    rows = r["rows"]
    out = [
        (
            f"training tokens/s, {name}",
            f"{row['tokens_per_s']:,.0f} ({row['fraction_of_peak']:.2f} of the "
            f"{r['matmul_peak_flops'] / 1e9:.0f} GFLOP/s matmul peak)",
        )
        for name, row in rows.items()
    ]
    names = list(rows)
    out.append(
        (
            f"validation loss in the same time, {names[1]} vs {names[0]}",
            f"{rows[names[1]]['val_loss']:.4f} vs {rows[names[0]]['val_loss']:.4f} nats/char",
        )
    )
    return out


def _grading(r: dict) -> list[tuple[str, str]]:
    n, s = r["notebooks"], r["seconds"]
    base = s["plain nbgrader autograde"]
    return [
        (
            f"grading s/notebook, {name} ({n} notebooks)",
            f"{t / n:.2f} ({base / t:.2f}x plain nbgrader's speed)",
        )
        for name, t in s.items()
    ]


def _book(r: dict) -> list[tuple[str, str]]:
    return [
        (
            f"book build ({r['pages']} pages): full / with the execution cache",
            f"{r['full_s']:.0f} s / {r['cached_s']:.0f} s = {r['full_over_cached']:.1f}x",
        )
    ]


def _class_scale(r: dict) -> list[tuple[str, str]]:
    n, last = r["students"], r["runs"][-1]
    first = r["runs"][0]
    rows = [(f"class of {n}: graded as expected", f"{last['as_expected']}/{n} at --jobs {last['jobs']}")]
    if r["serial_fraction"] is None:  # one run, on one core (--quick): no ratio to measure
        return rows + [(f"class of {n}: CPU seconds per student on 1 core", f"{last['cpu'] / n:.2f}")]
    rows += [
        (
            f"class of {n}: wall time on 1 core / on {last['cores']} (--jobs {last['jobs']})",
            f"{first['process_wall']:.0f} s / {last['process_wall']:.0f} s = "
            f"{first['process_wall'] / last['process_wall']:.2f}x",
        ),
        (
            "class: serial fraction (Amdahl; fitted to the wall times / from the busy cores; the larger)",
            f"{r['serial_fraction_walls']:.3f} / {r['serial_fraction_busy']:.3f}; {r['serial_fraction']:.3f}",
        ),
        (f"class: cores busy at --jobs {last['jobs']} (sandboxes included)", f"{last['busy']:.0%}"),
    ]
    rows += [(f"class: projected, {what}", f"{s / 60:.0f} min") for what, s in r["projected_seconds"].items()]
    return rows


#: name -> (script, extra arguments of the full mode, summary of its JSON)
BENCHMARKS = {
    "attention": ("attention.py", [], _attention),
    "attention_memory": ("long_context.py", [], _memory),
    "decoding": ("kv_cache.py", ["--threads", "1"], _decoding),
    "bpe": ("bpe.py", [], _bpe),
    "training": ("gpt_char.py", ["--threads", "1"], _training),
    "grading": ("grading.py", [], _grading),
    "book": ("book.py", [], _book),
    "class_scale": ("class_scale.py", [], _class_scale),
}


def machine() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem,
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"# Benchmarks{' (quick mode: toy sizes, not results)' if report['quick'] else ''}",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; {m['os']}; Python {m['python']}, "
        f"torch {m['torch']}; load average {m['load_average_at_start']:.2f} at the start.",
        f"Run {report['date']} with `{report['command']}`.",
        "",
        "| benchmark | measured side by side | result |",
        "|---|---|---|",
    ]
    for name, b in report["benchmarks"].items():
        for what, value in b["summary"]:
            lines.append(f"| {name} | {what} | {value} |")
    lines += [
        "",
        "Each benchmark's full output: `benchmarks/results/<name>.json`; scripts: `benchmarks/*.py`.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="toy sizes: checks that every benchmark runs")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these")
    parser.add_argument(
        "--out", type=Path, help="results folder (default benchmarks/results; quick: a temporary one)"
    )
    args = parser.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp(prefix="benchmarks-")) if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    names = args.only or list(BENCHMARKS)
    report = {
        "machine": machine(),
        "quick": args.quick,
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "command": "python benchmarks/run.py" + (" --quick" if args.quick else ""),
        "benchmarks": {},
    }
    previous = out / "report.json"
    if args.only and previous.is_file():  # keep the other benchmarks' latest results
        report["benchmarks"] = json.loads(previous.read_text()).get("benchmarks", {})
    failed = []
    for name in names:
        script, extra, summarize = BENCHMARKS[name]
        target = out / f"{name}.json"
        cmd = [sys.executable, str(ROOT / "benchmarks" / script), "--json", str(target)]
        # quick mode keeps the full mode's settings (one thread where it measures on one), at toy sizes:
        # a second thread only spins beside the other work of a busy machine (the test suite)
        cmd += [*extra, "--quick"] if args.quick else extra
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        start = time.perf_counter()
        run = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
        seconds = time.perf_counter() - start
        print(run.stdout, end="", flush=True)
        if run.returncode != 0:
            print(run.stderr[-3000:], file=sys.stderr)
            failed.append(name)
            continue
        results = json.loads(target.read_text())
        report["benchmarks"][name] = {
            "script": f"benchmarks/{script}",
            "seconds": round(seconds, 1),
            "summary": summarize(results),
            "results": results,
        }
        print(f"   ({seconds:.0f} s)", flush=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
    print(
        f"\nwrote {out / 'report.md'} and report.json" + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
