"""Which provider each batch went to: its lifecycle (poll, results, cancel) is that provider's API, so a
sweep in another process, under other settings, still finds it. Batches before it were all OpenAI's.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("provider", sa.String(16), nullable=False, server_default="openai"))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite >= 3.35), as 0003's: copying batches in batch mode would trip its foreign keys.
    op.drop_column("batches", "provider")
