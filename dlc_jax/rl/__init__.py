"""dlc_jax.rl."""
