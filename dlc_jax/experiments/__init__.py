"""dlc_jax.experiments."""
