"""Answers stored as what they are: each answer's tool calls (JSON, OpenAI's assistant-message shape) and the
refusal text of a refused one (status ``refused``, a new result and prompt status, kept in the same String
columns). Rows before it made no tool call or refusal that was kept: NULL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"

_COLUMNS = ("tool_calls", "refusal")


def upgrade() -> None:
    op.add_column("results", sa.Column("tool_calls", sa.JSON(), nullable=True))
    op.add_column("results", sa.Column("refusal", sa.Text(), nullable=True))


def downgrade() -> None:
    # Refused prompts have no status before this revision: they go back to pending, to be asked again.
    op.execute("UPDATE prompts SET status = 'pending' WHERE status = 'refused'")
    op.execute("UPDATE results SET status = 'failed' WHERE status = 'refused'")
    # Plain DROP COLUMNs (SQLite >= 3.35), as 0008's.
    for name in reversed(_COLUMNS):
        op.drop_column("results", name)
