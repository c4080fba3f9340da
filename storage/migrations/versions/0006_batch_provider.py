"""Which provider each batch went to: its lifecycle (poll, results, cancel) is that provider's API, so a
sweep in another process, under other settings, still finds it. Batches before it were all OpenAI's.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.add_column("batches", sa.Column("provider", sa.String(16), nullable=False, server_default="openai"))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite >= 3.35), as 0003's: copying batches in batch mode would trip its foreign keys.
    op.drop_column("batches", "provider")
