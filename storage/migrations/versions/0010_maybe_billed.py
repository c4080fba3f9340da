"""What each call may have cost beyond its answer: how many of its attempts the provider may have billed (an
answer, a 2xx that was no answer, a generation that timed out or was cut off and was tried again), and the start
of a 2xx body that was no answer, kept for inspection. Rows before it: NULL (not counted).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    op.add_column("results", sa.Column("maybe_billed", sa.Integer(), nullable=True))
    op.add_column("results", sa.Column("raw_body", sa.Text(), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMNs (SQLite >= 3.35), as 0008's.
    for name in ("raw_body", "maybe_billed"):
        op.drop_column("results", name)
