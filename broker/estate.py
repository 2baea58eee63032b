"""Load and validate the estate file; every error names the file, line, field and fix."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BeforeValidator,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from broker.apps.catalogue import load_catalogue
from broker.domain import (
    AppSettings,
    ArtifactSettings,
    CheckpointSignal,
    ComputeResource,
    DatasetSettings,
    Estate,
    Limits,
    Policy,
    Pool,
    Profile,
    Retention,
    StaticRoute,
    Team,
    UserMap,
)
from broker.errors import EstateError
from broker.identity_settings import IdentityFile, identity_problems
from broker.pools.registry import kinds
from broker.pools.settings import PoolSettings, UserMapRule
from broker.pools.slurm import pyxis_one_node
from broker.scheduler.policy_check import policy_problems
from broker.units import Name, Seconds, SecondsOrZero, SizeMB, Strict, parse_duration_s
from broker.yaml_lines import FIXES, LineMap, describe

# A DNS domain of two or more labels (RFC 1035: letters, digits, inner hyphens, 63 at most).
MAIL_DOMAIN = r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}$"


class ProfileFile(Strict):
    """What a task of the compute resource asks for, and the pools it may run on."""

    gpus: int = Field(0, ge=0)
    """Whole GPUs (on each node, with `nodes`); one of `gpus`, `gpu_fraction`, `gpu_memory`."""
    gpu_fraction: float | None = Field(None, gt=0, lt=1)
    """A share of one GPU, a multiple of 1/8 (`0.25`); a batch pool gives a whole GPU."""
    gpu_memory: SizeMB | None = None
    """GPU memory (`20G`): a share of one GPU sized by memory; a batch pool gives a whole GPU."""
    cpus: int = Field(1, ge=1)
    """CPU cores (on each node)."""
    memory: SizeMB = 1024
    """Memory (on each node), `16G`-style."""
    walltime: Seconds = 3600
    """The longest a task runs before it is stopped as timed out, `4h` or `01:30:00`."""
    nodes: int = Field(1, ge=1, le=4096)
    """Nodes a task spans, one runner each (batch pools only; `gpus`, `cpus` and `memory` are
    per node); host pools never take a task of more than one."""
    pools: list[Name] = Field(min_length=1)
    """The pools that may run its tasks, in order of preference."""


class CheckpointSignalFile(Strict):
    """A signal the scheduler sends the job before its walltime ends (Slurm `--signal=B:...`)."""

    signal: Literal["USR1", "USR2"] = "USR1"
    """The signal, which the runner passes on to the task's process group and goes on (TERM
    would end the run)."""
    before: Annotated[int, BeforeValidator(parse_duration_s), Field(gt=0, le=65535)]
    """How long before the walltime's end (`2m`); sbatch(1) takes at most 65535 seconds."""


class ResourceFile(Strict):
    """A compute resource: what users ask for by name (`klique submit -r NAME`)."""

    description: str = ""
    """One line for people, shown by `klique resources`."""
    profile: ProfileFile
    """What its tasks ask for, and where they run."""
    extra_directives: list[str] = []
    """Scheduler directives added to its tasks' batch scripts (`--constraint=a100`)."""
    skip_directives: list[str] = []
    """Directives of the pool's template left out of its tasks' scripts, by option name."""
    checkpoint_signal: CheckpointSignalFile | None = None
    """A signal before the walltime's end, for tasks that checkpoint (batch pools)."""

    @model_validator(mode="after")
    def _signal_within_walltime(self) -> ResourceFile:
        signal = self.checkpoint_signal
        if signal is not None and signal.before >= self.profile.walltime:
            raise ValueError(
                f"checkpoint_signal.before ({signal.before} s) is not shorter than the walltime "
                f"({self.profile.walltime} s); fix: send it less than the walltime before its end"
            )
        return self


class PolicyFile(Strict):
    """A team's resource policy."""

    resources: list[Name] = Field(min_length=1)
    """The compute resources the team may use."""
    reservation: dict[str, Annotated[int, Field(ge=0)]] = {}
    """Tasks of a compute resource guaranteed to the team (lent to others while unused), in
    the resource's own units: `{1-gpu: 4}` is four "1-gpu" tasks."""
    limit: dict[str, Annotated[int, Field(ge=0)]] = {}
    """The most tasks of a compute resource the team runs at once, across every pool."""
    priority: int = 0
    """Higher goes first for surplus capacity, before fair share and age."""


