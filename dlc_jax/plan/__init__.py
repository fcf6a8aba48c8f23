"""dlc_jax.plan: ``dlc-jax plan`` -- AOT-compile a training config for a TPU topology on a CPU host
and report whether it fits in HBM, its FLOPs, projected step time and compile time.

Modules: ``chips`` (per-chip HBM and bf16 peak), ``topology`` (slice names -> libtpu topology),
``abstract_state`` (the run's state as sharded shapes), ``compile`` (AOT compile + XLA analyses),
``flops`` (analytic FLOPs vs XLA's count), ``roofline`` (per-program compute / HBM / ICI time and
bound), ``report`` (the plan, fit verdict, advice), ``markdown``, ``cli``. The TPU compiler flags
the plan compiles with are ``dlc_jax.tpu_flags`` (shared with the trainer). Importing this
package does not import JAX.
"""

from dlc_jax.plan.config import PlanConfig

__all__ = ["PlanConfig"]
