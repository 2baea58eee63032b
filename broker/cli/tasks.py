"""The commands on tasks once submitted: ls, show, logs, why, cancel; and what they run on,
resources and pools. Thin: each calls the API and prints its answer."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from typing import Any

import click

from broker.cli import progress, sdk
from broker.cli.datasets import show_reads
from broker.cli.output import cell, json_option, listing, when
from broker.client import Client
from broker.domain import FINAL_STATES

# The states the API names once a task has ended, for the commands that wait for that.
FINAL = frozenset(state.value for state in FINAL_STATES)
# A followed task's state is asked this often, for its stage line (on a terminal only).
STAGE_EVERY_S = 1.0

TASK_COLUMNS = [
    ("id", "ID"),
    ("state", "STATE"),
    ("resource", "RESOURCE"),
    ("pool", "POOL"),
    ("project", "PROJECT"),
    ("name", "NAME"),
    ("tags", "TAGS"),
    ("exit_code", "EXIT"),
    ("reason", "REASON"),
]


@click.command("ls")
@click.option("--state", help="Only tasks in these states (comma-separated).")
@click.option("--all", "all_users", is_flag=True, help="Everyone's tasks (admin).")
@click.option("--limit", default=50, show_default=True, help="At most this many (up to 1000).")
@click.option("--before", type=int, help="Only tasks older than this id (the next page).")
@click.option("--sweep", type=int, metavar="ID", help="Only the tasks of sweep ID.")
@click.option("--project", "-p", metavar="P", help="Only the tasks of project P.")
@click.option("--tag", "tag", metavar="TAG", help="Only the tasks tagged TAG.")
@click.option("--team", is_flag=True, help="Your team's tasks (yours and your teammates').")
@click.option("--archived", is_flag=True, help="The archived tasks (hidden otherwise).")
@json_option
def list_tasks(
    state: str | None,
    all_users: bool,
    limit: int,
    before: int | None,
    sweep: int | None,
    project: str | None,
    tag: str | None,
    team: bool,
    archived: bool,
    as_json: bool,
) -> None:
    """List your tasks, newest first, a page at a time (archived ones with --archived only)."""
    if sweep is not None:
        if state or all_users or project or tag or team or archived:
            raise click.UsageError(
                "--sweep lists all of a sweep's tasks: no --state, --all, --project, --tag, "
                "--team or --archived"
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
            tag=tag,
            team=team or None,
            archived=archived or None,
        )
    listing(rows, as_json, TASK_COLUMNS, no_tasks(state or project or tag, sweep, before))


def no_tasks(state: str | None, sweep: int | None, before: int | None) -> str:
    """What an empty task listing says: why it may be empty, and what to do next."""
    if sweep is not None:
        return f"sweep {sweep} has no tasks here; `klique ls` lists yours"
    if state or before is not None:
        return "no tasks match; list them all with `klique ls`"
    return "no tasks yet; submit one with `klique submit -- python train.py`"


@click.command()
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
    if task.get("tags") or task.get("archived"):
        archived = " (archived)" if task.get("archived") else ""
        click.echo(f"{'tags:':11} {cell(task.get('tags') or None)}{archived}")
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
    sdk.show_record(task)
    show_reads(task)
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
    sdk.show_steps(client, task_id)


@click.command()
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
    """Print the console from its start; with `follow`, until the task ends, with a line on
    a terminal's standard error that says the task's stage (waiting, building the
    environment, running). Returns the last chunk the API answered (`final` says whether the
    console is complete)."""
    offset = 0
    where = {"rank": rank} if rank else {}
    line = progress.StageLine(task_id) if follow else progress.StageLine.quiet(task_id)
    runner = progress.RunnerLines()
    asked = 0.0
    with contextlib.closing(line):
        while True:
            chunk = client.get(f"/tasks/{task_id}/logs", offset=offset, **where)
            if chunk["text"]:
                runner.feed(chunk["text"])
                line.echo(chunk["text"])
                offset = chunk["offset"]
                continue
            if not follow or chunk["final"]:
                return chunk
            if line.shown and time.monotonic() - asked >= STAGE_EVERY_S:
                asked = time.monotonic()
                state = client.get(f"/tasks/{task_id}")["state"]
                line.say(progress.stage(state, runner.last, FINAL))
            time.sleep(poll_s)


@click.command()
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


@click.command()
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


@click.command()
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


@click.command()
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
