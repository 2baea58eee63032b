"""`klique completion SHELL`: the shell's completion script for the whole command tree."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell's completion script: eval "$(klique completion bash)" in ~/.bashrc."""
    complete = get_completion_class(shell)
    assert complete is not None  # noqa: S101 - click has all three
    # The root group, whatever added the commands: this module need not import it.
    root = ctx.find_root().command
    click.echo(complete(root, {}, "klique", "_KLIQUE_COMPLETE").source())
