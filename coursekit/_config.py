"""The checks every model configuration shares (GPT, BERT, ViT, the translation model)."""

from __future__ import annotations

from collections.abc import Iterable


def check_positive_ints(obj: object, names: Iterable[str]) -> None:
    """Raise ``ValueError`` unless each attribute in ``names`` is an ``int`` (not a bool) of at least 1."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_transformer_config(cfg: object, positive: Iterable[str]) -> None:
    """The fields in ``positive`` are positive integers, ``n_heads`` divides ``d_model``, an
    optional ``d_ff`` is ``None`` or positive, and ``dropout`` is a probability below 1."""
    check_positive_ints(cfg, positive)
    if cfg.d_model % cfg.n_heads:
        raise ValueError(f"n_heads={cfg.n_heads} must divide d_model={cfg.d_model}")
    d_ff = getattr(cfg, "d_ff", None)
    if d_ff is not None and (not isinstance(d_ff, int) or isinstance(d_ff, bool) or d_ff < 1):
        raise ValueError(f"d_ff must be a positive integer or None (for 4 * d_model), got {d_ff!r}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {cfg.dropout}")
