"""Shared test configuration.

Tolerances for comparisons with independent references live here, in one place:
float64 comparisons are tight, float32 ones use torch.testing's defaults.
"""

from __future__ import annotations

import os

import torch

# Hugging Face models in tests are built from tiny random configs; never reach the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: (rtol, atol) per dtype, for every comparison with a reference in tests/.
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-12), torch.float32: dict(rtol=1.3e-6, atol=1e-5)}


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, **TOL[expected.dtype])
