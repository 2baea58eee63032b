"""the model registry: models by name and version, with the run that made them and a stage

Revision ID: 0014_model_registry
Revises: 0013_research_record
Create Date: 2026-12-03 16:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0014_model_registry"
down_revision = "0013_research_record"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=True),
        sa.Column("project", sa.String(length=200), nullable=False),
        sa.Column("latest", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    with op.batch_alter_table("models") as batch:
        batch.create_index(batch.f("ix_models_owner"), ["owner"], unique=False)
        batch.create_index(batch.f("ix_models_team"), ["team"], unique=False)
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("framework", sa.String(length=64), nullable=False),
        sa.Column("files", sa.Text(), nullable=False),
        sa.Column("details", sa.Text(), nullable=False),
        sa.Column("tags", sa.Text(), nullable=False),
        sa.Column("metrics", sa.Text(), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.Column("stage_by", sa.String(length=64), nullable=False),
        sa.Column("stage_at", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["name"], ["models.name"]),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", "version"),
    )
    with op.batch_alter_table("model_versions") as batch:
        batch.create_index(batch.f("ix_model_versions_name"), ["name"], unique=False)
        batch.create_index(batch.f("ix_model_versions_task_id"), ["task_id"], unique=False)
        batch.create_index(batch.f("ix_model_versions_stage"), ["stage"], unique=False)
    # Datasets (broker/store/datasets.py): names, immutable versions, blobs by keeper, reads.
    op.create_table(
        "datasets",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=True),
        sa.Column("project", sa.String(length=200), nullable=False),
        sa.Column("latest", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    with op.batch_alter_table("datasets") as batch:
        batch.create_index(batch.f("ix_datasets_owner"), ["owner"], unique=False)
        batch.create_index(batch.f("ix_datasets_team"), ["team"], unique=False)
    op.create_table(
        "dataset_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("parent", sa.Integer(), nullable=True),
        sa.Column("manifest", sa.Text(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("new_size", sa.BigInteger(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["name"], ["datasets.name"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", "version"),
    )
    with op.batch_alter_table("dataset_versions") as batch:
        batch.create_index(batch.f("ix_dataset_versions_name"), ["name"], unique=False)
        batch.create_index(batch.f("ix_dataset_versions_task_id"), ["task_id"], unique=False)
    op.create_table(
        "dataset_blobs",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("keeper", sa.String(length=80), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("digest", "keeper"),
    )
    with op.batch_alter_table("dataset_blobs") as batch:
        batch.create_index(batch.f("ix_dataset_blobs_task_id"), ["task_id"], unique=False)
    op.create_table(
        "dataset_reads",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("task_id", "name", "version"),
    )
    with op.batch_alter_table("dataset_reads") as batch:
        batch.create_index(batch.f("ix_dataset_reads_task_id"), ["task_id"], unique=False)
        batch.create_index("ix_dataset_reads_name_version", ["name", "version"], unique=False)
    # Tuning (broker/store/tunings.py): searches over a base task's parameters, and trials.
    op.create_table(
        "tunings",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=True),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("base_task_id", sa.Integer(), nullable=False),
        sa.Column("resource", sa.String(length=64), nullable=False),
        sa.Column("settings", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("best", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["base_task_id"], ["tasks.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("tunings") as batch:
        batch.create_index(batch.f("ix_tunings_owner"), ["owner"], unique=False)
        batch.create_index(batch.f("ix_tunings_base_task_id"), ["base_task_id"], unique=False)
        batch.create_index(batch.f("ix_tunings_state"), ["state"], unique=False)
    op.create_table(
        "tuning_trials",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tuning_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("pruned_step", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["tuning_id"], ["tunings.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("tuning_id", "number"),
    )
    with op.batch_alter_table("tuning_trials") as batch:
        batch.create_index(batch.f("ix_tuning_trials_tuning_id"), ["tuning_id"], unique=False)
        batch.create_index(batch.f("ix_tuning_trials_task_id"), ["task_id"], unique=False)


def downgrade() -> None:
    op.drop_table("tuning_trials")
    op.drop_table("tunings")
    op.drop_table("dataset_reads")
    op.drop_table("dataset_blobs")
    op.drop_table("dataset_versions")
    op.drop_table("datasets")
    op.drop_table("model_versions")
    op.drop_table("models")
