"""The tables. Schema changes go through an alembic migration in store/migrations/versions."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class TaskRow(Base):
    __tablename__ = "tasks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    owner: Mapped[str] = mapped_column(String(64), index=True)
    team: Mapped[str | None] = mapped_column(String(64), nullable=True)
    project: Mapped[str] = mapped_column(String(200), default="default", index=True)
    resource: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    pool: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    native_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    job_dir: Mapped[str | None] = mapped_column(Text, nullable=True)
    spec: Mapped[str] = mapped_column(Text)  # TaskSpec as JSON, without the code's diff
    # The uncommitted diff, apart: listings never load it.
    diff: Mapped[str] = mapped_column(Text, default="", deferred=True)
    diff_bytes: Mapped[int] = mapped_column(Integer, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpus: Mapped[float] = mapped_column(Float, default=0.0)  # GPUs the profile asks for
    gpu_ids: Mapped[str] = mapped_column(Text, default="[]")  # JSON list: host GPUs given
    borrowed: Mapped[bool] = mapped_column(Boolean, default=False)
    preempted: Mapped[bool] = mapped_column(Boolean, default=False)
    skip_pools: Mapped[str] = mapped_column(Text, default="[]")  # JSON list (spill-over)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # SHA-256 of the current attempt's report token; the token itself is only in task.json.
    report_digest: Mapped[str] = mapped_column(String(64), default="", index=True)
    # The runner's own report of how the task ended (JSON): a claim until the pool confirms it.
    claim: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The SDK's record: where it ran, its parent (the task that made it: a pipeline for its
    # steps; a plain link, so any grouping of tasks can use it), parameters, packages, the
    # artifacts of other tasks it was created to read, and the digest of its code and inputs.
    origin: Mapped[str] = mapped_column(String(16), default="pool")
    parent_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    parameters: Mapped[str] = mapped_column(Text, default="{}")
    packages: Mapped[str] = mapped_column(Text, default="[]")
    inputs: Mapped[str] = mapped_column(Text, default="[]")
    cache_key: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    # Its tags (JSON list, sorted), when it was archived, and when it was deleted: a deleted
    # task's row is kept, emptied, for the usage ledger's rows (migration 0013_research_record).
    tags: Mapped[str] = mapped_column(Text, default="[]", server_default="[]")
    archived_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # What the control plane asks the task's pool agent to do: cancel, or withdraw (spill over).
    intent: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # The sweep that made it with others in one request (migration 0010_sweeps).
    sweep_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    created_at: Mapped[float] = mapped_column(Float)
    queued_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    submitted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float, index=True)  # the UI follows changes


class SweepRow(Base):
    """Many tasks made by one request (`klique submit --sweep`): their owner and how many."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    team: Mapped[str | None] = mapped_column(String(64), nullable=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    size: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


class TaskEventRow(Base):
    """Every state change, for `klique show` and for audits."""

    __tablename__ = "task_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    time: Mapped[float] = mapped_column(Float)
    old_state: Mapped[str] = mapped_column(String(16))
    new_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")


