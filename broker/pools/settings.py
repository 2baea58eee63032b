"""What an estate's pool entry may say: the settings every pool kind shares, and those every
batch pool shares. Each kind's module declares its own model on these, with `kind` as a
literal: the estate validates a pool against its kind's model alone, so a setting of another
kind (`partition` on a PBS pool) is an error with its file and line."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import Discriminator, Field, Tag, model_validator

from broker.domain import Pool
from broker.units import Seconds, Strict

SUBMIT_CONCURRENCY = 8  # a pool's submissions in flight at once, where its kind sets none

Runtime = Literal["charliecloud", "apptainer", "singularity", "enroot", "pyxis"]


class UserMapRule(Strict):
    """`user_map: {rule: same-name, deny: [...]}`: a user maps to the account of the same name."""

    rule: Literal["same-name"]
    """The rule: `same-name`, a user runs as the Linux account of their own name."""
    deny: list[str] = []
    """Accounts no user maps to (root never does)."""


def _user_map_form(value: Any) -> str:
    if isinstance(value, UserMapRule) or (isinstance(value, dict) and "rule" in value):
        return "rule"
    return "map"


# Klique user -> Linux account (`default` for the others), or a rule.
UserMapField = Annotated[
    Annotated[UserMapRule, Tag("rule")] | Annotated[dict[str, str], Tag("map")],
    Discriminator(_user_map_form),
]


class PoolSettings(Strict):
    """Every pool kind."""

    kind: str
    """The pool's kind, which says what else it may set."""
    description: str = ""
    """One line for people, shown by `klique pools`."""
    user_map: UserMapField = {}
    """Klique user to the Linux account their tasks run as (`default` for the others), or a
    rule; empty: only the server's own account's tasks, and none when that is root."""
    agent: Literal["server", "remote"] = "server"
    """Which agent serves the pool: one inside the server, or `klique agent` on the pool's
    login node (`remote`: the server only places its tasks and keeps its ledger)."""
    job_root: str | None = None
    """The folder that holds a private folder per attempt (on the shared filesystem for a
    batch pool); writable by other accounts only with the sticky bit."""
    query_account: str | None = None
    """The account that runs start-up checks and status queries (any ordinary one will do);
    unset: the first mapped account. A user_map rule names none in advance, so it needs this."""
    python: str | None = None
    """The Python (3.8 or later) that runs the runner on the nodes; unset: the system's."""
    cache_dir: str | None = None
    """Where the runner keeps environments, per account (`CACHE_DIR/ACCOUNT`); unset:
    `~/.cache/klique` of the account."""
    uv: str | None = None
    """uv on the nodes: a path, or `stage` (this server's uv, copied to a private folder of
    each account under job_root); unset: uv on the node's PATH, else venv and pip."""
    container_runtime: Runtime | None = None
    """What runs the tasks that name an image (unset: what the node has); Pyxis on Slurm
    pools only."""
    container_scratch: str | None = None
    """A node-local folder for unpacked containers and the runtimes' caches."""
    container_home: Literal["none", "account"] = "none"
    """Apptainer and SingularityCE: the account's home inside the container (`account`, the
    runtime's own default) or none (`--no-home`): by default ~/.local's packages stay out."""
    container_gpus: Literal["nvidia", "rocm"] = "nvidia"
    """The GPU driver libraries a container gets when its compute resource asks for GPUs
    (Apptainer `--nv` or `--rocm`), whatever GPU variables the scheduler sets."""
    PYXIS: ClassVar[bool] = False  # Pyxis is a Slurm plugin: only Slurm pools may name it

    @model_validator(mode="after")
    def _pyxis_on_slurm_only(self) -> PoolSettings:
        if self.container_runtime == "pyxis" and not self.PYXIS:
            raise ValueError(
                "pyxis is a Slurm plugin (srun --container-image); fix: use it on a slurm pool, "
                "or choose apptainer, enroot or charliecloud"
            )
        return self


class TransportSettings(Strict):
    """How the scheduler's commands reach the pool's login node, and as whom."""

    kind: Literal["local", "ssh", "sudo"] = "local"
    """`local`: on this host through `runuser`; `ssh`: over one pooled connection per account,
    host keys verified; `sudo`: `sudo -n -u ACCOUNT`, for an agent that runs as a service
    account (docs/login-node-agent.md)."""
    host: str = "127.0.0.1"
    """ssh: the login node."""
    port: int = Field(default=22, ge=1, le=65535)
    """ssh: its port."""
    known_hosts: str | None = None
    """ssh: a known_hosts file that holds the login node's key (required with ssh)."""
    client_keys: list[str] = []
    """ssh: private keys to log in with (unset: the server account's own)."""
    helper: str = "/usr/local/libexec/klique-helper"
    """sudo: the one program besides the scheduler's commands that the sudoers rule allows
    (its file operations, confined to the job roots of /etc/klique/helper.conf)."""


