"""The words of the domain as code: tasks, compute resources, profiles, pools, policies.

This module does no I/O. The task state machine lives here and only here: every writer
asks `transition()` before it changes a task's state.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import IllegalTransition

try:
    from enum import StrEnum
except ImportError:  # Python < 3.11: the client (the CLI, the SDK) reads the domain on 3.8

    class StrEnum(str, enum.Enum):  # type: ignore[no-redef]
        """Members are their values, in str() and format() as in Python 3.11's StrEnum."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


TYPE_CHECKING = False
if TYPE_CHECKING:  # types only: the CLI reads the domain without loading pydantic's models
    from pydantic import BaseModel

    from broker.identity_settings import IdentityFile


class TaskState(StrEnum):
    """A task's life, from submission to one of five final states."""

    CREATED = "created"  # recorded, not yet validated against the estate
    QUEUED = "queued"  # waiting in Klique for the meta-scheduler
    HELD = "held"  # kept out of scheduling until released
    PLACED = "placed"  # the scheduler chose a pool; the pool has not accepted it yet
    SUBMITTED = "submitted"  # the pool accepted it (a native job id exists)
    PENDING = "pending"  # waiting in the pool's own queue
    RUNNING = "running"
    COMPLETED = "completed"  # exit code 0
    FAILED = "failed"  # non-zero exit, or refused with a reason
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"  # ran past its walltime
    LOST = "lost"  # left the pool with no exit file after the grace period

    @property
    def final(self) -> bool:
        return self in FINAL_STATES

    @property
    def active(self) -> bool:
        """Holds or may hold capacity in a pool."""
        return self in (TaskState.PLACED, TaskState.SUBMITTED, TaskState.PENDING, TaskState.RUNNING)


FINAL_STATES = frozenset(
    {TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED, TaskState.TIMEOUT, TaskState.LOST}
)

_S = TaskState
_IN_POOL_ENDINGS = {_S.COMPLETED, _S.FAILED, _S.CANCELLED, _S.TIMEOUT, _S.LOST}

# The allowed transitions. A task goes back to QUEUED when a pool gives it up before it
# ran (spill-over, a refused submission) or when it is preempted and requeued. Two paths
# skip the pools: a task that runs locally (the SDK's Task.init outside any pool) is
# recorded RUNNING at once, and goes to QUEUED when it is sent to a compute resource
# (execute_remotely); a pipeline step whose outputs are reused from an identical completed
# step is recorded COMPLETED at once.
TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    _S.CREATED: frozenset({_S.QUEUED, _S.HELD, _S.RUNNING, _S.COMPLETED, _S.FAILED, _S.CANCELLED}),
    _S.QUEUED: frozenset({_S.PLACED, _S.HELD, _S.FAILED, _S.CANCELLED}),
    _S.HELD: frozenset({_S.QUEUED, _S.CANCELLED}),
    _S.PLACED: frozenset({_S.SUBMITTED, _S.QUEUED, _S.FAILED, _S.CANCELLED}),
    _S.SUBMITTED: frozenset({_S.PENDING, _S.RUNNING, _S.QUEUED} | _IN_POOL_ENDINGS),
    _S.PENDING: frozenset({_S.RUNNING, _S.QUEUED} | _IN_POOL_ENDINGS),
    # RUNNING -> PENDING: the pool's scheduler requeued the job (Slurm's requeue after a node
    # failure); only an observation that carries the scheduler's restart count makes it.
    _S.RUNNING: frozenset({_S.QUEUED, _S.PENDING} | _IN_POOL_ENDINGS),
    _S.COMPLETED: frozenset(),
    _S.FAILED: frozenset(),
    _S.CANCELLED: frozenset(),
    _S.TIMEOUT: frozenset(),
    _S.LOST: frozenset(),
}


def can_transition(old: TaskState, new: TaskState) -> bool:
    return new == old or new in TRANSITIONS[old]


def transition(old: TaskState, new: TaskState) -> TaskState:
    """Return `new` if a task may go from `old` to it; raise IllegalTransition otherwise.

    Staying in the same state is allowed (a repeated report is not an error).
    """
    if not can_transition(old, new):
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[old])) or "none: it is final"
        raise IllegalTransition(
            f"a task cannot go from {old.value} to {new.value} (allowed: {allowed})"
        )
    return new


