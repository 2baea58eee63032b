"""The store on SQLite and on a real PostgreSQL server (started by scripts/pg-up)."""

import asyncio
import threading
import time
import uuid

import pytest
import sqlalchemy

from broker.domain import TaskSpec, TaskState
from broker.errors import IllegalTransition, NotFound
from broker.store import repository
from broker.store.engine import normalise_url
from broker.store.repository import Move, Store

S = TaskState


def _fresh_schema(url: str) -> str:
    """A new schema per test so runs never see each other's rows."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    engine = sqlalchemy.create_engine(normalise_url(url))
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    engine.dispose()
    return f"{url}?options=-csearch_path%3D{schema}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'k.db'}"
    else:
        url = _fresh_schema(request.getfixturevalue("postgres_url"))
    s = Store.open(url)
    yield s
    s.close()


def spec(**kw):
    return TaskSpec(command=("echo", "hi"), resource="cpu", **kw)


def test_a_task_goes_through_its_life_and_every_change_is_an_event(store):
    task = store.create_task(spec(name="n"), "alice", "vision", gpus=2)
    assert task.state is S.QUEUED and task.queued_at
    store.change_state(task.id, S.PLACED, pool="local")
    store.change_state(task.id, S.SUBMITTED, native_id="123", job_dir="/tmp/x")
    store.change_state(task.id, S.RUNNING)
    done = store.change_state(task.id, S.COMPLETED, "exit code 0", exit_code=0)
    assert done.state is S.COMPLETED and done.exit_code == 0 and done.native_id == "123"
    assert done.started_at and done.finished_at and done.pool == "local"
    assert [e["to"] for e in store.events(task.id)] == [
        "queued",
        "placed",
        "submitted",
        "running",
        "completed",
    ]
    (run,) = store.ledger()
    assert run.owner == "alice" and run.team == "vision" and run.pool == "local"
    assert run.end is not None and run.gpu_seconds == pytest.approx(2 * (run.end - run.start))


def test_an_illegal_transition_changes_nothing(store):
    task = store.create_task(spec(), "alice", None)
    with pytest.raises(IllegalTransition):
        store.change_state(task.id, S.COMPLETED, "nope", exit_code=3)
    again = store.get(task.id)
    assert again.state is S.QUEUED and again.exit_code is None and again.reason == ""
    assert len(store.events(task.id)) == 1


def test_only_from_guards_against_races(store):
    task = store.create_task(spec(), "alice", None)
    store.change_state(task.id, S.CANCELLED, "by owner")
    assert store.change_state(task.id, S.PLACED, only_from=[S.QUEUED], pool="x") is None
    assert store.get(task.id).state is S.CANCELLED


def test_a_looks_moves_are_each_their_own_and_guarded(store, monkeypatch):
    """move_each: every task its own move, reason and fields, in chunks of transactions; a task
    not in its move's only_from, or not there, is left alone (None)."""
    monkeypatch.setattr(repository, "MOVES_AT_ONCE", 2)
    made = [store.create_task(spec(), "alice", None) for _ in range(4)]
    a, b, c, d = (t.id for t in made)
    placed = {i: {"pool": "p"} for i in (a, b, c)}
    store.change_states(list(placed), S.PLACED, "", [S.QUEUED], placed)
    store.change_states([a, b, c], S.SUBMITTED, "", [S.PLACED])
    moves = [
        Move(a, S.RUNNING, "R"),
        Move(b, S.COMPLETED, "done", [S.SUBMITTED], fields={"exit_code": 0}),
        Move(d, S.RUNNING, "R", [S.SUBMITTED]),  # still queued
        Move(c, S.FAILED, "exit 3", [S.RUNNING], fields={"exit_code": 3}),  # not running
        Move(10**6, S.RUNNING),  # no such task
    ]
    changed = store.move_each(moves)
    assert [t and (t.id, t.state) for t in changed] == [
        (a, S.RUNNING),
        (b, S.COMPLETED),
        None,
        None,
        None,
    ]
    assert store.get(b).exit_code == 0 and store.get(b).reason == "done"
    assert [store.get(i).state for i in (c, d)] == [S.SUBMITTED, S.QUEUED]
    assert store.events(a)[-1]["reason"] == "R" and store.events(d)[-1]["to"] == "queued"


