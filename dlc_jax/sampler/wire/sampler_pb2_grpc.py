"""The `Sampler` service's client stub and server handlers, built from the service descriptor of
`sampler.proto` (in `sampler_pb2`) rather than generated: a method added to the proto needs no
code here. PushWeights messages use `chunk_wire`'s codec (pre-encoded chunks pass through on the
client; the server reads chunk bytes without copying them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc

from . import chunk_wire
from . import sampler_pb2 as pb

_SERVICE = pb.DESCRIPTOR.services_by_name["Sampler"]
SERVICE_NAME = _SERVICE.full_name  # "dlc_jax.sampler.v1.Sampler"


def _methods() -> Iterator[tuple[str, str, Any, Any]]:
    """(name, cardinality e.g. "unary_stream", request class, response class) per method."""
    for m in _SERVICE.methods:
        kind = "_".join(
            "stream" if s else "unary" for s in (m.client_streaming, m.server_streaming)
        )
        yield m.name, kind, getattr(pb, m.input_type.name), getattr(pb, m.output_type.name)


class SamplerStub:
    """One callable attribute per RPC (`Generate`, `PushWeights`, `LoadWeights`, `Info`), as grpc's
    generated stub has."""

    def __init__(self, channel: grpc.Channel):
        for name, kind, req, resp in _methods():
            ser = chunk_wire.serialize_weight_message if req is pb.WeightMessage else None
            call = getattr(channel, kind)(
                f"/{SERVICE_NAME}/{name}",
                request_serializer=ser or req.SerializeToString,
                response_deserializer=resp.FromString,
                _registered_method=True,
            )
            setattr(self, name, call)


def add_service(servicer: object, server: Any) -> None:
    """Register `servicer`'s methods (one per RPC, by name) on a grpc(.aio) server."""
    handlers: dict[str, Callable] = {}
    for name, kind, req, resp in _methods():
        de = chunk_wire.decode_weight_message if req is pb.WeightMessage else None
        handlers[name] = getattr(grpc, f"{kind}_rpc_method_handler")(
            getattr(servicer, name),
            request_deserializer=de or req.FromString,
            response_serializer=resp.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
