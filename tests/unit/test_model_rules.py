"""The registry's pure rules: names, file paths, references, which version a reference picks,
and what a promotion moves."""

from __future__ import annotations

import pytest

from broker.errors import KliqueError
from broker.models.rules import check_file_path, check_name, parse_ref, pick, refs_in, stage_moves
from broker.tasks.models import last_scalars

VERSIONS = [
    {"version": 1, "stage": "archived"},
    {"version": 2, "stage": "staging"},
    {"version": 3, "stage": "production"},
    {"version": 4, "stage": "staging"},
    {"version": 5, "stage": "none"},
]


@pytest.mark.parametrize(
    ("ref", "version"),
    [("production", 3), ("staging", 4), ("latest", 5), ("2", 2), ("9", None)],
)
def test_a_reference_picks_one_version(ref: str, version: int | None) -> None:
    found = pick(VERSIONS, ref)
    assert (found["version"] if found else None) == version


def test_promoting_archives_the_production_version_before_it() -> None:
    stages = {v["version"]: v["stage"] for v in VERSIONS}
    assert stage_moves(stages, 5, "production") == {5: "production", 3: "archived"}
    assert stage_moves(stages, 5, "staging") == {5: "staging"}
    assert stage_moves(stages, 3, "production") == {3: "production"}


def test_references_are_found_in_string_and_list_parameters() -> None:
    params = {
        "model": "registry:llama@production",
        "command": ["python3", "serve.py", "registry:llama@production", "registry:tok@3"],
        "other": 4,
        "text": "not registry:x@1",
    }
    assert refs_in(params) == ["registry:llama@production", "registry:tok@3"]
    assert parse_ref("registry:tok@3") == ("tok", "3")
    for bad in ("registry:tok", "registry:../x@1", "registry:tok@prod", "registry:tok@0"):
        with pytest.raises(KliqueError, match="registry:NAME@production"):
            parse_ref(bad)


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".x", "a..b", "x" * 129, "a b"])
def test_a_bad_name_is_refused(name: str) -> None:
    with pytest.raises(KliqueError, match="model name"):
        check_name(name)


@pytest.mark.parametrize("path", ["../x", "/x", "a/../b", "a//b", ".git/config", "a/", ""])
def test_a_bad_file_path_is_refused(path: str) -> None:
    with pytest.raises(KliqueError, match="model file"):
        check_file_path(path)
    assert check_file_path("weights/model.safetensors") == "weights/model.safetensors"


def test_metrics_are_each_scalars_last_value() -> None:
    scalars = [
        {"name": "loss", "series": "", "value": 0.9},
        {"name": "loss", "series": "", "value": 0.2},
        {"name": "acc", "series": "val", "value": 0.7},
    ]
    assert last_scalars(scalars) == {"loss": 0.2, "acc/val": 0.7}
