"""The registry's rules as plain functions over plain data (table-tested in
tests/unit/test_model_rules.py)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from broker.errors import KliqueError
from broker.names import FILENAME

# A model's name is a name, never a path: a letter or digit, then letters, digits, . _ -
MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
STAGES = ("none", "staging", "production", "archived")
# Stages a reference may name; `latest` is the highest version whatever its stage.
NAMED_REFS = ("production", "staging", "latest")
# `registry:NAME@REF` in a launch parameter: REF a version number or a stage.
REGISTRY_REF = re.compile(r"^registry:([A-Za-z0-9][A-Za-z0-9._-]{0,127})@([a-z]+|[1-9][0-9]{0,8})$")
PREFIX = "registry:"
MOST_FILES = 10_000
_COMPONENT = re.compile(FILENAME)


def check_name(name: str) -> str:
    """A model name as the registry keeps it; KliqueError with the rule otherwise."""
    if not re.fullmatch(MODEL_NAME, name) or ".." in name:
        raise KliqueError(
            f"model name {name!r}: use letters, digits, '.', '_' and '-' (at most 128), "
            "starting with a letter or digit, never '..'"
        )
    return name


def check_file_path(path: str) -> str:
    """A file's place inside a model: relative, each part a plain file name (no '.', '..' or
    hidden parts, no empty parts), so that staging it can never leave the model's folder."""
    parts = path.split("/")
    if len(path) > 1024 or not all(_COMPONENT.fullmatch(part) for part in parts):
        raise KliqueError(
            f"model file {path!r}: a relative path of plain names (letters, digits, . _ + - and "
            "spaces, no part starting with '.'), at most 1024 characters"
        )
    return path


def check_stage(stage: str) -> str:
    if stage not in STAGES:
        raise KliqueError(f"stage {stage!r}: use one of {', '.join(STAGES)}")
    return stage


def parse_ref(text: str) -> tuple[str, str]:
    """(name, ref) of `registry:NAME@REF`; KliqueError naming the forms otherwise."""
    found = REGISTRY_REF.fullmatch(text)
    if found is None or (not found[2].isdigit() and found[2] not in NAMED_REFS):
        raise KliqueError(
            f"{text!r}: write registry:NAME@production, registry:NAME@staging, "
            "registry:NAME@latest or registry:NAME@VERSION (a number)"
        )
    return check_name(found[1]), found[2]


def refs_in(params: Mapping[str, Any]) -> list[str]:
    """The `registry:` references of a launch's parameters, in order, each once: a string
    parameter that is one, or an item of a list parameter that is one."""
    found: list[str] = []
    for value in params.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item.startswith(PREFIX) and item not in found:
                found.append(item)
    return found


def pick(versions: Iterable[Mapping[str, Any]], ref: str) -> Mapping[str, Any] | None:
    """The version `ref` names: a number; `production` (at most one); the newest `staging`;
    `latest`, the highest. None when there is none such."""
    ordered = sorted(versions, key=lambda v: int(v["version"]), reverse=True)
    for version in ordered:
        if ref.isdigit() and version["version"] == int(ref):
            return version
        if ref == "latest" or (not ref.isdigit() and version["stage"] == ref):
            return version
    return None


def stage_moves(stages: Mapping[int, str], version: int, stage: str) -> dict[int, str]:
    """What a change of `version` to `stage` writes: {version: new stage}. One production
    version per name: promoting one archives the one before (MLflow's
    archive_existing_versions rule), so `@production` always names exactly one."""
    moves = {version: stage}
    if stage == "production":
        for other, current in stages.items():
            if other != version and current == "production":
                moves[other] = "archived"
    return moves
