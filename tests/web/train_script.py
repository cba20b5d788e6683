"""A small training loop under the probe, run as a subprocess by the dashboard tests.

    python train_script.py SERVER LOG STOPFILE

Steps 0-39 are correct, 40-79 forget ``zero_grad()`` (a missed reset), 80-119 are correct
again; then it waits (at most 60 s) for STOPFILE before closing the probe, so a test can
look at the dashboard while the run is still live.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import gradwatch


def main() -> None:
    server, log, stop = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    handle = gradwatch.watch(opt, model=model, server=server, log=log,
                             run_name="live training", run_id="live-train")
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    for step in range(120):
        if not 40 <= step < 80:
            opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        time.sleep(0.03)
    deadline = time.monotonic() + 60
    while not stop.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    handle.close()


if __name__ == "__main__":
    main()
