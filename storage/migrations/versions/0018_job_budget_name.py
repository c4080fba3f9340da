"""The named budget (``--budget-name``) a job's latest run held, so ``status`` and ``cost`` show where it stands
beside the job's own (``--budget``, the budget ``job:<id>``). NULL: no run of the job named one.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("budget_name", sa.String(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "budget_name")
