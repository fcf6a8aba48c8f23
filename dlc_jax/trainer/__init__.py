"""dlc_jax.trainer."""
