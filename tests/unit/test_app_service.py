"""The app operations used directly, as the REST API and the web UI both use them (no HTTP):
launch, running apps, stop, relaunch, locks and static routes, on a SQLite store under a real
control loop (no pool drivers: an app task waits in the queue), with a stand-in route hub."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.apps.launch import AppRefused
from broker.control.loop import ControlLoop
from broker.errors import Conflict, NotFound, NotPermitted
from broker.estate import parse_estate
from broker.identity.resolve import Caller
from broker.store.repository import Store
from broker.tasks.app_schemas import LaunchRequest
from broker.tasks.apps import AppService

ESTATE = """
teams: {vision: [alice], nlp: [bob]}
resources:
  cpu: {profile: {cpus: 1, pools: [local]}}
pools:
  local: {kind: host, slots: 4}
apps: {max_running: 3, max_running_per_team: {vision: 2}}
routes:
  llama: {teams: [vision], apps: [vllm]}
"""
ALICE = Caller("alice", False, team="vision")
BOB = Caller("bob", False, team="nlp")
ADMIN = Caller("root", True)


class Hub:
    """The route proxy, as far as the app operations ask of it: what they told it."""

    def __init__(self) -> None:
        self.forgotten = 0
        self.drained: list[int] = []

    def is_ready(self, task_id: int) -> bool:
        return False

    def instances_of(self, route: str) -> list[int]:
        return []

    def ready_of(self, route: str) -> list[int]:
        return []

    def forget_routes(self) -> None:
        self.forgotten += 1

    async def drain(self, task_id: int) -> None:
        self.drained.append(task_id)


@pytest.fixture
def hub() -> Hub:
    return Hub()


@pytest.fixture
def apps(tmp_path: Path, hub: Hub) -> Iterator[AppService]:
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    yield AppService(ControlLoop(store, parse_estate(ESTATE), {}, tmp_path), hub)
    store.close()


def launch(apps: AppService, who: Caller, app: str = "jupyter", **body: object) -> int:
    return apps.launch(who, app, LaunchRequest.model_validate({"resource": "cpu", **body})).id


def test_a_launch_queues_an_app_task_of_the_callers_own_and_the_hub_reads_routes_again(
    apps: AppService, hub: Hub
) -> None:
    task_id = launch(apps, ALICE, name="mine")
    shown = apps.instance(ALICE, task_id)
    assert (shown.app, shown.owner, shown.state, shown.resource) == (
        "jupyter",
        "alice",
        "queued",
        "cpu",
    )
    assert shown.form["name"] == "mine" and hub.forgotten == 1
    assert [i.id for i in apps.instances(ALICE)] == [task_id]
    assert apps.instances(BOB) == []
    with pytest.raises(NotFound):
        apps.instance(BOB, task_id)  # another's app is as absent as none


def test_a_locked_app_is_refused_with_the_reason_until_an_admin_unlocks_it(
    apps: AppService,
) -> None:
    with pytest.raises(NotPermitted):
        apps.lock(ALICE, "jupyter", "maintenance")
    assert apps.lock(ADMIN, "jupyter", "maintenance").locked
    assert apps.app(ALICE, "jupyter").lock_reason == "maintenance"
    with pytest.raises(AppRefused, match="maintenance"):
        launch(apps, ALICE)
    apps.unlock(ADMIN, "jupyter")
    assert launch(apps, ALICE) > 0
    with pytest.raises(NotFound, match="klique app list"):
        apps.lock(ADMIN, "nothing", "no such app")


def test_a_stop_drains_the_route_before_it_cancels_and_only_the_owner_stops(
    apps: AppService, hub: Hub
) -> None:
    task_id = launch(apps, ALICE)
    with pytest.raises(NotFound):
        asyncio.run(apps.stop(BOB, task_id))
    assert hub.drained == []
    stopped = asyncio.run(apps.stop(ALICE, task_id))
    assert stopped.state == "cancelled" and hub.drained == [task_id]
    assert apps.instances(ALICE) == []  # ended: listed only when asked for ended ones
    assert [i.id for i in apps.instances(ALICE, ended=True)] == [task_id]


def test_a_relaunch_passes_every_rule_of_a_launch(apps: AppService) -> None:
    first = apps.control.store.get(launch(apps, ALICE))
    again = apps.relaunch(ALICE, first, None, "again")
    assert (again.spec.name, again.spec.app["name"]) == ("again", "jupyter")  # type: ignore[index]
    with pytest.raises(AppRefused, match="vision"):  # the team's quota of two is full
        apps.relaunch(ALICE, first, None, None)


def test_static_routes_are_the_admins_and_the_estates_stay(apps: AppService, hub: Hub) -> None:
    with pytest.raises(NotPermitted):
        apps.add_route(ALICE, "web", ["vision"], [])
    made = apps.add_route(ADMIN, "web", ["vision"], ["http"])
    assert (made.created_by, made.path) == ("root", "/routes/web/")
    assert {r.name for r in apps.routes(ALICE)} == {"llama", "web"}
    with pytest.raises(Conflict, match="exists already"):
        apps.add_route(ADMIN, "web", [], [])
    with pytest.raises(Conflict, match="exists already"):
        apps.add_route(ADMIN, "llama", [], [])
    with pytest.raises(NotPermitted, match="estate"):
        apps.remove_route(ADMIN, "llama")
    apps.remove_route(ADMIN, "web")
    with pytest.raises(NotFound):
        apps.remove_route(ADMIN, "web")
    assert hub.forgotten == 2  # made, then removed
