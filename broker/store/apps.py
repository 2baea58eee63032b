"""The store's side of apps: admin locks on catalogue apps and static routes made through the
API (the estate's own routes live in the estate). Only SQL here."""

from __future__ import annotations

import json
import time

from sqlalchemy import select

from broker.domain import StaticRoute
from broker.store.repository import Store
from broker.store.rows import AppLock, app_lock_of, route_of
from broker.store.tables import AppLockRow, RouteRow


class AppStore:
    """Locks and API-made routes, over the task store's engine and transactions."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def lock(self, app: str, reason: str, by: str) -> AppLock:
        with self.store.write() as session:
            row = session.get(AppLockRow, app, with_for_update=True)
            if row is None:
                row = AppLockRow(app=app)
                session.add(row)
            row.reason, row.locked_by, row.locked_at = reason, by, time.time()
            return app_lock_of(row)

    def unlock(self, app: str) -> bool:
        with self.store.write() as session:
            row = session.get(AppLockRow, app, with_for_update=True)
            if row is None:
                return False
            session.delete(row)
            return True

    def locks(self) -> dict[str, AppLock]:
        with self.store.read() as session:
            return {row.app: app_lock_of(row) for row in session.scalars(select(AppLockRow))}

    def add_route(self, route: StaticRoute) -> bool:
        """False when a route of that name exists already."""
        with self.store.write() as session:
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
        with self.store.write() as session:
            row = session.get(RouteRow, name, with_for_update=True)
            if row is None:
                return False
            session.delete(row)
            return True

    def routes(self) -> dict[str, StaticRoute]:
        with self.store.read() as session:
            return {row.name: route_of(row) for row in session.scalars(select(RouteRow))}
