"""Load and validate the estate file; every error names the file, line, field and fix."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from broker.domain import (
    ArtifactSettings,
    ComputeResource,
    Estate,
    Limits,
    Policy,
    Pool,
    PoolKind,
    Profile,
    Team,
    UserMap,
)
from broker.errors import EstateError

_SIZE_UNITS = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
_TIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_size_mb(value: object) -> int:
    """'16G', '512M', '1.5T' or a number of MiB -> MiB."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(value), re.IGNORECASE)
    if not match:
        raise ValueError(f"{value!r} is not a size; fix: write it like 512M, 16G or 1T")
    return int(float(match[1]) * _SIZE_UNITS[match[2].lower()])


def parse_duration_s(value: object) -> int:
    """'90s', '30m', '4h', '2d', 'HH:MM:SS', 'MM:SS' or a number of seconds -> seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    text = str(value).strip()
    if re.fullmatch(r"\d+(:\d{1,2}){1,2}", text):
        seconds = 0
        for part in text.split(":"):
            seconds = seconds * 60 + int(part)
        return seconds  # HH:MM:SS or MM:SS, as Slurm reads --time
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", text, re.IGNORECASE)
    if not match:
        raise ValueError(
            f"{value!r} is not a duration; fix: write it like 90s, 30m, 4h, 2d or 04:00:00"
        )
    return int(float(match[1]) * _TIME_UNITS[match[2].lower()])


SizeMB = Annotated[int, BeforeValidator(parse_size_mb), Field(ge=0)]
Seconds = Annotated[int, BeforeValidator(parse_duration_s), Field(gt=0)]
SecondsOrZero = Annotated[int, BeforeValidator(parse_duration_s), Field(ge=0)]
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProfileFile(_Strict):
    gpus: int = Field(0, ge=0)
    gpu_fraction: float | None = Field(None, gt=0, lt=1)
    gpu_memory: SizeMB | None = None
    cpus: int = Field(1, ge=1)
    memory: SizeMB = 1024
    walltime: Seconds = 3600
    pools: list[Name] = Field(min_length=1)


class ResourceFile(_Strict):
    description: str = ""
    profile: ProfileFile
    extra_directives: list[str] = []
    skip_directives: list[str] = []


class TransportFile(_Strict):
    kind: Literal["local", "ssh"] = "local"
    host: str = "127.0.0.1"
    port: int = 22
    known_hosts: str | None = None
    client_keys: list[str] = []


class PoolFile(_Strict):
    kind: PoolKind
    description: str = ""
    user_map: dict[str, str] = {}
    slots: int = Field(1, ge=1)
    gpus: int = Field(0, ge=0)
    gpu_memory: SizeMB = 0
    max_queued: int = Field(100, ge=1)
    max_wait: Seconds | None = None
    template: str | None = None
    extra_directives: list[str] = []
    skip_directives: list[str] = []
    # Batch pools: where and how jobs are submitted.
    transport: TransportFile = TransportFile()
    job_root: str | None = None
    partition: str | None = None
    queue: str | None = None
    account: str | None = None
    qos: str | None = None
    gpu_flag: Literal["gres", "gpus"] = "gres"
    dialect: Literal["pbspro", "torque"] = "pbspro"
    poll_interval: Seconds = 10
    lost_after: Seconds = 120
    accounting: Literal["none", "slurmdbd", "jobcomp"] = "none"
    query_account: str | None = None
    status_per_account: bool | None = None  # unset: one query, per account if others are hidden
    bjobs_json: bool = True  # LSF before 10.1 Fix Pack 2 has no `bjobs -json`: set false
    requeue_preempted: bool = False
    submit_concurrency: int = Field(8, ge=1, le=64)  # submissions in flight at once
    # Where and with what the runner runs on the nodes.
    python: str | None = None
    cache_dir: str | None = None
    uv: str | None = None
    # Tasks with an image: the runtime that runs them (null: what the node has), and the
    # node-local folder for unpacked containers and runtime caches.
    container_runtime: (
        Literal["charliecloud", "apptainer", "singularity", "enroot", "pyxis"] | None
    ) = None
    container_scratch: str | None = None


class PolicyFile(_Strict):
    resources: list[Name] = Field(min_length=1)
    reservation: dict[str, Annotated[int, Field(ge=0)]] = {}
    limit: dict[str, Annotated[int, Field(ge=0)]] = {}
    priority: int = 0


class DefaultsFile(_Strict):
    resource: Name | None = None
    fair_share_half_life: Seconds = 7 * 86400
    min_run: SecondsOrZero = 600
    reclaim_grace: SecondsOrZero = 120
    max_preemptions_per_cycle: Annotated[int, Field(ge=0)] = 8
    starvation: Seconds = 3600
    pipeline_resource: Name | None = None  # where pipeline controllers run (a CPU resource)


class ArtifactsFile(_Strict):
    store: str | None = None  # an fsspec URL or a path; unset: $KLIQUE_HOME/artifacts
    max_size: SizeMB = 10 * 1024  # MiB


class LimitsFile(_Strict):
    max_request: SizeMB = 32  # MiB
    max_diff: SizeMB = 16  # MiB


class EstateFile(_Strict):
    defaults: DefaultsFile = DefaultsFile()
    limits: LimitsFile = LimitsFile()
    artifacts: ArtifactsFile = ArtifactsFile()
    teams: dict[Name, list[str]] = {}
    resources: dict[Name, ResourceFile] = Field(min_length=1)
    pools: dict[Name, PoolFile] = Field(min_length=1)
    policies: dict[Name, PolicyFile] = {}


_FIXES = {
    "missing": "add it",
    "extra_forbidden": "remove it, or check its spelling against examples/estate.yaml",
    "int_parsing": "give a whole number",
    "int_type": "give a whole number",
    "float_parsing": "give a number",
    "bool_parsing": "give true or false",
    "string_type": "give a text value",
    "list_type": "give a list, like [a, b]",
    "dict_type": "give a mapping of name: value lines",
    "model_type": "give a mapping of field: value lines",
    "enum": "use one of the allowed values",
    "literal_error": "use one of the allowed values",
    "string_pattern_mismatch": "use letters, digits, '.', '_' and '-' (at most 64)",
    "greater_than_equal": "give a larger value",
    "greater_than": "give a larger value",
    "less_than": "give a smaller value",
    "too_short": "give at least one entry",
}


def load_estate(path: str | os.PathLike[str]) -> Estate:
    """Read, validate and build the estate. Raises EstateError listing every problem."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise EstateError([f"{source}: cannot read the estate file: {exc.strerror}"]) from exc
    return parse_estate(text, source)


