"""the SDK's record: origin, parent, parameters, packages, inputs, cache key; artifacts

Revision ID: 0007_sdk
Revises: 0006_apps
Create Date: 2026-12-02 12:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_sdk"
down_revision = "0006_apps"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("origin", sa.String(length=16), nullable=False, server_default="pool")
        )
        batch_op.add_column(sa.Column("parent_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("parameters", sa.Text(), nullable=False, server_default="{}"))
        batch_op.add_column(sa.Column("packages", sa.Text(), nullable=False, server_default="[]"))
        batch_op.add_column(sa.Column("inputs", sa.Text(), nullable=False, server_default="[]"))
        batch_op.add_column(sa.Column("cache_key", sa.String(length=64), nullable=True))
        batch_op.create_index("ix_tasks_parent_id", ["parent_id"])
        batch_op.create_index("ix_tasks_cache_key", ["cache_key"])
        batch_op.create_index("ix_tasks_report_digest", ["report_digest"])
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.Integer(), sa.ForeignKey("tasks.id"), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False, server_default=""),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("task_id", "name"),
    )
    op.create_index("ix_artifacts_task_id", "artifacts", ["task_id"])
    op.create_index("ix_artifacts_digest", "artifacts", ["digest"])


def downgrade() -> None:
    op.drop_index("ix_artifacts_digest", table_name="artifacts")
    op.drop_index("ix_artifacts_task_id", table_name="artifacts")
    op.drop_table("artifacts")
    for index in ("ix_tasks_report_digest", "ix_tasks_cache_key", "ix_tasks_parent_id"):
        op.drop_index(index, table_name="tasks")
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35 and later): copying the table, as batch mode
    # does, would break the foreign keys of task_events, scalars and ledger rows.
    for column in ("cache_key", "inputs", "packages", "parameters", "parent_id", "origin"):
        op.drop_column("tasks", column)
