"""The client's PushWeights request stream (`weight_stream.weight_messages`): conversion and
checksums done in the prefetch thread give the same messages as in the caller's thread, and the
trailers carry the checksum of exactly the bytes sent (independent hashlib / crc32c reference)."""

import hashlib

import crc32c
import ml_dtypes
import numpy as np
import pytest

from dlc_jax.sampler.push.weight_stream import weight_messages
from dlc_jax.sampler.wire import chunk_wire
from dlc_jax.sampler.wire import sampler_pb2 as pb


def _tensors():
    rng = np.random.default_rng(0)
    return [
        ("a", rng.standard_normal((5, 7)).astype(np.float32)),
        ("b", rng.standard_normal((300,)).astype(np.float32)),
        ("c", np.asfortranarray(rng.standard_normal((9, 4)).astype(np.float32))),  # not C order
    ]


def _serialized(msgs) -> list[bytes]:
    return [m if isinstance(m, bytes) else m.SerializeToString() for m in msgs]


@pytest.mark.parametrize("checksum", ["crc32c", "sha256"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefetched_stream_identical_and_checksums_match_bytes(checksum, dtype):
    tensors = _tensors()
    names_shapes = [(n, a.shape) for n, a in tensors]
    streams = [
        _serialized(
            weight_messages(iter(tensors), names_shapes, 3, dtype, 64, checksum, prefetch=p)
        )
        for p in (0, 1, 2)
    ]
    assert streams[0] == streams[1] == streams[2]
    np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
    want = [np.ascontiguousarray(a.astype(np_dtype)).tobytes() for _, a in tensors]
    got: list[bytearray] = [bytearray() for _ in tensors]
    dones = []
    for raw in streams[1][1:-1]:
        m = chunk_wire.decode_weight_message(raw)
        if isinstance(m, pb.WeightMessage):
            dones.append(m.done)
        else:
            assert m.offset == len(got[m.tensor_index])
            got[m.tensor_index] += bytes(m.data)
    assert [bytes(g) for g in got] == want
    for d, w in zip(dones, want):
        if checksum == "sha256":
            assert d.sha256 == hashlib.sha256(w).hexdigest()
        else:
            assert d.crc32c == crc32c.crc32c(w)


def test_socket_stream_sends_each_tensor_once_with_its_checksum():
    tensors = _tensors()
    sent: list[tuple[int, bytes]] = []
    msgs = list(
        weight_messages(
            iter(tensors),
            [(n, a.shape) for n, a in tensors],
            1,
            "float32",
            64,
            "crc32c",
            send_data=lambda i, buf: sent.append((i, bytes(buf))),
            push_id="p",
        )
    )
    assert [i for i, _ in sent] == [0, 1, 2]
    crcs = [m.done.crc32c for m in msgs if isinstance(m, pb.WeightMessage) and m.HasField("done")]
    assert crcs == [crc32c.crc32c(b) for _, b in sent]
    assert [b for _, b in sent] == [np.ascontiguousarray(a).tobytes() for _, a in tensors]


def test_bad_tensor_raises_in_the_consumer():
    tensors = [("a", np.zeros((2, 2), np.float32)), ("a", np.zeros((2, 2), np.float32))]
    with pytest.raises(ValueError, match="yielded twice"):
        list(weight_messages(iter(tensors), [("a", (2, 2))], 1, "float32", 64, "crc32c"))
    with pytest.raises(ValueError, match="header says"):
        list(
            weight_messages(
                iter([("a", np.zeros((3,), np.float32))]),
                [("a", (2, 2))],
                1,
                "float32",
                8,
                "crc32c",
            )
        )
