"""Sending a sliced multi-sender push (receiving: `sliced`): a part's and the commit's streams."""

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
    """One part's stream: the header, then per slice a `WeightSlice`, its bytes in `dtype` and a
    `TensorDone` with their CRC-32C, then Commit; other arguments as in `weight_messages`."""
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
