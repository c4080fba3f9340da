"""Spending caps that hold across runs, shards and workers: named budgets, what each period of one has spent and
reserved, and the reservations (a run's lease, a batch's worst case) behind the reserved figure."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"

_BIG = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("limit_pico_usd", sa.BigInteger(), nullable=False),
        sa.Column("per", sa.String(8), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_budgets"),
    )
    op.create_table(
        "budget_periods",
        sa.Column("budget", sa.String(), nullable=False),
        sa.Column("period", sa.String(10), nullable=False),
        sa.Column("spent_pico_usd", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("reserved_pico_usd", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["budget"], ["budgets.name"], name="fk_budget_periods_budget_budgets"),
        sa.PrimaryKeyConstraint("budget", "period", name="pk_budget_periods"),
    )
    op.create_table(
        "budget_reservations",
        sa.Column("id", _BIG, autoincrement=True, nullable=False),
        sa.Column("budget", sa.String(), nullable=False),
        sa.Column("period", sa.String(10), nullable=False),
        sa.Column("job_id", sa.String(36), nullable=True),
        sa.Column("batch_id", _BIG, nullable=True),
        sa.Column("holder", sa.String(), nullable=False),
        sa.Column("amount_pico_usd", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["budget"], ["budgets.name"], name="fk_budget_reservations_budget_budgets"),
        sa.PrimaryKeyConstraint("id", name="pk_budget_reservations"),
    )
    op.create_index("ix_budget_reservations_budget_period", "budget_reservations", ["budget", "period"])
    op.create_index("ix_budget_reservations_batch_id", "budget_reservations", ["batch_id"])


def downgrade() -> None:
    op.drop_table("budget_reservations")
    op.drop_table("budget_periods")
    op.drop_table("budgets")
