"""Initial schema: jobs, prompts, results."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None

# Written out here rather than imported from storage._models: a migration must keep
# describing the schema as it was at this revision, whatever the models become.
BigInt = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("input_path", sa.String(), nullable=True),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index(op.f("ix_jobs_fingerprint"), "jobs", ["fingerprint"], unique=False)

    op.create_table(
        "prompts",
        sa.Column("id", BigInt, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("custom_id", sa.String(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("messages", sa.JSON(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("dedupe_key", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_error_class", sa.String(), nullable=True),
        sa.Column("failed_retryable", sa.Boolean(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_prompts_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prompts")),
        sa.UniqueConstraint("job_id", "custom_id", name=op.f("uq_prompts_job_id_custom_id")),
    )
    op.create_index("ix_prompts_job_id_status", "prompts", ["job_id", "status"], unique=False)
    op.create_index(op.f("ix_prompts_dedupe_key"), "prompts", ["dedupe_key"], unique=False)

    op.create_table(
        "results",
        sa.Column("id", BigInt, autoincrement=True, nullable=False),
        sa.Column("prompt_id", BigInt, nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("route", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("finish_reason", sa.String(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("cached_tokens", sa.Integer(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("response_model", sa.String(), nullable=True),
        sa.Column("response_id", sa.String(), nullable=True),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error_class", sa.String(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_results_job_id_jobs")),
        sa.ForeignKeyConstraint(["prompt_id"], ["prompts.id"], name=op.f("fk_results_prompt_id_prompts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_results")),
    )
    op.create_index(op.f("ix_results_job_id"), "results", ["job_id"], unique=False)
    op.create_index(op.f("ix_results_prompt_id"), "results", ["prompt_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_results_prompt_id"), table_name="results")
    op.drop_index(op.f("ix_results_job_id"), table_name="results")
    op.drop_table("results")
    op.drop_index(op.f("ix_prompts_dedupe_key"), table_name="prompts")
    op.drop_index("ix_prompts_job_id_status", table_name="prompts")
    op.drop_table("prompts")
    op.drop_index(op.f("ix_jobs_fingerprint"), table_name="jobs")
    op.drop_table("jobs")
