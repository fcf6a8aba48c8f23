"""Test-wide environment: 8 fake CPU devices, offline HF, in-process small-KV vLLM.

These must be set before jax / vllm are imported anywhere, which is why they live here.
"""

import os
import shutil
import tempfile

import pytest
from xla_env import xla_flags  # noqa: E402 (tests/ is on the path: pyproject's pythonpath)

os.environ.setdefault("XLA_FLAGS", xla_flags(8))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# One JAX persistent compilation cache for the whole test session: every test process (and every
# sampler / CLI subprocess, which inherit the environment) reads back what another compiled. A
# fresh directory per session, removed at its end; DLC_JAX_TEST_COMPILE_CACHE=DIR keeps one
# across sessions (a developer's repeated runs).
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _keep = os.environ.get("DLC_JAX_TEST_COMPILE_CACHE", "")
    _OWN_CACHE = None if _keep else tempfile.mkdtemp(prefix="dlc_jax_test_jit_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _keep or str(_OWN_CACHE)
# the tiny test programs compile in a fraction of a second: store those too
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")

# Test tiers: a test's directory is its tier (tests/unit, tests/integration, tests/e2e); the marker
# of the same name is added here, so `-m unit` selects the unit tier. Files still at tests/ top
# level are not in a tier yet and get no marker.
#   unit: in one process, no subprocess, no server, no sleep, and cheap: small shapes, few
#     compiles (the whole tier runs in <= 3 minutes, `bash launch/run_tests.sh --fast`).
#   integration: real servers on loopback, vLLM-CPU, subprocesses, and the in-process tests whose
#     subject is a whole compiled program of a model: train steps (dense, LoRA, MoE router
#     replay, multi-turn), sharding over the 8 fake devices, parity with transformers (remat, scan,
#     KV cache), MoE forwards and round trips.
#   e2e: the main job, BYO page, multi-host, packaging, soak.
_TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        parts = item.path.parts
        if "tests" not in parts:
            continue
        tier = parts[parts.index("tests") + 1]
        if tier in _TIERS:
            item.add_marker(getattr(pytest.mark, tier))


# DLC_JAX_TEST_CPU_REPORT=FILE: one JSON line per test phase with its wall seconds and the CPU
# seconds it cost (this process's threads + the subprocesses it waited for): on a 2-core machine
# the suite is CPU-bound, so CPU-seconds, not --durations' wall time, say what to make cheaper.
_CPU_REPORT = os.environ.get("DLC_JAX_TEST_CPU_REPORT", "")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _CPU_REPORT:
        yield
        return
    import json
    import resource
    import time

    def cpu() -> float:
        ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        return sum(r.ru_utime + r.ru_stime for r in ru)

    t0, c0 = time.perf_counter(), cpu()
    yield
    row = {"test": item.nodeid, "wall_s": time.perf_counter() - t0, "cpu_s": cpu() - c0}
    with open(_CPU_REPORT, "a") as f:
        f.write(json.dumps(row) + "\n")


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


# ---- shared fixtures -----------------------------------------------------------------------------
# The trainer-test shape of the tiny random Qwen3 (with its offline-trained ChatML tokenizer).
TINY_TRAINER_SHAPE = dict(hidden_size=64, intermediate_size=128, head_dim=16)


@pytest.fixture(scope="session")
def make_tiny_dir(tmp_path_factory):
    """``make_tiny_dir(**config)``: the path of a tiny model directory with those config
    overrides, written once per session for each distinct set of overrides."""
    made: dict = {}

    def make(**overrides):
        key = tuple(sorted(overrides.items()))
        if key not in made:
            from dlc_jax.model.tiny import make_tiny

            made[key] = make_tiny(tmp_path_factory.mktemp("tiny") / "m", **overrides)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_dir(make_tiny_dir):
    """The session's tiny model directory in the trainer-test shape (read-only: tests that write
    next to a model copy it)."""
    return make_tiny_dir(**TINY_TRAINER_SHAPE)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir):
    from dlc_jax.data.tokenize import load_tokenizer

    return load_tokenizer(str(tiny_dir))
