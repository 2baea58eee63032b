"""Launching an app: its form checked and filled, its command built, the locks and the
running-app quotas honoured, then one task of kind `application` made through the same create
path, policies and ledger as any task (broker/tasks/create.py).

A command element that is exactly `{PARAM}` of a list parameter becomes the list's items; an
element that names a parameter left null is dropped (an option the user did not set); every
other placeholder is replaced by its value as text. Values travel in task.json as argv, never
through a shell. A parameter named `packages` adds to the app's requirements.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

from broker.apps.catalogue import PLACEHOLDER, RUNNER_FILLED, App
from broker.domain import Estate, StaticRoute, TaskSpec, TaskState
from broker.errors import KliqueError, NotFound, NotPermitted

APPLICATION = "application"
ROUTES_PREFIX = "/routes/"
# Tasks that hold a place in the running-app quotas: everything not yet final.
COUNTED = [s for s in TaskState if not s.final]
_quota_lock = threading.Lock()  # a launch counts and creates under it: no two pass one free slot


class AppRefused(NotPermitted):
    """A launch the rules refuse: a lock or a quota. Its message is one sentence with the fix."""


@dataclass(frozen=True)
class LaunchForm:
    """What a launch asks for; it exports and imports as JSON (`klique app export`)."""

    app: str
    resource: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    project: str = "default"
    route: str | None = None  # a static route to serve behind (endpoints)
    teams: tuple[str, ...] = ()  # endpoints without a static route: the teams that may call it
    walltime_s: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "resource": self.resource,
            "params": self.params,
            "name": self.name,
            "project": self.project,
            "route": self.route,
            "teams": list(self.teams),
            "walltime_s": self.walltime_s,
        }


def filled_params(app: App, given: dict[str, Any]) -> dict[str, Any]:
    """The form's defaults under the given values, checked against the form's JSON Schema."""
    params = {
        name: prop["default"]
        for name, prop in app.params.items()
        if isinstance(prop, dict) and "default" in prop
    }
    params.update(given)
    errors = sorted(
        Draft202012Validator(app.form).iter_errors(params), key=lambda e: [str(p) for p in e.path]
    )
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first.path) or "(the form)"
        raise KliqueError(
            f"app {app.name}: parameter {where}: {first.message}; fix: see the form with "
            f"`klique app show {app.name}`"
        )
    return params


def build_command(app: App, values: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for element in app.command:
        names = PLACEHOLDER.findall(element)
        whole = PLACEHOLDER.fullmatch(element)
        if whole and isinstance(values.get(whole[1]), list):
            argv += [_text(v) for v in values[whole[1]]]
            continue
        if any(n not in RUNNER_FILLED and values.get(n) is None for n in names):
            continue  # an option the user left unset
        argv.append(fill(element, values))
    return argv


def fill(text: str, values: dict[str, Any]) -> str:
    """Placeholders replaced by values; the runner's own ({port}, {secret}) are left for it."""

    def one(match: re.Match[str]) -> str:
        name = match[1]
        if name in RUNNER_FILLED or name not in values:
            return match[0]
        return _text(values[name])

    return PLACEHOLDER.sub(one, text)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def route_name(app: App) -> str:
    """A new route for one session or endpoint: the app's name and 8 random hex digits."""
    return f"{app.name[:48]}-{secrets.token_hex(4)}"


def app_spec(
    app: App, form: LaunchForm, estate: Estate, resource: str, route: str, static: bool
) -> TaskSpec:
    """The task an app launch makes: its command, env and route settings, in task.json."""
    params = filled_params(app, form.params)
    profile = estate.resources[resource].profile
    base_url = f"{ROUTES_PREFIX}{route}/"
    values = {
        **params,
        "gpus": max(profile.gpus, 1),
        "route": route,
        "base_url": base_url,
        "task_name": form.name or app.name,
    }
    walltime = min(form.walltime_s or profile.walltime_s, profile.walltime_s)
    extra = params.get("packages")
    packages = extra if isinstance(extra, list) else []
    return TaskSpec(
        command=tuple(build_command(app, values)),
        resource=resource,
        name=form.name or f"{app.name} ({app.kind})",
        project=form.project,
        requirements=(*app.requirements, *(str(p) for p in packages)),
        image=app.image,
        kind=APPLICATION,
        app={
            "name": app.name,
            "kind": app.kind,
            "params": params,
            "route": route,
            "static": static,
            "teams": list(form.teams),
            "path": app.path,
            "ready_path": fill(app.ready_path, values),
            "env": {k: fill(v, values) for k, v in app.env.items()},
            "upstream_headers": {k: fill(v, values) for k, v in app.upstream_headers.items()},
            "walltime_s": walltime,
        },
    )


def check_resource(app: App, resource: str) -> None:
    if app.resources and resource not in app.resources:
        raise NotPermitted(
            f"app {app.name} may use only the compute resources {', '.join(app.resources)}; "
            f"fix: launch it with -r {app.resources[0]}"
        )


def static_routes(made: Mapping[str, StaticRoute], estate: Estate) -> dict[str, StaticRoute]:
    """Every static route: those made through the API (`made`), and the estate's, which win a
    name both hold (the estate is the platform team's file, read at every start)."""
    return {**made, **estate.routes}


def check_route(
    app: App, route: StaticRoute | None, name: str, user: str, team: str | None, admin: bool
) -> None:
    """Only endpoints serve behind a static route, only apps it admits, launched by its teams."""
    if route is None:
        raise NotFound(
            f"no static route {name!r}; `klique app routes` lists them (the platform team makes "
            "them with `klique app route create`)"
        )
    if app.kind != "endpoint":
        raise NotPermitted(
            f"app {app.name} is a session: only endpoints serve behind a static route; fix: "
            "launch it without --route"
        )
    if route.apps and app.name not in route.apps:
        raise NotPermitted(
            f"static route {name} is served only by {', '.join(route.apps)}; fix: launch one "
            "of those, or ask the platform team to admit this app"
        )
    if not admin and (team is None or team not in route.teams):
        raise NotPermitted(
            f"static route {name} belongs to the teams {', '.join(route.teams) or '(none)'}, "
            f"not to {user}'s; fix: ask the platform team to add your team to it"
        )


def check_lock(app: App, locks: dict[str, Any]) -> None:
    lock = locks.get(app.name)
    if lock is not None:
        raise AppRefused(
            f"app {app.name} is locked by the platform team ({lock.reason}); launch another "
            f"app, or ask them to unlock it (`klique app unlock {app.name}`)"
        )


def check_quota(estate: Estate, team: str | None, running: list[str | None]) -> None:
    """`running`: the team of every app not yet ended. The company's quota, then the team's."""
    limit = estate.apps.max_running
    if limit is not None and len(running) >= limit:
        raise AppRefused(
            f"the company's quota of {limit} running apps is reached ({len(running)} running); "
            "stop one you no longer use (`klique app ls`, `klique app stop ID`), or ask the "
            "platform team to raise apps.max_running in the estate"
        )
    team_limit = estate.apps.max_running_per_team.get(team or "")
    ours = sum(1 for t in running if t == team)
    if team_limit is not None and ours >= team_limit:
        raise AppRefused(
            f"team {team}'s quota of {team_limit} running apps is reached ({ours} running); "
            "stop one of your team's apps (`klique app ls`, `klique app stop ID`), or ask the "
            "platform team to raise apps.max_running_per_team in the estate"
        )


def quota_lock() -> threading.Lock:
    return _quota_lock
