"""The one wire contract: every record that lands in a step log or crosses a socket.

This module imports neither torch nor fastapi. The probe writes these records, the server
validates and stores them, ``gradwatch check`` and the replay reader parse them. Their JSON
Schema (``python -m gradwatch.wire``, and ``GET /api/schema`` with the socket frames) documents
the protocol for other tools.

A step log is JSON Lines: one :class:`Header` line, then one record per line. Over the
ingest websocket the same records travel inside :class:`IngestBatch` frames. Every record
carries ``seq``, a per-(run, rank) sequence number starting at 0 with the header, so a
receiver stores each record once however often it is resent.

Non-finite floats (a NaN loss blows up a gradient norm) are data, not errors: they are
written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, which every JSON
parser accepts and which these models read back as floats.

Records are written at :data:`PROTOCOL_VERSION` (:mod:`gradwatch.wirejson`); a line is read at
the version it was written at, which the reader knows from outside the line (a log's
header, a frame's ``v``): see :func:`parse_record`. Version 2 leaves out what it implies and
packs per-parameter arrays, version 3 also leaves out a clean step's counts
(:mod:`gradwatch.encoding`); version 4 adds where a probe that turned itself off stopped
(``Stats.last_step``, ``Stats.last_opt``) and each parameter's placement on a device mesh
(``OptimizerInfo.placements``), which an older reader would refuse as unknown fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_serializer,
    field_validator,
    model_validator,
)

from gradwatch import encoding

PROTOCOL_VERSION = 4
"""The version records are written at; bumped on any change to how they are written."""

SUPPORTED_VERSIONS = frozenset({1, 2, 3, 4})
"""The versions a reader reads (a contract: a log of any of them stays readable)."""

FindingKind = Literal[
    "missed_reset",
    "cross_optimizer_leak",
    "late_reset",
    "discarded_accumulation",
    "untrained_params",
    "idle_optimizer",
]
"""Finding kinds, a contract: checks outside the project match on these exact names."""

FINDING_KINDS: tuple[str, ...] = get_args(FindingKind)

ResetHow = Literal[
    "optimizer_zero_grad",  # optimizer.zero_grad(), set_to_none True or False
    "module_zero_grad",  # nn.Module.zero_grad()
    "set_none",  # p.grad = None outside zero_grad
    "zero_",  # p.grad.zero_() / p.grad.data.zero_() outside zero_grad
    "replaced",  # p.grad = some other tensor
]

INT64_MAX = 2**63 - 1
"""The largest integer a record may carry: what SQLite and most JSON readers hold exactly."""
NonNegInt = Annotated[int, Field(ge=0, le=INT64_MAX)]
"""A count or index; a value past 64 bits is refused where it enters, never stored."""
Int64 = Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
STEP_MAX = 2**53 - 1
"""The largest step number: the largest integer a JavaScript number (the dashboard) holds."""
StepNumber = Annotated[int, Field(ge=0, le=STEP_MAX)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
"""A time or other quantity that must be a number: NaN and infinities are refused (unlike
norms, where they are data)."""
SiteId = Annotated[int, Field(ge=1, le=INT64_MAX)]
"""The id of a :class:`Site` record, unique within one (run, rank) stream."""
RUN_ID_CHARS = "A-Za-z0-9_.-"
"""The characters of a run id, as a regular-expression class body."""


def _path_segment(v: str) -> str:
    if v in (".", ".."):  # a URL path would resolve it away: no page could name the run
        raise ValueError(f"a run id cannot be '{v}'")
    return v


RunId = Annotated[str, Field(min_length=1, max_length=64, pattern=f"^[{RUN_ID_CHARS}]+$"),
                  AfterValidator(_path_segment)]
"""A run id: shared by every rank of one training job, safe in a URL path segment and a file
name (never ``.`` or ``..``)."""
ARG_MAX_CHARS = 4096
"""The longest ``argv`` item a header may carry (the probe shortens longer ones)."""
ARGV_MAX_CHARS = 32768
"""The most characters all ``argv`` items of a header may carry together."""
NAME_MAX_CHARS = 1000
"""The longest parameter name a record may carry (the probe shortens longer ones)."""
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                      "\ud800-\udfff]")
"""What a name may not hold: C0/C1 controls, bidirectional-text controls (a name holding
one can show reversed or reorder the text around it) and lone surrogates (not text)."""


def name_problem(text: str) -> str | None:
    """Why ``text`` cannot be a name shown to people (run, optimizer, label, parameter), as
    the end of a sentence; None when it can. The one rule for ingest, import and rename."""
    m = _UNSHOWN.search(text)
    if m is None:
        return None
    c = m.group()
    if "\ud800" <= c <= "\udfff":
        return f"must be valid Unicode text (it holds a lone surrogate U+{ord(c):04X})"
    if c < "\x20" or "\x7f" <= c <= "\x9f":
        return (f"cannot hold control characters (newlines, tabs, escapes; it holds "
                f"U+{ord(c):04X})")
    return (f"cannot hold bidirectional-text controls (U+202A-202E, U+2066-2069, U+200E/200F, "
            f"U+061C; it holds U+{ord(c):04X}): they make a name read as something else")


def shown(text: str) -> str:
    """``text`` with what :func:`name_problem` refuses written as escapes (``\\u202e``,
    ``\\x1b``): the same text on any reader, and idempotent."""
    if _UNSHOWN.search(text) is None:
        return text
    return _UNSHOWN.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


Shown = AfterValidator(shown)
"""A name in a record (run, optimizer, label, parameter): read with :func:`shown`. Escaped,
not refused: a step log is a record of a run that already happened, and a new version must
still read an old log whose name holds such a character (a right-to-left mark in a Hebrew
run name, a tab in a ``ModuleDict`` key). A rename, typed now, is refused instead."""
ArgItem = Annotated[str, Field(max_length=ARG_MAX_CHARS)]
ParamName = Annotated[str, Field(max_length=NAME_MAX_CHARS), Shown]


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ending in ``…`` when cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def bounded_argv(argv: Sequence[str]) -> list[str]:
    """A command line as a header may carry it: items shortened to :data:`ARG_MAX_CHARS`,
    at most 256 of them and :data:`ARGV_MAX_CHARS` characters together (``…`` where cut)."""
    out: list[str] = []
    total = 0
    for a in argv[:256]:
        item = clip(str(a), min(ARG_MAX_CHARS, ARGV_MAX_CHARS - total))
        if not item or total + len(item) > ARGV_MAX_CHARS:
            break
        out.append(item)
        total += len(item)
    return out


# Norms may be NaN or Inf; they are data. ``None`` means "not sampled this step".
Norm = float | None


class _Model(BaseModel):
    # defer_build: a model's validator and serializer are built at its first use, not at
    # import (``gradwatch run`` imports this module at exit even when nothing trained)
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings", frozen=False,
                              defer_build=True)


class _Record(_Model):
    seq: NonNegInt
    """Per-(run, rank) sequence number; the header is 0."""
    t: FiniteFloat
    """Wall-clock time (Unix seconds) when the probe made the record."""


NOTES_MAX = 10_000
"""The longest run notes (characters)."""
TAG_MAX = 64
"""The longest tag (characters)."""
TAGS_MAX = 32
"""Tags a run may carry."""


class Header(_Record):
    """First line of every step log and first record of every stream."""

    type: Literal["header"] = "header"
    v: int = PROTOCOL_VERSION
    run: RunId
    """Run id shared by every rank of one training job."""
    run_name: Annotated[str, Shown] = Field(max_length=200)
    rank: NonNegInt = 0
    world_size: Annotated[int, Field(ge=1, le=INT64_MAX)] = 1
    torch_version: str = Field(max_length=64)
    gradwatch_version: str = Field(max_length=64)
    started: FiniteFloat
    host: str = Field(default="", max_length=255)
    pid: NonNegInt = 0
    argv: list[ArgItem] = Field(default_factory=list, max_length=256)
    """The command line, items of at most :data:`ARG_MAX_CHARS`, :data:`ARGV_MAX_CHARS`
    in all."""
    norms_every: NonNegInt = 1
    worker: NonNegInt | None = None
    """Set in a process the training script started itself (``torch.multiprocessing``
    workers under ``gradwatch run``): its number in the run; None in a launched process."""
    notes: str = Field(default="", max_length=NOTES_MAX)
    """The run's notes, as written on its dashboard page (a step log exported by the
    server carries them; a log written by a probe has none)."""
    tags: list[Annotated[str, Field(min_length=1, max_length=TAG_MAX)]] = Field(
        default_factory=list, max_length=TAGS_MAX)
    """The run's tags, as given on its dashboard page (like :attr:`notes`)."""

    @field_validator("argv")
    @classmethod
    def _argv_total(cls, v: list[str]) -> list[str]:
        n = sum(map(len, v))
        if n > ARGV_MAX_CHARS:
            raise ValueError(f"argv holds {n} characters in all; at most {ARGV_MAX_CHARS}")
        return v

    @field_validator("v")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v not in SUPPORTED_VERSIONS:
            raise ValueError(
                f"protocol version {v} is not supported (this gradwatch reads "
                f"{sorted(SUPPORTED_VERSIONS)}); upgrade gradwatch to read this log"
            )
        return v

    @field_serializer("v")
    def _written_at(self, v: int) -> int:
        # Records are always written at the current version, so a header read from an
        # older log and written again must say so (its records follow in today's forms).
        return PROTOCOL_VERSION


