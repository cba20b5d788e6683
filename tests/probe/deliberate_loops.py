"""Small faithful re-implementations of correct training code that throws gradients away on
purpose: SAM (davda54/sam), FGSM and PGD adversarial training (locuslab/fast_adversarial),
PCGrad (WeiChengTseng/Pytorch-PCGrad) and DINO's ``cancel_gradients_last_layer``
(facebookresearch/dino). The algorithms' code is kept as published; only models and data
are tiny and on the CPU."""

from __future__ import annotations

import copy
import math
import random
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


# ---------------------------------------------------------------- SAM (davda54/sam, sam.py)
class SAM(torch.optim.Optimizer):
    def __init__(self, params: Any, base_optimizer: Any, rho: float = 0.05,
                 adaptive: bool = False, **kwargs: Any) -> None:
        assert rho >= 0.0, f"Invalid rho, should be non-negative: {rho}"
        defaults = dict(rho=rho, adaptive=adaptive, **kwargs)
        super().__init__(params, defaults)
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups
        self.defaults.update(self.base_optimizer.defaults)

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        grad_norm = self._grad_norm()
        for group in self.param_groups:
            scale = group["rho"] / (grad_norm + 1e-12)
            for p in group["params"]:
                if p.grad is None:
                    continue
                self.state[p]["old_p"] = p.data.clone()
                e_w = (torch.pow(p, 2) if group["adaptive"] else 1.0) * p.grad * scale.to(p)
                p.add_(e_w)  # climb to the local maximum "w + e(w)"
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                p.data = self.state[p]["old_p"]  # get back to "w" from "w + e(w)"
        self.base_optimizer.step()  # do the actual "sharpness-aware" update
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        assert closure is not None, "Sharpness Aware Minimization requires closure"
        closure = torch.enable_grad()(closure)  # the closure should do a full forward-backward
        self.first_step(zero_grad=True)
        closure()
        self.second_step()

    def _grad_norm(self) -> torch.Tensor:
        shared_device = self.param_groups[0]["params"][0].device
        return torch.norm(torch.stack([
            ((torch.abs(p) if group["adaptive"] else 1.0) * p.grad).norm(p=2).to(shared_device)
            for group in self.param_groups for p in group["params"] if p.grad is not None]),
            p=2)


def classifier(seed: int = 0, n_in: int = 4, n_out: int = 3, depth: int = 0) -> nn.Module:
    """Two layers, and ``depth`` more in between (more parameters than the probe samples)."""
    torch.manual_seed(seed)
    middle = [m for _ in range(depth) for m in (nn.Linear(16, 16), nn.ReLU())]
    return nn.Sequential(nn.Linear(n_in, 16), nn.ReLU(), *middle, nn.Linear(16, n_out))