class Origin(StrEnum):
    """Where a task runs: in a pool (placed by the scheduler), or locally, where the SDK's
    Task.init recorded it (a laptop, a login node), or nowhere: a reused pipeline step."""

    POOL = "pool"
    LOCAL = "local"
    CACHED = "cached"


# What a locally run task shows as its compute resource and pool, and meters as its pool.
LOCAL_POOL = "(local)"


@dataclass(frozen=True)
class Profile:
    """The allocation a compute resource names, and the pools that may serve it, in order.

    GPUs are whole (`gpus`), a fraction of one (`gpu_fraction`, down to 1/8), or an amount
    of GPU memory (`gpu_memory_mb`); at most one of the three is set.
    """

    pools: tuple[str, ...]
    gpus: int = 0
    gpu_fraction: float | None = None
    gpu_memory_mb: int | None = None
    cpus: int = 1
    memory_mb: int = 1024
    walltime_s: int = 3600
    nodes: int = 1  # GPUs, CPUs and memory are per node; the task runs once on each node

    @property
    def whole_gpus(self) -> int:
        """GPUs as a batch scheduler allocates them, and as placement counts them on a batch
        pool: whole GPUs, where a fraction or an amount of GPU memory takes one. (Host pools
        pack fractions and memory onto their GPUs; batch schedulers do not.)"""
        if self.gpus:
            return self.gpus
        return 1 if (self.gpu_fraction or self.gpu_memory_mb) else 0

    @property
    def gpu_share(self) -> float:
        """GPUs counted as a number, a fraction included (memory-sized requests count 0), on
        every node of the task: what the ledger meters."""
        share = self.gpu_fraction if self.gpu_fraction is not None else float(self.gpus)
        return share * self.nodes


@dataclass(frozen=True)
class CheckpointSignal:
    """A signal the scheduler sends the job `before_s` seconds before its walltime ends; the
    runner passes it on to the task, which may save its state."""

    signal: str  # USR1 or USR2: the runner forwards them and keeps running
    before_s: int


@dataclass(frozen=True)
class ComputeResource:
    name: str
    profile: Profile
    description: str = ""
    extra_directives: tuple[str, ...] = ()
    skip_directives: tuple[str, ...] = ()
    checkpoint_signal: CheckpointSignal | None = None


@dataclass(frozen=True)
class UserMap:
    """Klique user -> Linux account on a pool; `default` serves unmapped users if set.

    With `rule="same-name"` a user maps to the account of the same name (the site's directory
    gives both), never to root and never to an account in `deny`.
    """

    accounts: dict[str, str] = field(default_factory=dict)
    default: str | None = None
    rule: str | None = None
    deny: frozenset[str] = frozenset()

    def account_for(self, user: str) -> str | None:
        if user in self.accounts:
            return self.accounts[user]
        if self.rule == "same-name" and user != "root" and user not in self.deny:
            return user
        return self.default

    @property
    def maps_anyone(self) -> bool:
        """False for a pool without a user map (a single-user host pool)."""
        return bool(self.accounts) or self.default is not None or self.rule is not None


@dataclass(frozen=True)
class Pool:
    """Nodes in one place. `settings` is the pool's validated settings model, of its kind's
    own class (broker/pools/settings.py: partition, queue, ...); the fields above are what
    placement reads of it."""

    name: str
    kind: str  # a registered pool kind (broker/pools/registry.py): host, slurm, pbs, lsf, ...
    queueing: bool = False  # has a scheduler queue of its own, rather than fixed slots
    spans_nodes: bool = False  # one task may hold several nodes (batch schedulers)
    user_map: UserMap = field(default_factory=UserMap)
    slots: int = 1  # host pools: concurrent tasks
    gpus: int = 0  # host pools: GPUs on the host
    gpu_ids: tuple[int, ...] = ()  # host pools: the host's ids of those GPUs (else 0..gpus-1)
    gpu_memory_mb: int = 0  # host pools: memory of one GPU (for memory-sized requests)
    max_queued: int = 100  # queueing pools: most tasks Klique keeps in the pool's queue
    max_wait_s: int | None = None  # queueing pools: spill to the next pool after this
    template: str | None = None
    extra_directives: tuple[str, ...] = ()
    skip_directives: tuple[str, ...] = ()
    # Typed as pydantic's base here (the domain imports no pool kind); a driver takes its own
    # kind's model with broker.pools.settings.settings_as. A pool built by hand for placement
    # alone has none.
    settings: BaseModel | None = None

    @property
    def devices(self) -> tuple[int, ...]:
        """The host's ids of the pool's GPUs: those it names, else 0 to gpus-1."""
        return self.gpu_ids or tuple(range(self.gpus))


