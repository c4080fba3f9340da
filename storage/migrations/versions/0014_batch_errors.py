"""A batch's own trouble, kept on its row: the last error a step met on it (poll, ingest, cancel, finish a
submission), when, how many in a row, and when a sweep may try it again. Rows before it: no error.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"


def upgrade() -> None:
    op.add_column("batches", sa.Column("last_error", sa.Text(), nullable=True))
    op.add_column("batches", sa.Column("last_error_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("batches", sa.Column("error_count", sa.Integer(), nullable=False, server_default=sa.text("0")))
    op.add_column("batches", sa.Column("retry_after", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMNs (SQLite >= 3.35), as 0008's.
    for name in ("retry_after", "error_count", "last_error_at", "last_error"):
        op.drop_column("batches", name)
