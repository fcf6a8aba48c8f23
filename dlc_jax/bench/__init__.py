"""dlc_jax.bench."""
