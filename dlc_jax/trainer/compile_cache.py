"""JAX's persistent compilation cache for training runs (``train.compile_cache_dir``).

A restarted or resumed run on a pod compiles the same train step and theta_s forward again (about a
minute each at RL lengths); with the cache it reads them back. JAX keys each entry by the program,
the compiler options and the devices, so a changed config or topology compiles afresh. Off when the
directory is '' (the default); a relative path is relative to the working directory. Programs that
compile in under ``min_compile_s`` are not stored.
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
