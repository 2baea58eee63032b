"""`klique dataset ...`: immutable, content-addressed dataset versions: make one from a folder
(sending only the content the server lacks), list and show them, download one. Making a
version goes through the SDK's Dataset (klique/datasets.py), so the CLI and a script send the
same way."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from broker.cli.output import json_option, listing, table, when
from broker.client import Client
from klique._api import Api
from klique._api import KliqueError as SDKError
from klique.datasets import Dataset, inside

VERSION_COLUMNS = [
    ("version", "VERSION"),
    ("parent", "PARENT"),
    ("files", "FILES"),
    ("size", "BYTES"),
    ("new_size", "NEW BYTES"),
    ("made_by", "MADE BY"),
    ("created", "CREATED"),
]


def sdk_api(client: Client) -> Api:
    """The SDK's view of the CLI's server and credential."""
    return Api(client.api, client.token or "")


@click.group()
def dataset() -> None:
    """Datasets: immutable versions of a folder, each file kept once by its content."""


@dataset.command("create")
@click.argument("name")
@click.option(
    "--from",
    "source",
    required=True,
    type=click.Path(exists=True),
    help="The folder (or file) the version holds.",
)
@click.option("--parent", type=int, help="The version it derives from (only changes are sent).")
@click.option("--project", default=None, help="The project (a new dataset's; default: default).")
def create(name: str, source: str, parent: int | None, project: str | None) -> None:
    """Make the next version of dataset NAME from a folder."""
    api = sdk_api(Client())
    try:
        parents = [parent] if parent is not None else None
        draft = Dataset.create(
            dataset_name=name, dataset_project=project, parent_datasets=parents, api=api
        )
        draft.remove_files("*")  # the folder as it is now; what the parent had is not sent
        draft.add_files(source)
        sent = draft.upload()
        draft.finalize()
    except SDKError as exc:
        raise click.ClickException(str(exc)) from None
    info = draft.info or {}
    click.echo(
        f"dataset {draft.id}: {info.get('files')} files, {info.get('size')} bytes; "
        f"{sent} bytes sent (the rest the server had)"
    )


@dataset.command("ls")
@json_option
def list_datasets(as_json: bool) -> None:
    """The datasets you may read (your team's)."""
    rows = Client().get("/datasets")
    listing(
        rows,
        as_json,
        [
            ("name", "DATASET"),
            ("latest", "LATEST"),
            ("team", "TEAM"),
            ("owner", "OWNER"),
            ("project", "PROJECT"),
        ],
        "no datasets yet; make one with `klique dataset create NAME --from FOLDER`",
    )


@dataset.command("show")
@click.argument("name")
@json_option
def show(name: str, as_json: bool) -> None:
    """A dataset's versions: each one's parent, files, bytes, and what it added."""
    found = Client().get(f"/datasets/{quote(name)}")
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    click.echo(f"dataset {found['name']}: {found['team'] or found['owner']}, {found['project']}")
    table([version_row(v) for v in reversed(found["versions"])], VERSION_COLUMNS)


def version_row(version: dict[str, Any]) -> dict[str, Any]:
    run = f" (run {version['task_id']})" if version.get("task_id") else ""
    return {
        **version,
        "parent": version["parent"] or "-",
        "made_by": f"{version['created_by']}{run}",
        "created": when(version["created_at"]),
    }


@dataset.command("get")
@click.argument("name")
@click.option("--version", "version", type=int, help="A version number (default: the newest).")
@click.option(
    "--output", "-o", type=click.Path(file_okay=False), help="The folder (default: NAME-vN)."
)
def get(name: str, version: int | None, output: str | None) -> None:
    """Download a version's files into a folder."""
    client = Client()
    ref = str(version) if version is not None else "latest"
    found = client.get(f"/datasets/{quote(name)}/versions/{ref}")
    folder = Path(output or f"{found['name']}-v{found['version']}")
    folder.mkdir(parents=True, exist_ok=True)
    total = 0
    for path, entry in sorted(found["manifest"].items()):
        try:
            dest = Path(inside(str(folder), path))
        except SDKError as exc:
            raise click.ClickException(f"the server named a file {path!r}: {exc}") from None
        dest.parent.mkdir(parents=True, exist_ok=True)
        blob = (
            f"/datasets/{quote(found['name'])}/versions/{found['version']}/blobs/{entry['digest']}"
        )
        total += client.download(blob, dest)
    click.echo(
        f"{folder}{os.sep} (dataset {found['id']}: {len(found['manifest'])} files, {total} bytes)"
    )


def show_reads(task: dict[str, Any]) -> None:
    """The dataset part of `klique show`: the versions the task read."""
    if task.get("datasets"):
        read = ", ".join(f"{d['name']}@{d['version']}" for d in task["datasets"])
        click.echo(f"{'datasets:':11} {read}")
