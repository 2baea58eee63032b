"""The store's side of apps: admin locks on catalogue apps and static routes made through the
API (the estate's own routes live in the estate). Only SQL here."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from sqlalchemy import Float, String, Text, select
from sqlalchemy.orm import Mapped, mapped_column

from broker.domain import StaticRoute
from broker.store.repository import Store
from broker.store.tables import Base


class AppLockRow(Base):
    __tablename__ = "app_locks"

    app: Mapped[str] = mapped_column(String(64), primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    locked_by: Mapped[str] = mapped_column(String(64))
    locked_at: Mapped[float] = mapped_column(Float)


class RouteRow(Base):
    __tablename__ = "routes"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    teams: Mapped[str] = mapped_column(Text)  # JSON list
    apps: Mapped[str] = mapped_column(Text)  # JSON list
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)


@dataclass(frozen=True)
class AppLock:
    app: str
    reason: str
    locked_by: str
    locked_at: float


class AppStore:
    """Locks and API-made routes, over the task store's engine and transactions."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def lock(self, app: str, reason: str, by: str) -> AppLock:
        with self.store._tx() as session:
            row = session.get(AppLockRow, app, with_for_update=True)
            if row is None:
                row = AppLockRow(app=app)
                session.add(row)
            row.reason, row.locked_by, row.locked_at = reason, by, time.time()
            return AppLock(row.app, row.reason, row.locked_by, row.locked_at)

    def unlock(self, app: str) -> bool:
        with self.store._tx() as session:
            row = session.get(AppLockRow, app, with_for_update=True)
            if row is None:
                return False
            session.delete(row)
            return True

    def locks(self) -> dict[str, AppLock]:
        with self.store._sessions() as session:
            return {
                r.app: AppLock(r.app, r.reason, r.locked_by, r.locked_at)
                for r in session.scalars(select(AppLockRow))
            }

    def add_route(self, route: StaticRoute) -> bool:
        """False when a route of that name exists already."""
        with self.store._tx() as session:
            if session.get(RouteRow, route.name) is not None:
                return False
            session.add(
                RouteRow(
                    name=route.name,
                    teams=json.dumps(list(route.teams)),
                    apps=json.dumps(list(route.apps)),
                    created_by=route.created_by,
                    created_at=time.time(),
                )
            )
            return True

    def remove_route(self, name: str) -> bool:
        with self.store._tx() as session:
            row = session.get(RouteRow, name, with_for_update=True)
            if row is None:
                return False
            session.delete(row)
            return True

    def routes(self) -> dict[str, StaticRoute]:
        with self.store._sessions() as session:
            return {
                r.name: StaticRoute(
                    r.name, tuple(json.loads(r.teams)), tuple(json.loads(r.apps)), r.created_by
                )
                for r in session.scalars(select(RouteRow))
            }
