"""Indexes for reading a job's prompts a page at a time: by input position (planning, recording in
slices) and by request (the estimate, which counts identical requests once), so that each page is an
index range scan however many prompts the job and the table hold.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    op.create_index("ix_prompts_job_id_position", "prompts", ["job_id", "position"])
    op.create_index("ix_prompts_job_id_dedupe_key", "prompts", ["job_id", "dedupe_key"])


def downgrade() -> None:
    op.drop_index("ix_prompts_job_id_dedupe_key", table_name="prompts")
    op.drop_index("ix_prompts_job_id_position", table_name="prompts")
