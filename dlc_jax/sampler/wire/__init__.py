"""The wire format: the gRPC proto, its Python types, the chunk framing and safetensors I/O."""
