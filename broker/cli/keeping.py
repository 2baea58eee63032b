"""What is kept of a run: `klique tag`, `klique archive`, `klique unarchive` and `klique
delete`. Thin: each calls the API (broker/api/keeping.py) and prints its answer."""

from __future__ import annotations

import json

import click

from broker.cli.output import cell, json_option
from broker.client import Client


@click.command()
@click.argument("task_id", type=int)
@click.argument("tags", nargs=-1)
@click.option("--remove", "removed", multiple=True, metavar="TAG", help="Take this tag off.")
@json_option
def tag(task_id: int, tags: tuple[str, ...], removed: tuple[str, ...], as_json: bool) -> None:
    """Tag a task (its owner or an admin): `klique tag 42 baseline best`; `klique ls --tag
    baseline` lists the tasks with a tag."""
    if not tags and not removed:
        raise click.UsageError("name the tags to add (klique tag ID TAG...) or --remove TAG")
    task = Client().post(f"/tasks/{task_id}/tags", {"add": list(tags), "remove": list(removed)})
    if as_json:
        click.echo(json.dumps(task, indent=2))
        return
    click.echo(f"task {task['id']}: tags {cell(task['tags'] or None)}")


@click.command()
@click.argument("task_ids", type=int, nargs=-1, required=True)
@json_option
def archive(task_ids: tuple[int, ...], as_json: bool) -> None:
    """Archive ended tasks (their owner or an admin): hidden from `klique ls`, which shows them
    with --archived; the estate's retention.days deletes them once they are that old."""
    _set_archived(task_ids, True, as_json)


@click.command()
@click.argument("task_ids", type=int, nargs=-1, required=True)
@json_option
def unarchive(task_ids: tuple[int, ...], as_json: bool) -> None:
    """Take tasks out of the archive."""
    _set_archived(task_ids, False, as_json)


def _set_archived(task_ids: tuple[int, ...], archived: bool, as_json: bool) -> None:
    client = Client()
    path = "archive" if archived else "unarchive"
    done = [client.post(f"/tasks/{task_id}/{path}", {}) for task_id in task_ids]
    if as_json:
        click.echo(json.dumps(done, indent=2))
        return
    for task in done:
        click.echo(f"task {task['id']}: {'archived' if task['archived'] else 'not archived'}")


@click.command()
@click.argument("task_ids", type=int, nargs=-1, required=True)
@click.option("--yes", is_flag=True, help="Do not ask to confirm.")
def delete(task_ids: tuple[int, ...], yes: bool) -> None:
    """Delete ended tasks (their owner or an admin) with their reports, scalars, console and
    artifacts; this cannot be undone."""
    which = ", ".join(str(t) for t in task_ids)
    if not yes:
        click.confirm(f"delete task(s) {which} and everything they recorded?", abort=True)
    client = Client()
    for task_id in task_ids:
        client.call("DELETE", f"/tasks/{task_id}")
        click.echo(f"task {task_id}: deleted")
