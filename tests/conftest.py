"""Test-wide environment: 8 fake CPU devices, offline HF, in-process small-KV vLLM.

These must be set before jax / vllm are imported anywhere, which is why they live here.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Test tiers: a test's directory is its tier (tests/unit, tests/integration, tests/e2e); the marker
# of the same name is added here, so `-m unit` selects the unit tier. Files still at tests/ top
# level are not in a tier yet and get no marker.
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
