"""Three small tensors and two senders' slices of them (strided boxes included), shared by the
sliced-push tests."""

from __future__ import annotations

import numpy as np

SHAPES = {"a.weight": (64, 33), "b.weight": (1000,), "c.bias": (7, 6, 3)}


def slice_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def two_senders(w: dict[str, np.ndarray]) -> list[list[tuple]]:
    """Two senders' slices: a/b split on axis 0, c split on axis 1 (strided boxes)."""
    a, b, c = w["a.weight"], w["b.weight"], w["c.bias"]
    p0 = [
        ("a.weight", (0, 0), (40, 33), a[:40]),
        ("b.weight", (0,), (500,), b[:500]),
        ("c.bias", (0, 0, 0), (7, 2, 3), c[:, :2]),
    ]
    p1 = [
        ("c.bias", (0, 2, 0), (7, 6, 3), c[:, 2:]),
        ("a.weight", (40, 0), (64, 33), a[40:]),
        ("b.weight", (500,), (1000,), b[500:]),
    ]
    return [p0, p1]
