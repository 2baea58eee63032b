"""what the control plane asks a task's pool agent to do

Revision ID: 0004_intents
Revises: 0003
Create Date: 2026-11-30 14:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_intents"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("intent", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("intent")
