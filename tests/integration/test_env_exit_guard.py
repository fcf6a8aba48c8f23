"""``os._exit`` inside an environment call ends that call (tests/unit/test_env_hostile.py); the
guard must not stop the process's own ``os._exit`` elsewhere (a subprocess: it really exits)."""

import subprocess
import sys


def test_os_exit_outside_an_environment_still_exits():
    code = (
        "from dlc_jax.env.protocol import timed_call\n"
        "import os\n"
        "timed_call(lambda: 1, (), 5)\n"
        "assert os._exit.__name__ == '_guarded_exit'\n"
        "os._exit(7)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=300).returncode == 7