class DefaultsFile(Strict):
    """The scheduler's defaults and its reclaim knobs."""

    resource: Name | None = None
    """The compute resource of a task that names none (unset: the first declared)."""
    fair_share_half_life: Seconds = 7 * 86400
    """How fast past use (decayed GPU-seconds from the ledger) stops counting against a team."""
    min_run: SecondsOrZero = 600
    """A borrowed run younger than this is never preempted to reclaim its room."""
    reclaim_grace: SecondsOrZero = 120
    """A task waits this long before its team's reservation preempts a borrowed run."""
    max_preemptions_per_cycle: Annotated[int, Field(ge=0)] = 8
    """Runs preempted in one scheduling cycle, at most (bounds churn when several
    reservations wake at once)."""
    starvation: Seconds = 3600
    """A task waiting longer goes first and keeps a host pool for itself."""
    pipeline_resource: Name | None = None
    """The CPU compute resource where pipeline controllers (`flow.remote()`) run."""


class ArtifactsFile(Strict):
    """Where task artifacts are kept."""

    store: str | None = None
    """An fsspec URL (`s3://bucket/klique`) or a path; unset: `$KLIQUE_HOME/artifacts`."""
    max_size: SizeMB = 10 * 1024
    """The largest artifact one upload may carry."""


class RetentionFile(Strict):
    """How long archived runs are kept (`klique archive`); the control loop deletes them after."""

    days: float | None = Field(None, gt=0, le=36500)
    """Days an archived run is kept in every project; unset: for ever."""
    projects: dict[str, Annotated[float, Field(gt=0, le=36500)]] = {}
    """Days per project, overriding `days` (`{scratch: 7, papers: 3650}`)."""


class DatasetsFile(Strict):
    """Where dataset versions keep their files (docs/datasets.md)."""

    store: Literal["artifacts", "s3"] = "artifacts"
    """`artifacts`: the artifact store above; `s3`: the S3-compatible bucket named here."""
    endpoint: str | None = Field(None, pattern=r"^https?://[^\s]+$")
    """The bucket's service URL (`https://s3.example.org`); unset: AWS's own."""
    bucket: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    """The bucket (required with `store: s3`)."""
    credentials_file: str | None = None
    """A file in the AWS credentials format (`[default]` with `aws_access_key_id`,
    `aws_secret_access_key`), relative to this file; unset: boto3's own search."""
    region: str | None = None
    """The bucket's region, where the service asks for one."""

    @model_validator(mode="after")
    def _bucket_named(self) -> DatasetsFile:
        if self.store == "s3" and not self.bucket:
            raise ValueError("datasets.store s3 needs datasets.bucket")
        return self


class LimitsFile(Strict):
    """What one request, and one task's job, may send to the server; past one, a request or
    report is refused (413, naming the setting) and the job's own files stay whole."""

    max_request: SizeMB = 32
    """One API request's body (keep nginx's `client_max_body_size` a little above it)."""
    max_diff: SizeMB = 16
    """One task's uncommitted diff, sent with `klique submit`."""
    max_batch: int = Field(10_000, ge=1, le=1_000_000)
    """Tasks in one batch or sweep."""
    max_console: SizeMB = 256
    """Console kept on the server for one task (its job's own copy stays whole)."""
    max_scalars: int = Field(1_000_000, ge=0, le=2**31)
    """Scalar points kept for one task."""
    max_reports: int = Field(10_000, ge=0, le=2**31)
    """Reports of each kind beyond scalars (tables, images, texts...) kept for one task."""
    max_report_bytes: SizeMB = 256
    """All of one task's reports beyond scalars together."""
    max_artifacts: SizeMB = 100 * 1024
    """All of one task's artifacts together."""


class AppsFile(Strict):
    """Interactive apps (JupyterLab, endpoints) and how many may run."""

    catalogue: str | None = None
    """A folder of app files, relative to this file; unset: the built-in catalogue."""
    max_running: Annotated[int, Field(ge=0)] | None = None
    """Apps running at once, company-wide (unset: no bound)."""
    max_running_per_team: dict[Name, Annotated[int, Field(ge=0)]] = {}
    """Apps running at once, by team."""


