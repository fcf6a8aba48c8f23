"""Socket data plane for weight pushes: in-process gRPC servers with a recording transport-only
backend (staging + checksum verify + atomic swap; no engine)."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from dlc_jax.bench.sampler_bench import TransportOnlyBackend
from dlc_jax.sampler.client.client import SamplerClient
from dlc_jax.sampler.service.server import ServerConfig, ServerThread
from dlc_jax.sampler.wire import safetensors_io as st


class RecordingBackend(TransportOnlyBackend):
    """Loads every applied push back from its staged safetensors (what a real engine would
    serve)."""

    async def apply_weights(self, weights_dir, version):
        self.weights = dict(st.iter_tensors(weights_dir))
        self.version = int(version)


SHAPES = {"a.weight": (64, 33), "b.weight": (1000,), "c.bias": (7, 5, 3)}


def _weights(seed):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


@pytest.fixture
def server(tmp_path):
    def make(**kw):
        backend = RecordingBackend({n: (s, "float32") for n, s in SHAPES.items()}, 100)
        cfg = ServerConfig(staging_root=str(tmp_path / "stage"), data_port=0, data_wait_s=1.0, **kw)
        srv = ServerThread(backend, cfg).start()
        made.append(srv)
        return srv, backend

    made = []
    yield make
    for s in made:
        s.stop()


def _staged_dirs(tmp_path):
    root = tmp_path / "stage"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.mark.parametrize("checksum", ["crc32c", "sha256"])
def test_socket_push_serves_new_weights(server, tmp_path, checksum):
    srv, backend = server()
    with SamplerClient(srv.address, timeout=30) as c:
        assert c.info()["data_port"] > 0
        w = _weights(1)
        r = c.push_weights(w, 1, transport="socket", checksum=checksum)
        assert r.ok, r.message
        assert r.version == 1 and c.info()["version"] == 1
        for n, a in w.items():
            np.testing.assert_array_equal(backend.weights[n], a)
        w2 = _weights(2)  # a second push over a fresh data connection, then a plain gRPC one
        assert c.push_weights(w2, 2, transport="socket", checksum=checksum).ok
        np.testing.assert_array_equal(backend.weights["b.weight"], w2["b.weight"])
        assert c.push_weights(_weights(3), 3).ok and backend.version == 3
    # the serving push stays staged, plus one superseded buffer kept warm for the next push
    # (warm_staging; v3 was received into v1's buffer, renamed)
    assert [d.split("_")[3] for d in _staged_dirs(tmp_path)] == ["v2", "v3"]


def _reject(c, backend, tmp_path, **kw):
    before = _staged_dirs(tmp_path)
    r = c.push_weights(_weights(9), 5, transport="socket", **kw)
    assert not r.ok
    assert r.version == 1 and backend.version == 1 and c.info()["version"] == 1
    after = _staged_dirs(tmp_path)  # the served v1 stays; the rejected push's buffer is kept
    serving = [d for d in before if "_v1_" in d]  # warm for the next push (warm_staging)
    assert len(serving) == 1 and serving[0] in after and len(after) <= 2
    np.testing.assert_array_equal(
        backend.weights["a.weight"], _weights(1)["a.weight"]
    )  # old weights still serve
    return r


def test_socket_push_rejections_keep_old_weights(server, tmp_path, monkeypatch):
    srv, backend = server()
    with SamplerClient(srv.address, timeout=30) as c:
        assert c.push_weights(_weights(1), 1, transport="socket").ok

        # corrupted bytes: one byte flipped after the client computed the CRC
        def corrupt(sock, i, buf):
            b = bytearray(buf)
            if i == 1:
                b[17] ^= 0x01
            sock.sendall(b)

        monkeypatch.setattr(c, "_send_data", corrupt)
        r = _reject(c, backend, tmp_path)
        assert r.code == "DATA_LOSS" and "mismatch" in r.message and "b.weight" in r.message

        # the data socket is cut mid-push (the gRPC stream carries on to Commit)
        def cut(sock, i, buf):
            if i == 0:
                sock.sendall(buf[:100])
                sock.shutdown(socket.SHUT_RDWR)

        monkeypatch.setattr(c, "_send_data", cut)
        r = _reject(c, backend, tmp_path)
        assert r.code == "DATA_LOSS" and "closed after" in r.message
        monkeypatch.undo()

        # the data connection names another push id
        monkeypatch.setattr(
            c, "_data_preamble", lambda pid: SamplerClient._data_preamble(c, "0" * 32)
        )
        r = _reject(c, backend, tmp_path)
        assert r.code == "FAILED_PRECONDITION" and "no data connection" in r.message
        monkeypatch.undo()

        assert (
            c.push_weights(_weights(4), 4, transport="socket").ok and backend.version == 4
        )  # still healthy
    stats = SamplerClient(srv.address).info()
    assert stats["rejected_pushes"] == 3 and stats["pushes"] == 2


def test_socket_push_token_required(server, tmp_path, monkeypatch):
    srv, backend = server(token="s3cret")
    with SamplerClient(srv.address, token="s3cret", timeout=30) as c:
        assert c.push_weights(_weights(1), 1, transport="socket").ok
        # right token on gRPC but none / a wrong one in the data preamble: the data connection is
        # refused
        from dlc_jax.sampler.push import data_plane

        for bad in (None, "wrong"):
            monkeypatch.setattr(
                c, "_data_preamble", lambda pid, bad=bad: data_plane.preamble(pid, bad)
            )
            r = _reject(c, backend, tmp_path)
            assert r.code == "FAILED_PRECONDITION" and "token" in r.message


def test_socket_transport_off_or_tls_is_refused(tmp_path):
    backend = RecordingBackend({n: (s, "float32") for n, s in SHAPES.items()}, 100)
    with ServerThread(
        backend, ServerConfig(staging_root=str(tmp_path / "stage"))
    ) as srv:  # no data port
        with SamplerClient(srv.address, timeout=30) as c:
            assert c.info()["data_port"] == 0
            with pytest.raises(ValueError, match="no push data port"):
                c.push_weights(_weights(1), 1, transport="socket")
            with pytest.raises(ValueError, match="transport"):
                c.push_weights(_weights(1), 1, transport="carrier-pigeon")
            assert c.push_weights(_weights(1), 1).ok  # gRPC default unchanged
    with pytest.raises(ValueError, match="TLS"):
        ServerConfig(tls_cert="c.pem", tls_key="k.pem", data_port=0)
    c = SamplerClient("127.0.0.1:1", tls_root_cert=b"not a real cert")
    with pytest.raises(ValueError, match="TLS"):
        c.push_weights(_weights(1), 1, transport="socket")
    c.close()
