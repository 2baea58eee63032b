"""`klique demo`: a local server in the background, one small real task, followed to the end."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import click

from broker import config
from broker.cli.tasks import FINAL, follow_logs
from broker.client import ApiError, Client, save_token
from broker.errors import KliqueError

DEMO_TASK = """
import time
total = 0
for step in range(1, 6):
    deadline = time.time() + 0.6
    while time.time() < deadline:
        total += sum(i * i for i in range(2000))
    print(f"step {step}/5: sum of squares so far {total}", flush=True)
print("done")
"""


def _pid_file() -> Path:
    return config.home() / "demo-server.pid"


def _up(client: Client) -> bool:
    try:
        client.get("/health")
    except ApiError:
        return False
    return True


DEMO_ACCOUNT = "klique-demo"
DEMO_JOB_ROOT = Path("/var/tmp/klique-demo-jobs")


def _demo_estate(home: Path) -> Path:
    """As root, the demo's tasks run as an ordinary account made for it: Klique never runs a
    task as root, and a host pool without a user map runs only the server account's tasks."""
    # The estate module loads the server's settings models; only a root demo's start needs it.
    from broker.estate import builtin_estate_text

    try:
        pwd.getpwnam(DEMO_ACCOUNT)
    except KeyError:
        click.echo(f"the server runs as root: making the account {DEMO_ACCOUNT} to run the tasks")
        subprocess.run(
            ["useradd", "--system", "--create-home", "--shell", "/usr/sbin/nologin", DEMO_ACCOUNT],
            check=True,
        )
    if not DEMO_JOB_ROOT.is_dir():
        DEMO_JOB_ROOT.mkdir()
        DEMO_JOB_ROOT.chmod(0o1777)  # shared by the accounts, each folder its own (sticky)
    estate = home / "demo-estate.yaml"
    lines = f"    job_root: {DEMO_JOB_ROOT}\n    user_map: {{admin: {DEMO_ACCOUNT}}}\n"
    estate.write_text(
        f"# The demo's estate (the server runs as root): tasks run as {DEMO_ACCOUNT}, never root."
        + builtin_estate_text(pool_lines=lines)
    )
    return estate


def _start_server(client: Client, deadline_s: float = 60.0) -> None:
    home = config.home()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    log = home / "server.log"
    click.echo(f"starting a Klique server in the background (log: {log})")
    where = urlsplit(client.api)
    argv = [
        sys.executable,
        "-m",
        "broker",
        "server",
        "--host",
        where.hostname or "127.0.0.1",
        "--port",
        str(where.port or config.DEFAULT_PORT),
    ]
    if os.geteuid() == 0:
        argv += ["--estate", str(_demo_estate(home))]
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    _pid_file().write_text(str(process.pid))
    deadline = time.monotonic() + deadline_s
    while not _up(client):
        if process.poll() is not None:
            raise KliqueError(f"the server exited at start (code {process.returncode}); see {log}")
        if time.monotonic() > deadline:
            raise KliqueError(f"the server did not answer within {deadline_s:g} s; see {log}")
        time.sleep(0.2)


def _login(client: Client) -> Client:
    token_file = config.home() / "admin.token"
    if client.token:
        try:
            client.get("/whoami")
            return client
        except ApiError:
            pass
    if not token_file.exists():
        raise KliqueError(f"no token for {client.api}: run `klique login`")
    token = token_file.read_text().strip()
    save_token(client.api, token)
    click.echo(f"logged in as admin with {token_file}")
    return Client(api=client.api, token=token)


@click.command("demo")
@click.option("--stop", "stop_server", is_flag=True, help="Stop the server the demo started.")
def command(stop_server: bool) -> None:
    """Start a local server if none runs, submit a small task and follow it to the end."""
    if stop_server:
        stop()
    else:
        run()


def run() -> None:
    """Start a server unless one answers, submit the demo's task and follow it to its end."""
    client = Client()
    if not _up(client):
        _start_server(client)
    else:
        click.echo(f"using the Klique server at {client.api}")
    client = _login(client)
    task = client.post(
        "/tasks",
        {
            "command": ["python3", "-c", DEMO_TASK],
            "name": "demo: sum of squares",
            "project": "demo",
        },
    )
    click.echo(f"submitted task {task['id']} to compute resource {task['resource']}; its console:")
    follow_logs(client, task["id"], follow=True)
    task = client.get(f"/tasks/{task['id']}")
    while task["state"] not in FINAL:
        time.sleep(0.2)
        task = client.get(f"/tasks/{task['id']}")
    click.echo(
        f"task {task['id']} {task['state']} on pool {task['pool']} "
        f"(exit code {task['exit_code']}): {task['reason']}"
    )
    click.echo(f"its files: {task['job_dir']}")
    click.echo("next: `klique ls`, `klique show ID`, `klique demo --stop`")
    if task["state"] != "completed":
        sys.exit(1)


def stop() -> None:
    """Stop the server that `run` started, if it still runs."""
    try:
        pid = int(_pid_file().read_text())
    except (OSError, ValueError):
        click.echo("no demo server to stop")
        return
    try:
        os.killpg(pid, signal.SIGTERM)
        click.echo(f"stopped the demo server (pid {pid})")
    except ProcessLookupError:
        click.echo("the demo server had already stopped")
    _pid_file().unlink(missing_ok=True)