class RouteFile(Strict):
    """A static route made by the platform team: a fixed name that apps may serve."""

    teams: list[Name] = []
    """The teams that may call it (empty: every team)."""
    apps: list[Name] = []
    """The apps that may serve it (empty: any endpoint)."""


class ServerFile(Strict):
    """How the server is reached, apart from where it listens."""

    public_url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    """The URL that jobs, pods, agents and browsers use, apart from the address the server
    binds (0.0.0.0 or 127.0.0.1 reach nothing from a compute node); `klique server
    --public-url` overrides it. Required while any pool's nodes are not the server's host."""


class EstateFile(Strict):
    """The estate file: everything the platform team declares."""

    server: ServerFile = ServerFile()
    """The server's own settings."""
    defaults: DefaultsFile = DefaultsFile()
    """The scheduler's defaults."""
    limits: LimitsFile = LimitsFile()
    """Bounds on requests and on what a task keeps on the server."""
    artifacts: ArtifactsFile = ArtifactsFile()
    """Where artifacts are kept."""
    datasets: DatasetsFile = DatasetsFile()
    """Where dataset versions keep their files."""
    retention: RetentionFile = RetentionFile()
    """How long archived runs are kept."""
    templates_dir: str | None = None
    """The site's batch templates, searched before the built-in ones."""
    mail_domain: str | None = None
    """Where a task's owner reads mail: templates get `owner_email` = OWNER@mail_domain."""
    teams: dict[Name, list[str]] = {}
    """Team name to its users (empty: the teams named elsewhere are not checked)."""
    resources: dict[Name, ResourceFile] = Field(min_length=1)
    """The compute resources, by name."""
    pools: dict[Name, dict[str, Any]] = Field(min_length=1)
    """The pools, by name; each is checked against the settings of its `kind` alone."""
    policies: dict[Name, PolicyFile] = {}
    """Resource policies, by team."""
    identity: IdentityFile | None = None
    """Single sign-on, LDAP, and the groups that make teams (unset: tokens only)."""
    apps: AppsFile = AppsFile()
    """Interactive apps."""
    routes: dict[Name, RouteFile] = {}
    """Static routes, by name."""

    @field_validator("mail_domain")
    @classmethod
    def _a_domain(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 253 or not re.fullmatch(MAIL_DOMAIN, value)):
            raise ValueError(
                f"{value!r} is not a mail domain; fix: give a domain like example.org (letters, "
                "digits and inner hyphens, in labels joined by dots)"
            )
        return value


def load_estate(path: str | os.PathLike[str]) -> Estate:
    """Read, validate and build the estate. Raises EstateError listing every problem."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise EstateError([f"{source}: cannot read the estate file: {exc.strerror}"]) from exc
    estate = parse_estate(text, source)
    load_catalogue(estate)  # its own errors name the app file and line
    return estate


def parse_estate(text: str, source: str = "<estate>") -> Estate:
    lines = LineMap(text, source)
    data = lines.data
    if not isinstance(data, dict):
        raise EstateError(
            [f"{source}:1: the estate file must be a mapping with resources: and pools:"]
        )
    problems: list[str] = []
    try:
        model = EstateFile.model_validate(data)
    except ValidationError as exc:
        problems += [_describe(err, lines) for err in exc.errors()]
    pools: dict[str, PoolSettings] = {}
    if isinstance(data.get("pools"), dict):
        pools, found = _pools(data["pools"], lines)
        problems += found
    if problems:
        raise EstateError(problems)
    problems = [lines.error(path, message) for path, message in _cross_check(model, pools)]
    if problems:
        raise EstateError(problems)
    return replace(_build(model, pools, source), text=text)


@functools.cache
def _pool_settings() -> TypeAdapter[dict[str, PoolSettings]]:
    """Every registered kind's settings model, told apart by `kind`."""
    models = tuple(spec.settings for spec in kinds().values())
    union: Any = Annotated[Union[models], Field(discriminator="kind")]  # noqa: UP007
    return TypeAdapter(dict[str, union])


