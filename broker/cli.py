"""The `klique` command. Thin: every command but `server` and `estate check` calls the API."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from broker import config
from broker.client import Client, save_token
from broker.errors import EstateError, KliqueError

FINAL = {"completed", "failed", "cancelled", "timeout", "lost"}


class KliqueGroup(click.Group):
    """Turns Klique's errors into one line on stderr and a non-zero exit."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EstateError as exc:
            for problem in exc.problems:
                click.echo(problem, err=True)
            sys.exit(2)
        except KliqueError as exc:
            click.echo(f"klique: {exc}", err=True)
            sys.exit(1)


@click.group(cls=KliqueGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="klique")
def main() -> None:
    """Klique: send tasks to compute resources on Slurm, PBS, LSF and bare-metal pools."""


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> None:
    if not rows:
        click.echo("(none)")
        return
    cells = [[_cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(head), *(len(c[i]) for c in cells)) for i, (_, head) in enumerate(columns)]
    click.echo(
        "  ".join(head.ljust(w) for (_, head), w in zip(columns, widths, strict=True)).rstrip()
    )
    for c in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value).replace("\n", " ")


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _listing(rows: list[dict[str, Any]], as_json: bool, columns: Sequence[tuple[str, str]]) -> None:
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        _table(rows, columns)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


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
def server(estate_path: str | None, host: str, port: int) -> None:
    """Run the API, the scheduler and the pool agents in this process."""
    from broker.estate import builtin_estate, load_estate
    from broker.server import serve

    home = config.home()
    default = home / "estate.yaml"
    if estate_path is None and default.exists():
        estate_path = str(default)
    estate = load_estate(estate_path) if estate_path else builtin_estate()
    serve(estate, home, config.store_url(), host, port)


@main.group()
def estate() -> None:
    """Check the estate file."""


@estate.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
def estate_check(path: str) -> None:
    """Validate an estate file; every problem names the file, the line, the field and the fix."""
    from broker.estate import load_estate

    loaded = load_estate(path)
    click.echo(
        f"{path}: ok ({len(loaded.resources)} compute resources, {len(loaded.pools)} pools, "
        f"{len(loaded.policies)} policies, {len(loaded.teams)} teams)"
    )


@main.command()
@click.option("--token", help="The token (default: ask for it).")
@click.option("--api", help="The server's URL (default: $KLIQUE_API or the local server).")
def login(token: str | None, api: str | None) -> None:
    """Store a token for the server, after checking that the server accepts it."""
    token = token or click.prompt("token", hide_input=True)
    client = Client(api=api, token=token)
    me = client.get("/whoami")
    path = save_token(client.api, token)
    click.echo(f"logged in to {client.api} as {me['user']} (token kept in {path})")


@main.group()
def token() -> None:
    """Make tokens for users (admin only)."""


