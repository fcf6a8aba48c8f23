"""Regenerate `sampler_pb2.py` from `sampler.proto` (needs grpcio-tools):
`python -m dlc_jax.sampler.wire.gen_proto`."""

from __future__ import annotations

import pathlib

HERE = pathlib.Path(__file__).resolve().parent


def generate(out_dir: pathlib.Path = HERE) -> list[pathlib.Path]:
    import grpc_tools
    from grpc_tools import protoc

    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    rc = protoc.main(
        [
            "protoc",
            f"-I{HERE}",
            f"-I{include}",
            f"--python_out={out_dir}",
            str(HERE / "sampler.proto"),
        ]
    )
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}")
    return [out_dir / "sampler_pb2.py"]


if __name__ == "__main__":
    for p in generate():
        print(f"wrote {p}")
