"""Correct algorithms that throw gradients away on purpose stay clean, with the right step
counts (SAM, FGSM and PGD adversarial training, PCGrad, DINO's last-layer freeze), under
``watch()`` and as ``gradwatch run`` watches (every optimizer the script makes); and the
bugs they resemble still fire."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gradwatch.probe.api import WatchHandle
from gradwatch.steplog import read_log
from gradwatch.verdict import verdict_of
from gradwatch.wire import Step
from tests.probe import deliberate_loops as d
from tests.probe.conftest import Result

STEPS = 4


def _auto(tmp_path: Path, loop: Callable[[], None]) -> Result:
    """What ``gradwatch run`` does: every optimizer the loop makes is watched."""
    path = tmp_path / "auto.jsonl"
    h = WatchHandle([], log=path, auto=True)
    try:
        loop()
    finally:
        h.close()
    log = read_log(path)
    return Result(path, log.records, verdict_of([log.header, *log.records]).findings())


def _clean(r: Result, opt: str, steps: int, backwards: int = 1) -> list[Step]:
    assert r.findings == [], [f.model_dump() for f in r.findings]
    got = r.steps(opt)
    assert [s.step for s in got] == list(range(steps))
    assert all(s.backwards == backwards for s in got), [s.backwards for s in got]
    assert all(not (s.stale or s.leaked or s.late_params or s.discarded) for s in got)
    return got


@pytest.mark.parametrize(("way", "depth"), [("two_steps", 0), ("closure", 0),
                                           ("two_steps", 30)])
def test_sam_watching_the_sam_optimizer(watched: Any, way: str, depth: int) -> None:
    model = d.classifier(depth=depth)
    sam = d.SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    loop = d.sam_two_steps if way == "two_steps" else d.sam_closure
    r = watched(sam, lambda: loop(model, sam, STEPS), model=model)
    steps = _clean(r, "SGD#0", STEPS)  # SAM's base optimizer is the one that steps
    assert all(s.fresh == 4 + 2 * depth for s in steps)
    # SAM's own zero_grad resets the base optimizer's parameters: said so, never "replaced"
    assert {x.how for s in steps for x in s.resets} == {"optimizer_zero_grad"}
    assert all(any(x.site for x in s.resets) for s in steps[1:])


@pytest.mark.parametrize("way", ["two_steps", "closure"])
def test_sam_under_gradwatch_run(tmp_path: Path, way: str) -> None:
    def loop() -> None:
        model = d.classifier()
        sam = d.SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
        (d.sam_two_steps if way == "two_steps" else d.sam_closure)(model, sam, STEPS)

    r = _auto(tmp_path, loop)
    _clean(r, "SGD#1", STEPS)
    # SAM's own optimizer steps through its base one (the closure way: once per batch)
    assert len(r.steps("SAM#0")) == (STEPS if way == "closure" else 0)
    assert r.findings == []


@pytest.mark.parametrize("depth", [0, 30])
def test_sam_without_the_ascent_is_a_reset_inside_the_window(watched: Any, depth: int) -> None:
    """The same calls with no in-place update between backward and reset (SAM's
    ``first_step`` minus ``p.add_``): the first gradient is thrown away unused."""
    model = d.classifier(depth=depth)
    sam = d.SAM(model.parameters(), torch.optim.SGD, lr=0.1)

    def loop() -> None:
        for i in range(STEPS):
            inputs, targets = d.data(i)
            torch.nn.functional.cross_entropy(model(inputs), targets).backward()
            sam.zero_grad()  # through SAM's own optimizer object, nothing read
            torch.nn.functional.cross_entropy(model(inputs), targets).backward()
            sam.base_optimizer.step()
            sam.zero_grad()

    r = watched(sam, loop)
    assert r.kinds() == [("discarded_accumulation", "SGD#0", 0, STEPS)]
    assert [s.backwards for s in r.steps()] == [1] * STEPS


@pytest.mark.parametrize("attack", ["fgsm", "pgd"])
def test_adversarial_training(watched: Any, tmp_path: Path, attack: str) -> None:
    train = d.train_fgsm if attack == "fgsm" else d.train_pgd
    model = d.classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps = _clean(watched(opt, lambda: train(model, opt, STEPS)), "SGD#0", STEPS)
    assert all(s.fresh == 4 for s in steps)

    def auto() -> None:
        m = d.classifier()
        o = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        train(m, o, STEPS)

    _clean(_auto(tmp_path, auto), "SGD#0", STEPS)


def test_an_input_that_requires_grad_alone_changes_nothing(watched: Any) -> None:
    """A reset inside the window stays a bug when no backward wrote an input's gradient."""
    model = d.classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def loop() -> None:
        for i in range(STEPS):
            x, y = d.data(i)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.zero_grad()  # inside a window of 2
            x.requires_grad_(True)  # an input that requires grad, after the lost backward
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    assert watched(opt, loop).kinds() == [("discarded_accumulation", "SGD#0", 0, STEPS)]


def test_pcgrad(watched: Any, tmp_path: Path) -> None:
    net = d.MultiTask()
    pc_adam = d.PCGrad(torch.optim.Adam(net.parameters(), lr=1e-3))
    steps = _clean(watched(pc_adam, lambda: d.train_pcgrad(net, pc_adam, STEPS)), "Adam#0",
                   STEPS)
    # the last task's backward reaches the trunk and its head: its contributions are the
    # fresh ones; the step reads what the surgery wrote into all six
    assert all(s.fresh == 4 and s.consumed == 4 for s in steps)

    def auto() -> None:
        n = d.MultiTask()
        pc = d.PCGrad(torch.optim.Adam(n.parameters(), lr=1e-3))
        d.train_pcgrad(n, pc, STEPS)

    _clean(_auto(tmp_path, auto), "Adam#0", STEPS)


