"""YAML with the line of every key, and pydantic's errors worded against it (the estate's and
the app files' checks share them)."""

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from broker.errors import EstateError
from broker.yaml_lines import LineMap, describe

TEXT = """\
pools:
  gpu:
    slots: two
    extra: 1
"""


class _Pool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    slots: int


class _File(BaseModel):
    pools: dict[str, _Pool]


def _errors(text: str) -> list[str]:
    lines = LineMap(text, "e.yaml")
    with pytest.raises(ValidationError) as caught:
        _File.model_validate(lines.data)
    return [describe(err, lines) for err in caught.value.errors()]


def test_each_error_names_the_file_the_line_the_field_and_the_fix():
    assert _errors(TEXT) == [
        "e.yaml:3: pools.gpu.slots: Input should be a valid integer, unable to parse string as "
        "an integer; fix: give a whole number",
        "e.yaml:4: pools.gpu.extra: Extra inputs are not permitted; fix: remove it, or check "
        "its spelling against examples/estate.yaml",
    ]


def test_a_missing_field_points_at_the_nearest_line_that_is_there():
    assert _errors("pools:\n  gpu: {}\n") == ["e.yaml:2: pools.gpu.slots: is required; fix: add it"]


def test_text_that_is_not_yaml_is_an_estate_error_with_its_line():
    with pytest.raises(EstateError, match=r"e.yaml:2: not valid YAML: .*fix: check the"):
        LineMap("a: 1\n  b: [\n", "e.yaml")
