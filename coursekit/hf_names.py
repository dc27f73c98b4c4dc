"""Renaming state dicts between coursekit's names and Hugging Face's.

BERT (Chapter 6) and ViT (Chapter 9) load and export Hugging Face weights. Both need the same
two things: a table of name templates, where ``{i}`` stands for a layer index and ``{p}`` for
``weight`` or ``bias``, and the split of our fused ``qkv_proj`` (``(3C, C)``, queries first)
into Hugging Face's three projections, and back. :class:`NameTable` does both, so each model
only states its names.

Example::

    table = NameTable({"encoder.layers.{i}.norm1.{p}": "vit.layers.{i}.layernorm_before.{p}"},
                      our_qkv="encoder.layers.{i}.self_attn.qkv_proj.{p}",
                      hf_qkv="vit.layers.{i}.attention.{part}.{p}", parts=("q_proj", "k_proj", "v_proj"))
    table.hf_name("encoder.layers.3.norm1.bias")  # 'vit.layers.3.layernorm_before.bias'
"""

from __future__ import annotations

import re

import torch

__all__ = ["NameTable"]


def _pattern(template: str, parts: tuple[str, ...] = ()) -> re.Pattern:
    """A regex for a name template: ``{i}`` a layer index, ``{p}`` weight or bias, ``{part}`` one of ``parts``."""
    body = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>weight|bias)")
    if parts:
        body = body.replace(r"\{part\}", "(?P<part>" + "|".join(map(re.escape, parts)) + ")")
    return re.compile(body + "$")


def _rename(key: str, table: list[tuple[re.Pattern, str]]) -> str | None:
    for pattern, target in table:
        m = pattern.match(key)
        if m:
            return target.format(**m.groupdict())
    return None


class NameTable:
    """Our names <-> Hugging Face's, for one model family.

    Args:
        names: our template -> Hugging Face's template, for every tensor but the fused
            attention projection.
        our_qkv: the template of our fused ``qkv_proj`` (``{i}``, ``{p}``).
        hf_qkv: the template of Hugging Face's three projections (``{i}``, ``{part}``, ``{p}``).
        parts: Hugging Face's names of the query, key and value projections, in that order.
    """

    def __init__(self, names: dict[str, str], *, our_qkv: str, hf_qkv: str, parts: tuple[str, str, str]):
        self._to_hf = [(_pattern(ours), hf) for ours, hf in names.items()]
        self._to_ours = [(_pattern(hf), ours) for ours, hf in names.items()]
        self._our_qkv, self._our_qkv_template = _pattern(our_qkv), our_qkv
        self._hf_qkv, self._hf_qkv_template = _pattern(hf_qkv, parts), hf_qkv
        self.parts = parts

    def hf_name(self, key: str) -> str | None:
        """Hugging Face's name for our ``key``, or ``None`` if the table has none."""
        return _rename(key, self._to_hf)

    def our_name(self, key: str) -> str | None:
        """Our name for Hugging Face's ``key``, or ``None`` if the table has none."""
        return _rename(key, self._to_ours)

    def split_qkv(self, key: str, value: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """If ``key`` is our fused projection, its three parts under Hugging Face's names
        (``C`` rows each, queries first); otherwise ``None``."""
        m = self._our_qkv.match(key)
        if m is None:
            return None
        return {
            self._hf_qkv_template.format(i=m["i"], part=part, p=m["p"]): chunk
            for part, chunk in zip(self.parts, value.chunk(3, dim=0))
        }  # 3 x (C, C) or (C,)

    def to_hf(self, key: str, value: torch.Tensor, what: str) -> dict[str, torch.Tensor]:
        """Our tensor ``key`` under Hugging Face's name (the fused projection as its three parts).

        Raises:
            ValueError: ``key`` is not in the table; ``what`` names the state dict expected.
        """
        parts = self.split_qkv(key, value)
        if parts is not None:
            return parts
        name = self.hf_name(key)
        if name is None:
            raise ValueError(f"no Hugging Face name for {key!r}: is it a {what} state dict?")
        return {name: value}

    def collect_qkv(self, key: str, value: torch.Tensor, pending: dict) -> bool:
        """If ``key`` is one of Hugging Face's three projections, file ``value`` in ``pending``
        (for :meth:`join_qkv`) and return True; otherwise return False."""
        m = self._hf_qkv.match(key)
        if m is None:
            return False
        pending.setdefault((m["i"], m["p"]), {})[m["part"]] = value
        return True

    def join_qkv(self, pending: dict) -> dict[str, torch.Tensor]:
        """The fused projections, under our names, from what :meth:`collect_qkv` filed.

        Raises:
            ValueError: a layer that lacks one of the three projections.
        """
        out = {}
        for (i, p), found in pending.items():
            if set(found) != set(self.parts):
                q, k, v = self.parts
                raise ValueError(f"layer {i} {p}: expected {q}, {k} and {v}, got {sorted(found)}")
            out[self._our_qkv_template.format(i=i, p=p)] = torch.cat(
                [found[k] for k in self.parts], dim=0
            )  # (3C, ...)
        return out
