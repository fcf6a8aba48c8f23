"""Regenerate `sampler_pb2.py` / `sampler_pb2_grpc.py` from `sampler.proto` (needs grpcio-tools).

Usage: `python -m dlc_jax.sampler.wire.gen_proto`. The generated grpc module imports `sampler_pb2`
as a top-level module; we rewrite that to a package-relative import.
"""

from __future__ import annotations

import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent


def generate(out_dir: pathlib.Path = HERE) -> list[pathlib.Path]:
    import grpc_tools
    from grpc_tools import protoc

    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{HERE}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(HERE / "sampler.proto"),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}")
    grpc_mod = out_dir / "sampler_pb2_grpc.py"
    text = grpc_mod.read_text()
    text, n = re.subn(r"^import sampler_pb2 as", "from . import sampler_pb2 as", text, flags=re.M)
    if n != 1:
        raise RuntimeError("could not rewrite the sampler_pb2 import in sampler_pb2_grpc.py")
    grpc_mod.write_text(text)
    return [out_dir / "sampler_pb2.py", grpc_mod]


def main() -> int:
    for p in generate():
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
