"""Call sites: the line of the user's code behind a backward, a step or a reset call, found
once per line and named by a small id (a ``Site`` record, sent once).

Thread: training (the backward wrapper, the step hooks and the zero_grad wrappers, through
the tracker).

A notebook cell's line is named as IPython names it (``Cell In[3]``, line 4). A site is the
innermost frame outside torch, gradwatch and the frameworks that call torch on
the user's behalf (Lightning, Transformers, Accelerate). A framework's own helper for the
same call (``accelerator.backward(loss)``, ``self.manual_backward(loss)``, a wrapped
optimizer's ``step`` or ``zero_grad``) counts as the user's call: the line that called the
helper is named. Where the framework drives the loop (``trainer.fit(model)`` runs backward
and step itself), the user's function the callback said stands for that call is named
(:meth:`Sites.stand_in`: the module's ``training_step``, its ``optimizer_zero_grad``
override), else the user's line that started the framework: never a library's line. Frames
of any installed library (``site-packages``, ``dist-packages``) count as a framework's.
"""

# Cost: each code object is classified once (by its module's name); the usual call walks the
# two or three frames of torch and gradwatch above the user's line and finds its site by
# (code, instruction offset) in a dict: no traceback is formatted, no file is read.

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import CodeType, FrameType

from gradwatch.probe.nocompile import skip_tracing
from gradwatch.wire import Site

_USER, _SKIP, _FRAMEWORK = 0, 1, 2
_SKIPPED = frozenset({"torch", "gradwatch", "functorch"})
OUR_USERS = frozenset({"gradwatch.integrations.demo"})
"""gradwatch modules that are training code, not the probe: the demo's loop is its user's
(its lines are named, and its variables name optimizers: :mod:`gradwatch.probe.names`)."""
FRAMEWORKS = frozenset({"lightning", "pytorch_lightning", "lightning_fabric", "transformers",
                        "accelerate", "deepspeed"})
"""Top-level packages that call backward, step and zero_grad on the user's behalf."""
_INSTALLED = ("site-packages", "dist-packages")
"""Folders of installed libraries: their frames are a library's, never the user's lines."""
_VERB = {"backward": "backward", "step": "step", "reset": "zero_grad"}
"""Per role: what a framework helper's name holds when it makes that call for the user."""
_MAX_FRAMES = 96
"""Frames walked at most (a framework-driven loop is a few dozen deep)."""


def _kind(frame: FrameType) -> int:
    name = frame.f_globals.get("__name__")
    top = name.partition(".")[0] if isinstance(name, str) else ""
    if top in _SKIPPED:
        return _USER if name in OUR_USERS else _SKIP
    if top in FRAMEWORKS:
        return _FRAMEWORK
    parts = frame.f_code.co_filename.replace("\\", "/").split("/")
    return _FRAMEWORK if any(p in _INSTALLED for p in parts) else _USER


