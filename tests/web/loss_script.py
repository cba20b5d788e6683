"""A training loop with no gradwatch code but ``watch()`` (and one ``handle.log``), run as a
subprocess by the loss-panel test.

    python loss_script.py SERVER WANT_JSON

Accumulates two backwards per step (each loss divided by 2), with a StepLR schedule, and
logs a made-up accuracy every 10 steps. Writes what the loop itself computed to WANT_JSON:
the loss of each step (the sum of the ``loss.item()`` it passed to backward), its learning
rate and the logged values.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import gradwatch


def main() -> None:
    server, want_path = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.5)
    want: dict[str, list[float]] = {"loss": [], "lr": [], "acc_step": [], "acc": []}
    with gradwatch.watch(opt, model=model, server=server, run_name="zero-code loss",
                         run_id="loss-run") as handle:
        for step in range(60):
            opt.zero_grad()
            total = 0.0
            for micro in range(2):
                g = torch.Generator().manual_seed(step * 2 + micro)
                x, y = torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)
                loss = ((model(x) - y) ** 2).mean() / 2
                loss.backward()
                total += loss.item()
            want["loss"].append(total)
            want["lr"].append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
            if step % 10 == 9:
                acc = 0.5 + step / 200
                handle.log(acc=acc)
                want["acc_step"].append(step)
                want["acc"].append(acc)
        # A busy machine: let the server take every record before the probe closes (its
        # close waits a few seconds only; what it cannot send stays in the spool).
        handle.writer.settle()
        deadline = time.monotonic() + 60
        while (handle.streamer is not None and time.monotonic() < deadline
               and handle.streamer.stats()["acked_seq"] < handle.writer.written - 1):
            time.sleep(0.05)
    with open(want_path, "w") as f:
        json.dump(want, f)


if __name__ == "__main__":
    main()
