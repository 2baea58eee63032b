"""tokens with a kind, scopes, a team, an expiry, revocation and last use; browser sessions

Revision ID: 0008_identity
Revises: 0006_apps
Create Date: 2026-11-30 13:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_identity"
down_revision = "0007_sdk"
branch_labels = None
depends_on = None

_tokens = sa.table(
    "tokens",
    sa.column("digest", sa.String),
    sa.column("id", sa.String),
    sa.column("admin", sa.Boolean),
    sa.column("kind", sa.String),
    sa.column("scopes", sa.String),
)


def upgrade() -> None:
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("id", sa.String(length=16), nullable=True))
        batch_op.add_column(
            sa.Column("kind", sa.String(length=16), nullable=False, server_default="user")
        )
        batch_op.add_column(
            sa.Column("scopes", sa.String(length=64), nullable=False, server_default="read,submit")
        )
        batch_op.add_column(sa.Column("team", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("groups", sa.Text(), nullable=False, server_default="[]"))
        batch_op.add_column(sa.Column("expires_at", sa.Float(), nullable=True))
        batch_op.add_column(
            sa.Column("revoked", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("last_used_at", sa.Float(), nullable=True))
    connection = op.get_bind()
    for digest, admin in connection.execute(sa.select(_tokens.c.digest, _tokens.c.admin)).all():
        connection.execute(
            _tokens.update()
            .where(_tokens.c.digest == digest)
            .values(
                id=digest[:16],
                kind="admin" if admin else "user",
                scopes="admin,read,submit" if admin else "read,submit",
            )
        )
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.alter_column("id", existing_type=sa.String(length=16), nullable=False)
        batch_op.create_unique_constraint("uq_tokens_id", ["id"])
    op.create_table(
        "sessions",
        sa.Column("digest", sa.String(length=64), primary_key=True),
        sa.Column("user", sa.String(length=64), nullable=False),
        sa.Column("groups", sa.Text(), nullable=False, server_default="[]"),
        sa.Column("csrf_digest", sa.String(length=64), nullable=False),
        sa.Column("refresh_token", sa.Text(), nullable=False, server_default=""),
        sa.Column("fresh_until", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_sessions_user", "sessions", ["user"], unique=False)


def downgrade() -> None:
    """Revoked and expired tokens are deleted: the older schema could not refuse them."""
    op.drop_table("sessions")
    connection = op.get_bind()
    connection.execute(
        sa.text(
            "DELETE FROM tokens WHERE revoked OR expires_at IS NOT NULL OR kind = 'service' "
            "OR scopes NOT IN ('read,submit', 'admin,read,submit')"
        )
    )
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_constraint("uq_tokens_id", type_="unique")
        for column in ("last_used_at", "revoked", "expires_at", "groups", "team", "scopes", "kind"):
            batch_op.drop_column(column)
        batch_op.drop_column("id")
