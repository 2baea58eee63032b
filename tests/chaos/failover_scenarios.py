"""Failover on the real Slurm cluster: two replicas of the server on one PostgreSQL store, behind
an nginx that uses the deployed proxy settings (deploy/nginx/klique-proxy.conf), a storm of
creates through nginx, and the leader SIGKILLed at random moments or cut from the database;
then every task against Slurm's own records: no duplicate, none lost, none in a wrong final
state. Shared by tests/chaos/test_failover.py and bench/failover.py.

The cut is a TCP relay between each replica and PostgreSQL (`Relay`) that, cut, stops passing
bytes and holds every connection open and silent, as a dead network does; healed, it drops
what it held (nothing of it reaches the database) and passes new connections again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import sqlalchemy
from chaos_scenarios import (
    SLURM_DIR,
    USERS,
    ChaosRun,
    Outcome,
    Work,
    estate_text,
    mixed_work,
)
from conftest import ROOT, Server, free_port, stop_process, wait_for
from helpers.slurm import newest_job_id

from broker.domain import TaskSpec, TaskState
from broker.store.engine import normalise_url
from broker.store.repository import Store

NGINX = "/usr/sbin/nginx"
PG_HOST, PG_PORT = "127.0.0.1", int(os.environ.get("KLIQUE_PG_PORT", "54329"))
NAME = "failover"  # every task of the storm is named "failover N", N its work's index


class Relay:
    """A TCP relay to PostgreSQL on a port of its own, in a thread; `cut` makes it silent."""

    def __init__(self) -> None:
        self.port = free_port()
        self._cut = False
        self._held: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ends = {writer}
        self._held.add(writer)
        try:
            while self._cut:  # a new connection while cut: accepted, never answered
                await asyncio.sleep(0.1)
            up_reader, up_writer = await asyncio.open_connection(PG_HOST, PG_PORT)
            ends.add(up_writer)
            self._held.add(up_writer)
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for end in ends:
                self._held.discard(end)
                end.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                while self._cut:  # held, never sent: a dead network loses it
                    await asyncio.sleep(0.05)
                    if writer.is_closing():
                        return
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    def url(self, url: str) -> str:
        return url.replace(f"{PG_HOST}:{PG_PORT}", f"127.0.0.1:{self.port}")

    def cut(self) -> None:
        self._cut = True

    def heal(self) -> None:
        """Drop every connection it held (their bytes with them), then pass bytes again."""

        def drop() -> None:
            for writer in list(self._held):
                writer.transport.abort()
            self._held.clear()

        self._loop.call_soon_threadsafe(drop)
        time.sleep(0.2)
        self._cut = False

    def close(self) -> None:
        self.heal()
        self._loop.call_soon_threadsafe(self._loop.stop)


@dataclass
class Replica:
    name: str
    home: Path
    relay: Relay
    port: int = field(default_factory=free_port)
    routes_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def role(self) -> str | None:
        """leader, follower, or None when it does not answer (/readyz answers within its
        wait for the store, cut or not)."""
        try:
            return str(httpx.get(self.url + "/readyz", timeout=5).json()["role"])
        except (httpx.HTTPError, ValueError, KeyError):
            return None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class FailoverRun(ChaosRun):
    """Two replicas on one PostgreSQL schema, nginx in front, tasks by the storm's names."""

    def __init__(self, workdir: Path, db_url: str, ttl_s: float) -> None:
        # ChaosRun's own start is SQLite's: this run sets the same parts up on PostgreSQL.
        self.name = NAME
        self.home = workdir / NAME
        self.home.mkdir(parents=True, exist_ok=True)
        self.job_root = SLURM_DIR / "work" / f"failover-{os.getpid()}-{time.time_ns()}"
        self.job_root.mkdir(mode=0o1777)
        os.chmod(self.job_root, 0o1777)
        self.estate = self.home / "estate.yaml"
        self.estate.write_text(estate_text(self.job_root, "local", "90s", 100))
        self.db_url = db_url
        self.ttl_s = ttl_s
        self.store = Store.open(db_url)
        self.first_id = _seed_ids(self.store, db_url)
        self.since = time.time()
        self.since_job = newest_job_id()
        self.expected = {}
        self.server = None
        self.tokens = {}
        self.strangers = set()
        self.foreign = set()
        self.lives = 0
        self.env = {}
        self.replicas = [Replica(n, self.home / n, Relay()) for n in ("a", "b")]
        self.nginx_dir = self.home / "nginx"
        self.nginx_port = free_port()
        self.work: list[Work] = []

    # The replicas and nginx.

    def start(self, replica: Replica) -> None:
        replica.home.mkdir(parents=True, exist_ok=True)
        admin = self.home / "admin.token"
        if admin.exists():  # the store's admin token, made by the first replica's first start
            shutil.copy(admin, replica.home / "admin.token")
        args = [sys.executable, "-m", "broker", "server", "--port", str(replica.port)]
        args += ["--routes-port", str(replica.routes_port), "--replica-id", replica.name]
        args += ["--lease-ttl", str(self.ttl_s), "--estate", str(self.estate)]
        args += ["--log-format", "json"]  # each event's time: who stopped before whom
        # The jobs report through nginx, to whichever replica answers.
        args += ["--public-url", f"http://127.0.0.1:{self.nginx_port}"]
        env = {
            **os.environ,
            "KLIQUE_HOME": str(replica.home),
            "KLIQUE_DB": replica.relay.url(self.db_url),
        }
        self.lives += 1
        with (self.home / "server.log").open("ab") as log:  # one log: account() reads it
            log.write(f"\n--- replica {replica.name}, life {self.lives}\n".encode())
            log.flush()
            replica.process = subprocess.Popen(
                args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
            )
        wait_for(lambda: replica.role() is not None, 60, f"replica {replica.name} to answer")
        if not admin.exists():
            shutil.copy(replica.home / "admin.token", admin)

    def start_nginx(self) -> None:
        self.nginx_dir.mkdir(parents=True, exist_ok=True)
        (self.nginx_dir / "tmp").mkdir(exist_ok=True)
        upstream = "".join(
            f"        server 127.0.0.1:{r.port} max_fails=1 fail_timeout=2s;\n"
            for r in self.replicas
        )
        proxy = ROOT / "deploy" / "nginx" / "klique-proxy.conf"
        (self.nginx_dir / "nginx.conf").write_text(
            f"""worker_processes 1;
pid {self.nginx_dir}/nginx.pid;
error_log {self.nginx_dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {self.nginx_dir}/tmp/body;
    proxy_temp_path {self.nginx_dir}/tmp/proxy;
    fastcgi_temp_path {self.nginx_dir}/tmp/fastcgi;
    uwsgi_temp_path {self.nginx_dir}/tmp/uwsgi;
    scgi_temp_path {self.nginx_dir}/tmp/scgi;
    map $http_upgrade $klique_connection {{ default upgrade; '' ''; }}
    upstream klique_api {{
{upstream}        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{self.nginx_port};
        client_max_body_size 33m;
        location / {{
            proxy_pass http://klique_api;
            include {proxy};
            proxy_next_upstream error timeout http_502 http_503;
            proxy_connect_timeout 2s;
        }}
    }}
}}
"""
        )
        folder = str(self.nginx_dir)
        started = subprocess.run(
            [NGINX, "-p", folder, "-c", f"{folder}/nginx.conf", "-e", f"{folder}/error.log"],
            capture_output=True,
            text=True,
            check=False,
        )
        if started.returncode != 0:
            raise RuntimeError(f"nginx did not start: {started.stderr}")
        self.server = Server(
            f"http://127.0.0.1:{self.nginx_port}",
            self.home,
            (self.home / "admin.token").read_text().strip(),
            self.replicas[0].process,  # type: ignore[arg-type]
        )

    def leader(self) -> Replica | None:
        leaders = [r for r in self.replicas if r.alive() and r.role() == "leader"]
        return leaders[0] if len(leaders) == 1 else None

    def stop(self) -> None:
        for replica in self.replicas:
            if replica.alive():
                assert replica.process is not None
                stop_process(replica.process)
        pid = self.nginx_dir / "nginx.pid"
        if pid.exists():
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid.read_text()), signal.SIGQUIT)

    def close(self) -> None:
        self.stop()
        for replica in self.replicas:
            replica.relay.close()
        self.store.close()
        shutil.rmtree(self.job_root, ignore_errors=True)

    # The storm.

    def storm(self, work: list[Work], until: threading.Event, per_s: float) -> threading.Thread:
        """Creates through nginx, as their owners, at about `per_s` a second, each retried
        until it answers (a create whose answer was lost with a replica may exist twice: the
        accounting reads the store's tasks by their names, not the answers)."""
        assert self.server is not None
        for user in USERS:
            self.tokens[user] = self.server.make_token(user)
        self.work = work

        def run() -> None:
            assert self.server is not None
            for index, item in enumerate(work):
                body = {"command": list(item.command), "name": f"{NAME} {index}"}
                while True:
                    try:
                        with self.server.api(self.tokens[item.owner]) as api:
                            if api.post("/tasks", json=body).status_code in (200, 201):
                                break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.2)
                if until.wait(1 / per_s):
                    return

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def expect_from_names(self) -> None:
        """Every task of the storm the store holds, with what its command calls for."""
        for task in self.store.tasks(with_diff=False):
            prefix, _, index = task.spec.name.partition(" ")
            if prefix == NAME and index.isdigit():
                self.expected[task.id] = self.work[int(index)].expect