def unnamed_param(index: int) -> str:
    """The name of parameter ``index`` of an optimizer whose record does not name it."""
    return f"param{index}"


def param_names(names: Sequence[str], indices: Iterable[int]) -> list[str]:
    """The names of parameters ``indices`` in an optimizer record's ``params`` list, each
    :func:`unnamed_param` where the list does not reach it."""
    return [names[k] if k < len(names) else unnamed_param(k) for k in indices]


HParam = bool | int | float | Annotated[str, Field(max_length=200)] | Annotated[
    list[float], Field(max_length=16)] | None
"""One param-group setting: a number, a flag, a short string or a few numbers (betas)."""


class OptimizerInfo(_Record):
    """An optimizer the probe attached to, with its parameters in a fixed order.

    Per-parameter fields of later :class:`Step` records index into ``params``.
    """

    type: Literal["optimizer"] = "optimizer"
    opt: Annotated[str, Shown] = Field(min_length=1, max_length=200)
    """Display name, unique in the run, e.g. ``"Adam#0"`` or the user's ``name=``."""
    cls: str = Field(max_length=200)
    params: list[ParamName] = Field(max_length=100_000)
    """Parameter names (``model.named_parameters()`` names where known)."""
    shapes: list[list[NonNegInt]] = Field(default_factory=list, max_length=100_000)
    groups: list[NonNegInt] = Field(default_factory=list, max_length=100_000)
    """Parameter-group index of each parameter."""
    label: Annotated[str, Shown] | None = Field(default=None, max_length=200)
    """What the user calls it, where the probe could see it (the variable holding it, as
    ``dec_opt``); findings show it instead of ``opt``, which stays the id in records."""
    hparams: list[dict[Annotated[str, Field(max_length=64)], HParam]] = Field(
        default_factory=list, max_length=10_000)
    """Per param group, its settings when the optimizer was announced (``lr``,
    ``momentum``, ``betas``, ``weight_decay``, ...): empty in logs from before they were
    recorded. The learning rate of each step is :attr:`Step.lr`."""
    manual: bool = False
    """A virtual optimizer (``opt`` is ``"manual"``): parameters no optimizer holds, updated
    in place by hand (``p.data.add_(...)``, ``with torch.no_grad(): p -= lr * p.grad``). Each of
    its steps is such an update, seen between two backward passes."""
    placements: str | None = Field(default=None, max_length=100_000, pattern="^[-sr]*$")
    """Each parameter's placement on a device mesh (version 4), one character each: ``-`` a
    plain tensor, ``s`` a DTensor sharded over some mesh dimension (``Shard``: FSDP2, tensor
    parallel), ``r`` a DTensor replicated over every one; None where none is a DTensor. A
    rank's norms are its local shard's: where the ranks' records meet, an ``s`` parameter's
    norms combine as the square root of the sum of the ranks' squares, the others count
    once (:mod:`gradwatch.shardnorms`)."""


