"""gradwatch: catch gradient-reset bugs (missed, late, misplaced zero_grad) at run time.

``gradwatch.watch`` lives in the probe, which imports torch; it is loaded on first use so
that the torch-free parts (the wire contract, ``check``, the server) import without torch.
Where torch is missing, ``gradwatch.watch`` raises :class:`gradwatch.extras.TorchMissingError`
(an ``ImportError``) with one sentence that says to install it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gradwatch.probe import watch as watch

__all__ = ["__version__", "watch"]


def __getattr__(name: str) -> Any:
    if name == "watch":
        from gradwatch.probe import watch

        return watch
    raise AttributeError(f"module 'gradwatch' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gradwatch``: adds the ``%gradwatch on|off|status`` magic
    (:mod:`gradwatch.integrations.notebook`)."""
    from gradwatch.integrations.notebook import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext gradwatch``: closes the notebook's watch session, if one is open."""
    from gradwatch.integrations.notebook import unload_ipython_extension as unload

    unload(ipython)
