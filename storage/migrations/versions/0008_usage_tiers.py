"""What an answer's price depends on beyond its tokens: the service tier it reports (flex at the batch rate,
priority at its own price), its prompt-cache writes for the longer duration (Anthropic's 1 hour, 2x input
against 1.25x for 5 minutes), and its reasoning tokens. Rows stored before: NULL (standard tier, 5-minute writes).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.add_column("results", sa.Column("cache_creation_extended_tokens", sa.Integer(), nullable=True))
    op.add_column("results", sa.Column("reasoning_tokens", sa.Integer(), nullable=True))
    op.add_column("results", sa.Column("service_tier", sa.String(length=16), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMNs (SQLite >= 3.35), as 0003's.
    for column in ("service_tier", "reasoning_tokens", "cache_creation_extended_tokens"):
        op.drop_column("results", column)
