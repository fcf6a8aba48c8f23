"""The trainer side: the `Sampler` protocol, the gRPC client, the pool of samplers and the
in-process sampler."""
