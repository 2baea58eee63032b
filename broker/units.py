"""The units an estate file writes: sizes ('16G'), durations ('4h', '01:30:00') and names,
as pydantic types that every section of the file (and every pool kind's settings) shares. The
parsers under them are broker/quantities.py's, which the CLI uses without pydantic."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from broker.names import NAME
from broker.quantities import parse_duration_s, parse_size_mb

__all__ = [
    "Name",
    "Seconds",
    "SecondsOrZero",
    "SizeMB",
    "Strict",
    "parse_duration_s",
    "parse_size_mb",
]

SizeMB = Annotated[int, BeforeValidator(parse_size_mb), Field(ge=0)]
Seconds = Annotated[int, BeforeValidator(parse_duration_s), Field(gt=0)]
SecondsOrZero = Annotated[int, BeforeValidator(parse_duration_s), Field(ge=0)]
Name = Annotated[str, Field(pattern=NAME)]


class Strict(BaseModel):
    """A section of the estate file: unknown keys are errors (a typo never passes silently).
    Each field's docstring is its description: the estate reference (docs/hooks/reference.py)
    prints it, and tests/unit/test_estate_descriptions.py holds every field to having one."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
