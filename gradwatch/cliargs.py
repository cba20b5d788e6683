"""The argument parser every ``gradwatch`` subcommand uses.

A wrong argument is a usage error: the usage line, then ``gradwatch CMD: what was wrong``
on stderr, and exit code 2 (a contract of every subcommand).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors name the subcommand and exit 2.

    ``prog`` is the command as a user types it (``"gradwatch check"``); messages are
    prefixed with it.
    """

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)