def test_a_looks_moves_keep_the_ledger_as_single_moves_do(store):
    """One move_each transaction: a running task paused then resumed (its run closed, a new
    one opened), one that ends (its run closed, GPU-seconds counted), one that starts (a run
    opened), and one already running that stays so (no second run)."""
    made = [store.create_task(spec(), "alice", None, gpus=1) for _ in range(4)]
    paused, ending, starting, steady = (t.id for t in made)
    placed = {t.id: {"pool": "p"} for t in made}
    store.change_states(list(placed), S.PLACED, "", [S.QUEUED], placed)
    store.change_states(list(placed), S.SUBMITTED, "", [S.PLACED])
    store.change_states([paused, ending, steady], S.RUNNING, "", [S.SUBMITTED])
    store.move_each(
        [
            Move(paused, S.RUNNING, "suspended", charged=False),
            Move(ending, S.COMPLETED, "done", fields={"exit_code": 0}),
            Move(starting, S.RUNNING, "R"),
            Move(paused, S.RUNNING, "resumed"),
            Move(steady, S.RUNNING, "R"),
        ]
    )
    runs: dict[int, list[bool]] = {}  # each task's runs in order: still open?
    for run in store.ledger():
        runs.setdefault(run.task_id, []).append(run.end is None)
        if run.end is not None:
            assert run.gpu_seconds == pytest.approx(run.gpus * (run.end - run.start))
    assert runs == {paused: [False, True], ending: [False], starting: [True], steady: [True]}


def test_concurrent_writers_one_wins(store):
    task = store.create_task(spec(), "alice", None)
    store.change_state(task.id, S.PLACED, pool="p")
    store.change_state(task.id, S.SUBMITTED, native_id="1")
    store.change_state(task.id, S.RUNNING)
    outcomes = []
    barrier = threading.Barrier(8)

    def end(state):
        barrier.wait()
        outcomes.append(store.change_state(task.id, state, only_from=[S.RUNNING]))

    threads = [threading.Thread(target=end, args=(s,)) for s in [S.CANCELLED, S.COMPLETED] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o is not None]
    assert len(winners) == 1
    assert store.get(task.id).state is winners[0].state
    assert len(store.events(task.id)) == 5


def test_spec_round_trips_with_free_text(store):
    text = "it's $(rm -rf /) `x` \n#SBATCH --uid=0 ünïcode"
    task = store.create_task(
        TaskSpec(command=("echo", text), resource="cpu", name=text, env={"K": text}), "alice", None
    )
    back = store.get(task.id)
    assert back.spec.command == ("echo", text) and back.spec.name == text
    assert back.spec.env == {"K": text}


def test_unknown_task_is_not_found(store):
    with pytest.raises(NotFound):
        store.get(999)


def test_tokens(store):
    from broker.store.identity import IdentityStore

    identities = IdentityStore(store)
    token, _ = identities.add_token("alice")
    found = identities.token(token)
    assert found is not None and (found.user, found.admin) == ("alice", False)
    assert identities.token("forged") is None
    assert not identities.has_admin()
    _, admin = identities.add_token("admin", kind="admin")
    assert identities.has_admin()
    assert admin.admin and admin.scopes == {"admin", "read", "submit"}


def test_reopening_migrates_once_and_keeps_rows(store):
    task = store.create_task(spec(), "alice", None)
    again = Store.open(store.url)
    assert again.get(task.id).spec.command == ("echo", "hi")
    again.close()


def test_the_sdks_record_and_artifacts_are_kept_and_the_migration_goes_both_ways(store):
    from broker.domain import Origin
    from broker.store.migrate import config

    local = store.create_task(
        spec(),
        "alice",
        None,
        state=S.RUNNING,
        record={"origin": "local", "pool": "(local)", "parameters": {"lr": 0.1}},
    )
    step = store.create_task(
        spec(), "alice", None, record={"parent_id": local.id, "cache_key": "a" * 64}
    )
    assert (local.origin, local.pool, local.parameters) == (Origin.LOCAL, "(local)", {"lr": 0.1})
    assert [r.pool for r in store.ledger()] == ["(local)"]  # metered from its start
    assert store.merge_parameters(local.id, {"lr": 0.5, "epochs": 2}, overwrite=False) == {
        "lr": 0.1,
        "epochs": 2,
    }
    store.add_artifact(step.id, name="m", kind="file", filename="m.bin", digest="d" * 64, size=3)
    reused = store.create_task(spec(), "alice", None, state=S.COMPLETED)
    store.copy_artifacts(step.id, reused.id)
    assert store.artifact(reused.id, "m")["digest"] == "d" * 64
    assert [t.id for t in store.children(local.id)] == [step.id]
    with pytest.raises(IllegalTransition):
        store.create_task(spec(), "alice", None, state=S.PENDING)
    from alembic import command

    command.downgrade(config(store.engine), "0006_apps")
    command.upgrade(config(store.engine), "head")
    assert store.get(local.id).parameters == {}  # the columns were dropped and made again


