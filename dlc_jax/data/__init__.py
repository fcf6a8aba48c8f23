"""dlc_jax.data."""
