"""Background mode (issue 27): how many background creates were sent for a prompt, counted and committed before
each is sent. A run killed between a create's answer and storing its id leaves this count above the stored id's
one: the next run knows a create may be running (and billed) and counts it as possibly billed.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"


def upgrade() -> None:
    op.add_column("prompts", sa.Column("background_creates", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("prompts", "background_creates")