def test_a_sweep_is_made_in_one_transaction_each_task_from_its_own_item(store):
    changes = store.changes.reader()
    changes.take()
    items = [(spec(name=f"t{i}"), 0.5, {"parameters": {"i": i}}) for i in range(2500)]
    sweep, tasks = store.create_queued(items, "alice", "vision", sweep="lr")
    assert [t.spec.name for t in tasks] == [f"t{i}" for i in range(2500)]
    stored = {t.id: t for t in store.tasks(sweep=sweep)}
    assert len(stored) == 2500
    for made in tasks:  # each id is the row of its own item
        assert stored[made.id].spec.name == made.spec.name
        assert stored[made.id].parameters == made.parameters == {"i": int(made.spec.name[1:])}
    assert {t.sweep for t in stored.values()} == {sweep}
    assert store.events(tasks[7].id)[0]["to"] == "queued"
    info = store.sweep(sweep)
    assert (info["owner"], info["name"], info["size"]) == ("alice", "lr", 2500)
    assert info["states"] == {"queued": 2500}
    assert changes.take() == {t.id for t in tasks}  # the scheduler reads just these
    ended = store.change_states([tasks[0].id, tasks[1].id], S.CANCELLED, "stop", [S.QUEUED])
    assert [t.state for t in ended] == [S.CANCELLED] * 2
    assert store.sweep(sweep)["states"] == {"queued": 2498, "cancelled": 2}
    # A cycle's placements: one transaction, each task with its own pool and GPUs.
    ids = [t.id for t in tasks[:3]]
    where = {i: {"pool": f"p{n}", "gpu_ids": [n], "attempts": 1} for n, i in enumerate(ids)}
    placed = store.change_states(ids, S.PLACED, "", [S.QUEUED], where)
    assert sorted((t.id, t.pool, t.gpu_ids) for t in placed) == [(ids[2], "p2", (2,))]
    assert [(store.get(i).state, store.get(i).pool) for i in ids] == [
        (S.CANCELLED, None),
        (S.CANCELLED, None),
        (S.PLACED, "p2"),
    ]


def test_a_batchs_attempts_and_accepted_jobs_are_each_recorded_at_once(store):
    from broker.agents.link import Accepted, Attempt
    from broker.control.store_link import StoreLink
    from broker.estate import parse_estate
    from broker.store.identity import token_digest

    estate = "pools: {p: {kind: host}}\nresources: {cpu: {profile: {cpus: 1, pools: [p]}}}"
    link = StoreLink(store, parse_estate(estate))
    _sweep, tasks = store.create_queued([(spec(), 0.0, {}) for _ in range(3)], "alice", None)
    ids = [t.id for t in tasks]
    placed = store.change_states(ids, S.PLACED, "", [S.QUEUED], {i: {"pool": "p"} for i in ids})
    first, cancelled, last = sorted(placed, key=lambda t: t.id)
    store.change_state(cancelled.id, S.CANCELLED, "by its owner")
    attempts = [Attempt(t, f"/jobs/{t.id}") for t in (first, cancelled, last)]
    begun = asyncio.run(link.begin(attempts))
    # A cancelled task is not begun: nothing is sent for it, and nothing is written.
    assert [b and (b.task.id, b.task.job_dir) for b in begun] == [
        (first.id, f"/jobs/{first.id}"),
        None,
        (last.id, f"/jobs/{last.id}"),
    ]
    assert store.get(cancelled.id).job_dir is None
    # Each begun attempt gets its own report token, made here; only its digest is kept.
    assert begun[2] is not None and begun[0] is not None and begun[2].token != begun[0].token
    assert store.report_digest(last.id) == token_digest(begun[2].token)
    store.change_state(last.id, S.CANCELLED, "by its owner")  # while the pool accepts it
    accepted = [Accepted(t, f"9_{n}", f"/jobs/{t.id}") for n, t in enumerate((first, last))]
    assert asyncio.run(link.submitted(accepted)) == [True, False]
    now = [store.get(t.id) for t in (first, last)]
    assert [(t.state, t.native_id) for t in now] == [(S.SUBMITTED, "9_0"), (S.CANCELLED, "9_1")]
    assert [e["to"] for e in store.events(first.id)] == ["queued", "placed", "submitted"]


def test_agent_tokens_made_before_they_could_expire_get_an_end_and_revoked_ones_stay_out(store):
    from alembic import command

    from broker.store.identity import AgentTokens, token_digest
    from broker.store.migrate import config

    tokens = AgentTokens(store)
    kept, _ = tokens.add(["p"], time.time() + 3600)
    gone, info = tokens.add(["q"], time.time() + 3600)
    tokens.revoke(info.id)
    command.downgrade(config(store.engine), "0010_sweeps")
    made_before = "a token made when agent tokens had no end"
    with store.engine.begin() as conn:
        conn.execute(
            sqlalchemy.text(
                "INSERT INTO agent_tokens (digest, pools, created_at) VALUES (:d, :p, 0)"
            ),
            {"d": token_digest(made_before), "p": '["r"]'},
        )
    command.upgrade(config(store.engine), "head")
    old = tokens.find(made_before)
    assert old is not None and old.pools == ("r",) and not old.revoked
    assert old.id == "agent-" + token_digest(made_before)[:16]
    assert 89 * 86400 < old.expires_at - time.time() <= 90 * 86400  # from the upgrade on
    assert tokens.find(kept) is not None
    assert tokens.find(gone) is None  # a revoked token never comes back into force
