"""one scheduler at a time across replicas: a lease row with a fencing term; and what each
remote agent last published, for every replica

Revision ID: 0012_leader_lease
Revises: 0011_agent_token_expiry
Create Date: 2026-12-03 16:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_leader_lease"
down_revision = "0011_agent_token_expiry"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader_lease",
        sa.Column("name", sa.String(length=32), primary_key=True),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("renewed_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "pool_reports",
        sa.Column("pool", sa.String(length=64), primary_key=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("strangers", sa.Text(), nullable=False),
        sa.Column("seen", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("pool_reports")
    op.drop_table("leader_lease")
