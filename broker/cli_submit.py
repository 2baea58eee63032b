"""What `klique submit` sends: KEY=VALUE pairs, the command (or a script), the code (the
checkout here, or a repository that is not checked out) and a requirements file's lines."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import click

from broker.client import ApiError


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


def argv(command: tuple[str, ...], script: str | None, script_args: str | None) -> list[str]:
    if script is not None:
        return ["python3", script, *shlex.split(script_args or ""), *command]
    if script_args is not None:
        raise click.UsageError("--args goes with --script PATH")
    if not command:
        raise click.UsageError("give the command after --, or --script PATH, or --clone ID")
    return list(command)


def code(no_code: bool, repo: str | None, branch: str | None, commit: str | None) -> Any:
    from broker.codecapture import capture, remote_commit
    from broker.domain import CodeSpec

    if repo is None:
        if branch or commit:
            raise click.UsageError("--branch and --commit go with --repo URL")
        return None if no_code else capture(Path.cwd())
    if commit is None:
        commit = remote_commit(repo, branch or "HEAD")
    return CodeSpec(repo=repo, commit=commit)


def requirement_lines(path: str | None) -> list[str]:
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
    from broker import sweeps

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
    made = client.post("/sweeps", {"name": name[:200], "tasks": tasks})
    ids = [t["id"] for t in made["tasks"]]
    if as_json:
        click.echo(json.dumps(made, indent=2))
    else:
        click.echo(f"sweep {made['sweep']}: {len(ids)} tasks queued (ids {ids[0]}-{ids[-1]})")
    if wait:
        sys.exit(wait_sweep(client, int(made["sweep"])))


def wait_sweep(client: Any, sweep: int, poll_s: float = 0.5) -> int:
    """Wait until every task of the sweep has ended; 0 if all completed, else 1."""
    final = {"completed", "failed", "cancelled", "timeout", "lost"}
    while True:
        states: dict[str, int] = client.get(f"/sweeps/{sweep}")["states"]
        if set(states) <= final:
            break
        time.sleep(poll_s)
    click.echo(f"sweep {sweep}: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())))
    return 0 if set(states) == {"completed"} else 1


def stuck(client: Any, task: dict[str, Any]) -> str | None:
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
