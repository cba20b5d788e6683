"""The monitors ``bench/peers.py`` compares, each driven the way its own docs show, and the
on-demand install of the peers.

A :class:`Tool` is made once per model and session; ``start``/``stop`` bracket each block of
steps, ``between`` runs after the backward (before the optimizer's step), ``after`` after
the step, and ``finish`` closes what the tool keeps open for the whole session. Everything a
tool writes goes under the directory it was made with, so its size is what it wrote.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import gradwatch

TOOLS = ("wandb", "tensorboard", "lightning", "gradwatch")
PINS = {"wandb": "wandb==0.31.0", "tensorboard": "tensorboard==2.21.0",
        "lightning": "lightning==2.6.6"}
"""What is installed where a tool is missing: versions that install beside torch 2.13.0+cpu
(``lightning`` is in the dev extra already)."""
WRITES_NOTHING = {"lightning": "Lightning's grad_norm writes nothing itself: its norms go to "
                              "whichever logger the Trainer has"}
"""The modes that write nothing themselves, and where their figures go instead."""
LABELS = {
    "wandb": "wandb.watch(log='gradients', log_freq=1), offline",
    "tensorboard": "TensorBoard add_histogram per grad + total norm",
    "lightning": "Lightning grad_norm(norm_type=2), values read",
    "judging": "gradwatch, judging only (norms_every=0)",
    "norms": "gradwatch, judging + norms every step",
}


def modes_of(tools: list[str]) -> list[str]:
    """The timed modes of the chosen tools, in :data:`TOOLS` order (gradwatch has two)."""
    return [m for t in TOOLS if t in tools
            for m in (("judging", "norms") if t == "gradwatch" else (t,))]


def ensure_installed(tools: list[str]) -> dict[str, str]:
    """Install the chosen peers that are missing, pinned (:data:`PINS`), with torch held at
    the installed version; exits if torch changed all the same. Returns each tool's version.
    """
    missing = [t for t in tools if t in PINS and not _version(t)]
    if missing:
        before = _torch_in_subprocess()
        pins = [PINS[t] for t in missing]
        print(f"peers: installing {' '.join(pins)} into {sys.prefix}", file=sys.stderr)
        # A constraint, so pip refuses to solve by replacing torch (a CUDA build, GBs).
        with tempfile.TemporaryDirectory() as d:
            constraint = Path(d) / "torch.txt"
            constraint.write_text(f"torch=={before}\n")
            pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                                  "--disable-pip-version-check", "-c", str(constraint), *pins])
        if pip.returncode != 0:
            sys.exit(f"peers: pip could not install {' '.join(pins)} beside torch=={before} "
                     f"(exit {pip.returncode}, its output above); leave them out with --only")
        importlib.invalidate_caches()
        after = _torch_in_subprocess()
        if after != before or after != torch.__version__:
            sys.exit(f"peers: installing {' '.join(pins)} changed torch from {before} to "
                     f"{after}; refusing to measure (reinstall torch=={before})")
    return {t: _version(t) or "?" for t in tools}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_in_subprocess() -> str:
    """torch's version as a fresh interpreter imports it (this one has it loaded already)."""
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def child_cpu_seconds() -> float | None:
    """CPU time of this process's child processes (wandb's service), or None without psutil."""
    try:
        import psutil
    except ImportError:
        return None
    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            c = p.cpu_times()
        except psutil.Error:  # (one that ended meanwhile)
            continue
        total += c.user + c.system
    return total


def wait_children_idle(quiet: float = 0.002, interval: float = 0.02,
                       limit: float = 30.0) -> None:
    """Wait until the child processes use under ``quiet`` s of CPU in ``interval`` s (at most
    ``limit`` s), so a service still working through one mode's records does not share the
    machine with the next mode's block. Without psutil it cannot tell, and returns."""
    last = child_cpu_seconds()
    deadline = time.monotonic() + limit
    while last is not None and time.monotonic() < deadline:
        time.sleep(interval)
        now = child_cpu_seconds()
        if now is None or now - last < quiet:
            return
        last = now


