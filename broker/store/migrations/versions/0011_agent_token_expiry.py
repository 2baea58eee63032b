"""agent tokens expire and can be listed and revoked: an id, an end, a revoked flag, a last use

Revision ID: 0011_agent_token_expiry
Revises: 0010_sweeps
Create Date: 2026-12-03 09:00:00.000000
"""

import time

import sqlalchemy as sa
from alembic import op

revision = "0011_agent_token_expiry"
down_revision = "0010_sweeps"
branch_labels = None
depends_on = None

# Tokens made before they could expire get the default lifetime from the upgrade on, rather
# than from when they were made: an agent in service keeps working, and is told in time.
_DEFAULT_LIFETIME_S = 90 * 86400


def upgrade() -> None:
    with op.batch_alter_table("agent_tokens") as batch:
        batch.add_column(sa.Column("id", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("expires_at", sa.Float(), nullable=True))
        batch.add_column(
            sa.Column("revoked", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("last_used_at", sa.Float(), nullable=True))
    op.execute(
        sa.text(
            "UPDATE agent_tokens SET id = 'agent-' || substr(digest, 1, 16), expires_at = :until"
        ).bindparams(until=time.time() + _DEFAULT_LIFETIME_S)
    )
    with op.batch_alter_table("agent_tokens") as batch:
        batch.alter_column("id", existing_type=sa.String(length=32), nullable=False)
        batch.alter_column("expires_at", existing_type=sa.Float(), nullable=False)
        batch.create_unique_constraint("uq_agent_tokens_id", ["id"])


def downgrade() -> None:
    # A revoked token would be in force again without its flag: it goes instead.
    op.execute("DELETE FROM agent_tokens WHERE revoked")
    with op.batch_alter_table("agent_tokens") as batch:
        batch.drop_constraint("uq_agent_tokens_id", type_="unique")
        batch.drop_column("last_used_at")
        batch.drop_column("revoked")
        batch.drop_column("expires_at")
        batch.drop_column("id")