def test_per_task_backwards_without_surgery_are_a_reset_inside_the_window(
        watched: Any) -> None:
    """PCGrad's backwards and resets, stepping on what the last backward left: the trunk's
    first gradient is discarded, and the first head, which only the first task reaches,
    steps on nothing (an optimizer's zero_grad is no per-layer freeze)."""
    net = d.MultiTask()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def loop() -> None:
        for i in range(STEPS):
            x, y = d.data(i)
            y1, y2 = net(x)
            for loss in (torch.nn.functional.cross_entropy(y1, y), y2.pow(2).mean()):
                opt.zero_grad(set_to_none=True)
                loss.backward(retain_graph=True)
            opt.step()

    r = watched(opt, loop)
    assert r.kinds() == [("discarded_accumulation", "Adam#0", 0, STEPS),
                         ("late_reset", "Adam#0", 0, STEPS)]
    late = next(f for f in r.findings if f.kind == "late_reset")
    assert late.params == ["group0.param2", "group0.param3"]  # head1


def _dino() -> tuple[torch.nn.Module, torch.nn.Module, torch.optim.Optimizer]:
    student, teacher = d.dino_student(0), d.dino_student(1)
    teacher.load_state_dict(student.state_dict())
    for p in teacher.parameters():
        p.requires_grad = False
    return student, teacher, torch.optim.AdamW(d.get_params_groups(student), lr=1e-3)


def test_dino_cancels_the_last_layer_in_the_first_epoch(watched: Any, tmp_path: Path) -> None:
    student, teacher, opt = _dino()
    r = watched(opt, lambda: d.train_dino(student, teacher, opt, 2, 3), model=student)
    steps = _clean(r, "AdamW#0", 6)
    n = len([p for p in student.parameters() if p.requires_grad])
    assert [s.fresh for s in steps] == [n - 1] * 3 + [n] * 3  # weight_v frozen in epoch 0

    def auto() -> None:
        s, t, o = _dino()
        d.train_dino(s, t, o, 2, 3)

    _clean(_auto(tmp_path, auto), "AdamW#0", 6)


def _cancel_all(epoch: int, model: torch.nn.Module, freeze: int) -> None:
    for p in model.parameters():
        p.grad = None


def _cancel_half_a_layer(epoch: int, model: torch.nn.Module, freeze: int) -> None:
    model[0].weight.grad = None  # the first layer's bias steps on


@pytest.mark.parametrize("cancel", [_cancel_all, _cancel_half_a_layer])
def test_dropping_more_or_less_than_whole_layers_is_late(watched: Any, cancel: Any) -> None:
    student, teacher, opt = _dino()
    r = watched(opt, lambda: d.train_dino(student, teacher, opt, 1, 3, cancel=cancel),
                model=student)
    assert r.kinds() == [("late_reset", "AdamW#0", 0, 3)]
    late = {p for f in r.findings for p in f.params}
    assert late == ({"0.weight"} if cancel is _cancel_half_a_layer else
                    {n for n, p in student.named_parameters() if p.requires_grad})


class _ActorCritic(torch.nn.Module):
    """A shared trunk, an actor head and a critic head (the critic reads the actor's
    action, so the actor loss also writes the critic's gradients)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk = torch.nn.Linear(6, 8)
        self.actor = torch.nn.Linear(8, 2)
        self.critic = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.Tanh(),
                                          torch.nn.Linear(8, 1))


def _actor_critic(how: str) -> tuple[_ActorCritic, torch.optim.Optimizer,
                                     Callable[[], None]]:
    """``retained``: the actor loss's backward with ``retain_graph=True``, the critic's
    gradients reset, the critic loss's backward through the same graph, one step.
    ``micro``: the same reset between two micro-batches of separate forwards (a bug)."""
    net = _ActorCritic()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def losses(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        s, target = torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)
        h = torch.tanh(net.trunk(s))
        a = torch.tanh(net.actor(h))
        q = net.critic(torch.cat([h, a], 1))
        return -q.mean(), ((q - target) ** 2).mean()

    def loop() -> None:
        for i in range(STEPS):
            opt.zero_grad(set_to_none=True)
            if how == "retained":
                actor_loss, critic_loss = losses(i)
                actor_loss.backward(retain_graph=True)
                net.critic.zero_grad(set_to_none=True)  # the actor loss's share, removed
                critic_loss.backward()
            else:
                # retained too: only the graph the next backward runs through tells them apart
                losses(2 * i)[1].backward(retain_graph=True)
                net.critic.zero_grad(set_to_none=True)  # throws micro-batch 1 away
                losses(2 * i + 1)[1].backward()
            opt.step()

    return net, opt, loop


def test_actor_critic_through_one_retained_graph(watched: Any, tmp_path: Path) -> None:
    """Loss surgery through one retained graph is correct: every step clean, two backwards
    each, under watch() and gradwatch run."""
    _, opt, loop = _actor_critic("retained")
    _clean(watched(opt, loop), "Adam#0", STEPS, backwards=2)
    _clean(_auto(tmp_path, lambda: _actor_critic("retained")[2]()), "Adam#0", STEPS,
           backwards=2)  # the optimizer made under the watch, as gradwatch run sees it


def test_a_reset_between_micro_batches_of_separate_forwards_stays_a_finding(
        watched: Any) -> None:
    _, opt, loop = _actor_critic("micro")
    r = watched(opt, loop)
    assert r.kinds() == [("discarded_accumulation", "Adam#0", 0, STEPS)]
    assert r.findings[0].params == [f"group0.param{k}" for k in range(4, 8)]  # the critic's
    assert all(s.discarded == 4 for s in r.steps("Adam#0"))
