"""The ``gradwatch`` command: a thin dispatcher to one module per subcommand.

Each subcommand's module is imported only when it runs, so ``gradwatch check`` works
without torch and ``gradwatch run`` works without fastapi. A subcommand whose packages are
missing (:data:`NEEDS`) prints one line saying what to install and exits 2.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from gradwatch.extras import SERVER, TORCH, Requirement

COMMANDS = {
    "run": ("gradwatch.probe.runner", "run a training script under the probe"),
    "check": ("gradwatch.check", "judge a run's step logs; exit 1 on findings, 3 on nothing"),
    "serve": ("gradwatch.server.cli", "start the server and dashboard"),
    "replay": ("gradwatch.replay", "send a saved step log into a server as a run"),
    "demo": ("gradwatch.integrations.demo", "server + dashboard + a demo training run with bugs"),
}

NEEDS: dict[str, tuple[Requirement, ...]] = {
    "run": (TORCH,),
    "serve": (SERVER,),
    "demo": (SERVER, TORCH),
}
"""What a subcommand needs beyond the base install; a missing one is named in one line
before anything is imported (``demo`` imports torch and starts the server only later)."""

STOPPED_BY_CTRL_C = ("serve", "demo")
"""Commands that run until Ctrl-C: it is their normal end (exit 0) at any moment; any
other command it interrupts exits 130 (128 + SIGINT), as a shell reports it."""

USAGE = "usage: gradwatch {" + ",".join(COMMANDS) + "} ...\n\n" + "\n".join(
    f"  {name:<8}{help_}" for name, (_, help_) in COMMANDS.items()
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gradwatch`` console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from gradwatch import __version__

        print(f"gradwatch {__version__}")
        return 0
    name = args[0]
    if name not in COMMANDS:
        print(f"gradwatch: unknown command '{name}'\n{USAGE}", file=sys.stderr)
        return 2
    missing = [req for req in NEEDS.get(name, ()) if req.missing()]
    for req in missing:
        print(req.sentence(f"gradwatch {name}"), file=sys.stderr)
    if missing:
        return 2
    module_name = COMMANDS[name][0]
    try:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:  # a broken install: say which import failed, in one line
            print(f"gradwatch {name}: cannot load {module_name}: {e}", file=sys.stderr)
            return 2
        rc: int = module.main(args[1:])
    except KeyboardInterrupt:
        # A Ctrl-C the command did not handle itself (it came while the command was still
        # importing or starting up): one line, not a traceback from wherever it landed.
        print(f"gradwatch {name}: stopped", file=sys.stderr, flush=True)
        return 0 if name in STOPPED_BY_CTRL_C else 130
    except BrokenPipeError:  # the reader of our output went away (`| head`): end quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # 128 + SIGPIPE, as a shell reports a command a pipe ended
    return rc


if __name__ == "__main__":
    sys.exit(main())
