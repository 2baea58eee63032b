"""apps: admin locks on catalogue apps, and static routes made through the API

Revision ID: 0006_apps
Revises: 0005_agent_tokens
Create Date: 2026-12-01 12:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_apps"
down_revision = "0005_agent_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "app_locks",
        sa.Column("app", sa.String(length=64), primary_key=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("locked_by", sa.String(length=64), nullable=False),
        sa.Column("locked_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "routes",
        sa.Column("name", sa.String(length=64), primary_key=True),
        sa.Column("teams", sa.Text(), nullable=False),
        sa.Column("apps", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("routes")
    op.drop_table("app_locks")
