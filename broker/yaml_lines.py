"""YAML read with the line of every key, so that a check's errors point at file:line, and
pydantic's errors worded for the platform team who writes such files (the estate, app files)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from broker.errors import EstateError

# The fix each kind of pydantic error gets, said for someone editing a YAML file.
FIXES: Mapping[str, str] = {
    "missing": "add it",
    "extra_forbidden": "remove it, or check its spelling against examples/estate.yaml",
    "int_parsing": "give a whole number",
    "int_type": "give a whole number",
    "float_parsing": "give a number",
    "bool_parsing": "give true or false",
    "string_type": "give a text value",
    "list_type": "give a list, like [a, b]",
    "dict_type": "give a mapping of name: value lines",
    "model_type": "give a mapping of field: value lines",
    "enum": "use one of the allowed values",
    "literal_error": "use one of the allowed values",
    "string_pattern_mismatch": "use letters, digits, '.', '_' and '-' (at most 64)",
    "greater_than_equal": "give a larger value",
    "greater_than": "give a larger value",
    "less_than": "give a smaller value",
    "too_short": "give at least one entry",
}


def describe(err: Mapping[str, Any], lines: LineMap, fixes: Mapping[str, str] = FIXES) -> str:
    """One pydantic error as `file:line: field: message; fix: ...`."""
    path = tuple(str(p) for p in err["loc"])
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        message = "is required"
    if err["type"] == "value_error":  # Klique's own validators say the fix themselves
        return lines.error(path, message)
    fix = fixes.get(err["type"], "see examples/estate.yaml for the format")
    if err["type"] in ("enum", "literal_error") and "expected" in err.get("ctx", {}):
        fix = f"use one of {err['ctx']['expected']}"
    return lines.error(path, f"{message}; fix: {fix}")


class LineMap:
    """The parsed YAML plus the line of every key, so errors can point at file:line."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.lines: dict[tuple[str, ...], int] = {}
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            self.data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark else 1
            problem = getattr(exc, "problem", None) or str(exc)
            raise EstateError(
                [
                    f"{source}:{line}: not valid YAML: {problem}; fix: check the "
                    "indentation and quoting on that line"
                ]
            ) from None
        if node is not None:
            self._walk(node, ())

    def _walk(self, node: yaml.Node, path: tuple[str, ...]) -> None:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                self.lines[(*path, str(key.value))] = key.start_mark.line + 1
                self._walk(value, (*path, str(key.value)))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, (*path, str(i)))

    def line_of(self, path: tuple[str, ...]) -> int:
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, 1)

    def error(self, path: tuple[str, ...], message: str) -> str:
        field = ".".join(path) or "(top level)"
        return f"{self.source}:{self.line_of(path)}: {field}: {message}"
