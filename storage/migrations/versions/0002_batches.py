"""Batch API: batches, their members (prompt per line), and the prompt status ``batched``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"

# Written out here rather than imported from storage._models, as in 0001.
BigInt = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # Only new tables: the prompts table is untouched (no CHECK on its status), so an
    # existing database keeps every row and SQLite needs no table copy.
    op.create_table(
        "batches",
        sa.Column("id", BigInt, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("provider_batch_id", sa.String(), nullable=True),
        sa.Column("input_file_id", sa.String(), nullable=True),
        sa.Column("output_file_id", sa.String(), nullable=True),
        sa.Column("error_file_id", sa.String(), nullable=True),
        sa.Column("file_path", sa.String(), nullable=True),
        sa.Column("request_total", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("request_completed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("request_failed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_polled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("errors", sa.JSON(), nullable=True),
        sa.Column("resubmission_of", BigInt, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_batches_job_id_jobs")),
        sa.ForeignKeyConstraint(["resubmission_of"], ["batches.id"], name=op.f("fk_batches_resubmission_of_batches")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batches")),
        sa.UniqueConstraint("provider_batch_id", name=op.f("uq_batches_provider_batch_id")),
    )
    op.create_index(op.f("ix_batches_job_id"), "batches", ["job_id"], unique=False)
    op.create_index(op.f("ix_batches_status"), "batches", ["status"], unique=False)

    op.create_table(
        "batch_members",
        sa.Column("batch_id", BigInt, nullable=False),
        sa.Column("prompt_id", BigInt, nullable=False),
        sa.Column("custom_id", sa.String(), nullable=False),
        sa.ForeignKeyConstraint(["batch_id"], ["batches.id"], name=op.f("fk_batch_members_batch_id_batches")),
        sa.ForeignKeyConstraint(["prompt_id"], ["prompts.id"], name=op.f("fk_batch_members_prompt_id_prompts")),
        sa.PrimaryKeyConstraint("batch_id", "prompt_id", name=op.f("pk_batch_members")),
        sa.UniqueConstraint("batch_id", "custom_id", name=op.f("uq_batch_members_batch_id_custom_id")),
    )
    op.create_index(op.f("ix_batch_members_prompt_id"), "batch_members", ["prompt_id"], unique=False)


def downgrade() -> None:
    # Without the batches, "batched" means nothing: those prompts are to be sent again.
    op.execute(sa.text("UPDATE prompts SET status = 'pending' WHERE status = 'batched'"))
    op.drop_index(op.f("ix_batch_members_prompt_id"), table_name="batch_members")
    op.drop_table("batch_members")
    op.drop_index(op.f("ix_batches_status"), table_name="batches")
    op.drop_index(op.f("ix_batches_job_id"), table_name="batches")
    op.drop_table("batches")
