"""The sampler server: gRPC service, config, request checks, `dlc-jax sampler` CLI, subprocess."""
