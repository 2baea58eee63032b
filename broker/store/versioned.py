"""Named rows with numbered versions (datasets, models): the name's row holds whose it is and the
last number given; a new version takes the next number under that row's lock, so two at once
get two numbers. Only SQL here; the stores say what a version row holds."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from broker.store.repository import Store

# Two first versions of one new name race to insert its row; the loser tries again and finds
# the row (then waits for its lock). More tries than that is not a race but a fault.
TRIES = 3


class Named(Protocol):
    """A name's row: whose it is (kept from its first version) and the last number given."""

    name: str
    owner: str
    team: str | None
    project: str
    latest: int
    created_at: float

    def __init__(self, **fields: Any) -> None: ...


NamedT = TypeVar("NamedT", bound=Named)
VersionT = TypeVar("VersionT")


def named_of(row: Named) -> dict[str, Any]:
    return {
        "name": row.name,
        "owner": row.owner,
        "team": row.team,
        "project": row.project,
        "latest": row.latest,
        "created_at": row.created_at,
    }


def named(store: Store, table: type[Named], name: str) -> dict[str, Any] | None:
    with store.read() as session:
        row = session.get(table, name)
        return named_of(row) if row is not None else None


def all_named(store: Store, table: type[Named]) -> list[dict[str, Any]]:
    """Every name in `table`, by name."""
    with store.read() as session:
        return [named_of(row) for row in session.scalars(select(table).order_by(table.name))]


def add_version(
    store: Store,
    table: type[NamedT],
    owner: Mapping[str, Any],
    allowed: Callable[[dict[str, Any]], bool],
    made: Callable[[NamedT, float], VersionT],
    out: Callable[[VersionT], dict[str, Any]],
) -> dict[str, Any] | None:
    """A new version of owner['name'] in `table`, numbered one past the last under the name's
    row lock. `owner`: name, owner, team, project (kept from the first). `made(row, now)`: the
    version row, numbered row.latest; `out`: what the caller gets of it. None when `allowed`
    refuses the name as it stands."""

    def once() -> dict[str, Any] | None:
        now = time.time()
        with store.write() as session:
            row = session.get(table, owner["name"], with_for_update=True)
            if row is None:
                row = table(**owner, latest=0, created_at=now)
                session.add(row)
                session.flush()
            if not allowed(named_of(row)):
                return None
            row.latest += 1
            version = made(row, now)
            session.add(version)
            session.flush()
            return out(version)

    for attempt in range(TRIES):
        try:
            return once()
        except IntegrityError:
            if attempt == TRIES - 1:
                raise
    return None  # not reached
