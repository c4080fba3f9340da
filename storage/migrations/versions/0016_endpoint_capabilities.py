"""What an endpoint (a base URL) can do, learnt from its answers: a base URL whose files or batches route answered
404 has no Batch API, and every later run there sends every prompt real-time.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"


def upgrade() -> None:
    op.create_table(
        "endpoint_capabilities",
        sa.Column("base_url", sa.String(), primary_key=True),
        sa.Column("batch_api", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("learnt_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("endpoint_capabilities")
