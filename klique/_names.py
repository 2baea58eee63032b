"""The names the server keeps versions under (datasets, models) and the plain parts of their
files' paths, checked here before a request is sent so that a bad one is named at once (the
server checks them again)."""

from __future__ import annotations

import re

from klique._api import KliqueError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._ +-]{0,254}$")


def check_versioned_name(kind: str, name: str) -> str:
    """`name`, when it may name a `kind` ("dataset", "model"); else what a name may hold."""
    if not isinstance(name, str) or not NAME.match(name) or ".." in name:
        raise KliqueError(
            f"{kind} name {name!r}: use letters, digits, '.', '_' and '-' (at most 128), "
            "starting with a letter or digit, never '..'"
        )
    return name
