"""MkDocs hook: reference pages written from the code when the site is built, so they cannot
fall behind it: the estate file's fields (the pydantic models' JSON Schema, each pool kind's
settings model) and the REST API (the server's OpenAPI document)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

from broker.estate import EstateFile, builtin_estate
from broker.pools.registry import kinds
from broker.server import build_app
from broker.store.repository import Store

POOLS_ROW = "| `pools` | mapping of name to a pool of one of the kinds below, by its `kind:` |"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def cell(text: object) -> str:
    """Text that stays inside one cell of a Markdown table."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def type_of(schema: dict[str, Any]) -> str:
    """A JSON Schema's type in a few words: `int`, `list of Name`, `[ServerFile](#serverfile)`."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        kinds_ = [type_of(s) for s in schema["anyOf"] if s.get("type") != "null"]
        nullable = any(s.get("type") == "null" for s in schema["anyOf"])
        return " or ".join(kinds_) + (" or null" if nullable else "")
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {type_of(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"mapping of name to {type_of(schema['additionalProperties'])}"
    if kind == "object" and schema.get("patternProperties"):  # keys that are checked names
        values = next(iter(schema["patternProperties"].values()))
        return f"mapping of name to {type_of(values)}"
    return str(kind)


def limits_of(schema: dict[str, Any]) -> str:
    words = {
        "minimum": ">=",
        "exclusiveMinimum": ">",
        "maximum": "<=",
        "exclusiveMaximum": "<",
        "minLength": "length >=",
        "maxLength": "length <=",
        "minItems": "items >=",
        "pattern": "matches",
    }
    found = [f"{w} `{schema[k]}`" for k, w in words.items() if k in schema]
    for inner in schema.get("anyOf", []):
        found += [f"{w} `{inner[k]}`" for k, w in words.items() if k in inner]
    return ", ".join(found)


def fields_table(model: dict[str, Any]) -> list[str]:
    """A model's fields, one row each; a description column where the model describes them
    (every estate model does: its fields' docstrings; a REST schema may not)."""
    required = set(model.get("required", []))
    fields = model.get("properties", {})
    described = any(field.get("description") for field in fields.values())
    head = ["field", "type", "default", "limits", *(["description"] if described else [])]
    rows = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, field in fields.items():
        default = "required" if name in required else f"`{json.dumps(field.get('default'))}`"
        if isinstance(field.get("default"), dict) and field["default"]:
            default = "the defaults of its fields"  # a section: its own table says them
        cells = [f"`{name}`", type_of(field), default, limits_of(field)]
        cells += [field.get("description", "")] if described else []
        rows.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return rows


def about(model: dict[str, Any]) -> list[str]:
    """The model's own description (its docstring), as a paragraph, if it has one."""
    return [cell(model["description"]), ""] if model.get("description") else []


def models_section(title: str, schema: dict[str, Any], level: str = "##") -> list[str]:
    lines = [f"{level} {title}", "", *about(schema), *fields_table(schema), ""]
    for name, model in sorted(schema.get("$defs", {}).items()):
        if model.get("type") == "object":
            lines += [f"{level}# {name}", "", *about(model), *fields_table(model), ""]
    return lines


def estate_page() -> str:
    lines = [
        "# Estate reference",
        "",
        "Every field of the estate file, read from the models that validate it "
        "(`broker/estate.py`, each pool kind's settings in `broker/pools/`). Sizes take "
        "`16G`-style units and durations `4h` or `01:30:00`; the defaults below are as read, "
        "sizes in MiB and durations in seconds. What the fields mean: "
        "[the estate file](../estate.md).",
        "",
        *models_section("The estate (EstateFile)", EstateFile.model_json_schema()),
    ]
    # Each pool is checked against its kind's own model, below, chosen by its `kind:`.
    pools = "| `pools` | mapping of name to object |"
    lines = [line.replace(pools, POOLS_ROW) if line.startswith(pools) else line for line in lines]
    for name, spec in sorted(kinds().items()):
        title = f"Pools of kind `{name}`"
        schema = {**spec.settings.model_json_schema(), "description": None}  # the summary says it
        section = models_section(title, schema)
        lines += [*section[:2], f"{spec.summary} ({spec.settings.__name__})", "", *section[2:]]
    return "\n".join(lines) + "\n"


def openapi_document() -> dict[str, Any]:
    """The server's OpenAPI document, from an app over the built-in estate and a scratch store
    (nothing is started: the scheduler and the pools run only in the app's lifespan)."""
    with tempfile.TemporaryDirectory() as home:
        store = Store.open(f"sqlite:///{Path(home) / 'docs.db'}")
        try:
            app = build_app(builtin_estate(), store, Path(home), "http://127.0.0.1:8765")
            return app.openapi()
        finally:
            store.close()


def operation_lines(path: str, method: str, operation: dict[str, Any]) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", ""]
    if operation.get("summary"):
        lines += [operation["summary"], ""]
    if operation.get("description"):
        lines += [operation["description"], ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| parameter | in | type | required |", "|---|---|---|---|"]
        lines += [
            f"| `{p['name']}` | {p['in']} | {cell(type_of(p.get('schema', {})))} "
            f"| {'yes' if p.get('required') else 'no'} |"
            for p in parameters
        ]
        lines.append("")
    body = operation.get("requestBody", {}).get("content", {})
    for media, content in body.items():
        lines += [f"Body ({media}): {type_of(content.get('schema', {}))}", ""]
    answers = operation.get("responses", {})
    lines += ["| status | answer |", "|---|---|"]
    for status, answer in answers.items():
        if shared_error(status, answer):
            continue
        schemas = [type_of(c.get("schema", {})) for c in answer.get("content", {}).values()]
        what = answer.get("description", "")
        lines.append(f"| {status} | {cell(what)}{cell(': ' + schemas[0]) if schemas else ''} |")
    return [*lines, ""]


def shared_error(status: str, answer: dict[str, Any]) -> bool:
    """One of the errors every operation may answer (broker/api/mount.py), listed once."""
    schemas = [c.get("schema", {}) for c in answer.get("content", {}).values()]
    return status.startswith("4") and schemas == [{"$ref": "#/components/schemas/ErrorOut"}]


def rest_page(document: dict[str, Any]) -> str:
    info = document.get("info", {})
    lines = [
        "# REST API reference",
        "",
        f"{info.get('title', 'Klique')} {info.get('version', '')}: written from the server's "
        "OpenAPI document when the site is built; a running server serves the same document at "
        "`/openapi.json` and its own browser at `/docs`. Every operation takes "
        "`Authorization: Bearer TOKEN` and may answer 400, 401, 403, 404, 413 and 422 with "
        '[ErrorOut](#errorout), `{"detail": ...}`: one sentence, what was wrong and the fix.',
        "",
    ]
    if info.get("description"):
        lines += [info["description"], ""]
    lines += ["## Operations", ""]
    for path, operations in document.get("paths", {}).items():
        for method in METHODS:
            if method in operations:
                lines += operation_lines(path, method, operations[method])
    lines += ["## Schemas", ""]
    for name, schema in sorted(document.get("components", {}).get("schemas", {}).items()):
        lines += [f"### {name}", ""]
        lines += fields_table(schema) if "properties" in schema else [f"{type_of(schema)}", ""]
        lines.append("")
    return "\n".join(lines) + "\n"


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "reference/estate.md", content=estate_page()))
    files.append(File.generated(config, "reference/rest.md", content=rest_page(openapi_document())))
    return files