class Tool:
    """A monitor of one model and optimizer, writing under ``out`` (see the module doc)."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, out: Path) -> None:
        self.model, self.opt, self.out = model, opt, out
        out.mkdir(parents=True, exist_ok=True)

    def start(self, block: int) -> None:
        """Attach before a block of steps."""

    def between(self) -> None:
        """After the backward, before the optimizer's step."""

    def after(self) -> None:
        """After the optimizer's step."""

    def stop(self) -> None:
        """Detach after a block, everything queued so far handed on."""

    def finish(self) -> None:
        """End the session: everything written and closed."""


class WandbWatch(Tool):
    """One offline run per session; the watch is attached per block (``idx=0`` keeps the
    histograms' names the same from block to block)."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, out: Path) -> None:
        super().__init__(model, opt, out)
        import wandb

        self.run: Any = wandb.init(project="gradwatch-peers", dir=out, mode="offline")

    def start(self, block: int) -> None:
        self.run.watch(self.model, log="gradients", log_freq=1, idx=0)

    def after(self) -> None:
        self.run.log({}, commit=True)

    def stop(self) -> None:
        self.run.unwatch(self.model)
        wait_children_idle()  # its service works through the block's records apart

    def finish(self) -> None:
        self.run.finish()


class TensorBoardHistograms(Tool):
    """One event file per session: every gradient's histogram (TensorBoard's default bins)
    and the total norm as a scalar, each step."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, out: Path) -> None:
        super().__init__(model, opt, out)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out))
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.step = 0

    def between(self) -> None:
        grads = [p.grad for _, p in self.params if p.grad is not None]
        for name, p in self.params:
            if p.grad is not None:
                self.writer.add_histogram(f"grad/{name}", p.grad, self.step)
        self.writer.add_scalar("grad_norm/total", torch.nn.utils.get_total_norm(grads),
                               self.step)
        self.step += 1

    def stop(self) -> None:
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class LightningGradNorm(Tool):
    """``grad_norm`` as in ``on_before_optimizer_step``; the dict's tensors read to floats,
    which is what Lightning's logger connector does with logged tensors."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, out: Path) -> None:
        super().__init__(model, opt, out)
        from lightning.pytorch.utilities import grad_norm

        self.grad_norm = grad_norm
        self.last: dict[str, float] = {}

    def between(self) -> None:
        norms = self.grad_norm(self.model, norm_type=2)
        self.last = {k: float(v) for k, v in norms.items()}  # (tensors, despite its hint)


class GradwatchWatch(Tool):
    """A fresh watch and step log per block, as ``bench/probe_overhead.py`` attaches it."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, out: Path,
                 norms_every: int) -> None:
        super().__init__(model, opt, out)
        self.norms_every = norms_every
        self.handle: Any = None

    def start(self, block: int) -> None:
        self.handle = gradwatch.watch(self.opt, log=self.out / f"{block}.jsonl",
                                      norms_every=self.norms_every)

    def stop(self) -> None:
        self.handle.close()


def make_tool(mode: str, model: torch.nn.Module, opt: torch.optim.Optimizer,
              out: Path) -> Tool:
    """The monitor for a mode of :func:`modes_of`, writing under ``out``."""
    if mode == "wandb":
        os.environ.setdefault("WANDB_MODE", "offline")  # never the network, whoever calls
        return WandbWatch(model, opt, out)
    if mode == "tensorboard":
        return TensorBoardHistograms(model, opt, out)
    if mode == "lightning":
        return LightningGradNorm(model, opt, out)
    if mode in ("judging", "norms"):
        return GradwatchWatch(model, opt, out, norms_every=0 if mode == "judging" else 1)
    raise ValueError(f"unknown mode {mode!r}; modes are {modes_of(list(TOOLS))}")