class Site(_Record):
    """A line of the user's code that a backward, a step or a reset call ran from.

    Sent once, before the first record that names it by :attr:`id`: step and reset records
    carry site ids, and findings resolve them (:class:`Where`). The line is the innermost
    frame outside torch, gradwatch and the frameworks that call torch on the user's behalf;
    where the framework itself made the call (``trainer.fit`` runs the loop), the
    framework's frame.
    """

    type: Literal["site"] = "site"
    id: SiteId
    file: str = Field(max_length=4096)
    """The file as Python names it (``co_filename``: usually an absolute path)."""
    line: NonNegInt
    function: str = Field(default="", max_length=400)
    """The function's qualified name (``<module>`` at a script's top level)."""


class Reset(_Model):
    """Resets of one kind seen since the optimizer's previous step."""

    how: ResetHow
    params: list[NonNegInt] = Field(default_factory=list, max_length=100_000)
    """Indices (into the optimizer's params) of the parameters reset."""
    discarded: NonNegInt = 0
    """Finite contributions thrown away that no step had consumed."""
    after_backward: bool = False
    """True when the reset ran after this step's fresh backward (a late reset)."""
    site: SiteId | None = None
    """Where the reset was called: the one of this kind that threw contributions away, else
    the last (None for a reset written by hand, ``p.grad = None``: no call to see)."""


