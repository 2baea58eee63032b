"""A schema of a test's own on the test PostgreSQL server (scripts/pg-up): its tables, its
lease row and its tasks are no other test's."""

from __future__ import annotations

import uuid

import sqlalchemy

from broker.store.engine import normalise_url


def fresh_schema(url: str, prefix: str = "t") -> str:
    """A new schema on the server of `url`, and the URL that uses it."""
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    engine = sqlalchemy.create_engine(normalise_url(url))
    with engine.begin() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
    engine.dispose()
    return f"{url}?options=-csearch_path%3D{schema}"