def _seed_ids(store: Store, url: str) -> int:
    """Task ids start past a base no other run on the shared cluster uses (as ChaosRun's do)."""
    base = int(time.time()) % 2_000_000 * 1000 + 500
    seed = store.create_task(
        TaskSpec(("true",), "cpu", name="failover: where task ids start"),
        "chaos",
        None,
        state=TaskState.CANCELLED,
        reason="placeholder: the next task id follows this one",
    )
    engine = sqlalchemy.create_engine(normalise_url(url))
    with engine.begin() as connection:
        connection.exec_driver_sql(f"SELECT setval(pg_get_serial_sequence('tasks', 'id'), {base})")
    engine.dispose()
    assert seed.id < base
    return base + 1


@dataclass
class Takeover:
    fault: str  # kill or cut
    seconds: float  # from the fault until the other replica led
    old_stopped_first: bool | None = None  # a cut leader logged its stop before the other led
    stopped_before_s: float | None = None  # by how long


@dataclass
class FailoverOutcome:
    outcome: Outcome
    takeovers: list[Takeover]


def _take_over(run: FailoverRun, old: Replica, fault: str, deadline_s: float) -> Takeover:
    """Wait for the other replica to lead; with a cut, read from the replicas' own logged
    events (one machine, one clock) whether the cut leader stopped before the other led."""
    other = next(r for r in run.replicas if r is not old)
    started, since = time.monotonic(), time.time()
    while time.monotonic() - started < deadline_s:
        if other.role() == "leader":
            took = time.monotonic() - started
            if fault != "cut":
                return Takeover(fault, took)
            led = wait_for(
                lambda: _logged_at(run, f"replica {other.name} leads", since), 10, "its event"
            )
            stop = _logged_at(run, f"replica {old.name} stops leading", since)
            before = None if stop is None else led - stop
            return Takeover(fault, took, stop is not None and stop < led, before)
        time.sleep(0.1)
    raise RuntimeError(f"replica {other.name} did not lead within {deadline_s:g} s of the {fault}")


