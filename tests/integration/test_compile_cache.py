"""train.compile_cache_dir: a second process reads the compiled program back from the cache."""

import subprocess
import sys

import pytest

from dlc_jax.errors import UserError
from dlc_jax.trainer.build import enable_compile_cache

_PROG = """
import sys
import jax, jax.numpy as jnp
from dlc_jax.trainer.build import enable_compile_cache
enable_compile_cache(sys.argv[1], min_compile_s=0.0)
events = []
jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum() * 3.0 + jnp.cumsum(x, axis=0).max())
f(jnp.ones((64, 32))).block_until_ready()
key = "/jax/compilation_cache/cache_"
print(events.count(key + "hits"), events.count(key + "misses"))
"""


def test_second_process_reads_the_program_from_the_cache(tmp_path):
    cache = tmp_path / "xla_cache"
    run = [sys.executable, "-c", _PROG, str(cache)]
    first = subprocess.run(run, check=True, capture_output=True, text=True).stdout.split()
    hits, misses = (int(x) for x in first)
    assert hits == 0 and misses >= 1, first  # compiled, then written
    assert any(cache.iterdir()), "the first compile wrote nothing into the cache"
    second = subprocess.run(run, check=True, capture_output=True, text=True).stdout.split()
    hits, misses = (int(x) for x in second)
    assert hits >= 1 and misses == 0, second  # every program read back, none compiled


def test_off_by_default_and_bad_dir_is_one_line(tmp_path):
    assert enable_compile_cache("") is None
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match="train.compile_cache_dir"):
        enable_compile_cache(str(blocker / "sub"))
