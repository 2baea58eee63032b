"""Alembic environment: migrations run on the engine the store opened."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from broker.store.tables import Base

cfg = context.config
engine = cfg.attributes.get("engine") or create_engine(cfg.get_main_option("sqlalchemy.url") or "")

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
