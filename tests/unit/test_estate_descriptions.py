"""Every field of the estate file says what it is for: each model's fields carry a description
(the field's docstring, broker/units.py's Strict), and the estate reference (docs/hooks/
reference.py) prints it. A new field without one fails here, naming it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from broker.estate import EstateFile
from broker.pools.registry import kinds

ROOT = Path(__file__).resolve().parents[2]


def estate_schemas() -> dict[str, dict[str, Any]]:
    """The estate file's JSON Schema and each pool kind's, by a name for messages."""
    schemas = {"the estate": EstateFile.model_json_schema()}
    schemas.update(
        {f"pools of kind {k}": s.settings.model_json_schema() for k, s in kinds().items()}
    )
    return schemas


def fields_of(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(model.field, the field's schema) of the schema's model and every model it holds."""
    models = [(schema.get("title", "?"), schema), *schema.get("$defs", {}).items()]
    return [
        (f"{name}.{field}", definition)
        for name, model in models
        for field, definition in model.get("properties", {}).items()
    ]


def test_every_field_of_the_estate_has_a_description():
    missing = [
        f"{where}: {field}"
        for where, schema in estate_schemas().items()
        for field, definition in fields_of(schema)
        if not (definition.get("description") or "").strip()
    ]
    assert missing == [], (
        "these estate fields have no description; fix: write a docstring under each field "
        f"(it is the estate reference's description): {missing}"
    )


def test_the_estate_reference_prints_each_description():
    spec = importlib.util.spec_from_file_location(
        "docs_hook_reference", ROOT / "docs/hooks/reference.py"
    )
    assert spec is not None and spec.loader is not None
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    page = reference.estate_page()
    assert "| field | type | default | limits | description |" in page
    for _, schema in estate_schemas().items():
        for field, definition in fields_of(schema):
            if definition.get("description"):
                assert reference.cell(definition["description"]) in page, field
    # A one-line reading of a field that spans lines: the profile's `nodes`.
    assert "Nodes a task spans, one runner each (batch pools only;" in page
