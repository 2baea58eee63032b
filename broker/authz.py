"""May this caller do this to that: Klique's one authorization layer. Every entry point (the REST
API, the web UI, MCP tools, routes, the SDK's endpoints) asks here, and decides nothing itself.

The model, in the order the rules are applied:

1. A caller is who speaks (`broker.identity.resolve.Caller`, or the SDK's `Actor`): a user, their
   team, whether they are an admin, and the scopes of the credential they used. A browser session
   carries the scopes of the token it was signed in with; an MCP tool call those of its bearer.
2. An action is a verb in the domain's words (`Action`); each needs one scope (`SCOPE_OF`):
   `read` to look (a task, its logs, a list, an artifact), `submit` to act (submit, cancel,
   clone, launch an app, write an artifact), `admin` to administer the estate. `report` and
   `agent` belong to a task's report token and a pool agent's token, which speak only for their
   own task or pool. A caller without the scope: NotPermitted, naming the scope to ask for.
3. A task is seen and acted on by its owner and admins. The members of its team (the team its
   owner was in when it was made) read it: its record, console, scalars, reports and artifacts
   (`reads_as_teammate`), and nothing more: a cancel, a clone, a tag, an archive or a delete is
   NotPermitted to them. Anyone else gets NotFound, the same answer as for a task that does not
   exist (a task's id says nothing about whose it is). A task's report token speaks for that task
   only, and for the steps it creates (`controls`); it is no member of any team.
4. A route opens to admins, a session's to its owner, an endpoint's to its owner (unless it
   serves behind a static route) and the teams it names (`may_open_route`).
5. What an app launch may ask of its app (its lock, its compute resources, a static route's
   teams, the running-app quotas) is the app rules' business (broker/apps/launch.py), applied
   by the one function that makes every app task (broker/tasks/apps.py,
   `AppService.launch_task`): a launch, a form launched again, a clone. The create path
   refuses an app task from anywhere else.

`check(caller, action, target)` raises Klique's own errors (broker/errors.py); the adapters turn
them into 403/404, a page or a tool's refusal. The small named predicates (`has_scope`,
`sees_task`, `acts_on`, `controls`, ...) answer yes or no for callers that filter rather than
refuse. This module imports domain types only (no web framework), so every adapter can use it.
Each decision is a plain function here, with a docstring that says the rule.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Collection
from enum import Enum
from typing import Any, Protocol

from broker.domain import Task
from broker.errors import NotFound, NotPermitted

__all__ = [
    "SCOPE_OF",
    "Action",
    "RouteFacts",
    "Who",
    "acts_on",
    "agent_serves",
    "check",
    "check_agent_pool",
    "check_admin",
    "check_scope",
    "controls",
    "may_open_route",
    "find_task",
    "find_owned",
    "has_scope",
    "may_reuse",
    "may_stage_model",
    "needed_scope",
    "report_refusal",
    "report_token_reads",
    "report_token_reads_model",
    "reads_dataset",
    "reads_task",
    "writes_dataset",
    "no_such_task",
    "owner_filter",
    "reads_as_teammate",
    "scope_problem",
    "scopes_problem",
    "sees_model",
    "sees_owner",
    "sees_task",
    "speaks_for_task",
]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Who(Protocol):
    """What authorization needs of a caller (a Caller, an Actor, the web UI's Viewer)."""

    @property
    def user(self) -> str: ...
    @property
    def admin(self) -> bool: ...
    @property
    def team(self) -> str | None: ...
    @property
    def scopes(self) -> frozenset[str]: ...


class Action(Enum):
    """What a caller asks to do, in the domain's words."""

    READ_TASK = "read a task"  # its page, its state, its logs, its events
    LIST_TASKS = "list tasks"
    READ_ESTATE = "read the estate"  # compute resources, pools, apps, usage, policies
    SUBMIT = "submit a task"
    CANCEL = "cancel a task"
    CLONE = "clone a task"
    LAUNCH_APP = "launch an app"
    OPEN_ROUTE = "open a route"
    READ_ARTIFACT = "read an artifact"
    WRITE_ARTIFACT = "write an artifact"
    TAG_TASK = "tag a task"
    ARCHIVE_TASK = "archive a task"
    DELETE_TASK = "delete a task"
    ADMINISTER = "administer the estate"


# The scope each action needs. Reads need `read`; anything that changes something `submit`.
SCOPE_OF: dict[Action, str] = {
    Action.READ_TASK: "read",
    Action.LIST_TASKS: "read",
    Action.READ_ESTATE: "read",
    Action.SUBMIT: "submit",
    Action.CANCEL: "submit",
    Action.CLONE: "submit",
    Action.LAUNCH_APP: "submit",
    Action.OPEN_ROUTE: "read",
    Action.READ_ARTIFACT: "read",
    Action.WRITE_ARTIFACT: "submit",
    Action.TAG_TASK: "submit",
    Action.ARCHIVE_TASK: "submit",
    Action.DELETE_TASK: "submit",
    Action.ADMINISTER: "admin",
}

# Actions on one task: the caller must see the task first (rule 3).
_ON_A_TASK = frozenset(
    {
        Action.READ_TASK,
        Action.CANCEL,
        Action.CLONE,
        Action.READ_ARTIFACT,
        Action.WRITE_ARTIFACT,
        Action.TAG_TASK,
        Action.ARCHIVE_TASK,
        Action.DELETE_TASK,
    }
)
# What a member of a task's team may do to it: look (rule 3).
_TEAM_READS = frozenset({Action.READ_TASK, Action.READ_ARTIFACT})


def needed_scope(method: str) -> str:
    """The scope an HTTP request needs by its method alone: `read` to look, `submit` to act."""
    return "read" if method in SAFE_METHODS else "submit"


def has_scope(who: Who, scope: str) -> bool:
    return scope in who.scopes


def scope_problem(who: Who, needed: str) -> str | None:
    """Why this caller may not make a request that needs `needed`, if so (None: it may)."""
    return scopes_problem(who.scopes, needed)


def scopes_problem(scopes: Collection[str], needed: str) -> str | None:
    """scope_problem for a credential known by its scopes alone (an MCP tool call's token)."""
    if needed in scopes:
        return None
    may = " and ".join(sorted(scopes)) or "nothing"
    return (
        f"this token may only {may}; this request needs the {needed!r} scope "
        f"(ask for a token with --scope {needed})"
    )


def check_scope(who: Who, needed: str) -> None:
    """NotPermitted, naming the scope to ask for, unless the caller's credential has it."""
    problem = scope_problem(who, needed)
    if problem:
        raise NotPermitted(problem)


def speaks_for_task(who: Who) -> int | None:
    """The task whose report token speaks (the SDK's `Actor.task`); None for a user's credential.
    Read by name so that any caller type can be asked, without importing the API's `Actor`."""
    task: int | None = getattr(who, "task", None)
    return task


def sees_owner(who: Who, owner: str) -> bool:
    """Whether the caller sees what `owner` owns (tasks, ledger rows): their own; an admin all."""
    return who.admin or owner == who.user


def find_owned(
    who: Who, fetch: Callable[[], dict[str, Any] | None], refusal: str
) -> dict[str, Any]:
    """What `fetch` finds (a sweep, a tuning) when the caller sees its owner; else
    NotFound(refusal), the same for another's as for none: a different answer would tell
    that it exists."""
    try:
        found = fetch()
    except NotFound:
        found = None
    if found is None or not sees_owner(who, found["owner"]):
        raise NotFound(refusal)
    return found


def sees_task(who: Who, task: Task) -> bool:
    """The task's owner or an admin, speaking with a user's credential."""
    return sees_owner(who, task.owner)


def acts_on(who: Who, task: Task) -> bool:
    """The task's owner (or an admin) with a user token, or the task's own report token."""
    speaking = speaks_for_task(who)
    if speaking is not None:
        return speaking == task.id
    return sees_task(who, task)


def reads_as_teammate(who: Who, task: Task) -> bool:
    """A member of the task's team, with a user's credential: reads the task (rule 3)."""
    if speaks_for_task(who) is not None:
        return False
    return task.team is not None and who.team == task.team


def reads_task(who: Who, task: Task) -> bool:
    """acts_on, or a member of the task's team (who reads, and does nothing else)."""
    return acts_on(who, task) or reads_as_teammate(who, task)


def controls(who: Who, task: Task) -> bool:
    """acts_on, or a pipeline's report token over the steps it created."""
    speaking = speaks_for_task(who)
    return acts_on(who, task) or (speaking is not None and task.parent == speaking)


def reads_input(inputs: Collection[tuple[int, str]], task: Task, name: str | None) -> bool:
    """Whether a step made to read `inputs` (its (task, artifact) pairs) may read this task's
    artifact `name` (None: list the task's artifacts, one of which it reads)."""
    if name is None:
        return any(source == task.id for source, _ in inputs)
    return (task.id, name) in inputs


def no_such_task(task_id: int) -> NotFound:
    """The one answer for a task that does not exist and a task that is not the caller's."""
    return NotFound(f"no task {task_id} of yours; `klique ls` lists your tasks")


def check(who: Who, action: Action, target: Task | None = None) -> None:
    """May `who` do `action` to `target` (a task, or None for what is not about one task)?
    NotFound for a task the caller may not even see; NotPermitted for the rest."""
    if action in _ON_A_TASK and target is not None and not acts_on(who, target):
        if not reads_as_teammate(who, target):
            raise no_such_task(target.id)
        if action not in _TEAM_READS:
            raise NotPermitted(
                f"task {target.id} is {target.owner}'s: its team reads it, but only its owner "
                f"and admins may {action.value.replace(' a task', ' it')}"
            )
    check_scope(who, SCOPE_OF[action])
    if action is Action.ADMINISTER and not who.admin:
        raise NotPermitted("only an admin may administer the estate")


class RouteFacts(Protocol):
    """What opening a route needs to know of it (`broker.route_proxy.access.RouteInfo`)."""

    @property
    def kind(self) -> str: ...  # session | endpoint
    @property
    def owners(self) -> frozenset[str]: ...  # the users whose apps serve it
    @property
    def teams(self) -> frozenset[str]: ...
    @property
    def static(self) -> bool: ...


def may_open_route(who: Who, team: str | None, route: RouteFacts) -> bool:
    """Whether the caller (of `team`) may open a route: a session's to its owner and admins; an
    endpoint's to admins, its owner (not behind a static route, which belongs to its teams) and
    the teams it names. The scope a request through it needs is `needed_scope`'s."""
    if who.admin:
        return True
    if route.kind == "session":
        return who.user in route.owners
    if not route.static and who.user in route.owners:
        return True
    return team is not None and team in route.teams


def find_task(get: Callable[[int], Task], who: Who, action: Action, task_id: int) -> Task:
    """The task `get` reads, if `who` may do `action` to it: the one way every entry point
    finds a task for a caller. NotFound alike for a task that does not exist and one the
    caller may not see; NotPermitted when they see it but their credential lacks the scope."""
    try:
        task = get(task_id)
    except NotFound:
        raise no_such_task(task_id) from None
    check(who, action, task)
    return task


def owner_filter(who: Who, asked: str | None = None) -> str | None:
    """Whose tasks a listing shows: an admin's, those of `asked` (None: everyone's); anyone
    else's, their own whatever they asked."""
    return asked if who.admin else who.user


def check_admin(who: Who, what: str) -> None:
    """NotPermitted, with who to ask, unless an admin speaks (`what`: "lock an app", ...)."""
    if not who.admin:
        raise NotPermitted(f"only an admin token can {what}; ask the platform team")


# A task's report token (SECURITY.md, "Report tokens are minted by the control plane..."): the
# credential the control plane hands a job for one attempt. It speaks for its own task, the steps
# that task creates, and the artifacts the task was made to read; it is never its owner.


def report_token_reads(own: Task, task: Task, name: str | None) -> bool:
    """Whether the report token of `own` may read `task`'s artifact `name` (None: the listing):
    its own task's, its steps' (a pipeline's controller reads what they made), and those it was
    created to read (its inputs, named by the pipeline that made it). No other task's."""
    return task.id == own.id or task.parent == own.id or reads_input(own.inputs, task, name)


def may_reuse(who: Who, earlier: Task, own: Task | None) -> bool:
    """Whether a new record may take `earlier`'s outputs without running (a cached step).
    A user's credential: the user's own completed tasks (an admin's: anyone's). The report token
    of `own`: only a task of the same pipeline run (a step `own` made) or one whose artifacts
    `own` was created to read; a reuse would otherwise copy any of its owner's outputs into
    reach of the job."""
    if own is None:
        return sees_task(who, earlier)
    return earlier.parent == own.id or any(source == earlier.id for source, _ in own.inputs)


def report_refusal(task: Task) -> str | None:
    """Why a runner's report to this task is refused although its token is the current one:
    the task has ended. None: it is recorded. (A superseded attempt's token is no longer the
    task's at all: it is refused as an unknown one.)"""
    if not task.state.final:
        return None
    return (
        f"task {task.id} has ended ({task.state.value}); reports of its runner are no longer "
        "recorded"
    )


def agent_serves(token_pools: Collection[str], pool: str) -> bool:
    """Whether an agent token naming `token_pools` may act on pool `pool`: only a pool it names
    (compared in constant time, as anything read off a token)."""
    return any(hmac.compare_digest(pool, named) for named in token_pools)


def check_agent_pool(token_pools: Collection[str], pool: str, remote: Collection[str]) -> None:
    """NotPermitted unless an agent token naming `token_pools` may act on `pool`: a pool it
    names, served by an agent (`agent: remote`). A pool served inside the server has no agent,
    and a token made for it earlier (before the estate changed) must not start speaking for it."""
    if not agent_serves(token_pools, pool):
        raise NotPermitted(f"this agent token does not serve pool {pool!r}")
    if pool not in remote:
        raise NotPermitted(
            f"pool {pool!r} is served inside the server; declare `agent: remote` in the "
            "estate to serve it with `klique agent`"
        )


# Models (broker/tasks/models.py): a model name is kept by the owner and team of the run that
# registered its first version. Its team (or, for a model without a team, its owner) and admins
# read it and change its stages; no one else sees it (the NotFound of a model that does not
# exist). A report token is no member of any team: it reads only the versions its own task
# registered and those its app's launch resolved (`registry:NAME@REF`), so a job cannot fetch
# any other model of its team's.


def sees_model(who: Who, owner: str, team: str | None) -> bool:
    """A user's credential: an admin, the model's owner, or a member of its team."""
    if speaks_for_task(who) is not None:
        return False
    return who.admin or who.user == owner or (team is not None and who.team == team)


def may_stage_model(who: Who, owner: str, team: str | None) -> bool:
    """Who may change a model's stages: those who see it (its team, its owner, admins) with a
    user's credential; the `submit` scope is checked apart (`check_scope`)."""
    return sees_model(who, owner, team)


def report_token_reads_model(own: Task, name: str, version: int, made_by: int) -> bool:
    """Whether the report token of `own` may read version `version` of model `name` (made by
    task `made_by`): a version its own task registered, or one its app's launch resolved
    (recorded on the task's app as `models`). No other version of any model."""
    if made_by == own.id:
        return True
    staged = (own.spec.app or {}).get("models") or ()
    return any(m.get("name") == name and m.get("version") == version for m in staged)


# Datasets (broker/tasks/datasets.py): a dataset's name is kept by the owner and team of whoever
# made its first version. Its team (or, for a dataset without a team, its owner) and admins read
# it and add versions; no one else sees it (the NotFound of a dataset that does not exist). A
# run's report token speaks as the run's owner but never as an admin: it reads and writes only
# the datasets that owner keeps (the version it writes records the run).


def reads_dataset(who: Who, owner: str, team: str | None) -> bool:
    """An admin (a user's credential), the dataset's owner, or a member of its team."""
    admin = who.admin and speaks_for_task(who) is None
    return admin or who.user == owner or (team is not None and who.team == team)


def writes_dataset(who: Who, owner: str, team: str | None) -> bool:
    """Who may add a version: those who read it (the `submit` scope is checked apart)."""
    return reads_dataset(who, owner, team)
