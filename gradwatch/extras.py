"""What each part of gradwatch needs installed, and the one sentence that says so.

``pip install gradwatch`` is the core (wire contract, step log, ``check``, ``replay``) and
the probe, which runs on the torch the training environment already has; the ``server``
extra adds the server and dashboard. This module imports neither torch nor fastapi: it
only asks whether they could be imported, so a check costs no import time.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Requirement:
    """A part of gradwatch that needs packages the base install does not bring."""

    what: str
    """What is missing, as the sentence names it."""
    modules: tuple[str, ...]
    """Top-level modules that must be importable."""
    install: str
    """The command that installs them."""

    def missing(self) -> list[str]:
        """The modules of ``modules`` that cannot be imported here."""
        return [m for m in self.modules if not importable(m)]

    def sentence(self, who: str) -> str:
        """One sentence: ``who`` needs this, it is missing, and how to install it."""
        # No closing full stop: the sentence ends in a command a user copies.
        return (f"{who} needs {self.what}, which is not installed in this environment: "
                f"{self.install}")


TORCH = Requirement("torch", ("torch",), "install PyTorch where you train (pip install torch)")
SERVER = Requirement("the server extra (fastapi, uvicorn)", ("fastapi", "uvicorn"),
                     "pip install fastapi 'uvicorn[standard]'")
LIGHTNING = Requirement("Lightning (the lightning or pytorch_lightning package)", ("lightning",),
                        "pip install lightning")
TRANSFORMERS = Requirement("transformers", ("transformers",), "pip install transformers")


def importable(module: str) -> bool:
    """Whether ``import module`` would find it (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder refused it, or sys.modules holds None
        return False


class TorchMissingError(ImportError):
    """Importing the probe (``gradwatch.watch``, ``gradwatch.probe.*``) without torch."""

    def __init__(self) -> None:
        super().__init__(TORCH.sentence("the gradwatch probe (gradwatch.watch)"), name="torch")


def require_torch() -> None:
    """Raise :class:`TorchMissingError` unless torch can be imported.

    Raises:
        TorchMissingError: torch is not installed in this environment.
    """
    if TORCH.missing():
        raise TorchMissingError


class MissingPackageError(ImportError):
    """A part of gradwatch that plugs into a framework, imported where the framework is not
    installed (``gradwatch.lightning`` without Lightning, ...)."""


def require(who: str, requirement: Requirement) -> None:
    """Raise :class:`MissingPackageError` unless torch and ``requirement`` can be imported.

    Raises:
        MissingPackageError: one sentence naming the package ``who`` needs and how to
            install it; ``name`` is the missing module.
    """
    for r in (TORCH, requirement):
        if missing := r.missing():
            raise MissingPackageError(r.sentence(who), name=missing[0])
