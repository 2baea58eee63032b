"""The store's one way to map rows: each table's row as the value the store hands out, and a
value's fields as the columns that hold them (lists and mappings as JSON). No queries here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from broker.domain import (
    Origin,
    StaticRoute,
    Task,
    TaskSpec,
    TaskState,
    spec_from_dict,
    spec_to_dict,
)
from broker.store.tables import (
    AgentTokenRow,
    AppLockRow,
    ArtifactRow,
    RouteRow,
    ScalarRow,
    SessionRow,
    TaskEventRow,
    TaskRow,
    TokenRow,
)

ARTIFACT_FIELDS = ("name", "kind", "filename", "digest", "size", "created_at")

# Task columns that hold JSON: sorted lists, and any other value.
_JSON_LISTS = {"skip_pools", "gpu_ids", "tags"}
_JSON_VALUES = {"parameters", "packages", "inputs"}


@dataclass(frozen=True)
class TokenInfo:
    """What is kept of one of Klique's tokens (never the token itself)."""

    id: str
    user: str
    admin: bool
    kind: str  # user, service, admin
    scopes: frozenset[str]  # read, submit, admin
    team: str | None
    groups: tuple[str, ...]
    expires_at: float | None
    revoked: bool
    last_used_at: float | None
    created_at: float

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


@dataclass(frozen=True)
class SessionInfo:
    """A browser session, as kept: its cookie's digest, never the cookie."""

    digest: str
    user: str
    groups: tuple[str, ...]
    csrf_digest: str
    refresh_token: str
    fresh_until: float
    expires_at: float
    token_id: str | None = None  # a session signed in with a Klique token stands for it


@dataclass(frozen=True)
class AgentTokenInfo:
    """What is kept of an agent token (never the token itself)."""

    id: str
    pools: tuple[str, ...]
    expires_at: float
    revoked: bool
    last_used_at: float | None
    created_at: float

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


@dataclass(frozen=True)
class AppLock:
    """An admin's lock on a catalogue app: nobody launches it until it is lifted."""

    app: str
    reason: str
    locked_by: str
    locked_at: float


# Tasks


