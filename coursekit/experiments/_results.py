"""Committed results of an experiment: read back only when the code would still produce them.

An experiment too long to run at every book build (minutes of training over several seeds) is
run once with ``python -m coursekit.experiments.<name>``, which writes a JSON file next to the
module; the chapter loads that file. :func:`read_results` refuses a file written by other
settings or with another layout, naming the command that rewrites it, so a page can never show
runs of an experiment that no longer exists.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from coursekit._files import read_json, write_json


def read_results(
    path: str | Path,
    *,
    fmt: str,
    version: int,
    what: str,
    module: str,
    settings: dict | None = None,
    layout_ok: Callable[[dict], bool] = lambda data: True,
) -> dict:
    """Read ``path``, written as ``{"format": fmt, "version": version, "settings": ..., ...}``.

    Args:
        path, fmt, version, what: as :func:`coursekit._files.read_json`.
        module: the module whose ``python -m`` run rewrites the file (named in the error).
        settings: what the code would run now; the file's ``"settings"`` must equal it.
        layout_ok: whether the file's runs have the layout the code would write (variants,
            seeds, lengths, ...).

    Raises:
        ValueError: the file is not of this format or version, was written with other
            settings (the error names the keys that differ), or has another layout.
    """
    data = read_json(path, fmt, version, what)
    changed: list[str] = []
    if settings is not None:
        stored = data.get("settings")
        stored = stored if isinstance(stored, dict) else {}
        changed = sorted(k for k in set(settings) | set(stored) if stored.get(k) != settings.get(k))
    if changed or not layout_ok(data):
        why = f"settings that differ: {', '.join(changed)}" if changed else "its runs have another layout"
        raise ValueError(f"{path} holds another experiment ({why}); rerun python -m {module}")
    return data


def experiment_parser(
    module: str, description: str, seeds: Sequence[int], out: Path
) -> argparse.ArgumentParser:
    """The command line of ``python -m module``: ``--seeds`` (default ``seeds``) and ``--out``
    (default ``out``, the committed file); a module adds its own options."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(seeds))
    parser.add_argument("--out", type=Path, default=out)
    return parser


def run_and_write(
    path: str | Path, *, fmt: str, version: int, seeds: Sequence[int], run: Callable[[], dict]
) -> dict:
    """Run an experiment on one thread and write ``path``: ``{"format", "version", "seeds",
    "seconds", "cpu_seconds", **run()}``, where ``seconds`` is the wall clock (longer on a busy
    machine) and ``cpu_seconds`` the processor time. Returns what it wrote and prints where."""
    import torch

    torch.set_num_threads(1)
    start, cpu = time.perf_counter(), time.process_time()
    body = run()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    data = {
        "format": fmt,
        "version": version,
        "seeds": list(seeds),
        "seconds": round(seconds),
        "cpu_seconds": round(cpu_seconds),
        **body,
    }
    write_json(path, data)
    print(f"wrote {path} ({len(data['seeds'])} seeds) in {seconds:.0f} s ({cpu_seconds:.0f} s of CPU)")
    return data


@dataclass(frozen=True)
class CommittedResults:
    """One experiment's committed results: the command that writes them (``python -m module``), their
    file, format and version, what they are (for errors) and the default seeds. An experiment module
    defines one and reads and writes through it:

    ``load_results(path)`` is ``read(path, settings=settings(), layout_ok=...)`` and ``main(argv)`` is
    ``main(argv, description, lambda args: {"settings": ..., "runs": run_all(args.seeds)})``.
    """

    module: str
    path: Path
    fmt: str
    version: int
    what: str
    seeds: Sequence[int]

    def read(
        self,
        path: str | Path | None = None,
        *,
        settings: dict | None = None,
        layout_ok: Callable[[dict], bool] = lambda data: True,
    ) -> dict:
        """:func:`read_results` of ``path`` (the committed file by default)."""
        return read_results(
            self.path if path is None else path,
            fmt=self.fmt,
            version=self.version,
            what=self.what,
            module=self.module,
            settings=settings,
            layout_ok=layout_ok,
        )

    def main(
        self,
        argv: list[str] | None,
        description: str,
        run: Callable[[argparse.Namespace], dict],
        options: Callable[[argparse.ArgumentParser], None] | None = None,
    ) -> dict:
        """The command line: :func:`experiment_parser` (plus what ``options`` adds to it), then
        :func:`run_and_write` of ``run(args)`` to ``--out``. Returns what it wrote."""
        parser = experiment_parser(self.module, description, self.seeds, self.path)
        if options is not None:
            options(parser)
        args = parser.parse_args(argv)
        return run_and_write(
            args.out, fmt=self.fmt, version=self.version, seeds=args.seeds, run=lambda: run(args)
        )
