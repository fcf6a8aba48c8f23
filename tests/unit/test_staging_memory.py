"""Memory staging of a push (`WeightStager(memory=True, load=...)`): bytes land in the mapped
staging file, each tensor reaches the engine's load only once verified, and any corruption, NaN,
short stream or load failure rejects the push with nothing loaded past the bad tensor."""

from __future__ import annotations

import socket
import threading

import crc32c
import grpc
import numpy as np
import pytest

from dlc_jax.sampler.push.staging import WeightStager
from dlc_jax.sampler.push.weight_checks import PushError
from dlc_jax.sampler.wire import chunk_wire
from dlc_jax.sampler.wire import safetensors_io as st
from dlc_jax.sampler.wire import sampler_pb2 as pb

SHAPES = {"a.weight": (64, 33), "b.weight": (1000,), "c.bias": (7, 5, 3)}


class RecordingLoad:
    def __init__(self, fail_on: str | None = None):
        self.got: dict[str, np.ndarray] = {}
        self.fail_on = fail_on

    def add(self, name, array):
        if name == self.fail_on:
            raise RuntimeError("engine out of memory")
        assert not array.flags.writeable
        self.got[name] = np.array(array)  # a copy: the view is valid only during the call


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def _header(w, plane="grpc"):
    h = pb.WeightHeader(version=1, dtype="float32", checksum="crc32c", data_plane=plane)
    for n, a in w.items():
        h.tensors.append(
            pb.TensorSpec(name=n, shape=list(a.shape), dtype="float32", nbytes=a.nbytes)
        )
    return h


def _stager(tmp_path, load):
    expected = {n: (s, "float32") for n, s in SHAPES.items()}
    return WeightStager(expected, 0, str(tmp_path), memory=True, load=load)


def _done(i, a):
    return pb.TensorDone(tensor_index=i, crc32c=crc32c.crc32c(a.tobytes()))


def test_grpc_chunks_load_every_tensor_verified_and_stage_the_file(tmp_path):
    w, load = _weights(), RecordingLoad()
    s = _stager(tmp_path, load)
    s.header(_header(w))
    for i, a in enumerate(w.values()):
        raw = a.tobytes()
        for off in range(0, len(raw), 1000):
            s.chunk(
                chunk_wire.decode_weight_message(
                    chunk_wire.encode_chunk(i, off, raw[off : off + 1000])
                )
            )
        s.done(_done(i, a))
    d = s.commit()
    assert list(load.got) == list(w)  # push order
    for n, a in w.items():
        np.testing.assert_array_equal(load.got[n], a)
    on_disk = dict(st.iter_tensors(d))  # the file is still staged (restore / disk-only engines)
    for n, a in w.items():
        np.testing.assert_array_equal(on_disk[n], a)
    s.discard()


def test_corrupt_tensor_is_never_loaded_and_rejects(tmp_path):
    w, load = _weights(), RecordingLoad()
    s = _stager(tmp_path, load)
    s.header(_header(w))
    names = list(w)
    a0 = w[names[0]]
    s.chunk(pb.WeightChunk(tensor_index=0, offset=0, data=a0.tobytes()))
    s.done(_done(0, a0))
    bad = w[names[1]].copy()
    raw = bytearray(bad.tobytes())
    raw[17] ^= 1
    s.chunk(pb.WeightChunk(tensor_index=1, offset=0, data=bytes(raw)))
    with pytest.raises(PushError) as e:
        s.done(_done(1, bad))
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    s.discard()
    assert names[1] not in load.got and names[2] not in load.got
    assert not list(tmp_path.iterdir())  # staging removed


def test_load_failure_rejects_at_commit(tmp_path):
    w = _weights()
    s = _stager(tmp_path, RecordingLoad(fail_on="b.weight"))
    s.header(_header(w))
    for i, a in enumerate(w.values()):
        s.chunk(pb.WeightChunk(tensor_index=i, offset=0, data=a.tobytes()))
        s.done(_done(i, a))
    with pytest.raises(PushError) as e:
        s.commit()
    assert e.value.code == grpc.StatusCode.INTERNAL and "b.weight" in e.value.message
    s.discard()


def _socket_push(tmp_path, w, load, mutate=None, cut_after=None):
    s = _stager(tmp_path, load)
    s.header(_header(w, plane="socket"))
    a, b = socket.socketpair()
    payload = b"".join(x.tobytes() for x in w.values())
    if mutate is not None:
        payload = mutate(bytearray(payload))
    if cut_after is not None:
        payload = payload[:cut_after]

    def send():
        a.sendall(payload)
        a.close()

    t = threading.Thread(target=send)
    t.start()
    for i, x in enumerate(w.values()):
        s.done(_done(i, x))  # trailers before the bytes: verified once the bytes are in
    try:
        s.read_socket(b, piece=1024)
        return s, s.commit()
    except PushError:
        s.discard()
        raise
    finally:
        t.join()
        b.close()


def test_socket_plane_received_into_memory_and_loaded(tmp_path):
    w, load = _weights(3), RecordingLoad()
    s, d = _socket_push(tmp_path, w, load)
    assert s.bytes_received == sum(x.nbytes for x in w.values())
    for n, a in w.items():
        np.testing.assert_array_equal(load.got[n], a)
    s.discard()


@pytest.mark.parametrize(
    "kind,code",
    [
        ("flip", grpc.StatusCode.DATA_LOSS),
        ("nan", grpc.StatusCode.INVALID_ARGUMENT),
        ("cut", grpc.StatusCode.DATA_LOSS),
    ],
)
def test_socket_plane_bad_bytes_reject_and_load_nothing_past_them(tmp_path, kind, code):
    w, load = _weights(4), RecordingLoad()
    first = w["a.weight"].nbytes
    if kind == "nan":  # checksums over the NaN bytes are valid: the finite check refuses it
        w["b.weight"][5] = np.nan
    mutate = None
    if kind == "flip":

        def mutate(p):
            p[first + 40] ^= 0x10
            return bytes(p)

    with pytest.raises(PushError) as e:
        _socket_push(
            tmp_path, w, load, mutate=mutate, cut_after=first + 100 if kind == "cut" else None
        )
    assert e.value.code == code
    assert "b.weight" not in load.got and "c.bias" not in load.got
    assert not list(tmp_path.iterdir())  # staging removed


def test_relay_groups_chain_and_tree():
    from dlc_jax.sampler.push.relay import relay_groups

    hops = ["a", "b", "c", "d", "e"]
    assert relay_groups(hops, 1) == [hops]  # chain: a forwards to b, ..., d to e
    assert relay_groups(hops, 2) == [["a", "b", "c"], ["d", "e"]]
    assert relay_groups(hops, 9) == [[h] for h in hops]
    assert relay_groups([], 2) == []


def test_memory_staging_keeps_the_free_space_check(tmp_path):
    """Memory staging is bounded like file staging: a push that would leave less than the reserve
    free on the staging filesystem is refused before anything is mapped or loaded."""
    import shutil

    w, load = _weights(), RecordingLoad()
    expected = {n: (s, "float32") for n, s in SHAPES.items()}
    # a reserve above what is free, with room to spare: the other test workers delete files
    free = shutil.disk_usage(tmp_path).free + (1 << 40)
    s = WeightStager(expected, 0, str(tmp_path), reserve_bytes=free, memory=True, load=load)
    with pytest.raises(PushError) as e:
        s.header(_header(w))
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    s.discard()
    assert not load.got and not list(tmp_path.iterdir())
