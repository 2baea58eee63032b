"""`klique db`: the platform team's commands on the store's schema. `upgrade` runs the Alembic
migrations a new release brings (the server also runs them at start; upgrading first, with the
server stopped, makes a failed migration an error at the console rather than a server that
does not start); `current` says where a database stands."""

from __future__ import annotations

from typing import Any

import click

from broker import config
from broker.errors import KliqueError

db_option = click.option(
    "--db",
    "url",
    metavar="URL",
    help="The store's SQLAlchemy URL, postgresql:// accepted (default: $KLIQUE_DB, else "
    "SQLite in $KLIQUE_HOME).",
)


@click.group()
def db() -> None:
    """The store's schema: upgrade it to this release's, or show its revision."""


@db.command("upgrade")
@db_option
def db_upgrade(url: str | None) -> None:
    """Run the migrations this release brings; say from which revision to which."""
    # the server extra (SQLAlchemy, Alembic) is optional: loaded by the command that needs it
    from broker.store import migrate
    from broker.store.engine import make_engine  # the server extra is optional

    engine = _reachable(make_engine(url or config.store_url()))
    try:
        before = _known_revision(migrate, engine)
        newest = migrate.head()
        if before == newest:
            click.echo(f"{_shown(engine)} is at {newest}, the newest revision: nothing to do")
            return
        migrate.upgrade(engine)
        after = migrate.current(engine)
    finally:
        engine.dispose()
    click.echo(f"upgraded {_shown(engine)} from {before or 'an empty database'} to {after}")


@db.command("current")
@db_option
def db_current(url: str | None) -> None:
    """Show the database's revision and the newest this release knows."""
    # the server extra (SQLAlchemy, Alembic) is optional: loaded by the command that needs it
    from broker.store import migrate
    from broker.store.engine import make_engine  # the server extra is optional

    engine = _reachable(make_engine(url or config.store_url()))
    try:
        revision = _known_revision(migrate, engine)
    finally:
        engine.dispose()
    newest = migrate.head()
    if revision == newest:
        click.echo(f"{revision} (the newest)")
    else:
        click.echo(
            f"{revision or 'none (an empty database)'}; run `klique db upgrade` for {newest}"
        )


def _reachable(engine: Any) -> Any:
    """The engine, once a connection opens; else the reason, in one line."""
    from sqlalchemy.exc import DBAPIError  # the server extra is optional

    try:
        engine.connect().close()
    except DBAPIError as exc:
        engine.dispose()
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise KliqueError(
            f"cannot open the store at {_shown(engine)}: {reason}; fix: check that the "
            "database is up and that KLIQUE_DB (or --db) is the server's database URL"
        ) from None
    return engine


def _known_revision(migrate: Any, engine: Any) -> str | None:
    revision: str | None = migrate.current(engine)
    if revision is not None and not migrate.is_known(revision):
        raise KliqueError(
            f"{_shown(engine)} is at revision {revision}, which this release does not know: a "
            "newer release upgraded it; fix: run that release (Klique does not downgrade)"
        )
    return revision


def _shown(engine: Any) -> str:
    shown: str = engine.url.render_as_string(hide_password=True)
    return shown