def _pools(raw: dict[str, Any], lines: LineMap) -> tuple[dict[str, PoolSettings], list[str]]:
    """Each pool against its own kind's model: errors name the pool's field, not the kind."""
    try:
        return _pool_settings().validate_python(raw), []
    except ValidationError as exc:
        errors = []
        for err in exc.errors():
            loc = list(err["loc"])
            if len(loc) > 1 and loc[1] in kinds():  # the union's tag: not a field of the file
                del loc[1]
            if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
                tag = err.get("ctx", {}).get("tag")
                loc.append("kind")
                err = {**err, "msg": f"unknown pool kind {tag!r}" if tag else "is required"}
            errors.append(_describe({**err, "loc": ("pools", *loc)}, lines))
        return {}, errors


def _describe(err: Any, lines: LineMap) -> str:
    """An error in the estate: without the tag of a user map's form, and with the pool kinds
    named where a pool's kind is wrong."""
    known = ", ".join(sorted(kinds()))
    fixes = {
        **FIXES,
        "union_tag_invalid": f"use one of the pool kinds: {known}",
        "union_tag_not_found": f"add kind: with one of the pool kinds: {known}",
    }
    return describe({**err, "loc": _untagged(tuple(str(p) for p in err["loc"]))}, lines, fixes)


def _untagged(path: tuple[str, ...]) -> tuple[str, ...]:
    """Without the tag pydantic adds for the form of a user_map (a mapping, or a rule)."""
    if "user_map" in path:
        i = path.index("user_map") + 1
        if path[i : i + 1] in (("rule",), ("map",)):
            return path[:i] + path[i + 1 :]
    return path


def _cross_check(
    model: EstateFile, pools: dict[str, PoolSettings]
) -> list[tuple[tuple[str, ...], str]]:
    problems: list[tuple[tuple[str, ...], str]] = []
    known_pools = ", ".join(pools)
    for name, resource in model.resources.items():
        profile = resource.profile
        at = ("resources", name, "profile")
        for i, pool_ref in enumerate(profile.pools):
            if pool_ref not in pools:
                problems.append(
                    (
                        (*at, "pools", str(i)),
                        f"pool {pool_ref!r} is not declared; fix: declare it under pools: "
                        f"or use one of: {known_pools}",
                    )
                )
        for i, pool_ref in enumerate(profile.pools):
            runtime = getattr(pools.get(pool_ref), "container_runtime", None)
            if profile.nodes > 1 and runtime == "pyxis":
                problem = pyxis_one_node(pool_ref, name, profile.nodes)
                problems.append(((*at, "pools", str(i)), problem))
        gpu_ways = [
            profile.gpus > 0,
            profile.gpu_fraction is not None,
            profile.gpu_memory is not None,
        ]
        if sum(gpu_ways) > 1:
            problems.append(
                (
                    at,
                    "sets more than one of gpus, gpu_fraction, gpu_memory; "
                    "fix: keep exactly one way of sizing the GPU request",
                )
            )
        if (
            profile.gpu_fraction is not None
            and round(profile.gpu_fraction * 8) != profile.gpu_fraction * 8
        ):
            problems.append(
                (
                    (*at, "gpu_fraction"),
                    "must be a multiple of 1/8; fix: use 0.125, "
                    "0.25, 0.375, 0.5, 0.625, 0.75 or 0.875",
                )
            )
    for pool_name, pool in pools.items():
        problems += [(("pools", pool_name, *at), what) for at, what in _pool_problems(pool)]
    problems += _shared_gpus(pools)
    for team, policy in model.policies.items():
        if model.teams and team not in model.teams:
            problems.append(
                (("policies", team), f"team {team!r} is not declared; fix: add it under teams:")
            )
        for i, resource_name in enumerate(policy.resources):
            if resource_name not in model.resources:
                problems.append(
                    (
                        ("policies", team, "resources", str(i)),
                        f"compute resource {resource_name!r} is not declared; fix: declare it "
                        "under resources:",
                    )
                )
    problems += [(path[:-1], path[-1]) for path in identity_problems(model.identity, model.teams)]
    quota_teams = [
        (("apps", "max_running_per_team", t), t) for t in model.apps.max_running_per_team
    ]
    route_teams = [(("routes", n, "teams"), t) for n, r in model.routes.items() for t in r.teams]
    for at, team in quota_teams + route_teams:
        if model.teams and team not in model.teams:
            problems.append((at, f"team {team!r} is not declared; fix: add it under teams:"))
    for key in ("resource", "pipeline_resource"):
        named = getattr(model.defaults, key)
        if named and named not in model.resources:
            problems.append(
                (
                    ("defaults", key),
                    f"compute resource {named!r} is not declared; fix: name one under resources:",
                )
            )
    if not problems:
        estate = _build(model, pools, "")
        problems += [(tuple(path.split(".")), message) for path, message in policy_problems(estate)]
    return problems


