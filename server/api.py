"""REST routes under ``/api`` (all in the OpenAPI schema); thin wrappers over :class:`Runs`.

A refusal of the core (:mod:`server.errors`) becomes an HTTP status here: :func:`refused`,
which ``create_app`` installs as the app's handler of :class:`Refused`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from gradwatch.frames import (
    ParamSeries,
    RunSummary,
    ScalarSeries,
    StepSeries,
    frame_json,
    json_schema,
)
from gradwatch.server.errors import (
    InvalidStream,
    LogTooBig,
    NameTaken,
    Refused,
    RunLimitReached,
    RunLive,
    StorageFailed,
    StoreBusy,
)
from gradwatch.server.importing import MultipartFile
from gradwatch.server.modelnorms import Norms, model_steps
from gradwatch.server.runs import Runs
from gradwatch.wire import (
    INT64_MAX,
    NOTES_MAX,
    TAG_MAX,
    TAGS_MAX,
    Finding,
    Header,
    name_problem,
)

router = APIRouter(prefix="/api")

# Query numbers past 64 bits are refused here (422), never handed to SQLite.
StepBound = Annotated[int | None, Query(ge=-INT64_MAX - 1, le=INT64_MAX)]
RankQuery = Annotated[int | None, Query(ge=0, le=INT64_MAX)]
Rank = Annotated[int, Query(ge=0, le=INT64_MAX)]

STATUS: dict[type[Refused], int] = {InvalidStream: 400, NameTaken: 409, RunLimitReached: 429,
                                    StoreBusy: 503, StorageFailed: 507, LogTooBig: 413,
                                    RunLive: 409}
"""The HTTP status that answers each refusal of the core (others: 400)."""


async def refused(request: Request, exc: Exception) -> Response:
    """The answer to a refusal: its status and ``{"detail": reason}``."""
    assert isinstance(exc, Refused)
    return JSONResponse({"detail": exc.reason}, status_code=STATUS.get(type(exc), 400))


_WHERE = {"body": "body field", "query": "query parameter", "path": "path parameter",
          "header": "header"}


def validation_sentence(errors: Sequence[Mapping[str, Any]]) -> str:
    """The problems FastAPI found in a request (``RequestValidationError.errors()``) as one
    sentence naming each wrong field and what it got."""
    problems = []
    for err in list(errors)[:5]:
        where, *rest = [str(x) for x in err.get("loc", ())] or ["request"]
        name = (f"{_WHERE.get(where, where)} '{'.'.join(rest)}'" if rest and where == "query"
                or rest and not rest[0].isdigit() else "the request body")
        if err.get("type") == "json_invalid":
            why = (err.get("ctx") or {}).get("error", "")
            problems.append(f"the request body is not valid JSON ({why})")
            continue
        shown = "" if err.get("input") in ({}, None) else f" (got {repr(err['input'])[:80]})"
        problems.append(f"{name}: {err.get('msg', 'invalid')}{shown}")
    return "; ".join(problems) or "invalid request"


async def invalid_request(request: Request, exc: Exception) -> Response:
    """The answer to a request FastAPI could not validate: 422 and ``{"detail": sentence}``
    naming each wrong field, as every other error reads (FastAPI's own answer echoes the
    input as JSON, which fails, a 500, on a body holding ``1e999``)."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": validation_sentence(exc.errors())}, status_code=422)


class RunList(BaseModel):
    """Every run, newest first."""
    runs: list[RunSummary]


class FindingList(BaseModel):
    """Findings of a run."""
    findings: list[Finding]


class RunRename(BaseModel):
    """What to change of a run: its display name, notes, tags (each optional)."""
    name: str | None = None
    notes: str | None = None
    tags: list[str] | None = None


_NAME_MAX = next(m.max_length for m in Header.model_fields["run_name"].metadata
                 if hasattr(m, "max_length"))
"""The longest run name: what a probe's header may carry."""


def _run_name(raw: str) -> str:
    """A display name as typed, trimmed; a 400 that says why when it cannot be one."""
    name = raw.strip()
    if not name:
        raise HTTPException(400, "a run name cannot be empty")
    if len(name) > _NAME_MAX:
        raise HTTPException(400, f"a run name has at most {_NAME_MAX} characters "
                                 f"(this one has {len(name)})")
    problem = name_problem(name)  # the rule ingest and import apply to a header's run_name
    if problem is not None:
        raise HTTPException(400, f"a run name {problem}")
    return name