def data(i: int, n_in: int = 4, n_out: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(16, n_in, generator=g), torch.randint(0, n_out, (16,), generator=g)


def sam_two_steps(model: nn.Module, optimizer: SAM, steps: int) -> None:
    """davda54/sam example/train.py: two forward-backward passes per batch."""
    for i in range(steps):
        inputs, targets = data(i)
        predictions = model(inputs)
        loss = F.cross_entropy(predictions, targets)
        loss.mean().backward()
        optimizer.first_step(zero_grad=True)
        F.cross_entropy(model(inputs), targets).mean().backward()
        optimizer.second_step(zero_grad=True)


def sam_closure(model: nn.Module, optimizer: SAM, steps: int) -> None:
    """davda54/sam README: the closure way."""
    for i in range(steps):
        inputs, targets = data(i)

        def closure(inputs: torch.Tensor = inputs, targets: torch.Tensor = targets
                    ) -> torch.Tensor:
            loss = F.cross_entropy(model(inputs), targets)
            loss.backward()
            return loss

        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step(closure)
        optimizer.zero_grad()


# ------------------------------------------- FGSM / PGD (locuslab/fast_adversarial, CIFAR10)
EPSILON, ALPHA = torch.tensor(0.1), torch.tensor(0.125)
LOWER, UPPER = torch.tensor(-3.0), torch.tensor(3.0)  # the repository's tensors, per channel


def clamp(X: torch.Tensor, lower_limit: Any, upper_limit: Any) -> torch.Tensor:
    return torch.max(torch.min(X, upper_limit), lower_limit)


def train_fgsm(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    """train_fgsm.py's loop (delta_init 'random', no amp)."""
    criterion = nn.CrossEntropyLoss()
    delta = torch.zeros(16, 4)
    for i in range(steps):
        X, y = data(i)
        delta.uniform_(-float(EPSILON), float(EPSILON))
        delta.data = clamp(delta, LOWER - X, UPPER - X)
        delta.requires_grad = True
        output = model(X + delta[:X.size(0)])
        loss = F.cross_entropy(output, y)
        loss.backward()
        grad = delta.grad.detach()
        delta.data = clamp(delta + ALPHA * torch.sign(grad), -EPSILON, EPSILON)
        delta.data[:X.size(0)] = clamp(delta[:X.size(0)], LOWER - X, UPPER - X)
        delta = delta.detach()
        output = model(X + delta[:X.size(0)])
        loss = criterion(output, y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def attack_pgd(model: nn.Module, X: torch.Tensor, y: torch.Tensor, epsilon: torch.Tensor,
               alpha: torch.Tensor, attack_iters: int, restarts: int) -> torch.Tensor:
    """utils.py's attack_pgd (no amp)."""
    max_loss = torch.zeros(y.shape[0])
    max_delta = torch.zeros_like(X)
    for _ in range(restarts):
        delta = torch.zeros_like(X).uniform_(-float(epsilon), float(epsilon))
        delta.data = clamp(delta, LOWER - X, UPPER - X)
        delta.requires_grad = True
        for _ in range(attack_iters):
            output = model(X + delta)
            index = torch.where(output.max(1)[1] == y)
            if len(index[0]) == 0:
                break
            loss = F.cross_entropy(output, y)
            loss.backward()
            grad = delta.grad.detach()
            d = delta[index[0], :]
            g = grad[index[0], :]
            d = clamp(d + alpha * torch.sign(g), -epsilon, epsilon)
            d = clamp(d, LOWER - X[index[0], :], UPPER - X[index[0], :])
            delta.data[index[0], :] = d
            delta.grad.zero_()
        all_loss = F.cross_entropy(model(X + delta), y, reduction="none").detach()
        max_delta[all_loss >= max_loss] = delta.detach()[all_loss >= max_loss]
        max_loss = torch.max(max_loss, all_loss)
    return max_delta


def train_pgd(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    """train_pgd.py's loop; the labels are the model's own predictions, so that every
    attack runs its iterations (it stops once nothing is classified right)."""
    criterion = nn.CrossEntropyLoss()
    for i in range(steps):
        X, _ = data(i)
        with torch.no_grad():
            y = model(X).argmax(1)
        delta = attack_pgd(model, X, y, EPSILON, ALPHA / 4, attack_iters=3, restarts=1)
        output = model(clamp(X + delta[:X.size(0)], LOWER, UPPER))
        loss = criterion(output, y)
        opt.zero_grad()
        loss.backward()
        opt.step()


# --------------------------------------------- PCGrad (WeiChengTseng/Pytorch-PCGrad, pcgrad.py)
class PCGrad:
    def __init__(self, optimizer: torch.optim.Optimizer, reduction: str = "mean") -> None:
        self._optim, self._reduction = optimizer, reduction

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optim

    def zero_grad(self) -> None:
        return self._optim.zero_grad(set_to_none=True)

    def step(self) -> None:
        self._optim.step()

    def pc_backward(self, objectives: list[torch.Tensor]) -> None:
        grads, shapes, has_grads = self._pack_grad(objectives)
        pc_grad = self._project_conflicting(grads, has_grads)
        pc_grad = self._unflatten_grad(pc_grad, shapes[0])
        self._set_grad(pc_grad)

    def _project_conflicting(self, grads: list[torch.Tensor], has_grads: list[torch.Tensor]
                             ) -> torch.Tensor:
        shared = torch.stack(has_grads).prod(0).bool()
        pc_grad = copy.deepcopy(grads)
        for g_i in pc_grad:
            random.shuffle(grads)
            for g_j in grads:
                g_i_g_j = torch.dot(g_i, g_j)
                if g_i_g_j < 0:
                    g_i -= (g_i_g_j) * g_j / (g_j.norm() ** 2)
        merged_grad = torch.zeros_like(grads[0]).to(grads[0].device)
        merged_grad[shared] = torch.stack([g[shared] for g in pc_grad]).mean(dim=0)
        merged_grad[~shared] = torch.stack([g[~shared] for g in pc_grad]).sum(dim=0)
        return merged_grad

    def _set_grad(self, grads: list[torch.Tensor]) -> None:
        idx = 0
        for group in self._optim.param_groups:
            for p in group["params"]:
                p.grad = grads[idx]
                idx += 1

    def _pack_grad(self, objectives: list[torch.Tensor]) -> tuple[list[Any], list[Any],
                                                                   list[Any]]:
        grads, shapes, has_grads = [], [], []
        for obj in objectives:
            self._optim.zero_grad(set_to_none=True)
            obj.backward(retain_graph=True)
            grad, shape, has_grad = self._retrieve_grad()
            grads.append(self._flatten_grad(grad))
            has_grads.append(self._flatten_grad(has_grad))
            shapes.append(shape)
        return grads, shapes, has_grads

    def _unflatten_grad(self, grads: torch.Tensor, shapes: list[Any]) -> list[torch.Tensor]:
        unflatten_grad, idx = [], 0
        for shape in shapes:
            length = math.prod(shape)
            unflatten_grad.append(grads[idx:idx + length].view(shape).clone())
            idx += length
        return unflatten_grad

    def _flatten_grad(self, grads: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([g.flatten() for g in grads])

    def _retrieve_grad(self) -> tuple[list[Any], list[Any], list[Any]]:
        grad, shape, has_grad = [], [], []
        for group in self._optim.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    shape.append(p.shape)
                    grad.append(torch.zeros_like(p).to(p.device))
                    has_grad.append(torch.zeros_like(p).to(p.device))
                    continue
                shape.append(p.grad.shape)
                grad.append(p.grad.clone())
                has_grad.append(torch.ones_like(p).to(p.device))
        return grad, shape, has_grad


class MultiTask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Sequential(nn.Linear(4, 16), nn.ReLU())
        self.head1, self.head2 = nn.Linear(16, 3), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return self.head1(h), self.head2(h)


def train_pcgrad(net: MultiTask, pc_adam: PCGrad, steps: int) -> None:
    """The repository's README loop."""
    random.seed(0)
    for i in range(steps):
        x, y = data(i)
        pc_adam.zero_grad()
        y1, y2 = net(x)
        loss1, loss2 = F.cross_entropy(y1, y), (y2 - 1.0).pow(2).mean()
        pc_adam.pc_backward([loss1, loss2])
        pc_adam.step()


# ------------------------------------------- DINO (facebookresearch/dino: utils.py, main_dino.py)
class DINOHead(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, norm_last_layer: bool = True,
                 nlayers: int = 3, hidden_dim: int = 32, bottleneck_dim: int = 16) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(in_dim, hidden_dim), nn.GELU()]
        for _ in range(nlayers - 2):
            layers += [nn.Linear(hidden_dim, hidden_dim), nn.GELU()]
        layers.append(nn.Linear(hidden_dim, bottleneck_dim))
        self.mlp = nn.Sequential(*layers)
        with warnings.catch_warnings():  # deprecated since, still what DINO runs
            warnings.simplefilter("ignore", FutureWarning)
            self.last_layer = nn.utils.weight_norm(nn.Linear(bottleneck_dim, out_dim,
                                                             bias=False))
        self.last_layer.weight_g.data.fill_(1)
        if norm_last_layer:
            self.last_layer.weight_g.requires_grad = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mlp(x)
        x = nn.functional.normalize(x, dim=-1, p=2)
        return self.last_layer(x)


def dino_student(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), DINOHead(8, 10))


def get_params_groups(model: nn.Module) -> list[dict[str, Any]]:
    regularized, not_regularized = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name.endswith(".bias") or len(param.shape) == 1:
            not_regularized.append(param)
        else:
            regularized.append(param)
    return [{"params": regularized}, {"params": not_regularized, "weight_decay": 0.0}]


def clip_gradients(model: nn.Module, clip: float) -> list[float]:
    norms = []
    for _, p in model.named_parameters():
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            norms.append(param_norm.item())
            clip_coef = clip / (param_norm + 1e-6)
            if clip_coef < 1:
                p.grad.data.mul_(clip_coef)
    return norms


def cancel_gradients_last_layer(epoch: int, model: nn.Module, freeze_last_layer: int) -> None:
    if epoch >= freeze_last_layer:
        return
    for n, p in model.named_parameters():
        if "last_layer" in n:
            p.grad = None


def train_dino(student: nn.Module, teacher: nn.Module, optimizer: torch.optim.Optimizer,
               epochs: int, per_epoch: int,
               cancel: Callable[[int, nn.Module, int], None] = cancel_gradients_last_layer
               ) -> None:
    """main_dino.py's train_one_epoch (no fp16), with a plain cross-view loss."""
    for epoch in range(epochs):
        for it in range(per_epoch):
            x1, _ = data(10 * epoch + it)
            x2 = x1 + 0.1 * torch.randn(x1.shape, generator=torch.Generator().manual_seed(it))
            teacher_out = F.softmax(teacher(x2) / 0.04, dim=-1).detach()
            loss = torch.sum(-teacher_out * F.log_softmax(student(x1) / 0.1, dim=-1),
                             dim=-1).mean()
            optimizer.zero_grad()
            loss.backward()
            clip_gradients(student, 3.0)
            cancel(epoch, student, 1)
            optimizer.step()
            with torch.no_grad():  # EMA update for the teacher
                for param_q, param_k in zip(student.parameters(), teacher.parameters(),
                                            strict=True):
                    param_k.data.mul_(0.996).add_((1 - 0.996) * param_q.detach().data)
