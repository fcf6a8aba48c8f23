"""Find libtpu for ahead-of-time TPU compiles on a machine without TPUs. ``launch/setup_env.sh``
installs it under ``<venv>/libtpu``, outside site-packages (vLLM takes an importable ``libtpu`` to
mean "this host has TPUs"); JAX finds it through ``TPU_LIBRARY_PATH``. An importable one is used
as is."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

# the libtpu that jax[tpu]==0.10.2 pins; launch/setup_env.sh reads this line and installs it
LIBTPU_VERSION = "0.0.42.1"


def ensure_libtpu() -> str | None:
    """Make libtpu loadable by JAX: its path (None: the importable module), else RuntimeError."""
    env = os.environ.get("TPU_LIBRARY_PATH")
    if env and os.path.isfile(env):
        return env
    if importlib.util.find_spec("libtpu") is not None:
        return None
    for root in (Path(sys.prefix), Path(sys.executable).resolve().parent.parent):
        path = root / "libtpu" / "libtpu" / "libtpu.so"
        if path.is_file():
            os.environ["TPU_LIBRARY_PATH"] = str(path)
            return str(path)
    raise RuntimeError(
        "libtpu not found (needed to compile for TPU topologies): run launch/setup_env.sh, or "
        f"pip install --target {sys.prefix}/libtpu --no-deps libtpu=={LIBTPU_VERSION}"
    )
