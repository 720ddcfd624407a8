"""The argument parser of every ``robustmq`` command: usage errors in one line.

It lives below the CLI because the streaming jobs (``topic-to-delta``, ``tier``,
``compact``, ``table-maintenance``) parse their own arguments with it too.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["EXIT_USAGE", "OneLineArgumentParser"]

EXIT_USAGE = 2  # a usage error or bad input, as argparse's own


class OneLineArgumentParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (the usage is one ``--help`` away).

    Exit code 2, as argparse's own. Every ``robustmq`` subcommand's parser is one,
    including the jobs that parse their own arguments (``topic-to-delta``).
    """

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
