"""The argument parser of every ``dlc-jax`` subcommand: argparse raising :class:`UsageError` (a
user error, printed by ``dlc_jax.cli`` in one line) instead of printing several and exiting."""

from __future__ import annotations

import argparse
from typing import NoReturn

from dlc_jax.errors import UserError


class UsageError(UserError):
    """A bad command line (unknown option, missing or malformed argument)."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` raising :class:`UsageError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")
