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
    deny: list[str] = []


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
    description: str = ""
    user_map: UserMapField = {}
    # Which agent serves the pool: one inside the server, or `klique agent` on the pool's login
    # node (remote: the server only places its tasks and keeps its ledger).
    agent: Literal["server", "remote"] = "server"
    job_root: str | None = None
    # The account that runs start-up checks and status queries (any ordinary one will do);
    # unset: the first mapped account. A user_map rule names none in advance, so it needs this.
    query_account: str | None = None
    # Where and with what the runner runs on the nodes.
    python: str | None = None
    cache_dir: str | None = None
    uv: str | None = None
    # Tasks with an image: the runtime that runs them (null: what the node has), and the
    # node-local folder for unpacked containers and runtime caches.
    container_runtime: Runtime | None = None
    container_scratch: str | None = None
    # Apptainer and SingularityCE: the account's home inside the container (`account`, the
    # runtime's own default) or none (`--no-home`): by default ~/.local's packages stay out.
    container_home: Literal["none", "account"] = "none"
    # The GPU driver libraries a container gets when its compute resource asks for GPUs
    # (Apptainer --nv or --rocm), whatever GPU variables the scheduler sets.
    container_gpus: Literal["nvidia", "rocm"] = "nvidia"
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
    kind: Literal["local", "ssh", "sudo"] = "local"
    host: str = "127.0.0.1"
    port: int = Field(default=22, ge=1, le=65535)
    known_hosts: str | None = None
    client_keys: list[str] = []
    helper: str = "/usr/local/libexec/klique-helper"  # sudo: the one program besides the
    # scheduler's commands that the sudoers rule allows (see docs/login-node-agent.md)


class BatchSettings(PoolSettings):
    """Every pool behind a batch scheduler."""

    transport: TransportSettings = Field(default_factory=TransportSettings)
    max_queued: int = Field(100, ge=1)
    max_wait: Seconds | None = None
    template: str | None = None
    extra_directives: list[str] = []
    skip_directives: list[str] = []
    poll_interval: Seconds = 10
    lost_after: Seconds = 120
    # How long a lost submit reply's job may take to show in the scheduler's listing: the
    # looks for its tag are this far apart (unset: what the scheduler says, or its default).
    message_timeout: Seconds | None = None
    status_per_account: bool | None = None  # unset: one query, per account if others are hidden
    requeue_preempted: bool = False
    # Phases of a running job that the ledger charges (default none: a job whose nodes are
    # booting, or whose execution is suspended by gang scheduling, is not charged).
    charge_phases: list[Literal["configuring", "suspended"]] = []
    submit_concurrency: int = Field(SUBMIT_CONCURRENCY, ge=1, le=64)  # submissions in flight
    # A sweep's tasks that share every directive go as one array job, where the scheduler
    # has them (docs/job-arrays.md); false: one job each.
    job_arrays: bool = True


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
