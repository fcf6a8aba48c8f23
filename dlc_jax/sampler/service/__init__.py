"""The sampler server: the gRPC service, its config and request checks, the `dlc-jax sampler`
CLI and the subprocess that runs it."""
