"""PostgreSQL: a prompt's status change becomes a heap-only (HOT) update. The status leaves every index (the
covering (job_id, status, planned_route) one is dropped; SQLite keeps it) and the prompts table keeps half of each
page free, so the new row version fits beside the old one and no index entry is written. Pages written before
this keep their fill until rewritten; the job's new prompts get the free space.
"""

from __future__ import annotations

from alembic import op

revision = "0029"
down_revision = "0027"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_prompts_job_id_status_route", table_name="prompts")
    op.execute("ALTER TABLE prompts SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE prompts RESET (fillfactor)")
    op.create_index("ix_prompts_job_id_status_route", "prompts", ["job_id", "status", "planned_route"], unique=False)