class StepSites(_Model):
    """Where a step's finding facts come from, as :class:`Site` ids. Only steps with a
    finding fact carry them."""

    step: SiteId | None = None
    """The step call."""
    stale: list[SiteId] = Field(default_factory=list, max_length=64)
    """Backward calls whose contributions the step re-applied (stale)."""
    leaked: list[SiteId] = Field(default_factory=list, max_length=64)
    """Backward calls whose contributions leaked from another optimizer's step."""
    lost: list[SiteId] = Field(default_factory=list, max_length=64)
    """Backward calls whose contributions a reset threw away before the step."""
    fresh: list[SiteId] = Field(default_factory=list, max_length=64)
    """Backward calls whose contributions the step read fresh (the loop's own backward: a
    missed reset's fix goes before it)."""
    reset: SiteId | None = None
    """A step that re-applied old gradients: the call that last reset its optimizer's
    parameters, a reset in the wrong place (``zero_grad()`` once per epoch); None when
    none was seen or it was written by hand."""


class Step(_Record):
    """One optimizer step and its verdict facts.

    A *contribution* is one backward pass's gradient added into one parameter's ``.grad``.
    The counts below are over (parameter, backward) pairs.
    """

    type: Literal["step"] = "step"
    opt: Annotated[str, Shown] = Field(min_length=1, max_length=200)
    step: StepNumber
    """Index of this step among the optimizer's steps (0-based; skipped steps count)."""
    skipped: bool = False
    """GradScaler found inf/NaN and skipped ``optimizer.step()``."""
    closure_evals: NonNegInt = 0
    """Closure evaluations inside this step (LBFGS); 0 for a plain step."""
    backwards: NonNegInt = 0
    """Backward passes that contributed to this optimizer's params since its last step."""
    consumed: NonNegInt = 0
    """Contributions present in the gradients this step read."""
    fresh: NonNegInt = 0
    """Of ``consumed``, those no step had read before."""
    stale: NonNegInt = 0
    """Of ``consumed``, those this optimizer already consumed at an earlier step."""
    leaked: NonNegInt = 0
    """Of ``consumed``, those from a backward another optimizer's step already consumed."""
    stale_params: list[NonNegInt] = Field(default_factory=list, max_length=100_000)
    leaked_params: list[NonNegInt] = Field(default_factory=list, max_length=100_000)
    late_params: list[NonNegInt] = Field(default_factory=list, max_length=100_000)
    """Params whose fresh contribution a reset removed between backward and this step."""
    discarded: NonNegInt = 0
    """Finite contributions of wasted backwards discarded since the previous step."""
    discarded_params: list[NonNegInt] = Field(default_factory=list, max_length=100_000)
    resets: list[Reset] = Field(default_factory=list, max_length=64)
    norm: Norm = None
    """Norm of the accumulated gradient the step read (unscaled), all params together."""
    fresh_norm: Norm = None
    """Norm of the contributions added since the previous step, in the scale the step read:
    where ``.grad`` also held old content it is measured when the backward returned and
    scaled by what happened to each gradient since (clipping, unscaling, DDP's averaging)."""
    drift: Norm = None
    """``norm / fresh_norm``: 1.0 when every gradient was reset; climbs on a missed reset.
    An in-place rescale between backward and step leaves it unchanged."""
    param_norms: list[Norm] | None = Field(default=None, max_length=100_000)
    param_fresh_norms: list[Norm] | None = Field(default=None, max_length=100_000)
    sites: StepSites | None = None
    """Where its finding facts come from (None on a step without one)."""
    loss: Norm = None
    """Sum of the values of the roots passed to ``backward()`` by the backwards this step
    read, as the user passed them (divided by an accumulation count if the user divides); a
    root made by ``GradScaler.scale`` is read before scaling. None when no such backward had
    a scalar floating-point root the probe could read (NaN and infinities are data)."""
    lr: list[Norm] | None = Field(default=None, max_length=100_000)
    """Each parameter group's learning rate when the step ran (None: not a number the probe
    could read without a device sync)."""

    @model_validator(mode="before")
    @classmethod
    def _v2_forms(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and (v := _version(info)) >= 2:
            try:
                return encoding.step_at_v1(data, v)
            except encoding.FormError as e:
                raise ValueError(str(e)) from None
        return data


def _version(info: ValidationInfo) -> int:
    """The version the input was written at: the validation context's ``v``. Without one
    (a model built in Python, pydantic's own JSON) 1: every field left out takes its
    default."""
    ctx = info.context
    return ctx.get("v", 1) if isinstance(ctx, dict) else 1


class Unowned(_Record):
    """Parameters (``nn.Parameter``) that receive gradients while no optimizer holds them and
    that nothing updates (``untrained_params``).

    The probe learns which tensors a backward reaches from the autograd graphs of some
    backwards (the first few, then every Nth), and watches what those no optimizer holds do
    between backwards: updated in place by hand they belong to the virtual optimizer
    ``manual``; left as they are they are listed here. Sent when the list changes, when the
    sampled backwards that reached them double, and at close; the last one sent holds (an
    empty list withdraws the finding).
    """

    type: Literal["unowned"] = "unowned"
    params: list[ParamName] = Field(default_factory=list, max_length=1000)
    """Names of the parameters (at most 1000 of them; ``count`` says how many in all)."""
    shapes: list[list[NonNegInt]] = Field(default_factory=list, max_length=1000)
    """Shape of each parameter named in ``params``."""
    count: NonNegInt = 0
    """How many such parameters."""
    numel: NonNegInt = 0
    """Their elements, all together: the gradient the backward computes for nothing."""
    backwards: NonNegInt = 0
    """Sampled backward passes that reached them."""
    first_step: NonNegInt = 0
    """Optimizer steps (of every optimizer, ``manual`` included) in the run when the first of
    them was seen."""
    step: NonNegInt = 0
    """Optimizer steps in the run when this record was made."""


class Holding(_Record):
    """Which parameters of one optimizer have held a gradient at one of its steps
    (``idle_optimizer``; a hint for ``untrained_params``).

    Sent from the optimizer's second step on, only when something is missing (no gradient on
    any parameter, or parameters that never had one), and again when that changes; the last
    one sent holds.
    """

    type: Literal["holding"] = "holding"
    opt: Annotated[str, Shown] = Field(min_length=1, max_length=200)
    step: NonNegInt
    """The optimizer's step this was checked at."""
    requiring: NonNegInt = 0
    """Parameters that require grad."""
    held: bool = True
    """Some parameter has held a gradient, or a backward reached one, by this step."""
    never: list[NonNegInt] = Field(default_factory=list, max_length=100_000)
    """Indices (into the optimizer's params) of parameters that require grad and held no
    gradient at any step checked."""


class Stats(_Record):
    """Probe health: records it had to drop and why. Sent periodically and at close."""

    type: Literal["stats"] = "stats"
    dropped: NonNegInt = 0
    """Records lost for good (queue full and no spool)."""
    spooled: NonNegInt = 0
    """Always 0 from this probe: its step log is the spool, where records the server has not
    stored stay (``gradwatch replay`` sends them). Kept so that logs carrying it still read."""
    disabled: str | None = Field(default=None, max_length=1000)
    """Why the probe turned itself off, if it did."""
    last_step: StepNumber | None = None
    """With ``disabled``: the last step judged before the probe turned itself off, of
    optimizer :attr:`last_opt` (None: no step was judged, or a log older than version 4)."""
    last_opt: Annotated[str, Shown] | None = Field(default=None, min_length=1, max_length=200)


class Scalars(_Record):
    """Scalars the user logged at one step (``loss``, ``accuracy``, ...), beside the probe's
    own figures."""

    type: Literal["scalars"] = "scalars"
    step: StepNumber
    """The step they belong to (the latest step of the run when the user named none)."""
    opt: Annotated[str, Shown] | None = Field(default=None, min_length=1, max_length=200)
    """The optimizer whose step counter ``step`` is (None: the run's first optimizer)."""
    values: dict[Annotated[str, Field(min_length=1, max_length=200)], float] = Field(
        max_length=1000)
    """Name → value; NaN and infinities are data."""


class End(_Record):
    """Last record of a run (absent after a crash: the run then reads as interrupted)."""

    type: Literal["end"] = "end"
    status: Literal["finished", "failed", "interrupted"] = "finished"
    exit_code: Int64 | None = None
    steps: NonNegInt = 0
    dropped: NonNegInt = 0


AnyRecord = Header | OptimizerInfo | Site | Step | Stats | End | Unowned | Holding | Scalars
"""Any record model (the plain union, for type hints)."""
Record = Annotated[AnyRecord, Field(discriminator="type")]
"""Any record of a step log or stream, told apart by its ``type`` (for validation)."""

_LATER = ConfigDict(defer_build=True)
"""Adapters too are built at their first use."""
RECORD_ADAPTER: TypeAdapter[Any] = TypeAdapter(Record, config=_LATER)
RECORDS_ADAPTER: TypeAdapter[list[Any]] = TypeAdapter(list[Record], config=_LATER)
"""A block of records (one validation call for many lines; an error's location starts with
the index of the record)."""
MAX_BATCH = 10_000
"""Records in one :class:`IngestBatch` at most."""
_RECORDS: TypeAdapter[list[Any]] = TypeAdapter(
    Annotated[list[Record], Field(max_length=MAX_BATCH)], config=_LATER)


class IngestBatch(_Model):
    """A frame on ``/ws/ingest``: records of one (run, rank), in ``seq`` order."""

    type: Literal["batch"] = "batch"
    v: int = PROTOCOL_VERSION
    run: RunId
    rank: NonNegInt = 0
    records: list[Record] = Field(max_length=MAX_BATCH)
    """Written at ``v``, and read at it: the frame passes its version to its records."""

    @field_validator("v")
    @classmethod
    def _known_version(cls, v: int) -> int:
        return Header._known_version(v)

    @field_serializer("v")
    def _written_at(self, v: int) -> int:
        return PROTOCOL_VERSION  # a model dumps its records in today's forms

    @field_validator("records", mode="wrap")
    @classmethod
    def _records_at_v(cls, value: Any, handler: ValidatorFunctionWrapHandler,
                      info: ValidationInfo) -> Any:
        v = info.data.get("v")
        if v is None or v == _version(info) or isinstance(value, list) and all(
                isinstance(r, BaseModel) for r in value):
            return handler(value)
        return _RECORDS.validate_python(value, context={"v": v})


class Where(_Model):
    """A line of code a finding names (a :class:`Site`, with the part it played)."""

    role: Literal["backward", "reset", "step"]
    file: str
    line: NonNegInt
    function: str = ""


class Finding(_Model):
    """A judged bug, as ``gradwatch check --json`` prints it (a contract)."""

    kind: FindingKind
    optimizer: str
    first_step: StepNumber
    last_step: StepNumber
    steps: NonNegInt
    """Number of steps affected."""
    params: list[str]
    message: str
    fix: str
    rank: NonNegInt = 0
    where: list[Where] = Field(default_factory=list)
    """The lines involved, the one to change first (see :mod:`gradwatch.verdict`)."""
    worker: NonNegInt | None = None
    """The worker process (see :attr:`Header.worker`) the finding is in, if any."""




def parse_record(line: str | bytes, v: int) -> Any:
    """Parse one JSON line into a record model.

    Args:
        line: the record's JSON.
        v: the protocol version it was written at: its log's header's ``v``, its frame's
            ``v``; never guessed from the line. (A line pydantic wrote from a model with
            every field present reads the same at any version; one written without its
            ``None`` fields reads right only at 1.)

    Raises:
        pydantic.ValidationError: the line is not valid JSON or not a valid record; its
            message says which field is wrong.
    """
    return RECORD_ADAPTER.validate_json(line, context={"v": v})


def batch_json(run: str, rank: int, v: int, lines: list[bytes]) -> bytes:
    """An :class:`IngestBatch` frame of records already validated as JSON lines written
    at version ``v`` (a spool's), passed on as they are."""
    head = json.dumps({"type": "batch", "v": v, "run": run, "rank": rank}).encode()
    return head[:-1] + b',"records":[' + b",".join(lines) + b"]}"


_M = TypeVar("_M", bound=BaseModel)


def trusted(cls: type[_M], fields: dict[str, Any]) -> _M:
    """A record from values the probe made itself, every field given, none validated.

    What ``model_construct`` does for these models (no aliases, no extras, no private
    attributes) without its per-field loop, which costs more than serialising the record:
    the probe's writer thread makes one per optimizer step. ``fields`` must name every
    field of ``cls`` exactly (tests hold the probe to that).
    """
    m = cls.__new__(cls)
    _set = object.__setattr__
    _set(m, "__dict__", fields)
    _set(m, "__pydantic_fields_set__", set(fields))
    _set(m, "__pydantic_extra__", None)
    _set(m, "__pydantic_private__", None)
    return m


def json_schema() -> dict[str, Any]:
    """JSON Schema of records, ingest batches and findings: the protocol documented for
    other tools (``GET /api/schema`` adds the socket frames; the dashboard reads none)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "gradwatch wire protocol",
        "protocol_version": PROTOCOL_VERSION,
        "record": RECORD_ADAPTER.json_schema(),
        "ingest_batch": IngestBatch.model_json_schema(),
        "finding": Finding.model_json_schema(),
    }


if __name__ == "__main__":
    print(json.dumps(json_schema(), indent=2))
