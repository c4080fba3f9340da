"""The groups of a job's prompts that share a cached prefix, found when the job is recorded, with each group's
cache plan and its prefix cost planned and uncached: what the estimate shows before anything is sent, kept with
the job for ``status``."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"


def upgrade() -> None:
    op.create_table(
        "cache_groups",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("lane", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=32), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("endpoint", sa.String(), nullable=False),
        sa.Column("prompts", sa.Integer(), nullable=False),
        sa.Column("prefix_tokens", sa.Integer(), nullable=False),
        sa.Column("prefix_messages", sa.Integer(), nullable=False),
        sa.Column("own_breakpoints", sa.Boolean(), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("keys", sa.Integer(), nullable=False),
        sa.Column("ttl", sa.String(length=8), nullable=True),
        sa.Column("planned_cost_pico_usd", sa.BigInteger(), nullable=True),
        sa.Column("uncached_cost_pico_usd", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_cache_groups_job_id_jobs")),
        sa.PrimaryKeyConstraint("job_id", "lane", "key", name=op.f("pk_cache_groups")),
    )


def downgrade() -> None:
    op.drop_table("cache_groups")
