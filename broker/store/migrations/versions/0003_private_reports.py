"""report tokens kept as digests, the runner's claims, diffs apart from the spec

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 12:00:00.000000
"""

import hashlib
import json

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_tasks = sa.table(
    "tasks",
    sa.column("id", sa.Integer),
    sa.column("spec", sa.Text),
    sa.column("diff", sa.Text),
    sa.column("diff_bytes", sa.Integer),
    sa.column("report_token", sa.String),
    sa.column("report_digest", sa.String),
)


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("diff", sa.Text(), nullable=False, server_default=""))
        batch_op.add_column(
            sa.Column("diff_bytes", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(
            sa.Column("report_digest", sa.String(length=64), nullable=False, server_default="")
        )
        batch_op.add_column(sa.Column("claim", sa.Text(), nullable=True))
    connection = op.get_bind()
    rows = connection.execute(sa.select(_tasks.c.id, _tasks.c.spec, _tasks.c.report_token))
    for task_id, spec_text, token in rows.fetchall():
        spec = json.loads(spec_text)
        code = spec.get("code") or {}
        diff = code.pop("diff", "") if isinstance(code, dict) else ""
        connection.execute(
            _tasks.update()
            .where(_tasks.c.id == task_id)
            .values(
                spec=json.dumps(spec),
                diff=diff or "",
                diff_bytes=len((diff or "").encode()),
                report_digest=hashlib.sha256(token.encode()).hexdigest() if token else "",
            )
        )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("report_token")


def downgrade() -> None:
    """Report tokens cannot be recovered from their digests: running tasks' reports are refused."""
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("report_token", sa.String(length=64), nullable=False, server_default="")
        )
    connection = op.get_bind()
    rows = connection.execute(sa.select(_tasks.c.id, _tasks.c.spec, _tasks.c.diff))
    for task_id, spec_text, diff in rows.fetchall():
        spec = json.loads(spec_text)
        if isinstance(spec.get("code"), dict):
            spec["code"]["diff"] = diff or ""
            connection.execute(
                _tasks.update().where(_tasks.c.id == task_id).values(spec=json.dumps(spec))
            )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("claim")
        batch_op.drop_column("report_digest")
        batch_op.drop_column("diff_bytes")
        batch_op.drop_column("diff")
