"""The ``gradwatch`` command: a thin dispatcher to one module per subcommand.

Each subcommand's module is imported only when it runs, so ``gradwatch check`` works
without torch and ``gradwatch run`` works without fastapi.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS = {
    "run": ("gradwatch.probe.runner", "run a training script under the probe"),
    "check": ("gradwatch.check", "judge a run's step logs; exit 1 on findings, 3 on nothing"),
    "serve": ("gradwatch.server.cli", "start the server and dashboard"),
    "replay": ("gradwatch.replay", "send a saved step log into a server as a run"),
    "demo": ("gradwatch.demo", "server + dashboard + a demo training run with bugs"),
}

SERVER_PACKAGES = frozenset({"fastapi", "starlette", "uvicorn", "plotly"})
"""What the ``[server]`` extra installs: a missing one gets an install hint."""

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
    module_name = COMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        missing = (e.name or "").split(".")[0]
        extra = (" Install it with: pip install 'gradwatch[server]'"
                 if missing in SERVER_PACKAGES else "")
        print(f"gradwatch {name}: cannot load {module_name}: {e}.{extra}", file=sys.stderr)
        return 2
    rc: int = module.main(args[1:])
    return rc


if __name__ == "__main__":
    sys.exit(main())
