"""`klique model ...`: the model registry: list and show models, promote a version to a stage,
download a version's files. Thin: every command calls the API."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from broker.cli.output import json_option, listing, table, when
from broker.client import Client

STAGES = ("none", "staging", "production", "archived")
# As the server checks them: a file's place in a model is a path of plain names.
_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._ +-]{0,254}$")
VERSION_COLUMNS = [
    ("version", "VERSION"),
    ("stage", "STAGE"),
    ("task_id", "RUN"),
    ("framework", "FRAMEWORK"),
    ("files", "FILES"),
    ("metrics", "METRICS"),
    ("tags", "TAGS"),
    ("created", "CREATED"),
]


@click.group()
def model() -> None:
    """The model registry: versions that runs registered, their stages, their files."""


@model.command("ls")
@json_option
def list_models(as_json: bool) -> None:
    """The models you may read (your team's)."""
    rows = Client().get("/models")
    listing(
        rows,
        as_json,
        [
            ("name", "MODEL"),
            ("latest", "LATEST"),
            ("production", "PRODUCTION"),
            ("team", "TEAM"),
            ("owner", "OWNER"),
            ("project", "PROJECT"),
        ],
        "no models yet; a run registers one with task.register_model(NAME, PATH)",
    )


@model.command("show")
@click.argument("name")
@json_option
def show(name: str, as_json: bool) -> None:
    """A model's versions (the run that made each, its stage, metrics) and the apps serving it."""
    found = Client().get(f"/models/{quote(name)}")
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    click.echo(f"model {found['name']}: {found['team'] or found['owner']}, {found['project']}")
    rows = [version_row(v) for v in reversed(found["versions"])]
    table(rows, VERSION_COLUMNS)
    for app in found["serving"]:
        click.echo(
            f"served by app {app['id']} ({app['app']}, {app['state']}) at /routes/{app['route']}/:"
            f" version {app['version']} from {app['ref']}"
        )


def version_row(version: dict[str, Any]) -> dict[str, Any]:
    metrics = version["metrics"]
    return {
        **version,
        "files": len(version["files"]),
        "metrics": ", ".join(f"{k}={v:g}" for k, v in sorted(metrics.items())[:4]) or "-",
        "created": when(version["created_at"]),
    }


@model.command("promote")
@click.argument("name")
@click.argument("version", type=int)
@click.option(
    "--stage",
    type=click.Choice(STAGES),
    default="production",
    show_default=True,
    help="The stage; to production, the version there before is archived.",
)
def promote(name: str, version: int, stage: str) -> None:
    """Move VERSION of model NAME to a stage (your team's models; admins any)."""
    path = f"/models/{quote(name)}/versions/{version}/stage"
    found = Client().post(path, {"stage": stage})
    click.echo(f"model {found['name']} version {found['version']} is now {found['stage']}")


@model.command("download")
@click.argument("name")
@click.option("--version", "version", type=int, help="A version number (default: the newest).")
@click.option("--stage", type=click.Choice(["production", "staging"]), help="Or a stage's.")
@click.option(
    "--output", "-o", type=click.Path(file_okay=False), help="The folder (default: NAME-vN)."
)
def download(name: str, version: int | None, stage: str | None, output: str | None) -> None:
    """Download a version's files into a folder."""
    if version is not None and stage is not None:
        raise click.UsageError("give --version or --stage, not both")
    client = Client()
    ref = str(version) if version is not None else (stage or "latest")
    found = client.get(f"/models/{quote(name)}/versions/{ref}")
    folder = Path(output or f"{found['name']}-v{found['version']}")
    total = 0
    for index, file in enumerate(found["files"]):
        parts = file["path"].split("/")
        if not all(_PART.fullmatch(p) for p in parts):
            raise click.ClickException(f"the server named a file {file['path']!r}; not written")
        dest = folder.joinpath(*parts)
        dest.parent.mkdir(parents=True, exist_ok=True)
        path = f"/models/{quote(found['name'])}/versions/{found['version']}/files/{index}"
        total += client.download(path, dest)
    click.echo(
        f"{folder} (model {found['name']} version {found['version']}, {found['stage']}: "
        f"{len(found['files'])} files, {total} bytes)"
    )
