"""The provider that serves each prompt (a built-in one, or one a providers file declares): its results are that
provider's, and costs are summed per provider from it. NULL for a prompt stored before: the built-in rule's."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"


def upgrade() -> None:
    op.add_column("prompts", sa.Column("provider", sa.String(16), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite >= 3.35), as 0003's: a batch alter would copy the table the results point at.
    op.drop_column("prompts", "provider")
