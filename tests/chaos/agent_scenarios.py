"""Chaos with the submitter on the login node: a pool served by `klique agent` (a process of
its own, talking to the control plane over the agent API) on the real Slurm cluster. The agent
is killed with -9 mid-storm, the control plane is killed with -9 while the agent runs, and the
network between them is cut for a minute; every task is then accounted for against Slurm's
own records, as in chaos_scenarios.py.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from chaos_scenarios import ChaosRun, Outcome, _submitted, chaos_run, mixed_work
from conftest import ROOT, free_port, wait_for

# Where the agent kills itself (broker/faults.py), one point per life of the agent.
AGENT_POINTS = ("after_submit:3", "before_submit:5", "after_poll:2", "after_submit:11")


class Agent:
    """`klique agent --pool slurm` for a ChaosRun's server, restartable at will."""

    def __init__(self, run: ChaosRun, server_url: str) -> None:
        self.run = run
        self.url = server_url
        self.home = run.home.parent / "agent-home"
        self.home.mkdir(exist_ok=True)
        self.token_file = run.home.parent / "agent.token"
        with run.api() as api:
            answer = api.post("/agent-tokens", json={"pools": ["slurm"]})
        answer.raise_for_status()
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(answer.json()["token"])
        self.process: subprocess.Popen[bytes] | None = None
        self.lives = 0

    def start(self, crash_at: str | None = None) -> None:
        env = {**os.environ, "KLIQUE_HOME": str(self.home)}
        env.pop("KLIQUE_CRASH_AT", None)
        if crash_at:
            env["KLIQUE_CRASH_AT"] = crash_at
        self.lives += 1
        argv = [sys.executable, "-m", "broker", "agent", "--pool", "slurm", "--server", self.url]
        with (self.home / "agent.log").open("ab") as log:
            log.write(f"\n--- life {self.lives}: crash at {crash_at or 'never'}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [*argv, "--token-file", str(self.token_file)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )

    def await_crash(self, point: str, timeout: float = 180) -> None:
        assert self.process is not None
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"the agent never reached {point} in {timeout:g} s") from None
        if code != -signal.SIGKILL:
            raise RuntimeError(f"the agent exited {code}, not by SIGKILL at {point}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def remote_run(name: str, workdir: Path, **options: object) -> Iterator[ChaosRun]:
    with chaos_run(name, workdir, agent="remote", **options) as run:  # type: ignore[arg-type]
        yield run


def agent_crashes(workdir: Path, tasks: int = 80, points: Sequence[str] = AGENT_POINTS) -> Outcome:
    """The agent kills itself with -9 at each of `points` in turn (a submission sent but not
    reported, one about to be sent, a poll answered but not reported) and is restarted."""
    started = time.monotonic()
    problems: list[str] = []
    with remote_run("agent-crash", workdir, max_queued=16) as run:
        run.queue(mixed_work(tasks))
        server = run.launch()
        agent = Agent(run, server.url)
        try:
            for point in points:
                agent.start(point)
                agent.await_crash(point)
                problems += [f"after the agent died at {point}: {p}" for p in run.duplicates()]
            agent.start()
            if not run.wait_final(300):
                problems.append("not every task ended within 300 s of the agent's last start")
        finally:
            agent.stop()
            run.stop()
        outcome = run.account("agent-sigkill", len(points), started)
    outcome.problems += problems
    return outcome


def control_plane_crashes(workdir: Path, tasks: int = 80, kills: int = 3) -> Outcome:
    """The control plane is killed with -9 while the agent submits and polls, `kills` times,
    each once a few more tasks reached Slurm; restarted on the same address, the agent goes on."""
    started = time.monotonic()
    problems: list[str] = []
    with remote_run("plane-crash", workdir, max_queued=16) as run:
        run.queue(mixed_work(tasks))
        server = run.launch()
        agent = Agent(run, server.url)
        agent.start()
        try:
            for kill in range(1, kills + 1):
                goal = _submitted(run) + 5
                wait_for(
                    lambda goal=goal: _submitted(run) >= goal or run.all_final(),
                    180,
                    f"{goal} tasks to reach Slurm before kill {kill}",
                    0.05,
                )
                assert run.server is not None
                run.server.process.kill()
                run.server.process.wait()
                problems += [f"after kill {kill}: {p}" for p in run.duplicates()]
                run.launch()
            if not run.wait_final(300):
                problems.append("not every task ended within 300 s of the last restart")
            if agent.process is None or agent.process.poll() is not None:
                problems.append("the agent did not outlive the control plane's restarts")
        finally:
            agent.stop()
            run.stop()
        outcome = run.account("control-plane-sigkill", kills, started)
    outcome.problems += problems
    return outcome


def network_cut(workdir: Path, tasks: int = 40, cut_s: float = 60) -> Outcome:
    """The network between the agent and the control plane is cut for `cut_s` (a proxy on
    loopback stops forwarding and drops its connections) while tasks run: none fails, the pool
    shows its agent silent, and all finish once it is back."""
    started = time.monotonic()
    problems: list[str] = []
    notes: list[str] = []
    with remote_run("network-cut", workdir, max_queued=16) as run:
        server = run.launch()
        with TcpProxy(int(server.url.rsplit(":", 1)[1])) as proxy:
            agent = Agent(run, f"http://127.0.0.1:{proxy.port}")
            agent.start()
            try:
                run.submit(mixed_work(tasks, sleep_s=20))
                wait_for(lambda: _submitted(run) >= tasks // 2, 180, "tasks to reach Slurm", 0.1)
                proxy.cut()
                cut_at = time.monotonic()
                try:
                    wait_for(lambda: not _pool_up(run), cut_s, "the pool to show its agent silent")
                    notes.append(f"silent after {time.monotonic() - cut_at:.0f} s")
                except AssertionError as exc:
                    problems.append(str(exc))
                time.sleep(max(0.0, cut_s - (time.monotonic() - cut_at)))  # the fault itself
                problems += [
                    f"during the cut: task {t.id} ended {t.state.value} ({t.reason!r})"
                    for t in run.tasks().values()
                    if t.state.final and t.state.value != run.expected[t.id].state
                ]
                proxy.restore()
                if not run.wait_final(300):
                    problems.append("not every task ended within 300 s of the network's return")
            finally:
                agent.stop()
                run.stop()
        outcome = run.account("network-cut", 1, started)
    outcome.problems += problems
    outcome.notes += notes
    return outcome


def _pool_up(run: ChaosRun) -> bool:
    with run.api() as api:
        pools = {p["name"]: p for p in api.get("/pools").json()}
    return bool(pools["slurm"]["reachable"])


class TcpProxy:
    """Forwards a local port to the control plane; `cut()` drops every connection and refuses
    new ones until `restore()`, as a network that went away would."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.port = free_port()
        self._up = threading.Event()
        self._up.set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> TcpProxy:
        self._listen()
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self.cut()
        self._thread.join(10)

    def cut(self) -> None:
        self._up.clear()
        with self._lock:
            for sock in self._sockets | ({self._listener} if self._listener else set()):
                _close(sock)
            self._sockets.clear()
            self._listener = None

    def restore(self) -> None:
        self._listen()
        self._up.set()

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.2)
        with self._lock:
            self._listener = listener

    def _serve(self) -> None:
        while not self._stop.is_set():
            listener = self._listener
            if listener is None or not self._up.is_set():
                time.sleep(0.05)
                continue
            try:
                client, _ = listener.accept()
            except (OSError, TimeoutError):
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._sockets |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        try:
            selector.register(a, selectors.EVENT_READ, b)
            selector.register(b, selectors.EVENT_READ, a)
            while True:
                for key, _ in selector.select(timeout=0.5):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
        except (OSError, ValueError):
            return
        finally:
            selector.close()
            for sock in (a, b):
                _close(sock)
            with self._lock:
                self._sockets -= {a, b}


def _close(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
