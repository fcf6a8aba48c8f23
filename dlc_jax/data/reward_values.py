"""What a reward function may return: one real number per completion (a list / tuple of numbers
or a 1-D numeric array; a str, mapping, set, scalar or nested sequence is refused), each within
``±MAX_ABS_REWARD`` unless ``reward.clip`` clips them (NaN never): larger values overflowed the
float32 advantages. A call breaking either rule scores 0 like a raising one.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np

# |reward| limit without reward.clip: (2 * 1e15)^2 * a group of 10^6 stays finite in float32
MAX_ABS_REWARD = 1e15


def as_reward_list(out: object) -> list[float] | str:
    """A reward function's return value as a list of floats, or a one-line reason why not."""
    kind = type(out).__name__
    if isinstance(out, (str, bytes, bytearray, Mapping, set, frozenset)) or out is None:
        return f"returned a {kind}, expected a list of numbers (one per completion)"
    if isinstance(out, np.ndarray) or (hasattr(out, "__array__") and not isinstance(out, Sequence)):
        try:
            arr = np.asarray(out)
        except Exception as e:  # noqa: BLE001 - any array-like that does not convert
            return f"returned a {kind} that is not an array ({type(e).__name__})"
        if arr.ndim != 1 or arr.dtype.kind not in "biuf":
            return (
                f"returned a {kind} of shape {list(arr.shape)} and dtype {arr.dtype}, "
                "expected a 1-D array of real numbers"
            )
        return [float(x) for x in arr.tolist()]
    if not isinstance(out, (list, tuple)):
        return f"returned a {kind}, expected a list of numbers (one per completion)"
    vals = []
    for i, x in enumerate(out):
        if not isinstance(x, numbers.Real) or isinstance(x, (np.datetime64, np.timedelta64)):
            return (
                f"returned a {kind} whose item {i} is a {type(x).__name__} ({_short(x)}), "
                "expected real numbers"
            )
        vals.append(float(x))
    return vals


def check_values(
    vals: list[float], n: int, clip: tuple[float, float] | None = None
) -> tuple[list[float] | None, str | None]:
    """(values, None) when ``vals`` are ``n`` usable rewards (clipped into ``clip`` when given),
    else (None, the reason)."""
    if len(vals) != n:
        return None, f"returned {len(vals)} values for {n} samples"
    nan = [x for x in vals if math.isnan(x)]
    if nan:
        return None, f"returned NaN ({len(nan)} of {n} values)"
    if clip is not None:
        lo, hi = clip
        return [min(max(x, lo), hi) for x in vals], None
    big = [x for x in vals if not abs(x) <= MAX_ABS_REWARD]
    if big:
        return None, (
            f"returned values outside ±{MAX_ABS_REWARD:g} "
            f"({', '.join(f'{x:g}' for x in big[:3])}); set reward.clip: [lo, hi] to clip them"
        )
    return vals, None


def check_clip(clip: object) -> tuple[float, float] | None:
    """``reward.clip`` as ``(lo, hi)`` (None: no clipping); one-line ValueError naming the key."""
    if clip is None:
        return None
    ok = (
        isinstance(clip, (list, tuple))
        and len(clip) == 2
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in clip)
    )
    if not ok:
        raise ValueError(f"reward.clip: expected [lo, hi] (two numbers) or null, got {clip!r}")
    lo, hi = float(clip[0]), float(clip[1])  # type: ignore[index]
    if not (-MAX_ABS_REWARD <= lo < hi <= MAX_ABS_REWARD):
        raise ValueError(
            f"reward.clip: need -{MAX_ABS_REWARD:g} <= lo < hi <= {MAX_ABS_REWARD:g}, got {clip!r}"
        )
    return lo, hi


def _short(x: object) -> str:
    s = repr(x)
    return s if len(s) <= 40 else s[:37] + "..."
