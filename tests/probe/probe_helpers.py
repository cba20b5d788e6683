"""Tiny models and batches shared by the probe tests (deterministic, CPU)."""

from __future__ import annotations

import torch


def mlp(seed: int = 0, n_in: int = 4, n_out: int = 2) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(n_in, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, n_out))


def batch(i: int, n_in: int = 4, n_out: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(16, n_in, generator=g), torch.randn(16, n_out, generator=g)


def loss_of(model: torch.nn.Module, i: int) -> torch.Tensor:
    x, y = batch(i)
    return ((model(x) - y) ** 2).mean()
