"""dlc_jax.rl — pure jitted RL math: token log-probs, discrepancy/lag decomposition, ESS,
group advantages, correction losses (DLC and baselines), the resync rule, step metrics.

No I/O and no model import: callers pass hidden states and the unembedding matrix.
Names are loaded on first use, so ``dlc_jax.rl.loss_config`` (``LossConfig``, ``LOSS_SPECS``)
imports without JAX.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "advantages": ("ADVANTAGE_MODES", "broadcast_to_tokens", "group_advantages"),
    "decomposition": ("decompose", "mismatch_kl"),
    "effective_sample_size": ("ess", "ess_from_log_weights", "gaussian_ess", "sequence_ess"),
    "logprobs": ("OUT_OF_SUPPORT_LOGPROB", "TokenLogprobs", "token_logprobs"),
    "loss_config": ("LOSS_NAMES", "LOSS_SPECS", "LossConfig", "LossSpec"),
    "loss_inputs": ("LossInputs", "validate_inputs"),
    "losses": ("LOSSES", "compute_loss", "register_loss"),
    "metrics": ("step_metrics",),
    "resync": ("ResyncDecision", "resync_decision"),
    "vocab_parallel": ("truncates", "vocab_parallel_token_logprobs", "vocab_shards"),
}
_MODULE_OF = {name: mod for mod, names in _EXPORTS.items() for name in names}

if TYPE_CHECKING:
    from dlc_jax.rl.advantages import ADVANTAGE_MODES, broadcast_to_tokens, group_advantages
    from dlc_jax.rl.decomposition import decompose, mismatch_kl
    from dlc_jax.rl.effective_sample_size import (
        ess,
        ess_from_log_weights,
        gaussian_ess,
        sequence_ess,
    )
    from dlc_jax.rl.logprobs import OUT_OF_SUPPORT_LOGPROB, TokenLogprobs, token_logprobs
    from dlc_jax.rl.loss_config import LOSS_NAMES, LOSS_SPECS, LossConfig, LossSpec
    from dlc_jax.rl.loss_inputs import LossInputs, validate_inputs
    from dlc_jax.rl.losses import LOSSES, compute_loss, register_loss
    from dlc_jax.rl.metrics import step_metrics
    from dlc_jax.rl.resync import ResyncDecision, resync_decision
    from dlc_jax.rl.vocab_parallel import truncates, vocab_parallel_token_logprobs, vocab_shards


def __getattr__(name: str) -> Any:
    mod = _MODULE_OF.get(name)
    if mod is None:
        raise AttributeError(f"module 'dlc_jax.rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dlc_jax.rl.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))


__all__ = [
    "ADVANTAGE_MODES",
    "LOSSES",
    "LOSS_NAMES",
    "LOSS_SPECS",
    "LossConfig",
    "LossInputs",
    "LossSpec",
    "OUT_OF_SUPPORT_LOGPROB",
    "ResyncDecision",
    "TokenLogprobs",
    "broadcast_to_tokens",
    "compute_loss",
    "decompose",
    "ess",
    "ess_from_log_weights",
    "gaussian_ess",
    "group_advantages",
    "mismatch_kl",
    "register_loss",
    "resync_decision",
    "sequence_ess",
    "step_metrics",
    "token_logprobs",
    "truncates",
    "validate_inputs",
    "vocab_parallel_token_logprobs",
    "vocab_shards",
]
assert sorted(__all__) == sorted(_MODULE_OF)
# A name exported like a submodule would be shadowed by that submodule once something imports it.
assert not set(_MODULE_OF) & {m.name for m in pkgutil.iter_modules(__path__)}
