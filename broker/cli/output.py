"""How the CLI prints: readable tables for people, JSON for programs."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import click

# An empty listing says so and what to do next, never a bare "(none)".
NOTHING = "nothing to list"


def table(
    rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], empty: str = NOTHING
) -> None:
    """Rows as columns padded to their widest cell, under a heading; `empty` when none."""
    if not rows:
        click.echo(empty)
        return
    cells = [[cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(head), *(len(c[i]) for c in cells)) for i, (_, head) in enumerate(columns)]
    click.echo("  ".join(head.ljust(w) for (_, head), w in zip(columns, widths)).rstrip())
    for c in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip())


def cell(value: Any) -> str:
    """One value as a table cell: `-` for none, lists joined by commas, on one line."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value).replace("\n", " ")


def when(ts: float | None) -> str:
    """A Unix time as local date and time, `-` for none."""
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def listing(
    rows: list[dict[str, Any]],
    as_json: bool,
    columns: Sequence[tuple[str, str]],
    empty: str = NOTHING,
) -> None:
    """A table for people (`empty` when there are no rows), JSON for programs ([] then)."""
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        table(rows, columns, empty)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
