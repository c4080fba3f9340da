"""Routing and batch resubmission: each prompt's planned route, its reason and deadline; a batch
line may answer several identical prompts; a batch remembers that the user cancelled it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    # Plain ADD COLUMNs: SQLite adds them without copying the prompts table.
    op.add_column("prompts", sa.Column("planned_route", sa.String(length=16), nullable=True))
    op.add_column("prompts", sa.Column("route_reason", sa.String(), nullable=True))
    op.add_column("prompts", sa.Column("deadline", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "batches", sa.Column("cancel_requested", sa.Boolean(), server_default=sa.false(), nullable=False)
    )
    # Identical prompts share one line (one paid request): custom_id is no longer unique per batch.
    with op.batch_alter_table("batch_members") as batch:
        batch.drop_constraint("uq_batch_members_batch_id_custom_id", type_="unique")


def downgrade() -> None:
    with op.batch_alter_table("batch_members") as batch:
        batch.create_unique_constraint("uq_batch_members_batch_id_custom_id", ["batch_id", "custom_id"])
    # Plain DROP COLUMNs (SQLite >= 3.35): copying prompts in batch mode would trip its foreign keys.
    op.drop_column("batches", "cancel_requested")
    op.drop_column("prompts", "deadline")
    op.drop_column("prompts", "route_reason")
    op.drop_column("prompts", "planned_route")
