"""User errors: problems the user can fix (a config value, a path, a corrupt checkpoint, a sampler
that does not answer), printed by ``dlc-jax`` as one line with a non-zero exit status; a few
well-known library exception types (missing files, YAML syntax errors) are treated the same way."""

from __future__ import annotations

import os


class UserError(Exception):
    """A problem the user can fix; its message is printed as one line, without a traceback."""


# Exception class names (anywhere in the MRO) shown as one line too: the project's own input errors
# (ValueError subclasses that predate UserError) and library errors that mean "bad input".
USER_ERROR_NAMES = {
    "ConfigError",  # dlc_jax.trainer.config
    "DistributedError",  # dlc_jax.trainer.distributed
    "DataError",  # dlc_jax.data.sources
    "RewardError",  # dlc_jax.data.reward_runner
    "UnsupportedModelError",  # dlc_jax.model.config
    "CheckpointError",  # dlc_jax.model.hf_io / dlc_jax.trainer.checkpoint
    "YAMLError",  # yaml: syntax errors
    "HFValidationError",  # huggingface_hub: a path that is not a directory
    "FileNotFoundError",
    "FileExistsError",
    "NotADirectoryError",
    "IsADirectoryError",
    "PermissionError",
}


def is_user_error(e: BaseException) -> bool:
    """True for a :class:`UserError` or an exception of a well-known "bad input" type."""
    return isinstance(e, UserError) or any(c.__name__ in USER_ERROR_NAMES for c in type(e).__mro__)


def one_line(text: str, limit: int = 600) -> str:
    """``text`` on one line (newlines folded, whitespace squeezed), cut at ``limit`` characters."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def user_message(e: BaseException) -> str:
    """The one-line message for a user error ``e``."""
    name = type(e).__name__
    if name == "HFValidationError" or "Repo id must be" in str(e):
        return one_line(f"model path: not an existing directory ({e})")
    if isinstance(e, OSError) and getattr(e, "filename", None) and e.strerror:
        return one_line(f"{e.filename}: {e.strerror}")
    if name.endswith("YAMLError") or any(c.__name__ == "YAMLError" for c in type(e).__mro__):
        return one_line(f"YAML syntax error: {e}")
    return one_line(str(e) or name)


def require_dir(path: str | os.PathLike, what: str) -> None:
    """Raise a :class:`UserError` unless ``path`` is an existing directory."""
    p = os.fspath(path)
    if not os.path.isdir(p):
        state = "is a file, not a directory" if os.path.exists(p) else "does not exist"
        raise UserError(f"{what} {p!r} {state}")
