"""The wire format: the gRPC proto and its generated modules, the Python types of its messages,
the chunk framing and safetensors reading/writing."""
