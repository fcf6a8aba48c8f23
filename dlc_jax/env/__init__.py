"""Multi-turn and tool-using episodes (docs/ENVIRONMENTS.md): `runner.EnvSampler` runs the
episodes of an environment (`protocol`) behind the `Sampler` protocol on token ids only, so the
trainer trains on exactly the tokens the sampler saw and produced."""

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
