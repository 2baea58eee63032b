"""Bring a database's schema up to date with alembic (run at every start; cheap when current),
and say where a database stands: its revision, and the newest this code knows."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

MIGRATIONS = Path(__file__).parent / "migrations"


def config(engine: Engine | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if engine is not None:
        url = engine.url.render_as_string(hide_password=False)
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # configparser syntax
        cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    command.upgrade(config(engine), revision)


def current(engine: Engine) -> str | None:
    """The database's revision; None for a database no migration has touched."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head() -> str:
    """The newest revision this code knows."""
    newest = ScriptDirectory.from_config(config()).get_current_head()
    assert newest is not None, "the migrations folder holds one line of revisions"
    return newest


def is_known(revision: str) -> bool:
    """Whether this code's migrations hold the revision (a database a newer release upgraded
    holds one it does not)."""
    script = ScriptDirectory.from_config(config())
    return revision in {known.revision for known in script.walk_revisions()}
