"""dlc_jax.plan: ``dlc-jax plan`` -- AOT-compile a training config for a TPU topology on a CPU host
and report whether it fits in HBM, its FLOPs, projected step time and compile time. Importing this
package does not import JAX."""
