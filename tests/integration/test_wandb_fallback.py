"""log.wandb=true without WANDB_MODE: no API key -> offline from the start with one line; a key and
an endpoint that never answers -> the online start gives up after its deadline and the run goes on
offline (real wandb, its service process, a silent server on loopback)."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from dlc_jax.trainer import writers


@pytest.fixture
def no_wandb_env(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    # wandb keeps a process-wide singleton whose settings (an earlier test's offline mode among
    # them) a later wandb.init inherits: start each test from a fresh one
    wandb.teardown()
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "home" / ".netrc"))  # absent: no `wandb login`
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    yield
    wandb.teardown()


def test_no_key_logs_offline_with_one_line(no_wandb_env, tmp_path, caplog):
    assert not writers.wandb_api_key_known()
    t0 = time.time()
    with caplog.at_level(logging.INFO, logger="dlc_jax"):
        w = writers.WandbWriter(tmp_path, "p", "r", {"a": 1})
        w.log(1, {"reward/mean": 0.5})
        w.close()
    assert w.run.settings.mode == "offline" and time.time() - t0 < 60
    notices = [r.getMessage() for r in caplog.records if "no wandb API key" in r.getMessage()]
    assert len(notices) == 1 and "\n" not in notices[0]
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_unanswered_online_start_falls_back_to_offline(no_wandb_env, tmp_path, caplog, monkeypatch):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)  # accepts, never answers
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{srv.getsockname()[1]}")
    monkeypatch.setattr(writers, "WANDB_INIT_TIMEOUT_S", 5.0)
    assert writers.wandb_api_key_known()
    t0 = time.time()
    try:
        with caplog.at_level(logging.INFO, logger="dlc_jax"):
            w = writers.WandbWriter(tmp_path, "p", "r", {})
            w.log(1, {"reward/mean": 0.5})
            w.close()
    finally:
        srv.close()
    took = time.time() - t0
    assert w.run.settings.mode == "offline" and took < 60, took
    text = caplog.text
    assert "did not start within 5 s" in text and "logging offline" in text