@dataclass(frozen=True)
class Policy:
    """Which compute resources a team may use, with a reservation, a limit and a priority.

    `reservation` and `limit` count units of each compute resource (4 means 4 x "1-gpu").
    """

    team: str
    resources: tuple[str, ...]
    reservation: dict[str, int] = field(default_factory=dict)
    limit: dict[str, int] = field(default_factory=dict)
    priority: int = 0


@dataclass(frozen=True)
class Team:
    name: str
    users: tuple[str, ...]


@dataclass(frozen=True)
class Limits:
    """What one API request may carry, and what one task may keep on the server (its console
    copy, scalars and artifacts); the estate's `limits:` section sets them."""

    max_request_bytes: int = 32 * 1024 * 1024
    max_diff_bytes: int = 16 * 1024 * 1024
    max_batch: int = 10_000  # tasks in one request (a sweep, a batch)
    max_console_bytes: int = 256 * 1024 * 1024
    max_scalars: int = 1_000_000  # points
    max_artifact_bytes: int = 100 * 1024 * 1024 * 1024  # all of one task's artifacts
    max_reports: int = 10_000  # of each kind beyond scalars (tables, images, texts...)
    max_report_bytes: int = 256 * 1024 * 1024  # all of one task's reports beyond scalars


@dataclass(frozen=True)
class Retention:
    """How long an archived run is kept before the control loop deletes it: `days` for every
    project (None: for ever), `projects` per project (overriding it); the estate's `retention:`."""

    days: float | None = None
    projects: Mapping[str, float] = field(default_factory=dict)

    def days_for(self, project: str) -> float | None:
        return self.projects.get(project, self.days)


@dataclass(frozen=True)
class ArtifactSettings:
    """Where the control plane keeps artifacts (an fsspec URL; None: $KLIQUE_HOME/artifacts)
    and the largest one it accepts; the estate's `artifacts:` section sets them."""

    store: str | None = None
    max_bytes: int = 10 * 1024**3


@dataclass(frozen=True)
class DatasetSettings:
    """Where dataset versions keep their bytes (the estate's `datasets:` section): `artifacts`,
    the artifact store; `s3`, the bucket at `endpoint` with the keys in `credentials_file`."""

    store: str = "artifacts"
    endpoint: str | None = None
    bucket: str | None = None
    credentials_file: str | None = None
    region: str | None = None


@dataclass(frozen=True)
class StaticRoute:
    """A route the platform team made: it outlives the endpoints launched behind it and spreads
    requests over every live one. `teams` may call it; `apps` may serve it (empty: any endpoint)."""

    name: str
    teams: tuple[str, ...] = ()
    apps: tuple[str, ...] = ()
    created_by: str = "estate"


@dataclass(frozen=True)
class AppSettings:
    """The estate's `apps:` section: where the app catalogue is, and the running-apps quotas."""

    catalogue: str | None = None  # a folder of app files; None: the built-in catalogue
    max_running: int | None = None  # apps running at once, company-wide
    max_running_per_team: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Estate:
    """Everything the platform team declares: the validated content of the estate file."""

    resources: dict[str, ComputeResource]
    pools: dict[str, Pool]
    policies: dict[str, Policy]
    teams: dict[str, Team]
    default_resource: str | None = None
    fair_share_half_life_s: float = 7 * 24 * 3600.0
    min_run_s: float = 600.0  # reclaim never preempts a run younger than this
    reclaim_grace_s: float = 120.0  # a reservation's task waits this long before preempting
    max_preemptions_per_cycle: int = 8
    starvation_s: float = 3600.0  # a task waiting longer goes first and pins a host pool
    limits: Limits = field(default_factory=Limits)
    artifacts: ArtifactSettings = field(default_factory=ArtifactSettings)
    retention: Retention = field(default_factory=Retention)
    datasets: DatasetSettings = field(default_factory=DatasetSettings)
    pipeline_resource: str | None = None  # where pipeline controllers run (None: the default)
    templates_dir: str | None = None  # the site's batch templates, searched before the built-in
    mail_domain: str | None = None  # a task owner's mail address is OWNER@mail_domain
    public_url: str | None = None  # server.public_url: where jobs, pods and browsers reach us
    apps: AppSettings = field(default_factory=AppSettings)
    routes: dict[str, StaticRoute] = field(default_factory=dict)
    source: str = "<built-in>"
    identity: IdentityFile | None = None  # single sign-on, LDAP, group -> team
    text: str = ""  # the file as written: `klique agent` builds the same estate from it

    def team_of(self, user: str) -> str | None:
        for team in self.teams.values():
            if user in team.users:
                return team.name
        return None

    def permitted(self, team: str | None, resource: str) -> bool:
        """With no policies at all, everyone may use everything (the embedded default)."""
        if not self.policies:
            return True
        policy = self.policies.get(team or "")
        return policy is not None and resource in policy.resources


