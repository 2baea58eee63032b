"""HTML form fields from a JSON Schema (an app's launch form), and the typed values back.

Only the flat subset a launch form needs: an object's `properties` of type string, integer,
number or boolean, with `enum`, `default`, `title`, `description`, `minimum`, `maximum` and
`required`. Anything else is shown as a text field whose value is read as JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Field:
    name: str
    label: str
    kind: str  # text, number, integer, checkbox, select, json
    required: bool
    default: str
    help: str
    options: tuple[str, ...] = ()
    minimum: str = ""
    maximum: str = ""


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value)


def fields(schema: dict[str, Any]) -> list[Field]:
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    found = []
    for name, prop in properties.items():
        if not isinstance(prop, dict):
            continue
        kind = {"string": "text", "integer": "integer", "number": "number", "boolean": "checkbox"}
        found.append(
            Field(
                name=str(name),
                label=str(prop.get("title") or name),
                kind="select" if "enum" in prop else kind.get(str(prop.get("type")), "json"),
                required=name in required,
                default=_text(prop.get("default")),
                help=str(prop.get("description") or ""),
                options=tuple(_text(v) for v in prop.get("enum") or ()),
                minimum=_text(prop.get("minimum")),
                maximum=_text(prop.get("maximum")),
            )
        )
    return found


def values(schema: dict[str, Any], form: Any) -> dict[str, Any]:
    """The form's values typed as the schema says; the API validates them and says what is
    wrong, so a value that does not convert is passed on as text for it to refuse."""
    out: dict[str, Any] = {}
    for field in fields(schema):
        raw = form.get(f"field.{field.name}")
        if field.kind == "checkbox":
            out[field.name] = raw is not None
            continue
        if raw is None or raw == "":
            continue
        out[field.name] = _typed(field, str(raw), schema["properties"][field.name])
    return out


def _typed(field: Field, raw: str, prop: dict[str, Any]) -> Any:
    try:
        if field.kind == "integer":
            return int(raw)
        if field.kind == "number":
            return float(raw)
        if field.kind == "json" or (field.kind == "select" and prop.get("type") != "string"):
            return json.loads(raw)
    except ValueError:
        return raw
    return raw
