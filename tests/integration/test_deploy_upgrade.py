"""`klique db upgrade` on a store the previous release made: the schema moves to this release's
revision and the rows written under the old one read back intact, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import sqlalchemy
from click.testing import CliRunner

from broker.cli import main
from broker.domain import TaskSpec, TaskState, spec_to_dict
from broker.store import migrate
from broker.store.engine import make_engine, normalise_url
from broker.store.identity import AgentTokens, token_digest
from broker.store.repository import Store

# The schema of the last release before agent tokens could expire (0011 rewrites that table:
# a migration that moves rows, not only one that adds a table). Landed revisions never change,
# so the store this makes is the same whatever migrations are added later.
PREVIOUS_RELEASE = "0010_sweeps"
AGENT_TOKEN = "t" * 43


def _fresh_schema(url: str) -> str:
    """A schema of the test's own on the shared server, so that runs never see each other."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    engine = sqlalchemy.create_engine(normalise_url(url))
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    engine.dispose()
    return f"{url}?options=-csearch_path%3D{schema}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'klique.db'}"
    return _fresh_schema(request.getfixturevalue("postgres_url"))


def _old_store(url: str, now: float) -> tuple[int, int]:
    """A store at the previous release's revision with a finished task, its events, a sweep
    and an agent token, written as that release wrote them (plain SQL, no current code); the
    task's id and the sweep's."""
    engine = make_engine(url)
    migrate.upgrade(engine, PREVIOUS_RELEASE)
    spec = spec_to_dict(
        TaskSpec(command=("python", "train.py"), resource="cpu", name="old", project="p1")
    )
    with engine.begin() as conn:
        sweep = conn.execute(
            sqlalchemy.text(
                "INSERT INTO sweeps (owner, team, name, size, created_at) "
                "VALUES ('alice', 'vision', 'lr', 1, :now) RETURNING id"
            ),
            {"now": now},
        ).scalar_one()
        task = conn.execute(
            sqlalchemy.text(
                "INSERT INTO tasks (name, owner, team, project, resource, state, reason, "
                "spec, gpus, borrowed, skip_pools, attempts, created_at, updated_at, pool, "
                "native_id, exit_code, sweep_id) VALUES ('old', 'alice', 'vision', 'p1', "
                "'cpu', 'completed', 'exit code 0', :spec, 0, false, '[]', 1, :now, :now, "
                "'local', '123', 0, :sweep) RETURNING id"
            ),
            {"spec": json.dumps(spec), "now": now, "sweep": sweep},
        ).scalar_one()
        for old, new in [("", "queued"), ("queued", "placed"), ("placed", "completed")]:
            conn.execute(
                sqlalchemy.text(
                    "INSERT INTO task_events (task_id, time, old_state, new_state, reason) "
                    "VALUES (:task, :now, :old, :new, '')"
                ),
                {"task": task, "now": now, "old": old, "new": new},
            )
        conn.execute(
            sqlalchemy.text(
                "INSERT INTO agent_tokens (digest, pools, created_at) VALUES (:d, :p, :now)"
            ),
            {"d": token_digest(AGENT_TOKEN), "p": json.dumps(["far"]), "now": now},
        )
    assert migrate.current(engine) == PREVIOUS_RELEASE
    engine.dispose()
    return int(task), int(sweep)


def test_db_upgrade_brings_the_previous_releases_store_to_this_one_with_its_rows(url):
    now = time.time()
    task_id, sweep_id = _old_store(url, now)
    runner = CliRunner()
    before = runner.invoke(main, ["db", "current", "--db", url])
    assert before.exit_code == 0, before.output
    assert PREVIOUS_RELEASE in before.output and "klique db upgrade" in before.output

    done = runner.invoke(main, ["db", "upgrade", "--db", url])

    assert done.exit_code == 0, done.output
    assert f"from {PREVIOUS_RELEASE} to {migrate.head()}" in done.output
    engine = make_engine(url)
    assert migrate.current(engine) == migrate.head()  # upgraded by the command, not by Store.open
    engine.dispose()
    store = Store.open(url)
    try:
        task = store.get(task_id)
        assert task.state is TaskState.COMPLETED and task.exit_code == 0
        assert (task.owner, task.team, task.spec.project, task.pool) == (
            "alice",
            "vision",
            "p1",
            "local",
        )
        assert task.spec.command == ("python", "train.py") and task.spec.name == "old"
        assert [e["to"] for e in store.events(task_id)] == ["queued", "placed", "completed"]
        sweep = store.sweep(sweep_id)
        assert (sweep["name"], sweep["states"]) == ("lr", {"completed": 1})
        kept = AgentTokens(store).find(AGENT_TOKEN)
        assert kept is not None and list(kept.pools) == ["far"] and not kept.revoked
        assert kept.id.startswith("agent-") and kept.expires_at > now  # given by 0011
        # A new row after the upgrade takes the next id: sequences survived on PostgreSQL too.
        new = store.create_task(TaskSpec(command=("true",), resource="cpu"), "bob", None)
        assert new.id > task_id
    finally:
        store.close()
    again = runner.invoke(main, ["db", "upgrade", "--db", url])
    assert again.exit_code == 0 and "nothing to do" in again.output, again.output


def test_db_upgrade_refuses_a_store_a_newer_release_made(url):
    engine = make_engine(url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("UPDATE alembic_version SET version_num = '0099_future'"))
    engine.dispose()

    done = CliRunner().invoke(main, ["db", "upgrade", "--db", url])

    assert done.exit_code == 1
    assert "0099_future" in done.output and "does not downgrade" in done.output


def test_db_commands_say_in_one_line_why_the_store_cannot_be_opened(tmp_path):
    url = f"sqlite:///{tmp_path / 'no-such-folder' / 'klique.db'}"
    for command in ("current", "upgrade"):
        done = CliRunner().invoke(main, ["db", command, "--db", url])
        assert done.exit_code == 1, done.output
        assert done.output.startswith("klique: cannot open the store at sqlite:///"), done.output
        assert "KLIQUE_DB" in done.output and len(done.output.splitlines()) == 1
