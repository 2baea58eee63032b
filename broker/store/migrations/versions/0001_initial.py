"""tasks, events, tokens, scalars, ledger

Revision ID: 0001
Revises:
Create Date: 2026-11-29 20:55:08.263565
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=True),
        sa.Column("project", sa.String(length=200), nullable=False),
        sa.Column("resource", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=True),
        sa.Column("native_id", sa.String(length=64), nullable=True),
        sa.Column("job_dir", sa.Text(), nullable=True),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("gpus", sa.Float(), nullable=False),
        sa.Column("borrowed", sa.Boolean(), nullable=False),
        sa.Column("skip_pools", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("report_token", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("queued_at", sa.Float(), nullable=True),
        sa.Column("submitted_at", sa.Float(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tasks_owner"), ["owner"], unique=False)
        batch_op.create_index(batch_op.f("ix_tasks_pool"), ["pool"], unique=False)
        batch_op.create_index(batch_op.f("ix_tasks_state"), ["state"], unique=False)

    op.create_table(
        "tokens",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("user", sa.String(length=64), nullable=False),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("digest"),
    )
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tokens_user"), ["user"], unique=False)

    op.create_table(
        "ledger",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=True),
        sa.Column("project", sa.String(length=200), nullable=False),
        sa.Column("resource", sa.String(length=64), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("gpus", sa.Float(), nullable=False),
        sa.Column("start", sa.Float(), nullable=False),
        sa.Column("end", sa.Float(), nullable=True),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("ledger", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ledger_start"), ["start"], unique=False)
        batch_op.create_index(batch_op.f("ix_ledger_task_id"), ["task_id"], unique=False)

    op.create_table(
        "scalars",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("scalars", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_scalars_task_id"), ["task_id"], unique=False)

    op.create_table(
        "task_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("old_state", sa.String(length=16), nullable=False),
        sa.Column("new_state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("task_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_task_events_task_id"), ["task_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("task_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_events_task_id"))

    op.drop_table("task_events")
    with op.batch_alter_table("scalars", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_scalars_task_id"))

    op.drop_table("scalars")
    with op.batch_alter_table("ledger", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ledger_task_id"))
        batch_op.drop_index(batch_op.f("ix_ledger_start"))

    op.drop_table("ledger")
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tokens_user"))

    op.drop_table("tokens")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tasks_state"))
        batch_op.drop_index(batch_op.f("ix_tasks_pool"))
        batch_op.drop_index(batch_op.f("ix_tasks_owner"))

    op.drop_table("tasks")