def parse_estate(text: str, source: str = "<estate>") -> Estate:
    lines = _LineMap(text, source)
    data = lines.data
    if not isinstance(data, dict):
        raise EstateError(
            [f"{source}:1: the estate file must be a mapping with resources: and pools:"]
        )
    try:
        model = EstateFile.model_validate(data)
    except ValidationError as exc:
        raise EstateError([_describe(err, lines) for err in exc.errors()]) from None
    problems = [lines.error(path, message) for path, message in _cross_check(model)]
    if problems:
        raise EstateError(problems)
    return _build(model, source)


def _describe(err: Any, lines: _LineMap) -> str:
    path = tuple(str(p) for p in err["loc"])
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        message = "is required"
    if err["type"] == "value_error":  # Klique's own validators say the fix themselves
        return lines.error(path, message)
    fix = _FIXES.get(err["type"], "see examples/estate.yaml for the format")
    if err["type"] in ("enum", "literal_error") and "expected" in err.get("ctx", {}):
        fix = f"use one of {err['ctx']['expected']}"
    return lines.error(path, f"{message}; fix: {fix}")


def _cross_check(model: EstateFile) -> list[tuple[tuple[str, ...], str]]:
    from broker.scheduler.policy_check import policy_problems

    problems: list[tuple[tuple[str, ...], str]] = []
    known_pools = ", ".join(model.pools)
    for name, resource in model.resources.items():
        profile = resource.profile
        at = ("resources", name, "profile")
        for i, pool_ref in enumerate(profile.pools):
            if pool_ref not in model.pools:
                problems.append(
                    (
                        (*at, "pools", str(i)),
                        f"pool {pool_ref!r} is not declared; fix: declare it under pools: "
                        f"or use one of: {known_pools}",
                    )
                )
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
    for pool_name, pool in model.pools.items():
        if pool.kind.queueing and pool.job_root is None:
            problems.append(
                (
                    ("pools", pool_name),
                    "a batch pool needs job_root: a folder on the shared "
                    "filesystem that the mapped accounts can write; fix: add job_root",
                )
            )
        if not pool.kind.queueing and pool.user_map and pool.job_root is None:
            problems.append(
                (
                    ("pools", pool_name),
                    "a host pool with a user_map needs job_root: a folder outside the server's "
                    "home that the mapped accounts share, with the sticky bit; fix: add job_root "
                    "and create it with `install -d -m 1777 PATH`",
                )
            )
        for user, account in pool.user_map.items():
            if account == "root" or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", account):
                problems.append(
                    (
                        ("pools", pool_name, "user_map", user),
                        f"{account!r} is not an ordinary Linux account name (Klique never runs "
                        "tasks as root); fix: map the user to the account it logs in with",
                    )
                )
        if pool.container_runtime == "pyxis" and pool.kind is not PoolKind.SLURM:
            problems.append(
                (
                    ("pools", pool_name, "container_runtime"),
                    "pyxis is a Slurm plugin (srun --container-image); fix: use it on a slurm "
                    "pool, or choose apptainer, enroot or charliecloud",
                )
            )
        if pool.transport.kind == "ssh" and pool.transport.known_hosts is None:
            problems.append(
                (
                    ("pools", pool_name, "transport"),
                    "an ssh transport needs known_hosts; fix: give the path of a known_hosts file",
                )
            )
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
        estate = _build(model, "")
        problems += [(tuple(path.split(".")), message) for path, message in policy_problems(estate)]
    return problems