def task_of(row: TaskRow, with_diff: bool = True) -> Task:
    """The task a row holds; listings pass with_diff=False (the diff is loaded apart)."""
    data = json.loads(row.spec)
    if with_diff and data.get("code") is not None:
        data["code"]["diff"] = row.diff
    return Task(
        id=row.id,
        spec=spec_from_dict(data),
        owner=row.owner,
        team=row.team,
        state=TaskState(row.state),
        reason=row.reason,
        pool=row.pool,
        native_id=row.native_id,
        job_dir=row.job_dir,
        exit_code=row.exit_code,
        borrowed=row.borrowed,
        gpus=row.gpus,
        skip_pools=frozenset(json.loads(row.skip_pools or "[]")),
        attempts=row.attempts,
        gpu_ids=tuple(json.loads(row.gpu_ids or "[]")),
        preempted=row.preempted,
        diff_bytes=row.diff_bytes,
        claim=json.loads(row.claim) if row.claim else None,
        origin=Origin(row.origin or "pool"),
        parent=row.parent_id,
        parameters=json.loads(row.parameters or "{}"),
        packages=tuple(json.loads(row.packages or "[]")),
        inputs=tuple((int(i[0]), str(i[1])) for i in json.loads(row.inputs or "[]")),
        cache_key=row.cache_key,
        tags=tuple(json.loads(row.tags or "[]")),
        archived_at=row.archived_at,
        intent=row.intent,
        sweep=row.sweep_id,
        created_at=row.created_at,
        queued_at=row.queued_at,
        submitted_at=row.submitted_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def spec_json(spec: TaskSpec) -> tuple[str, str]:
    """The spec as stored (JSON without the diff), and the diff."""
    data = spec_to_dict(spec)
    diff = data["code"].pop("diff", "") if data.get("code") else ""
    return json.dumps(data), diff


def tag_like(tag: str) -> str:
    """The LIKE pattern (escape character a backslash) of a tags column (a JSON list) that
    holds `tag`: the tag quoted as JSON, so that `gpu` does not match `gpu-large`."""
    quoted = json.dumps(tag).replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{quoted}%"


def field_values(fields: dict[str, Any]) -> dict[str, Any]:
    """Fields as their columns hold them (lists and values as JSON)."""
    stored = {}
    for name, value in fields.items():
        if name in _JSON_LISTS:
            value = json.dumps(sorted(value))
        elif name in _JSON_VALUES or name == "claim" and value is not None:
            value = json.dumps(value)
        stored[name] = value
    return stored


def set_fields(row: TaskRow, fields: dict[str, Any]) -> None:
    for name, value in field_values(fields).items():
        setattr(row, name, value)


def task_values(
    spec: TaskSpec,
    owner: str,
    team: str | None,
    gpus: float,
    state: TaskState,
    reason: str,
    record: dict[str, Any],
    now: float,
) -> dict[str, Any]:
    """A new task's columns."""
    stored, diff = spec_json(spec)
    return {
        "name": spec.name,
        "owner": owner,
        "team": team,
        "project": spec.project,
        "resource": spec.resource,
        "state": state.value,
        "reason": reason,
        "spec": stored,
        "diff": diff,
        "diff_bytes": len(diff.encode()),
        "gpus": gpus,
        "report_digest": "",
        "created_at": now,
        "updated_at": now,
        "queued_at": now if state is TaskState.QUEUED else None,
        "started_at": now if state is TaskState.RUNNING else None,
        "finished_at": now if state.final else None,
        **field_values(record),
    }


def queued_task(
    task_id: int,
    spec: TaskSpec,
    owner: str,
    team: str | None,
    gpus: float,
    record: dict[str, Any],
    values: dict[str, Any],
    sweep: int | None,
) -> Task:
    """The task just inserted from `values` (its row's columns), without reading it back."""
    return Task(
        id=task_id,
        spec=spec,
        owner=owner,
        team=team,
        state=TaskState.QUEUED,
        gpus=gpus,
        diff_bytes=values["diff_bytes"],
        parameters=record.get("parameters") or {},
        parent=record.get("parent_id"),
        sweep=sweep,
        created_at=values["created_at"],
        queued_at=values["created_at"],
    )


_NONE_SKIPPED: frozenset[str] = frozenset()


def skipped(stored: str | None) -> frozenset[str]:
    """skip_pools as stored: almost always none, which needs no parsing."""
    return _NONE_SKIPPED if stored in (None, "", "[]") else frozenset(json.loads(stored))


def event_of(row: TaskEventRow) -> dict[str, Any]:
    return {"time": row.time, "from": row.old_state, "to": row.new_state, "reason": row.reason}


def scalar_of(row: ScalarRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "series": row.series,
        "value": row.value,
        "step": row.step,
        "time": row.time,
    }


def artifact_of(row: ArtifactRow) -> dict[str, Any]:
    return {key: getattr(row, key) for key in ARTIFACT_FIELDS}


# Tokens and sessions


def token_of(row: TokenRow) -> TokenInfo:
    return TokenInfo(
        id=row.id,
        user=row.user,
        admin=row.admin,
        kind=row.kind,
        scopes=frozenset(s for s in row.scopes.split(",") if s),
        team=row.team,
        groups=tuple(json.loads(row.groups or "[]")),
        expires_at=row.expires_at,
        revoked=row.revoked,
        last_used_at=row.last_used_at,
        created_at=row.created_at,
    )


def session_of(row: SessionRow) -> SessionInfo:
    return SessionInfo(
        digest=row.digest,
        user=row.user,
        groups=tuple(json.loads(row.groups or "[]")),
        csrf_digest=row.csrf_digest,
        refresh_token=row.refresh_token,
        fresh_until=row.fresh_until,
        expires_at=row.expires_at,
        token_id=row.token_id,
    )


def agent_token_of(row: AgentTokenRow) -> AgentTokenInfo:
    return AgentTokenInfo(
        id=row.id,
        pools=tuple(json.loads(row.pools)),
        expires_at=row.expires_at,
        revoked=row.revoked,
        last_used_at=row.last_used_at,
        created_at=row.created_at,
    )


# Apps


def app_lock_of(row: AppLockRow) -> AppLock:
    return AppLock(row.app, row.reason, row.locked_by, row.locked_at)


def route_of(row: RouteRow) -> StaticRoute:
    return StaticRoute(
        row.name, tuple(json.loads(row.teams)), tuple(json.loads(row.apps)), row.created_by
    )
