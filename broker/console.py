"""The `klique` console command: the CLI's `main` group with `klique demo` added. It sits above
both: the demo drives the CLI's commands, and the CLI never imports the demo."""

from __future__ import annotations

from broker import demo
from broker.cli import main

main.add_command(demo.command)

__all__ = ["main"]
