"""A sweep's tasks from one command: each set of parameters (a line of a JSON-lines file, a
point of a grid) fills the `{name}` placeholders of the command's arguments.

Placeholders are filled in each argument on its own, never in a shell string: a value is one
argument's text, whatever it holds. `{{` and `}}` stand for literal braces."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Dict

from broker.errors import KliqueError

Params = Dict[str, Any]  # typing's: the CLI runs on Python 3.8, where dict[...] fails
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


class SweepError(KliqueError):
    pass


def read_lines(path: Path) -> list[tuple[str, Params]]:
    """(where, parameters) for each non-empty line of a JSON-lines file: one object a line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SweepError(f"cannot read the sweep file {path}: {exc.strerror}") from exc
    found: list[tuple[str, Params]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"line {number} of {path}"
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise SweepError(f"{where} is not JSON ({exc}); write one JSON object a line") from None
        if not isinstance(value, dict):
            raise SweepError(f'{where} is not a JSON object; write one like {{"lr": 0.1}} a line')
        found.append((where, value))
    if not found:
        raise SweepError(f"the sweep file {path} has no lines; write one JSON object a line")
    return found


def grid(items: Iterable[str]) -> list[tuple[str, Params]]:
    """Every combination of `KEY=V1,V2,...` items, in order; a value that reads as JSON is that
    value (0.01 a number), any other is text. No items: no points."""
    axes: list[tuple[str, list[Any]]] = []
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.isidentifier() or not values:
            raise SweepError(f"--grid {item!r} is not KEY=VALUE,VALUE,... (KEY a name like lr)")
        axes.append((key, [_value(v) for v in values.split(",")]))
    points: list[tuple[str, Params]] = []
    if not axes:
        return points
    for combination in itertools.product(*(values for _, values in axes)):
        params = {key: value for (key, _), value in zip(axes, combination)}
        shown = " ".join(f"{k}={_text(v)}" for k, v in params.items())
        points.append((f"grid point {shown}", params))
    return points


def combine(
    lines: list[tuple[str, Params]], points: list[tuple[str, Params]]
) -> list[tuple[str, Params]]:
    """Each line with each grid point (either alone when the other is not given)."""
    if not lines or not points:
        return lines or points
    return [(f"{w1}, {w2}", {**p1, **p2}) for w1, p1 in lines for w2, p2 in points]


def fill(text: str, params: Params, where: str) -> str:
    """`text` with its `{name}` placeholders filled from `params`."""

    def one(match: re.Match[str]) -> str:
        key = match.group(1)
        if key is None:
            return match.group(0)[0]  # {{ or }}
        if key not in params:
            known = ", ".join(sorted(params)) or "none"
            raise SweepError(
                f"{where} has no key {key!r} for the placeholder {{{key}}} (its keys: {known}); "
                "fix: add the key, or write {{ and }} for literal braces"
            )
        return _text(params[key])

    return _PLACEHOLDER.sub(one, text)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
