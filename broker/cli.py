"""The `klique` command. Thin: every command but `server` and `estate check` calls the API."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from broker import cli_sdk, cli_submit, config
from broker.cli_output import cell, json_option, listing, when
from broker.client import Client, one_line, save_token
from broker.errors import EstateError, KliqueError

FINAL = {"completed", "failed", "cancelled", "timeout", "lost"}


class KliqueGroup(click.Group):
    """Turns Klique's errors into one line on stderr and a non-zero exit."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EstateError as exc:
            for problem in exc.problems:  # one line each, FILE:LINE: field: what; fix: how
                click.echo(one_line(problem), err=True)
            sys.exit(2)
        except KliqueError as exc:
            click.echo(f"klique: {one_line(str(exc))}", err=True)
            sys.exit(1)


@click.group(cls=KliqueGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="klique")
@click.option(
    "--profile",
    metavar="NAME",
    help="Talk to the server that `klique login` kept for profile NAME (default: "
    "$KLIQUE_PROFILE, else $KLIQUE_API, else the last login's server).",
)
def main(profile: str | None) -> None:
    """Klique: send tasks to compute resources on Slurm, PBS, LSF and bare-metal pools."""
    config.use_profile(profile)


@main.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell's completion script: eval "$(klique completion bash)" in ~/.bashrc."""
    from click.shell_completion import get_completion_class

    complete = get_completion_class(shell)
    assert complete is not None  # noqa: S101 - click has all three
    click.echo(complete(main, {}, "klique", "_KLIQUE_COMPLETE").source())


@main.command()
@click.option(
    "--estate",
    "estate_path",
    type=click.Path(dir_okay=False),
    help="The estate file (default: $KLIQUE_HOME/estate.yaml if present, else one "
    "host pool on this machine).",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=config.DEFAULT_PORT, show_default=True, type=int)
@click.option(
    "--routes-port",
    type=int,
    help="The port that serves routes (apps' pages), an origin apart from the UI's and API's "
    "(default: --port + 1).",
)
@click.option(
    "--routes-domain",
    metavar="DOMAIN",
    help="A wildcard DNS domain: route NAME is served at NAME.DOMAIN (a host of its own per "
    "route, on the routes port). Without it, all routes share the routes port's origin.",
)
@click.option(
    "--routes-url",
    metavar="URL",
    help="The routes' public address where a proxy (TLS) serves the routes port, `*` standing "
    "for the route's name: https://*.routes.example.org (default: from the options above).",
)
@click.option(
    "--forwarded-allow-ips",
    metavar="ADDRESSES",
    help="The reverse proxies (comma-separated addresses) whose X-Forwarded-For and "
    "X-Forwarded-Proto are believed. Default: none; every caller's address is its socket's, "
    "so login throttles count real addresses.",
)
@click.option(
    "--public-url",
    metavar="URL",
    help="The URL that jobs, pods, agents and browsers use to reach this server, when it is "
    "not the bind address: http://klique.example.org:8765 (default: the estate's "
    "server.public_url, else http://HOST:PORT). Required while any pool's nodes are not "
    "this host and the bind address is loopback or 0.0.0.0.",
)
def server(
    estate_path: str | None,
    host: str,
    port: int,
    routes_port: int | None,
    routes_domain: str | None,
    routes_url: str | None,
    forwarded_allow_ips: str | None,
    public_url: str | None,
) -> None:
    """Run the API, the scheduler and the pool agents in this process."""
    from broker.estate import builtin_estate, load_estate
    from broker.server import serve

    home = config.home()
    default = home / "estate.yaml"
    if estate_path is None and default.exists():
        estate_path = str(default)
    estate = load_estate(estate_path) if estate_path else builtin_estate()
    if estate_path is None and os.geteuid() == 0:
        click.echo(f"klique: {ROOT_WITHOUT_ESTATE}", err=True)
    serve(
        estate,
        home,
        config.store_url(),
        host,
        port,
        routes_port,
        routes_domain,
        routes_url,
        trusted_proxies=forwarded_allow_ips,
        public=public_url,
    )


