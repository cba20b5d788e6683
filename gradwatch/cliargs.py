"""The argument parser every ``gradwatch`` subcommand uses.

A wrong argument is a usage error: the usage line, then ``gradwatch CMD: what was wrong``
on stderr, and exit code 2 (a contract of every subcommand). ``--help`` reads as help: the
reST markup of the docstrings it quotes is dropped, and each option says its default.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, NoReturn

_MARKUP = re.compile(r"``([^`]*)``|:\w+:`~?([^`]*)`")


def printable(text: str) -> str:
    """``text`` with what a terminal would act on escaped (``\\x1b``, ``\\u202e``): names
    come from logs anyone may have written, and an escape sequence or a bidi override in
    one must show as what it is. Newlines and tabs stay."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else c.encode("unicode_escape").decode()
                   for c in text)


def quiet_print(text: str) -> None:
    """Print ``text`` to stdout; a reader that stopped reading (``gradwatch check LOG |
    head``) ends the output quietly: no BrokenPipeError, now or at exit."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that is quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def summary(doc: str | None) -> str:
    """The first paragraph of a module docstring, on one line, as a parser's description."""
    first = (doc or "").strip().split("\n\n")[0]
    return plain(" ".join(line.strip() for line in first.splitlines()))


def plain(text: str) -> str:
    """``text`` without reST markup: ````code```` and ``:class:`x``` become ``code``, ``x``."""
    return _MARKUP.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)


class _HelpFormatter(argparse.HelpFormatter):
    """Adds ``(default: X)`` to an option's help where it has a default worth saying (not
    None, not False, and not already said)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if ("default" not in text and action.option_strings and d is not None
                and d is not False and d != [] and d != ""
                and d is not argparse.SUPPRESS and action.nargs != 0):
            text += " (default: %(default)s)"
        return text


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors name the subcommand and exit 2.

    ``prog`` is the command as a user types it (``"gradwatch check"``); messages are
    prefixed with it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def format_help(self) -> str:
        return plain(super().format_help())

    def format_usage(self) -> str:
        return plain(super().format_usage())

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: {plain(message)}", file=sys.stderr)
        raise SystemExit(2)
