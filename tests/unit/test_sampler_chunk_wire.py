"""Weight-push fast path (no engine, no server): hand-encoded chunk messages against protobuf's own
encoding, the zero-copy decoder, and CRC-32C verification in the stager (incl. the standard check
value)."""

from __future__ import annotations

import hashlib
import os

import crc32c
import grpc
import numpy as np
import pytest

from dlc_jax.sampler.push.staging import PushError, WeightStager
from dlc_jax.sampler.wire import chunk_wire
from dlc_jax.sampler.wire import sampler_pb2 as pb

EXPECTED = {"a.weight": ((3, 4), "float32"), "b.weight": ((5,), "float32")}


@pytest.mark.parametrize(
    "index,offset,n", [(0, 0, 0), (0, 0, 5), (3, 0, 1), (1, 127, 300), (2**20, 2**40 + 7, 70000)]
)
def test_encode_chunk_equals_protobuf_and_decodes_without_copy(index, offset, n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    raw = chunk_wire.encode_chunk(index, offset, memoryview(data))
    ref = pb.WeightMessage(
        chunk=pb.WeightChunk(tensor_index=index, offset=offset, data=data.tobytes())
    ).SerializeToString()
    assert raw == ref
    c = chunk_wire.decode_weight_message(raw)
    assert isinstance(c, chunk_wire.RawChunk)
    assert (c.tensor_index, c.offset, bytes(c.data)) == (index, offset, data.tobytes())
    if n:
        assert c.data.obj is raw  # a view into the received message, not a copy


def test_decoder_falls_back_to_protobuf_for_other_messages():
    for m in (
        pb.WeightMessage(header=pb.WeightHeader(version=3, checksum="crc32c")),
        pb.WeightMessage(done=pb.TensorDone(tensor_index=1, crc32c=0)),
        pb.WeightMessage(commit=pb.Commit()),
    ):
        got = chunk_wire.decode_weight_message(m.SerializeToString())
        assert isinstance(got, pb.WeightMessage) and got == m
    assert (
        chunk_wire.decode_weight_message(b"").WhichOneof("kind") is None
    )  # empty message: no field set
    # a chunk with an extra field 9 inside: parsed by protobuf (unknown field kept), still a chunk
    raw = chunk_wire.encode_chunk(1, 2, b"xy")
    inner = raw[2:] + b"\x48\x01"
    odd = bytes([0x12, len(inner)]) + inner
    got = chunk_wire.decode_weight_message(odd)
    assert isinstance(got, pb.WeightMessage) and got.chunk.data == b"xy" and got.chunk.offset == 2
    assert chunk_wire.serialize_weight_message(raw) is raw
    assert chunk_wire.serialize_weight_message(pb.WeightMessage(commit=pb.Commit())) == b"\x22\x00"


def test_crc32c_check_value():
    assert crc32c.crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value (RFC 3720)


def _tensors():
    rng = np.random.default_rng(0)
    return {
        "a.weight": rng.standard_normal((3, 4)).astype(np.float32),
        "b.weight": rng.standard_normal(5).astype(np.float32),
    }


def _push(stager, t, *, corrupt_at=None, crc_in_header=False, chunk=7):
    h = pb.WeightHeader(version=1, dtype="float32", checksum="crc32c")
    for n, a in t.items():
        spec = pb.TensorSpec(name=n, shape=list(a.shape), dtype="float32", nbytes=a.nbytes)
        if crc_in_header:
            spec.crc32c = crc32c.crc32c(a.tobytes())
        h.tensors.append(spec)
    stager.header(h)
    for i, a in enumerate(t.values()):
        b = a.tobytes()
        for off in range(0, len(b), chunk):
            data = bytearray(b[off : off + chunk])
            if corrupt_at == (i, off):
                data[0] ^= 1
            stager.chunk(
                chunk_wire.decode_weight_message(chunk_wire.encode_chunk(i, off, bytes(data)))
            )
        if not crc_in_header:
            stager.done(pb.TensorDone(tensor_index=i, crc32c=crc32c.crc32c(b)))
    return stager.commit()


def _expect(code, needle, fn):
    with pytest.raises(PushError) as ei:
        fn()
    assert ei.value.code == code and needle in ei.value.message, ei.value.message


def test_stager_crc32c_happy_paths_and_rejections(tmp_path):
    root = tmp_path / "not" / "yet"  # the staging root is created on demand
    t = _tensors()
    for in_header in (False, True):
        s = WeightStager(EXPECTED, current_version=0, staging_root=str(root))
        d = _push(s, t, crc_in_header=in_header)
        raw = (d / "model.safetensors").read_bytes()
        assert t["a.weight"].tobytes() in raw and t["b.weight"].tobytes() in raw
        s.discard()

    s = WeightStager(EXPECTED, current_version=0, staging_root=str(root))
    _expect(
        grpc.StatusCode.DATA_LOSS,
        "'b.weight': crc32c mismatch",
        lambda: _push(s, t, corrupt_at=(1, 7)),
    )
    s.discard()

    s = WeightStager(EXPECTED, current_version=0, staging_root=str(root))
    _expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "header.checksum 'md5'",
        lambda: s.header(pb.WeightHeader(version=1, checksum="md5")),
    )

    s = WeightStager(
        EXPECTED, current_version=0, staging_root=str(root)
    )  # crc32c header, sha256 trailer only
    h = pb.WeightHeader(
        version=1,
        checksum="crc32c",
        tensors=[
            pb.TensorSpec(name=n, shape=list(a.shape), dtype="float32", nbytes=a.nbytes)
            for n, a in t.items()
        ],
    )
    s.header(h)
    b = t["a.weight"].tobytes()
    s.chunk(pb.WeightChunk(tensor_index=0, offset=0, data=b))
    _expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "no crc32c",
        lambda: s.done(pb.TensorDone(tensor_index=0, sha256=hashlib.sha256(b).hexdigest())),
    )
    s.discard()
    assert os.listdir(root) == []
