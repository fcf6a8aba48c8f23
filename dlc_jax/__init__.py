"""dlc_jax: RL post-training for LLMs in JAX with discrepancy-lag correction (DLC)."""

__version__ = "0.1.0"