def _notes(raw: str) -> str:
    """Run notes as typed (trailing space trimmed); a 400 that says why when too long."""
    notes = raw.rstrip()
    if len(notes) > NOTES_MAX:
        raise HTTPException(400, f"run notes have at most {NOTES_MAX} characters (these have "
                                 f"{len(notes)})")
    return notes


def _tags(raw: list[str]) -> list[str]:
    """Tags as given, trimmed, empty ones and repeats dropped; a 400 that names the bad
    one."""
    out: list[str] = []
    for t in (x.strip() for x in raw):
        if not t or t in out:
            continue
        if len(t) > TAG_MAX or name_problem(t) is not None:  # a tag is shown as a name is
            raise HTTPException(400, f"a tag has 1-{TAG_MAX} characters and no control "
                                     f"characters: {t[:TAG_MAX]!r}")
        out.append(t)
    if len(out) > TAGS_MAX:
        raise HTTPException(400, f"a run has at most {TAGS_MAX} tags (these are {len(out)})")
    return out


class Imported(BaseModel):
    """An uploaded step log stored as a run."""
    run: str
    steps: int
    warnings: list[str]


def _runs(request: Request) -> Runs:
    runs: Runs = request.app.state.runs
    return runs


def _json(model: BaseModel, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status,
                    media_type="application/json")


def _missing(run_id: str) -> HTTPException:
    return HTTPException(404, f"no run '{run_id}'")


@router.get("/schema", summary="JSON Schema of the wire records and socket frames")
async def schema() -> dict[str, Any]:
    """JSON Schema of the wire records and of every socket frame."""
    return json_schema()


@router.get("/runs", response_model=RunList, summary="Every run, newest first")
async def runs(request: Request) -> Response:
    """Every run, newest first."""
    return _json(RunList(runs=await asyncio.to_thread(_runs(request).reader.runs)))


@router.get("/runs/{run_id}", summary="A run with its optimizers and header")
async def run(run_id: str, request: Request) -> dict[str, Any]:
    """A run: its summary plus ``optimizers`` and ``header``."""
    out = await asyncio.to_thread(_runs(request).reader.run, run_id)
    if out is None:
        raise _missing(run_id)
    return out


@router.get("/runs/{run_id}/steps", response_model=StepSeries,
            summary="Step rows, min/max-downsampled per (rank, opt)")
async def steps(request: Request, run_id: str, start: StepBound = None,
                end: StepBound = None, max_points: int = Query(4000, ge=10, le=100_000),
                opt: str | None = None, rank: RankQuery = None,
                norms: Norms = "model") -> Response:
    """Step rows in [start, end], min/max-downsampled to ``max_points`` per (rank, opt);
    a sharded optimizer's norms are the model's (``norms=model``) or each rank's own."""
    reader = _runs(request).reader
    if norms == "model":
        out = await asyncio.to_thread(model_steps, reader, run_id, start, end, max_points,
                                      opt, rank)
    else:
        out = await asyncio.to_thread(reader.steps, run_id, start, end, max_points, opt, rank)
    if out is None:
        raise _missing(run_id)
    return Response(frame_json(StepSeries, **out.columns()), media_type="application/json")


@router.get("/runs/{run_id}/params", response_model=ParamSeries,
            summary="Per-parameter norms of one optimizer")
async def params(request: Request, run_id: str, opt: str, rank: Rank = 0,
                 start: StepBound = None, end: StepBound = None,
                 max_points: int = Query(500, ge=1, le=100_000)) -> Response:
    """Per-parameter norms; per bucket, the step with the largest total norm."""
    out = await asyncio.to_thread(_runs(request).reader.params, run_id, opt, rank, start,
                                  end, max_points)
    if out is None:
        raise HTTPException(404, f"no optimizer '{opt}' (rank {rank}) in run '{run_id}'")
    return _json(out)


@router.get("/runs/{run_id}/scalars", response_model=ScalarSeries,
            summary="Values the user logged (handle.log), one entry per value")
async def scalars(run_id: str, request: Request) -> Response:
    """Values logged with ``handle.log`` (and the framework callbacks), in stored order."""
    out = await asyncio.to_thread(_runs(request).reader.scalars, run_id)
    if out is None:
        raise _missing(run_id)
    return _json(out)


@router.get("/runs/{run_id}/findings", response_model=FindingList,
            summary="Findings, as gradwatch check computes them")
