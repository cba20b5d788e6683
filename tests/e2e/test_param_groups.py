"""A parameter group added mid-run (progressive unfreezing), from the probe to the server:
the optimizer's parameter list grows, and the per-parameter view serves the new ones from
the step they joined."""

from __future__ import annotations

from pathlib import Path

import torch
from apps import app_settings  # noqa: E402  (tests/server, via conftest)
from fastapi.testclient import TestClient

import gradwatch
from gradwatch.server import create_app


def test_unfrozen_parameters_reach_the_per_parameter_view(tmp_path: Path) -> None:
    torch.manual_seed(0)
    backbone, head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)
    backbone.requires_grad_(False)
    model = torch.nn.Sequential(backbone, torch.nn.Tanh(), head)
    opt = torch.optim.SGD(head.parameters(), lr=0.01)
    log = tmp_path / "unfreeze.jsonl"
    with gradwatch.watch(opt, model=model, log=log, run_name="unfreeze"):
        for i in range(6):
            if i == 3:
                backbone.requires_grad_(True)
                opt.add_param_group({"params": backbone.parameters()})
            opt.zero_grad()
            ((model(torch.randn(16, 4)) - torch.randn(16, 2)) ** 2).mean().backward()
            opt.step()
    with TestClient(create_app(app_settings(data_dir=tmp_path / "data"))) as client:
        r = client.post("/api/runs/import", content=log.read_bytes(),
                        headers={"content-type": "application/x-ndjson"})
        assert r.status_code == 201, r.text
        run = r.json()["run"]
        p = client.get(f"/api/runs/{run}/params", params={"opt": "SGD#0"}).json()
        assert p["params"] == ["2.weight", "2.bias", "0.weight", "0.bias"]
        assert [len(row) for row in p["norm"]] == [2, 2, 2, 4, 4, 4]
        assert client.get(f"/api/runs/{run}/findings").json()["findings"] == []
