"""Tiny Lightning modules for the callback tests (module level: ``ddp_spawn`` pickles them).

Lightning is imported here; tests import this module only after ``pytest.importorskip``.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch.utils.data import DataLoader, TensorDataset


def regression_data(n: int = 64, batch: int = 4, seed: int = 0) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = x @ torch.randn(6, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch)


def noise_data(n: int = 48, batch: int = 8, seed: int = 0) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 2, generator=g) * 0.5 + 1.0),
                      batch_size=batch)


class Regressor(LightningModule):
    """Automatic optimization: one optimizer, Lightning owns backward, step and zero_grad."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Gan(LightningModule):
    """Manual optimization with two optimizers: the usual GAN step.

    ``forget_d_zero_grad``: the discriminator's ``zero_grad`` is missing, so its gradients
    pile up from step to step (and the generator's backward leaks into them).
    """

    def __init__(self, forget_d_zero_grad: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.forget = forget_d_zero_grad
        torch.manual_seed(0)
        self.generator = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(),
                                             torch.nn.Linear(16, 2))
        self.discriminator = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(),
                                                 torch.nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        (real,) = batch
        g_opt, d_opt = self.optimizers()  # type: ignore[misc]
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        z = torch.randn(real.shape[0], 4)
        fake = self.generator(z)

        if not self.forget:
            d_opt.zero_grad()
        d_real = self.discriminator(real)
        d_fake = self.discriminator(fake.detach())
        d_loss = bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))
        self.manual_backward(d_loss)
        d_opt.step()

        g_opt.zero_grad()
        g_out = self.discriminator(fake)
        g_loss = bce(g_out, torch.ones_like(g_out))
        self.manual_backward(g_loss)
        g_opt.step()
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss})

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.Adam(self.generator.parameters(), lr=1e-3),
                torch.optim.Adam(self.discriminator.parameters(), lr=1e-3)]


class NoReset(Regressor):
    """Automatic optimization with an ``optimizer_zero_grad`` override that does nothing:
    Lightning never clears the gradients."""

    def optimizer_zero_grad(self, epoch: int, batch_idx: int,
                            optimizer: torch.optim.Optimizer) -> None:
        pass