class BatchSettings(PoolSettings):
    """Every pool behind a batch scheduler."""

    transport: TransportSettings = Field(default_factory=TransportSettings)
    """How the scheduler's commands are run."""
    max_queued: int = Field(100, ge=1)
    """Klique's jobs waiting in the scheduler's queue at once, at most (no flooding)."""
    max_wait: Seconds | None = None
    """A task waiting in the scheduler's queue longer is withdrawn and moves to its compute
    resource's next pool (unset: it stays)."""
    template: str | None = None
    """The batch script template (a file under templates_dir; unset: the kind's built-in)."""
    extra_directives: list[str] = []
    """Scheduler directives added to every job of the pool."""
    skip_directives: list[str] = []
    """Directives of the template left out of every job of the pool, by option name."""
    poll_interval: Seconds = 10
    """How often the pool is asked about its jobs (one status query a look)."""
    lost_after: Seconds = 120
    """A job gone from the queue with no exit file and no accounting record this long is
    lost, with a reason."""
    message_timeout: Seconds | None = None
    """How long a lost submit reply's job may take to show in the scheduler's listing: the
    looks for its tag are this far apart (unset: what the scheduler says, or its default)."""
    status_per_account: bool | None = None
    """Status queries run once per mapped account, as it (unset: one query, per account once
    the scheduler hides other users' jobs)."""
    requeue_preempted: bool = False
    """A preempted task goes back to Klique's queue and runs again."""
    charge_phases: list[Literal["configuring", "suspended"]] = []
    """Phases of a running job that the ledger charges (default none: a job whose nodes are
    booting, or whose execution is suspended by gang scheduling, is not charged)."""
    submit_concurrency: int = Field(SUBMIT_CONCURRENCY, ge=1, le=64)
    """Submissions in flight at once."""
    job_arrays: bool = True
    """A sweep's tasks that share every directive go as one array job, where the scheduler
    has them (docs/job-arrays.md); false: one job each."""


Model = TypeVar("Model", bound=PoolSettings)


def settings_as(pool: Pool, model: type[Model]) -> Model:
    """The pool's settings as its kind's model (or a base of it: PoolSettings, BatchSettings).

    The estate validates each pool against its kind's model and the model travels as itself
    in `Pool.settings`; a pool of another kind here is a wiring mistake, not a user's."""
    settings = pool.settings
    if not isinstance(settings, model):
        raise TypeError(
            f"pool {pool.name!r} ({pool.kind}) has {type(settings).__name__} settings where "
            f"{model.__name__} was expected"
        )
    return settings


def batch_settings(pool: Pool) -> BatchSettings | None:
    """A batch pool's settings; None for a pool of another kind (a host, a namespace)."""
    settings = pool.settings
    return settings if isinstance(settings, BatchSettings) else None


# What the scheduler's loop and the agents ask of any pool, whatever its kind. A pool built by
# hand for placement alone (no settings model) answers with the defaults.


def serves_remotely(pool: Pool) -> bool:
    """The pool is served by `klique agent` on its login node: the server only places its
    tasks and keeps its ledger."""
    return isinstance(pool.settings, PoolSettings) and pool.settings.agent == "remote"


def description_of(pool: Pool) -> str:
    """The pool's one line for people (empty where it says none)."""
    return pool.settings.description if isinstance(pool.settings, PoolSettings) else ""


def poll_interval_s(pool: Pool) -> float | None:
    """How often a batch pool is asked about its jobs (None: the scheduler's own tick)."""
    batch = batch_settings(pool)
    return None if batch is None else float(batch.poll_interval)


def submit_concurrency(pool: Pool) -> int:
    """Submissions in flight at once on the pool."""
    batch = batch_settings(pool)
    return SUBMIT_CONCURRENCY if batch is None else batch.submit_concurrency


def requeues_preempted(pool: Pool) -> bool:
    """A preempted task goes back to Klique's queue (the pool's `requeue_preempted`)."""
    batch = batch_settings(pool)
    return batch is not None and batch.requeue_preempted