class TokenRow(Base):
    __tablename__ = "tokens"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the token
    id: Mapped[str] = mapped_column(String(16), unique=True)  # the digest's start: for ls/revoke
    user: Mapped[str] = mapped_column(String(64), index=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    kind: Mapped[str] = mapped_column(String(16), default="user")  # user, service, admin
    scopes: Mapped[str] = mapped_column(String(64), default="read,submit")  # comma-separated
    team: Mapped[str | None] = mapped_column(String(64), nullable=True)  # a service user's team
    groups: Mapped[str] = mapped_column(Text, default="[]")  # JSON: LDAP groups at login
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class SessionRow(Base):
    """A browser's single sign-on session: the cookie holds a random id, kept here as a digest,
    with the provider's refresh token (so that a user the provider drops loses the session)."""

    __tablename__ = "sessions"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the cookie
    user: Mapped[str] = mapped_column(String(64), index=True)
    groups: Mapped[str] = mapped_column(Text, default="[]")  # JSON, from the provider's token
    csrf_digest: Mapped[str] = mapped_column(String(64))  # sha256 of the CSRF token
    refresh_token: Mapped[str] = mapped_column(Text, default="")  # the provider's
    fresh_until: Mapped[float] = mapped_column(Float)  # when the groups are asked again
    expires_at: Mapped[float] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    # A browser signed in with a Klique token (the web UI's form, or an LDAP password) stands for
    # that token: its revocation or expiry ends the session (migration 0009_web).
    token_id: Mapped[str | None] = mapped_column(String(16), nullable=True)


class AgentTokenRow(Base):
    """A token for `klique agent`: it may act only for the pools it names, until it expires or
    is revoked (migration 0011_agent_token_expiry)."""

    __tablename__ = "agent_tokens"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the token
    id: Mapped[str] = mapped_column(String(32), unique=True)  # agent-<digest's start>: ls/revoke
    pools: Mapped[str] = mapped_column(Text)  # JSON list of pool names
    expires_at: Mapped[float] = mapped_column(Float)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class ScalarRow(Base):
    __tablename__ = "scalars"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    series: Mapped[str] = mapped_column(String(200), default="")  # a line of chart `name`
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    value: Mapped[float] = mapped_column(Float)
    time: Mapped[float] = mapped_column(Float)


class ReportRow(Base):
    """One report of a task beyond scalars: a table, an image, a plot, a histogram, a text, a
    single value or a media file. `data` is its JSON; an image's or media file's bytes are
    `content`, kept on the record (bounded per task: broker/bounds.py)."""

    __tablename__ = "reports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    title: Mapped[str] = mapped_column(String(200))
    series: Mapped[str] = mapped_column(String(200), default="")
    iteration: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    time: Mapped[float] = mapped_column(Float)
    data: Mapped[str] = mapped_column(Text, default="null")
    content: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    content_type: Mapped[str] = mapped_column(String(100), default="")
    size: Mapped[int] = mapped_column(Integer)  # data and content: the task's bytes bound


class LedgerRow(Base):
    """One run of a task on a pool: who, where, how long, how many GPU-seconds."""

    __tablename__ = "ledger"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    owner: Mapped[str] = mapped_column(String(64))
    team: Mapped[str | None] = mapped_column(String(64), nullable=True)
    project: Mapped[str] = mapped_column(String(200))
    resource: Mapped[str] = mapped_column(String(64))
    pool: Mapped[str] = mapped_column(String(64))
    gpus: Mapped[float] = mapped_column(Float)
    start: Mapped[float] = mapped_column(Float, index=True)
    end: Mapped[float | None] = mapped_column(Float, nullable=True)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)


class ArtifactRow(Base):
    """A task's named artifact: the content lives in the artifact store under its digest."""

    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("task_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))  # file | folder (a zip) | object (a pickle)
    filename: Mapped[str] = mapped_column(String(255), default="")
    digest: Mapped[str] = mapped_column(String(64), index=True)  # SHA-256 of the content
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)


class AppLockRow(Base):
    """An admin's lock on a catalogue app."""

    __tablename__ = "app_locks"

    app: Mapped[str] = mapped_column(String(64), primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    locked_by: Mapped[str] = mapped_column(String(64))
    locked_at: Mapped[float] = mapped_column(Float)


class RouteRow(Base):
    """A static route made through the API (the estate's own routes live in the estate)."""

    __tablename__ = "routes"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    teams: Mapped[str] = mapped_column(Text)  # JSON list
    apps: Mapped[str] = mapped_column(Text)  # JSON list
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)


class LeaderLeaseRow(Base):
    """Which replica runs the scheduler cycle and the in-server pool agents (broker/control/
    lease.py): its id, its fencing term (one more at every take), and until when its lease
    holds, on the database's clock."""

    __tablename__ = "leader_lease"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)  # what is led: "scheduler"
    holder: Mapped[str] = mapped_column(String(128))
    term: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[float] = mapped_column(Float)
    renewed_at: Mapped[float] = mapped_column(Float)


class VersionedName:
    """The columns of a name whose versions are numbered (a model, a dataset): whose it is, kept
    from its first version, and the last number given (broker/store/versioned.py)."""

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    team: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    project: Mapped[str] = mapped_column(String(200), default="default")
    latest: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)


