"""Each answer's prompt-cache writes (Anthropic's ``cache_creation_input_tokens``): part of its prompt tokens,
priced at the cache-write price, kept so that a report or a reprice can count them again. Rows before it
wrote no cache (OpenAI reports none): NULL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.add_column("results", sa.Column("cache_creation_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite >= 3.35), as 0003's: copying results in batch mode would trip its foreign keys.
    op.drop_column("results", "cache_creation_tokens")
