"""The API's request and response bodies."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from broker.domain import ComputeResource, Pool, Task, TaskState
from broker.execution import PoolState
from broker.names import ENV_NAME, IMAGE, LINE, NAME, NO_NUL, PROJECT, REPO
from broker.pools.settings import description_of
from broker.tasks.report_schemas import ReportIn

Name = Annotated[str, Field(pattern=NAME)]
Line = Annotated[str, Field(pattern=LINE, max_length=4096)]
Argument = Annotated[str, Field(pattern=NO_NUL, max_length=131072)]
EnvName = Annotated[str, Field(pattern=ENV_NAME)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CodeIn(_Body):
    repo: str | None = Field(None, pattern=REPO)
    commit: str | None = Field(None, pattern=r"^[0-9a-f]{7,64}$")
    diff: str = ""
    workdir: str | None = Field(None, pattern=r"^/" + LINE[1:], max_length=4096)
    subdir: Line = ""


class RunIn(_Body):
    """What runs, and where: the fields of `klique submit` (the SDK's too)."""

    command: list[Argument] = Field(min_length=1, max_length=4096)
    resource: Name | None = None
    env: dict[EnvName, Argument] = Field({}, max_length=1024)
    code: CodeIn | None = None
    requirements: list[Line] = Field([], max_length=4096)
    requirements_file: Line | None = None
    image: str | None = Field(None, pattern=IMAGE)


class SubmitRequest(RunIn):
    project: str = Field("default", pattern=PROJECT)
    name: str = Field("", max_length=200, pattern=LINE)


class ArtifactOut(BaseModel):
    name: str
    kind: Literal["file", "folder", "object"]  # a file as uploaded, a folder (zip), a pickle
    filename: str
    digest: str  # SHA-256 of the content
    size: int
    created_at: float


class TaskOut(BaseModel):
    id: int
    name: str
    owner: str
    team: str | None
    project: str
    resource: str
    state: TaskState
    reason: str
    pool: str | None
    native_id: str | None
    job_dir: str | None
    exit_code: int | None
    command: list[str]
    borrowed: bool
    gpu_ids: list[int] = []  # host pools: the host's GPUs it was given
    created_at: float
    submitted_at: float | None
    started_at: float | None
    finished_at: float | None
    code: dict[str, Any] | None = None
    claim: dict[str, Any] | None = None  # the runner's report of its end, not yet confirmed
    origin: str = "pool"  # pool, local (recorded by the SDK where it ran) or cached (reused)
    parent: int | None = None  # the task that made this one (a pipeline, for its steps)
    parameters: dict[str, Any] = {}
    sweep: int | None = None  # the sweep it was made in (`klique ls --sweep ID`)
    tags: list[str] = []
    archived: bool = False  # hidden from default listings (`klique ls --archived` shows it)
    events: list[dict[str, Any]] = []
    scalars: list[dict[str, Any]] = []
    packages: list[str] = []  # shown in detail only
    artifacts: list[ArtifactOut] = []  # shown in detail only
    datasets: list[dict[str, Any]] = []  # the dataset versions it read; in detail only

    @classmethod
    def of(cls, task: Task) -> TaskOut:
        code = None
        if task.spec.code is not None:
            c = task.spec.code
            code = {
                "repo": c.repo,
                "commit": c.commit,
                "diff_bytes": task.diff_bytes,
                "workdir": c.workdir,
                "subdir": c.subdir,
            }
        return cls(
            id=task.id,
            name=task.spec.name,
            owner=task.owner,
            team=task.team,
            project=task.spec.project,
            resource=task.spec.resource,
            state=task.state,
            reason=task.reason,
            pool=task.pool,
            native_id=task.native_id,
            job_dir=task.job_dir,
            exit_code=task.exit_code,
            command=list(task.spec.command),
            borrowed=task.borrowed,
            gpu_ids=list(task.gpu_ids),
            created_at=task.created_at,
            submitted_at=task.submitted_at,
            started_at=task.started_at,
            finished_at=task.finished_at,
            code=code,
            claim=task.claim,
            origin=task.origin.value,
            parent=task.parent,
            parameters=task.parameters,
            sweep=task.sweep,
            tags=list(task.tags),
            archived=task.archived_at is not None,
        )


class WhyOut(BaseModel):
    id: int
    state: TaskState
    waiting: bool
    primary: str  # a stable code (PendingCode): not-permitted ... pool-queue, outcome-unknown
    sentence: str
    detail: str
    pools: dict[str, str]
    reason: str = ""  # the one line `ls` shows: the sentence and the detail, each said once


class LogChunk(BaseModel):
    id: int
    offset: int
    text: str
    final: bool


class ConsoleIn(BaseModel):
    offset: int = Field(ge=0, lt=2**62)
    text: str = Field(max_length=1 << 20)


Finite = Annotated[float, Field(allow_inf_nan=False)]


class ScalarIn(BaseModel):
    name: str = Field(min_length=1, max_length=200, pattern=LINE)  # the chart's title
    series: str = Field("", max_length=200, pattern=LINE)  # its line ("": the title's own)
    value: Finite
    step: int | None = Field(None, ge=-(2**62), lt=2**62)
    time: Finite | None = None


class StatusIn(BaseModel):
    """status.json, as the runner writes it (docs/job-directory.md)."""

    state: Literal["setting_up", "running", "done"]
    time: Finite | None = None
    host: str | None = Field(None, max_length=255)
    pid: int | None = Field(None, ge=0, lt=2**31)


class ExitIn(BaseModel):
    """exit.json, as the runner writes it: a claim until the pool confirms the job has ended."""

    exit_code: int | None = Field(None, ge=-(2**31), lt=2**31)
    outcome: Literal["completed", "failed", "setup_failed", "signalled", "preempted", "timeout"]
    reason: str = Field("", max_length=2000)
    signal: int | None = Field(None, ge=0, lt=256)
    started: Finite | None = None
    finished: Finite | None = None


class Report(BaseModel):
    state: StatusIn | None = None
    exit: ExitIn | None = None
    console: ConsoleIn | None = None
    scalars: list[ScalarIn] = Field([], max_length=10000)
    reports: list[ReportIn] = Field([], max_length=10000)  # beyond scalars (report_schemas.py)


class ResourceOut(BaseModel):
    name: str
    description: str
    gpus: int
    gpu_fraction: float | None
    gpu_memory_mb: int | None
    cpus: int
    memory_mb: int
    walltime_s: int
    pools: list[str]
    permitted: bool

    @classmethod
    def of(cls, r: ComputeResource, permitted: bool) -> ResourceOut:
        p = r.profile
        return cls(
            name=r.name,
            description=r.description,
            gpus=p.gpus,
            gpu_fraction=p.gpu_fraction,
            gpu_memory_mb=p.gpu_memory_mb,
            cpus=p.cpus,
            memory_mb=p.memory_mb,
            walltime_s=p.walltime_s,
            pools=list(p.pools),
            permitted=permitted,
        )


class PoolOut(BaseModel):
    name: str
    kind: str
    description: str
    reachable: bool
    reason: str
    free_slots: int | None
    free_gpus: float
    queued: int
    last_good: float | None  # when the pool last answered well (None: never yet)
    unknown_jobs: list[str]  # jobs with Klique's tag that no task owns: reported, left alone

    @classmethod
    def of(cls, pool: Pool, state: PoolState | None, strangers: set[str]) -> PoolOut:
        state = state or PoolState(pool.name, reachable=False, reason="not polled yet")
        return cls(
            name=pool.name,
            kind=pool.kind,
            description=description_of(pool),
            reachable=state.reachable,
            reason=state.reason,
            free_slots=state.free_slots,
            free_gpus=state.free_gpus,
            queued=state.queued,
            last_good=state.last_good,
            unknown_jobs=sorted(strangers),
        )


class UsageLineOut(BaseModel):
    key: str  # a team, project or user, as `by` asks
    runs: int
    gpu_seconds: float
    gpu_hours: float
    wall_seconds: float
    ongoing: int  # runs still going, counted up to `until`


class UsageOut(BaseModel):
    by: str
    since: float | None
    until: float
    everyone: bool  # False: only the caller's own runs
    rows: list[UsageLineOut]


class SimulateRequest(BaseModel):
    estate: str = Field(min_length=1, description="The changed estate file's YAML text.")
    source: str = Field("<posted estate>", max_length=1000, description="Its name, for errors.")
    include_trace: bool = Field(False, description="Also return the inputs, to replay offline.")


class SimulatedTaskOut(BaseModel):
    id: int
    owner: str
    team: str | None
    resource: str
    outcome: Literal["start", "wait"]
    pool: str | None
    borrowed: bool
    sentence: str  # "would start on POOL" or "would wait: WHY"
    reason: str | None  # the pending code when it would wait
    detail: str | None
    pools: dict[str, str]


class TeamSummaryOut(BaseModel):
    team: str
    tasks: int
    start: int
    wait: int
    pools: dict[str, int]
    reasons: dict[str, int]


class SimulationOut(BaseModel):
    now: float
    queued: int
    active: int
    tasks: list[SimulatedTaskOut]
    teams: list[TeamSummaryOut]
    preempted: list[int]
    withdrawn: list[int]
    assumed_pools: list[str]
    trace: dict[str, Any] | None = None
