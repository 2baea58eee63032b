"""`klique submit`: a command, a script of a repository, a copy of an earlier task, or a sweep.
What it sends: KEY=VALUE pairs, the command (or a script), the code (the checkout here, or a
repository that is not checked out) and a requirements file's lines."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from broker import sweeps
from broker.cli import progress
from broker.cli.tasks import FINAL
from broker.client import ApiError, Client, one_line
from broker.codecapture import capture, remote_commit
from broker.domain import CodeSpec


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
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
                "parameters": pairs(params, "--param", json_values=True),
                "resource": resource,
                "name": name or None,
            },
        )
        code = None
    else:
        if params:
            raise click.UsageError("--param edits a clone's parameters: give --clone ID too")
        argv = task_argv(command, script, script_args)
        code = task_code(no_code, repo, branch, commit)
        packages = list(requirements) + requirement_lines(requirements_local)
        body = {
            "command": argv,
            "resource": resource,
            "project": project,
            "name": name,
            "env": pairs(env, "--env"),
            "requirements": packages,
            "requirements_file": requirements_file,
            "image": image,
            "code": code.__dict__ if code else None,
        }
        if sweeping:
            submit_sweep(client, body, sweep_file, grid, as_json, wait)
            return
        task = client.post("/tasks", body, sending=progress.sending("the task and its code"))
    if as_json:
        click.echo(json.dumps(task, indent=2))
    else:
        where = f" from {code.repo}@{code.commit[:10]}" if code and code.commit else ""
        diff = f" + {len(code.diff.encode())} bytes of changes" if code and code.diff else ""
        copy = f" (a copy of task {clone})" if clone is not None else ""
        click.echo(f"task {task['id']} queued on {task['resource']}{where}{diff}{copy}")
        stuck = stuck_reason(client, task)  # for people; programs read the task's state
        if stuck:
            click.echo(f"klique: {stuck}", err=True)
    if wait:
        task = wait_for(client, task["id"], lambda t: t["state"] in FINAL)
        ended = task["state"] == "completed"
        reason = one_line(task["reason"]) if task["reason"] else "-"
        click.echo(f"task {task['id']} {task['state']}: {reason}", err=not ended)
        sys.exit(0 if ended else (task["exit_code"] or 1))


def wait_for(
    client: Client, task_id: int, done: Callable[[dict[str, Any]], bool], poll_s: float = 0.3
) -> dict[str, Any]:
    """The task as the API shows it once `done` holds for it."""
    while True:
        task: dict[str, Any] = client.get(f"/tasks/{task_id}")
        if done(task):
            return task
        time.sleep(poll_s)


def pairs(items: tuple[str, ...], option: str, json_values: bool = False) -> dict[str, Any]:
    """KEY=VALUE items; with json_values, a value that reads as JSON is that value (0.01)."""
    found: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=option)
        found[key] = value
        if json_values:
            with contextlib.suppress(ValueError):
                found[key] = json.loads(value)
    return found


def task_argv(command: tuple[str, ...], script: str | None, script_args: str | None) -> list[str]:
    """What the task runs: the command after --, or `python3 SCRIPT ARGS...`."""
    if script is not None:
        return ["python3", script, *shlex.split(script_args or ""), *command]
    if script_args is not None:
        raise click.UsageError("--args goes with --script PATH")
    if not command:
        raise click.UsageError("give the command after --, or --script PATH, or --clone ID")
    return list(command)


def task_code(
    no_code: bool, repo: str | None, branch: str | None, commit: str | None
) -> CodeSpec | None:
    """The code the task runs: the checkout around here (with its uncommitted changes), a
    repository's commit, or none."""
    if repo is None:
        if branch or commit:
            raise click.UsageError("--branch and --commit go with --repo URL")
        return None if no_code else capture(Path.cwd())
    if commit is None:
        commit = remote_commit(repo, branch or "HEAD")
    return CodeSpec(repo=repo, commit=commit)


def requirement_lines(path: str | None) -> list[str]:
    """A requirements file's packages, without comments and blank lines."""
    if path is None:
        return []
    lines = (line.split("#", 1)[0].strip() for line in Path(path).read_text().splitlines())
    return [line for line in lines if line]


def submit_sweep(
    client: Any,
    body: dict[str, Any],
    sweep_file: str | None,
    grid_items: tuple[str, ...],
    as_json: bool,
    wait: bool,
) -> None:
    """One task per set of parameters, made together as one sweep (all or none)."""
    lines = sweeps.read_lines(Path(sweep_file)) if sweep_file else []
    points = sweeps.combine(lines, sweeps.grid(grid_items))
    tasks = [
        dict(
            body,
            command=[sweeps.fill(arg, params, where) for arg in body["command"]],
            name=sweeps.fill(body["name"], params, where),
            parameters=params,
        )
        for where, params in points
    ]
    name = Path(sweep_file).name if sweep_file else " ".join(grid_items)
    sweep = {"name": name[:200], "tasks": tasks}
    made = client.post("/sweeps", sweep, sending=progress.sending(f"{len(tasks)} tasks"))
    ids = [t["id"] for t in made["tasks"]]
    if as_json:
        click.echo(json.dumps(made, indent=2))
    else:
        click.echo(f"sweep {made['sweep']}: {len(ids)} tasks queued (ids {ids[0]}-{ids[-1]})")
    if wait:
        sys.exit(wait_sweep(client, int(made["sweep"])))


def wait_sweep(client: Any, sweep: int, poll_s: float = 0.5) -> int:
    """Wait until every task of the sweep has ended, its finished tasks and its counts by
    state on a bar meanwhile (on a terminal); 0 if all completed, else 1."""
    with contextlib.closing(progress.sweep_bar(sweep)) as bar:
        while True:
            states: dict[str, int] = client.get(f"/sweeps/{sweep}")["states"]
            progress.show_sweep(bar, states, FINAL)
            if set(states) <= FINAL:
                break
            time.sleep(poll_s)
    click.echo(f"sweep {sweep}: {progress.by_state(states)}")
    return 0 if set(states) == {"completed"} else 1


def stuck_reason(client: Any, task: dict[str, Any]) -> str | None:
    """Why a queued task cannot start in any pool of its compute resource (None: some pool
    may start it): each pool found a problem at start that stops it taking any task."""
    if task.get("state") != "queued":
        return None
    try:
        resources, pools = client.get("/resources"), client.get("/pools")
    except ApiError:  # a token that may submit but not read: the task is queued all the same
        return None
    profile = next((r for r in resources if r["name"] == task["resource"]), None)
    states = {p["name"]: p for p in pools}
    if profile is None or not profile["pools"]:
        return None
    seen = [states.get(name) or {} for name in profile["pools"]]
    if not all(_stopped(p) for p in seen):
        return None
    reasons = "; ".join(str(p["reason"]) for p in seen)
    return f"task {task['id']} is queued, but no pool of {task['resource']} can start it: {reasons}"


def _stopped(pool: dict[str, Any]) -> bool:
    """A pool that answered with a problem (not one that is only slow, or not yet asked)."""
    return bool(pool) and not pool["reachable"] and pool["reason"] not in ("", "not polled yet")
