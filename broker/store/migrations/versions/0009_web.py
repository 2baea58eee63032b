"""the web UI: signed-in browser sessions; indexes for the task list's filters and live updates

Revision ID: 0009_web
Revises: 0006_apps
Create Date: 2026-12-01 12:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_web"
down_revision = "0006_apps"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("digest", sa.String(length=64), primary_key=True),
        sa.Column("user", sa.String(length=64), nullable=False),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_web_sessions_user", "web_sessions", ["user"])
    op.create_index("ix_web_sessions_expires_at", "web_sessions", ["expires_at"])
    # The task list filters by project and follows changes by their time.
    op.create_index("ix_tasks_project", "tasks", ["project"])
    op.create_index("ix_tasks_updated_at", "tasks", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_tasks_updated_at", table_name="tasks")
    op.drop_index("ix_tasks_project", table_name="tasks")
    op.drop_index("ix_web_sessions_expires_at", table_name="web_sessions")
    op.drop_index("ix_web_sessions_user", table_name="web_sessions")
    op.drop_table("web_sessions")
