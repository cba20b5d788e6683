"""Training loops on sharded parameters, run by torchrun with two gloo ranks on CPU:
``python sharded_loops.py OUT``, under ``gradwatch run`` or not.

Each scenario (FSDP2's ``fully_shard``, then tensor parallel) builds its own model and
optimizer (the k-th optimizer of the step log is the k-th scenario of :func:`scenarios`),
trains :data:`STEPS` steps of :data:`MICRO` micro-batches, and the script saves, per rank,
every scenario's final local parameters, losses, the norm of the local gradients each step
read and of the whole model's (gathered), each a plain loop of ``vector_norm``, and the RNG
state at the end
(``OUT/rank<r>.pt``): the differential test compares them with and without the probe, bit
for bit.

Resets: ``zero`` (``opt.zero_grad()``), ``keep`` (``set_to_none=False``), ``module``
(``model.zero_grad()``), ``none`` (``p.grad = None``); ``nosync``: gradient sync off on
every micro-batch but the last (FSDP2's ``set_requires_gradient_sync``).
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

STEPS = 6
MICRO = 2


class Scenario(NamedTuple):
    name: str
    opt: str = "adamw"
    reset: str = "zero"
    bug: str = ""
    """``missed_r1`` (rank 1 stops resetting at step 2), ``late`` (the reset runs between
    the backwards and the step), ``discarded`` (between the micro-batches)."""
    nosync: bool = False
    reshard: bool = True
    bf16: bool = False


SCENARIOS: dict[str, list[Scenario]] = {
    "fsdp": [
        Scenario("clean"),
        Scenario("clean_keep_noreshard", reset="keep", reshard=False),
        Scenario("clean_module", reset="module"),
        Scenario("clean_none", reset="none"),
        Scenario("clean_nosync", nosync=True),
        Scenario("clean_bf16", bf16=True),
        Scenario("nosync_reset_between", nosync=True, bug="discarded"),
        Scenario("missed_r1", bug="missed_r1"),
        Scenario("missed_r1_nosync", bug="missed_r1", nosync=True),
        Scenario("late", bug="late"),
        Scenario("late_keep", bug="late", reset="keep"),
        Scenario("discarded", bug="discarded"),
        Scenario("discarded_none", bug="discarded", reset="none"),
    ],
    "tp": [
        Scenario("clean_sgd", opt="sgd"),
        Scenario("clean_adam", opt="adam"),
        Scenario("clean_none_sgd", opt="sgd", reset="none"),
        Scenario("missed_r1_sgd", opt="sgd", bug="missed_r1"),
        Scenario("missed_r1_adam", opt="adam", bug="missed_r1"),
        Scenario("late_adam", opt="adam", bug="late"),
        Scenario("discarded_sgd", opt="sgd", bug="discarded", reset="module"),
    ],
    # DDP, for the resets by hand before the first step (flagged from step 0, as on one
    # process)
    "ddp": [
        Scenario("clean_ddp", opt="sgd"),
        Scenario("late_none_ddp", opt="sgd", bug="late", reset="none"),
        Scenario("discarded_none_ddp", opt="sgd", bug="discarded", reset="none"),
    ],
}


def scenarios() -> list[tuple[str, Scenario]]:
    """Every ``(mode, scenario)``, in the order the script runs them."""
    return [(mode, sc) for mode in ("fsdp", "tp", "ddp") for sc in SCENARIOS[mode]]


def _model() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _fsdp(sc: Scenario) -> torch.nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = _model()
    kw: dict[str, Any] = {"reshard_after_forward": sc.reshard}
    if sc.bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, **kw)
    fully_shard(model, **kw)
    return model


def _tp(sc: Scenario) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = _model()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return model


def _reset(sc: Scenario, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    if sc.reset == "zero":
        opt.zero_grad()
    elif sc.reset == "keep":
        opt.zero_grad(set_to_none=False)
    elif sc.reset == "module":
        model.zero_grad()
    else:
        for p in model.parameters():
            p.grad = None


def _sync(model: torch.nn.Module, on: bool) -> None:
    model.set_requires_gradient_sync(on)  # type: ignore[operator]


def run(mode: str, sc: Scenario, rank: int) -> dict[str, Any]:
    """Train one scenario; its final local parameters and losses."""
    torch.manual_seed(0)
    model = (_fsdp(sc) if mode == "fsdp" else _tp(sc) if mode == "tp"
             else torch.nn.parallel.DistributedDataParallel(_model()))
    params = list(model.parameters())
    opt: torch.optim.Optimizer
    if sc.opt == "sgd":
        opt = torch.optim.SGD(params, lr=0.05)
    elif sc.opt == "adam":
        opt = torch.optim.Adam(params, lr=0.01)
    else:
        opt = torch.optim.AdamW(params, lr=0.01)
    # FSDP2, DDP: each rank its own data; TP: the same data on both (replicated inputs)
    gen = torch.Generator().manual_seed(0 if mode == "tp" else rank)
    losses, norms, full = [], [], []
    for i in range(STEPS):
        if not sc.bug.startswith(("late", "discarded")) and not (
                sc.bug == "missed_r1" and rank == 1 and i >= 2):
            _reset(sc, model, opt)
        for j in range(MICRO):
            last = j == MICRO - 1
            if sc.nosync:
                _sync(model, last)
            if sc.bug == "discarded" and last:
                _reset(sc, model, opt)
            x = torch.randn(8, 4, generator=gen)
            loss = model(x).float().pow(2).mean()
            loss.backward()
            losses.append(loss.detach().clone())
        if sc.bug == "late":
            _reset(sc, model, opt)
        norms.append(_local_norm(params))
        full.append(_full_norm(params))
        opt.step()
    local = [_local(p).detach().clone() for p in model.parameters()]
    return {"params": local, "losses": losses, "norms": norms, "full": full}


def _full_norm(params: list[torch.Tensor]) -> float | None:
    """The norm of the whole model's gradients, gathered (a collective on every rank)."""
    with torch.no_grad():
        sq = [float(torch.linalg.vector_norm(
            (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).double())) ** 2
            for p in params if p.grad is not None]
    return sum(sq) ** 0.5 if sq else None


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _local_norm(params: list[torch.Tensor]) -> float | None:
    """The norm of this rank's shards of the gradients, the slow obvious way."""
    with torch.no_grad():
        sq = [float(torch.linalg.vector_norm(_local(p.grad).double())) ** 2
              for p in params if p.grad is not None]
    return sum(sq) ** 0.5 if sq else None


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {f"{mode}:{sc.name}": run(mode, sc, rank) for mode, sc in scenarios()}
    torch.save({"results": results, "rng": torch.get_rng_state()}, f"{out}/rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
