"""dlc_jax.rl — pure jitted RL math: token log-probs, discrepancy/lag decomposition, ESS,
group advantages, correction losses (DLC and baselines), the resync rule, step metrics.

No I/O and no model import: callers pass hidden states and the unembedding matrix.
"""

from dlc_jax.rl.advantages import ADVANTAGE_MODES, broadcast_to_tokens, group_advantages
from dlc_jax.rl.decomposition import decompose, mismatch_kl
from dlc_jax.rl.ess import ess, ess_from_log_weights, gaussian_ess, sequence_ess
from dlc_jax.rl.logprobs import (OUT_OF_SUPPORT_LOGPROB, TokenLogprobs, reference_token_logprobs,
                                 token_logprobs)
from dlc_jax.rl.loss_inputs import LossConfig, LossInputs, validate_inputs
from dlc_jax.rl.losses import LOSSES, REQUIRED, compute_loss
from dlc_jax.rl.metrics import step_metrics
from dlc_jax.rl.resync import ResyncDecision, resync_decision

__all__ = [
    "ADVANTAGE_MODES", "LOSSES", "LossConfig", "LossInputs", "OUT_OF_SUPPORT_LOGPROB", "REQUIRED",
    "ResyncDecision", "TokenLogprobs", "broadcast_to_tokens", "compute_loss", "decompose", "ess",
    "ess_from_log_weights", "gaussian_ess", "group_advantages", "mismatch_kl",
    "reference_token_logprobs", "resync_decision", "sequence_ess", "step_metrics",
    "token_logprobs", "validate_inputs",
]