@dataclass(frozen=True)
class CodeSpec:
    """The code a task runs: a repository at a commit plus the uncommitted diff, or a folder."""

    repo: str | None = None
    commit: str | None = None
    diff: str = ""
    workdir: str | None = None  # a folder on the node to run in, instead of a clone
    subdir: str = ""  # where in the repository the user was when submitting


@dataclass(frozen=True)
class TaskSpec:
    """What a user asks for. Free text lives here and travels in task.json, never in a script."""

    command: tuple[str, ...]
    resource: str
    name: str = ""
    project: str = "default"
    env: dict[str, str] = field(default_factory=dict)
    code: CodeSpec | None = None
    requirements: tuple[str, ...] = ()
    requirements_file: str | None = None  # in the code: requirements.txt, pyproject.toml, uv.lock
    image: str | None = None
    kind: str = "batch"  # or "application": an app from the catalogue, reached through a route
    app: dict[str, Any] | None = None  # an application's launch: see broker/apps/launch.py


@dataclass(frozen=True)
class Task:
    """One tracked run, as the store holds it."""

    id: int
    spec: TaskSpec
    owner: str
    team: str | None
    state: TaskState
    reason: str = ""
    pool: str | None = None
    native_id: str | None = None
    job_dir: str | None = None
    exit_code: int | None = None
    gpus: float = 0.0
    gpu_ids: tuple[int, ...] = ()  # host pools: the GPUs it was given
    borrowed: bool = False
    preempted: bool = False  # asked to stop to hand capacity back; requeued when it ends
    skip_pools: frozenset[str] = frozenset()
    attempts: int = 0
    diff_bytes: int = 0
    claim: dict[str, Any] | None = None  # the runner's report of its outcome, not yet confirmed
    origin: Origin = Origin.POOL
    parent: int | None = None  # the task that made this one (a pipeline's step, say)
    parameters: dict[str, Any] = field(default_factory=dict)
    packages: tuple[str, ...] = ()  # as installed where it ran (name==version)
    inputs: tuple[tuple[int, str], ...] = ()  # artifacts (task, name) it was created to read
    cache_key: str | None = None
    tags: tuple[str, ...] = ()  # sorted
    archived_at: float | None = None  # archived: hidden from default listings
    intent: str | None = None  # asked of the pool's agent: "cancel" or "withdraw"
    sweep: int | None = None  # the sweep it was made in, with others
    created_at: float = 0.0
    queued_at: float | None = None
    submitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def tag(self) -> str:
        """The job name every pool job of this task carries."""
        return f"klique-{self.id}"

    @property
    def resource(self) -> str:
        return self.spec.resource

    def job_name(self) -> str:
        """The job directory's name: the tag, with the attempt after the first."""
        return self.tag if self.attempts <= 1 else f"{self.tag}-{self.attempts}"


def spec_to_dict(spec: TaskSpec) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(spec)


def spec_from_dict(data: dict[str, Any]) -> TaskSpec:
    code = data.get("code")
    fields = {k: v for k, v in data.items() if k in TaskSpec.__dataclass_fields__}
    fields["command"] = tuple(data["command"])
    fields["requirements"] = tuple(data.get("requirements") or ())
    fields["code"] = CodeSpec(**code) if isinstance(code, dict) else None
    return TaskSpec(**fields)