def _logged_at(run: FailoverRun, words: str, since: float) -> float | None:
    """When a replica first logged an event starting with `words` after `since` (JSON logs)."""
    for line in (run.home / "server.log").read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        with contextlib.suppress(ValueError, KeyError):
            event = json.loads(line)
            if str(event["message"]).startswith(words):
                at = datetime.fromisoformat(event["time"]).timestamp()
                if at >= since:
                    return at
    return None


def failover(
    workdir: Path,
    db_url: str,
    tasks: int = 40,
    faults: tuple[str, ...] = ("kill", "cut"),
    ttl_s: float = 8.0,
    per_s: float = 4.0,
    seed: int | None = None,
) -> FailoverOutcome:
    """The storm through nginx while each of `faults` in turn strikes the leader at a random
    moment: "kill" (SIGKILL; restarted as a follower once the other leads) or "cut" (from the
    database, healed once the other leads); then every task against Slurm's records."""
    chance = random.Random(seed)
    started = time.monotonic()
    takeovers: list[Takeover] = []
    problems: list[str] = []
    with _run(workdir, db_url, ttl_s) as run:
        first, second = run.replicas
        run.start(first)
        wait_for(lambda: run.leader() is first, 30, "replica a to lead")
        run.start(second)
        run.start_nginx()
        done = threading.Event()
        storm = run.storm(mixed_work(tasks), done, per_s)
        try:
            for fault in faults:
                time.sleep(chance.uniform(1.0, 4.0))  # a random moment of the storm
                old = run.leader()
                if old is None:
                    raise RuntimeError("no single leader before the fault")
                if fault == "kill":
                    assert old.process is not None
                    old.process.kill()
                    old.process.wait()
                else:
                    old.relay.cut()
                takeovers.append(_take_over(run, old, fault, 3 * ttl_s))
                if fault == "kill":
                    run.start(old)
                else:
                    old.relay.heal()
                    wait_for(lambda o=old: o.role() == "follower", 30, "the cut replica back")
            storm.join(timeout=tasks / per_s + 120)
            run.expect_from_names()
            if not run.wait_final(240):
                problems.append("not every task ended within 240 s of the storm's end")
        finally:
            done.set()
            run.stop()
        outcome = run.account("failover", len(faults), started)
    outcome.problems += problems
    for takeover in takeovers:
        if takeover.old_stopped_first is False:
            outcome.problems.append("a cut leader had not stopped when the other led")
    outcome.notes.append(
        "takeovers: " + ", ".join(f"{t.fault} {t.seconds:.1f} s" for t in takeovers)
    )
    return FailoverOutcome(outcome, takeovers)


@contextmanager
def _run(workdir: Path, db_url: str, ttl_s: float) -> Iterator[FailoverRun]:
    run = FailoverRun(workdir, db_url, ttl_s)
    try:
        yield run
    finally:
        run.close()
