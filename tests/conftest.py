"""Shared test configuration.

Tolerances for comparisons with independent references live here, in one place:
float64 comparisons are tight, float32 ones use torch.testing's defaults.
"""

from __future__ import annotations

import torch

#: (rtol, atol) per dtype, for every comparison with a reference in tests/.
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-12), torch.float32: dict(rtol=1.3e-6, atol=1e-5)}


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, **TOL[expected.dtype])
