"""what a run reports beyond scalars (tables, images, plots, histograms, text, media); its tags,
when it was archived and when it was deleted

Revision ID: 0013_research_record
Revises: 0012_leader_lease
Create Date: 2026-12-03 16:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0013_research_record"
down_revision = "0012_leader_lease"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A scalar is a line (series) of a chart (its name, the title): "" for one-line charts.
    with op.batch_alter_table("scalars") as batch:
        batch.add_column(
            sa.Column("series", sa.String(length=200), nullable=False, server_default="")
        )
    op.create_table(
        "reports",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("series", sa.String(length=200), nullable=False),
        sa.Column("iteration", sa.BigInteger(), nullable=True),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=True),
        sa.Column("content_type", sa.String(length=100), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("reports") as batch:
        batch.create_index(batch.f("ix_reports_task_id"), ["task_id"], unique=False)
    # A task's tags (a JSON list), when it was archived (hidden from default listings;
    # deleted past the estate's retention), and when it was deleted (what is left of it is what
    # the usage ledger's rows point at).
    op.add_column("tasks", sa.Column("tags", sa.Text(), nullable=False, server_default="[]"))
    op.add_column("tasks", sa.Column("archived_at", sa.Float(), nullable=True))
    op.add_column("tasks", sa.Column("deleted_at", sa.Float(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35 and later): copying the table, as batch mode
    # does, would break the foreign keys of the tables that refer to tasks (0010_sweeps).
    for column in ("deleted_at", "archived_at", "tags"):
        op.drop_column("tasks", column)
    with op.batch_alter_table("reports") as batch:
        batch.drop_index(batch.f("ix_reports_task_id"))
    op.drop_table("reports")
    with op.batch_alter_table("scalars") as batch:
        batch.drop_column("series")
