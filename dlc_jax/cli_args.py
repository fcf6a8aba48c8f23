"""The argument parser of every ``dlc-jax`` subcommand: argparse whose errors are user errors.

Plain argparse prints its usage block and the error on several lines, then exits 2 itself. This
:class:`ArgumentParser` raises :class:`UsageError` (a :class:`dlc_jax.errors.UserError`) instead,
so ``dlc_jax.cli`` prints it like every other user error, in one line:
``dlc-jax COMMAND: error: MESSAGE (see dlc-jax COMMAND --help)``, exit status 2. ``--help`` is
unchanged. Sub-parsers made with ``add_subparsers`` are of the same class.
"""

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
