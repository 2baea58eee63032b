"""sweeps: many tasks made by one request, linked by the sweep's id

Revision ID: 0010_sweeps
Revises: 0009_web
Create Date: 2026-12-02 12:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_sweeps"
down_revision = "0009_web"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=True),
        sa.Column("name", sa.String(length=200), nullable=False, server_default=""),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_sweeps_owner", "sweeps", ["owner"])
    op.add_column("tasks", sa.Column("sweep_id", sa.Integer(), nullable=True))
    op.create_index("ix_tasks_sweep_id", "tasks", ["sweep_id"])


def downgrade() -> None:
    op.drop_index("ix_tasks_sweep_id", table_name="tasks")
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35 and later): copying the table, as batch mode
    # does, would break the foreign keys of task_events, scalars and ledger rows.
    op.drop_column("tasks", "sweep_id")
    op.drop_index("ix_sweeps_owner", table_name="sweeps")
    op.drop_table("sweeps")