@token.command("create")
@click.argument("user")
@click.option("--admin", is_flag=True, help="Make an admin token.")
def token_create(user: str, admin: bool) -> None:
    """Print a new token for USER."""
    click.echo(Client().post("/tokens", {"user": user, "admin": admin})["token"])


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
    "--requirements-file",
    metavar="PATH",
    help="requirements.txt, pyproject.toml or uv.lock in the code, for the task's "
    "environment (relative to where the task runs).",
)
@click.option("--image", help="A container image to run in.")
@click.option("--no-code", is_flag=True, help="Do not capture the git checkout around here.")
@click.option("--wait", is_flag=True, help="Wait for the task to end; exit with its status.")
@click.option("--json", "as_json", is_flag=True, help="Print the task as JSON.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def submit(
    resource: str | None,
    project: str,
    name: str,
    env: tuple[str, ...],
    requirements: tuple[str, ...],
    requirements_file: str | None,
    image: str | None,
    no_code: bool,
    wait: bool,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Submit COMMAND as a task: klique submit [OPTIONS] -- CMD ARGS..."""
    from broker.codecapture import capture

    variables = {}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--env")
        variables[key] = value
    code = None if no_code else capture(Path.cwd())
    body = {
        "command": list(command),
        "resource": resource,
        "project": project,
        "name": name,
        "env": variables,
        "requirements": list(requirements),
        "requirements_file": requirements_file,
        "image": image,
        "code": code.__dict__ if code else None,
    }
    client = Client()
    task = client.post("/tasks", body)
    if as_json:
        click.echo(json.dumps(task, indent=2))
    else:
        where = f" from {code.repo}@{code.commit[:10]}" if code and code.commit else ""
        diff = f" + {len(code.diff.encode())} bytes of changes" if code and code.diff else ""
        click.echo(f"task {task['id']} queued on {task['resource']}{where}{diff}")
    if wait:
        task = _wait(client, task["id"], lambda t: t["state"] in FINAL)
        click.echo(f"task {task['id']} {task['state']}: {task['reason']}")
        sys.exit(0 if task["state"] == "completed" else (task["exit_code"] or 1))


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
@click.option("--limit", default=50, show_default=True)
@json_option
def list_tasks(state: str | None, all_users: bool, limit: int, as_json: bool) -> None:
    """List your tasks, newest first."""
    rows = Client().get("/tasks", state=state, all_users=all_users or None, limit=limit)
    _listing(rows, as_json, TASK_COLUMNS)


@main.command()
@click.argument("task_id", type=int)
@json_option
def show(task_id: int, as_json: bool) -> None:
    """Show one task: its command, code, state history and scalars."""
    task = Client().get(f"/tasks/{task_id}")
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
        click.echo(f"{key + ':':11} {_cell(task[key])}")
    click.echo(f"{'command:':11} {' '.join(task['command'])}")
    if task.get("code"):
        code = task["code"]
        click.echo(
            f"{'code:':11} {code['repo']}@{code['commit']} (+{code['diff_bytes']} bytes of diff)"
        )
    click.echo("history:")
    for e in task["events"]:
        click.echo(f"  {_when(e['time'])}  {e['from']:>9} -> {e['to']:<9} {e['reason']}")
    if task["scalars"]:
        click.echo("scalars:")
        for s in task["scalars"]:
            click.echo(
                f"  {s['name']} = {s['value']:g}"
                + (f" (step {s['step']})" if s["step"] is not None else "")
            )


@main.command()
@click.argument("task_id", type=int)
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the task ends.")
def logs(task_id: int, follow: bool) -> None:
    """Print a task's console."""
    follow_logs(Client(), task_id, follow)


def follow_logs(client: Client, task_id: int, follow: bool, poll_s: float = 0.3) -> dict[str, Any]:
    offset = 0
    while True:
        chunk = client.get(f"/tasks/{task_id}/logs", offset=offset)
        if chunk["text"]:
            click.echo(chunk["text"], nl=False)
            offset = chunk["offset"]
            continue
        if not follow or chunk["final"]:
            return chunk
        time.sleep(poll_s)


@main.command()
@click.argument("task_ids", type=int, nargs=-1, required=True)
def cancel(task_ids: tuple[int, ...]) -> None:
    """Cancel tasks, queued or running."""
    client = Client()
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
    click.echo(f"task {task_id} waits [{answer['primary']}]: {answer['sentence']}")
    click.echo(f"  {answer['detail']}")
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
    _listing(
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
    _listing(
        rows,
        as_json,
        [
            ("name", "POOL"),
            ("kind", "KIND"),
            ("reachable", "UP"),
            ("free_slots", "FREE SLOTS"),
            ("free_gpus", "FREE GPUS"),
            ("queued", "QUEUED"),
            ("unknown_jobs", "UNKNOWN JOBS"),
            ("reason", "REASON"),
        ],
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


@main.group()
def template() -> None:
    """Preview the batch scripts Klique submits."""


@template.command("render")
@click.option("--resource", "-r", required=True, help="The compute resource.")
@click.option("--pool", help="The pool (default: the first batch pool in the profile's order).")
@click.option("--task", "task_id", type=int, help="Render for this task (fetched from the API).")
@click.option(
    "--spec",
    "spec_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Render for a task spec in a JSON file (command, name, env, ...).",
)
@click.option("--owner", help="The Klique user to render for (default: the first mapped user).")
@click.option(
    "--estate",
    "estate_path",
    type=click.Path(dir_okay=False),
    help="The estate file (default: $KLIQUE_HOME/estate.yaml).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Also run bash -n and, where the pool is reachable, the scheduler's test-only submission.",
)
def template_render(
    resource: str,
    pool: str | None,
    task_id: int | None,
    spec_file: str | None,
    owner: str | None,
    estate_path: str | None,
    check: bool,
) -> None:
    """Print the exact script that would be submitted."""
    from dataclasses import replace

    from broker.domain import spec_from_dict
    from broker.estate import load_estate
    from broker.preview import render_preview, sample_task

    estate_file = Path(estate_path) if estate_path else config.home() / "estate.yaml"
    loaded = load_estate(estate_file)
    task = sample_task(loaded, resource, owner)
    if task_id is not None:
        shown = Client().get(f"/tasks/{task_id}")
        task = replace(
            task,
            id=task_id,
            owner=shown["owner"],
            spec=replace(
                task.spec,
                command=tuple(shown["command"]),
                name=shown["name"],
                project=shown["project"],
            ),
        )
    elif spec_file is not None:
        data = json.loads(Path(spec_file).read_text())
        task = replace(task, spec=spec_from_dict({"resource": resource, **data}))
    preview = render_preview(loaded, task, pool, check)
    click.echo(preview.script, nl=False)
    for line in preview.checks:
        click.echo(f"# {line}", err=True)
    if not preview.ok:
        sys.exit(1)


@main.command()
@click.option(
    "--by",
    type=click.Choice(["team", "project", "user", "pool", "resource"]),
    default="team",
    show_default=True,
    help="What to sum the runs by.",
)
@click.option(
    "--since",
    metavar="WHEN",
    help="Only use from then on: 7d, 12h, 30m ago, a date (2026-11-01), or Unix seconds.",
)
@json_option
def usage(by: str, since: str | None, as_json: bool) -> None:
    """GPU-seconds and wall time from the ledger (yours; everyone's with an admin token)."""
    from broker.usage import parse_since

    start = None
    if since is not None:
        try:
            start = parse_since(since, time.time())
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from None
    answer = Client().get("/usage", by=by, since=start)
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    rows = answer["rows"]
    for row in rows:
        row["gpu_seconds"] = f"{row['gpu_seconds']:.1f}"
        row["gpu_hours"] = f"{row['gpu_hours']:.3f}"
        row["wall_seconds"] = f"{row['wall_seconds']:.1f}"
    window = f"since {_when(answer['since'])}" if answer["since"] is not None else "all time"
    whose = "everyone" if answer["everyone"] else "your runs only"
    click.echo(f"usage by {by}, {window} until {_when(answer['until'])} ({whose})")
    _table(
        rows,
        [
            ("key", by.upper()),
            ("runs", "RUNS"),
            ("ongoing", "ONGOING"),
            ("gpu_seconds", "GPU-SECONDS"),
            ("gpu_hours", "GPU-HOURS"),
            ("wall_seconds", "WALL-SECONDS"),
        ],
    )


@main.group()
def policy() -> None:
    """Try a changed estate before it goes live."""


@policy.command("simulate")
@click.option(
    "--estate",
    "estate_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The changed estate file.",
)
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False),
    help="Replay this recorded JSON trace here instead of the server's current queue.",
)
@click.option(
    "--save-trace",
    "save_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Also write the server's queue, active tasks and pool states here, for --trace.",
)
@json_option
def policy_simulate(
    estate_path: str, trace_path: str | None, save_path: str | None, as_json: bool
) -> None:
    """Say what would start where, and who would wait, if NEW.yaml were the estate now."""
    from broker.estate import parse_estate
    from broker.simulate import parse_trace, simulate

    text = _read_text(estate_path, "estate file")
    new = parse_estate(text, estate_path)  # file:line errors before anything else happens
    if trace_path is not None:
        if save_path is not None:
            raise click.UsageError("--save-trace records a server's queue; drop it with --trace")
        trace = parse_trace(_read_text(trace_path, "trace"), trace_path)
        answer = simulate(new, trace.queued, trace.active, trace.pools, trace.usage, trace.now)
        result = answer.to_dict()
    else:
        body = {"estate": text, "source": estate_path, "include_trace": save_path is not None}
        result = Client().post("/policy/simulate", body)
        if save_path is not None:
            Path(save_path).write_text(json.dumps(result.pop("trace"), indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    _show_simulation(result, estate_path, trace_path)
    if save_path is not None:
        click.echo(f"trace written to {save_path} (replay it with --trace {save_path})")


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise KliqueError(f"{path}: cannot read the {what}: {exc.strerror}") from exc


def _show_simulation(result: dict[str, Any], estate_path: str, trace_path: str | None) -> None:
    source = f"the trace {trace_path}" if trace_path else "the server's current queue"
    click.echo(
        f"one placement cycle under {estate_path}, over {source} "
        f"({result['queued']} queued, {result['active']} active):"
    )
    for task in result["tasks"]:
        who = f"{task['owner']}, {task['team'] or '(no team)'}, {task['resource']}"
        click.echo(f"  task {task['id']} ({who}): {task['sentence']}")
        for pool, why in task["pools"].items():
            click.echo(f"      {pool}: {why}")
    for key, words in (
        ("preempted", "would be preempted to hand a reservation back"),
        ("withdrawn", "would be withdrawn from its pool's queue (spill-over)"),
    ):
        for task_id in result[key]:
            click.echo(f"  active task {task_id} {words}")
    if result["assumed_pools"]:
        click.echo(
            "  no recorded state for pools "
            + ", ".join(result["assumed_pools"])
            + ": taken as reachable, with nothing free beyond what Klique counts itself"
        )
    click.echo("by team:")
    rows = [
        {
            **team,
            "pools": ", ".join(f"{p}: {n}" for p, n in team["pools"].items()) or "-",
            "reasons": ", ".join(f"{r}: {n}" for r, n in team["reasons"].items()) or "-",
        }
        for team in result["teams"]
    ]
    _table(
        rows,
        [
            ("team", "TEAM"),
            ("tasks", "TASKS"),
            ("start", "START"),
            ("wait", "WAIT"),
            ("pools", "WHERE"),
            ("reasons", "WHY WAITING"),
        ],
    )
