"""``status`` and ``cost`` on a job of millions of prompts read indexes, not rows: a job's usage and stored cost
summed from one covering index on results (job_id, then the columns it groups by in that order, then those it
sums), which replaces the index on job_id alone that it leads with; the rows checked against a schema in a partial
index on job_id (a job without any answers ``structured`` statistics at once); and a job's models and endpoints in an
index on prompts (job_id, model, endpoint), read one pair after another.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"

CHECKED = "parsed IS NOT NULL OR violation IS NOT NULL"
LEDGER = ["job_id", "route", "service_tier", "prices_as_of", "prices_file", "cost_basis", "status", "prompt_tokens",
          "completion_tokens", "cached_tokens", "cache_creation_tokens", "cache_creation_extended_tokens",
          "cost_pico_usd", "list_cost_pico_usd"]


def upgrade() -> None:
    op.create_index("ix_results_job_id_ledger", "results", LEDGER, unique=False)
    op.drop_index("ix_results_job_id", table_name="results")
    op.create_index("ix_results_job_id_checked", "results", ["job_id"], unique=False,
                    sqlite_where=sa.text(CHECKED), postgresql_where=sa.text(CHECKED))
    op.create_index("ix_prompts_job_id_model_endpoint", "prompts", ["job_id", "model", "endpoint"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_prompts_job_id_model_endpoint", table_name="prompts")
    op.drop_index("ix_results_job_id_checked", table_name="results")
    op.create_index("ix_results_job_id", "results", ["job_id"], unique=False)
    op.drop_index("ix_results_job_id_ledger", table_name="results")
