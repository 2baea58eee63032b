"""host GPU ids and the preempted flag

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 21:22:36.439703
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu_ids", sa.Text(), nullable=False, server_default="[]"))
        batch_op.add_column(
            sa.Column("preempted", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("preempted")
        batch_op.drop_column("gpu_ids")
