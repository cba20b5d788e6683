"""Frames on the server's websockets other than the records of :mod:`gradwatch.wire`.

Ingest control frames (``hello``, ``ack``, ``resume``) and the live frames the dashboard
receives (``runs``, ``run``, ``snapshot``, ``steps``, ``findings``, ``optimizer``,
``deleted``) are defined here once, each with a ``type`` field, so the server, the probe's
streamer, replay and the tests build them from models instead of hand-built dicts. This
module imports neither torch nor fastapi. :func:`json_schema` returns the schema of the
whole protocol, served at ``GET /api/schema``; :func:`frame_json` serialises a frame from
values the server already validated. :class:`CloseCode` names the codes a server closes a
websocket with: the server picks them (``server/ws_close.py``), the streamer and replay tell
refusals apart by them, never by the text of a reason.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from gradwatch import wire
from gradwatch.wire import Finding, Header, RunId

RunStatus = Literal["live", "finished", "failed", "interrupted"]


class CloseCode(IntEnum):
    """Why a server closed a websocket (``server/API.md``, "Close codes")."""

    GOING_AWAY = 1001
    """Idle for too long (or the server is stopping): reconnect when there is more to send."""
    UNSUPPORTED = 1003
    """A frame that is not JSON text."""
    INVALID = 1007
    """A frame that is not valid (its reason names the field)."""
    POLICY = 1008
    """Refused by policy (the run limit; a foreign Host or Origin before accept)."""
    TOO_BIG = 1009
    """A frame over the server's size limit: send smaller ones."""
    TRY_LATER = 1013
    """Not now: over the rate or connection limit, storage busy, acks not read."""
    NOT_OWNER = 4403
    """The stream belongs to another connection's key."""
    NO_RUN = 4404
    """No such run (``/ws/live?run=``)."""


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


STREAM_KEY_CHARS = "A-Za-z0-9_-"
"""The characters of a stream key (what ``secrets.token_urlsafe`` makes)."""
StreamKey = Annotated[str, Field(min_length=16, max_length=128,
                                 pattern=f"^[{STREAM_KEY_CHARS}]+$")]
"""A stream's secret: whoever sent it first owns the (run, rank) stream."""


class Hello(_Frame):
    """Client → server on ``/ws/ingest``: "where should I restart this stream?".

    With ``key`` it also claims the stream: the first connection to start a (run, rank)
    stream after a keyed hello makes it that key's (the server keeps a hash), and from then
    on only connections whose hello carried the same key may add records to it (see
    ``server/API.md``). Serialise it with ``exclude_none=True``: a server older than the
    key refuses the field.
    """

    type: Literal["hello"] = "hello"
    v: int = wire.PROTOCOL_VERSION
    run: RunId
    rank: wire.NonNegInt = 0
    key: StreamKey | None = None

    @field_validator("v")
    @classmethod
    def _known_version(cls, v: int) -> int:
        return Header._known_version(v)


class Ack(_Frame):
    """Server → client, once per stored batch in frame order: every record of (run, rank)
    with ``seq`` ≤ this one is stored (the contiguous prefix: a gap in the stream holds it
    below the gap, however far later records go)."""

    type: Literal["ack"] = "ack"
    run: str
    rank: int
    seq: int


class Resume(_Frame):
    """Server → client answer to :class:`Hello`: the stream's ack (every record up to
    ``seq`` is stored; -1 if none)."""

    type: Literal["resume"] = "resume"
    run: str
    rank: int
    seq: int


class RunSummary(_Frame):
    """One run as the run list shows it."""

    id: str
    name: str
    status: RunStatus
    started: float
    updated: float
    steps: int
    findings: int
    ranks: list[int]
    optimizers: list[str]
    dropped: int
    torch_version: str
    notes: str = ""
    """What the user wrote about the run (``PATCH /api/runs/{id}``)."""
    tags: list[str] = Field(default_factory=list)
    """The run's tags, in the order given."""
    stopped: str | None = None
    """Where judging stopped, in a process whose probe turned itself off
    (:meth:`gradwatch.verdict.Verdict.stopped_text`); None: nowhere. Such a run is never
    shown clean."""


class OptimizerView(_Frame):
    """An optimizer of one rank, with its parameter names."""

    rank: int
    opt: str
    cls: str
    params: list[str]
    shapes: list[list[int]]
    groups: list[int]
    label: str | None = None
    """What the user calls it (``OptimizerInfo.label``); findings name it so."""
    hparams: list[dict[str, Any]] = Field(default_factory=list)
    """Each param group's settings (``OptimizerInfo.hparams``)."""
    placements: str | None = None
    """Each parameter's placement kind across ranks (``OptimizerInfo.placements``; None:
    no sharded parameter)."""


class ResetCount(_Frame):
    """Resets of one kind at a step, with the number of parameters they touched."""

    how: str
    n: int


