"""the web UI: browser sessions signed in with a Klique token; indexes for the task list's
filters and live updates

Revision ID: 0009_web
Revises: 0008_identity
Create Date: 2026-12-01 12:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_web"
down_revision = "0008_identity"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A session signed in with a Klique token stands for it: revoking the token ends it.
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("token_id", sa.String(length=16), nullable=True))
    # The task list filters by project and follows changes by their time.
    op.create_index("ix_tasks_project", "tasks", ["project"])
    op.create_index("ix_tasks_updated_at", "tasks", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_tasks_updated_at", table_name="tasks")
    op.drop_index("ix_tasks_project", table_name="tasks")
    # Sessions that stood for a token would become sessions of their user alone: end them.
    op.execute("DELETE FROM sessions WHERE token_id IS NOT NULL")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("token_id")
