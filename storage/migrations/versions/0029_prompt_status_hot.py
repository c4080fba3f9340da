"""PostgreSQL: a prompt's status change becomes a heap-only (HOT) update. The status leaves every index (the
covering (job_id, status, planned_route) one is dropped; SQLite keeps it) and the prompts table keeps half of each
page free, so the new row version fits beside the old one and no index entry is written. Pages written before
this keep their fill until rewritten; the job's new prompts get the free space. Also on PostgreSQL only:
batch_members loses its two foreign keys (a trigger per member; their writer checks the same, see the models).
On both: the prompts that have a deadline get a partial index by it, so an ingest finds the late ones without
reading the job (PostgreSQL no longer has the status index for that).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"


_DEADLINE = "deadline IS NOT NULL"


def upgrade() -> None:
    op.create_index("ix_prompts_job_id_deadline", "prompts", ["job_id", "deadline"], unique=False,
                    sqlite_where=sa.text(_DEADLINE), postgresql_where=sa.text(_DEADLINE))
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_prompts_job_id_status_route", table_name="prompts")
    op.execute("ALTER TABLE prompts SET (fillfactor = 50)")
    op.drop_constraint("fk_batch_members_batch_id_batches", "batch_members", type_="foreignkey")
    op.drop_constraint("fk_batch_members_prompt_id_prompts", "batch_members", type_="foreignkey")


def downgrade() -> None:
    op.drop_index("ix_prompts_job_id_deadline", table_name="prompts")
    if op.get_bind().dialect.name != "postgresql":
        return
    op.create_foreign_key("fk_batch_members_prompt_id_prompts", "batch_members", "prompts", ["prompt_id"], ["id"])
    op.create_foreign_key("fk_batch_members_batch_id_batches", "batch_members", "batches", ["batch_id"], ["id"])
    op.execute("ALTER TABLE prompts RESET (fillfactor)")
    op.create_index("ix_prompts_job_id_status_route", "prompts", ["job_id", "status", "planned_route"], unique=False)