def _build(model: EstateFile, source: str) -> Estate:
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
            ),
            extra_directives=tuple(r.extra_directives),
            skip_directives=tuple(r.skip_directives),
        )
        for name, r in model.resources.items()
    }
    pools = {name: _build_pool(name, p) for name, p in model.pools.items()}
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
        pools=pools,
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
        ),
        artifacts=ArtifactSettings(
            store=model.artifacts.store, max_bytes=model.artifacts.max_size * 1024 * 1024
        ),
        pipeline_resource=model.defaults.pipeline_resource,
        source=source,
    )


def _build_pool(name: str, p: PoolFile) -> Pool:
    accounts = dict(p.user_map)
    default = accounts.pop("default", None)
    settings = p.model_dump(
        exclude={
            "kind",
            "user_map",
            "slots",
            "gpus",
            "gpu_memory",
            "max_queued",
            "max_wait",
            "template",
            "extra_directives",
            "skip_directives",
        }
    )
    return Pool(
        name=name,
        kind=p.kind,
        user_map=UserMap(accounts, default),
        slots=p.slots,
        gpus=p.gpus,
        gpu_memory_mb=p.gpu_memory,
        max_queued=p.max_queued,
        max_wait_s=p.max_wait,
        template=p.template,
        extra_directives=tuple(p.extra_directives),
        skip_directives=tuple(p.skip_directives),
        settings=settings,
    )


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


class _LineMap:
    """The parsed YAML plus the line of every key, so errors can point at file:line."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.lines: dict[tuple[str, ...], int] = {}
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            self.data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark else 1
            problem = getattr(exc, "problem", None) or str(exc)
            raise EstateError(
                [
                    f"{source}:{line}: not valid YAML: {problem}; fix: check the "
                    "indentation and quoting on that line"
                ]
            ) from None
        if node is not None:
            self._walk(node, ())

    def _walk(self, node: yaml.Node, path: tuple[str, ...]) -> None:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                self.lines[(*path, str(key.value))] = key.start_mark.line + 1
                self._walk(value, (*path, str(key.value)))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, (*path, str(i)))

    def line_of(self, path: tuple[str, ...]) -> int:
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, 1)

    def error(self, path: tuple[str, ...], message: str) -> str:
        field = ".".join(path) or "(top level)"
        return f"{self.source}:{self.line_of(path)}: {field}: {message}"
