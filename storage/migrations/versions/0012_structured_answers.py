"""Structured answers: each result's parsed value (JSONB on PostgreSQL, so SQL can query its fields), the first
violation of an answer that broke its schema (status ``invalid``, a new result and prompt status in the same String
columns), and which asking of the prompt it answers (``reask``: 0 for the prompt's own request). Rows before it:
NULL, NULL, 0.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    op.add_column("results", sa.Column("parsed", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=True))
    op.add_column("results", sa.Column("violation", sa.Text(), nullable=True))
    op.add_column("results", sa.Column("reask", sa.Integer(), server_default=sa.text("0"), nullable=False))


def downgrade() -> None:
    # An invalid answer was an answer: it reads as one where the status is unknown.
    op.execute("UPDATE prompts SET status = 'succeeded' WHERE status = 'invalid'")
    op.execute("UPDATE results SET status = 'succeeded' WHERE status = 'invalid'")
    for name in ("reask", "violation", "parsed"):
        op.drop_column("results", name)
