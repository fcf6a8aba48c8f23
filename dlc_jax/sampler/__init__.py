"""dlc_jax.sampler."""
