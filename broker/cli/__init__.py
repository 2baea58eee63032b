"""The `klique` command: the `main` group, and the wiring of the command modules into it.
Thin: every command but `server`, `agent` and `estate check` calls the API. `klique demo` is
added above this package, by broker/console.py: the demo drives the CLI, never the reverse."""

from __future__ import annotations

import sys
from typing import Any

import click

from broker import config
from broker.cli import (
    apps,
    completion,
    db,
    deploy,
    keeping,
    login,
    platform,
    sdk,
    submit,
    tasks,
    tokens,
)
from broker.cli import datasets as dataset_commands
from broker.cli import models as model_commands
from broker.cli import tune as tune_commands
from broker.cli.server_extra import LOAD_ERRORS, missing_server
from broker.client import one_line
from broker.errors import EstateError, KliqueError


class KliqueGroup(click.Group):
    """Turns Klique's errors, and a platform command run without the server extra, into one
    line on stderr and a non-zero exit."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LOAD_ERRORS as exc:
            hint = missing_server(exc, ctx.invoked_subcommand)
            if hint is None:
                raise
            click.echo(f"klique: {hint}", err=True)
            sys.exit(1)
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


# click lists the commands by name, whatever the order they are added in.
COMMANDS: tuple[click.Command, ...] = (
    completion.completion,
    login.login,
    submit.submit,
    tasks.list_tasks,
    tasks.show,
    tasks.logs,
    tasks.cancel,
    tasks.why,
    tasks.resources,
    tasks.pools,
    keeping.tag,
    keeping.archive,
    keeping.unarchive,
    keeping.delete,
    sdk.artifacts,
    sdk.compare,
    apps.app,
    model_commands.model,
    dataset_commands.dataset,
    tune_commands.tune,
    platform.server,
    platform.agent,
    platform.estate,
    platform.template,
    platform.usage,
    platform.policy,
    db.db,
    deploy.deploy,
    tokens.token,
)
for command in COMMANDS:
    main.add_command(command)
