"""The sending side of a sliced multi-sender push (the receiving side and the wire: `sliced_push`).

`part_messages` is the PushWeights stream of one part: the header (all tensors, plus the group
fields), then for each slice this sender owns a `WeightSlice` (tensor index, box), the slice's
C-order bytes in chunks (`chunk_wire.encode_chunk`, offsets inside the slice) and a `TensorDone`
with the CRC-32C of exactly those bytes, then Commit (which ends the part). On the socket data plane
(`send_data`, `SamplerClient.push_with_data`) each slice's bytes go over the part's data connection
right after its `WeightSlice` instead of as chunks. `commit_messages` is the coordinator's stream
that applies the group. Both go through `SamplerClient.push_messages`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import crc32c
import numpy as np

from ..wire import safetensors_io as st
from ..wire import sampler_pb2 as pb
from .weight_stream import TensorSender, as_sent, weight_header

# (HF tensor name, start per dimension, stop per dimension, the slice's values)
Slice = tuple[str, Sequence[int], Sequence[int], np.ndarray]


def part_messages(
    slices: Iterable[Slice],
    names_shapes: list[tuple[str, tuple[int, ...]]],
    version: int,
    dtype: str,
    *,
    group: str,
    part: int,
    parts: int,
    chunk_bytes: int = 16 << 20,
    on_sent: Callable[[int], None] | None = None,
    send_data: Callable[[int, memoryview], None] | None = None,
    push_id: str = "",
    relay_to: Sequence[str] = (),
    relay_fanout: int = 1,
) -> Iterator:
    """One part's stream (see the module docstring). Each slice is converted to `dtype` (C order);
    its shape must be stop - start. ``on_sent(n)``: called with each slice's byte count once handed
    to the transport. ``send_data(tensor_index, bytes)`` / ``push_id``: the socket data plane (a
    data connection the server dropped stops the sending; the server says why it rejects).
    ``relay_to`` / ``relay_fanout``: the samplers the receiver forwards the assembled tensors to
    (the same in every part of the group; `relay`)."""
    socket_id = push_id if send_data is not None else None
    header = weight_header(
        names_shapes, version, dtype, "crc32c", socket_push_id=socket_id,
        relay_to=relay_to, relay_fanout=relay_fanout,
    )  # fmt: skip
    header.push_group, header.push_part, header.push_parts = group, int(part), int(parts)
    yield pb.WeightMessage(header=header)
    out = TensorSender(chunk_bytes, send_data, on_sent)
    np_dtype = st.NP_DTYPES[dtype]
    index = {n: i for i, (n, _) in enumerate(names_shapes)}
    for name, start, stop, arr in slices:
        if name not in index:
            raise ValueError(f"sliced push: tensor {name!r} is not in the header")
        a, buf = as_sent(arr, np_dtype)
        box = tuple(int(b) - int(s) for s, b in zip(start, stop))
        if tuple(a.shape) != box:
            raise ValueError(
                f"sliced push: slice of {name!r} has shape {a.shape}, its box [{list(start)}, "
                f"{list(stop)}) says {box}"
            )
        i = index[name]
        yield pb.WeightMessage(
            slice=pb.WeightSlice(
                tensor_index=i, start=[int(x) for x in start], stop=[int(x) for x in stop]
            )
        )
        yield from out.messages(i, buf, pb.TensorDone(tensor_index=i, crc32c=crc32c.crc32c(buf)))
        del a, buf
    yield pb.WeightMessage(commit=pb.Commit())


def commit_messages(version: int, group: str, parts: int) -> Iterator[pb.WeightMessage]:
    """The coordinator's stream that applies push group `group` (all `parts` parts sent)."""
    header = pb.WeightHeader(
        version=int(version), push_group=group, push_parts=int(parts), group_commit=True
    )
    yield pb.WeightMessage(header=header)
    yield pb.WeightMessage(commit=pb.Commit())