class StepSeries(_Frame):
    """Columnar step rows (one per step record), sorted by rank, opt, step."""

    rank: list[int] = Field(default_factory=list)
    opt: list[str] = Field(default_factory=list)
    step: list[int] = Field(default_factory=list)
    t: list[float] = Field(default_factory=list)
    norm: list[float | None] = Field(default_factory=list)
    fresh_norm: list[float | None] = Field(default_factory=list)
    drift: list[float | None] = Field(default_factory=list)
    stale: list[int] = Field(default_factory=list)
    leaked: list[int] = Field(default_factory=list)
    late: list[int] = Field(default_factory=list)
    discarded: list[int] = Field(default_factory=list)
    skipped: list[bool] = Field(default_factory=list)
    resets: list[list[ResetCount]] = Field(default_factory=list)
    loss: list[float | None] = Field(default_factory=list)
    """Each step's loss (``Step.loss``): None where unknown."""
    lr: list[list[float] | None] = Field(default_factory=list)
    """Each step's learning rate per param group (``Step.lr``): None where unknown."""
    bucket: int = 1
    downsampled: bool = False
    total: int = 0


class ScalarSeries(_Frame):
    """Values the user logged (``Scalars`` records), one entry per value, in the order they
    were stored (``GET .../scalars``, live ``scalars`` frames)."""

    rank: list[int] = Field(default_factory=list)
    opt: list[str | None] = Field(default_factory=list)
    step: list[int] = Field(default_factory=list)
    name: list[str] = Field(default_factory=list)
    value: list[float] = Field(default_factory=list)
    total: int = 0
    """Values stored (more than listed when the answer was cut at its limit)."""


class ParamSeries(_Frame):
    """Per-parameter norms of one (rank, opt) over steps (``GET .../params``)."""

    opt: str
    rank: int
    params: list[str]
    step: list[int]
    norm: list[list[float | None]]
    fresh_norm: list[list[float | None]]
    bucket: int = 1


class RunsFrame(_Frame):
    """Live, run-list view: every run, sent first."""
    type: Literal["runs"] = "runs"
    runs: list[RunSummary]


class RunFrame(_Frame):
    """Live: a run changed (new, counters, status); at most ~4 per second per run."""
    type: Literal["run"] = "run"
    run: RunSummary


class DeletedFrame(_Frame):
    """Live: a run was deleted."""
    type: Literal["deleted"] = "deleted"
    run: str


class SnapshotFrame(_Frame):
    """Live, one-run view: the run so far (steps downsampled), sent first."""
    type: Literal["snapshot"] = "snapshot"
    run: RunSummary
    optimizers: list[OptimizerView]
    steps: StepSeries
    findings: list[Finding]


class StepsFrame(_Frame):
    """Live: new step rows; ``decimated`` when the client fell behind."""
    type: Literal["steps"] = "steps"
    run: str
    steps: StepSeries
    decimated: bool = False


class ScalarsFrame(_Frame):
    """Live: values the user logged, new to the server."""
    type: Literal["scalars"] = "scalars"
    run: str
    scalars: ScalarSeries


class FindingsFrame(_Frame):
    """Live: the full current list of findings of a run."""
    type: Literal["findings"] = "findings"
    run: str
    findings: list[Finding]


class OptimizerFrame(_Frame):
    """Live: an optimizer appeared in a run."""
    type: Literal["optimizer"] = "optimizer"
    run: str
    optimizer: OptimizerView


LIVE_FRAMES: tuple[type[_Frame], ...] = (RunsFrame, RunFrame, DeletedFrame, SnapshotFrame,
                                         StepsFrame, FindingsFrame, OptimizerFrame,
                                         ScalarsFrame)
INGEST_FRAMES: tuple[type[_Frame], ...] = (Hello, Ack, Resume)


_FIELDS: dict[type[_Frame], tuple[str, ...]] = {}
_VALUES: TypeAdapter[dict[str, Any]] = TypeAdapter(
    dict[str, Any], config=ConfigDict(ser_json_inf_nan="strings"))


def frame_json(frame: type[_Frame], /, **fields: Any) -> str:
    """A frame's JSON, from values that were validated where they entered the server.

    The text equals ``frame(**fields).model_dump_json()`` for valid fields (non-finite
    floats as strings), without validating them again: the fields of a frame come from
    records validated on ingest, or from the server's own database. ``type`` is filled in;
    a nested frame may be a model or a dict of its fields (``StepSeries`` columns).

    Raises:
        TypeError: ``fields`` are not exactly the frame's fields (besides ``type``).
    """
    names = _FIELDS.get(frame)
    if names is None:
        names = _FIELDS[frame] = tuple(frame.model_fields)
    given = {"type": frame.model_fields["type"].default, **fields} if "type" in names \
        else fields
    if len(given) != len(names) or not all(k in given for k in names):
        raise TypeError(f"{frame.__name__} has fields {sorted(names)}, got {sorted(given)}")
    return _VALUES.dump_json({k: given[k] for k in names}).decode()


def json_schema() -> dict[str, Any]:
    """JSON Schema of the whole protocol, as ``GET /api/schema`` serves it.

    Returns:
        :func:`gradwatch.wire.json_schema` (``record``, ``ingest_batch``, ``finding``) plus
        ``ingest_frames`` (Hello, Ack, Resume), ``live_frames`` (every frame of
        ``/ws/live``) and ``shapes`` (RunSummary, OptimizerView, StepSeries, ParamSeries),
        each keyed by model name.
    """
    out = wire.json_schema()
    out["ingest_frames"] = {m.__name__: m.model_json_schema() for m in INGEST_FRAMES}
    out["live_frames"] = {m.__name__: m.model_json_schema() for m in LIVE_FRAMES}
    out["shapes"] = {m.__name__: m.model_json_schema()
                     for m in (RunSummary, OptimizerView, StepSeries, ParamSeries,
                               ScalarSeries)}
    return out
