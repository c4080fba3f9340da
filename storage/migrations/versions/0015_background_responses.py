"""Background mode (issue 27): the id of the background response created for a prompt, stored as soon as the
create answers, so a later run polls it instead of creating (and paying for) it again. NULL: none created.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"


def upgrade() -> None:
    op.add_column("prompts", sa.Column("background_id", sa.String(), nullable=True))


def downgrade() -> None:
    op.drop_column("prompts", "background_id")
