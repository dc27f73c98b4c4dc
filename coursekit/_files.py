"""Small file helpers shared by the modules that save things: atomic writes and
versioned JSON formats (``{"format": ..., "version": ..., ...}``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it over
    ``path``: a reader never sees a half-written file. Returns ``path``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)
    return path


def write_json(path: str | os.PathLike, data: dict) -> Path:
    """Write ``data`` as compact UTF-8 JSON, atomically."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_json(path: str | os.PathLike, fmt: str, version: int, what: str) -> dict:
    """Read a file written with ``{"format": fmt, "version": version, ...}``.

    Raises:
        ValueError: naming ``what`` (e.g. "coursekit BPE file") if the file is not
            JSON, not of this format, or of another version.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not a {what}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise ValueError(f'{path} is not a {what} (no "format": "{fmt}")')
    if data.get("version") != version:
        raise ValueError(f"{path} has format version {data.get('version')}; this coursekit reads {version}")
    return data
