"""dlc_jax.model."""
