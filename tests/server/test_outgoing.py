"""What leaves the server: frames built without validating again, refusals in each route's
words (close codes on websockets, HTTP statuses on REST)."""

from __future__ import annotations

import json
import math

import pytest
import synth

from gradwatch.frames import (
    OptimizerView,
    RunSummary,
    SnapshotFrame,
    StepSeries,
    StepsFrame,
    frame_json,
)
from gradwatch.server import errors, ws_close
from gradwatch.server.api import STATUS
from gradwatch.server.rows import SeriesRows
from gradwatch.verdict import verdict_of


def odd_rows() -> list:
    recs = synth.records(steps=6, stale_from=3, nan_at=1)
    rows = [synth.row_from_step(r, 0) for r in recs if r.type == "step"]
    rows[2] = rows[2]._replace(norm=None, drift=math.inf, fresh_norm=-math.inf)
    return rows


def test_a_steps_frame_is_the_text_the_validated_model_would_send() -> None:
    cols = SeriesRows(odd_rows(), bucket=3, downsampled=True, total=40).columns()
    text = frame_json(StepsFrame, run="run1", steps=cols, decimated=True)
    model = StepsFrame(run="run1", steps=StepSeries.model_validate(cols), decimated=True)
    assert text == model.model_dump_json()
    sent = json.loads(text)
    assert sent["steps"]["norm"][1] == "NaN" and sent["steps"]["norm"][2] is None
    assert sent["steps"]["drift"][2] == "Infinity" and sent["steps"]["stale"][3] == 3
    assert sent["steps"]["resets"][0] == [{"how": "optimizer_zero_grad", "n": 3}]


def test_a_snapshot_with_models_inside_is_the_text_the_model_would_send() -> None:
    recs = synth.records(steps=8, stale_from=4)
    summary = RunSummary(id="run1", name="r", status="live", started=1.0, updated=2.0,
                         steps=8, findings=1, ranks=[0], optimizers=["SGD#0"], dropped=0,
                         torch_version="2.13.0")
    view = OptimizerView(rank=0, opt="SGD#0", cls="SGD", params=["w"], shapes=[[1]],
                         groups=[0])
    rows = SeriesRows([synth.row_from_step(r, 0) for r in recs if r.type == "step"], total=8)
    findings = verdict_of(recs).findings()
    text = frame_json(SnapshotFrame, run=summary, optimizers=[view], steps=rows.columns(),
                      findings=findings)
    assert text == SnapshotFrame(run=summary, optimizers=[view],
                                 steps=StepSeries.model_validate(rows.columns()),
                                 findings=findings).model_dump_json()


def test_a_frame_without_all_its_fields_is_a_programming_error() -> None:
    cols = SeriesRows(odd_rows()).columns()
    with pytest.raises(TypeError, match="decimated"):
        frame_json(StepsFrame, run="run1", steps=cols)
    with pytest.raises(TypeError, match="extra"):
        frame_json(StepsFrame, run="run1", steps=cols, decimated=False, extra=1)


def test_every_refusal_has_a_close_code_and_storage_refusals_an_http_status() -> None:
    refusals = [c for c in vars(errors).values()
                if isinstance(c, type) and issubclass(c, errors.Refused) and c is not
                errors.Refused]
    codes = {c: ws_close.close_code(c("why")) for c in refusals}
    assert codes == {errors.UnreadableFrame: 1003, errors.InvalidFrame: 1007,
                     errors.InvalidStream: 1007, errors.RunLimitReached: 1008,
                     errors.StreamOwned: 4403,
                     errors.FrameTooBig: 1009, errors.TooManyFrames: 1013,
                     errors.StoreBusy: 1013, errors.TooManyConnections: 1013,
                     errors.IdleConnection: 1001, errors.SlowReader: 1013,
                     errors.StorageFailed: 1013,
                     errors.NameTaken: 1008,  # a rename's refusal: REST only, never a socket
                     errors.InvalidLog: 1008,  # an import's: REST only
                     errors.LogTooBig: 1008,  # an import's: REST only
                     errors.RunLive: 1008}  # a delete's: REST only
    assert STATUS == {errors.InvalidStream: 400, errors.RunLimitReached: 429,  # noqa: SIM300
                      errors.StoreBusy: 503, errors.NameTaken: 409,
                      errors.StorageFailed: 507, errors.LogTooBig: 413,
                      errors.RunLive: 409}
