"""Committed results of an experiment: read back only when the code would still produce them.

An experiment too long to run at every book build (minutes of training over several seeds) is
run once with ``python -m coursekit.experiments.<name>``, which writes a JSON file next to the
module; the chapter loads that file. :func:`read_results` refuses a file written by other
settings or with another layout, naming the command that rewrites it, so a page can never show
runs of an experiment that no longer exists.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from coursekit._files import read_json


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
