"""broker/authz.py's table: every scope x action x ownership case, and the report token's reach,
checked against rules written out here apart from the module; then that no adapter decides
ownership on its own (only authz compares a task's owner with a caller)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker import authz
from broker.authz import Action
from broker.domain import Task, TaskSpec, TaskState
from broker.errors import NotFound, NotPermitted

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Who:
    user: str
    admin: bool = False
    team: str | None = "vision"
    scopes: frozenset[str] = frozenset({"read", "submit"})
    task: int | None = None  # a report token speaks for this task


# The scope each action needs, written out again (not read from the module).
NEEDS = {
    Action.READ_TASK: "read",
    Action.LIST_TASKS: "read",
    Action.READ_ESTATE: "read",
    Action.OPEN_ROUTE: "read",
    Action.READ_ARTIFACT: "read",
    Action.SUBMIT: "submit",
    Action.CANCEL: "submit",
    Action.CLONE: "submit",
    Action.LAUNCH_APP: "submit",
    Action.WRITE_ARTIFACT: "submit",
    Action.TAG_TASK: "submit",
    Action.ARCHIVE_TASK: "submit",
    Action.DELETE_TASK: "submit",
    Action.ADMINISTER: "admin",
}
ON_A_TASK = {
    Action.READ_TASK,
    Action.CANCEL,
    Action.CLONE,
    Action.READ_ARTIFACT,
    Action.WRITE_ARTIFACT,
    Action.TAG_TASK,
    Action.ARCHIVE_TASK,
    Action.DELETE_TASK,
}
TEAM_READS = {Action.READ_TASK, Action.READ_ARTIFACT}  # what a teammate may do to a run
SCOPES = {
    "read": frozenset({"read"}),
    "submit": frozenset({"submit"}),
    "read+submit": frozenset({"read", "submit"}),
    "admin": frozenset({"admin", "read", "submit"}),
    "report": frozenset({"report"}),
    "agent": frozenset({"agent"}),
}
# Whose task it is, seen from alice (team vision): her own, bob's (vision too), carol's (team
# nlp), or (None) no task at all.
OWNERSHIP = {"own": "alice", "a teammate's": "bob", "another team's": "carol", "no task": None}
TEAMS = {"alice": "vision", "bob": "vision", "carol": "nlp"}


def task(owner: str, task_id: int = 7, parent: int | None = None) -> Task:
    return Task(task_id, TaskSpec(command=("true",), resource="cpu"), owner, TEAMS[owner],
                TaskState.QUEUED, parent=parent)  # fmt: skip


def expected(scopes: str, action: Action, owner: str | None) -> type[Exception] | None:
    admin = scopes == "admin"
    if action in ON_A_TASK and owner is not None and owner != "alice" and not admin:
        if TEAMS[owner] != "vision":
            return NotFound  # another team's task: as if it did not exist
        if action not in TEAM_READS:
            return NotPermitted  # the team reads a run; only its owner acts on it
    if NEEDS[action] not in SCOPES[scopes]:
        return NotPermitted
    return None


CASES = [
    pytest.param(s, a, o, id=f"{s}-{a.name.lower()}-{o.replace(' ', '_')}")
    for s in SCOPES
    for a in Action
    for o in OWNERSHIP
    if o == "no task" or a in ON_A_TASK
]


@pytest.mark.parametrize(("scopes", "action", "ownership"), CASES)
def test_the_table(scopes: str, action: Action, ownership: str) -> None:
    who = Who("alice", admin=scopes == "admin", scopes=SCOPES[scopes])
    owner = OWNERSHIP[ownership]
    target = task(owner) if owner is not None else None
    outcome = expected(scopes, action, owner)
    if outcome is None:
        authz.check(who, action, target)
    else:
        with pytest.raises(outcome):
            authz.check(who, action, target)


def test_every_action_is_in_the_table() -> None:
    assert set(NEEDS) == set(Action) and authz.SCOPE_OF == NEEDS


def test_a_refusal_for_scope_names_the_scope_to_ask_for() -> None:
    with pytest.raises(NotPermitted, match=r"needs the 'read' scope.*--scope read"):
        authz.check(Who("alice", scopes=frozenset({"submit"})), Action.READ_TASK, task("alice"))


def test_another_users_task_is_not_found_whatever_the_scopes() -> None:
    for scopes in SCOPES.values():
        with pytest.raises(NotFound, match="no task 7 of yours"):
            authz.check(Who("bob", team="nlp", scopes=scopes), Action.READ_TASK, task("alice"))


def test_a_report_token_is_no_member_of_its_owners_team() -> None:
    job = Who("bob", task=8)  # bob's job, speaking with its report token (team vision)
    with pytest.raises(NotFound):
        authz.check(job, Action.READ_TASK, task("alice"))
    assert authz.reads_as_teammate(Who("bob"), task("alice"))
    assert not authz.reads_as_teammate(job, task("alice"))
    assert not authz.reads_as_teammate(Who("bob", team=None), task("alice"))


@pytest.mark.parametrize(
    ("speaks_for", "target", "acts", "controls"),
    [
        (7, task("alice", 7), True, True),  # its own task
        (7, task("alice", 8, parent=7), False, True),  # a step it made
        (7, task("alice", 9), False, False),  # another task of the same owner
        (7, task("bob", 9), False, False),  # another owner's
    ],
    ids=["own-task", "its-step", "owners-other-task", "another-owner"],
)
def test_a_report_token_speaks_for_its_task_only(speaks_for, target, acts, controls) -> None:
    report = Who("alice", scopes=frozenset({"read", "submit"}), task=speaks_for)
    assert authz.acts_on(report, target) is acts
    assert authz.controls(report, target) is controls
    if not acts:
        with pytest.raises(NotFound):
            authz.check(report, Action.READ_TASK, target)


def test_listings_show_a_user_their_own_and_an_admin_what_they_ask() -> None:
    assert authz.owner_filter(Who("alice"), None) == "alice"
    assert authz.owner_filter(Who("alice"), "bob") == "alice"
    assert authz.owner_filter(Who("root", admin=True), "bob") == "bob"
    assert authz.owner_filter(Who("root", admin=True), None) is None


@dataclass(frozen=True)
class Route:
    kind: str
    owners: frozenset[str]
    teams: frozenset[str]
    static: bool


def session(*teams: str) -> Route:
    return Route("session", frozenset({"alice"}), frozenset(teams), False)


def endpoint(*teams: str, static: bool = False) -> Route:
    return Route("endpoint", frozenset({"alice"}), frozenset(teams), static)


@pytest.mark.parametrize(
    ("who", "team", "route", "opens"),
    [
        (Who("alice"), "vision", session(), True),
        (Who("bob"), "vision", session("vision"), False),
        (Who("root", admin=True), None, session(), True),
        (Who("alice"), None, endpoint(), True),
        (Who("alice"), None, endpoint("nlp", static=True), False),
        (Who("bob"), "nlp", endpoint("nlp", static=True), True),
        (Who("bob"), None, endpoint("nlp"), False),
    ],
    ids=[
        "session-owner",
        "session-teammate",
        "session-admin",
        "endpoint-owner",
        "static-owner-not-of-its-teams",
        "static-team",
        "no-team",
    ],
)
def test_who_opens_a_route(who: Who, team: str | None, route: Route, opens: bool) -> None:
    assert authz.may_open_route(who, team, route) is opens


# A module that decides ownership itself compares a task's (or a row's) owner with the caller's
# user: `x.owner == who.user`, `t.owner != a.user`, `who.user in route.owners`...
OWNER = r"(?:\.owners?\b|\[\"owners?\"\])"
OWN_DECISION = re.compile(
    rf"{OWNER}\s*(?:==|!=)\s*\w+\.user\b|\w+\.user\s*(?:==|!=)\s*\w+{OWNER}"
    rf"|\w+\.user\s+(?:not\s+)?in\s+\w+{OWNER}"
)
ADAPTERS = ("broker/api", "broker/web", "broker/mcp", "broker/tasks")  # and the task service


def test_no_adapter_decides_ownership_itself() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ADAPTERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OWN_DECISION.search(line)
    ]
    assert found == [], "ask broker/authz.py instead:\n" + "\n".join(found)


def test_the_lint_finds_what_it_looks_for() -> None:
    for line in ("if task.owner != who.user", "t.owner == a.user or a.admin",
                 "return caller.user in route.owners", "who.user == r.owner",
                 'sweep["owner"] != who.user'):  # fmt: skip
        assert OWN_DECISION.search(line), line
    assert not OWN_DECISION.search("owner=task.owner,")


def test_authz_imports_no_web_framework() -> None:
    source = (ROOT / "broker" / "authz.py").read_text()
    imports = re.findall(r"^(?:from|import) ([\w.]+)", source, re.M)
    assert all(not m.startswith(("fastapi", "starlette", "httpx", "mcp")) for m in imports)
    allowed = {"__future__", "collections.abc", "enum", "typing", "hmac", "dataclasses"}
    assert {m for m in imports if not m.startswith("broker.")} <= allowed, imports
    assert {m for m in imports if m.startswith("broker.")} <= {"broker.domain", "broker.errors"}


def test_the_create_path_makes_no_app_task_that_skipped_the_apps_rules() -> None:
    from broker.tasks.create import new_task

    spec = TaskSpec(command=("true",), resource="cpu", kind="application", app={"name": "echo"})
    with pytest.raises(NotPermitted, match="klique app launch echo"):
        new_task(None, Who("alice"), spec)  # type: ignore[arg-type]