async def findings(run_id: str, request: Request) -> Response:
    """Findings, as the run's Verdict (the code of ``gradwatch check``) grouped them."""
    out = await asyncio.to_thread(_runs(request).reader.findings, run_id)
    if out is None:
        raise _missing(run_id)
    return _json(FindingList(findings=out))


@router.get("/runs/{run_id}/export", summary="The run as a step log (jsonl) or CSV",
            response_class=StreamingResponse)
async def export(run_id: str, request: Request, format: Literal["jsonl", "csv"] = "jsonl",
                 rank: Rank = 0) -> StreamingResponse:
    """The run as a step log (JSON Lines, one rank) or as CSV of step rows."""
    reader = _runs(request).reader
    if format == "jsonl":
        summary = await asyncio.to_thread(reader.summary, run_id)
        if summary is None:
            raise _missing(run_id)
        if rank not in summary.ranks:  # an empty file would read as a log, and none
            raise HTTPException(404, f"run '{run_id}' has no rank {rank} (its ranks: "
                                     f"{', '.join(map(str, summary.ranks)) or 'none yet'})")
        lines = await asyncio.to_thread(reader.export_lines, run_id, rank)
        media, ext = "application/x-ndjson", "jsonl"
    else:
        lines = await asyncio.to_thread(reader.export_csv, run_id)
        media, ext = "text/csv", "csv"
    if lines is None:
        raise _missing(run_id)
    return StreamingResponse(lines, media_type=media, headers={
        "Content-Disposition": f'attachment; filename="{run_id}.{ext}"'})


@router.patch("/runs/{run_id}", response_model=RunSummary,
              summary="Rename a run, or set its notes and tags")
async def rename(run_id: str, body: RunRename, request: Request) -> Response:
    """Give a run a new display name (distinct from every other run's: 409 otherwise),
    and/or new notes or tags. Everything is checked before anything is changed."""
    if body.name is None and body.notes is None and body.tags is None:
        raise HTTPException(400, "nothing to change: give name, notes or tags")
    name = None if body.name is None else _run_name(body.name)
    notes = None if body.notes is None else _notes(body.notes)
    tags = None if body.tags is None else _tags(body.tags)
    runs = _runs(request)
    summary = None
    if name is not None:
        summary = await runs.rename(run_id, name)
        if summary is None:
            raise _missing(run_id)
    if notes is not None or tags is not None:
        summary = await runs.annotate(run_id, notes, tags)
    if summary is None:
        raise _missing(run_id)
    return _json(summary)


@router.delete("/runs/{run_id}", status_code=204, summary="Delete a run")
async def delete(run_id: str, request: Request) -> Response:
    """Delete a run and everything stored for it."""
    if not await _runs(request).delete(run_id):
        raise _missing(run_id)
    return Response(status_code=204)


@router.post("/runs/import", status_code=201, response_model=Imported,
             summary="Upload a saved step log as a run",
             openapi_extra={"requestBody": {"content": {
                 "application/x-ndjson": {"schema": {"type": "string"}},
                 "multipart/form-data": {"schema": {"type": "object", "properties": {
                     "file": {"type": "string", "format": "binary"}}}}}}})
async def import_log(request: Request) -> Response:
    """Store an uploaded step log (body, or multipart field ``file``) as a new run.

    The body is read, validated and stored a block at a time as it arrives; a bad line
    answers 400 naming the line and field, and nothing of the log stays stored.
    """
    runs = _runs(request)
    limit = runs.settings.max_import_bytes
    ctype = request.headers.get("content-type", "")
    chunks = _limited(request.stream(), limit)
    if not ctype.startswith("multipart/form-data"):
        run_id, n, warnings = await runs.import_stream(chunks)
    else:
        part = MultipartFile(ctype)
        first = b""
        async for data in chunks:  # up to the file's first bytes: its name is known then
            first = part.feed(data)
            if first or part.filename != "upload":
                break
        run_id, n, warnings = await runs.import_stream(_file_of(part, first, chunks),
                                                       Path(part.filename).name)
    return _json(Imported(run=run_id, steps=n, warnings=warnings), 201)


async def _file_of(part: MultipartFile, first: bytes, chunks: AsyncIterator[bytes]
                   ) -> AsyncIterator[bytes]:
    yield first
    async for data in chunks:
        yield part.feed(data)
    part.finish()


async def _limited(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"step log too big: the limit is {limit} bytes")
        yield chunk
