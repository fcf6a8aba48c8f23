"""dlc_jax.rl — pure jitted RL math: token log-probs, discrepancy/lag decomposition, ESS, group
advantages, correction losses, the resync rule, step metrics. No I/O and no model import. Names
are loaded on first use, so ``dlc_jax.rl.loss_config`` imports without JAX."""

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

__all__ = sorted(_MODULE_OF)

if TYPE_CHECKING:  # the names of __all__ for type checkers
    from .advantages import ADVANTAGE_MODES, broadcast_to_tokens, group_advantages  # noqa: F401
    from .decomposition import decompose, mismatch_kl  # noqa: F401
    from .effective_sample_size import ess, ess_from_log_weights, gaussian_ess, sequence_ess  # noqa: F401
    from .logprobs import OUT_OF_SUPPORT_LOGPROB, TokenLogprobs, token_logprobs  # noqa: F401
    from .loss_config import LOSS_NAMES, LOSS_SPECS, LossConfig, LossSpec  # noqa: F401
    from .loss_inputs import LossInputs, validate_inputs  # noqa: F401
    from .losses import LOSSES, compute_loss, register_loss  # noqa: F401
    from .metrics import step_metrics  # noqa: F401
    from .resync import ResyncDecision, resync_decision  # noqa: F401
    from .vocab_parallel import truncates, vocab_parallel_token_logprobs, vocab_shards  # noqa: F401


def __getattr__(name: str) -> Any:
    mod = _MODULE_OF.get(name)
    if mod is None:
        raise AttributeError(f"module 'dlc_jax.rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dlc_jax.rl.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))


# A name exported like a submodule would be shadowed by that submodule once something imports it.
assert not set(_MODULE_OF) & {m.name for m in pkgutil.iter_modules(__path__)}
