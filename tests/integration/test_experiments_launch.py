"""CPU-seconds of a training subprocess (load-independent cost) and its timeout: real processes."""

import subprocess
import sys

import pytest

from dlc_jax.experiments.launch import _wait_with_usage


def test_cpu_seconds_of_a_child_and_its_exit_code():
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    proc = subprocess.Popen([sys.executable, "-c", busy + "raise SystemExit(3)"])
    rc, cpu = _wait_with_usage(proc, timeout_s=60)
    assert rc == 3 and proc.returncode == 3
    assert 0.25 <= cpu < 30  # its own CPU time, not the wall time it waited for a core


def test_a_child_past_its_timeout_is_killed():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    with pytest.raises(subprocess.TimeoutExpired):
        _wait_with_usage(proc, timeout_s=0.5)
    assert proc.poll() is not None  # gone, and reaped