class Sites:
    """The call sites of one watch session: ids from 1, each sent to ``emit`` once."""

    __slots__ = ("_emit", "_kinds", "_by_key", "_by_line", "_by_def", "_stand_ins",
                 "reset_hook")

    def __init__(self, emit: Callable[[Site], None]) -> None:
        self._emit = emit
        self._kinds: dict[int, tuple[CodeType, int]] = {}
        """``id(code) -> (code, kind)``; the code is kept so that its id stays its own."""
        self._by_key: dict[tuple[int, int], int] = {}
        """``(id(code), f_lasti) -> site id``."""
        self._by_line: dict[tuple[str, int, str], int] = {}
        self._by_def: dict[int, tuple[CodeType, int]] = {}
        """``id(code) -> (code, site id)`` of a function's ``def`` line (a stand-in's, the
        reset hook's), asked for at every call a framework makes: its file's name (a
        notebook cell's costs an IPython call) is looked up once."""
        self._stand_ins: dict[str, CodeType] = {}
        """Per role, the user's code to name where a framework makes the call."""
        self.reset_hook: CodeType | None = None
        """The user's override of the framework's reset hook (a LightningModule's
        ``optimizer_zero_grad``): where resets belong, named by a missed reset even when
        the override never resets."""

    def hook_site(self) -> int:
        """The site of :attr:`reset_hook` (its ``def`` line), 0 without one."""
        code = self.reset_hook
        return 0 if code is None else self._def_site(code)

    def stand_in(self, role: str, code: CodeType) -> None:
        """Name ``code`` (a function of the user's: a LightningModule's ``training_step``,
        its ``optimizer_zero_grad`` override) for the ``role`` calls a framework makes on
        the user's behalf, instead of the framework's own line."""
        self._stand_ins[role] = code

    def here(self, role: str, depth: int = 1) -> int:
        """The site of the ``role`` call (``backward``, ``step`` or ``reset``) being made
        now, ``depth`` frames above the caller of this method; 0 when no frame can be named.
        """
        f: FrameType | None = sys._getframe(depth + 1)
        kinds = self._kinds
        inner: FrameType | None = None  # the innermost framework frame
        outer: FrameType | None = None  # the outermost framework frame so far
        n = 0
        while f is not None and n < _MAX_FRAMES:
            code = f.f_code
            entry = kinds.get(id(code))
            if entry is None:
                entry = kinds[id(code)] = (code, _kind(f))
            kind = entry[1]
            if kind == _USER:
                if outer is None or _VERB[role] in outer.f_code.co_name:
                    sid = self._by_key.get((id(code), f.f_lasti))  # the usual call: known
                    return self._site(f) if sid is None else sid
                # the framework made the call: the user's function standing for it, else
                # the user's line that started the framework (``trainer.fit(model)``)
                stand = self._stand_ins.get(role)
                return self._site(f) if stand is None else self._def_site(stand)
            if kind == _FRAMEWORK:
                if inner is None:
                    inner = f
                outer = f
            f = f.f_back
            n += 1
        stand = self._stand_ins.get(role)
        if stand is not None:
            return self._def_site(stand)
        return 0 if inner is None else self._site(inner)

    skip_tracing(here, "gradwatch's call-site lookup (reads frames)")

    def _site(self, f: FrameType) -> int:
        code = f.f_code
        key = (id(code), f.f_lasti)
        sid = self._by_key.get(key)
        if sid is not None:
            return sid
        if id(code) not in self._kinds:  # keep the code alive while its id is a key
            self._kinds[id(code)] = (code, _kind(f))
        sid = self._by_key[key] = self._line(code, f.f_lineno or code.co_firstlineno)
        return sid

    def _def_site(self, code: CodeType) -> int:
        """The site id of the ``def`` line of ``code``."""
        known = self._by_def.get(id(code))
        if known is not None:
            return known[1]
        sid = self._line(code, code.co_firstlineno)
        self._by_def[id(code)] = (code, sid)  # the code kept: its id stays its own
        return sid

    def _line(self, code: CodeType, lineno: int) -> int:
        """The site id of line ``lineno`` of ``code`` (its ``Site`` sent the first time)."""
        line = (_cell_name(code.co_filename), lineno,
                getattr(code, "co_qualname", code.co_name))
        sid = self._by_line.get(line)
        if sid is None:
            sid = self._by_line[line] = len(self._by_line) + 1
            self._emit(Site(seq=0, t=time.time(), id=sid, file=line[0][:4096], line=line[1],
                            function=line[2][:400]))
        return sid


def _cell_name(filename: str) -> str:
    """A notebook cell's code as IPython names it in tracebacks (``Cell In[3]``), not its
    temporary file (``/tmp/ipykernel_<pid>/<hash>.py``); any other file as given."""
    ipython = sys.modules.get("IPython")  # only a program IPython runs has cells
    if ipython is None:
        return filename
    try:
        shell = ipython.get_ipython()
        named = shell.compile.format_code_name(filename) if shell is not None else None
    except Exception:  # noqa: BLE001 - an older or odd IPython only costs the cell's name
        return filename
    return f"{named[0]} {named[1]}" if named else filename