class ModelRow(VersionedName, Base):
    """A registered model's name: whose it is (the owner and team of its first version's run)
    and the last version number given, the counter a registration bumps under its row lock."""

    __tablename__ = "models"


class ModelVersionRow(Base):
    """One version of a model: the run that made it, its files (JSON: path, digest, size; the
    content is in the artifact store), what it is, the run's last scalars, and its stage."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(ForeignKey("models.name"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # file | folder
    framework: Mapped[str] = mapped_column(String(64), default="")
    files: Mapped[str] = mapped_column(Text, default="[]")
    details: Mapped[str] = mapped_column(Text, default="{}")  # the user's metadata (JSON)
    tags: Mapped[str] = mapped_column(Text, default="[]")
    metrics: Mapped[str] = mapped_column(Text, default="{}")
    stage: Mapped[str] = mapped_column(String(16), default="none", index=True)
    stage_by: Mapped[str] = mapped_column(String(64), default="")
    stage_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class PoolReportRow(Base):
    """What a pool's `klique agent` last published, for every replica (the agent may report to
    any): the pool's state and unknown jobs as JSON, and when it reported."""

    __tablename__ = "pool_reports"

    pool: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(Text)  # PoolState as JSON (broker/agents/wire.py)
    strangers: Mapped[str] = mapped_column(Text)  # JSON list of native ids
    seen: Mapped[float] = mapped_column(Float)


class DatasetRow(VersionedName, Base):
    """A dataset's name: whose it is (the owner and team of whoever made its first version)
    and the last version number given, the counter a new version bumps under its row lock."""

    __tablename__ = "datasets"


class DatasetVersionRow(Base):
    """One immutable version of a dataset: its manifest (JSON: path -> digest, size; the bytes
    are blobs), its parent version, and who made it (a user, or a run as its owner)."""

    __tablename__ = "dataset_versions"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(ForeignKey("datasets.name"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    parent: Mapped[int | None] = mapped_column(Integer, nullable=True)
    manifest: Mapped[str] = mapped_column(Text)
    files: Mapped[int] = mapped_column(Integer)
    size: Mapped[int] = mapped_column(BigInteger)  # all its files
    new_size: Mapped[int] = mapped_column(BigInteger)  # its files' content its parent lacks
    created_by: Mapped[str] = mapped_column(String(64))
    task_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    created_at: Mapped[float] = mapped_column(Float)


class DatasetBlobRow(Base):
    """A blob a dataset keeper (`team:NAME` or `user:NAME`) has sent: a version may name only
    its keeper's blobs, so knowing a digest never reads another team's content."""

    __tablename__ = "dataset_blobs"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    keeper: Mapped[str] = mapped_column(String(80), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)
    task_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)  # a job's


class DatasetReadRow(Base):
    """A dataset version a task read (its job fetched the version's manifest): the task's
    record lists them."""

    __tablename__ = "dataset_reads"
    __table_args__ = (
        UniqueConstraint("task_id", "name", "version"),
        Index("ix_dataset_reads_name_version", "name", "version"),  # who read a version
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    time: Mapped[float] = mapped_column(Float)


class TuningRow(Base):
    """A tuning: a search over a base task's parameters (broker/tasks/tuning.py), its settings
    as JSON (search space, objective, sampler, pruner, budget) and the best trial so far."""

    __tablename__ = "tunings"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    team: Mapped[str | None] = mapped_column(String(64), nullable=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    base_task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    resource: Mapped[str] = mapped_column(String(64))
    settings: Mapped[str] = mapped_column(Text)
    # running, stopping (its owner stopped it), completed, stopped, failed
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    best: Mapped[str] = mapped_column(Text, default="")  # JSON: number, value, params, model
    created_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class TuningTrialRow(Base):
    """One trial of a tuning: the parameters sampled, the task that ran them, the outcome."""

    __tablename__ = "tuning_trials"
    __table_args__ = (UniqueConstraint("tuning_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tuning_id: Mapped[int] = mapped_column(ForeignKey("tunings.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    task_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    params: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))  # running, complete, pruned, failed
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    pruned_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