def _shared_gpus(pools: Mapping[str, PoolSettings]) -> list[tuple[tuple[str, ...], str]]:
    """Host pools that split one host's GPUs (`gpu_ids`) must not name the same GPU twice."""
    owner: dict[int, str] = {}
    problems: list[tuple[tuple[str, ...], str]] = []
    for name, pool in pools.items():
        for gpu in getattr(pool, "gpu_ids", None) or ():
            if gpu in owner:
                problems.append(
                    (
                        ("pools", name, "gpu_ids"),
                        f"GPU {gpu} belongs to pool {owner[gpu]} as well: both would hand it out; "
                        "fix: give each GPU to one pool",
                    )
                )
            owner.setdefault(gpu, name)
    return problems


def _pool_problems(pool: PoolSettings) -> list[tuple[tuple[str, ...], str]]:
    """What a pool's settings model alone cannot say: settings that go together."""
    problems: list[tuple[tuple[str, ...], str]] = []
    queueing = kinds()[pool.kind].queueing
    if queueing and pool.job_root is None:
        problems.append(
            (
                (),
                "a batch pool needs job_root: a folder on the shared filesystem that the "
                "mapped accounts can write; fix: add job_root",
            )
        )
    if not queueing and pool.user_map and pool.job_root is None:
        problems.append(
            (
                (),
                "a host pool with a user_map needs job_root: a folder outside the server's "
                "home that the mapped accounts share, with the sticky bit; fix: add job_root "
                "and create it with `install -d -m 1777 PATH`",
            )
        )
    if isinstance(pool.user_map, UserMapRule) and not pool.query_account:
        problems.append(
            (
                ("user_map",),
                "a user_map rule names no account in advance; fix: add query_account: an "
                "ordinary account that the pool's start-up checks and status queries run as",
            )
        )
    explicit = pool.user_map if isinstance(pool.user_map, dict) else {}
    for user, account in explicit.items():
        if account == "root" or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", account):
            problems.append(
                (
                    ("user_map", user),
                    f"{account!r} is not an ordinary Linux account name (Klique never runs "
                    "tasks as root); fix: map the user to the account it logs in with",
                )
            )
    transport = getattr(pool, "transport", None)
    if transport is not None and transport.kind == "ssh" and transport.known_hosts is None:
        problems.append(
            (
                ("transport",),
                "an ssh transport needs known_hosts; fix: give the path of a known_hosts file",
            )
        )
    return problems


