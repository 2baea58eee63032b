"""A tuning's search space from `NAME=KIND:ARGS` items, as `klique tune --param` takes them:

    lr=loguniform:1e-5:1e-1   a float, sampled on a log scale
    drop=uniform:0:0.5        a float
    layers=int:2:8            an integer, both ends included (int:2:8:2 steps by 2)
    opt=choice:adam,sgd       one of the values (a value that reads as JSON is that value)

Standard library only: the client checks what it sends, the server checks again."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Dict  # noqa: UP035 - the alias below runs on Python 3.8

from broker.errors import KliqueError

Spec = Dict[str, Any]  # noqa: UP006 - typing's: the CLI runs on Python 3.8, where dict[...] fails
KINDS = ("uniform", "loguniform", "int", "choice")
SAMPLERS = ("tpe", "random", "grid", "cmaes")
PRUNERS = ("none", "median", "hyperband")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]{0,127}")
_EXAMPLE = "lr=loguniform:1e-5:1e-1, layers=int:2:8 or opt=choice:adam,sgd"
MAX_CHOICES = 1000


class SpecError(KliqueError):
    pass


def parse_param(item: str) -> Spec:
    """One `NAME=KIND:ARGS` item as a spec: {"name", "kind", and low/high/step or choices}."""
    name, sep, rest = item.partition("=")
    kind, _, args = rest.partition(":")
    where = f"--param {item!r}"
    if not sep or not _NAME.fullmatch(name):
        raise SpecError(
            f"{where} is not NAME=KIND:ARGS (NAME a parameter like lr); write {_EXAMPLE}"
        )
    if kind not in KINDS:
        raise SpecError(f"{where}: unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    if kind == "choice":
        values = [_value(v) for v in args.split(",")] if args else []
        return check_spec({"name": name, "kind": kind, "choices": values}, where)
    parts = args.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and kind != "int"):
        shape = "int:LOW:HIGH[:STEP]" if kind == "int" else f"{kind}:LOW:HIGH"
        raise SpecError(f"{where}: write {name}={shape}")
    try:
        numbers = [int(p) if kind == "int" else float(p) for p in parts]
    except ValueError:
        number = "an integer" if kind == "int" else "a number"
        raise SpecError(f"{where}: each bound must be {number}; got {args!r}") from None
    spec: Spec = {"name": name, "kind": kind, "low": numbers[0], "high": numbers[1]}
    if len(numbers) == 3:
        spec["step"] = numbers[2]
    return check_spec(spec, where)


def parse_params(items: list[str]) -> list[Spec]:
    """Every item's spec, each name once; at least one."""
    specs = [parse_param(item) for item in items]
    return check_specs(specs)


def check_specs(specs: list[Spec]) -> list[Spec]:
    """Specs as they arrive over the API: each checked, names once, at least one."""
    if not specs:
        raise SpecError(f"a tuning needs at least one parameter to search, like {_EXAMPLE}")
    seen: set = set()
    checked = []
    for index, spec in enumerate(specs):
        name = spec.get("name")
        if name in seen:
            raise SpecError(f"parameter {name!r} is given twice; give each parameter once")
        seen.add(name)
        checked.append(check_spec(dict(spec), f"params[{index}]"))
    return checked


def check_spec(spec: Spec, where: str) -> Spec:
    """The spec if its bounds make sense: low < high, positive for a log scale, choices."""
    kind, name = spec.get("kind"), spec.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SpecError(f"{where}: {name!r} is not a parameter name (letters, digits, _ . / -)")
    if kind not in KINDS:
        raise SpecError(f"{where}: unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    if kind == "choice":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices or len(choices) > MAX_CHOICES:
            raise SpecError(f"{where}: a choice needs 1 to {MAX_CHOICES} values: {name}=choice:a,b")
        if any(not isinstance(c, (str, int, float, bool)) or c is None for c in choices):
            raise SpecError(f"{where}: choices are numbers, text or true/false")
        if len(set(map(json.dumps, choices))) != len(choices):
            raise SpecError(f"{where}: a value is given twice among {name}'s choices")
        return {"name": name, "kind": kind, "choices": choices}
    low, high = spec.get("low"), spec.get("high")
    integer = kind == "int"
    for bound in (low, high, spec.get("step", 1)):
        if not _number(bound, integer):
            number = "integers" if integer else "finite numbers"
            raise SpecError(f"{where}: {name}'s bounds must be {number}")
    if not low < high:  # type: ignore[operator]
        raise SpecError(f"{where}: {name}'s low bound {low} must be below its high bound {high}")
    if kind == "loguniform" and low <= 0:  # type: ignore[operator]
        raise SpecError(f"{where}: a log scale needs a low bound above 0; {name} has {low}")
    checked: Spec = {"name": name, "kind": kind, "low": low, "high": high}
    if integer and spec.get("step", 1) != 1:
        if spec["step"] < 1:
            raise SpecError(f"{where}: {name}'s step must be 1 or more")
        checked["step"] = spec["step"]
    return checked


def grid_size(specs: list[Spec]) -> int | None:
    """How many points a grid over these specs has; None when one is continuous (a float)."""
    size = 1
    for spec in specs:
        if spec["kind"] == "choice":
            size *= len(spec["choices"])
        elif spec["kind"] == "int":
            size *= (spec["high"] - spec["low"]) // spec.get("step", 1) + 1
        else:
            return None
    return size


def _number(value: Any, integer: bool) -> bool:
    if isinstance(value, bool):
        return False
    if integer:
        return isinstance(value, int)
    return isinstance(value, (int, float)) and math.isfinite(value)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
