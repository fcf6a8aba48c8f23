"""JAX's persistent compilation cache for training runs (``train.compile_cache_dir``, '' = off): a
restarted run reads its compiled step and theta_s forward back instead of compiling them again.
"""

from __future__ import annotations

import logging
from pathlib import Path

import jax

from dlc_jax.errors import UserError

log = logging.getLogger(__name__)


def enable_compile_cache(directory: str, min_compile_s: float = 1.0) -> str | None:
    """Point JAX's persistent compilation cache at ``directory`` (a local directory is created;
    a URL such as gs://... is passed through); the directory used, None when ''."""
    if not directory:
        return None
    if "://" in directory:  # gs://bucket/... : JAX writes it through its own file layer
        where = directory
    else:
        path = Path(directory).expanduser().resolve()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"train.compile_cache_dir: cannot create {path}: {e.strerror}") from e
        where = str(path)
    jax.config.update("jax_compilation_cache_dir", where)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    log.info("compilation cache: %s (programs compiling in >= %.1f s)", where, min_compile_s)
    return where
