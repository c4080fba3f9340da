"""Endpoints besides chat (issue 27): the endpoint each prompt and each batch goes to (``chat`` for the rows before
it), and an embeddings answer's vector as float32 little-endian bytes (NULL for any other answer).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"


def upgrade() -> None:
    for table in ("prompts", "batches"):
        op.add_column(table, sa.Column("endpoint", sa.String(16), nullable=False, server_default="chat"))
    op.add_column("results", sa.Column("embedding", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMNs (SQLite >= 3.35), as 0008's.
    op.drop_column("results", "embedding")
    for table in ("batches", "prompts"):
        op.drop_column(table, "endpoint")
