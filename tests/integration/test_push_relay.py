"""Relayed weight pushes between samplers (`relay.py`, `SamplerPool(relay=...)`): 1 trainer and 4
in-process samplers on loopback. Byte counts, not times: the trainer sends one model whatever the
number of samplers; a failed hop falls back to direct pushes (that sampler leaves rotation); a
corrupt push at the relaying sampler is never committed downstream."""

from __future__ import annotations

import crc32c
import numpy as np
import pytest

from dlc_jax.bench.sampler_bench import TransportOnlyBackend
from dlc_jax.sampler.client.client import SamplerClient
from dlc_jax.sampler.client.pool import SamplerPool
from dlc_jax.sampler.service.server import ServerConfig, ServerThread
from dlc_jax.sampler.wire import safetensors_io as st
from dlc_jax.sampler.wire import sampler_pb2 as pb


class RecordingBackend(TransportOnlyBackend):
    """Loads every applied push back from its staged safetensors (what an engine would serve)."""

    async def apply_weights(self, weights_dir, version):
        self.weights = dict(st.iter_tensors(weights_dir))
        self.version = int(version)


SHAPES = {"a.weight": (256, 130), "b.weight": (5000,), "c.bias": (7, 5, 3)}
MODEL_BYTES = sum(int(np.prod(s)) * 4 for s in SHAPES.values())


def _weights(seed):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


@pytest.fixture
def samplers(tmp_path):
    made = []
    for k in range(4):
        b = RecordingBackend({n: (s, "float32") for n, s in SHAPES.items()}, 100)
        cfg = ServerConfig(
            staging_root=str(tmp_path / f"stage{k}"), data_port=0, token="tok", data_wait_s=2.0
        )
        made.append((ServerThread(b, cfg).start(), b))
    yield made
    for srv, _ in made:
        try:
            srv.stop()
        except Exception:  # noqa: BLE001 - already stopped by the test
            pass


def _served(b, w):
    return b.version and all(np.array_equal(b.weights[n], a) for n, a in w.items())


@pytest.mark.parametrize("mode", ["chain", "tree"])
@pytest.mark.parametrize("transport", ["grpc", "socket"])
def test_relay_trainer_sends_one_model_to_four_samplers(samplers, mode, transport):
    w = _weights(1)
    with SamplerPool([s.address for s, _ in samplers], token="tok", relay=mode) as pool:
        r = pool.push_weights(w, 1, transport=transport)
    assert r.ok and not r.removed, r
    assert r.egress_bytes == MODEL_BYTES  # one copy leaves the trainer (bound: 1.1 model)
    assert all(p.bytes == MODEL_BYTES for p in r.per_sampler.values())  # each got a full copy
    assert sorted(p.transport for p in r.per_sampler.values()).count("relay") == 3
    for _, b in samplers:
        assert b.version == 1 and _served(b, w)


def test_relay_off_sends_one_model_per_sampler(samplers):
    w = _weights(2)
    with SamplerPool([s.address for s, _ in samplers], token="tok") as pool:
        r = pool.push_weights(w, 1)
    assert r.ok and r.egress_bytes == 4 * MODEL_BYTES


def test_failed_hop_falls_back_to_direct_pushes(samplers):
    w = _weights(3)
    samplers[1][0].stop()  # the chain's second hop is down
    # one retry, short backoff: the subject is the fallback, not how long a dead sampler is retried
    addrs = [s.address for s, _ in samplers]
    with SamplerPool(addrs, token="tok", relay="chain", max_retries=1, backoff=0.05) as pool:
        r = pool.push_weights(w, 1, transport="socket")
        assert r.ok and r.removed == (samplers[1][0].address,), r
        assert pool.rotation() == [True, False, True, True]
    # head relayed nothing usable; samplers 2, 3 were pushed directly: 3 copies, not 4
    assert r.egress_bytes == 3 * MODEL_BYTES
    for k in (0, 2, 3):
        assert _served(samplers[k][1], w)


def test_corrupt_push_at_the_relay_head_is_never_committed_downstream(samplers):
    good = _weights(4)
    addrs = [s.address for s, _ in samplers]
    with SamplerPool(addrs, token="tok", relay="chain") as pool:
        assert pool.push_weights(good, 1).ok
    bad = _weights(5)
    h = pb.WeightHeader(version=2, dtype="float32", checksum="crc32c", relay_to=addrs[1:])
    h.relay_fanout = 1
    for n, a in bad.items():
        h.tensors.append(pb.TensorSpec(name=n, shape=a.shape, dtype="float32", nbytes=a.nbytes))
    msgs = [pb.WeightMessage(header=h)]
    for i, (n, a) in enumerate(bad.items()):
        raw = bytearray(a.tobytes())
        crc = crc32c.crc32c(bytes(raw))
        if n == "b.weight":
            raw[100] ^= 0xFF  # corrupted after its checksum was taken
        msgs.append(pb.WeightMessage(chunk=pb.WeightChunk(tensor_index=i, data=bytes(raw))))
        msgs.append(pb.WeightMessage(done=pb.TensorDone(tensor_index=i, crc32c=crc)))
    msgs.append(pb.WeightMessage(commit=pb.Commit()))
    with SamplerClient(addrs[0], token="tok", timeout=30) as c:
        r = c.push_messages(msgs)
    assert not r.ok and r.code == "DATA_LOSS", r
    for _, b in samplers:  # every sampler still serves version 1, fully
        assert b.version == 1 and _served(b, good)
    with SamplerPool(addrs, token="tok", relay="chain") as pool:  # and the next push goes through
        r = pool.push_weights(bad, 2)
    assert r.ok and not r.removed and r.egress_bytes == MODEL_BYTES


class FailingSwapBackend(RecordingBackend):
    """Verifies and relays pushes but cannot apply version 2 (an engine failure at the swap)."""

    async def apply_weights(self, weights_dir, version):
        if int(version) == 2:
            raise RuntimeError("engine failed to reload")
        await super().apply_weights(weights_dir, version)


def test_head_swap_failure_keeps_children_that_committed(tmp_path):
    specs = {n: (s, "float32") for n, s in SHAPES.items()}
    backends = [FailingSwapBackend(specs, 100), RecordingBackend(specs, 100)]
    servers = [
        ServerThread(b, ServerConfig(staging_root=str(tmp_path / f"s{k}"), data_port=0)).start()
        for k, b in enumerate(backends)
    ]
    try:
        with SamplerPool([s.address for s in servers], relay="chain") as pool:
            assert pool.push_weights(_weights(6), 1).ok
            r = pool.push_weights(_weights(7), 2)
        # the head failed (out of rotation); its child committed v2 and stays in, without a
        # second copy from the trainer
        assert r.removed == (servers[0].address,) and r.per_sampler[servers[1].address].ok
        assert r.egress_bytes == MODEL_BYTES and backends[1].version == 2
        assert backends[0].version == 1 and _served(backends[0], _weights(6))
    finally:
        for s in servers:
            s.stop()
