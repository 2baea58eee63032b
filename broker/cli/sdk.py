"""The CLI's commands for the SDK's record: artifacts, compare, and a pipeline's graph."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import click

from broker.cli import progress
from broker.cli.output import cell, json_option, listing, table
from broker.client import Client

STATE_MARKS = {
    "completed": "done",
    "running": "running",
    "failed": "FAILED",
    "cancelled": "cancelled",
    "timeout": "TIMEOUT",
    "lost": "LOST",
}


class _ArtifactsGroup(click.Group):
    """`klique artifacts ID` lists; `klique artifacts get ID NAME` downloads."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        if args and args[0].isdigit():
            args.insert(0, "list")
        return super().resolve_command(ctx, args)


@click.group(cls=_ArtifactsGroup)
def artifacts() -> None:
    """A task's artifacts: `klique artifacts ID`, `klique artifacts get ID NAME`."""


@artifacts.command("list")
@click.argument("task_id", type=int)
@json_option
def artifacts_list(task_id: int, as_json: bool) -> None:
    """List a task's artifacts."""
    rows = Client().get(f"/tasks/{task_id}/artifacts")
    listing(
        rows,
        as_json,
        [
            ("name", "NAME"),
            ("kind", "KIND"),
            ("size", "BYTES"),
            ("filename", "FILE"),
            ("digest", "SHA256"),
        ],
    )


@artifacts.command("get")
@click.argument("task_id", type=int)
@click.argument("name")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Where to write it.")
def artifacts_get(task_id: int, name: str, output: str | None) -> None:
    """Download one artifact (default: into this folder, under its file name)."""
    client = Client()
    found = {a["name"]: a for a in client.get(f"/tasks/{task_id}/artifacts")}
    if name not in found:
        known = ", ".join(found) or "none"
        raise click.ClickException(f"task {task_id} has no artifact {name!r} (it has: {known})")
    # The file name comes from the server's pattern (no folders); -o names any path.
    dest = Path(output or Path(found[name]["filename"]).name or name)
    counter = functools.partial(progress.byte_bar, what=f"downloading {dest.name}")
    size = client.download(f"/tasks/{task_id}/artifacts/{name}", dest, counter)
    click.echo(f"{dest} ({size} bytes, {found[name]['kind']})")


@click.command()
@click.argument("task_ids", type=int, nargs=-1, required=True)
@json_option
def compare(task_ids: tuple[int, ...], as_json: bool) -> None:
    """Parameters and last scalars of tasks, side by side."""
    client = Client()
    tasks = [client.get(f"/tasks/{task_id}") for task_id in task_ids]
    rows = comparison(tasks)
    if as_json:
        click.echo(json.dumps({"tasks": list(task_ids), "rows": rows}, indent=2))
        return
    heads = [("what", ""), *((str(t["id"]), f"{t['id']} {t['name']}".strip()) for t in tasks)]
    table(rows, heads)


def comparison(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row a parameter (`param NAME`) or scalar (`last NAME`), one column a task."""
    names: dict[str, None] = {}
    for task in tasks:
        names.update(dict.fromkeys(f"param {k}" for k in task.get("parameters") or {}))
    for task in tasks:
        names.update(dict.fromkeys(f"last {s['name']}" for s in task.get("scalars") or []))
    rows = []
    for name in names:
        row: dict[str, Any] = {"what": name}
        for task in tasks:
            row[str(task["id"])] = _value(task, name)
        rows.append(row)
    return rows


def _value(task: dict[str, Any], name: str) -> Any:
    kind, _, key = name.partition(" ")
    if kind == "param":
        return (task.get("parameters") or {}).get(key)
    last = [s["value"] for s in task.get("scalars") or [] if s["name"] == key]
    return last[-1] if last else None


def show_record(task: dict[str, Any]) -> None:
    """The SDK's part of `klique show`: origin, parent, parameters, packages, artifacts."""
    if task.get("origin") and task["origin"] != "pool":
        click.echo(f"{'origin:':11} {task['origin']}")
    if task.get("parent"):
        click.echo(f"{'pipeline:':11} {task['parent']}")
    if task.get("sweep"):
        click.echo(f"{'sweep:':11} {task['sweep']} (klique ls --sweep {task['sweep']})")
    if task.get("parameters"):
        click.echo("parameters:")
        for key, value in task["parameters"].items():
            click.echo(f"  {key} = {json.dumps(value)[:200]}")
    if task.get("packages"):
        click.echo(f"{'packages:':11} {len(task['packages'])} installed (--json lists them)")
    if task.get("artifacts"):
        click.echo("artifacts:")
        for a in task["artifacts"]:
            click.echo(f"  {a['name']}  {a['kind']}  {a['size']} bytes  {a['filename']}")


def show_steps(client: Client, task_id: int) -> None:
    """A pipeline's graph: its steps by stage, each with its state and what it reads."""
    steps = client.get(f"/sdk/tasks/{task_id}/steps")
    if steps:
        click.echo("pipeline:")
        for line in draw(steps):
            click.echo(f"  {line}")


def draw(steps: list[dict[str, Any]]) -> list[str]:
    """Stages left to right (a step sits one stage after the last step it reads)."""
    by_id = {s["id"]: s for s in steps}
    stage: dict[int, int] = {}
    for s in steps:  # steps are made after the steps they read: ids are in order
        stage[s["id"]] = 1 + max((stage.get(n, -1) for n in s["needs"] if n in by_id), default=-1)
    lines = []
    for s in steps:
        box = f"[{s['id']}] {s['name']}: {STATE_MARKS.get(s['state'], s['state'])}"
        where = f" on {s['resource']}" + (f" @ {s['pool']}" if s["pool"] else "")
        needs = ", ".join(f"{by_id[n]['name']} [{n}]" for n in s["needs"] if n in by_id)
        arrow = f"  <- {needs}" if needs else ""
        lines.append(
            "    " * stage[s["id"]] + ("└─ " if stage[s["id"]] else "") + box + where + arrow
        )
        if s["state"] in ("failed", "timeout", "lost") and s["reason"]:
            lines.append("    " * stage[s["id"]] + f"   {cell(s['reason'])}")
    return lines
