"""Multi-turn and tool-using episodes (docs/ENVIRONMENTS.md).

An environment is one class with ``reset(row) -> messages`` and ``step(completion) -> (messages,
reward, done)`` (`protocol`), named by ``env.fn``. `runner.EnvSampler` runs its episodes behind
the `Sampler` protocol on token ids only (`history`, `chat_delta`), so the trainer trains on
exactly the tokens the sampler saw and produced, with a loss mask (environment tokens 0) and the
weight version of every generated token. Built in: `builtin.calculator.Calculator` (tool calls on
chain arithmetic) and `builtin.feedback.Feedback` (try again after a wrong answer).
"""

from dlc_jax.env.chat_delta import ChatDelta, TemplateError
from dlc_jax.env.config import EnvConfig
from dlc_jax.env.history import History
from dlc_jax.env.protocol import EnvError, Environment, load_env_factory
from dlc_jax.env.runner import END_REASONS, EnvSampler, PrefixBreakError, episode_stats
from dlc_jax.env.tool_calls import ToolCall, ToolEnv, format_tool_call, parse_tool_calls

__all__ = [
    "END_REASONS",
    "ChatDelta",
    "EnvConfig",
    "EnvError",
    "EnvSampler",
    "Environment",
    "History",
    "PrefixBreakError",
    "TemplateError",
    "ToolCall",
    "ToolEnv",
    "episode_stats",
    "format_tool_call",
    "load_env_factory",
    "parse_tool_calls",
]
