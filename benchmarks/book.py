"""Book build time: a full build from clean, then a rebuild that reuses the execution cache.

    .venv/bin/python benchmarks/book.py [--quick] [--json out.json]

The book's sources (the files git tracks) are copied to a temporary folder, so neither the
repository's ``_build/`` nor its execution cache is touched or reused:

1. **full**: ``jupyter-book build . -W -n --keep-going`` on the clean copy: every page's
   code is executed (the cost a fresh clone pays);
2. **cached**: ``_build/html`` and Sphinx's doctrees are deleted, the execution cache
   (``_build/.jupyter_cache``) is kept, and the book is built again: every page is
   rendered, no code is re-run (the cost of editing prose).

``--quick`` builds a book of only the introduction and the notation page (no executed
code): it checks that the benchmark runs, in seconds. Those pages link to chapters the small
book leaves out, so the quick build allows warnings; the full one treats them as errors.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK_TOC = "format: jb-book\nroot: book/intro\nchapters:\n  - file: book/notation\n"


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def copy_sources(dest: Path) -> None:
    for rel in tracked_files():
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    shutil.copytree(ROOT / "_vendor", dest / "_vendor")  # MathJax (installed, not tracked)


def build(folder: Path, strict: bool = True) -> float:
    bindir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    start = time.perf_counter()
    flags = ["-W", "-n", "--keep-going"] if strict else ["-n"]
    run = subprocess.run(
        [str(bindir / "jupyter-book"), "build", ".", *flags],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if run.returncode != 0:
        sys.exit(f"the book build failed:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}")
    return seconds


def main() -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="two pages without code: checks that it runs")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if not (ROOT / "_vendor" / "mathjax").is_dir():
        sys.exit("MathJax is not installed: run scripts/install_mathjax.sh (make book does)")
    with tempfile.TemporaryDirectory(prefix="book-bench-") as tmp:
        folder = Path(tmp)
        copy_sources(folder)
        if args.quick:
            (folder / "_toc.yml").write_text(QUICK_TOC)
        pages = sum(1 for line in (folder / "_toc.yml").read_text().splitlines() if "file:" in line) + 1
        full = build(folder, strict=not args.quick)
        shutil.rmtree(folder / "_build" / "html")
        shutil.rmtree(folder / "_build" / ".doctrees", ignore_errors=True)
        cached = build(folder, strict=not args.quick)
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "quick": args.quick,
        "pages": pages,
        "full_s": full,
        "cached_s": cached,
        "full_over_cached": full / cached,
    }
    print(
        f"{pages} pages: full build {full:.1f} s, rebuild with the execution cache {cached:.1f} s "
        f"({full / cached:.1f}x)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
