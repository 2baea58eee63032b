"""tokens for pool agents on login nodes

Revision ID: 0005_agent_tokens
Revises: 0004_intents
Create Date: 2026-11-30 15:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_agent_tokens"
down_revision = "0004_intents"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agent_tokens",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("pools", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("digest"),
    )


def downgrade() -> None:
    op.drop_table("agent_tokens")