# Klique never runs a task as root, and the built-in pool has no user map to run it as anyone
# else: said at start, not discovered by the first task that waits for ever.
ROOT_WITHOUT_ESTATE = (
    "the server runs as root without an estate, and the built-in pool runs no task as root, "
    "so every task would wait; fix: give --estate a file whose pool maps users to an ordinary "
    "account (user_map, job_root), or run `klique demo`, which makes such an account and estate"
)


@main.command()
@click.option("--token", help="The token (default: ask for it).")
@click.option("--sso", is_flag=True, help="Log in through the company's single sign-on.")
@click.option("--ldap", "ldap_user", metavar="USER", help="Log in with USER's LDAP password.")
@click.option(
    "--api",
    help="The server's URL, kept as the profile's server (default: the profile's, else "
    "$KLIQUE_API, else the local server).",
)
def login(token: str | None, sso: bool, ldap_user: str | None, api: str | None) -> None:
    """Store a token for the server, after checking that the server accepts it.

    With --sso, open the address it prints and confirm the code: the refresh token is kept
    (mode 600) and access tokens are renewed silently. With --ldap, a token that lasts the
    server's identity.token_lifetime is kept."""
    from broker.cli_login import ldap_login, sso_login

    if sso or ldap_user:
        client = Client(api=api, anonymous=True)
        entry: str | dict[str, Any] = (
            sso_login(client) if sso else ldap_login(client, str(ldap_user))
        )
    else:
        entry = token or click.prompt("token", hide_input=True)
    # A sign-on's access token may end before it is checked (a short lifetime, a slow
    # machine): the check renews it with the refresh token, and the renewed one is kept.
    client = Client(api=api, token=entry) if isinstance(entry, str) else Client(api=api, sso=entry)
    me = client.get("/whoami")
    path = save_token(client.api, client.sso or entry, config.profile())
    team = f", team {me['team']}" if me.get("team") else ""
    click.echo(
        f"logged in to {client.api} as {me['user']}{team} "
        f"(profile {config.profile()}, kept in {path})"
    )


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--resource", "-r", help="The compute resource (default: the estate's default).")
@click.option("--project", "-p", default="default", show_default=True)
@click.option("--name", "-n", default="", help="A name for the task (free text).")
@click.option("--env", "-e", "env", multiple=True, metavar="KEY=VALUE", help="Set in the task.")
@click.option(
    "--requirement",
    "requirements",
    multiple=True,
    metavar="SPEC",
    help="A package the task needs (repeatable).",
)
@click.option(
    "--requirements",
    "requirements_local",
    type=click.Path(exists=True, dir_okay=False),
    help="A requirements.txt here whose packages the task needs.",
)
@click.option(
    "--requirements-file",
    metavar="PATH",
    help="requirements.txt, pyproject.toml or uv.lock in the code, for the task's "
    "environment (relative to where the task runs).",
)
@click.option("--image", help="A container image to run in.")
@click.option("--no-code", is_flag=True, help="Do not capture the git checkout around here.")
@click.option("--repo", metavar="URL", help="Run a repository that is not checked out here.")
@click.option("--branch", metavar="B", help="With --repo: its branch (default: its HEAD).")
@click.option("--commit", metavar="C", help="With --repo: this commit.")
@click.option("--script", metavar="PATH", help="Run `python3 PATH` (in the repository).")
@click.option("--args", "script_args", metavar="ARGS", help="The script's arguments, as one line.")
@click.option("--clone", type=int, metavar="ID", help="A copy of task ID (same code, packages).")
@click.option("--param", "params", multiple=True, metavar="K=V", help="With --clone: a parameter.")
@click.option(
    "--sweep",
    "sweep_file",
    type=click.Path(exists=True, dir_okay=False),
    help="A JSON-lines file: one task per line, its keys fill {KEY} in the command and name.",
)
@click.option(
    "--grid",
    "grid",
    multiple=True,
    metavar="KEY=V1,V2",
    help="One task per combination of the grids' values (with --sweep: per line and combination).",
)
@click.option("--wait", is_flag=True, help="Wait for the task to end; exit with its status.")
@click.option("--json", "as_json", is_flag=True, help="Print the task as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def submit(
    resource: str | None,
    project: str,
    name: str,
    env: tuple[str, ...],
    requirements: tuple[str, ...],
    requirements_local: str | None,
    requirements_file: str | None,
    image: str | None,
    no_code: bool,
    repo: str | None,
    branch: str | None,
    commit: str | None,
    script: str | None,
    script_args: str | None,
    clone: int | None,
    params: tuple[str, ...],
    sweep_file: str | None,
    grid: tuple[str, ...],
    wait: bool,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Submit COMMAND as a task: klique submit [OPTIONS] -- CMD ARGS...

    Or a script of a repository that is not checked out (--repo URL --branch B --script PATH
    --args ...), or a copy of an earlier task with edited parameters (--clone ID --param K=V).

    A sweep: one task per line of --sweep FILE and per combination of --grid KEY=V1,V2; their
    values fill the {KEY} placeholders of each argument (never a shell string)."""
    client = Client()
    sweeping = sweep_file is not None or bool(grid)
    if sweeping and clone is not None:
        raise click.UsageError("--sweep and --grid make new tasks: they do not go with --clone")
    if clone is not None:
        task = client.post(
            f"/sdk/tasks/{clone}/clone",
            {
                "parameters": cli_submit.pairs(params, "--param", json_values=True),
                "resource": resource,
                "name": name or None,
            },
        )
        code = None
    else:
        if params:
            raise click.UsageError("--param edits a clone's parameters: give --clone ID too")
        argv = cli_submit.argv(command, script, script_args)
        code = cli_submit.code(no_code, repo, branch, commit)
        packages = list(requirements) + cli_submit.requirement_lines(requirements_local)
        body = {
            "command": argv,
            "resource": resource,
            "project": project,
            "name": name,
            "env": cli_submit.pairs(env, "--env"),
            "requirements": packages,
            "requirements_file": requirements_file,
            "image": image,
            "code": code.__dict__ if code else None,
        }
        if sweeping:
            cli_submit.submit_sweep(client, body, sweep_file, grid, as_json, wait)
            return
        task = client.post("/tasks", body)
    if as_json:
        click.echo(json.dumps(task, indent=2))
    else:
        where = f" from {code.repo}@{code.commit[:10]}" if code and code.commit else ""
        diff = f" + {len(code.diff.encode())} bytes of changes" if code and code.diff else ""
        copy = f" (a copy of task {clone})" if clone is not None else ""
        click.echo(f"task {task['id']} queued on {task['resource']}{where}{diff}{copy}")
        stuck = cli_submit.stuck(client, task)  # for people; programs read the task's state
        if stuck:
            click.echo(f"klique: {stuck}", err=True)
    if wait:
        task = _wait(client, task["id"], lambda t: t["state"] in FINAL)
        ended = task["state"] == "completed"
        reason = one_line(task["reason"]) if task["reason"] else "-"
        click.echo(f"task {task['id']} {task['state']}: {reason}", err=not ended)
        sys.exit(0 if ended else (task["exit_code"] or 1))


def _wait(
    client: Client, task_id: int, done: Callable[[dict[str, Any]], bool], poll_s: float = 0.3
) -> dict[str, Any]:
    while True:
        task: dict[str, Any] = client.get(f"/tasks/{task_id}")
        if done(task):
            return task
        time.sleep(poll_s)


TASK_COLUMNS = [
    ("id", "ID"),
    ("state", "STATE"),
    ("resource", "RESOURCE"),
    ("pool", "POOL"),
    ("project", "PROJECT"),
    ("name", "NAME"),
    ("exit_code", "EXIT"),
    ("reason", "REASON"),
]


@main.command("ls")
@click.option("--state", help="Only tasks in these states (comma-separated).")
@click.option("--all", "all_users", is_flag=True, help="Everyone's tasks (admin).")
@click.option("--limit", default=50, show_default=True, help="At most this many (up to 1000).")
@click.option("--before", type=int, help="Only tasks older than this id (the next page).")
@click.option("--sweep", type=int, metavar="ID", help="Only the tasks of sweep ID.")
@click.option("--project", "-p", metavar="P", help="Only the tasks of project P.")
@json_option
def list_tasks(
    state: str | None,
    all_users: bool,
    limit: int,
    before: int | None,
    sweep: int | None,
    project: str | None,
    as_json: bool,
) -> None:
    """List your tasks, newest first, a page at a time."""
    if sweep is not None:
        if state or all_users or project:
            raise click.UsageError(
                "--sweep lists all of a sweep's tasks: no --state, --all or --project"
            )
        rows = Client().get(f"/sweeps/{sweep}/tasks", limit=limit, before=before)
    else:
        rows = Client().get(
            "/tasks",
            state=state,
            all_users=all_users or None,
            limit=limit,
            before=before,
            project=project,
        )
    listing(rows, as_json, TASK_COLUMNS, no_tasks(state or project, sweep, before))


def no_tasks(state: str | None, sweep: int | None, before: int | None) -> str:
    """What an empty task listing says: why it may be empty, and what to do next."""
    if sweep is not None:
        return f"sweep {sweep} has no tasks here; `klique ls` lists yours"
    if state or before is not None:
        return "no tasks match; list them all with `klique ls`"
    return "no tasks yet; submit one with `klique submit -- python train.py`"


@main.command()
@click.argument("task_id", type=int)
@json_option
def show(task_id: int, as_json: bool) -> None:
    """Show one task: its command, code, parameters, state history, scalars, artifacts; for a
    pipeline, the graph of its steps with each step's state."""
    client = Client()
    task = client.get(f"/tasks/{task_id}")
    if as_json:
        click.echo(json.dumps(task, indent=2))
        return
    for key in (
        "id",
        "name",
        "owner",
        "team",
        "project",
        "resource",
        "pool",
        "state",
        "reason",
        "exit_code",
        "native_id",
        "job_dir",
    ):
        click.echo(f"{key + ':':11} {cell(task[key])}")
    click.echo(f"{'command:':11} {' '.join(task['command'])}")
    if task.get("gpu_ids"):
        click.echo(f"{'gpus:':11} {', '.join(str(n) for n in task['gpu_ids'])}")
    if task.get("claim") and task["state"] not in FINAL:
        claim = task["claim"]
        click.echo(
            f"{'claim:':11} its runner reports {claim['outcome']} (exit code "
            f"{claim['exit_code']}); final once the pool sees the job end"
        )
    if task.get("code"):
        code = task["code"]
        click.echo(
            f"{'code:':11} {code['repo'] or code['workdir']}@{code['commit']} "
            f"(+{code['diff_bytes']} bytes of diff)"
        )
    cli_sdk.show_record(task)
    click.echo("history:")
    for e in task["events"]:
        click.echo(f"  {when(e['time'])}  {e['from']:>9} -> {e['to']:<9} {e['reason']}")
    if task["scalars"]:
        click.echo("scalars:")
        for s in task["scalars"]:
            click.echo(
                f"  {s['name']} = {s['value']:g}"
                + (f" (step {s['step']})" if s["step"] is not None else "")
            )
    cli_sdk.show_steps(client, task_id)


@main.command()
@click.argument("task_id", type=int)
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the task ends.")
@click.option(
    "--rank",
    type=click.IntRange(0, 4095),
    default=0,
    help="On several nodes: this rank's console (0, the default, is the task's).",
)
def logs(task_id: int, follow: bool, rank: int) -> None:
    """Print a task's console."""
    follow_logs(Client(), task_id, follow, rank=rank)


def follow_logs(
    client: Client, task_id: int, follow: bool, poll_s: float = 0.3, rank: int = 0
) -> dict[str, Any]:
    offset = 0
    where = {"rank": rank} if rank else {}
    while True:
        chunk = client.get(f"/tasks/{task_id}/logs", offset=offset, **where)
        if chunk["text"]:
            click.echo(chunk["text"], nl=False)
            offset = chunk["offset"]
            continue
        if not follow or chunk["final"]:
            return chunk
        time.sleep(poll_s)


@main.command()
@click.argument("task_ids", type=int, nargs=-1)
@click.option("--sweep", type=int, metavar="ID", help="Cancel every task of sweep ID.")
def cancel(task_ids: tuple[int, ...], sweep: int | None) -> None:
    """Cancel tasks, queued or running (or all of a sweep's)."""
    client = Client()
    if sweep is not None:
        if task_ids:
            raise click.UsageError("give task ids or --sweep ID, not both")
        states = client.post(f"/sweeps/{sweep}/cancel")["states"]
        click.echo(f"sweep {sweep}: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())))
        return
    if not task_ids:
        raise click.UsageError("give the ids of the tasks to cancel, or --sweep ID")
    for task_id in task_ids:
        task = client.post(f"/tasks/{task_id}/cancel")
        click.echo(f"task {task['id']} {task['state']}")


@main.command()
@click.argument("task_id", type=int)
@json_option
def why(task_id: int, as_json: bool) -> None:
    """Explain why a task is waiting."""
    answer = Client().get(f"/tasks/{task_id}/why")
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    if not answer["waiting"]:
        click.echo(f"task {task_id} is not waiting: it is {answer['state']} ({answer['detail']})")
        return
    click.echo(f"task {task_id} waits [{answer['primary']}]: {answer['reason']}")
    for pool, reason in answer["pools"].items():
        click.echo(f"  {pool}: {reason}")


@main.command()
@json_option
def resources(as_json: bool) -> None:
    """List the compute resources and their profiles."""
    rows = Client().get("/resources")
    for r in rows:
        r["gpu"] = (
            (r["gpu_fraction"] and f"{r['gpu_fraction']:g}")
            or (r["gpu_memory_mb"] and f"{r['gpu_memory_mb']}M")
            or r["gpus"]
        )
        r["memory"] = f"{r['memory_mb']}M"
        r["walltime"] = str(dt.timedelta(seconds=r["walltime_s"]))
    listing(
        rows,
        as_json,
        [
            ("name", "RESOURCE"),
            ("gpu", "GPUS"),
            ("cpus", "CPUS"),
            ("memory", "MEMORY"),
            ("walltime", "WALLTIME"),
            ("pools", "POOLS"),
            ("permitted", "YOURS"),
            ("description", "DESCRIPTION"),
        ],
    )


@main.command()
@json_option
def pools(as_json: bool) -> None:
    """List the pools and what they reported last."""
    rows = Client().get("/pools")
    if not as_json:
        rows = [dict(row, last_good=when(row.get("last_good"))) for row in rows]
    listing(
        rows,
        as_json,
        [
            ("name", "POOL"),
            ("kind", "KIND"),
            ("reachable", "UP"),
            ("last_good", "LAST GOOD ANSWER"),
            ("free_slots", "FREE SLOTS"),
            ("free_gpus", "FREE GPUS"),
            ("queued", "QUEUED"),
            ("unknown_jobs", "UNKNOWN JOBS"),
            ("reason", "REASON"),
        ],
        "the estate has no pools; the platform team adds them under pools: in the estate",
    )


@main.command()
@click.option("--stop", is_flag=True, help="Stop the server the demo started.")
def demo(stop: bool) -> None:
    """Start a local server if none runs, submit a small task and follow it to the end."""
    from broker import demo as demo_module

    if stop:
        demo_module.stop()
    else:
        demo_module.run()


def _register_platform_commands() -> None:
    from broker import cli_apps, cli_platform

    cli_sdk.register(main)
    main.add_command(cli_apps.app)
    for command in (
        cli_platform.estate,
        cli_platform.token,
        cli_platform.template,
        cli_platform.usage,
        cli_platform.policy,
        cli_platform.agent,
    ):
        main.add_command(command)


_register_platform_commands()
