"""A job's prompts counted per route and status from one covering index: (job_id, status, planned_route) replaces
(job_id, status), whose prefix every query on a job's statuses still seeks on; ``status`` groups by route and
status without reading a prompt's row.
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"


def upgrade() -> None:
    op.create_index("ix_prompts_job_id_status_route", "prompts", ["job_id", "status", "planned_route"], unique=False)
    op.drop_index("ix_prompts_job_id_status", table_name="prompts")


def downgrade() -> None:
    op.create_index("ix_prompts_job_id_status", "prompts", ["job_id", "status"], unique=False)
    op.drop_index("ix_prompts_job_id_status_route", table_name="prompts")