def _build(model: EstateFile, pools: dict[str, PoolSettings], source: str) -> Estate:
    resources = {
        name: ComputeResource(
            name=name,
            description=r.description,
            profile=Profile(
                pools=tuple(r.profile.pools),
                gpus=r.profile.gpus,
                gpu_fraction=r.profile.gpu_fraction,
                gpu_memory_mb=r.profile.gpu_memory,
                cpus=r.profile.cpus,
                memory_mb=r.profile.memory,
                walltime_s=r.profile.walltime,
                nodes=r.profile.nodes,
            ),
            extra_directives=tuple(r.extra_directives),
            skip_directives=tuple(r.skip_directives),
            checkpoint_signal=_checkpoint_signal(r.checkpoint_signal),
        )
        for name, r in model.resources.items()
    }
    built = {name: _build_pool(name, p) for name, p in pools.items()}
    policies = {
        team: Policy(
            team=team,
            resources=tuple(p.resources),
            reservation=dict(p.reservation),
            limit=dict(p.limit),
            priority=p.priority,
        )
        for team, p in model.policies.items()
    }
    teams = {name: Team(name=name, users=tuple(users)) for name, users in model.teams.items()}
    return Estate(
        resources=resources,
        pools=built,
        policies=policies,
        teams=teams,
        default_resource=model.defaults.resource or next(iter(resources)),
        fair_share_half_life_s=float(model.defaults.fair_share_half_life),
        min_run_s=float(model.defaults.min_run),
        reclaim_grace_s=float(model.defaults.reclaim_grace),
        max_preemptions_per_cycle=model.defaults.max_preemptions_per_cycle,
        starvation_s=float(model.defaults.starvation),
        limits=Limits(
            max_request_bytes=model.limits.max_request * 1024 * 1024,
            max_diff_bytes=model.limits.max_diff * 1024 * 1024,
            max_batch=model.limits.max_batch,
            max_console_bytes=model.limits.max_console * 1024 * 1024,
            max_scalars=model.limits.max_scalars,
            max_artifact_bytes=model.limits.max_artifacts * 1024 * 1024,
            max_reports=model.limits.max_reports,
            max_report_bytes=model.limits.max_report_bytes * 1024 * 1024,
        ),
        artifacts=ArtifactSettings(
            store=model.artifacts.store, max_bytes=model.artifacts.max_size * 1024 * 1024
        ),
        retention=Retention(days=model.retention.days, projects=dict(model.retention.projects)),
        datasets=DatasetSettings(
            store=model.datasets.store,
            endpoint=model.datasets.endpoint,
            bucket=model.datasets.bucket,
            credentials_file=_beside(source, model.datasets.credentials_file),
            region=model.datasets.region,
        ),
        pipeline_resource=model.defaults.pipeline_resource,
        templates_dir=model.templates_dir,
        mail_domain=model.mail_domain,
        public_url=model.server.public_url,
        apps=AppSettings(
            catalogue=_beside(source, model.apps.catalogue),
            max_running=model.apps.max_running,
            max_running_per_team=dict(model.apps.max_running_per_team),
        ),
        routes={
            name: StaticRoute(name, tuple(r.teams), tuple(r.apps))
            for name, r in model.routes.items()
        },
        source=source,
        identity=model.identity,
    )


def _beside(source: str, folder: str | None) -> str | None:
    """A folder named in the estate, relative to the estate file's own folder."""
    if folder is None or os.path.isabs(folder) or not os.path.isfile(source):
        return folder
    return os.path.join(os.path.dirname(os.path.abspath(source)), folder)


def _checkpoint_signal(given: CheckpointSignalFile | None) -> CheckpointSignal | None:
    return None if given is None else CheckpointSignal(given.signal, given.before)


# A kind's settings that placement reads, by their name in the domain's Pool; a kind without
# one (slots on a Slurm pool), or one left unset, keeps the Pool's default.
_PLACEMENT_FIELDS = {
    "slots": "slots",
    "gpus": "gpus",
    "gpu_ids": "gpu_ids",
    "gpu_memory": "gpu_memory_mb",
    "max_queued": "max_queued",
    "max_wait": "max_wait_s",
    "template": "template",
    "extra_directives": "extra_directives",
    "skip_directives": "skip_directives",
}


def _build_pool(name: str, p: PoolSettings) -> Pool:
    """The domain's Pool: the fields placement reads, and the kind's settings model itself."""
    given = p.model_dump(include=set(_PLACEMENT_FIELDS))
    placement: dict[str, Any] = {
        _PLACEMENT_FIELDS[key]: tuple(value) if isinstance(value, list) else value
        for key, value in given.items()
        if value is not None
    }
    return Pool(
        name=name,
        kind=p.kind,
        queueing=kinds()[p.kind].queueing,
        spans_nodes=kinds()[p.kind].spans_nodes,
        user_map=_user_map(p),
        settings=p,
        **placement,
    )


def _user_map(p: PoolSettings) -> UserMap:
    if isinstance(p.user_map, UserMapRule):
        return UserMap(rule=p.user_map.rule, deny=frozenset(p.user_map.deny))
    accounts = dict(p.user_map)
    return UserMap(accounts, accounts.pop("default", None))


def builtin_estate_text(slots: int | None = None, pool_lines: str = "") -> str:
    """The embedded default's YAML; `pool_lines` add settings to its one pool (indented)."""
    slots = slots or max(1, (os.cpu_count() or 1))
    return f"""
resources:
  cpu:
    description: one CPU on this machine
    profile: {{cpus: 1, memory: 1G, walltime: 24h, pools: [local]}}
pools:
  local:
    kind: host
    description: this machine
    slots: {slots}
{pool_lines}"""


def builtin_estate(slots: int | None = None) -> Estate:
    """The embedded default: one host pool on this machine and one CPU compute resource."""
    return parse_estate(builtin_estate_text(slots), "<built-in>")
