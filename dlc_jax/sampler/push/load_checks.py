"""LoadWeights checks: a server loads only directories under its `load_root` (symlinks resolved;
None = disabled), never the one it serves, and their files get the push checks.
"""

from __future__ import annotations

import pathlib

from ..wire import safetensors_io as st
from .weight_checks import PushError, validate_specs


def check_load_path(raw: str, load_root: str | None, serving: list[pathlib.Path]) -> pathlib.Path:
    """`raw` resolved, inside `load_root`, a directory, none of `serving`; else PushError."""
    if not load_root:
        raise PushError.precondition(
            "LoadWeights is disabled on this server (start it with --load-root DIR to allow "
            "loading weight directories under DIR)"
        )
    path = pathlib.Path(raw).resolve()
    root = pathlib.Path(load_root).resolve()
    if path != root and root not in path.parents:
        raise PushError.precondition(f"path {raw!r} is outside the load root {load_root}")
    if not path.is_dir():
        raise PushError.invalid(f"path {raw!r} is not a directory")
    if path in {p.resolve() for p in serving}:
        raise PushError.precondition(
            f"path {raw!r} is the directory being served; write the new weights to another "
            "directory"
        )
    return path


def check_load_files(path: pathlib.Path, expected: dict[str, tuple[tuple[int, ...], str]]) -> None:
    """Blocking: names/shapes/dtypes against `expected`, bounded header reads, finite values."""
    validate_specs(expected, _read(st.read_specs, path), where=str(path))
    bad = _read(st.first_nonfinite, path)
    if bad is not None:
        raise PushError.invalid(
            f"tensor {bad!r} in {path} contains NaN or Inf values (load refused; the current "
            "weights keep serving)"
        )


def _read(read, path: pathlib.Path):
    """``read(path)``; an unreadable or malformed file is INVALID_ARGUMENT."""
    try:
        return read(path)
    except (OSError, ValueError) as e:
        raise PushError.invalid(f"cannot read safetensors in {path}: {e}") from None
