"""A hub name against an endpoint that accepts connections and never answers: the load fails in one
line within data.timeout_s instead of hanging (real `datasets`, a silent server on loopback)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time


def test_silent_hub_endpoint_fails_within_the_deadline(tmp_path):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)  # accepts (the kernel completes the handshake) and never answers
    port = srv.getsockname()[1]
    env = dict(os.environ)
    env.update(
        HF_ENDPOINT=f"http://127.0.0.1:{port}",
        HF_HUB_OFFLINE="0",
        HF_DATASETS_OFFLINE="0",
        HF_HOME=str(tmp_path / "hf"),
        HF_HUB_ETAG_TIMEOUT="600",  # the deadline must hold even with the hub's own set long
        HF_HUB_DOWNLOAD_TIMEOUT="600",
    )
    code = (
        "from dlc_jax.data.sources import DataError, open_source\n"
        "try:\n"
        "    open_source('hf:someone/some_dataset', timeout_s=3)\n"
        "except DataError as e:\n"
        "    print('DATAERROR', e)\n"
    )
    t0 = time.time()
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
    finally:
        srv.close()
    took = time.time() - t0
    assert "DATAERROR" in out.stdout, out.stdout + out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert "no answer within data.timeout_s=3 s" in line and "hf:someone/some_dataset" in line
    assert took < 30, took  # interpreter + datasets import + the 3 s deadline
