"""The trainer side: the `Sampler` protocol, gRPC client, pool and in-process sampler."""
