"""Copy-light wire encoding of `WeightMessage{chunk: WeightChunk}`: one copy of the data to encode,
a zero-copy `RawChunk` view to decode (other messages: protobuf-parsed)."""

from __future__ import annotations

import dataclasses

from . import sampler_pb2 as pb

_CHUNK_TAG = 0x12  # field 2 (WeightMessage.chunk), wire type 2 (length-delimited)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf, pos: int) -> tuple[int, int]:
    """-> (value, position after it); ValueError past the end or beyond 10 bytes."""
    n = shift = 0
    for _ in range(10):
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7
    raise ValueError("varint longer than 10 bytes")


def encode_chunk(tensor_index: int, offset: int, data) -> bytes:
    """Serialized `WeightMessage(chunk=WeightChunk(tensor_index, offset, data))` (any buffer)."""
    n = memoryview(data).nbytes
    inner = bytearray()
    if tensor_index:
        inner += b"\x08" + _varint(tensor_index)
    if offset:
        inner += b"\x10" + _varint(offset)
    if n:
        inner += b"\x1a" + _varint(n)
    head = bytes([_CHUNK_TAG]) + _varint(len(inner) + n) + bytes(inner)
    return b"".join((head, data)) if n else head


@dataclasses.dataclass(frozen=True)
class RawChunk:
    """A decoded chunk message; `data` is a memoryview into the received message bytes."""

    tensor_index: int
    offset: int
    data: memoryview


def _decode_chunk(raw: bytes) -> RawChunk | None:
    """Parse `raw` as exactly one chunk field holding fields 1-3; None if it is anything else."""
    if not raw or raw[0] != _CHUNK_TAG:
        return None
    length, pos = _read_varint(raw, 1)
    if pos + length != len(raw):
        return None
    index = offset = 0
    data = memoryview(b"")
    mv = memoryview(raw)
    while pos < len(raw):
        tag, pos = _read_varint(raw, pos)
        if tag == 0x08:
            index, pos = _read_varint(raw, pos)
        elif tag == 0x10:
            offset, pos = _read_varint(raw, pos)
        elif tag == 0x1A:
            n, pos = _read_varint(raw, pos)
            if pos + n > len(raw):
                return None
            data = mv[pos : pos + n]
            pos += n
        else:
            return None
    if index >= 1 << 32:
        return None
    return RawChunk(index, offset, data)


def decode_weight_message(raw: bytes) -> RawChunk | pb.WeightMessage:
    """gRPC request deserializer for PushWeights."""
    try:
        c = _decode_chunk(raw)
    except ValueError:
        c = None
    return c if c is not None else pb.WeightMessage.FromString(raw)


def serialize_weight_message(m: bytes | pb.WeightMessage) -> bytes:
    """gRPC request serializer for PushWeights: pre-encoded chunks pass through."""
    return m if isinstance(m, bytes) else m.SerializeToString()
